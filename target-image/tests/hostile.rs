//! Hostile clients against the engine, each beside a healthy one.
//!
//! Every case runs on an engine that already serves a healthy client
//! (`s-healthy`: its own HCA, its own session of two connections, vol0
//! open read-write) whose background workload writes and reads back 4-16
//! KiB blocks, checked byte for byte, before, during and after the attack.
//! Each case asserts the error the specs give (`docs/protocol/rtrs.md` §2.4,
//! §4.5; `rnbd.md` §4.5, §8) or, where the engine closes the offending path
//! as a protocol violation, that the path was closed for that reason; then
//! that the healthy workload kept going with no error and no mismatch, and
//! that the engine is back to serving the healthy session alone.
//!
//! Attackers: a raw verbs client (`common::RawNode`) for CM private data and
//! malformed RTRS requests, and Brick's own RTRS client with crafted RNBD
//! messages or limits-breaking parameters.

mod common;

use common::{
    con_req, info_req, pattern, raw_read_message, with_world, Fabric, RawOutcome, RawRefusal,
    World, SECOND,
};
use rnbd::client as rnbd_client;
use rnbd::wire::{AccessMode, Io, IoFlags, IoOp};
use rtrs::client::PathError;
use rtrs::server::errno as rtrs_errno;
use rtrs::wire::{BufferDesc, ReadFlags, ReadMsg, Uuid, WriteMsg};
use verbs::RejectReason;

/// qd 12 (not a power of two, so chunk ids 12..15 are representable in the
/// immediate's 4 chunk bits), 36 KiB chunks, two sessions of one path of
/// at most three connections.
const MANIFEST: &str = r#"
[target]
name = "brick-hostile"

[limits]
queue_depth = 12
chunk_size = "36KiB"
max_sessions = 2
max_paths_per_session = 1
max_connections_per_path = 3

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "4MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol2"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "s*"
volumes = ["vol0", "vol2"]
mode = "rw"

[[access]]
sessions = "s*"
volumes = ["vol1"]
mode = "ro"
"#;

const QUEUE_DEPTH: u16 = 12;
const CHUNK_SIZE: u32 = 36 * 1024;
/// Connections of the healthy client's path.
const HEALTHY_CONNECTIONS: u16 = 2;
/// IOs the healthy workload must complete after each case.
const PROGRESS: u64 = 24;

/// The healthy client: node index.
const HEALTHY: usize = 0;

/// Brings up the healthy client and its workload (4 streams over the first
/// 256 KiB of vol0), and lets it run a little.
fn healthy(world: &mut World<'_>) {
    let c = world.add_client(2, QUEUE_DEPTH, 1);
    assert_eq!(c, HEALTHY);
    world
        .connect(c, "s-healthy", HEALTHY_CONNECTIONS)
        .expect("healthy session");
    assert_eq!(world.sess_info(c, 1), 2);
    let device = world.open(c, 2, "vol0", AccessMode::ReadWrite).unwrap();
    world.start_workload(c, device, 0, 4, &[4096, 8192, 16384]);
    world.workload_progress(c, PROGRESS);
    assert_only_healthy(world);
}

/// The engine serves the healthy session alone: one session, one path of
/// two connections, its chunks and control buffers.
fn assert_only_healthy(world: &World<'_>) {
    let usage = world.engine.rtrs(0).unwrap().usage();
    assert_eq!(world.engine.session_count(), 1, "{usage:?}");
    assert_eq!(usage.sessions, 1, "{usage:?}");
    assert_eq!(usage.paths, 1, "{usage:?}");
    assert_eq!(
        usage.connections,
        usize::from(HEALTHY_CONNECTIONS),
        "{usage:?}"
    );
    assert_eq!(usage.buffers, usize::from(QUEUE_DEPTH) + 2, "{usage:?}");
}

/// After a case: the engine drops back to the healthy session alone, the
/// workload makes progress again and has seen no error or mismatch, and
/// the engine never failed to answer a request.
fn after_case(world: &mut World<'_>, case: &str) {
    world.run_until("engine back to the healthy session", |w| {
        let usage = w.engine.rtrs(0).unwrap().usage();
        w.engine.session_count() == 1 && usage.sessions == 1 && usage.paths == 1
    });
    let reads_before = world.workload(HEALTHY).reads_checked;
    world.workload_progress(HEALTHY, PROGRESS);
    world.workload(HEALTHY).assert_clean(PROGRESS);
    assert!(world.workload(HEALTHY).reads_checked > reads_before);
    assert_only_healthy(world);
    // The engine's own counters agree: no request of the healthy session
    // was answered with an error.
    let stats = world.engine.stats().to_string();
    let line = stats
        .lines()
        .find(|l| l.starts_with("session \"s-healthy\""))
        .unwrap_or_else(|| panic!("{case}: no healthy session in\n{stats}"));
    assert!(line.contains(" rtrs_errors 0 "), "{case}: {line}");
    assert_eq!(
        world.log_count("complete_io("),
        0,
        "{case}: the engine failed to answer a request"
    );
}

