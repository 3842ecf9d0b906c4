//! RTRS server IO path against the mock provider (rtrs.md §3, §4).

mod server_support;

use rtrs::server::{errno, CloseReason, Event, IoDirection, ReadData};
use rtrs::wire::{Imm, RkeyRsp};
use server_support::*;
use verbs::{Memory, Rkey, SendOp, WcOpcode, WcStatus, WorkCompletion};

fn open(h: &mut Harness) -> ClientPath {
    let path = ClientPath::open(h, 2, 1, 1, "sess-a");
    let events = h.drain_events();
    assert!(matches!(&events[0], Event::SessionOpened { name, .. } if name.as_str() == "sess-a"));
    assert!(matches!(events[1], Event::PathUp { .. }));
    path
}

#[test]
fn info_exchange_covers_the_pool() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    let config = *h.server.config();
    assert_eq!(path.chunks.len(), usize::from(config.queue_depth));
    // Distinct chunks, each registered for remote write with its rkey.
    for chunk in &path.chunks {
        assert_eq!(chunk.len, config.chunk_size);
        h.mock()
            .remote_write(chunk.rkey, chunk.addr + u64::from(chunk.len) - 1, &[1])
            .expect("whole chunk writable");
    }
    // IO receives: 512 on cid 0, qd on cid 1 (rtrs.md §3.2).
    assert_eq!(h.mock().posted_receives(path.conns[0]), 512);
    assert_eq!(h.mock().posted_receives(path.conns[1]), 8);
    // Accept parameters (rtrs.md §2.8).
    let accepted = h.mock().accepted.clone();
    assert_eq!(accepted[0].send_queue_depth, 1026);
    assert_eq!(accepted[1].receive_queue_depth, 9);
    assert_eq!(accepted[0].rnr_retry_count, 7);
}

#[test]
fn write_io_with_new_rkey() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    let header = [0xAB; 32];
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let old_rkey = path.chunks[5].rkey;
    path.write(&mut h, 1, 5, &header, &data);
    let event = next_io(&mut h).expect("an Io event");
    let Event::Io {
        direction,
        header: header_handle,
        data: data_handle,
        admin,
        ..
    } = event.clone()
    else {
        unreachable!()
    };
    assert_eq!(direction, IoDirection::Write);
    assert!(!admin);
    let mut got = vec![0; 32];
    h.ports[0].read(header_handle, 0, &mut got).unwrap();
    assert_eq!(got, header);
    let mut got = vec![0; 4096];
    assert_eq!(data_handle.len(), 4096);
    h.ports[0].read(data_handle, 0, &mut got).unwrap();
    assert_eq!(got, data);
    // The chunk is revoked while the server owns it (LOCAL_INV posted).
    assert!(h
        .mock()
        .remote_write(old_rkey, path.chunks[5].addr, &[0])
        .is_err());
    let from = h.mock().sends.len();
    let rekeys = h.mock().rekeys;
    complete_ok(&mut h, token(&event));
    let sends = h.mock().sends_since(from);
    assert_eq!(sends.len(), 1, "{sends:?}");
    let (conn, wr) = &sends[0];
    assert_eq!(*conn, path.conns[1], "answer on the request's connection");
    assert!(wr.signaled);
    let SendOp::SendInline { imm: Some(imm), .. } = &wr.op else {
        panic!("inline SEND_WITH_IMM expected: {wr:?}")
    };
    assert_eq!(
        Imm::decode(*imm),
        Imm::IoRsp {
            msg_id: 5,
            errno: 0
        }
    );
    let rkey_rsp = RkeyRsp::parse(&h.mock().gather(wr)).unwrap();
    assert_eq!(rkey_rsp.buf_id, 5);
    assert_eq!(h.mock().rekeys, rekeys + 1, "rekey happened");
    assert_ne!(rkey_rsp.rkey, old_rkey);
    // The new rkey works, the old one does not.
    h.mock()
        .remote_write(rkey_rsp.rkey, path.chunks[5].addr, &[1])
        .unwrap();
    assert!(h
        .mock()
        .remote_write(old_rkey, path.chunks[5].addr, &[1])
        .is_err());
    let stats = h.server.session_stats(match event {
        Event::Io { session, .. } => session,
        _ => unreachable!(),
    });
    assert_eq!(stats.unwrap().writes, 1);
    assert_eq!(stats.unwrap().write_bytes, 4096);
}

