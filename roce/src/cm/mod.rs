//! IB CM + RDMA CM connection state machines for the software HCA (sans-IO).
//!
//! ib-cm.md §4-6 (IB CM over RoCEv2, the RDMA CM conventions on top, the message
//! sequence with a Linux client and its timers), roce-v2.md §2.1 (which CM field
//! becomes which QP attribute) and checklist.md A.4/B (the passive side's duties
//! and its reactions to hostile input). [`Cm`] owns the CM state of a fixed number
//! of connections; it does not know queue pairs: everything the HCA needs to build
//! one is in the events, and everything the CM needs from the HCA (local QPN,
//! starting PSN, "the first data packet arrived") is passed in.
//!
//! # Driving it (what the HCA does)
//!
//! ```text
//! QP1 receive  --(now, rng, Route, &wire::cm::Repr)-->  Cm::process / process_mad
//! poll loop    --(now)--------------------------------> Cm::poll      (timers; bounded)
//!              <------------------------------------- Cm::poll_at     (next deadline)
//! QP1 send     <------------------------------------- Cm::dispatch    (Outbound MADs)
//! consumer     <------------------------------------- Cm::poll_event  (Event)
//! consumer     --(accept / reject / delay / connect / ready_to_use / disconnect)--> Cm
//! RC receive   --(first valid packet: Cm::conn_by_qpn)--> Cm::notify_data_received
//! QPN alloc    --(qpn)--------------------------------> Cm::qpn_in_use (timewait guard)
//! ```
//!
//! - **Inbound**: every CM MAD received on QP1 (UD SEND_ONLY, Q_Key 0x80010000,
//!   roce-v2.md §3) goes to [`Cm::process_mad`] (raw 256 bytes: malformed MADs are
//!   counted and dropped, checklist B) or, already parsed, to [`Cm::process`]. The
//!   [`Route`] names our IPv4 address (the IP destination), the sender's IPv4 and MAC
//!   (IP/Ethernet source): replies go back there (roce-v2.md §3, "Addressing of
//!   replies"). The HCA checks the GSI rules first (DestQP 1, Q_Key 0x80010000,
//!   P_Key, ICRC, checklist B): the CM sees only the MAD.
//! - **Outbound**: [`Cm::dispatch`] hands out one [`Outbound`] at a time: the 256-byte
//!   MAD plus its [`Route`], traffic class and hop limit. The HCA wraps it in
//!   Ethernet/IPv4/UDP/BTH(UD SEND_ONLY to QP1)/DETH(Q_Key 0x80010000, SrcQP 1). A
//!   full output is never fatal: messages that expect an answer are retransmitted by
//!   the timers and answers are re-sent on duplicates.
//! - **Events** ([`Event`]): passive [`Event::ConnectRequest`] (answer with
//!   [`Cm::accept`], [`Cm::reject`] or [`Cm::delay`]), active [`Event::Reply`]
//!   (set the QP up, then [`Cm::ready_to_use`] sends the RTU, or [`Cm::reject`]),
//!   [`Event::Established`] (passive: RTU or first data packet),
//!   [`Event::Rejected`], [`Event::TimedOut`], [`Event::Disconnected`] (move the QP
//!   to the error state). Events come out in the order they happened.
//! - **Identifiers**: a connection is named by a [`ConnId`] (slot + generation: a
//!   stale id never names a newer connection). Local Comm IDs and transaction IDs
//!   come from the [`Random`] source passed to the calls that create them.
//! - **Timewait**: after a disconnect or a rejected REP the connection stays in
//!   [`State::Timewait`] for [`Config::timewait`]; until then
//!   [`Cm::qpn_in_use`] is `true` for its QPN and its Local Comm ID is not reused
//!   (ib-cm.md §4.9). The HCA's QPN allocator must skip QPNs in use.
//!
//! Time is a monotonic nanosecond count (`now: u64`, the HAL clock). Every call does
//! work bounded by the connection capacity `N`.
//!
//! # Not implemented
//! LAP/APR (alternate paths; none on RoCE), SIDR, MRA(REP) sent by the active side,
//! IPv6 CMA headers (rejected with reason 28), checking the REQ's GIDs against the
//! IP header (Linux uses the CMA header addresses, as we do).

mod machine;
mod state;

pub use self::machine::{Accepted, Cm};
pub use self::state::State;