/// One hostile case: runs on a world whose healthy client is up.
type Case = fn(&mut World<'_>);

/// Runs `case` beside the healthy client.
fn hostile(case: Case) {
    with_world(MANIFEST, move |world| {
        healthy(world);
        case(world);
        after_case(world, "case");
    });
}

/// A raw node at `host` with an established session `s-raw<host>` of two
/// connections; returns its index.
fn raw_session(world: &mut World<'_>, host: u8) -> usize {
    let r = world.add_raw(host, u64::from(host) * 77);
    world.raw_establish(r, &format!("s-raw{host}"), 2);
    let session = world.raw_session(r);
    assert_eq!(session.queue_depth, QUEUE_DEPTH);
    assert_eq!(session.chunk_size, CHUNK_SIZE);
    r
}

/// Asserts the healthy client has IO in flight (the attack lands while it
/// works).
fn assert_healthy_busy(world: &World<'_>) {
    assert!(
        world.workload_in_flight(HEALTHY) > 0,
        "the healthy workload should have IO in flight during the attack"
    );
}

/// Posts `requests` from raw node `r` on cid 1 while the healthy client is
/// busy, and waits for the outcome of `msg_id`.
fn attack(
    world: &mut World<'_>,
    r: usize,
    requests: &[(u16, u32, &[u8], u32)],
    msg_id: u32,
) -> RawOutcome {
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    assert_healthy_busy(world);
    world.raw_post(r, 1, requests);
    world.raw_await(r, msg_id)
}

/// Asserts the engine closed raw node `r`'s path as a protocol violation
/// (rnbd.md §8.2: "close"), then lets the connections go.
fn assert_closed_for_violation(world: &mut World<'_>, r: usize, host: u8) {
    world.run_until("raw path fully disconnected", |w| w.raw_all_disconnected(r));
    world.raw_teardown(r);
    let line = format!("path down: session \"s-raw{host}\": ProtocolViolation");
    assert_eq!(world.log_count(&line), 1, "expected engine log {line:?}");
}

/// Sends a well-formed RNBD SESS_INFO as an RTRS READ from raw node `r` on
/// chunk `chunk` and checks the answer: proves the path still serves.
fn assert_raw_path_serves(world: &mut World<'_>, r: usize, chunk: u16) {
    assert_eq!(
        world.raw_sess_info(r, chunk),
        (RawOutcome::Answered(0), Some(2)),
        "a valid SESS_INFO after the bad request"
    );
}

// ----- RTRS request level (rnbd.md §8.2) --------------------------------------

/// #14: an IO_REQ naming chunk 12 of a queue depth of 12 closes the path.
fn case_chunk_id_beyond_queue_depth(world: &mut World<'_>) {
    let r = raw_session(world, 10);
    let imm = world.raw_imm(r, u32::from(QUEUE_DEPTH), 64);
    let outcome = attack(world, r, &[(0, 0, &[], imm)], u32::from(QUEUE_DEPTH));
    assert_eq!(outcome, RawOutcome::Closed);
    assert_closed_for_violation(world, r, 10);
}

/// #14: an IO_REQ whose message offset is beyond the chunk closes the path.
fn case_offset_beyond_chunk(world: &mut World<'_>) {
    let r = raw_session(world, 11);
    let imm = world.raw_imm(r, 0, CHUNK_SIZE + 8);
    assert_eq!(attack(world, r, &[(0, 0, &[], imm)], 0), RawOutcome::Closed);
    assert_closed_for_violation(world, r, 11);
}

/// #15: a WRITE message that does not fit the chunk (it starts 2 bytes
/// before the end, `off + 4 > chunk_size`) closes the path.
fn case_message_overflows_chunk(world: &mut World<'_>) {
    let r = raw_session(world, 12);
    let at = CHUNK_SIZE - 2;
    let imm = world.raw_imm(r, 1, at);
    let outcome = attack(world, r, &[(1, at, &2u16.to_le_bytes(), imm)], 1);
    assert_eq!(outcome, RawOutcome::Closed);
    assert_closed_for_violation(world, r, 12);
}

/// #16: an unknown RTRS message type in the chunk closes the path.
fn case_unknown_message_type(world: &mut World<'_>) {
    let r = raw_session(world, 13);
    let bytes = [9u8, 0, 0, 0];
    let imm = world.raw_imm(r, 2, 100);
    assert_eq!(
        attack(world, r, &[(2, 100, &bytes, imm)], 2),
        RawOutcome::Closed
    );
    assert_closed_for_violation(world, r, 13);
}

/// #17: `usr_len` larger than the message offset (the user header would
/// start before the chunk) is answered EINVAL (Linux drops it silently);
/// the path keeps serving.
fn case_user_header_beyond_chunk_start(world: &mut World<'_>) {
    let r = raw_session(world, 14);
    let mut msg = [0u8; 4];
    WriteMsg { usr_len: 512 }.emit(&mut msg).unwrap();
    let imm = world.raw_imm(r, 3, 64);
    let outcome = attack(world, r, &[(3, 64, &msg, imm)], 3);
    assert_eq!(outcome, RawOutcome::Answered(rtrs_errno::EINVAL));
    assert_raw_path_serves(world, r, 4);
    world.raw_teardown(r);
}

/// #18: a READ with `sg_cnt = 2`, or `0xffff` (descriptors far beyond the
/// chunk), is answered EINVAL; the path keeps serving.
fn case_read_with_two_descriptors(world: &mut World<'_>) {
    let r = raw_session(world, 15);
    let memory = world.raws[r].memory;
    let desc = BufferDesc {
        addr: memory.remote_addr(common::RAW_READ_DEST),
        rkey: memory.rkey,
        len: 4096,
    };
    let (bytes, offset) = raw_read_message(&[desc, desc], 4096);
    let imm = world.raw_imm(r, 5, offset);
    let outcome = attack(world, r, &[(5, 4096, &bytes, imm)], 5);
    assert_eq!(outcome, RawOutcome::Answered(rtrs_errno::EINVAL));
    // sg_cnt = 0xffff: its descriptors would run far past the chunk.
    let (mut bytes, offset) = raw_read_message(&[desc], 4096);
    bytes[32 + 6..32 + 8].copy_from_slice(&u16::MAX.to_le_bytes());
    let imm = world.raw_imm(r, 10, offset);
    let outcome = attack(world, r, &[(10, 4096, &bytes, imm)], 10);
    assert_eq!(outcome, RawOutcome::Answered(rtrs_errno::EINVAL));
    assert_raw_path_serves(world, r, 6);
    world.raw_teardown(r);
}

/// #19: a READ whose `desc.len` (8 KiB) differs from the room the client
/// left in the chunk (4 KiB) is answered EINVAL; the path keeps serving.
fn case_read_length_differs_from_room(world: &mut World<'_>) {
    let r = raw_session(world, 16);
    let memory = world.raws[r].memory;
    let desc = BufferDesc {
        addr: memory.remote_addr(common::RAW_READ_DEST),
        rkey: memory.rkey,
        len: 8192,
    };
    let (bytes, offset) = raw_read_message(&[desc], 4096);
    let imm = world.raw_imm(r, 7, offset);
    let outcome = attack(world, r, &[(7, 4096, &bytes, imm)], 7);
    assert_eq!(outcome, RawOutcome::Answered(rtrs_errno::EINVAL));
    assert_raw_path_serves(world, r, 8);
    world.raw_teardown(r);
}

/// #20: a second request on a chunk whose first is still outstanding (both
/// posted back to back) closes the path.
fn case_chunk_reused_before_answer(world: &mut World<'_>) {
    let r = raw_session(world, 17);
    let mut msg = [0u8; 4];
    WriteMsg { usr_len: 32 }.emit(&mut msg).unwrap();
    let mut bytes = vec![0u8; 32];
    bytes.extend_from_slice(&msg);
    let imm = world.raw_imm(r, 9, 32);
    let outcome = attack(world, r, &[(9, 0, &bytes, imm), (9, 0, &bytes, imm)], 9);
    // The first may be answered before the close reaches the client.
    if let RawOutcome::Answered(_) = outcome {
        assert_eq!(world.raw_await(r, 9), RawOutcome::Closed);
    }
    assert_closed_for_violation(world, r, 17);
}

/// #13: an immediate of an unknown type (3) is counted and ignored, with no
/// answer and no close; the path keeps serving.
fn case_unknown_immediate_type(world: &mut World<'_>) {
    let r = raw_session(world, 18);
    let ignored = world.engine.rtrs(0).unwrap().stats().ignored_immediates;
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    world.raw_post(r, 1, &[(0, 0, &[], 0x3000_0000)]);
    world.run_steps(200);
    assert!(world.raws[r].completions.iter().all(|wc| wc.imm.is_none()));
    assert!(!world.raw_all_disconnected(r));
    let stats = world.engine.rtrs(0).unwrap().stats();
    assert_eq!(stats.ignored_immediates, ignored + 1);
    assert_raw_path_serves(world, r, 0);
    world.raw_teardown(r);
}

/// A READ whose descriptor names a forged rkey: the engine's RDMA WRITE of
/// the reply is refused by the client's HCA (remote access error), the
/// engine's send fails and it closes that path (CompletionError, rtrs.md
/// §6.1); nothing else is affected.
fn case_read_into_forged_rkey(world: &mut World<'_>) {
    let r = raw_session(world, 19);
    let mut header = [0u8; 64];
    let out = rnbd_client::sess_info(&mut header).unwrap();
    let usr_len = out.user_header_len;
    let memory = world.raws[r].memory;
    let mut bytes = header[..usr_len].to_vec();
    let mut msg = [0u8; 24];
    let n = ReadMsg {
        usr_len: usr_len as u16,
        flags: ReadFlags(0),
        desc: Some(BufferDesc {
            addr: memory.remote_addr(common::RAW_READ_DEST),
            rkey: verbs::Rkey(memory.rkey.0 ^ 0x5a5a_5a00),
            len: out.data_len,
        }),
    }
    .emit(&mut msg)
    .unwrap();
    bytes.extend_from_slice(&msg[..n]);
    let imm = world.raw_imm(r, 11, out.data_len + usr_len as u32);
    let outcome = attack(world, r, &[(11, out.data_len, &bytes, imm)], 11);
    assert_eq!(outcome, RawOutcome::Closed);
    world.run_until("raw path fully disconnected", |w| w.raw_all_disconnected(r));
    world.raw_teardown(r);
    let line = "path down: session \"s-raw19\": CompletionError";
    assert_eq!(world.log_count(line), 1, "expected engine log {line:?}");
}

// ----- CM level (rtrs.md §2.4, rnbd.md §8.1) -----------------------------------

/// CON_REQs the CM layer must refuse (rtrs.md §2.4 steps 1-4): bad magic,
/// bad major version and `cid >= cid_num` get a consumer-defined REJ
/// (reason 28) whose CONN_RSP carries -ECONNRESET; an unknown session with
/// `first_conn` clear (also what a short CON_REQ becomes once the CM pads
/// it) gets -ENXIO. None leaves a session or path behind.
fn case_malformed_con_reqs(world: &mut World<'_>) {
    let r = world.add_raw(20, 2020);
    let good = con_req(0, 2, Uuid([1; 16]), Uuid([2; 16]));
    let mut bad_magic = good;
    bad_magic[2..4].copy_from_slice(&0xdeadu16.to_le_bytes());
    let mut bad_version = good;
    bad_version[4..6].copy_from_slice(&0x0300u16.to_le_bytes());
    let mut cid_beyond = good;
    cid_beyond[6..8].copy_from_slice(&2u16.to_le_bytes());
    let mut no_first_conn = good;
    no_first_conn[44] = 0;
    let cases: [(&str, &[u8], i16); 5] = [
        ("bad magic", &bad_magic, -104),
        ("bad version", &bad_version, -104),
        // The CM REQ private data is a fixed-size field: a short CON_REQ
        // arrives zero-padded to 56 bytes, so `first_conn` reads 0 and the
        // (unknown) session is refused with ENXIO.
        ("short (zero-padded)", &good[..40], -6),
        ("cid >= cid_num", &cid_beyond, -104),
        ("unknown session, first_conn clear", &no_first_conn, -6),
    ];
    let rejected_before = world.engine.rtrs(0).unwrap().stats().rejected;
    for (name, private_data, errno) in cases {
        world.run_until("healthy IO in flight", |w| {
            w.workload_in_flight(HEALTHY) > 0
        });
        match world.raw_connect(r, private_data) {
            Err(RawRefusal::Rejected(reason, Some(rsp))) => {
                assert_eq!(reason, RejectReason::CONSUMER_DEFINED, "{name}");
                assert_eq!(rsp.errno, errno, "{name}: CONN_RSP errno");
                assert!(!rsp.is_accept(), "{name}");
            }
            other => panic!("{name}: expected a consumer-defined REJ, got {other:?}"),
        }
        assert_only_healthy(world);
    }
    let rejected = world.engine.rtrs(0).unwrap().stats().rejected - rejected_before;
    assert_eq!(rejected, 5);
}

/// A peer presenting the healthy client's session uuid (the uuids travel in
/// clear in every CON_REQ) cannot join or displace it: with the healthy
/// path's uuid and the same `recon_cnt` it gets -ECONNRESET (the path is
/// still up, rtrs.md §2.4 step 5); with a path uuid of its own it gets
/// -ENOMEM (`max_paths_per_session` is 1). The healthy path stays as it was.
fn case_session_uuid_collision(world: &mut World<'_>) {
    let session = world.clients[HEALTHY].client.session_uuid().unwrap();
    let path = world.clients[HEALTHY].client.path_uuid(0).unwrap();
    let r = world.add_raw(24, 2424);
    let cases = [
        ("healthy path uuid", con_req(0, 2, path, session), -104),
        (
            "new path uuid",
            con_req(0, 2, Uuid([0x77; 16]), session),
            -12,
        ),
    ];
    for (name, private_data, errno) in cases {
        world.run_until("healthy IO in flight", |w| {
            w.workload_in_flight(HEALTHY) > 0
        });
        match world.raw_connect(r, &private_data) {
            Err(RawRefusal::Rejected(reason, Some(rsp))) => {
                assert_eq!(reason, RejectReason::CONSUMER_DEFINED, "{name}");
                assert_eq!(rsp.errno, errno, "{name}: CONN_RSP errno");
            }
            other => panic!("{name}: expected a consumer-defined REJ, got {other:?}"),
        }
        assert_only_healthy(world);
    }
    world.raws[r].alive = false;
}

/// rnbd.md §8.1 #7: a path that connects cid 0 of two and never finishes
/// (no cid 1, no INFO_REQ) holds its connection and nothing else: no
/// session slot (`max_sessions` = 2, and another client still gets in) and
/// no chunk pool. One address holds at most `max_half_open_per_source` of
/// them (the next is refused with -ENOMEM), and each is closed at the
/// short setup deadline, after which the engine holds nothing of them.
fn case_half_open_path_times_out(world: &mut World<'_>) {
    let r = world.add_raw(25, 2525);
    let config = *world.engine.rtrs(0).unwrap().config();
    let per_source = usize::from(config.max_half_open_per_source);
    for n in 0..per_source {
        let private_data = con_req(0, 2, Uuid([0x25 + n as u8; 16]), Uuid([0x52 + n as u8; 16]));
        world.raw_connect(r, &private_data).expect("cid 0 accepted");
    }
    let usage = world.engine.rtrs(0).unwrap().usage();
    assert_eq!(
        (usage.sessions, usage.paths),
        (1, 1 + per_source),
        "{usage:?}"
    );
    assert_eq!(
        usage.buffers,
        usize::from(QUEUE_DEPTH) + 2 + per_source,
        "a half-open path holds its INFO_REQ buffer only: {usage:?}"
    );
    let private_data = con_req(0, 2, Uuid([0x7e; 16]), Uuid([0x7f; 16]));
    match world.raw_connect(r, &private_data) {
        Err(RawRefusal::Rejected(_, Some(rsp))) => assert_eq!(rsp.errno, -12),
        other => panic!("one half-open path too many from one address: {other:?}"),
    }
    let late = world.add_client(26, QUEUE_DEPTH, 26);
    world
        .connect(late, "s-late", 2)
        .expect("half-open paths hold no session slot");
    world.close_session(late);
    world.clients[late].alive = false;

    let deadline = world.now + config.setup_timeout_ns + 2 * config.close_timeout_ns + SECOND;
    let freed = |w: &World<'_>| {
        let usage = w.engine.rtrs(0).unwrap().usage();
        (usage.sessions, usage.paths) == (1, 1)
    };
    while world.now < deadline && !freed(world) {
        world.advance(50_000_000);
        world.run_steps(3);
    }
    assert!(
        freed(world),
        "the half-open paths are still held {} s later: {:?}",
        (deadline - world.now) / SECOND,
        world.engine.rtrs(0).unwrap().usage()
    );
    world.raws[r].alive = false;
}