#[test]
fn read_io_with_need_inval_is_chained_in_order() {
    let mut h = Harness::new(small_config());
    let mut path = open(&mut h);
    // A write first, so the chunk's rkey changes (the client tracks it).
    path.write(&mut h, 1, 2, &[1; 32], &[7; 512]);
    let event = next_io(&mut h).unwrap();
    let from = h.mock().sends.len();
    complete_ok(&mut h, token(&event));
    let rsp = RkeyRsp::parse(&h.mock().gather_send(from)).unwrap();
    path.chunks[2].rkey = rsp.rkey;
    h.mock().complete_sends();
    h.settle();

    let client_rkey = Rkey(0x4242_4201);
    path.read(&mut h, 1, 2, &[2; 32], 4096, client_rkey, true);
    let event = next_io(&mut h).unwrap();
    let Event::Io {
        direction, data, ..
    } = event
    else {
        unreachable!()
    };
    assert_eq!(direction, IoDirection::Read { read_len: 4096 });
    assert_eq!(data.len(), 4096);
    h.mock().write(data, 0, &[0x5A; 4096]).unwrap();
    let from = h.mock().sends.len();
    let now = h.now;
    h.server
        .complete_io(token(&event), 0, ReadData::Chunk, now, &mut h.ports)
        .unwrap();
    let sends = h.mock().sends_since(from);
    assert_eq!(sends.len(), 3, "{sends:?}");
    match &sends[0].1.op {
        SendOp::RdmaWrite {
            remote_addr,
            rkey,
            imm: None,
            ..
        } => {
            assert_eq!((*remote_addr, *rkey), (0x7000_0000, client_rkey));
            assert_eq!(h.mock().gather(&sends[0].1), vec![0x5A; 4096]);
            assert!(!sends[0].1.signaled);
        }
        other => panic!("RDMA WRITE expected: {other:?}"),
    }
    assert!(
        matches!(sends[1].1.op, SendOp::SendWithInv { invalidate, ref sgl } if invalidate == client_rkey && sgl.is_empty())
    );
    match &sends[2].1.op {
        SendOp::SendInline { imm: Some(imm), .. } => assert_eq!(
            Imm::decode(*imm),
            Imm::IoRspWithInvalidate {
                msg_id: 2,
                errno: 0
            }
        ),
        other => panic!("SEND_WITH_IMM expected: {other:?}"),
    }
    assert!(sends.iter().all(|(c, _)| *c == path.conns[1]));
}

#[test]
fn read_without_new_rkey_uses_write_with_imm() {
    let mut config = small_config();
    config.always_invalidate = false;
    let mut h = Harness::new(config);
    let path = open(&mut h);
    path.read(&mut h, 0, 3, &[2; 32], 1024, Rkey(0x99), false);
    let event = next_io(&mut h).unwrap();
    assert!(matches!(event, Event::Io { admin: true, .. }));
    let from = h.mock().sends.len();
    complete_ok(&mut h, token(&event));
    let sends = h.mock().sends_since(from);
    assert_eq!(sends.len(), 2);
    assert!(matches!(sends[0].1.op, SendOp::RdmaWrite { imm: None, .. }));
    match &sends[1].1.op {
        SendOp::RdmaWrite {
            sgl,
            remote_addr: 0,
            rkey: Rkey(0),
            imm: Some(imm),
        } => {
            assert!(sgl.is_empty());
            assert_eq!(
                Imm::decode(*imm),
                Imm::IoRsp {
                    msg_id: 3,
                    errno: 0
                }
            );
        }
        other => panic!("zero-length WRITE_WITH_IMM expected: {other:?}"),
    }
    assert_eq!(h.mock().rekeys, 0);
}

