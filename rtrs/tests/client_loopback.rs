//! The RTRS client against `rtrs::server::Server` in one process over a
//! loopback verbs pair: establishment (2 paths × 3 connections), byte-exact
//! writes and reads with NEW_RKEY on and off, failover on path loss,
//! reconnect, heartbeats under a fake clock.

mod client_support;

use client_support::*;
use rtrs::client::{
    ClientIo, Direction, Event, MultipathPolicy, PathError, PathStatus, ReadBuffer, SubmitError,
};
use rtrs::server::Event as ServerEvent;
use rtrs::wire::{ConnReq, Uuid};
use verbs::{AccessFlags, Memory, MemoryRegion, Sge, Sgl};

fn up(pair: &mut Pair, paths: u8, conns: u16) {
    pair.connect(paths, conns);
    let events = pair.take_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::SessionUp {
                reconnected: false,
                ..
            }
        )),
        "{events:?}"
    );
    for path in 0..u16::from(paths) {
        assert!(events.contains(&Event::PathUp { path }), "{events:?}");
        assert_eq!(pair.client.path_status(path), Some(PathStatus::Connected));
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Writes `data` at disk `offset` through the client; returns the tag.
fn write(pair: &mut Pair, tag: u64, offset: u64, data: &[u8], buffer: MemoryRegion) {
    pair.client
        .verbs_mut()
        .write(buffer.handle, 0, data)
        .unwrap();
    let sgl = Sgl::single(Sge::new(buffer.lkey, 0, data.len() as u32));
    pair.client
        .submit(ClientIo {
            tag,
            header: &header(b'W', offset),
            direction: Direction::Write { data: sgl },
            admin: false,
            hint: None,
        })
        .expect("submit write");
}

fn read(pair: &mut Pair, tag: u64, offset: u64, len: u32, buffer: MemoryRegion) {
    pair.client
        .submit(ClientIo {
            tag,
            header: &header(b'R', offset),
            direction: Direction::Read {
                dest: ReadBuffer {
                    region: buffer,
                    offset: 0,
                    len,
                },
            },
            admin: false,
            hint: None,
        })
        .expect("submit read");
}

fn completed(events: &[Event], tag: u64) -> Option<(u16, Option<ReadBuffer>)> {
    events.iter().find_map(|e| match e {
        Event::IoCompleted {
            tag: t,
            errno,
            read,
            ..
        } if *t == tag => Some((*errno, *read)),
        _ => None,
    })
}

#[test]
fn session_of_two_paths_with_three_connections() {
    let mut pair = Pair::new(server_config(true), client_config());
    up(&mut pair, 2, 3);
    let reqs = pair.fabric.con_reqs();
    assert_eq!(reqs.len(), 6);
    let session = pair.client.session_uuid().unwrap();
    for (i, bytes) in reqs.iter().enumerate() {
        let req = ConnReq::parse(bytes).unwrap();
        let path = (i / 3) as u16;
        assert_eq!(req.cid, (i % 3) as u16, "cids in order");
        assert_eq!(req.cid_num, 3);
        assert_eq!(req.recon_cnt, 1, "first round sends 1");
        assert_eq!(req.session_uuid, session);
        assert_eq!(req.path_uuid, pair.client.path_uuid(path).unwrap());
        // rtrs.md §2.3: the first path's connections all carry first_conn;
        // the second path's cid 0 does not, its later cids do.
        assert_eq!(req.first_conn, path == 0 || req.cid > 0, "req {i}");
    }
    assert_ne!(
        pair.client.path_uuid(0).unwrap(),
        pair.client.path_uuid(1).unwrap()
    );
    assert_ne!(pair.client.path_uuid(0).unwrap(), Uuid([0; 16]));
    assert_eq!(pair.client.queue_depth(), Some(8));
    // The server sees one session with two paths up.
    let ups = pair
        .server_events
        .iter()
        .filter(|e| matches!(e, ServerEvent::PathUp { .. }))
        .count();
    assert_eq!(ups, 2);
    assert_eq!(pair.server.usage().connections, 6);
}

fn write_then_read(always_invalidate: bool, policy: MultipathPolicy) {
    let mut config = client_config();
    config.policy = policy;
    let mut pair = Pair::new(server_config(always_invalidate), config);
    up(&mut pair, 2, 3);
    let source = pair.client_buffer(64 * 1024, AccessFlags::LOCAL_WRITE);
    let sink = pair.client_buffer(
        64 * 1024,
        AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
    );
    let chunk_rkeys: Vec<_> = (0..8)
        .map(|id| pair.client.chunk(0, id).unwrap().rkey)
        .collect();
    // Several rounds reuse every chunk: in NEW_RKEY mode each reuse needs the
    // rkey from the previous RKEY_RSP.
    for round in 0..4u64 {
        let mut expected = Vec::new();
        for i in 0..8u64 {
            let len = 512 + (i as usize * 1000) + round as usize * 7;
            let data = pattern((round * 8 + i) as u8, len);
            let offset = (i * 12 * 1024) + round * 100;
            let buffer = pair.client_buffer(len as u32, AccessFlags::LOCAL_WRITE);
            write(&mut pair, round * 100 + i, offset, &data, buffer);
            expected.push((offset, data));
        }
        // All permits are in use now.
        let extra = Sgl::single(Sge::new(source.lkey, 0, 16));
        assert_eq!(
            pair.client.submit(ClientIo {
                tag: 999,
                header: &header(b'W', 0),
                direction: Direction::Write { data: extra },
                admin: false,
                hint: None,
            }),
            Err(SubmitError::NoPermit)
        );
        pair.settle();
        let events = pair.take_events();
        for i in 0..8u64 {
            assert_eq!(
                completed(&events, round * 100 + i),
                Some((0, None)),
                "{events:?}"
            );
        }
        for (offset, data) in &expected {
            assert_eq!(
                &pair.disk[*offset as usize..*offset as usize + data.len()],
                &data[..],
                "disk byte-exact"
            );
        }
        // Read each back, byte-exact, into the sink.
        for (i, (offset, data)) in expected.iter().enumerate() {
            read(&mut pair, 1000 + i as u64, *offset, data.len() as u32, sink);
            pair.settle();
            let events = pair.take_events();
            let (errno, buffer) = completed(&events, 1000 + i as u64).expect("read completed");
            assert_eq!(errno, 0);
            let buffer = buffer.unwrap();
            let mut got = vec![0u8; data.len()];
            pair.client.read_response(&buffer, &mut got).unwrap();
            assert_eq!(&got, data, "read byte-exact");
        }
    }
    let rekeyed = (0..8)
        .filter(|&id| pair.client.chunk(0, id).unwrap().rkey != chunk_rkeys[id as usize])
        .count();
    if always_invalidate {
        assert_eq!(rekeyed, 8, "RKEY_RSP updated every chunk");
    } else {
        assert_eq!(rekeyed, 0);
    }
    let stats: Vec<_> = (0..2).map(|p| pair.client.path_stats(p).unwrap()).collect();
    let writes: u64 = stats.iter().map(|s| s.writes).sum();
    let reads: u64 = stats.iter().map(|s| s.reads).sum();
    assert_eq!((writes, reads), (32, 32));
    assert!(
        stats.iter().all(|s| s.writes > 0),
        "both paths used: {stats:?}"
    );
    assert_eq!(pair.client.inflight(), 0);
}

#[test]
fn writes_and_reads_byte_exact_with_new_rkey() {
    write_then_read(true, MultipathPolicy::MinInflight);
}

#[test]
fn writes_and_reads_byte_exact_without_new_rkey() {
    write_then_read(false, MultipathPolicy::RoundRobin);
}

#[test]
fn server_error_is_reported_and_admin_goes_on_cid_zero() {
    let mut pair = Pair::new(server_config(false), client_config());
    up(&mut pair, 1, 3);
    let buffer = pair.client_buffer(4096, AccessFlags::LOCAL_WRITE);
    pair.client
        .submit(ClientIo {
            tag: 1,
            header: &header(b'E', 0),
            direction: Direction::Write {
                data: Sgl::single(Sge::new(buffer.lkey, 0, 100)),
            },
            admin: true,
            hint: None,
        })
        .unwrap();
    pair.serve = false;
    pair.settle();
    let held = std::mem::take(&mut pair.held);
    assert_eq!(held.len(), 1);
    assert!(matches!(held[0], ServerEvent::Io { admin: true, .. }));
    pair.held = held;
    pair.serve_held();
    pair.settle();
    assert_eq!(completed(&pair.take_events(), 1), Some((5, None)));
    // A data-less read (FLUSH-like) and the size limits.
    let sink = pair.client_buffer(
        4096,
        AccessFlags::REMOTE_WRITE.union(AccessFlags::LOCAL_WRITE),
    );
    pair.serve = true;
    read(&mut pair, 2, 0, 0, sink);
    pair.settle();
    assert_eq!(completed(&pair.take_events(), 2).map(|c| c.0), Some(0));
    let big = pair.client_buffer(16 * 1024, AccessFlags::LOCAL_WRITE);
    let too_big = ClientIo {
        tag: 3,
        header: &header(b'W', 0),
        direction: Direction::Write {
            data: Sgl::single(Sge::new(big.lkey, 0, 16 * 1024)),
        },
        admin: false,
        hint: None,
    };
    assert_eq!(pair.client.submit(too_big), Err(SubmitError::TooLarge));
    let long_header = vec![0u8; 300];
    assert_eq!(
        pair.client.submit(ClientIo {
            tag: 4,
            header: &long_header,
            direction: Direction::Write { data: Sgl::new() },
            admin: false,
            hint: None,
        }),
        Err(SubmitError::HeaderTooLong)
    );
}

#[test]
fn path_failure_fails_over_in_flight_ios_and_reconnects() {
    for always_invalidate in [false, true] {
        let mut config = client_config();
        config.policy = MultipathPolicy::RoundRobin;
        let mut pair = Pair::new(server_config(always_invalidate), config);
        up(&mut pair, 2, 3);
        pair.serve = false;
        let mut expected = Vec::new();
        for i in 0..6u64 {
            let data = pattern(i as u8 + 50, 2000 + i as usize);
            let buffer = pair.client_buffer(data.len() as u32, AccessFlags::LOCAL_WRITE);
            write(&mut pair, i, i * 4096, &data, buffer);
            expected.push((i * 4096, data));
        }
        pair.settle();
        let on_path0 = pair.client.path_stats(0).unwrap().inflight;
        assert!(on_path0 > 0);
        // The server holds the requests; path 0 dies (its held requests are
        // answered later into the closing path, and dropped).
        pair.fabric.kill(server_addr(0).ip());
        pair.settle();
        let events = pair.take_events();
        assert!(
            events.iter().any(|e| matches!(
                e,
                Event::PathDown {
                    path: 0,
                    reason: PathError::Disconnected
                }
            )),
            "{events:?}"
        );
        assert!(!events.iter().any(|e| matches!(e, Event::SessionDown)));
        assert_eq!(
            pair.client.path_stats(1).unwrap().failovers,
            u64::from(on_path0)
        );
        assert_eq!(pair.client.path_stats(1).unwrap().inflight, 6);
        // Serve everything on path 1 now.
        pair.serve_held();
        pair.settle();
        let events = pair.take_events();
        for i in 0..6 {
            assert_eq!(completed(&events, i), Some((0, None)), "{events:?}");
        }
        for (offset, data) in &expected {
            assert_eq!(&pair.disk[*offset as usize..][..data.len()], &data[..]);
        }
        // Reconnect after the delay (1 s by default), recon_cnt 2.
        pair.serve = true;
        assert_eq!(
            pair.client.path_status(0),
            Some(PathStatus::WaitingToReconnect)
        );
        pair.advance(SECOND, 2);
        assert_eq!(pair.client.path_status(0), Some(PathStatus::Connected));
        let events = pair.take_events();
        assert!(events.contains(&Event::PathUp { path: 0 }), "{events:?}");
        let last = ConnReq::parse(pair.fabric.con_reqs().last().unwrap()).unwrap();
        assert_eq!(last.recon_cnt, 2);
        assert!(last.first_conn);
        assert_eq!(last.path_uuid, pair.client.path_uuid(0).unwrap());
        assert_eq!(pair.client.path_stats(0).unwrap().reconnects, 1);
        // IO works on the reconnected path.
        let buffer = pair.client_buffer(100, AccessFlags::LOCAL_WRITE);
        for i in 0..4 {
            write(&mut pair, 100 + i, 0, &[9; 100], buffer);
        }
        pair.settle();
        let events = pair.take_events();
        for i in 0..4 {
            assert_eq!(completed(&events, 100 + i), Some((0, None)));
        }
    }
}

#[test]
fn last_path_lost_fails_ios_then_session_comes_back() {
    let mut pair = Pair::new(server_config(true), client_config());
    up(&mut pair, 1, 2);
    pair.serve = false;
    let buffer = pair.client_buffer(100, AccessFlags::LOCAL_WRITE);
    write(&mut pair, 1, 0, &[1; 100], buffer);
    pair.settle();
    pair.held.clear();
    pair.fabric.kill(server_addr(0).ip());
    pair.settle();
    let events = pair.take_events();
    assert_eq!(completed(&events, 1), Some((103, None)), "ECONNABORTED");
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::IoCompleted {
                tag: 1,
                answered_on: None,
                ..
            }
        )),
        "the abort is marked as the client's own, not a server's answer"
    );
    assert!(events.contains(&Event::SessionDown), "{events:?}");
    assert!(!pair.client.is_up());
    let io = ClientIo {
        tag: 2,
        header: &header(b'W', 0),
        direction: Direction::Write { data: Sgl::new() },
        admin: false,
        hint: None,
    };
    assert_eq!(pair.client.submit(io), Err(SubmitError::NotConnected));
    pair.serve = true;
    pair.advance(SECOND / 2, 4);
    let events = pair.take_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::SessionUp {
                reconnected: true,
                ..
            }
        )),
        "{events:?}"
    );
}