/// rnbd.md §8.1 #9-#11: INFO_REQs the engine refuses by closing the path
/// (no INFO_RSP): the name of another live session (squatting it would
/// hijack its exports), names with `/` or `.`, an empty name, a name with no
/// NUL in its 255 bytes, and an INFO_REQ sent before every connection of
/// the path is up. The healthy session keeps its name and its IO.
fn case_bad_info_reqs(world: &mut World<'_>) {
    let cases: [(&str, [u8; 272], u16); 6] = [
        ("another session's name", info_req(b"s-healthy"), 2),
        ("name with '/'", info_req(b"s/evil"), 2),
        ("name with '.'", info_req(b"s.evil"), 2),
        ("empty name", info_req(b""), 2),
        ("unterminated name", info_req(&[b's'; 255]), 2),
        ("before cid 1 is up", info_req(b"s-early"), 1),
    ];
    let opened = world.log_count(" opened on ");
    for (index, (name, info, connect)) in cases.into_iter().enumerate() {
        let r = world.add_raw(40 + index as u8, 4000 + index as u64);
        let closed = world.engine.rtrs(0).unwrap().stats().paths_closed;
        world.run_until("healthy IO in flight", |w| {
            w.workload_in_flight(HEALTHY) > 0
        });
        assert_eq!(
            world.raw_try_establish(r, &info, 2, connect),
            Err(()),
            "{name}: the path should be closed"
        );
        assert_eq!(
            world.engine.rtrs(0).unwrap().stats().paths_closed,
            closed + 1,
            "{name}"
        );
        world.run_until("back to the healthy session", |w| {
            let usage = w.engine.rtrs(0).unwrap().usage();
            (usage.sessions, usage.paths) == (1, 1)
        });
        assert_only_healthy(world);
        world.raws[r].alive = false;
    }
    assert_eq!(world.log_count(" opened on "), opened, "no session came up");
}