/// A provider that revokes an rkey at once (the software HCA) gets no
/// LOCAL_INV: the request is parsed in the same poll, with the client's
/// access already gone, and the answer carries a fresh rkey as before.
#[test]
fn a_provider_that_revokes_at_once_needs_no_local_inv() {
    let mut h = Harness::new(small_config());
    h.mock().revoke_now = true;
    let path = open(&mut h);
    let old_rkey = path.chunks[3].rkey;
    let from = h.mock().sends.len();
    path.write(&mut h, 1, 3, &[0xCD; 32], &[7; 512]);
    h.settle();
    let event = h
        .drain_events()
        .into_iter()
        .find(|e| matches!(e, Event::Io { .. }))
        .expect("parsed without a send completing");
    assert_eq!(h.mock().revokes, 1);
    assert!(
        !h.mock()
            .sends_since(from)
            .iter()
            .any(|(_, wr)| matches!(wr.op, SendOp::LocalInv { .. })),
        "no LOCAL_INV posted"
    );
    assert!(h
        .mock()
        .remote_write(old_rkey, path.chunks[3].addr, &[0])
        .is_err());
    let from = h.mock().sends.len();
    complete_ok(&mut h, token(&event));
    let sends = h.mock().sends_since(from);
    let rkey_rsp = RkeyRsp::parse(&h.mock().gather(&sends[0].1)).unwrap();
    assert_ne!(rkey_rsp.rkey, old_rkey);
    h.mock()
        .remote_write(rkey_rsp.rkey, path.chunks[3].addr, &[1])
        .unwrap();
}

#[test]
fn error_answer_to_read_still_invalidates() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    path.read(&mut h, 1, 0, &[2; 32], 512, Rkey(0x1234), true);
    let event = next_io(&mut h).unwrap();
    let from = h.mock().sends.len();
    let now = h.now;
    h.server
        .complete_io(
            token(&event),
            errno::EIO,
            ReadData::Chunk,
            now,
            &mut h.ports,
        )
        .unwrap();
    let sends = h.mock().sends_since(from);
    assert_eq!(sends.len(), 2);
    assert!(matches!(sends[0].1.op, SendOp::SendWithInv { .. }));
    assert!(
        matches!(&sends[1].1.op, SendOp::SendInline { imm: Some(imm), .. }
        if Imm::decode(*imm) == Imm::IoRspWithInvalidate { msg_id: 0, errno: 5 })
    );
    // Answering twice is refused.
    assert!(h
        .server
        .complete_io(token(&event), 0, ReadData::Chunk, now, &mut h.ports)
        .is_err());
}

#[test]
fn send_queue_full_and_previous_completion_are_waits() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    path.write(&mut h, 1, 1, &[1; 8], &[2; 8]);
    let event = next_io(&mut h).unwrap();
    h.mock().queue_full = true;
    complete_ok(&mut h, token(&event));
    assert_eq!(h.server.usage().ios, 1, "parked");
    assert_eq!(h.server.poll_at(), Some(0));
    h.mock().queue_full = false;
    let from = h.mock().sends.len();
    h.settle();
    assert_eq!(h.mock().sends.len(), from + 1, "sent once room appeared");
    assert_eq!(h.server.usage().ios, 0);
    // The response is not completed yet: a new request on the chunk waits
    // for it before answering.
    let rsp = RkeyRsp::parse(&h.mock().gather_send(from)).unwrap();
    let mut path = path;
    path.chunks[1].rkey = rsp.rkey;
    path.write(&mut h, 1, 1, &[1; 8], &[3; 8]);
    h.settle();
    // Complete only the LOCAL_INV, keep the old response outstanding.
    let inv = h
        .mock()
        .outstanding
        .iter()
        .position(|(_, wr)| matches!(wr.op, SendOp::LocalInv { .. }))
        .unwrap();
    let (conn, wr) = h.mock().outstanding.remove(inv).unwrap();
    h.mock().cq.push_back(WorkCompletion::new(
        wr.wr_id,
        conn,
        WcOpcode::LocalInv,
        WcStatus::Success,
    ));
    h.settle();
    let event = h
        .drain_events()
        .into_iter()
        .find(|e| matches!(e, Event::Io { .. }))
        .unwrap();
    let from = h.mock().sends.len();
    complete_ok(&mut h, token(&event));
    assert_eq!(
        h.mock().sends.len(),
        from,
        "waits for the previous completion"
    );
    h.mock().complete_sends();
    h.settle();
    assert_eq!(h.mock().sends.len(), from + 1);
}

