//! RTRS server connection handling against the mock provider (rtrs.md §2,
//! §6, §7): accept/reject, limits, reconnect, multipath, teardown, leaks.

mod server_support;

use rtrs::server::{errno, CloseReason, Event, PathRefusal, ReadData, ServerConfig, Usage};
use rtrs::wire::{ConnRsp, ConnRspFlags};
use server_support::*;
use verbs::CmEvent;

#[test]
fn accept_carries_conn_rsp() {
    let mut h = Harness::new(small_config());
    assert_eq!(h.mock().listening, Some(1234));
    let conn = h.request(&con_req(0, 2, 1, 1, 1));
    assert!(h.was_accepted(conn));
    let rsp = ConnRsp::parse(&h.mock().accepted[0].private_data).unwrap();
    assert_eq!(
        rsp,
        ConnRsp::accept(8, 16 * 1024 - 4096, 4096, ConnRspFlags::NEW_RKEY)
    );
    // cid 0 has its INFO_REQ receive before the accept (rtrs.md §2.4 step 6).
    assert_eq!(h.mock().posted_receives(conn), 1);
}

#[test]
fn brick_default_does_not_split_128k() {
    let config = ServerConfig::brick_default();
    assert_eq!(config.max_io_size(), 128 * 1024);
    assert!(config.check().is_ok());
}

#[test]
fn malformed_con_req_is_rejected() {
    let mut h = Harness::new(small_config());
    let mut bad_magic = con_req(0, 1, 1, 1, 1);
    bad_magic[2] ^= 0xff;
    let conn = h.request(&bad_magic);
    assert_eq!(h.reject_errno(conn), Some(-(errno::ECONNRESET as i16)));
    let mut bad_version = con_req(0, 1, 1, 1, 1);
    bad_version[5] = 3;
    let conn = h.request(&bad_version);
    assert_eq!(h.reject_errno(conn), Some(-104));
    let conn = h.request(&con_req(0, 1, 1, 1, 1)[..40]);
    assert_eq!(h.reject_errno(conn), Some(-104));
    let mut cid_beyond = con_req(0, 1, 1, 1, 1);
    cid_beyond[6] = 1; // cid 1 of cid_num 1
    let conn = h.request(&cid_beyond);
    assert_eq!(h.reject_errno(conn), Some(-104));
    // The reject private data is a CONN_RSP with the errno and zeros.
    let (_, pd) = h.mock().rejected[0].clone();
    assert_eq!(pd.len(), 56);
    assert_eq!(&pd[4..6], &(-104i16).to_le_bytes());
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.server.stats().rejected, 4);
}

#[test]
fn limits_are_enforced() {
    let mut h = Harness::new(small_config()); // 2 sessions, 2 paths, 4 cids
    let conn = h.request(&con_req(0, 5, 1, 1, 1));
    assert_eq!(h.reject_errno(conn), Some(-104), "cid_num above the limit");
    // Sessions count once admitted: two open ones fill the table.
    let _a = ClientPath::open(&mut h, 1, 1, 1, "one");
    let _b = ClientPath::open(&mut h, 1, 2, 2, "two");
    let conn = h_request(&mut h, 3, 3);
    assert_eq!(
        h.reject_errno(conn),
        Some(-(errno::ENOMEM as i16)),
        "3rd session"
    );
    // Paths per session: the up one and a half-open one.
    let conn = h_request(&mut h, 4, 1);
    assert!(h.was_accepted(conn));
    let conn = h_request(&mut h, 5, 1);
    assert_eq!(h.reject_errno(conn), Some(-12), "3rd path");
    // A duplicate cid of a connecting path.
    let conn = h.request(&con_req(0, 1, 4, 1, 1));
    assert_eq!(h.reject_errno(conn), Some(-104));
    // Unknown session without first_conn: ENXIO.
    let mut req = con_req(0, 1, 9, 9, 1);
    req[44] = 0;
    let conn = h.request(&req);
    assert_eq!(h.reject_errno(conn), Some(-(errno::ENXIO as i16)));
}

fn h_request(h: &mut Harness, path: u8, session: u8) -> verbs::ConnId {
    h.request(&con_req(0, 1, path, session, 1))
}

#[test]
fn pool_exhaustion_refuses_the_path_at_info_req() {
    // Room for one path's chunks only.
    let mut h = Harness::with_pool(small_config(), 200 * 1024);
    let _a = ClientPath::open(&mut h, 1, 1, 1, "one");
    let held = h.mock().arena.buffers();
    // A CON_REQ costs no chunk pool: the second session's is accepted...
    let conn = h_request(&mut h, 2, 2);
    assert!(h.was_accepted(conn));
    h.drain_events();
    // ...and its INFO_REQ finds no room: the path is closed, and no
    // session was made.
    h.info_req(conn, "two");
    let events = h.drain_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::PathRefused {
                reason: PathRefusal::OutOfMemory,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::SessionOpened { .. })));
    assert!(h.mock().disconnected.contains(&conn));
    h.drain();
    assert_eq!(h.server.usage().sessions, 1, "no half-made session left");
    assert_eq!(h.server.usage().paths, 1);
    assert_eq!(h.mock().arena.buffers(), held, "the partial pool is back");
}