/// More connections per path than `max_connections_per_path` (4 > 3) are
/// refused with -ECONNRESET (Linux's answer to `cid_num > 4096`).
fn case_too_many_connections(world: &mut World<'_>) {
    let c = world.add_client(21, QUEUE_DEPTH, 21);
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    let result = world.connect(c, "s-wide", 4);
    assert_eq!(result, Err(PathError::Rejected(-104)));
    assert_only_healthy(world);
    world.close_session(c);
    world.clients[c].alive = false;
}

/// A session beyond `max_sessions` (2) is refused with -ENOMEM; the session
/// admitted before it keeps doing byte-exact IO, before and after.
fn case_too_many_sessions(world: &mut World<'_>) {
    let second = world.add_client(22, QUEUE_DEPTH, 22);
    world
        .connect(second, "s-second", 2)
        .expect("second session");
    let device = world
        .open(second, 1, "vol2", AccessMode::ReadWrite)
        .unwrap();
    let data = pattern(22, 8192);
    assert_eq!(world.write(second, 2, &device, 8192, &data), 0);

    let third = world.add_client(23, QUEUE_DEPTH, 23);
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    assert_eq!(
        world.connect(third, "s-third", 2),
        Err(PathError::Rejected(-12))
    );
    world.close_session(third);
    world.clients[third].alive = false;
    assert_eq!(world.engine.session_count(), 2);

    let (errno, back) = world.read(second, 3, &device, 8192, 8192);
    assert_eq!(errno, 0);
    assert!(back == data, "the admitted session's data");
    let more = pattern(23, 4096);
    assert_eq!(world.write(second, 4, &device, 0, &more), 0);
    assert_eq!(world.read(second, 5, &device, 0, 4096), (0, more));
    assert_eq!(world.close_device(second, 6, &device), 0);
    world.close_session(second);
    world.clients[second].alive = false;
}

