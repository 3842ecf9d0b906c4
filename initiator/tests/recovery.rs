//! The initiator when things break: the target restarts (the session and
//! the volumes come back by themselves, IO held meanwhile completes), the
//! fail-fast policy, a lossy link under a verified workload, and multipath
//! failover when one interface is cut.

mod common;

use common::{config, pattern, run, Faults, Workload, World, SECOND};
use initiator::{AccessMode, Event, IoError, OnDisconnect, SubmitError, VolumeState};

const MANIFEST: &str = r#"
[target]
name = "brick-initiator-recovery"

[limits]
queue_depth = 32
max_paths_per_session = 2

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[interfaces]]
name = "eth1"
mac = "52:54:00:77:00:11"
address = "10.77.0.11/24"

[[volumes]]
name = "data"
kind = "ram"
size = "8MiB"

[[access]]
sessions = "*"
volumes = ["data"]
mode = "rw"
"#;

const TARGET: &str = "10.77.0.1:1234";
const TARGET_B: &str = "10.77.0.11:1234";

/// The target dies and a new one starts on the same link (RAM volumes come
/// back empty). The initiator notices within the heartbeat budget,
/// reconnects, re-sends SESS_INFO and OPEN by itself, and the IO submitted
/// while the target was down is held and completes after the re-open. Data
/// written after the restart reads back.
#[test]
fn target_restart_reconnects_and_reopens_volumes() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "restart", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        world
            .write(node, info.id, 0, &pattern(1, 65536), false)
            .unwrap();
        world.nodes[node].events.clear();

        let died = world.now;
        world.stop_target();
        // A write while the target is down: held, not failed.
        let now = world.now;
        let held_data = pattern(2, 128 * 1024);
        world.nodes[node]
            .init
            .submit_write(now, 500, info.id, 1 << 20, &held_data, true)
            .unwrap();
        world.wait_event(node, "SessionDown", 10 * SECOND, |e| {
            matches!(e, Event::SessionDown)
        });
        let detected = world.now - died;
        assert!(
            detected <= 5 * SECOND,
            "dead target noticed after {} ms",
            detected / 1_000_000
        );
        assert_eq!(
            world.nodes[node].init.volume_state(info.id),
            Some(VolumeState::Disconnected)
        );
        // Another IO submitted while disconnected is held as well.
        let now = world.now;
        world.nodes[node]
            .init
            .submit_read(now, 501, info.id, 0, 4096)
            .unwrap();

        world.run_for(SECOND);
        world.start_target();
        let restarted = world.now;
        world.wait_event(node, "SessionUp again", 20 * SECOND, |e| {
            matches!(e, Event::SessionUp { reconnected: true })
        });
        let reopened = world.wait_event(node, "Reopened", 5 * SECOND, |e| {
            matches!(e, Event::Reopened { .. })
        });
        let back = world.now - restarted;
        assert!(
            back <= 3 * SECOND,
            "back {} ms after the restart",
            back / 1_000_000
        );
        let Event::Reopened {
            volume,
            info: new_info,
        } = reopened
        else {
            unreachable!()
        };
        assert_eq!(volume, info.id);
        assert_eq!(new_info.size, info.size);

        // The held IO completed after the re-open: the write landed on the
        // new target, the read sees the empty RAM of the new target.
        let (write, _) = world.completion(node, 500, 5 * SECOND);
        assert_eq!(write.result, Ok(()));
        let (read, data) = world.completion(node, 501, 5 * SECOND);
        assert_eq!(read.result, Ok(()));
        assert_eq!(data, vec![0; 4096], "a restarted RAM volume is empty");
        assert_eq!(
            world.read(node, info.id, 1 << 20, 128 * 1024).unwrap(),
            held_data
        );

        // And IO goes on, verified.
        let mut workload = Workload::new(info.size, 11);
        workload.model[1 << 20..(1 << 20) + 128 * 1024].copy_from_slice(&held_data);
        workload.run(&mut world, node, info.id, 10, 8, true);
        workload.verify_all(&mut world, node, info.id);

        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.reopens, 1);
        assert!(stats.held >= 2, "held {}", stats.held);
        assert_eq!(stats.errors, 0);
        let session = world.nodes[node].init.session_stats();
        assert_eq!(session.reconnects, 1);
        assert_eq!(session.disconnects, 1);
        let path = world.nodes[node].init.path_report(0).unwrap();
        assert_eq!(path.stats.reconnects, 1);
    });
}

/// With `OnDisconnect::Fail`, IO in flight when the target dies and IO
/// submitted while it is down fail with `Disconnected`; once the target is
/// back the volume is re-opened and IO works again. With `Hold`, IO held
/// longer than the hold timeout fails with `Disconnected` too.
#[test]
fn fail_policy_and_hold_timeout() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let mut fail = config(2);
        fail.on_disconnect = OnDisconnect::Fail;
        let node = world.add_node(2, fail);
        let mut short = config(3);
        short.on_disconnect = OnDisconnect::Hold {
            hold_timeout_ns: 2 * SECOND,
        };
        let patient = world.add_node(3, short);
        world.connect(node, "failfast", &[TARGET]);
        world.connect(patient, "patient", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        let other = world.open(patient, "data", AccessMode::ReadOnly).unwrap();

        world.stop_target();
        let now = world.now;
        world.nodes[node]
            .init
            .submit_write(now, 600, info.id, 0, &[5; 4096], false)
            .unwrap();
        world.nodes[patient]
            .init
            .submit_read(now, 700, other.id, 0, 4096)
            .unwrap();
        let (write, _) = world.completion(node, 600, 10 * SECOND);
        assert!(
            matches!(write.result, Err(IoError::Disconnected { .. })),
            "{:?}",
            write.result
        );
        world.wait_event(node, "SessionDown", 10 * SECOND, |e| {
            matches!(e, Event::SessionDown)
        });
        let now = world.now;
        assert_eq!(
            world.nodes[node]
                .init
                .submit_read(now, 601, info.id, 0, 512),
            Err(SubmitError::Disconnected)
        );
        let (read, _) = world.completion(patient, 700, 10 * SECOND);
        let Err(IoError::Disconnected { held_ns }) = read.result else {
            panic!("held read: {:?}", read.result)
        };
        assert!(held_ns >= 2 * SECOND, "held {held_ns} ns");

        world.start_target();
        world.wait_event(node, "Reopened", 20 * SECOND, |e| {
            matches!(e, Event::Reopened { .. })
        });
        world.write(node, info.id, 4096, &[6; 4096], false).unwrap();
        assert_eq!(
            world.read(node, info.id, 4096, 4096).unwrap(),
            vec![6; 4096]
        );
        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.errors, 1);
    });
}