use crate::types::{Mtu, Psn, Qpn};
use crate::wire::{EthernetAddress, Ipv4Address};

pub use crate::wire::cm::RejectReason;
pub use verbs::{ConnId, PrivateData};

/// Length of a CM MAD on the wire.
pub const MAD_LEN: usize = crate::wire::mad::MAD_LEN;

/// Where the port space RDMA_PS_TCP puts user data in a REQ: after the 36-byte CMA
/// header, 56 bytes (ib-cm.md §5.2).
pub const REQ_USER_DATA_LEN: usize =
    crate::wire::cm::req::PRIVATE_DATA_LEN - crate::wire::rdma_cm::HEADER_LEN;

/// Most RDMA CM ports [`Cm::listen`] serves at once.
pub const MAX_LISTENERS: usize = 8;

/// MADs that belong to no connection (REJ for an unknown service, DREP for an
/// unknown DREQ) waiting for [`Cm::dispatch`]; more are dropped and counted.
pub const STATELESS_QUEUE_LEN: usize = 8;

/// A source of random 32-bit values (comm IDs, transaction IDs).
///
/// Implemented for every `FnMut() -> u32`. The HAL's RDRAND / getrandom source in
/// the image; a seeded generator in tests.
pub trait Random {
    /// The next random value.
    fn next_u32(&mut self) -> u32;
}

impl<F: FnMut() -> u32> Random for F {
    fn next_u32(&mut self) -> u32 {
        self()
    }
}

/// A peer's link-layer and IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// The peer's MAC (Ethernet source of its MADs, or resolved by ARP).
    pub mac: EthernetAddress,
    /// The peer's IPv4 address.
    pub ip: Ipv4Address,
}

/// The addresses of one CM exchange: ours and the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// Our IPv4 address (destination of received MADs, source of sent ones).
    pub local_ip: Ipv4Address,
    /// The peer.
    pub peer: PeerAddr,
}

/// A MAD to send on QP1, produced by [`Cm::dispatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// Source IP, destination IP and MAC.
    pub route: Route,
    /// IPv4 TOS to send with: the REQ primary path's traffic class (ib-cm.md §6.1).
    pub traffic_class: u8,
    /// IPv4 TTL to send with: the REQ primary path's hop limit.
    pub hop_limit: u8,
    /// The whole 256-byte MAD (the UD payload).
    pub mad: [u8; MAD_LEN],
}

/// Fixed settings of a [`Cm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Our 64-bit CA GUID (REQ/REP "Local CA GUID"); stable and unique, e.g.
    /// [`guid_from_mac`] of the NIC (ib-cm.md §4.3).
    pub local_ca_guid: u64,
    /// REP Target ACK Delay; ≤ 17 keeps a Linux client's ACK timeout at 19
    /// (checklist A.4). rxe sends 15.
    pub target_ack_delay: u8,
    /// Our local CA ACK delay, used for the REQ's Local ACK Timeout
    /// ([`ack_timeout`] with the packet life time; rxe: 15).
    pub local_ca_ack_delay: u8,
    /// Path packet life time (IB time exponent) for our REQs; RDMA CM uses 18 on
    /// RoCE (ib-cm.md §6.2).
    pub packet_life_time: u8,
    /// CM response timeout (IB time exponent) we put in our REQs (20 like Linux).
    pub cm_response_timeout: u8,
    /// Retransmissions of our REQ and DREQ (15 like Linux).
    pub max_cm_retries: u8,
    /// How long a connection stays in timewait, nanoseconds.
    pub timewait: u64,
    /// How long a received REQ waits for [`Cm::accept`] / [`Cm::reject`] before it
    /// is rejected (reason 4, timeout) and reported as [`Event::TimedOut`],
    /// nanoseconds. [`Cm::delay`] restarts the wait.
    pub accept_timeout: u64,
    /// The largest path MTU we accept in a REQ; a larger one is rejected with
    /// reason 26 (invalid MTU, checklist B). Set it from the NIC's MTU with
    /// [`Mtu::for_ethernet_mtu`].
    pub max_path_mtu: Mtu,
    /// Upper bound on any CM timer exponent taken from the peer (REQ response
    /// timeout, MRA service timeout): a hostile peer cannot park a slot for hours.
    pub max_peer_timeout_exponent: u8,
    /// Offer Brick's selective retransmission (a reserved bit of our REQ,
    /// accepted by a reserved bit of the REP only when the REQ offered it;
    /// `docs/protocol/selective-retransmission.md`). A Linux peer sends and
    /// answers 0, so its connections keep standard go-back-N.
    pub selective_retransmission: bool,
}

