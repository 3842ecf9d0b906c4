//! RDMA CM conventions on top of IB CM: service IDs and the CMA IP header.
//!
//! ib-cm.md §5. An rdma_cm client in an IP port space (RDMA_PS_TCP for RTRS and
//! rping) puts `service_id = port_space << 16 | port` in the REQ (§5.1), and
//! starts the REQ private data with a 36-byte header (§5.2, Linux `struct
//! cma_hdr`), big-endian:
//!
//! ```text
//! 0 cma_version (0) | 1 ip_version (7..4: 4 or 6) | 2-3 the client's rdma_cm port
//! 4-19 source address | 20-35 destination address | 36.. user private data (≤ 56)
//! ```
//!
//! For IPv4 an address is 12 zero bytes followed by the address (*not*
//! `::ffff:`-mapped). Brick speaks IPv4 only, so [`Repr`] refuses IPv6 headers.
//! REP and REJ private data carry no such header (§5.3).
//! After [`Packet::check_len`] succeeds no accessor panics.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::bytes::{get_bits, read_u16_be, set_bits, write_u16_be};
use super::{Ipv4Address, ParseError};

mod field {
    use crate::wire::bytes::Field;

    pub const VERSION: usize = 0;
    /// IP version (4) | reserved (4).
    pub const IP_VERSION: usize = 1;
    pub const PORT: Field = 2..4;
    pub const SRC_ADDR: Field = 4..20;
    pub const DST_ADDR: Field = 20..36;
}

/// Length of the CMA header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// The only CMA header version (`CMA_VERSION`).
pub const CMA_VERSION: u8 = 0;

enum_with_unknown! {
    /// RDMA CM port spaces (`enum rdma_ucm_port_space`).
    pub enum PortSpace(u16) {
        /// RDMA_PS_IPOIB.
        Ipoib = 0x0002,
        /// RDMA_PS_TCP: RC connections (RTRS, rping).
        Tcp = 0x0106,
        /// RDMA_PS_UDP.
        Udp = 0x0111,
        /// RDMA_PS_IB.
        Ib = 0x013f,
    }
}

/// The IB CM service ID for an RDMA CM port (`rdma_get_service_id()`).
///
/// ```
/// use roce::wire::rdma_cm::{service_id, PortSpace};
/// assert_eq!(service_id(PortSpace::Tcp, 1234), 0x0000_0000_0106_04d2);
/// ```
pub fn service_id(port_space: PortSpace, port: u16) -> u64 {
    u64::from(u16::from(port_space)) << 16 | u64::from(port)
}

/// The port space and port of an RDMA CM service ID, or `None` if the ID is not
/// of that form (bits 63..32 set, or an unknown port space).
pub fn parse_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    match PortSpace::from((service_id >> 16) as u16) {
        PortSpace::Unknown(_) => None,
        // The low 16 bits are the port: truncation is the decoding.
        port_space => Some((port_space, service_id as u16)),
    }
}

/// The port an RDMA_PS_TCP service ID listens on, or `None` for any other ID.
pub fn tcp_port(service_id: u64) -> Option<u16> {
    match parse_service_id(service_id) {
        Some((PortSpace::Tcp, port)) => Some(port),
        _ => None,
    }
}

header_view!(
    /// A read/write view of a CMA header at the start of REQ private data;
    /// `payload()` is the user private data.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// cma_version (0).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// IP version (4 or 6), from the high nibble.
    pub fn ip_version(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::IP_VERSION], 4, 4)
    }

    /// The client's rdma_cm source port (not the server's port: that is in the
    /// service ID).
    pub fn src_port(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::PORT])
    }

    /// The 16-byte source address field.
    pub fn src_addr_field(&self) -> &[u8] {
        &self.buffer.as_ref()[field::SRC_ADDR]
    }

    /// The 16-byte destination address field.
    pub fn dst_addr_field(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DST_ADDR]
    }

    /// The source address read as IPv4 (last four bytes of the field).
    pub fn src_ipv4(&self) -> Ipv4Address {
        ipv4_of(self.src_addr_field())
    }

    /// The destination address read as IPv4 (last four bytes of the field).
    pub fn dst_ipv4(&self) -> Ipv4Address {
        ipv4_of(self.dst_addr_field())
    }
}

fn ipv4_of(field: &[u8]) -> Ipv4Address {
    Ipv4Address::new(field[12], field[13], field[14], field[15])
}