// ----- RNBD level (rnbd.md §4, §8.3) ---------------------------------------------

/// A rogue client with crafted RNBD IO: `bi_size` beyond the data sent (a
/// write) or the read buffer (a read) gets EINVAL and changes nothing
/// (#34); an unknown op or WRITE_SAME gets EOPNOTSUPP (#33); a message
/// shorter than 24 bytes (#24), a range beyond the device end or
/// overflowing 64 bits, a size not a multiple of 512 (#35) and a WRITE
/// carried as an RTRS READ (#26) get EINVAL, and none of them changes the
/// volume; a write through a read-only open of the volume the healthy
/// client writes gets EPERM (#36), and so does re-opening it read-write
/// (#31); IO for a device id never opened, or closed, gets ENOTCONN (#32).
/// Its own valid IO stays byte-exact.
fn case_rnbd_violations(world: &mut World<'_>) {
    let c = world.add_client(30, QUEUE_DEPTH, 30);
    world.connect(c, "s-rogue", 2).expect("rogue session");
    let device = world.open(c, 1, "vol2", AccessMode::ReadWrite).unwrap();
    let original = pattern(30, 8192);
    assert_eq!(world.write(c, 2, &device, 4096, &original), 0);

    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    // bi_size 8 KiB, 4 KiB of data.
    let mut header = [0u8; 64];
    let io = |id: u32, op: IoOp, sector: u64, bi_size: u32| Io {
        device_id: id,
        sector,
        op,
        flags: IoFlags::NONE,
        bi_size,
        prio: 0,
    };
    let len = io(device.id, IoOp::Write, 8, 8192)
        .emit(&mut header)
        .unwrap();
    let errno = world.write_request(c, 3, &header[..len], &pattern(31, 4096), false);
    assert_eq!(errno, rnbd::errno::EINVAL, "write bi_size > data_len");
    // bi_size 8 KiB, a 4 KiB read buffer.
    let len = io(device.id, IoOp::Read, 8, 8192)
        .emit(&mut header)
        .unwrap();
    let (errno, _) = world.read_request(c, 4, &header[..len], 4096, false);
    assert_eq!(errno, rnbd::errno::EINVAL, "read bi_size > buffer");

    // Malformed IO messages, each written over the original data (#24, #26,
    // #33, #35).
    let data = pattern(34, 4096);
    // Emitted valid, then patched: the encoder refuses what we send.
    let write_at = |sector: u64, header: &mut [u8; 64]| {
        let len = io(device.id, IoOp::Write, 8, 4096).emit(header).unwrap();
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        len
    };
    let mut tag = 20;
    let mut expect = |world: &mut World<'_>, what: &str, header: &[u8], errno: u16| {
        tag += 1;
        let got = world.write_request(c, tag, header, &data, false);
        assert_eq!(got, errno, "{what}");
    };
    let len = write_at(8, &mut header);
    let mut op = header;
    op[16] = 7; // no such op
    expect(world, "unknown op", &op[..len], rnbd::errno::EOPNOTSUPP);
    op[16] = 5; // WRITE_SAME
    expect(world, "WRITE_SAME", &op[..len], rnbd::errno::EOPNOTSUPP);
    expect(
        world,
        "IO shorter than 24 bytes",
        &header[..16],
        rnbd::errno::EINVAL,
    );
    let nsectors = device.nsectors;
    let len = write_at(nsectors - 4, &mut header);
    expect(
        world,
        "beyond the device end",
        &header[..len],
        rnbd::errno::EINVAL,
    );
    let len = write_at(u64::MAX - 3, &mut header);
    expect(
        world,
        "sector range overflows",
        &header[..len],
        rnbd::errno::EINVAL,
    );
    let len = write_at(8, &mut header);
    header[20..24].copy_from_slice(&1000u32.to_le_bytes());
    let got = world.write_request(c, 30, &header[..len], &data[..1000], false);
    assert_eq!(got, rnbd::errno::EINVAL, "1000-byte write");
    // A WRITE carried as an RTRS READ (rnbd.md §8.3 #26).
    let len = write_at(8, &mut header);
    let (errno, _) = world.read_request(c, 31, &header[..len], 4096, false);
    assert_eq!(errno, rnbd::errno::EINVAL, "WRITE as an RTRS READ");
    assert_eq!(world.read(c, 5, &device, 4096, 8192), (0, original.clone()));

    // A read-only open of vol0, written anyway at the healthy client's blocks.
    let read_only = world.open(c, 6, "vol0", AccessMode::ReadOnly).unwrap();
    let mut forced = read_only;
    forced.mode = AccessMode::ReadWrite;
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    assert_eq!(
        world.write(c, 7, &forced, 0, &pattern(32, 16384)),
        rnbd::errno::EPERM
    );
    // Re-opening it read-write is refused too (#31: the mode is rechecked).
    assert_eq!(
        world
            .open(c, 40, "vol0", AccessMode::ReadWrite)
            .unwrap_err(),
        rnbd::errno::EPERM
    );

    // Unknown and closed device ids.
    let mut unknown = device;
    unknown.id = 999;
    assert_eq!(
        world.write(c, 8, &unknown, 0, &[1; 4096]),
        rnbd::errno::ENOTCONN
    );
    assert_eq!(world.read(c, 9, &unknown, 0, 4096).0, rnbd::errno::ENOTCONN);
    assert_eq!(world.close_device(c, 10, &read_only), 0);
    assert_eq!(
        world.write(c, 11, &forced, 0, &[1; 4096]),
        rnbd::errno::ENOTCONN
    );

    // The rogue's own IO still works.
    let fresh = pattern(33, 16384);
    assert_eq!(world.write(c, 12, &device, 65536, &fresh), 0);
    assert_eq!(world.read(c, 13, &device, 65536, 16384), (0, fresh));
    world.close_session(c);
    world.clients[c].alive = false;
}