#[test]
fn heartbeats_keep_an_idle_path_and_detect_a_silent_one() {
    let mut pair = Pair::new(server_config(false), client_config());
    up(&mut pair, 2, 2);
    // 60 s of idleness: heartbeats both ways keep both paths up.
    pair.advance(SECOND, 60);
    for path in 0..2 {
        let stats = pair.client.path_stats(path).unwrap();
        assert_eq!(pair.client.path_status(path), Some(PathStatus::Connected));
        assert!(stats.heartbeats_sent >= 10, "{stats:?}");
        assert_eq!(stats.heartbeats_acked, stats.heartbeats_sent);
        assert!(
            stats.heartbeats_answered >= 10,
            "server heartbeats answered"
        );
    }
    assert!(pair
        .take_events()
        .iter()
        .all(|e| !matches!(e, Event::PathDown { .. })));
    // Path 1 goes silent: detected within 30-35 s (rtrs.md §5).
    pair.fabric.blackhole(server_addr(1).ip());
    let mut detected = None;
    for second in 1..=40 {
        pair.advance(SECOND, 1);
        if pair.events.iter().any(|e| {
            matches!(
                e,
                Event::PathDown {
                    path: 1,
                    reason: PathError::HeartbeatTimeout
                }
            )
        }) {
            detected = Some(second);
            break;
        }
    }
    let detected = detected.expect("heartbeat timeout");
    assert!((25..=36).contains(&detected), "detected after {detected} s");
    assert_eq!(pair.client.path_status(0), Some(PathStatus::Connected));
    // While blackholed, reconnects fail; after healing, the path comes back
    // (the server replaces its stale path: newer recon_cnt).
    pair.advance(SECOND, 3);
    pair.fabric.heal(server_addr(1).ip());
    pair.advance(SECOND, 3);
    assert_eq!(pair.client.path_status(1), Some(PathStatus::Connected));
    assert!(pair.client.path_stats(1).unwrap().connect_failures >= 1);
}

