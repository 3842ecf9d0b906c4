//! The 44-byte path description inside a CM REQ (primary and alternate path).
//!
//! ib-cm.md §4.2, CM offsets 52..96 (primary) and 96..140 (alternate); offsets
//! below are relative to the path. On RoCE the LIDs are 0xFFFF (permissive),
//! the GIDs IPv4-mapped, and the flow label, traffic class and hop limit are
//! the ones the client uses for the connection's GRH (IPv4 TOS/TTL).
//!
//! ```text
//! 0-1 local LID | 2-3 remote LID | 4-19 local GID | 20-35 remote GID
//! 36-39 flow label (bits 31..12) | reserved (11..6) | packet rate (5..0)
//! 40 traffic class | 41 hop limit | 42 SL (7..4) | subnet local (3)
//! 43 local ACK timeout (7..3)
//! ```

use core::fmt;

use super::super::bytes::{
    get_bits, read_u16_be, read_u32_be, set_bits, write_u16_be, write_u32_be,
};
use super::super::ParseError;
use crate::types::Gid;

mod field {
    use crate::wire::bytes::Field;

    pub const LOCAL_LID: Field = 0..2;
    pub const REMOTE_LID: Field = 2..4;
    pub const LOCAL_GID: Field = 4..20;
    pub const REMOTE_GID: Field = 20..36;
    /// Flow label (20 bits) | reserved (6) | packet rate (6).
    pub const FLOW_LABEL_RATE: Field = 36..40;
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    /// SL (4) | subnet local (1) | reserved (3).
    pub const SL: usize = 42;
    /// Local ACK timeout (5) | reserved (3).
    pub const ACK_TIMEOUT: usize = 43;
}

/// Length of a path description.
pub const LEN: usize = 44;

header_view!(
    /// A read/write view of a CM path description.
    Packet,
    LEN
);

fn gid(bytes: &[u8]) -> Gid {
    let mut raw = [0u8; 16];
    raw.copy_from_slice(bytes);
    Gid(raw)
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local port LID (0xFFFF, permissive, on routed RoCE).
    pub fn local_lid(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::LOCAL_LID])
    }

    /// Remote port LID.
    pub fn remote_lid(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::REMOTE_LID])
    }

    /// Local port GID (the REQ sender's).
    pub fn local_gid(&self) -> Gid {
        gid(&self.buffer.as_ref()[field::LOCAL_GID])
    }

    /// Remote port GID (the REQ receiver's).
    pub fn remote_gid(&self) -> Gid {
        gid(&self.buffer.as_ref()[field::REMOTE_GID])
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::FLOW_LABEL_RATE]) >> 12
    }

    /// Packet rate (6 bits; 0 = port current).
    pub fn packet_rate(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::FLOW_LABEL_RATE.end - 1], 0, 6)
    }

    /// Traffic class: the IPv4 TOS the REQ sender uses.
    pub fn traffic_class(&self) -> u8 {
        self.buffer.as_ref()[field::TRAFFIC_CLASS]
    }

    /// Hop limit: the IPv4 TTL the REQ sender uses.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::SL], 4, 4)
    }

    /// Subnet local: 1 iff hop limit ≤ 1.
    pub fn subnet_local(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::SL], 3, 1) != 0
    }

    /// Local ACK timeout (5-bit IB time exponent; Linux sends 19).
    pub fn local_ack_timeout(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::ACK_TIMEOUT], 3, 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the local LID.
    pub fn set_local_lid(&mut self, value: u16) {
        write_u16_be(&mut self.buffer.as_mut()[field::LOCAL_LID], value);
    }

    /// Sets the remote LID.
    pub fn set_remote_lid(&mut self, value: u16) {
        write_u16_be(&mut self.buffer.as_mut()[field::REMOTE_LID], value);
    }

    /// Sets the local GID.
    pub fn set_local_gid(&mut self, value: Gid) {
        self.buffer.as_mut()[field::LOCAL_GID].copy_from_slice(&value.0);
    }

    /// Sets the remote GID.
    pub fn set_remote_gid(&mut self, value: Gid) {
        self.buffer.as_mut()[field::REMOTE_GID].copy_from_slice(&value.0);
    }

    /// Sets the flow label (low 20 bits) and packet rate (low 6 bits); the
    /// reserved bits between them are cleared.
    pub fn set_flow_label_and_rate(&mut self, flow_label: u32, packet_rate: u8) {
        let word = (flow_label & 0xf_ffff) << 12 | u32::from(packet_rate & 0x3f);
        write_u32_be(&mut self.buffer.as_mut()[field::FLOW_LABEL_RATE], word);
    }

    /// Sets the traffic class.
    pub fn set_traffic_class(&mut self, value: u8) {
        self.buffer.as_mut()[field::TRAFFIC_CLASS] = value;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value;
    }

    /// Sets SL (low 4 bits) and subnet local; clears the reserved bits.
    pub fn set_sl_and_subnet_local(&mut self, sl: u8, subnet_local: bool) {
        let byte = &mut self.buffer.as_mut()[field::SL];
        *byte = 0;
        set_bits(byte, 4, 4, sl);
        set_bits(byte, 3, 1, subnet_local.into());
    }

    /// Sets the local ACK timeout (low 5 bits); clears the reserved bits.
    pub fn set_local_ack_timeout(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::ACK_TIMEOUT];
        *byte = 0;
        set_bits(byte, 3, 5, value);
    }
}