impl Config {
    /// Linux-compatible defaults for the given CA GUID.
    pub const fn new(local_ca_guid: u64) -> Config {
        Config {
            local_ca_guid,
            target_ack_delay: 15,
            local_ca_ack_delay: 15,
            packet_life_time: 18,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            timewait: 4_096 * MILLISECOND,
            accept_timeout: 60_000 * MILLISECOND,
            max_path_mtu: Mtu::Mtu4096,
            max_peer_timeout_exponent: 24,
            selective_retransmission: true,
        }
    }
}

/// One millisecond in the nanosecond time base.
pub const MILLISECOND: u64 = 1_000_000;

/// The CM's millisecond approximation of an IB time exponent `t` (4.096 µs × 2^t):
/// `1 << max(t − 8, 0)` ms (ib-cm.md §4.1). Exponents above 31 count as 31.
pub const fn cm_timeout_ms(exponent: u8) -> u64 {
    let t = if exponent > 31 { 31 } else { exponent };
    1 << t.saturating_sub(8)
}

/// The RC ACK timeout exponent the CM derives from a CA ACK delay and the path
/// packet life time (ib-cm.md §4.3, roce-v2.md §2.1): twice the life time (one
/// more exponent), raised to the ACK delay, plus one when the two are within one of
/// each other; at most 31. With life time 18: delays ≤ 17 give 19, 18-19 give 20,
/// 20-21 give 21, larger ones themselves.
pub const fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let round_trip = packet_life_time as u16 + 1;
    let delay = ca_ack_delay as u16;
    let value = if round_trip >= delay {
        round_trip + (delay + 1 >= round_trip) as u16
    } else {
        delay + (round_trip + 1 >= delay) as u16
    };
    if value > 31 {
        31
    } else {
        value as u8
    }
}

/// The EUI-64 CA GUID of a MAC address, as rxe forms its node GUID: flip the
/// universal/local bit of the first byte and insert `ff fe` in the middle.
///
/// ```
/// use roce::cm::guid_from_mac;
/// use roce::wire::EthernetAddress;
/// let mac = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]);
/// assert_eq!(guid_from_mac(mac), 0x5054_00ff_fe77_0001);
/// ```
pub const fn guid_from_mac(mac: EthernetAddress) -> u64 {
    let m = mac.0;
    u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// Our side of a queue pair, as the HCA created it for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalQp {
    /// Our RC QPN (24-bit, never 0 or 1).
    pub qpn: Qpn,
    /// Our receive side's first expected PSN: the peer's first send PSN (REP or REQ
    /// Starting PSN). Random per connection (ib-cm.md §4.9).
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests from the peer we serve concurrently (0 = none).
    /// [`Cm::accept`] clamps it to the REQ's Initiator Depth.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we keep outstanding toward the peer. [`Cm::accept`]
    /// clamps it to the REQ's Responder Resources.
    pub initiator_depth: u8,
    /// The RNR retry count the *peer* should use for its sends to us (REP) or our
    /// own (REQ asks the peer for this one; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Our QP uses a shared receive queue (informational).
    pub srq: bool,
}

/// The RC queue pair attributes the CM negotiated: everything the HCA needs to move
/// its QP to RTR/RTS (roce-v2.md §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttributes {
    /// The peer's QPN (the BTH DestQP of everything we send).
    pub remote_qpn: Qpn,
    /// The PSN of our first request packet (passive: REQ Starting PSN; active: REP
    /// Starting PSN). Our first expected receive PSN is [`LocalQp::starting_psn`].
    pub send_psn: Psn,
    /// Path MTU (REQ Path Packet Payload MTU; both ends use it).
    pub path_mtu: Mtu,
    /// Our requester's ACK timeout exponent (passive: REQ Local ACK Timeout;
    /// active: [`ack_timeout`] of the REP's Target ACK Delay).
    pub ack_timeout: u8,
    /// Transport retries for our requester (7 = the maximum).
    pub retry_count: u8,
    /// RNR retries for our requester (7 = infinite).
    pub rnr_retry_count: u8,
    /// Most RDMA READ/atomics we may keep outstanding toward the peer.
    pub max_initiator_depth: u8,
    /// RDMA READ/atomics the peer wants to keep outstanding toward us.
    pub peer_initiator_depth: u8,
    /// IPv4 TOS for the connection's packets (REQ primary traffic class).
    pub traffic_class: u8,
    /// IPv4 TTL for the connection's packets (REQ primary hop limit).
    pub hop_limit: u8,
    /// The peer's CA GUID.
    pub remote_ca_guid: u64,
    /// The peer uses a shared receive queue (informational).
    pub peer_srq: bool,
    /// Both ends offered Brick's selective retransmission (REQ and REP
    /// reserved bits, `docs/protocol/selective-retransmission.md`): the QP
    /// runs it instead of go-back-N.
    pub selective_retransmission: bool,
}

