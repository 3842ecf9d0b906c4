//! Admission against the mock provider: what a connecting path may hold
//! before and after its INFO_REQ is admitted (server/admission.rs), the
//! half-open limits, and the session a reconnect gets.

mod server_support;

use std::net::{IpAddr, Ipv4Addr};

use rtrs::server::{errno, CloseReason, Event, PathRefusal, ReadData, ServerConfig, Usage};
use server_support::*;
use verbs::CmEvent;

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// The client address `Harness::request` uses for path uuid byte `path`.
fn path_source(path: u8) -> IpAddr {
    ip(10, 0, path, 2)
}

fn refusals(events: &[Event]) -> Vec<PathRefusal> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PathRefused { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn a_con_req_costs_no_chunk_pool_until_its_info_req_is_admitted() {
    let mut h = Harness::new(small_config());
    let cid0 = h.request(&con_req(0, 2, 1, 1, 1));
    let cid1 = h.request(&con_req(1, 2, 1, 1, 1));
    assert!(h.was_accepted(cid0) && h.was_accepted(cid1));
    // Both connections, the INFO_REQ receive buffer, and nothing else.
    let usage = h.server.usage();
    assert_eq!((usage.sessions, usage.paths, usage.connections), (0, 1, 2));
    assert_eq!(usage.buffers, 1);
    assert_eq!(h.mock().arena.buffers(), 1);
    assert!(h.policy.asked.is_empty(), "nothing asked before INFO_REQ");
    // Admitted: now the session and the pool exist.
    h.info_req(cid0, "sess");
    let qd = usize::from(h.server.config().queue_depth);
    assert_eq!(h.server.usage().sessions, 1);
    // The chunks, INFO_REQ and INFO_RSP (RKEY_RSP goes inline).
    assert_eq!(h.mock().arena.buffers(), qd + 2);
    // Asked once, with the client address of the path (its cid 0).
    let remote = std::net::SocketAddr::new(path_source(1), 40000 + cid0.0 as u16);
    assert_eq!(h.policy.asked, [("sess".to_owned(), remote, false)]);
}

#[test]
fn a_refused_path_holds_nothing_and_leaves_its_name_free() {
    let mut h = Harness::new(small_config());
    // "victim" is admitted from path 2's address only.
    h.policy.rules = vec![("victim".into(), Some(path_source(2)))];
    let squatter = h.request(&con_req(0, 1, 1, 1, 1));
    h.info_req(squatter, "victim");
    let events = h.drain_events();
    assert_eq!(refusals(&events), [PathRefusal::NotAdmitted]);
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::SessionOpened { .. } | Event::PathUp { .. })));
    assert!(h.mock().disconnected.contains(&squatter));
    h.drain();
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
    assert_eq!(h.server.stats().paths_refused, 1);
    // The name was never taken: its rightful client gets it.
    let _path = ClientPath::open(&mut h, 1, 2, 2, "victim");
    let events = h.drain_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::SessionOpened { name, .. } if name.as_str() == "victim"
        )),
        "{events:?}"
    );
    // A half-open path cannot squat the name either: while it waits, the
    // open session keeps it and the newcomer is refused at INFO_REQ.
    h.policy.rules.clear();
    let late = h.request(&con_req(0, 1, 3, 3, 1));
    h.info_req(late, "victim");
    assert_eq!(refusals(&h.drain_events()), [PathRefusal::NameInUse]);
}

#[test]
fn every_path_of_a_session_is_checked_with_its_own_address() {
    let mut h = Harness::new(small_config());
    h.policy.rules = vec![("mp".into(), Some(path_source(1)))];
    let _a = ClientPath::open(&mut h, 1, 1, 1, "mp");
    let session = h
        .drain_events()
        .iter()
        .find_map(|e| match e {
            Event::SessionOpened { session, .. } => Some(*session),
            _ => None,
        })
        .expect("first path admitted");
    // The session's second path comes from an address no rule admits.
    let b = h.request(&con_req(0, 1, 2, 1, 1));
    assert!(h.was_accepted(b));
    h.info_req(b, "mp");
    let events = h.drain_events();
    assert_eq!(refusals(&events), [PathRefusal::NotAdmitted]);
    assert_eq!(h.policy.asked.len(), 2);
    let (name, remote, joins) = h.policy.asked[1].clone();
    assert_eq!(
        (name.as_str(), remote.ip(), joins),
        ("mp", path_source(2), true)
    );
    h.drain();
    assert_eq!(h.server.usage().paths, 1);
    assert!(h.server.session_stats(session).is_some(), "session stays");
    // Once admitted from there too, the same path comes up in the session.
    h.policy.rules.push(("mp".into(), Some(path_source(2))));
    let _b = ClientPath::open_recon(&mut h, 1, 2, 1, "mp", 2);
    let ups: Vec<_> = h
        .drain_events()
        .into_iter()
        .filter_map(|e| match e {
            Event::PathUp { session, .. } => Some(session),
            _ => None,
        })
        .collect();
    assert_eq!(ups, [session]);
}