#[test]
fn info_req_before_all_connections_closes() {
    let mut h = Harness::new(small_config());
    let conn = h.request(&con_req(0, 2, 1, 1, 1));
    let mut info = vec![0u8; 272];
    rtrs::wire::InfoReq { session_name: "x" }
        .emit(&mut info)
        .unwrap();
    h.mock().deliver_send(conn, &info);
    h.settle();
    assert!(h.mock().disconnected.contains(&conn));
    h.settle();
    assert_eq!(h.server.usage(), Usage::default());
}

#[test]
fn session_name_of_another_session_is_refused() {
    let mut h = Harness::new(small_config());
    let _a = ClientPath::open(&mut h, 1, 1, 1, "same");
    let conn = h.request(&con_req(0, 1, 2, 2, 1));
    let mut info = vec![0u8; 272];
    rtrs::wire::InfoReq {
        session_name: "same",
    }
    .emit(&mut info)
    .unwrap();
    h.mock().deliver_send(conn, &info);
    h.settle();
    assert!(h.mock().disconnected.contains(&conn));
}

#[test]
fn reconnect_replaces_only_a_stale_path_of_its_own_address() {
    let mut h = Harness::new(small_config());
    let old = ClientPath::open_recon(&mut h, 2, 1, 1, "sess", 1);
    h.drain_events();
    h.mock().complete_sends();
    h.settle();
    // Same recon_cnt while up: refused (the Linux behaviour).
    let conn = h.request(&con_req(0, 2, 1, 1, 1));
    assert_eq!(h.reject_errno(conn), Some(-104));
    assert_eq!(h.server.stats().takeovers_refused, 0);
    // A newer recon_cnt while the path is fresh (it answered within the
    // last heartbeat interval): refused, the path stays.
    let conn = h.request(&con_req(0, 2, 1, 1, 2));
    assert_eq!(h.reject_errno(conn), Some(-104));
    assert_eq!(h.server.stats().takeovers_refused, 1);
    // The path goes silent: a heartbeat out, a whole interval unanswered.
    let interval = h.server.config().heartbeat_interval_ns;
    for _ in 0..2 {
        h.now += interval;
        h.settle();
    }
    h.mock().complete_sends();
    h.settle();
    // Stale now, but another address presents its uuids: refused.
    let intruder = std::net::Ipv4Addr::new(10, 9, 9, 9);
    let conn = h.request_from(intruder, &con_req(0, 2, 1, 1, 3));
    assert_eq!(h.reject_errno(conn), Some(-104));
    assert_eq!(h.server.stats().takeovers_refused, 2);
    assert!(h.drain_events().is_empty(), "the path is untouched");
    // Its own client, after giving the old path up: replaced.
    let new = ClientPath::open_recon(&mut h, 2, 1, 1, "sess", 4);
    let events = h.drain_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::PathDown {
                reason: CloseReason::Replaced,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(events.iter().any(|e| matches!(e, Event::PathUp { .. })));
    assert!(h.mock().disconnected.contains(&old.conns[0]));
    assert!(h.mock().disconnected.contains(&old.conns[1]));
    assert_eq!(h.server.stats().paths_replaced, 1);
    h.drain();
    assert_eq!(h.server.usage().paths, 1, "stale path freed");
    // Replacing the only path up closed the session; the new path opened
    // a new one.
    assert_eq!(h.server.usage().sessions, 1);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::SessionClosed { .. })));
    // IO works on the new path.
    new.write(&mut h, 1, 0, &[1; 8], &[2; 8]);
    assert!(next_io(&mut h).is_some());
}

#[test]
fn multipath_session() {
    let mut h = Harness::new(small_config());
    let a = ClientPath::open(&mut h, 2, 1, 1, "mp");
    let b = ClientPath::open(&mut h, 1, 2, 1, "mp");
    let events = h.drain_events();
    let opened = events
        .iter()
        .filter(|e| matches!(e, Event::SessionOpened { .. }))
        .count();
    let ups = events
        .iter()
        .filter(|e| matches!(e, Event::PathUp { .. }))
        .count();
    assert_eq!((opened, ups), (1, 2));
    assert_eq!(h.server.usage().sessions, 1);
    // IO on both paths, same chunk id.
    a.write(&mut h, 1, 3, &[1; 8], &[1; 8]);
    b.write(&mut h, 0, 3, &[2; 8], &[2; 8]);
    h.settle();
    h.mock().complete_sends();
    h.settle();
    let ios: Vec<_> = h
        .drain_events()
        .into_iter()
        .filter(|e| matches!(e, Event::Io { .. }))
        .collect();
    assert_eq!(ios.len(), 2);
    for io in &ios {
        complete_ok(&mut h, token(io));
    }
    // Path a goes away: session stays.
    h.mock()
        .cm_events
        .push_back(CmEvent::Disconnected { conn: a.conns[1] });
    h.settle();
    let events = h.drain_events();
    assert!(events.iter().any(|e| matches!(e, Event::PathDown { .. })));
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::SessionClosed { .. })));
    // Then b: session closed.
    h.mock()
        .cm_events
        .push_back(CmEvent::Disconnected { conn: b.conns[0] });
    h.settle();
    assert!(h
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::SessionClosed { .. })));
    h.mock().complete_sends();
    h.settle();
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
}