/// A connection request (passive side), reported by [`Event::ConnectRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The addresses the REQ came over (replies and RC traffic use them).
    pub route: Route,
    /// The port we listen on (low 16 bits of the service ID).
    pub port: u16,
    /// The client's address as its RDMA CM sees it (CMA header source).
    pub cma_src_addr: Ipv4Address,
    /// The client's RDMA CM source port (CMA header).
    pub cma_src_port: u16,
    /// Our address the client connected to (CMA header destination).
    pub cma_dst_addr: Ipv4Address,
    /// The QP attributes from the REQ.
    pub qp: QpAttributes,
    /// The client's user private data: the 56 bytes after the CMA header
    /// (trailing zeros cannot be told from data, ib-cm.md §5.2).
    pub private_data: PrivateData,
}

impl ConnectRequest {
    /// Our address and listen port, as the verbs `ConnectRequest` event names them.
    pub fn local_addr(&self) -> core::net::SocketAddr {
        core::net::SocketAddr::new(core::net::IpAddr::V4(self.cma_dst_addr), self.port)
    }

    /// The client's address and RDMA CM source port.
    pub fn remote_addr(&self) -> core::net::SocketAddr {
        core::net::SocketAddr::new(core::net::IpAddr::V4(self.cma_src_addr), self.cma_src_port)
    }
}

/// A connection reply (active side), reported by [`Event::Reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The QP attributes from the REQ we sent and the REP.
    pub qp: QpAttributes,
    /// The REP's 196 bytes of private data (no CMA header, ib-cm.md §5.3).
    pub private_data: PrivateData,
}

/// What a connection waited for when its retries ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// Active: our REQ was never answered (REJ reason 4 sent).
    ForReply,
    /// Passive: our REP got neither RTU nor data (REJ reason 4 sent).
    ForReadyToUse,
    /// Passive: the consumer did not accept or reject in time (REJ reason 4 sent).
    ForConsumer,
}

/// Why a connection is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DisconnectCause {
    /// The peer sent a DREQ (we answered with DREP).
    PeerRequest,
    /// Our DREQ was answered by a DREP.
    Reply,
    /// Our DREQ got no DREP after every retry.
    TimedOut,
    /// A new REQ from the same peer GUID and QPN showed the old connection stale
    /// (REJ 10 to the new one, DREQ on this one, ib-cm.md §4.8).
    Stale,
}

/// A connection event, from [`Cm::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Passive: a REQ for a port we listen on. Create the QP (RTR, receives
    /// posted), then [`Cm::accept`]; or [`Cm::reject`]. If the client withdraws
    /// first (its REJ, or our accept timeout), a [`Event::Rejected`] or
    /// [`Event::TimedOut`] for the same id follows and `accept` answers
    /// [`CmError::UnknownConnection`].
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// The request.
        request: ConnectRequest,
    },
    /// Active: the REP arrived. Move the QP to RTR/RTS with these attributes, then
    /// call [`Cm::ready_to_use`] (RTU; the connection is established) or
    /// [`Cm::reject`].
    Reply {
        /// The connection.
        conn: ConnId,
        /// The reply.
        reply: Reply,
    },
    /// Passive: the RTU or the first data packet arrived; the QP may send.
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer sent a REJ: for our REQ (active) or our REP (passive), or it gave
    /// up waiting (reason 4). The connection is gone.
    Rejected {
        /// The connection.
        conn: ConnId,
        /// The REJ reason.
        reason: RejectReason,
        /// The REJ's 148 bytes of private data.
        private_data: PrivateData,
    },
    /// No answer after every retry; the connection is gone.
    TimedOut {
        /// The connection.
        conn: ConnId,
        /// What it waited for.
        waiting_for: Waiting,
    },
    /// The connection is down: move the QP to the error state. Its QPN stays in
    /// use until timewait ends ([`Cm::qpn_in_use`]).
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// Why.
        cause: DisconnectCause,
    },
}