/// A session name no access rule matches never becomes a session: the
/// path is closed at INFO_REQ (no INFO_RSP, rnbd.md §4.5), before the
/// engine registers a chunk for it, and holds no slot or name afterwards.
fn case_session_name_refused(world: &mut World<'_>) {
    let refused = world.engine.rtrs(0).unwrap().stats().paths_refused;
    let c = world.add_client(31, QUEUE_DEPTH, 31);
    world.run_until("healthy IO in flight", |w| {
        w.workload_in_flight(HEALTHY) > 0
    });
    assert_eq!(
        world.connect(c, "other", 2),
        Err(PathError::Disconnected),
        "the path is closed"
    );
    assert!(world.engine.rtrs(0).unwrap().stats().paths_refused > refused);
    assert!(world.log_count("refuse: session \"other\"") > 0);
    world.close_session(c);
    world.clients[c].alive = false;
}

// ----- the tests -------------------------------------------------------------

/// rnbd.md §8.2 #14 (chunk id): the offending path is closed, the healthy
/// client is unaffected.
#[test]
fn chunk_id_beyond_queue_depth_closes_the_path() {
    hostile(case_chunk_id_beyond_queue_depth);
}

/// rnbd.md §8.2 #14 (offset): the offending path is closed, the healthy
/// client is unaffected.
#[test]
fn offset_beyond_chunk_closes_the_path() {
    hostile(case_offset_beyond_chunk);
}