#[test]
fn poll_at_reports_the_next_timer() {
    let mut pair = Pair::new(server_config(false), client_config());
    assert_eq!(pair.client.poll_at(), None);
    up(&mut pair, 1, 1);
    let at = pair.client.poll_at().unwrap();
    assert!(at > pair.now && at <= pair.now + 5 * SECOND);
}

#[test]
fn reconnect_attempts_are_bounded_when_configured() {
    let mut config = client_config();
    config.max_reconnect_attempts = Some(2);
    let mut pair = Pair::new(server_config(false), config);
    up(&mut pair, 1, 2);
    pair.fabric.blackhole(server_addr(0).ip());
    pair.fabric.kill(server_addr(0).ip());
    pair.advance(SECOND, 5);
    let events = pair.take_events();
    assert!(
        events.contains(&Event::PathClosed { path: 0 }),
        "{events:?}"
    );
    assert_eq!(pair.client.path_status(0), Some(PathStatus::Closed));
    assert_eq!(pair.client.path_stats(0).unwrap().connect_failures, 2);
    // The reconnect delay is ~1 s, far below Linux's 30 s.
    let reqs = pair.fabric.con_reqs();
    assert_eq!(reqs.len(), 2 + 2, "two connects up, one cid 0 per attempt");
    assert_eq!(ConnReq::parse(&reqs[3]).unwrap().recon_cnt, 3);
}