#[test]
fn hostile_immediates() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    let layout = path.layout;
    let imm = |chunk: u32, offset: u32| {
        Imm::IoReq {
            payload: layout.join(chunk, offset).unwrap(),
        }
        .encode()
        .unwrap()
    };

    // usr_len > offset: answered EINVAL (Linux would hang the IO).
    let chunk = path.chunks[0];
    h.mock()
        .remote_write(chunk.rkey, chunk.addr + 4, &[2, 0, 200, 0])
        .unwrap();
    let from = h.mock().sends.len();
    h.mock().deliver_imm(path.conns[1], imm(0, 4));
    h.settle();
    h.mock().complete_sends();
    h.settle();
    let answer = h
        .mock()
        .sends_since(from)
        .into_iter()
        .find_map(|(_, wr)| match wr.op {
            SendOp::SendInline { imm: Some(imm), .. } => Some(Imm::decode(imm)),
            _ => None,
        });
    assert_eq!(
        answer,
        Some(Imm::IoRsp {
            msg_id: 0,
            errno: 22
        })
    );

    // sg_cnt > 1: EINVAL.
    let chunk = path.chunks[1];
    h.mock()
        .remote_write(chunk.rkey, chunk.addr + 64, &[3, 0, 0, 0, 1, 0, 2, 0])
        .unwrap();
    let from = h.mock().sends.len();
    h.mock().deliver_imm(path.conns[1], imm(1, 64));
    h.settle();
    h.mock().complete_sends();
    h.settle();
    assert!(h.mock().sends_since(from).iter().any(|(_, wr)| matches!(wr.op,
        SendOp::SendInline { imm: Some(imm), .. } if Imm::decode(imm) == Imm::IoRsp { msg_id: 1, errno: 22 })));

    // desc.len beyond the chunk (and != data_len): EINVAL, still invalidated.
    let chunk = path.chunks[2];
    let mut msg = vec![3, 0, 0, 0, 1, 0, 1, 0];
    msg.extend_from_slice(&0x1000u64.to_le_bytes());
    msg.extend_from_slice(&0x77u32.to_le_bytes());
    msg.extend_from_slice(&u32::MAX.to_le_bytes());
    h.mock()
        .remote_write(chunk.rkey, chunk.addr + 100, &msg)
        .unwrap();
    let from = h.mock().sends.len();
    h.mock().deliver_imm(path.conns[1], imm(2, 100));
    h.settle();
    h.mock().complete_sends();
    h.settle();
    let sends = h.mock().sends_since(from);
    assert!(sends
        .iter()
        .any(|(_, wr)| matches!(wr.op, SendOp::SendWithInv { .. })));
    assert!(sends.iter().any(|(_, wr)| matches!(wr.op,
        SendOp::SendInline { imm: Some(imm), .. } if Imm::decode(imm) == Imm::IoRspWithInvalidate { msg_id: 2, errno: 22 })));
    assert!(h
        .drain_events()
        .iter()
        .all(|e| !matches!(e, Event::Io { .. })));
    assert_eq!(h.server.usage().ios, 0);

    // Unknown immediate types are ignored.
    h.mock().deliver_imm(path.conns[1], 0x3000_0000);
    h.settle();
    assert_eq!(h.server.stats().ignored_immediates, 1);

    // Offset beyond the chunk (but inside the immediate's bits): close.
    let beyond = layout.join(3, 16 * 1024 + 5).unwrap();
    h.mock().deliver_imm(
        path.conns[1],
        Imm::IoReq { payload: beyond }.encode().unwrap(),
    );
    h.mock().complete_sends();
    h.settle();
    let events = h.drain_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::PathDown {
                reason: CloseReason::ProtocolViolation,
                ..
            }
        )),
        "{events:?}"
    );
    h.settle();
    assert_eq!(h.server.usage(), Default::default());
    assert_eq!(h.mock().arena.buffers(), 0);
}