#[test]
fn close_waits_for_requests_the_consumer_holds() {
    let mut h = Harness::new(small_config());
    let path = ClientPath::open(&mut h, 2, 1, 1, "s");
    path.write(&mut h, 1, 6, &[1; 8], &[1; 8]);
    let io = next_io(&mut h).unwrap();
    h.mock().cm_events.push_back(CmEvent::Disconnected {
        conn: path.conns[0],
    });
    h.settle();
    let usage = h.server.usage();
    assert_eq!((usage.paths, usage.ios, usage.connections), (1, 1, 0));
    assert!(
        h.mock().arena.buffers() > 0,
        "chunk still owned by the consumer"
    );
    let from = h.mock().sends.len();
    let now = h.now;
    h.server
        .complete_io(token(&io), 0, ReadData::Chunk, now, &mut h.ports)
        .unwrap();
    assert_eq!(h.mock().sends.len(), from, "answer dropped");
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
}

#[test]
fn close_deadline_destroys_unanswered_disconnects() {
    let mut h = Harness::new(small_config());
    let path = ClientPath::open(&mut h, 2, 1, 1, "s");
    let id = match h.drain_events().last() {
        Some(Event::PathUp { path, .. }) => *path,
        other => panic!("{other:?}"),
    };
    let now = h.now;
    h.server.close_path(id, now, &mut h.ports);
    // The provider never reports the disconnects.
    h.mock().cm_events.clear();
    h.settle();
    assert_eq!(h.server.usage().connections, 2);
    let deadline = h.server.poll_at().unwrap();
    h.now = deadline;
    h.settle();
    assert_eq!(h.server.usage(), Usage::default());
    assert!(h.mock().destroyed.contains(&path.conns[1]));
}

#[test]
fn thousand_connect_disconnect_cycles_leak_nothing() {
    let mut h = Harness::new(small_config());
    for round in 0..1000u32 {
        // A client reconnecting at the sustained setup rate (one path per
        // `setup_interval_ns` from its address) is never refused.
        h.now += h.server.config().setup_interval_ns;
        let cid_num = 1 + (round % 3) as u16;
        let path = ClientPath::open_recon(&mut h, cid_num, 1, 1, "cycle", round as u16 + 1);
        if round % 2 == 0 {
            path.write(&mut h, 0, round % 8, &[1; 8], &[2; 16]);
            let io = next_io(&mut h).unwrap();
            complete_ok(&mut h, token(&io));
        }
        let victim = path.conns[round as usize % path.conns.len()];
        h.mock()
            .cm_events
            .push_back(CmEvent::Disconnected { conn: victim });
        h.settle();
        h.mock().complete_sends();
        h.settle();
        h.drain_events();
        assert_eq!(h.server.usage(), Usage::default(), "round {round}");
        assert_eq!(h.mock().arena.buffers(), 0, "round {round}");
        assert!(h.mock().live.is_empty(), "round {round}");
    }
    assert_eq!(h.server.stats().paths_closed, 1000);
}

#[test]
fn second_path_with_the_same_addresses_is_refused() {
    let mut h = Harness::new(small_config());
    let _a = ClientPath::open(&mut h, 1, 1, 1, "dup");
    // A different path uuid from the same client address pair: the harness
    // derives the client address from byte 12 (the path uuid), so forge it.
    let mut req = con_req(0, 1, 2, 1, 1);
    req[12] = 1;
    req[13] = 2; // a different uuid, same first byte -> same addresses
    let conn = h.request(&req);
    assert_eq!(h.reject_errno(conn), Some(-(errno::EEXIST as i16)));
}

#[test]
fn close_all_returns_everything() {
    let mut h = Harness::new(small_config());
    let a = ClientPath::open(&mut h, 2, 1, 1, "one");
    let _b = ClientPath::open(&mut h, 1, 2, 2, "two");
    a.write(&mut h, 1, 0, &[1; 8], &[1; 8]);
    let io = next_io(&mut h).unwrap();
    let now = h.now;
    h.server.close_all(now, &mut h.ports);
    h.settle();
    let events = h.drain_events();
    let closed = events
        .iter()
        .filter(|e| matches!(e, Event::SessionClosed { .. }))
        .count();
    assert_eq!(closed, 2);
    assert_eq!(h.server.usage().paths, 1, "waits for the held request");
    h.server
        .complete_io(token(&io), 0, ReadData::Chunk, now, &mut h.ports)
        .unwrap();
    h.settle();
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
    assert!(h.mock().live.is_empty());
}
