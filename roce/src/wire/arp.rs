//! ARP for Ethernet/IPv4 (28 bytes), from smoltcp's wire module.
//!
//! A RoCEv2 server must answer who-has for its address and resolve the
//! client's MAC (roce-v2.md §1.1, §1.11): rxe hands its packets to the kernel
//! IP stack, which fills the destination MAC from the neighbour table. smoltcp's
//! `Packet` view and `Repr::EthernetIpv4` (`parse`/`emit`/`buffer_len`,
//! `Display`) are used unchanged.

pub use smoltcp::wire::{
    ArpHardware as Hardware, ArpOperation as Operation, ArpPacket as Packet, ArpRepr as Repr,
};
