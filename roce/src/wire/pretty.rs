//! A pretty-printer that walks a whole frame: Ethernet to MAD, CM and RDMA CM.
//!
//! STYLE.md §4: one `PrettyPrinter` is the debugging tool, the fuzz target and
//! the golden-test output. It walks Ethernet → ARP | IPv4 → ICMP | UDP 4791 →
//! BTH → extended headers (by opcode) → on QP1 the MAD / CM message, the REQ
//! paths and the RDMA CM header in the REQ private data. Layer 2-4 go on the
//! first line; every further layer on an indented line of its own.
//!
//! It never panics: a layer that does not parse is printed as `(layer: error)`
//! and ends the walk.

use core::fmt;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr};

use super::cm::{self, Message, TrimmedHex};
use super::ethernet::Colons;
use super::icrc::compute_icrc;
use super::{
    arp, ethernet, ipv4, mad, rdma_cm, udp, ArpRepr, EtherType, Ipv4Repr, Opcode, RoceFrame,
    UdpRepr,
};
use crate::types::Qpn;

/// Displays a frame layer by layer (see the module docs).
///
/// ```
/// use roce::wire::PrettyPrinter;
/// let arp = [
///     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0x77, 0, 2, 0x08, 0x06,
///     0, 1, 0x08, 0, 6, 4, 0, 1, 0x52, 0x54, 0, 0x77, 0, 2, 10, 77, 0, 2,
///     0, 0, 0, 0, 0, 0, 10, 77, 0, 1,
/// ];
/// assert_eq!(
///     PrettyPrinter::new(&arp).to_string(),
///     "52:54:00:77:00:02 > ff:ff:ff:ff:ff:ff ARP request who-has 10.77.0.1 tell 10.77.0.2"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PrettyPrinter<'a> {
    frame: &'a [u8],
}

impl<'a> PrettyPrinter<'a> {
    /// A printer for one Ethernet frame.
    pub fn new(frame: &'a [u8]) -> PrettyPrinter<'a> {
        PrettyPrinter { frame }
    }
}

/// At most 16 bytes as hex, then `..` if there are more.
struct Preview<'a>(&'a [u8]);

impl fmt::Display for Preview<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0.iter().take(16) {
            write!(f, "{byte:02x}")?;
        }
        if self.0.len() > 16 {
            f.write_str("..")?;
        }
        Ok(())
    }
}

impl fmt::Display for PrettyPrinter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let eth = match ethernet::Frame::new_checked(self.frame) {
            Ok(eth) => eth,
            Err(_) => return write!(f, "(Ethernet: truncated, {} bytes)", self.frame.len()),
        };
        write!(
            f,
            "{} > {} ",
            Colons(eth.src_addr()),
            Colons(eth.dst_addr())
        )?;
        match eth.ethertype() {
            EtherType::Arp => print_arp(f, eth.payload()),
            EtherType::Ipv4 => print_ipv4(f, self.frame, eth.payload()),
            other => write!(f, "type={other} len={}", eth.payload().len()),
        }
    }
}

fn print_arp(f: &mut fmt::Formatter<'_>, payload: &[u8]) -> fmt::Result {
    let repr = arp::Packet::new_checked(payload)
        .ok()
        .and_then(|packet| ArpRepr::parse(&packet).ok());
    match repr {
        Some(ArpRepr::EthernetIpv4 {
            operation: arp::Operation::Request,
            source_protocol_addr,
            target_protocol_addr,
            ..
        }) => write!(
            f,
            "ARP request who-has {target_protocol_addr} tell {source_protocol_addr}"
        ),
        Some(ArpRepr::EthernetIpv4 {
            operation: arp::Operation::Reply,
            source_hardware_addr,
            source_protocol_addr,
            ..
        }) => write!(
            f,
            "ARP reply {source_protocol_addr} is-at {}",
            Colons(source_hardware_addr)
        ),
        Some(other) => write!(f, "{other}"),
        None => f.write_str("(ARP: malformed)"),
    }
}

fn print_ipv4(f: &mut fmt::Formatter<'_>, frame: &[u8], payload: &[u8]) -> fmt::Result {
    let packet = ipv4::Packet::new_unchecked(payload);
    let ip = match Ipv4Repr::parse(&packet) {
        Ok(ip) => ip,
        Err(err) => return write!(f, "(IPv4: {err})"),
    };
    write!(f, "{ip}")?;
    match ip.protocol {
        ipv4::Protocol::Icmp => {
            let caps = ChecksumCapabilities::default();
            let repr = Icmpv4Packet::new_checked(packet.payload())
                .and_then(|icmp| Icmpv4Repr::parse(&icmp, &caps));
            match repr {
                Ok(icmp) => write!(f, " | {icmp}"),
                Err(_) => f.write_str(" | (ICMPv4: malformed)"),
            }
        }
        ipv4::Protocol::Udp => {
            let udp_packet = udp::Packet::new_unchecked(packet.payload());
            match UdpRepr::parse(&udp_packet, ip.src_addr, ip.dst_addr) {
                Ok(udp) => {
                    write!(f, " | {udp} len={}", udp_packet.len())?;
                    if udp.dst_port == udp::ROCE_V2_PORT {
                        print_roce(f, frame)?;
                    }
                    Ok(())
                }
                Err(err) => write!(f, " | (UDP: {err})"),
            }
        }
        _ => Ok(()),
    }
}