/// rnbd.md §8.2 #15: a message overflowing the chunk closes the path, the
/// healthy client is unaffected.
#[test]
fn message_overflowing_the_chunk_closes_the_path() {
    hostile(case_message_overflows_chunk);
}

/// rnbd.md §8.2 #16: an unknown message type closes the path, the healthy
/// client is unaffected.
#[test]
fn unknown_message_type_closes_the_path() {
    hostile(case_unknown_message_type);
}

/// rnbd.md §8.2 #17: `usr_len > offset` gets EINVAL and the path serves on;
/// the healthy client is unaffected.
#[test]
fn user_header_beyond_chunk_start_gets_einval() {
    hostile(case_user_header_beyond_chunk_start);
}

/// rnbd.md §8.2 #18: a READ with two descriptors gets EINVAL and the path
/// serves on; the healthy client is unaffected.
#[test]
fn read_with_two_descriptors_gets_einval() {
    hostile(case_read_with_two_descriptors);
}

/// rnbd.md §8.2 #19: a READ length different from the room left gets
/// EINVAL and the path serves on; the healthy client is unaffected.
#[test]
fn read_length_different_from_room_gets_einval() {
    hostile(case_read_length_differs_from_room);
}

/// rnbd.md §8.2 #20: reusing a chunk before its answer closes the path;
/// the healthy client is unaffected.
#[test]
fn chunk_reused_before_answer_closes_the_path() {
    hostile(case_chunk_reused_before_answer);
}

/// rnbd.md §8.2 #13: an unknown immediate type is ignored; the healthy
/// client is unaffected.
#[test]
fn unknown_immediate_type_is_ignored() {
    hostile(case_unknown_immediate_type);
}

/// A forged rkey in a READ closes only the offending path; the healthy
/// client is unaffected.
#[test]
fn read_into_forged_rkey_closes_the_path() {
    hostile(case_read_into_forged_rkey);
}

