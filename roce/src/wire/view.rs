//! The fixed headers of a received RoCEv2 frame, checked and read in place.
//!
//! [`PacketView::parse`] makes every check the fast parser of
//! [`RoceFrame::parse`] makes on the 54 fixed header bytes (IPv4 without
//! options or fragments and with a right checksum, UDP to port 4791
//! without a checksum, TVer 0, a known opcode, lengths that fit) and
//! locates the extended headers, the payload and the ICRC, without
//! building the Ethernet, IPv4, UDP and extended-header reprs.
//! [`PacketView::frame`] builds them: that is the whole frame
//! `RoceFrame::parse` returns. A receive path that needs only the BTH, the
//! addresses and the payload (the middle packets of an RDMA WRITE) reads
//! them here and skips the rest.

use super::bytes::read_u32_le;
use super::frame::FIXED_HEADERS_LEN;
use super::icrc::{IcrcSeed, ICRC_LEN};
use super::{bth, ethernet, ipv4, udp};
use super::{BthRepr, EtherType, EthernetRepr, ExtHeaders, ExtSet, Ipv4Repr, RoceFrame, UdpRepr};

const IP: usize = ethernet::HEADER_LEN;
const UDP: usize = IP + ipv4::HEADER_LEN;
const BTH: usize = UDP + udp::HEADER_LEN;

/// A received RoCEv2 frame whose fixed headers passed the checks of
/// [`PacketView::parse`]; the ICRC is not checked yet
/// ([`PacketView::icrc_end`] says what it covers).
#[derive(Debug, Clone, Copy)]
pub struct PacketView<'a> {
    frame: &'a [u8],
    headers: &'a [u8; FIXED_HEADERS_LEN],
    /// The base transport header.
    pub bth: BthRepr,
    layout: ExtSet,
    ext: &'a [u8],
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC field as received.
    pub icrc: u32,
    icrc_end: usize,
}

impl<'a> PacketView<'a> {
    /// The view of `frame`, or `None` where [`RoceFrame::parse`] would not
    /// take its fast path (it then reads the frame layer by layer).
    #[inline(always)]
    pub fn parse(frame: &'a [u8]) -> Option<PacketView<'a>> {
        let h: &[u8; FIXED_HEADERS_LEN] = frame.first_chunk()?;
        let be16 = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
        if be16(12) != 0x0800 {
            return None;
        }
        let ip: &[u8; ipv4::HEADER_LEN] = h[IP..UDP].first_chunk()?;
        // Version 4, IHL 5; MF clear and fragment offset 0; protocol UDP.
        if ip[0] != 0x45 || ip[6] & 0x3f != 0 || ip[7] != 0 || ip[9] != 17 {
            return None;
        }
        if !ipv4::checksum_ok(ip) {
            return None;
        }
        let total_len = usize::from(be16(IP + 2));
        let ip_payload = frame.get(UDP..IP + total_len)?;
        let udp_len = usize::from(be16(UDP + 4));
        if be16(UDP + 2) != udp::ROCE_V2_PORT
            || be16(UDP + 6) != 0
            || udp_len < udp::HEADER_LEN
            || udp_len > ip_payload.len()
        {
            return None;
        }
        let ib = &ip_payload[udp::HEADER_LEN..udp_len];
        if ib.len() < bth::HEADER_LEN + ICRC_LEN || h[BTH + 1] & 0x0f != 0 {
            return None;
        }
        let bth = BthRepr {
            opcode: bth::Opcode::from(h[BTH]),
            solicited: h[BTH + 1] & 0x80 != 0,
            mig_req: h[BTH + 1] & 0x40 != 0,
            pad_count: (h[BTH + 1] >> 4) & 0x03,
            pkey: crate::types::Pkey(be16(BTH + 2)),
            fecn: h[BTH + 4] & 0x80 != 0,
            becn: h[BTH + 4] & 0x40 != 0,
            dest_qp: crate::types::Qpn::new_truncate(u32::from_be_bytes([
                0,
                h[BTH + 5],
                h[BTH + 6],
                h[BTH + 7],
            ])),
            ack_req: h[BTH + 8] & 0x80 != 0,
            psn: crate::types::Psn::new_truncate(u32::from_be_bytes([
                0,
                h[BTH + 9],
                h[BTH + 10],
                h[BTH + 11],
            ])),
        };
        let layout = bth.opcode.ext_headers()?;
        let payload_start = bth::HEADER_LEN + layout.len();
        let icrc_start = ib.len() - ICRC_LEN;
        let payload_end = icrc_start
            .checked_sub(usize::from(bth.pad_count))
            .filter(|&end| end >= payload_start)?;
        Some(PacketView {
            frame,
            headers: h,
            bth,
            layout,
            ext: &ib[bth::HEADER_LEN..payload_start],
            payload: &ib[payload_start..payload_end],
            icrc: read_u32_le(&ib[icrc_start..]),
            icrc_end: UDP + udp_len,
        })
    }

    /// Where the ICRC field ends in the frame (`14 + 20 + UDP length`):
    /// the ICRC covers the frame up to 4 bytes before.
    pub fn icrc_end(&self) -> usize {
        self.icrc_end
    }

    /// Whether the ICRC field holds the ICRC of the frame, computed from
    /// `seed` (`verify_icrc_from` without locating the field again).
    ///
    /// # Fuzzing
    /// Always true under `cfg(fuzzing)`.
    #[inline]
    pub fn icrc_ok(&self, seed: &IcrcSeed) -> bool {
        cfg!(fuzzing) || seed.start(&self.frame[..self.icrc_end - ICRC_LEN]).finish() == self.icrc
    }

    /// The IPv4 source address.
    pub fn src_ip(&self) -> [u8; 4] {
        let h = self.headers;
        [h[IP + 12], h[IP + 13], h[IP + 14], h[IP + 15]]
    }

    /// The IPv4 destination address.
    pub fn dst_ip(&self) -> [u8; 4] {
        let h = self.headers;
        [h[IP + 16], h[IP + 17], h[IP + 18], h[IP + 19]]
    }

    /// The whole frame, as [`RoceFrame::parse`] returns it; `None` if the
    /// extended headers do not parse (the layered parser then names why).
    #[inline(always)]
    pub fn frame(&self) -> Option<RoceFrame<'a>> {
        let h = self.headers;
        let be16 = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
        let ext = ExtHeaders::parse(self.layout, self.ext).ok()?;
        let address = |at: usize| ipv4::Address::from([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        Some(RoceFrame {
            eth: EthernetRepr {
                src_addr: ethernet::Address([h[6], h[7], h[8], h[9], h[10], h[11]]),
                dst_addr: ethernet::Address([h[0], h[1], h[2], h[3], h[4], h[5]]),
                ethertype: EtherType::Ipv4,
            },
            ip: Ipv4Repr {
                src_addr: address(IP + 12),
                dst_addr: address(IP + 16),
                protocol: ipv4::Protocol::Udp,
                payload_len: usize::from(be16(IP + 2)) - ipv4::HEADER_LEN,
                ttl: h[IP + 8],
                tos: h[IP + 1],
                ident: be16(IP + 4),
                dont_frag: h[IP + 6] & 0x40 != 0,
            },
            udp: UdpRepr {
                src_port: be16(UDP),
                dst_port: udp::ROCE_V2_PORT,
            },
            bth: self.bth,
            ext,
            payload: self.payload,
            icrc: self.icrc,
        })
    }
}