fn ipv4_field(addr: Ipv4Address) -> [u8; 16] {
    let mut field = [0u8; 16];
    field[12..].copy_from_slice(&addr.octets());
    field
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets cma_version.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the IP version (low 4 bits) and clears the reserved nibble.
    pub fn set_ip_version(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::IP_VERSION];
        *byte = 0;
        set_bits(byte, 4, 4, value);
    }

    /// Sets the client's source port.
    pub fn set_src_port(&mut self, value: u16) {
        write_u16_be(&mut self.buffer.as_mut()[field::PORT], value);
    }

    /// Sets the source address as IPv4 (12 zero bytes, then the address).
    pub fn set_src_ipv4(&mut self, value: Ipv4Address) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&ipv4_field(value));
    }

    /// Sets the destination address as IPv4.
    pub fn set_dst_ipv4(&mut self, value: Ipv4Address) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&ipv4_field(value));
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "RDMA-CM ({err})"),
        }
    }
}

/// A parsed IPv4 CMA header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The client's rdma_cm port.
    pub src_port: u16,
    /// The client's address, as its rdma_cm sees it.
    pub src_addr: Ipv4Address,
    /// The server's address the client connected to.
    pub dst_addr: Ipv4Address,
}

impl Repr {
    /// Parses a CMA header (the start of REQ private data).
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 36 bytes; [`ParseError::Unsupported`]
    /// if cma_version ≠ 0 (Linux rejects those too) or the IP version is not 4.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        if packet.version() != CMA_VERSION || packet.ip_version() != 4 {
            return Err(ParseError::Unsupported);
        }
        Ok(Repr {
            src_port: packet.src_port(),
            src_addr: packet.src_ipv4(),
            dst_addr: packet.dst_ipv4(),
        })
    }

    /// Length of the emitted header: 36.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (version 0, IPv4).
    ///
    /// # Panics
    /// If the buffer is shorter than 36 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version(CMA_VERSION);
        packet.set_ip_version(4);
        packet.set_src_port(self.src_port);
        packet.set_src_ipv4(self.src_addr);
        packet.set_dst_ipv4(self.dst_addr);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RDMA-CM {}:{} > {}",
            self.src_addr, self.src_port, self.dst_addr
        )
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // rping-linux.pcap frame 5: REQ private data, 10.77.0.2 port 48883 > 10.77.0.1.
    static CMA_HDR: [u8; 36] = [
        0x00, 0x40, 0xbe, 0xf3, // version 0, IPv4, port 48883
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 2, // src
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 1, // dst
    ];

    const REPR: Repr = Repr {
        src_port: 48883,
        src_addr: Ipv4Address::new(10, 77, 0, 2),
        dst_addr: Ipv4Address::new(10, 77, 0, 1),
    };

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&CMA_HDR[..]).unwrap();
        assert_eq!(packet.version(), 0);
        assert_eq!(packet.ip_version(), 4);
        assert_eq!(packet.src_port(), 48883);
        assert_eq!(packet.src_ipv4(), Ipv4Address::new(10, 77, 0, 2));
        assert_eq!(packet.dst_ipv4(), Ipv4Address::new(10, 77, 0, 1));
        assert!(packet.payload().is_empty());
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 36];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_version(0);
        packet.set_ip_version(4);
        packet.set_src_port(48883);
        packet.set_src_ipv4(Ipv4Address::new(10, 77, 0, 2));
        packet.set_dst_ipv4(Ipv4Address::new(10, 77, 0, 1));
        assert_eq!(buf, CMA_HDR);
    }

    #[test]
    fn test_parse() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&CMA_HDR[..])), Ok(REPR));
        let mut v6 = CMA_HDR;
        v6[1] = 0x60;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&v6[..])),
            Err(ParseError::Unsupported)
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&CMA_HDR[..35])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 36];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, CMA_HDR);
    }

    #[test]
    fn test_service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0106_1c06);
        assert_eq!(parse_service_id(0x0106_1c06), Some((PortSpace::Tcp, 7174)));
        assert_eq!(tcp_port(0x0106_04d2), Some(1234));
        assert_eq!(tcp_port(0x0111_04d2), None);
        assert_eq!(parse_service_id(0x1_0106_04d2), None);
        assert_eq!(parse_service_id(0x0999_04d2), None);
    }
}