/// rtrs.md §2.4: malformed CON_REQs are rejected with the right CONN_RSP
/// errno and leave nothing behind; the healthy client is unaffected.
#[test]
fn malformed_con_reqs_are_rejected() {
    hostile(case_malformed_con_reqs);
}

/// rtrs.md §2.4 step 5: another host reusing the healthy session's uuids
/// is refused and the healthy path is untouched.
#[test]
fn session_uuid_collision_is_refused() {
    hostile(case_session_uuid_collision);
}

/// rnbd.md §8.1 #7: a half-open path is timed out and its session slot
/// freed; the healthy client is unaffected.
#[test]
fn half_open_path_times_out() {
    hostile(case_half_open_path_times_out);
}

/// rnbd.md §8.1 #9-#11: bad INFO_REQs close only the offending path; the
/// healthy client keeps its session name and is unaffected.
#[test]
fn bad_info_reqs_close_the_path() {
    hostile(case_bad_info_reqs);
}

/// `max_connections_per_path` is enforced at connect time; the healthy
/// client is unaffected.
#[test]
fn too_many_connections_are_refused() {
    hostile(case_too_many_connections);
}

/// `max_sessions` is enforced; the earlier sessions keep working.
#[test]
fn too_many_sessions_are_refused() {
    hostile(case_too_many_sessions);
}

/// rnbd.md §8.3 #32, #34, #36: crafted RNBD IO gets ENOTCONN / EINVAL /
/// EPERM and changes nothing; the healthy client is unaffected.
#[test]
fn rnbd_violations_get_their_errno() {
    hostile(case_rnbd_violations);
}

/// rnbd.md §4.5: a session the access list refuses is closed at INFO_REQ;
/// the healthy client is unaffected.
#[test]
fn refused_session_name_is_closed_at_info_req() {
    hostile(case_session_name_refused);
}

/// Every case above in sequence on one engine: afterwards the engine's
/// RTRS server holds only the healthy client's session, path, connections
/// and buffers, its workload has seen no error and no mismatch, and it
/// still does byte-exact IO.
#[test]
fn all_cases_in_sequence_leave_only_the_healthy_session() {
    with_world(MANIFEST, |world| {
        healthy(world);
        let cases: [(&str, Case); 18] = [
            ("half-open path", case_half_open_path_times_out),
            ("chunk id", case_chunk_id_beyond_queue_depth),
            ("offset", case_offset_beyond_chunk),
            ("overflow", case_message_overflows_chunk),
            ("message type", case_unknown_message_type),
            ("usr_len", case_user_header_beyond_chunk_start),
            ("sg_cnt", case_read_with_two_descriptors),
            ("desc.len", case_read_length_differs_from_room),
            ("chunk reuse", case_chunk_reused_before_answer),
            ("immediate type", case_unknown_immediate_type),
            ("forged rkey", case_read_into_forged_rkey),
            ("CON_REQ", case_malformed_con_reqs),
            ("uuid collision", case_session_uuid_collision),
            ("INFO_REQ", case_bad_info_reqs),
            ("connections", case_too_many_connections),
            ("sessions", case_too_many_sessions),
            ("rnbd", case_rnbd_violations),
            ("access list", case_session_name_refused),
        ];
        for (name, case) in cases {
            case(world);
            after_case(world, name);
        }
        world.stop_workload(HEALTHY);
        let workload = world.workload(HEALTHY);
        workload.assert_clean(PROGRESS * cases.len() as u64);
        assert!(workload.reads_checked > 0);
        assert_only_healthy(world);
        let usage = world.engine.rtrs(0).unwrap().usage();
        assert_eq!(usage.ios, 0, "{usage:?}");
        // The healthy client still does explicit byte-exact IO.
        let device = world
            .open(HEALTHY, 100, "vol0", AccessMode::ReadWrite)
            .unwrap();
        let data = pattern(100, 32 * 1024);
        assert_eq!(world.write(HEALTHY, 101, &device, 1 << 20, &data), 0);
        assert_eq!(
            world.read(HEALTHY, 102, &device, 1 << 20, 32 * 1024),
            (0, data)
        );
    });
}

/// The healthy client's checker is not blind: a write behind the
/// workload's back (its shadow copy goes stale) is reported as read
/// mismatches once the workload resumes. Guards every "0 mismatches"
/// assertion above against passing vacuously.
#[test]
fn workload_checker_detects_foreign_writes() {
    with_world(MANIFEST, |world| {
        healthy(world);
        world.stop_workload(HEALTHY);
        let device = world
            .open(HEALTHY, 50, "vol0", AccessMode::ReadWrite)
            .unwrap();
        // Slot 0 owns the first 64 KiB of vol0; overwrite half of it.
        let foreign = pattern(50, 32 * 1024);
        assert_eq!(world.write(HEALTHY, 51, &device, 0, &foreign), 0);
        world.clients[HEALTHY].workload.as_mut().unwrap().running = true;
        world.run_until("mismatch detected", |w| w.workload(HEALTHY).mismatches > 0);
    });
}
