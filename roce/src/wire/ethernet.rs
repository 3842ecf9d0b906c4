//! Ethernet II header (14 bytes), from smoltcp's wire module.
//!
//! RoCEv2 frames are untagged Ethernet II with EtherType 0x0800 (roce-v2.md
//! §1.1); ARP (0x0806) resolves the peer's MAC. Brick builds the Ethernet header
//! itself on every path that owns the NIC. smoltcp's `Frame` view and `Repr`
//! (`parse`/`emit`/`buffer_len`, `Display`) are used unchanged; its unit error
//! converts into [`ParseError::Truncated`](crate::wire::ParseError::Truncated).

pub use smoltcp::wire::{
    EthernetAddress as Address, EthernetFrame as Frame, EthernetProtocol as EtherType,
    EthernetRepr as Repr, ETHERNET_HEADER_LEN as HEADER_LEN,
};

/// Displays a MAC address the way tcpdump and tshark do (`52:54:00:77:00:01`);
/// smoltcp's own `Display` uses dashes.
pub(crate) struct Colons(pub Address);

impl core::fmt::Display for Colons {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let [a, b, c, d, e, g] = self.0 .0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}