/// A parsed path description. Fields wider than their wire width are
/// truncated on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl Repr {
    /// Parses a path description.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 44 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            local_lid: packet.local_lid(),
            remote_lid: packet.remote_lid(),
            local_gid: packet.local_gid(),
            remote_gid: packet.remote_gid(),
            flow_label: packet.flow_label(),
            packet_rate: packet.packet_rate(),
            traffic_class: packet.traffic_class(),
            hop_limit: packet.hop_limit(),
            sl: packet.sl(),
            subnet_local: packet.subnet_local(),
            local_ack_timeout: packet.local_ack_timeout(),
        })
    }

    /// Length of the emitted path: 44.
    pub const fn buffer_len(&self) -> usize {
        LEN
    }

    /// Writes the path description (reserved bits 0).
    ///
    /// # Panics
    /// If the buffer is shorter than 44 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_lid(self.local_lid);
        packet.set_remote_lid(self.remote_lid);
        packet.set_local_gid(self.local_gid);
        packet.set_remote_gid(self.remote_gid);
        packet.set_flow_label_and_rate(self.flow_label, self.packet_rate);
        packet.set_traffic_class(self.traffic_class);
        packet.set_hop_limit(self.hop_limit);
        packet.set_sl_and_subnet_local(self.sl, self.subnet_local);
        packet.set_local_ack_timeout(self.local_ack_timeout);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "path ({err})"),
        }
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "path gid={} > {} lid={:#06x} > {:#06x} flow={:#07x} tc={} hop={} sl={} rate={} ack_timeout={}",
            self.local_gid,
            self.remote_gid,
            self.local_lid,
            self.remote_lid,
            self.flow_label,
            self.traffic_class,
            self.hop_limit,
            self.sl,
            self.packet_rate,
            self.local_ack_timeout
        )?;
        if self.subnet_local {
            f.write_str(" subnet_local")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use core::net::Ipv4Addr;

    // rping-linux.pcap frame 5: the REQ primary path, 10.77.0.2 > 10.77.0.1.
    static PATH: [u8; 44] = [
        0xff, 0xff, 0xff, 0xff, // LIDs
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2, // local GID
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1, // remote GID
        0x73, 0xb7, 0x30, 0x00, // flow label 0x73b73, rate 0
        0x00, 0x40, 0x00, 0x98, // tc 0, hop 64, SL 0, ACK timeout 19
    ];

    fn repr() -> Repr {
        Repr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 2)),
            remote_gid: Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)),
            flow_label: 0x7_3b73,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&PATH[..]).unwrap();
        assert_eq!(packet.local_lid(), 0xffff);
        assert_eq!(
            packet.local_gid().to_ipv4(),
            Some(Ipv4Addr::new(10, 77, 0, 2))
        );
        assert_eq!(packet.flow_label(), 0x7_3b73);
        assert_eq!(packet.hop_limit(), 64);
        assert_eq!(packet.local_ack_timeout(), 19);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 44];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_local_lid(0xffff);
        packet.set_remote_lid(0xffff);
        packet.set_local_gid(Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 2)));
        packet.set_remote_gid(Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)));
        packet.set_flow_label_and_rate(0x7_3b73, 0);
        packet.set_traffic_class(0);
        packet.set_hop_limit(64);
        packet.set_sl_and_subnet_local(0, false);
        packet.set_local_ack_timeout(19);
        assert_eq!(buf, PATH);
    }

    #[test]
    fn test_parse() {
        assert_eq!(Repr::parse(&Packet::new_unchecked(&PATH[..])), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 44];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, PATH);
    }
}
