//! RTRS IO cases (rtrs.md §4, §5): bad immediates, chunk ids and offsets,
//! user headers and READ descriptors, floods, heartbeats, a client that
//! stops taking responses.

use rtrs::server::errno as rtrs_errno;
use rtrs::wire::{BufferDesc, Imm, WriteMsg};
use verbs::CmEvent;

use super::{await_sends, case, geometry, newcomer, raw_session, still_serves, Case};
use crate::clients::{raw_read_message, Fabric, RawOutcome, RAW_READ_DEST};
use crate::outcome::{errno_name, raw_outcome, tally};
use crate::wire::Wire;
use crate::Args;

/// Requests per connection and round of the flood (half the send queue).
const FLOOD_PER_CONN: u16 = 64;
/// Receive slots a raw node posts per connection (`clients.rs`), and the
/// answers the stalled client asks for on one.
const RECEIVES: usize = 64;
const ASKED: u16 = 96;
/// Heartbeats of the heartbeat storm.
const HEARTBEATS: usize = 1000;

pub fn cases(_args: &Args) -> Vec<Case> {
    let einval = errno_name(rtrs_errno::EINVAL);
    vec![
        case(
            "chunk_id_beyond_queue_depth",
            "path closed",
            |wire, args| {
                let r = raw_session(wire, args, "chunk-id");
                let (qd, _) = geometry(wire, r);
                bare_immediate(wire, r, u32::from(qd), 64)
            },
        ),
        case("offset_beyond_chunk", "path closed", |wire, args| {
            let r = raw_session(wire, args, "offset");
            let (_, chunk_size) = geometry(wire, r);
            bare_immediate(wire, r, 0, chunk_size + 8)
        }),
        case("message_overflows_chunk", "path closed", |wire, args| {
            // A WRITE message starting 2 bytes before the chunk's end.
            let r = raw_session(wire, args, "overflow");
            let (_, chunk_size) = geometry(wire, r);
            let at = chunk_size - 2;
            let imm = wire.raw_imm(r, 1, at);
            wire.raw_post(r, 1, &[(1, at, &2u16.to_le_bytes(), imm)]);
            closed_outcome(wire, r, 1)
        }),
        case("unknown_message_type", "path closed", |wire, args| {
            let r = raw_session(wire, args, "msg-type");
            let imm = wire.raw_imm(r, 2, 100);
            wire.raw_post(r, 1, &[(2, 100, &[9, 0, 0, 0], imm)]);
            closed_outcome(wire, r, 2)
        }),
        case(
            "usr_len_beyond_chunk_start",
            format!("answered {einval}; serves (protocol 2)"),
            |wire, args| {
                let r = raw_session(wire, args, "usr-len");
                let mut msg = [0u8; 4];
                WriteMsg { usr_len: 512 }
                    .emit(&mut msg)
                    .expect("a WRITE message fits 4 bytes");
                let imm = wire.raw_imm(r, 3, 64);
                wire.raw_post(r, 1, &[(3, 64, &msg, imm)]);
                let outcome = raw_outcome(wire.raw_await(r, 3));
                format!("{outcome}; {}", still_serves(wire, r, 4))
            },
        ),
        case(
            "sg_cnt_too_large",
            format!(
                "sg_cnt 2 answered {einval}, sg_cnt 65535 answered {einval}; serves (protocol 2)"
            ),
            |wire, args| {
                let r = raw_session(wire, args, "sg-cnt");
                let desc = read_dest(wire, r, 4096);
                let (bytes, offset) = raw_read_message(&[desc, desc], 4096);
                let imm = wire.raw_imm(r, 5, offset);
                wire.raw_post(r, 1, &[(5, 4096, &bytes, imm)]);
                let two = raw_outcome(wire.raw_await(r, 5));
                // sg_cnt = 0xffff: its descriptors would run far past the chunk.
                let (mut bytes, offset) = raw_read_message(&[desc], 4096);
                bytes[32 + 6..32 + 8].copy_from_slice(&u16::MAX.to_le_bytes());
                let imm = wire.raw_imm(r, 10, offset);
                wire.raw_post(r, 1, &[(10, 4096, &bytes, imm)]);
                let many = raw_outcome(wire.raw_await(r, 10));
                format!(
                    "sg_cnt 2 {two}, sg_cnt 65535 {many}; {}",
                    still_serves(wire, r, 6)
                )
            },
        ),
        case(
            "read_length_beyond_room",
            format!("answered {einval}; serves (protocol 2)"),
            |wire, args| {
                let r = raw_session(wire, args, "room");
                let desc = read_dest(wire, r, 8192);
                let (bytes, offset) = raw_read_message(&[desc], 4096);
                let imm = wire.raw_imm(r, 7, offset);
                wire.raw_post(r, 1, &[(7, 4096, &bytes, imm)]);
                let outcome = raw_outcome(wire.raw_await(r, 7));
                format!("{outcome}; {}", still_serves(wire, r, 8))
            },
        ),
        case("read_into_forged_rkey", "path closed", |wire, args| {
            // The reply's RDMA WRITE is refused by the client's HCA.
            let r = raw_session(wire, args, "forged-rkey");
            let mut desc = read_dest(wire, r, 4096);
            desc.rkey = verbs::Rkey(desc.rkey.0 ^ 0x5a5a_5a00);
            sess_info_into(wire, r, 11, desc)
        }),
        case("read_beyond_client_memory", "path closed", |wire, args| {
            // A valid rkey, an address past the end of its region.
            let r = raw_session(wire, args, "far-addr");
            let mut desc = read_dest(wire, r, 4096);
            desc.addr += 1 << 30;
            sess_info_into(wire, r, 12, desc)
        }),
        case("chunk_reused_before_answer", "path closed", |wire, args| {
            let r = raw_session(wire, args, "reuse");
            let mut msg = [0u8; 4];
            WriteMsg { usr_len: 32 }
                .emit(&mut msg)
                .expect("a WRITE message fits 4 bytes");
            let mut bytes = vec![0u8; 32];
            bytes.extend_from_slice(&msg);
            let imm = wire.raw_imm(r, 9, 32);
            wire.raw_post(r, 1, &[(9, 0, &bytes, imm), (9, 0, &bytes, imm)]);
            // The first may be answered before the close reaches the client.
            if let RawOutcome::Answered(_) = wire.raw_await(r, 9) {
                return closed_outcome(wire, r, 9);
            }
            wire.run_until("raw path fully disconnected", |w| w.raw_all_disconnected(r));
            "path closed".into()
        }),
        case(
            "unknown_immediate_type",
            "ignored; serves (protocol 2)",
            |wire, args| {
                let r = raw_session(wire, args, "imm-type");
                wire.raw_post(r, 1, &[(0, 0, &[], 0x3000_0000)]);
                wire.run_for(300_000_000);
                let answered = wire.raws[r].completions.iter().any(|wc| wc.imm.is_some());
                let closed = wire.raw_all_disconnected(r);
                let outcome = match (answered, closed) {
                    (false, false) => "ignored",
                    (true, _) => "answered",
                    (false, true) => "path closed",
                };
                format!("{outcome}; {}", still_serves(wire, r, 0))
            },
        ),
        case(
            "heartbeat_storm",
            format!("{HEARTBEATS} heartbeats taken; serves (protocol 2)"),
            |wire, args| {
                let r = raw_session(wire, args, "heartbeats");
                let hb = Imm::HbMsg.encode().expect("a heartbeat immediate encodes");
                for burst in 0..HEARTBEATS / 50 {
                    let requests = [(0u16, 0u32, &[][..], hb); 50];
                    wire.raw_post(r, burst % 2, &requests);
                    await_sends(wire, r, 50 * (burst + 1));
                }
                wire.run_for(300_000_000);
                if wire.raw_all_disconnected(r) {
                    return "path closed".into();
                }
                format!(
                    "{HEARTBEATS} heartbeats taken; {}",
                    still_serves(wire, r, 1)
                )
            },
        ),
        case(
            "request_flood",
            "every request of 3 rounds over every chunk answered 0; serves (protocol 2)",
            // Every chunk at once, on both connections, three times over:
            // the target's completion queue floods, the client's
            // transport acknowledges cumulatively.
            |wire, args| {
                let r = raw_session(wire, args, "flood");
                let (qd, _) = geometry(wire, r);
                let mut header = [0u8; 64];
                let out = rnbd::client::sess_info(&mut header).expect("SESS_INFO encodes");
                let desc = read_dest(wire, r, out.data_len);
                let (bytes, offset) = sess_info_message(&header[..out.user_header_len], desc);
                let mut outcomes = Vec::new();
                let mut posted = 0;
                for _ in 0..3 {
                    for first in (0..qd).step_by(usize::from(2 * FLOOD_PER_CONN)) {
                        let mut ids = Vec::new();
                        for cid in 0..2u16 {
                            let from = first + cid * FLOOD_PER_CONN;
                            let to = (from + FLOOD_PER_CONN).min(qd);
                            let requests: Vec<(u16, u32, &[u8], u32)> = (from..to)
                                .map(|chunk| {
                                    (
                                        chunk,
                                        out.data_len,
                                        &bytes[..],
                                        wire.raw_imm(r, u32::from(chunk), offset),
                                    )
                                })
                                .collect();
                            if !requests.is_empty() {
                                posted += requests.len();
                                wire.raw_post(r, usize::from(cid), &requests);
                            }
                            ids.extend(from..to);
                        }
                        for chunk in ids {
                            outcomes.push(raw_outcome(wire.raw_await(r, u32::from(chunk))));
                        }
                        await_sends(wire, r, posted);
                    }
                }
                let all = usize::from(qd) * 3;
                let outcome = if outcomes.len() == all && outcomes.iter().all(|o| o == "answered 0")
                {
                    "every request of 3 rounds over every chunk answered 0".to_string()
                } else {
                    tally(&outcomes)
                };
                format!("{outcome}; {}", still_serves(wire, r, 0))
            },
        ),
        case(
            "receives_never_reposted",
            format!("answered {RECEIVES} of {ASKED} (its receives), the path held; a new session serves"),
            // The client stops reposting receives: the target's responses
            // beyond the receives it has find none (RNR) and wait; nobody
            // else notices.
            |wire, args| {
                let r = raw_session(wire, args, "no-receives");
                wire.raws[r].hold_receives = true;
                let mut header = [0u8; 64];
                let out = rnbd::client::sess_info(&mut header).expect("SESS_INFO encodes");
                let desc = read_dest(wire, r, out.data_len);
                let (bytes, offset) = sess_info_message(&header[..out.user_header_len], desc);
                for round in 0..ASKED / 32 {
                    let requests: Vec<(u16, u32, &[u8], u32)> = (round * 32..round * 32 + 32)
                        .map(|chunk| (chunk, out.data_len, &bytes[..], wire.raw_imm(r, u32::from(chunk), offset)))
                        .collect();
                    wire.raw_post(r, 0, &requests);
                }
                wire.run_for(3_000_000_000);
                let answered = wire.raws[r].completions.iter().filter(|wc| wc.imm.is_some()).count();
                let held = if wire.raw_all_disconnected(r) { "closed" } else { "held" };
                format!(
                    "answered {answered} of {ASKED} (its receives), the path {held}; {}",
                    newcomer(wire, args, "beside-rnr")
                )
            },
        ),
        case(
            "responses_never_acknowledged",
            "the target closes the path; a new session serves",
            // The client sends requests and falls silent (it acknowledges
            // nothing, takes nothing): the target's retransmissions run out.
            |wire, args| {
                let r = raw_session(wire, args, "silent");
                let mut header = [0u8; 64];
                let out = rnbd::client::sess_info(&mut header).expect("SESS_INFO encodes");
                let desc = read_dest(wire, r, out.data_len);
                let (bytes, offset) = sess_info_message(&header[..out.user_header_len], desc);
                let requests: Vec<(u16, u32, &[u8], u32)> = (0..32u16)
                    .map(|chunk| {
                        (
                            chunk,
                            out.data_len,
                            &bytes[..],
                            wire.raw_imm(r, u32::from(chunk), offset),
                        )
                    })
                    .collect();
                wire.raw_post(r, 0, &requests);
                // One step sends them; then the node goes quiet.
                wire.step();
                wire.raws[r].alive = false;
                let start = wire.now();
                let newcomer = newcomer(wire, args, "beside-silent");
                wire.run_for(20_000_000_000u64.saturating_sub(wire.now() - start));
                wire.raws[r].alive = true;
                wire.raws[r].cm_events.clear();
                // Back: the path must be gone (its requests answered by a
                // disconnect, or never again).
                let saved = wire.wait_ns;
                wire.wait_ns = saved.max(30_000_000_000);
                let mut closed = false;
                wire.run_until("the silent path's fate", |w| {
                    closed = w.raw_all_disconnected(r)
                        || w.raws[r]
                            .cm_events
                            .iter()
                            .any(|e| matches!(e, CmEvent::Disconnected { .. }));
                    closed
                });
                wire.wait_ns = saved;
                let outcome = if closed {
                    "the target closes the path"
                } else {
                    "the path lives"
                };
                format!("{outcome}; {newcomer}")
            },
        ),
    ]
}

