//! UDP header as RoCEv2 uses it: smoltcp's view, Brick's representation.
//!
//! roce-v2.md §1.3: destination port 4791; source port a per-QP constant
//! (≥ 0xC000 on rxe); length = 8 + the IB part; checksum 0 on transmit (the ICRC
//! protects the IB part). The UDP length, not the IP total length, delimits the
//! IB part (rxe `rxe_udp_encap_recv()`). A non-zero checksum is verified on
//! receive, as the Linux UDP stack does before rxe sees the packet.
//!
//! The [`Packet`] view is smoltcp's `UdpPacket`.
//!
//! # Fuzzing
//! smoltcp's `verify_checksum` returns `true` under `cfg(fuzzing)`.

use core::fmt;

use smoltcp::wire::IpAddress;

use super::{Ipv4Address, ParseError};

pub use smoltcp::wire::{UdpPacket as Packet, UDP_HEADER_LEN as HEADER_LEN};

/// The RoCEv2 destination port (`ROCE_V2_UDP_DPORT`).
pub const ROCE_V2_PORT: u16 = 4791;

/// The source port of every MAD an rxe node sends: the port of QPN 1 under
/// [`source_port_for_qpn`].
pub const GSI_SOURCE_PORT: u16 = 0xd872;

/// rxe's source port for a QP at creation time (roce-v2.md §1.3):
/// `0xC000 + (hash_32(qpn, 14) & 0x3FFF)`.
pub const fn source_port_for_qpn(qpn: crate::types::Qpn) -> u16 {
    let hash = qpn.value().wrapping_mul(0x61c8_8647) >> 18;
    0xc000 + (hash & 0x3fff) as u16
}

/// The RoCE source port derived from a GRH flow label (`rdma_flow_label_to_udp_sport()`,
/// roce-v2.md §1.3): `0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))`.
pub const fn source_port_from_flow_label(flow_label: u32) -> u16 {
    let port = (flow_label & 0x3fff) ^ ((flow_label & 0xf_c000) >> 14);
    0xc000 | port as u16
}

/// A parsed UDP header. Length and checksum are not kept: the length follows
/// from the payload, and Brick always transmits checksum 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl Repr {
    /// Parses a UDP header; the payload is `packet.payload()` (`length - 8` bytes).
    ///
    /// # Errors
    /// - [`ParseError::Truncated`]: buffer shorter than 8 bytes or than the length field;
    /// - [`ParseError::BadLength`]: length field < 8;
    /// - [`ParseError::BadChecksum`]: a non-zero checksum that does not verify.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
        src_addr: Ipv4Address,
        dst_addr: Ipv4Address,
    ) -> Result<Repr, ParseError> {
        let len = packet.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let field_len = usize::from(packet.len());
        if field_len < HEADER_LEN {
            return Err(ParseError::BadLength);
        }
        if len < field_len {
            return Err(ParseError::Truncated);
        }
        // A zero checksum means "none" on IPv4 (RFC 768); smoltcp accepts it.
        if !packet.verify_checksum(&IpAddress::Ipv4(src_addr), &IpAddress::Ipv4(dst_addr)) {
            return Err(ParseError::BadChecksum);
        }
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
        })
    }

    /// Length of the emitted header: always 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes ports, length `8 + payload_len` and checksum 0.
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes or `8 + payload_len` exceeds 65535
    /// (programming errors: frame emitters check both).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>, payload_len: usize) {
        let len = u16::try_from(HEADER_LEN + payload_len).expect("UDP length exceeds 65535");
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        packet.set_checksum(0);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UDP {} > {}", self.src_port, self.dst_port)
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::types::Qpn;

    // Worked example 1 of roce-v2.md §1.8: sport 0xd3a5, dport 4791, length 32, csum 0.
    static HEADER: [u8; 8] = [0xd3, 0xa5, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00];
    const SRC: Ipv4Address = Ipv4Address::new(192, 168, 1, 1);
    const DST: Ipv4Address = Ipv4Address::new(192, 168, 1, 2);

    fn repr() -> Repr {
        Repr {
            src_port: 0xd3a5,
            dst_port: ROCE_V2_PORT,
        }
    }

    fn datagram() -> [u8; 32] {
        let mut buf = [0u8; 32];
        buf[..8].copy_from_slice(&HEADER);
        buf
    }

    #[test]
    fn test_deconstruct() {
        let buf = datagram();
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.dst_port(), 4791);
        assert_eq!(packet.len(), 32);
        assert_eq!(packet.payload().len(), 24);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 8];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]), 24);
        assert_eq!(buf, HEADER);
    }

    #[test]
    fn test_parse() {
        let buf = datagram();
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..]), SRC, DST),
            Ok(repr())
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0u8; 32];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]), 24);
        assert_eq!(buf, datagram());
    }

    #[test]
    fn test_bad_lengths_and_checksum() {
        let mut buf = datagram();
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..31]), SRC, DST),
            Err(ParseError::Truncated)
        );
        buf[5] = 7;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..]), SRC, DST),
            Err(ParseError::BadLength)
        );
        buf[5] = 32;
        buf[7] = 1;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..]), SRC, DST),
            Err(ParseError::BadChecksum)
        );
    }

    #[test]
    fn test_source_ports() {
        assert_eq!(source_port_for_qpn(Qpn::GSI), GSI_SOURCE_PORT);
        assert_eq!(source_port_for_qpn(Qpn::new(0x11)) & 0xc000, 0xc000);
        assert_eq!(source_port_from_flow_label(0), 0xc000);
        assert_eq!(
            source_port_from_flow_label(0xf_ffff),
            0xc000 | (0x3fff ^ 0x3f)
        );
    }
}