#[test]
fn reads_fail_over_byte_exact() {
    let mut pair = Pair::new(server_config(true), client_config());
    up(&mut pair, 2, 3);
    for (i, byte) in pair.disk.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let sink = pair.client_buffer(
        8 * 4096,
        AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
    );
    pair.serve = false;
    for i in 0..8u32 {
        pair.client
            .submit(ClientIo {
                tag: u64::from(i),
                header: &header(b'R', u64::from(i) * 777),
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: sink,
                        offset: i * 4096,
                        len: 3000,
                    },
                },
                admin: false,
                hint: Some(i as u16),
            })
            .unwrap();
    }
    pair.settle();
    pair.fabric.kill(server_addr(1).ip());
    pair.settle();
    pair.serve_held();
    pair.settle();
    let events = pair.take_events();
    for i in 0..8u32 {
        let (errno, buffer) = completed(&events, u64::from(i)).expect("completed");
        assert_eq!(errno, 0);
        let mut got = vec![0u8; 3000];
        pair.client
            .read_response(&buffer.unwrap(), &mut got)
            .unwrap();
        let start = i as usize * 777;
        assert_eq!(&got[..], &pair.disk[start..start + 3000], "read {i}");
    }
    assert!(pair.client.path_stats(0).unwrap().failovers > 0);
}