/// The verified workload through a segment that drops, duplicates and
/// reorders a few percent of all frames (seeded): no data error, no IO
/// error; the link really was lossy.
#[test]
fn lossy_link_workload_has_no_errors() {
    run(|| {
        let mut world = World::new(MANIFEST);
        world.set_faults(
            Faults {
                drop: 30,
                duplicate: 20,
                reorder: 30,
            },
            0xfeed_beef,
        );
        let node = world.add_node(2, config(2));
        world.connect(node, "lossy", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        let mut workload = Workload::new(info.size, 23);
        workload.run(&mut world, node, info.id, 25, 6, true);
        workload.verify_all(&mut world, node, info.id);
        let link = world.link_counters();
        assert!(
            link.dropped > 50 && link.duplicated > 30 && link.reordered > 50,
            "{link:?}"
        );
        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.errors, 0);
        assert!(workload.verified_bytes >= info.size);
    });
}

/// Two paths to two target interfaces. Cutting the first one's interface
/// moves IO to the second without an IO error or a session loss; the
/// first comes back when the cut is healed.
#[test]
fn multipath_failover_keeps_io_going() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "multi", &[TARGET, TARGET_B]);
        world.wait_event(node, "second path up", 10 * SECOND, |e| {
            matches!(e, Event::PathUp { path: 1 })
        });
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        let mut workload = Workload::new(info.size, 31);
        workload.run(&mut world, node, info.id, 5, 8, false);

        // IO in flight while path 0 is cut.
        let now = world.now;
        let data = pattern(77, 1 << 20);
        world.nodes[node]
            .init
            .submit_write(now, 900, info.id, 2 << 20, &data, false)
            .unwrap();
        world.cut[0] = true;
        let (write, _) = world.completion(node, 900, 20 * SECOND);
        assert_eq!(write.result, Ok(()));
        workload.model[2 << 20..3 << 20].copy_from_slice(&data);
        world.wait_event(node, "path 0 down", 10 * SECOND, |e| {
            matches!(e, Event::PathDown { path: 0, .. })
        });
        workload.run(&mut world, node, info.id, 5, 8, false);
        workload.verify_all(&mut world, node, info.id);
        assert!(world
            .take_event(node, |e| matches!(e, Event::SessionDown))
            .is_none());
        let path1 = world.nodes[node].init.path_report(1).unwrap();
        assert!(path1.stats.writes > 0 && path1.stats.reads > 0);
        assert!(
            path1.stats.failovers > 0,
            "the cut path's requests moved: {path1:?}"
        );

        world.cut[0] = false;
        world.wait_event(node, "path 0 back", 20 * SECOND, |e| {
            matches!(e, Event::PathUp { path: 0 })
        });
        workload.run(&mut world, node, info.id, 5, 8, false);
        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.errors, 0);
        assert_eq!(world.nodes[node].init.session_stats().disconnects, 0);
    });
}

/// The target comes back without the volume: the re-open fails with the
/// target's errno, held IO fails with `VolumeLost` naming it, new IO is
/// refused with the state, and the volume can still be closed.
#[test]
fn volume_missing_after_restart_is_lost() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "lost", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        world.stop_target();
        let now = world.now;
        world.nodes[node]
            .init
            .submit_read(now, 800, info.id, 0, 4096)
            .unwrap();
        world.wait_event(node, "SessionDown", 10 * SECOND, |e| {
            matches!(e, Event::SessionDown)
        });
        world.set_manifest(&MANIFEST.replace("\"data\"", "\"other\""));
        world.start_target();
        let failed = world.wait_event(node, "ReopenFailed", 20 * SECOND, |e| {
            matches!(e, Event::ReopenFailed { .. })
        });
        let lost = initiator::OpenError::Remote(rnbd::client::RemoteError::NotFound);
        assert_eq!(
            failed,
            Event::ReopenFailed {
                volume: info.id,
                error: lost
            }
        );
        let (read, _) = world.completion(node, 800, SECOND);
        assert_eq!(read.result, Err(IoError::VolumeLost(lost)));
        let now = world.now;
        assert_eq!(
            world.nodes[node]
                .init
                .submit_read(now, 801, info.id, 0, 512),
            Err(SubmitError::NotOpen {
                volume: info.id,
                state: VolumeState::Lost(lost)
            })
        );
        world.nodes[node].init.close(info.id).unwrap();
        let closed = world.wait_event(node, "Closed", SECOND, |e| {
            matches!(e, Event::Closed { .. })
        });
        assert_eq!(
            closed,
            Event::Closed {
                volume: info.id,
                result: Ok(())
            }
        );
        assert_eq!(world.nodes[node].init.volume_state(info.id), None);
        // The session itself is fine: other volumes open.
        assert!(world.nodes[node].init.is_ready());
    });
}