/// A storm of new paths from one address: its burst is set up, the rest
/// refused with ENOMEM and counted, one more per interval afterwards; another
/// address meanwhile connects as if nothing happened.
#[test]
fn new_paths_per_address_are_paced() {
    let mut config = small_config();
    config.max_sessions = 8;
    config.max_paths_per_session = 4;
    config.max_half_open = 8;
    config.max_half_open_per_source = 8;
    config.setup_burst = 3;
    config.setup_interval_ns = 100_000_000;
    let mut h = Harness::new(config);
    let storm = Ipv4Addr::new(10, 1, 0, 1);
    // Each path is set up and closed at once, so only the rate limits it.
    let cycle = |h: &mut Harness, path: u8| {
        let conn = h.request_from(storm, &con_req(0, 1, path, path, 1));
        if h.was_accepted(conn) {
            h.mock().cm_events.push_back(CmEvent::Disconnected { conn });
            h.settle();
            h.drain();
            None
        } else {
            h.reject_errno(conn)
        }
    };
    for path in 1..=3 {
        assert_eq!(cycle(&mut h, path), None, "path {path} of the burst");
    }
    for path in 4..=10 {
        assert_eq!(
            cycle(&mut h, path),
            Some(-(errno::ENOMEM as i16)),
            "path {path} beyond the burst"
        );
    }
    assert_eq!(h.server.stats().setup_rate_refused, 7);
    // Another address is not paced by the storm.
    let other = Ipv4Addr::new(10, 2, 0, 1);
    let conn = h.request_from(other, &con_req(0, 1, 20, 20, 1));
    assert!(h.was_accepted(conn));
    h.info_req(conn, "bystander");
    assert!(h
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::SessionOpened { .. })));
    // One interval later the storm's address gets one more, not two.
    h.now += 100_000_000;
    assert_eq!(cycle(&mut h, 11), None);
    assert_eq!(cycle(&mut h, 12), Some(-(errno::ENOMEM as i16)));
    assert_eq!(
        h.server.usage().paths,
        1,
        "only the bystander's path is left"
    );
}

#[test]
fn half_open_paths_are_limited_per_address_and_a_stalled_oldest_is_evicted() {
    let mut config = small_config();
    config.max_sessions = 8;
    config.max_half_open = 4;
    config.max_half_open_per_source = 2;
    let mut h = Harness::new(config);
    let one = Ipv4Addr::new(10, 1, 0, 1);
    let first = h.request_from(one, &con_req(0, 2, 1, 1, 1));
    h.now += 1;
    let _second = h.request_from(one, &con_req(0, 2, 2, 2, 1));
    assert!(h.was_accepted(first));
    // A third from the same address: refused, the others stay.
    let third = h.request_from(one, &con_req(0, 2, 3, 3, 1));
    assert_eq!(h.reject_errno(third), Some(-(errno::ENOMEM as i16)));
    assert_eq!(h.server.stats().half_open_refused, 1);
    // Another address fills the table.
    let two = Ipv4Addr::new(10, 2, 0, 1);
    for path in 4..6 {
        h.now += 1;
        let conn = h.request_from(two, &con_req(0, 2, path, path, 1));
        assert!(h.was_accepted(conn));
    }
    assert_eq!(h.server.usage().paths, 4);
    // While every half-open path is young (a rack connecting at once),
    // a newcomer is refused and retries; nobody is evicted.
    let three = Ipv4Addr::new(10, 3, 0, 1);
    let early = h.request_from(three, &con_req(0, 1, 6, 6, 1));
    assert_eq!(h.reject_errno(early), Some(-(errno::ENOMEM as i16)));
    assert_eq!(h.server.stats().half_open_evicted, 0);
    assert_eq!(h.server.usage().paths, 4);
    // Once the oldest has stalled for a quarter of the setup deadline, a
    // newcomer is not locked out: the oldest half-open path goes.
    h.now += h.server.config().setup_timeout_ns / 4;
    let newcomer = h.request_from(three, &con_req(0, 1, 6, 6, 1));
    assert!(h.was_accepted(newcomer));
    assert_eq!(h.server.stats().half_open_evicted, 1);
    assert!(
        h.mock().destroyed.contains(&first) || h.mock().disconnected.contains(&first),
        "the oldest half-open path is closed"
    );
    h.drain();
    assert_eq!(h.server.usage().paths, 4);
    // The newcomer completes its setup normally.
    h.info_req(newcomer, "new");
    assert!(h
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::SessionOpened { .. })));
}

#[test]
fn a_half_open_path_is_closed_at_the_short_setup_deadline() {
    let config = ServerConfig::brick_default();
    assert!(
        config.setup_timeout_ns <= 10 * SECOND,
        "setup deadline {} s",
        config.setup_timeout_ns / SECOND
    );
    assert!(config.max_half_open >= config.max_half_open_per_source);
    let mut h = Harness::new(small_config());
    let conn = h.request(&con_req(0, 2, 1, 1, 1));
    let deadline = h.server.poll_at().expect("the setup deadline");
    assert_eq!(deadline, h.now + h.server.config().setup_timeout_ns);
    h.now = deadline - 1;
    h.settle();
    assert_eq!(h.server.usage().paths, 1);
    h.now = deadline;
    h.settle();
    h.drain();
    assert!(h.mock().destroyed.contains(&conn));
    assert_eq!(h.server.usage(), Usage::default());
    assert_eq!(h.mock().arena.buffers(), 0);
}