/// A descriptor of `len` bytes at the raw node's READ destination.
fn read_dest(wire: &Wire, r: usize, len: u32) -> BufferDesc {
    let memory = wire.raws[r].memory;
    BufferDesc {
        addr: memory.remote_addr(RAW_READ_DEST),
        rkey: memory.rkey,
        len,
    }
}

/// A READ message carrying user header `header` with one descriptor: the
/// bytes to write at offset `desc.len` of a chunk, and the message offset.
fn sess_info_message(header: &[u8], desc: BufferDesc) -> (Vec<u8>, u32) {
    let mut bytes = header.to_vec();
    let mut msg = [0u8; 24];
    let n = rtrs::wire::ReadMsg {
        usr_len: header.len() as u16,
        flags: rtrs::wire::ReadFlags(0),
        desc: Some(desc),
    }
    .emit(&mut msg)
    .expect("a READ message fits 24 bytes");
    bytes.extend_from_slice(&msg[..n]);
    (bytes, desc.len + header.len() as u32)
}

/// A SESS_INFO whose reply goes to `desc`, on `chunk`: the path's fate.
fn sess_info_into(wire: &mut Wire, r: usize, chunk: u16, desc: BufferDesc) -> String {
    let mut header = [0u8; 64];
    let out = rnbd::client::sess_info(&mut header).expect("SESS_INFO encodes");
    let desc = BufferDesc {
        len: out.data_len,
        ..desc
    };
    let (bytes, offset) = sess_info_message(&header[..out.user_header_len], desc);
    let imm = wire.raw_imm(r, u32::from(chunk), offset);
    wire.raw_post(r, 0, &[(chunk, out.data_len, &bytes, imm)]);
    closed_outcome(wire, r, u32::from(chunk))
}

/// Waits for the answer to `chunk` or the close; "path closed" once every
/// connection is down.
fn closed_outcome(wire: &mut Wire, r: usize, chunk: u32) -> String {
    let outcome = wire.raw_await(r, chunk);
    if outcome == RawOutcome::Closed {
        wire.run_until("raw path fully disconnected", |w| w.raw_all_disconnected(r));
    }
    raw_outcome(outcome)
}

/// Posts a zero-length WRITE WITH IMM naming `chunk` at `offset` on cid 1
/// and waits for the outcome.
fn bare_immediate(wire: &mut Wire, r: usize, chunk: u32, offset: u32) -> String {
    let Some(payload) = wire.raw_session(r).layout.join(chunk, offset) else {
        let (qd, _) = geometry(wire, r);
        return format!("chunk {chunk} offset {offset} not representable (queue depth {qd})");
    };
    let imm = Imm::IoReq { payload }
        .encode()
        .expect("an IO_REQ immediate encodes");
    wire.raw_post(r, 1, &[(0, 0, &[], imm)]);
    closed_outcome(wire, r, chunk)
}