fn print_roce(f: &mut fmt::Formatter<'_>, frame: &[u8]) -> fmt::Result {
    let roce = match RoceFrame::parse(frame) {
        Ok(roce) => roce,
        Err(err) => return write!(f, "\n  (RoCEv2: {err})"),
    };
    write!(f, "\n  {}", roce.bth)?;
    if !roce.ext.set().is_empty() {
        write!(f, " | {}", roce.ext)?;
    }
    write!(f, " | payload={}", roce.payload.len())?;
    let gsi = roce.bth.dest_qp == Qpn::GSI && roce.bth.opcode == Opcode::UdSendOnly;
    if !roce.payload.is_empty() && !gsi {
        write!(f, " {}", Preview(roce.payload))?;
    }
    match compute_icrc(frame) {
        Ok(icrc) if icrc == roce.icrc => write!(f, " | icrc={:#010x} ok", roce.icrc)?,
        Ok(icrc) => write!(f, " | icrc={:#010x} BAD (expected {icrc:#010x})", roce.icrc)?,
        Err(err) => write!(f, " | icrc=({err})")?,
    }
    if gsi {
        print_mad(f, roce.payload)?;
    }
    Ok(())
}

fn print_mad(f: &mut fmt::Formatter<'_>, payload: &[u8]) -> fmt::Result {
    let err = match cm::Repr::parse(payload) {
        Ok(repr) => return print_cm(f, &repr),
        Err(err) => err,
    };
    match mad::Packet::new_checked(payload).and_then(|packet| mad::Repr::parse(&packet)) {
        Ok(header) => write!(f, "\n  {header} (CM: {err})"),
        Err(mad_err) => write!(f, "\n  (MAD: {mad_err})"),
    }
}

fn print_cm(f: &mut fmt::Formatter<'_>, repr: &cm::Repr<'_>) -> fmt::Result {
    write!(f, "\n  {repr}")?;
    if let Message::Req(req) = &repr.message {
        write!(f, "\n    primary {}", req.primary_path)?;
        if req.alternate_path != cm::PathRepr::default() {
            write!(f, "\n    alternate {}", req.alternate_path)?;
        }
        if let Some((port_space, port)) = rdma_cm::parse_service_id(req.service_id) {
            let packet = rdma_cm::Packet::new_unchecked(req.private_data);
            return match rdma_cm::Repr::parse(&packet) {
                Ok(cma) => write!(
                    f,
                    "\n  {cma}:{port} ({port_space:?}) user_data={}",
                    TrimmedHex(packet.payload())
                ),
                Err(err) => write!(f, "\n  (RDMA-CM: {err})"),
            };
        }
    }
    let private_data = repr.message.private_data();
    if private_data.iter().any(|&b| b != 0) {
        write!(f, "\n    private_data={}", TrimmedHex(private_data))?;
    }
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_never_panics_on_prefixes() {
        // Worked example 1 of roce-v2.md §1.8, cut at every length.
        let frame = [
            0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x02, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x01, 0x08, 0x00,
            0x45, 0x00, 0x00, 0x34, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x11, 0x9b, 0x1f, 0xc0, 0xa8,
            0x01, 0x01, 0xc0, 0xa8, 0x01, 0x02, 0xd3, 0xa5, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00,
            0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x01, 0x23, 0x80, 0x12, 0x34, 0x56, 0x68, 0x65,
            0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0x4d, 0xbc, 0xfc, 0xef,
        ];
        let full = PrettyPrinter::new(&frame).to_string();
        assert_eq!(
            full,
            "aa:bb:cc:00:00:01 > aa:bb:cc:00:00:02 IPv4 192.168.1.1 > 192.168.1.2 UDP tos=0x00 \
             ttl=64 id=0x1c46 DF len=32 | UDP 54181 > 4791 len=32\n  BTH RC_SEND_ONLY \
             qp=0x000123 psn=1193046 ackreq pad=3 | payload=5 68656c6c6f | icrc=0xeffcbc4d ok"
        );
        for len in 0..frame.len() {
            let _ = PrettyPrinter::new(&frame[..len]).to_string();
        }
    }
}