#[test]
fn another_address_cannot_add_connections_to_a_half_open_path() {
    let mut h = Harness::new(small_config());
    let cid0 = h.request(&con_req(0, 2, 1, 1, 1));
    assert!(h.was_accepted(cid0));
    let intruder = h.request_from(Ipv4Addr::new(10, 9, 9, 9), &con_req(1, 2, 1, 1, 1));
    assert_eq!(h.reject_errno(intruder), Some(-(errno::ECONNRESET as i16)));
    // A newer recon_cnt from there cannot replace it either.
    let intruder = h.request_from(Ipv4Addr::new(10, 9, 9, 9), &con_req(0, 2, 1, 1, 2));
    assert_eq!(h.reject_errno(intruder), Some(-(errno::ECONNRESET as i16)));
    assert_eq!(h.server.stats().takeovers_refused, 1);
    // Its own client completes it.
    let cid1 = h.request(&con_req(1, 2, 1, 1, 1));
    assert!(h.was_accepted(cid1));
}

/// rtrs.md §6.2: a reconnect while the old path still drains (the consumer
/// holds one of its requests) opens a *new* session: the closed one is
/// never handed out again, so the consumer cannot mix the two up.
#[test]
fn a_reconnect_after_session_closed_gets_a_new_session() {
    let mut h = Harness::new(small_config());
    let old = ClientPath::open(&mut h, 2, 1, 1, "sess");
    let first = h
        .drain_events()
        .iter()
        .find_map(|e| match e {
            Event::SessionOpened { session, .. } => Some(*session),
            _ => None,
        })
        .unwrap();
    old.write(&mut h, 1, 0, &[1; 8], &[2; 8]);
    let held = next_io(&mut h).expect("an IO the consumer holds");
    h.mock()
        .cm_events
        .push_back(CmEvent::Disconnected { conn: old.conns[0] });
    h.settle();
    let events = h.drain_events();
    assert!(events.iter().any(|e| matches!(
        e,
        Event::SessionClosed { session } if *session == first
    )));
    assert_eq!(h.server.usage().paths, 1, "the old path drains");
    // The client reconnects the same path uuid and session uuid.
    let new = ClientPath::open_recon(&mut h, 2, 1, 1, "sess", 2);
    let events = h.drain_events();
    let second = events
        .iter()
        .find_map(|e| match e {
            Event::SessionOpened { session, .. } => Some(*session),
            _ => None,
        })
        .expect("a session opened again");
    assert_ne!(second, first, "a closed session id is not reused");
    assert!(events.iter().all(|e| match e {
        Event::PathUp { session, .. } => *session == second,
        _ => true,
    }));
    assert_eq!(h.server.usage().sessions, 2, "the old one lingers");
    // The old request is answered (dropped), the old session goes.
    let now = h.now;
    h.server
        .complete_io(token(&held), 0, ReadData::Chunk, now, &mut h.ports)
        .unwrap();
    h.drain();
    assert_eq!(h.server.usage().sessions, 1);
    assert!(h.server.session_stats(first).is_none());
    assert!(h.server.session_stats(second).is_some());
    new.write(&mut h, 1, 1, &[3; 8], &[4; 8]);
    match next_io(&mut h) {
        Some(Event::Io { session, .. }) => assert_eq!(session, second),
        other => panic!("{other:?}"),
    }
    // The old path closed as disconnected, not as a protocol error.
    assert!(!events.iter().any(|e| matches!(
        e,
        Event::PathDown {
            reason: CloseReason::ProtocolViolation,
            ..
        }
    )));
}

#[test]
fn limits_and_names_are_checked_again_at_info_req() {
    let mut h = Harness::new(small_config()); // 2 sessions
    let _a = ClientPath::open(&mut h, 1, 1, 1, "one");
    // Two new sessions get past their CON_REQs while one slot is free...
    let b = h.request(&con_req(0, 1, 2, 2, 1));
    let c = h.request(&con_req(0, 1, 3, 3, 1));
    assert!(h.was_accepted(b) && h.was_accepted(c));
    // ...but only the first admitted gets it.
    h.info_req(b, "two");
    h.info_req(c, "three");
    assert_eq!(refusals(&h.drain_events()), [PathRefusal::TooManySessions]);
    assert!(h.mock().disconnected.contains(&c));
    // A second path of session "one" presenting another name is refused.
    let d = h.request(&con_req(0, 1, 4, 1, 1));
    h.info_req(d, "other");
    assert_eq!(refusals(&h.drain_events()), [PathRefusal::NameMismatch]);
    h.drain();
    let usage = h.server.usage();
    assert_eq!((usage.sessions, usage.paths), (2, 2));
}