#[test]
fn close_session_fails_in_flight_and_stops_reconnecting() {
    let mut pair = Pair::new(server_config(false), client_config());
    up(&mut pair, 2, 2);
    pair.serve = false;
    let buffer = pair.client_buffer(100, AccessFlags::LOCAL_WRITE);
    for i in 0..4 {
        write(&mut pair, i, 0, &[1; 100], buffer);
    }
    pair.settle();
    let now = pair.now;
    pair.client.close_session(now);
    pair.settle();
    let events = pair.take_events();
    for i in 0..4 {
        assert_eq!(completed(&events, i), Some((103, None)), "{events:?}");
    }
    for path in 0..2 {
        assert!(events.contains(&Event::PathClosed { path }), "{events:?}");
        assert_eq!(pair.client.path_status(path), Some(PathStatus::Closed));
    }
    assert!(events.contains(&Event::SessionDown));
    assert_eq!(pair.fabric.live_conns(0), 0, "client connections destroyed");
    let reqs = pair.fabric.con_reqs().len();
    pair.advance(SECOND, 5);
    assert_eq!(pair.fabric.con_reqs().len(), reqs, "no reconnect");
    assert_eq!(pair.client.poll_at(), None);
    // The server saw both paths go down.
    let downs = pair
        .server_events
        .iter()
        .filter(|e| matches!(e, ServerEvent::PathDown { .. }))
        .count();
    assert_eq!(downs, 2);
}

#[test]
fn linux_default_parameters_max_io_size() {
    // qd 512, 128 KiB chunks, 4 KiB header room, always_invalidate: the
    // parameters of a stock Linux server (rtrs.md §0), 126976-byte IOs.
    let mut server = rtrs::server::ServerConfig::linux_default();
    server.max_sessions = 1;
    server.max_paths_per_session = 1;
    server.max_connections_per_path = 4;
    let mut client = rtrs::client::ClientConfig::default_with_seed([9; 16]);
    client.max_paths = 1;
    client.max_connections_per_path = 4;
    let mut pair = Pair::with_pool(server, client, 80 << 20);
    pair.disk = vec![0; 1 << 20];
    pair.connect(1, 4);
    let events = pair.take_events();
    assert!(
        events.contains(&Event::SessionUp {
            reconnected: false,
            max_io_size: 126_976
        }),
        "{events:?}"
    );
    assert_eq!(pair.client.queue_depth(), Some(512));
    let data = pattern(3, 126_976);
    let buffer = pair.client_buffer(126_977, AccessFlags::LOCAL_WRITE);
    write(&mut pair, 1, 4096, &data, buffer);
    pair.settle();
    assert_eq!(completed(&pair.take_events(), 1), Some((0, None)));
    assert_eq!(&pair.disk[4096..4096 + data.len()], &data[..]);
    let sink = pair.client_buffer(
        126_976,
        AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
    );
    read(&mut pair, 2, 4096, 126_976, sink);
    pair.settle();
    let (errno, got) = completed(&pair.take_events(), 2).unwrap();
    assert_eq!(errno, 0);
    let mut bytes = vec![0u8; data.len()];
    pair.client
        .read_response(&got.unwrap(), &mut bytes)
        .unwrap();
    assert_eq!(bytes, data);
    let too_big = ClientIo {
        tag: 3,
        header: &header(b'W', 0),
        direction: Direction::Write {
            data: Sgl::single(Sge::new(buffer.lkey, 0, 126_977)),
        },
        admin: false,
        hint: None,
    };
    assert_eq!(pair.client.submit(too_big), Err(SubmitError::TooLarge));
}