impl Event {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            Event::ConnectRequest { conn, .. }
            | Event::Reply { conn, .. }
            | Event::Established { conn }
            | Event::Rejected { conn, .. }
            | Event::TimedOut { conn, .. }
            | Event::Disconnected { conn, .. } => *conn,
        }
    }
}

/// What an active connection asks for ([`Cm::connect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams<'a> {
    /// Our address and the server's (its MAC resolved by ARP).
    pub route: Route,
    /// The server's RDMA CM port (service ID `0x0106 << 16 | port`).
    pub port: u16,
    /// Our RDMA CM source port (CMA header; also feeds the flow label).
    pub src_port: u16,
    /// Our QP.
    pub qp: LocalQp,
    /// Path MTU for both directions.
    pub path_mtu: Mtu,
    /// Transport retries for both ends' requesters (≤ 7).
    pub retry_count: u8,
    /// IPv4 TOS (REQ primary traffic class).
    pub traffic_class: u8,
    /// IPv4 TTL (REQ primary hop limit; 64 normally).
    pub hop_limit: u8,
    /// User private data after the CMA header (at most [`REQ_USER_DATA_LEN`]).
    pub private_data: &'a [u8],
}

/// Why a [`Cm`] call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmError {
    /// The id names no live connection (never issued, or its connection ended).
    UnknownConnection,
    /// The connection is not in a state that allows the call.
    InvalidState,
    /// Private data longer than the message's field.
    PrivateDataTooLong,
    /// Every connection slot (or every listener slot) is taken.
    NoResources,
    /// A parameter outside its range: QPN 0/1, an unknown MTU, a 0 comm ID source.
    InvalidParameter,
    /// [`Cm::listen`] on a port already listened on.
    AlreadyListening,
    /// [`Cm::unlisten`] on a port not listened on.
    NotListening,
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            CmError::UnknownConnection => "unknown connection",
            CmError::InvalidState => "invalid state for this call",
            CmError::PrivateDataTooLong => "private data too long",
            CmError::NoResources => "no free connection or listener slot",
            CmError::InvalidParameter => "invalid parameter",
            CmError::AlreadyListening => "already listening on that port",
            CmError::NotListening => "not listening on that port",
        })
    }
}

impl core::error::Error for CmError {}

/// Counters of what the CM dropped or refused (for diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// MADs that did not parse as a CM message (checklist B: silent drop).
    pub malformed: u64,
    /// Parsed messages that matched no connection, or came in the wrong state.
    pub unmatched: u64,
    /// REQs answered with a REJ without reaching the consumer.
    pub rejected_requests: u64,
    /// Stateless replies dropped because their queue was full.
    pub stateless_dropped: u64,
    /// Retransmissions sent (REQ, REP, DREQ).
    pub retransmissions: u64,
    /// Timewaits ended early because every connection slot was taken.
    pub timewaits_cut: u64,
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_cm_timeout_ms() {
        assert_eq!(cm_timeout_ms(20), 4096);
        assert_eq!(cm_timeout_ms(19), 2048);
        assert_eq!(cm_timeout_ms(18), 1024);
        assert_eq!(cm_timeout_ms(0), 1);
        assert_eq!(cm_timeout_ms(255), 1 << 23);
    }

    #[test]
    fn test_ack_timeout_table() {
        // ib-cm.md §4.3 with packet life time 18.
        for delay in 0..=17 {
            assert_eq!(ack_timeout(delay, 18), 19, "delay {delay}");
        }
        assert_eq!(ack_timeout(18, 18), 20);
        assert_eq!(ack_timeout(19, 18), 20);
        assert_eq!(ack_timeout(20, 18), 21);
        assert_eq!(ack_timeout(21, 18), 21);
        assert_eq!(ack_timeout(25, 18), 25);
        assert_eq!(ack_timeout(31, 31), 31);
        assert_eq!(ack_timeout(15, 18), 19);
    }

    #[test]
    fn test_guid_from_mac() {
        let mac = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x02]);
        assert_eq!(guid_from_mac(mac), 0x5054_00ff_fe77_0002);
    }
}
