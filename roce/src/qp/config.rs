//! Default depths of a queue pair, its fixed capacities and the
//! transport constants.

/// Default send depth per QP ([`super::Qp::new`]; an HCA sets its own,
/// `HcaCapacity::send_depth`): posted, not yet completed send WRs plus
/// their completions not yet consumed.
pub const SQ_DEPTH: usize = 128;
/// Default receive depth per QP, counted as [`SQ_DEPTH`] is. An RTRS server posts queue_depth + 1
/// receives on cid 0 (512 + 1 with the Linux client's queue depth); an
/// RTRS client posts two per request plus 8 on every connection (1032
/// for the default queue depth of 512), so this must exceed 1032.
pub const RQ_DEPTH: usize = 2048;
/// Remembered incoming RDMA READs per QP, for duplicate replay; also the
/// most READs the responder serves at once (`max_dest_rd_atomic` cap).
pub const READ_RESOURCES: usize = 16;
/// Queued responder output (ACK/NAK, READ reply streams) per QP.
pub const RESPONSE_DEPTH: usize = 32;
/// How far past the oldest unacknowledged PSN the requester may send
/// (rxe `RXE_MAX_UNACKED_PSNS`, roce-v2.md §2.3.3: PSN `una + 128` is
/// the last allowed, as in the captures).
pub const MAX_UNACKED_PSNS: u32 = 128;
/// AckReq is set on every message's last packet and on the this-many-th
/// consecutive non-final packet since the last AckReq, exactly as rxe
/// does (more than `RXE_MAX_PKT_PER_ACK` = 64, roce-v2.md §2.3.2; seen at
/// the 66th in `rnbd-linux-srv-linux-clt.pcap`).
pub const ACK_REQ_INTERVAL: u32 = 66;
/// Largest message (rxe `RXE_PORT_MAX_MSG_SZ`); bounds the PSNs one WR
/// takes, keeping every outstanding PSN within the 2^23 comparison window.
pub const MAX_MESSAGE_LEN: u32 = 8 << 20;
/// Local ACK timeout exponent used when the negotiated one is 0 (which IB
/// defines as "no timer"): Brick never runs without a retransmit timer.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// Floor of the adaptive retransmit timeout and of its margin over the
/// smoothed RTT: 5 ms. The timeout is `SRTT + max(G, 4·RTTVAR)` with G
/// this value (RFC 6298 §2.3, where G is the clock granularity), capped
/// by the negotiated Local ACK Timeout (a QP negotiating less gets less).
///
/// `4·RTTVAR` only covers delays the requester has seen; G covers those
/// it has not. The peer's ACK is produced by software: Linux rxe builds it
/// in its responder task, which a busy or descheduled (virtual) CPU can
/// hold back for a scheduler tick (4 ms at HZ=250) on top of the usual
/// round trip, before the RTT samples ever show it. 5 ms is above one
/// tick, far above the tens to hundreds of µs of a LAN or a host-local
/// relay, and still 400 times below the 2.15 s default timeout, so a
/// lost tail packet costs milliseconds instead of seconds. A timer that
/// fires too early is cheap for RC: the responder re-ACKs duplicate
/// SEND/WRITE packets and replays READ responses (roce-v2.md §2.5 item
/// 5), and such a timeout never consumes the retry count (see the
/// requester).
pub const MIN_RETRANSMIT_TIMEOUT_NS: u64 = 5_000_000;
/// Retransmit timeout before the first RTT sample: 100 ms (capped by the
/// negotiated Local ACK Timeout).
///
/// Nothing is known about the path yet, and the first messages of a
/// connection meet the slowest peer: a VM under TCG translating the code
/// path for the first time, page faults on fresh buffers, a relay. 100 ms
/// is well above the multi-millisecond round trips of TCG guests, yet
/// 20 times below the 2.15 s default; one valid sample replaces it.
pub const INITIAL_RETRANSMIT_TIMEOUT_NS: u64 = 100_000_000;
/// Floor of the adaptive retransmit timeout on a QP with selective
/// retransmission (both ends Brick, [`super::selective`]): 1 ms. An
/// expiry there resends two packets (the oldest unacknowledged and the
/// newest), not a window, so firing early is cheap, while a lost tail
/// packet at queue depth 1 costs a millisecond instead of five.
pub const SELECTIVE_MIN_RETRANSMIT_TIMEOUT_NS: u64 = 1_000_000;
