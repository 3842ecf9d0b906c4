//! What brings a QP to RTS: the path and the negotiated parameters.

use verbs::AccessFlags;

use super::config;
use crate::types::{Mtu, Psn, Qpn};

/// Where the peer is: Ethernet and IPv4 addresses plus the IP/UDP fields of
/// every frame the QP sends (roce-v2.md §1.2-1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// Our MAC.
    pub local_mac: [u8; 6],
    /// The peer's MAC (from ARP).
    pub peer_mac: [u8; 6],
    /// Our IPv4 address.
    pub local_ip: [u8; 4],
    /// The peer's IPv4 address; packets from any other source are dropped.
    pub peer_ip: [u8; 4],
    /// UDP source port, constant per QP (rxe: ≥ 0xC000, see
    /// [`crate::wire::udp::source_port_for_qpn`]).
    pub udp_src_port: u16,
    /// IPv4 TOS (CM traffic class, normally 0).
    pub tos: u8,
    /// IPv4 TTL (CM hop limit, normally 64).
    pub ttl: u8,
}

/// Everything needed to bring an RC QP to RTS: what the CM negotiates
/// (roce-v2.md §2.1, ib-cm.md §4) or a test sets directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// The peer's QPN (BTH DestQP of everything we send).
    pub peer_qpn: Qpn,
    /// Our first send PSN (the peer's expected PSN).
    pub send_psn: Psn,
    /// The first PSN we expect from the peer.
    pub recv_psn: Psn,
    /// Path MTU: payload bytes per packet.
    pub mtu: Mtu,
    /// Local ACK timeout exponent: retransmit after 4.096 µs · 2^t (0 is
    /// replaced by [`config::DEFAULT_ACK_TIMEOUT`]; values above 31 by 31).
    pub local_ack_timeout: u8,
    /// Retransmissions allowed on timeout/NAK 0x60 before `RetryExcErr`;
    /// 7 = infinite (as rxe).
    pub retry_count: u8,
    /// RNR retries allowed before `RnrRetryExcErr`; 7 = infinite.
    pub rnr_retry: u8,
    /// RNR timer code we put into our RNR NAKs (roce-v2.md §2.3.6).
    pub min_rnr_timer: u8,
    /// RDMA READs we may have outstanding at the peer (its responder
    /// resources); 0 forbids posting READs.
    pub max_rd_atomic: u8,
    /// RDMA READs we serve at once (our responder resources); 0 refuses
    /// incoming READs with NAK 0x61. Capped at [`config::READ_RESOURCES`].
    pub max_dest_rd_atomic: u8,
    /// Remote operations the peer may do on this QP: REMOTE_WRITE and/or
    /// REMOTE_READ (others NAK 0x61).
    pub remote_access: AccessFlags,
    /// Addressing.
    pub path: Path,
    /// Selective retransmission ([`super::selective`], Brick's extension): set
    /// only when both ends are Brick and said so in the CM exchange; off,
    /// the QP speaks standard go-back-N.
    pub selective_retransmission: bool,
}

impl QpParams {
    /// The retransmit timeout in nanoseconds (4.096 µs · 2^t).
    pub fn ack_timeout_ns(&self) -> u64 {
        let t = match self.local_ack_timeout {
            0 => config::DEFAULT_ACK_TIMEOUT,
            t => t.min(31),
        };
        4096u64 << t
    }
}

/// RNR NAK timer code → delay in nanoseconds (roce-v2.md §2.3.6).
pub fn rnr_delay_ns(code: u8) -> u64 {
    const MICROS: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    u64::from(MICROS[usize::from(code & 0x1f)]) * 1000
}