#[test]
fn bad_chunk_id_closes_the_path() {
    let mut config = small_config();
    config.queue_depth = 6;
    let mut h = Harness::new(config);
    let path = open(&mut h);
    // qd 6 uses 3 chunk bits; chunk ids 6 and 7 are representable but >= qd.
    let payload = (7u32 << path.layout.mem_bits()) | 16;
    h.mock()
        .deliver_imm(path.conns[0], Imm::IoReq { payload }.encode().unwrap());
    h.settle();
    assert!(h.drain_events().iter().any(|e| matches!(
        e,
        Event::PathDown {
            reason: CloseReason::ProtocolViolation,
            ..
        }
    )));
    assert!(h.mock().disconnected.contains(&path.conns[0]));
    assert!(h.mock().disconnected.contains(&path.conns[1]));
}

#[test]
fn bad_message_type_and_chunk_reuse_close() {
    let mut config = small_config();
    config.always_invalidate = false;
    let mut h = Harness::new(config);
    let path = open(&mut h);
    path.write(&mut h, 1, 4, &[0; 8], &[0; 8]);
    assert!(next_io(&mut h).is_some());
    // Second request on chunk 4 before the answer: protocol violation.
    path.write(&mut h, 1, 4, &[0; 8], &[0; 8]);
    h.settle();
    assert!(h.drain_events().iter().any(|e| matches!(
        e,
        Event::PathDown {
            reason: CloseReason::ProtocolViolation,
            ..
        }
    )));
}

#[test]
fn heartbeats_are_sent_and_answered() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    let deadline = h.server.poll_at().unwrap();
    assert_eq!(deadline, 1 + 5 * SECOND);
    // HB_MSG from the client is answered with HB_ACK on cid 0.
    let from = h.mock().sends.len();
    h.mock().deliver_imm(path.conns[1], 0x8000_0000);
    h.settle();
    let sends = h.mock().sends_since(from);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].0, path.conns[0]);
    assert!(matches!(
        sends[0].1.op,
        SendOp::RdmaWrite {
            imm: Some(0x9000_0000),
            rkey: Rkey(0),
            remote_addr: 0,
            ..
        }
    ));
    // Our heartbeat goes out on schedule.
    h.now = deadline;
    let from = h.mock().sends.len();
    h.settle();
    assert!(matches!(
        h.mock().sends[from].1.op,
        SendOp::RdmaWrite {
            imm: Some(0x8000_0000),
            ..
        }
    ));
}

#[test]
fn heartbeat_timeout_closes_the_path() {
    let mut h = Harness::new(small_config());
    let _path = open(&mut h);
    let mut closed_at = None;
    for tick in 1..=8 {
        h.now = 1 + tick * 5 * SECOND;
        h.settle();
        if h.drain_events().iter().any(|e| {
            matches!(
                e,
                Event::PathDown {
                    reason: CloseReason::HeartbeatTimeout,
                    ..
                }
            )
        }) {
            closed_at = Some(tick);
            break;
        }
    }
    // HB at T=5 s, missed count 6 at 30 s, fires at 35 s (rtrs.md §5).
    assert_eq!(closed_at, Some(7));
    h.settle();
    assert_eq!(h.server.usage(), Default::default());
}

#[test]
fn any_receive_resets_the_heartbeat() {
    let mut h = Harness::new(small_config());
    let path = open(&mut h);
    for tick in 1..=20 {
        h.now = 1 + tick * 5 * SECOND;
        h.mock().deliver_imm(path.conns[0], 0x9000_0000); // HB_ACK
        h.settle();
        assert!(h.drain_events().is_empty(), "tick {tick}");
    }
}
