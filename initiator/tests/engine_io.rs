//! The initiator against the real target engine, in process: open, random
//! verified IO up to 1 MiB (split into chunk-size pieces), flush, FUA,
//! discard, access rules between sessions, read-only mappings refused
//! locally and remotely, ranges past the end.

mod common;

use common::{config, pattern, run, Failure, Workload, World, SECOND};
use initiator::{AccessMode, Event, IoError, OpenError, SubmitError, VolumeState};
use rnbd::client::RemoteError;
use rtrs::client::{ClientIo, Direction, ReadBuffer};
use verbs::Sgl;

const MANIFEST: &str = r#"
[target]
name = "brick-initiator-test"

[limits]
queue_depth = 32

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "data"
kind = "ram"
size = "16MiB"

[[volumes]]
name = "golden"
kind = "ram"
size = "4MiB"

[[volumes]]
name = "bobs"
kind = "ram"
size = "4MiB"

[[access]]
sessions = "alice*"
volumes = ["data"]
mode = "rw"

[[access]]
sessions = "alice*"
volumes = ["golden"]
mode = "ro"

[[access]]
sessions = "bob*"
volumes = ["bobs"]
mode = "rw"
"#;

const TARGET: &str = "10.77.0.1:1234";

/// 4 KiB of registered memory on node `i`'s HCA for raw requests.
fn scratch(world: &mut World, i: usize) -> verbs::MemoryRegion {
    use verbs::{AccessFlags, Verbs};
    let hca = world.nodes[i].init.verbs_mut();
    let buffer = hca.alloc(4096, 4096).unwrap();
    hca.reg_mr(buffer, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap()
}

/// Random IO from 512 B to 1 MiB at queue depth up to 8, byte-exact
/// against a model; 1 MiB IOs are split into pieces no larger than what the
/// server advertised, and the volume reads back whole at the end.
#[test]
fn random_io_is_byte_exact_and_split_to_the_chunk_size() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "alice1", &[TARGET]);
        let info = world
            .open(node, "data", AccessMode::ReadWrite)
            .expect("open data");
        assert_eq!(info.size, 16 << 20);
        assert_eq!(info.logical_block_size, 512);
        assert_eq!(info.mode, AccessMode::ReadWrite);
        let max_io = world.nodes[node].init.max_io_size();
        // Brick's default chunk is 132 KiB with 4 KiB of header room.
        assert_eq!(max_io, 128 * 1024, "max_io_size advertised by the target");
        assert_eq!(info.max_io_size, max_io);

        // One 1 MiB write: 8 pieces.
        let before = world.nodes[node].init.volume_stats(info.id).unwrap();
        let data = pattern(99, 1 << 20);
        world.write(node, info.id, 3 << 20, &data, false).unwrap();
        let after = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(
            after.requests - before.requests,
            8,
            "1 MiB in 128 KiB pieces"
        );
        assert_eq!(world.read(node, info.id, 3 << 20, 1 << 20).unwrap(), data);

        let mut workload = Workload::new(info.size, 7);
        workload.model[3 << 20..4 << 20].copy_from_slice(&data);
        workload.run(&mut world, node, info.id, 40, 8, true);
        workload.verify_all(&mut world, node, info.id);
        assert_eq!(workload.largest, 1 << 20);
        assert!(workload.completed > 100, "{} IOs", workload.completed);

        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.errors, 0);
        assert!(stats.reads > 0 && stats.writes > 0);
        assert!(stats.read_bytes >= 16 << 20);
        assert_eq!(
            stats.latency.count,
            stats.reads + stats.writes + stats.flushes + stats.discards
        );
        assert!(stats.latency.max_ns > 0);
        let path = world.nodes[node].init.path_report(0).unwrap();
        assert_eq!(path.status, rtrs::client::PathStatus::Connected);
        assert!(path.stats.read_bytes >= 16 << 20);
    });
}

/// FLUSH on a volume without write cache completes locally; FUA writes are
/// durable writes; discard (advertised by RAM volumes) reads back zeroes,
/// including a discard longer than the per-request limit.
#[test]
fn flush_fua_and_discard() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "alice2", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        assert!(!info.write_cache, "RAM volumes have no volatile cache");
        assert!(info.max_discard_bytes > 0, "RAM volumes advertise discard");

        let requests = world.nodes[node]
            .init
            .volume_stats(info.id)
            .unwrap()
            .requests;
        world.flush(node, info.id).unwrap();
        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.flushes, 1);
        assert_eq!(
            stats.requests, requests,
            "no request for a cache-less flush"
        );

        let data = pattern(5, 12 << 20);
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            world
                .write(node, info.id, (i as u64) << 20, piece, i % 2 == 0)
                .unwrap();
        }
        assert_eq!(world.read(node, info.id, 0, 4096).unwrap(), data[..4096]);

        // 12 MiB: longer than the advertised discard limit, split.
        let len = 12u32 << 20;
        assert!(u64::from(len) > info.max_discard_bytes);
        let before = world.nodes[node]
            .init
            .volume_stats(info.id)
            .unwrap()
            .requests;
        world.discard(node, info.id, 0, len).unwrap();
        let pieces = world.nodes[node]
            .init
            .volume_stats(info.id)
            .unwrap()
            .requests
            - before;
        assert_eq!(pieces, u64::from(len).div_ceil(info.max_discard_bytes));
        for offset in (0..u64::from(len)).step_by(1 << 20) {
            let back = world.read(node, info.id, offset, 1 << 20).unwrap();
            assert!(
                back.iter().all(|&b| b == 0),
                "discarded MiB at {offset} not zero"
            );
        }
        let stats = world.nodes[node].init.volume_stats(info.id).unwrap();
        assert_eq!(stats.discards, 1);
        assert_eq!(stats.discarded_bytes, u64::from(len));
        assert_eq!(stats.errors, 0);
    });
}

/// Access rules by session name: alice's session opens `data`, not
/// `bobs`; bob's the other way round; both at once, each with its own
/// data. Unknown volumes are NotFound; a second open of the same path is
/// refused locally.
#[test]
fn two_sessions_with_separate_access() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let alice = world.add_node(2, config(2));
        let bob = world.add_node(3, config(3));
        world.connect(alice, "alice3", &[TARGET]);
        world.connect(bob, "bob3", &[TARGET]);

        assert_eq!(
            world.open(alice, "bobs", AccessMode::ReadWrite),
            Err(OpenError::Remote(RemoteError::AccessDenied))
        );
        assert_eq!(
            world.open(bob, "data", AccessMode::ReadOnly),
            Err(OpenError::Remote(RemoteError::AccessDenied))
        );
        assert_eq!(
            world.open(bob, "nope", AccessMode::ReadOnly),
            Err(OpenError::Remote(RemoteError::NotFound))
        );
        let a = world.open(alice, "data", AccessMode::ReadWrite).unwrap();
        let b = world.open(bob, "bobs", AccessMode::ReadWrite).unwrap();
        assert_eq!(
            world.nodes[alice].init.open("data", AccessMode::ReadOnly),
            Err(OpenError::AlreadyOpen(a.id))
        );

        let da = pattern(1, 64 * 1024);
        let db = pattern(2, 64 * 1024);
        world.write(alice, a.id, 0, &da, false).unwrap();
        world.write(bob, b.id, 0, &db, false).unwrap();
        assert_eq!(world.read(alice, a.id, 0, 64 * 1024).unwrap(), da);
        assert_eq!(world.read(bob, b.id, 0, 64 * 1024).unwrap(), db);

        // Close and reopen: the id is new, the data stays.
        world.nodes[bob].init.close(b.id).unwrap();
        let closed = world.wait_event(bob, "Closed", 5 * SECOND, |e| {
            matches!(e, Event::Closed { .. })
        });
        assert_eq!(
            closed,
            Event::Closed {
                volume: b.id,
                result: Ok(())
            }
        );
        assert_eq!(world.nodes[bob].init.volume_state(b.id), None);
        let now = world.now;
        assert_eq!(
            world.nodes[bob].init.submit_read(now, 1, b.id, 0, 512),
            Err(SubmitError::UnknownVolume(b.id))
        );
        let b2 = world.open(bob, "bobs", AccessMode::ReadOnly).unwrap();
        assert_ne!(b2.id, b.id);
        assert_eq!(world.read(bob, b2.id, 0, 64 * 1024).unwrap(), db);
    });
}

/// A read-only mapping: writes and discards are refused locally (nothing
/// sent); a write forced through the RTRS client with the device id gets
/// EPERM from the target; a read-write open of a read-only grant gets
/// EACCES.
#[test]
fn read_only_mapping_refuses_writes_locally_and_remotely() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "alice4", &[TARGET]);
        assert_eq!(
            world.open(node, "golden", AccessMode::ReadWrite),
            Err(OpenError::Remote(RemoteError::AccessDenied))
        );
        let info = world.open(node, "golden", AccessMode::ReadOnly).unwrap();
        assert_eq!(info.mode, AccessMode::ReadOnly);
        let requests = world.nodes[node]
            .init
            .volume_stats(info.id)
            .unwrap()
            .requests;
        assert_eq!(
            world.write(node, info.id, 0, &[1; 4096], false),
            Err(Failure::Submit(SubmitError::ReadOnly(info.id)))
        );
        assert_eq!(
            world.discard(node, info.id, 0, 4096),
            Err(Failure::Submit(SubmitError::ReadOnly(info.id)))
        );
        assert_eq!(
            world.nodes[node]
                .init
                .volume_stats(info.id)
                .unwrap()
                .requests,
            requests
        );
        assert_eq!(world.read(node, info.id, 0, 4096).unwrap(), vec![0; 4096]);

        // Forced: the RNBD write message for this device id, sent raw.
        let mut device = info.device;
        device.mode = AccessMode::ReadWrite;
        let mut header = [0u8; 64];
        let outgoing = device.write(0, 0x1000, false, &mut header).unwrap();
        let region = scratch(&mut world, node);
        world.nodes[node]
            .init
            .client_mut()
            .submit(ClientIo {
                tag: 77,
                header: &header[..outgoing.user_header_len],
                direction: Direction::Write {
                    data: Sgl::single(region.sge(0, 0x1000)),
                },
                admin: false,
                hint: None,
            })
            .unwrap();
        let raw = world.wait_event(node, "raw completion", 5 * SECOND, |e| {
            matches!(e, Event::RawCompleted { tag: 77, .. })
        });
        let Event::RawCompleted { errno, .. } = raw else {
            unreachable!()
        };
        assert_eq!(
            errno,
            rnbd::errno::EPERM,
            "forced write through a read-only open"
        );
        // The mapping is still fine.
        assert_eq!(
            world.nodes[node].init.volume_state(info.id),
            Some(VolumeState::Open)
        );
        assert_eq!(world.read(node, info.id, 4096, 512).unwrap(), vec![0; 512]);
    });
}

/// Ranges past the end: refused locally with the numbers; the last block
/// works; a raw read past the end is refused by the target.
#[test]
fn past_the_end_is_an_error() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "alice5", &[TARGET]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        let size = info.size;
        let now = world.now;
        let init = &mut world.nodes[node].init;
        assert_eq!(
            init.submit_read(now, 1, info.id, size, 512),
            Err(SubmitError::OutOfRange {
                offset: size,
                len: 512,
                capacity: size
            })
        );
        assert_eq!(
            init.submit_write(now, 2, info.id, size - 512, &[0; 1024], false),
            Err(SubmitError::OutOfRange {
                offset: size - 512,
                len: 1024,
                capacity: size
            })
        );
        assert_eq!(
            init.submit_discard(now, 3, info.id, u64::MAX - 511, 512),
            Err(SubmitError::OutOfRange {
                offset: u64::MAX - 511,
                len: 512,
                capacity: size
            })
        );
        assert_eq!(
            init.submit_read(now, 4, info.id, 100, 512),
            Err(SubmitError::Misaligned {
                offset: 100,
                len: 512,
                block_size: 512
            })
        );
        assert_eq!(
            init.submit_read(now, 5, info.id, 0, 0),
            Err(SubmitError::Empty)
        );
        assert_eq!(
            init.submit_read(now, 6, info.id, 0, 2 << 20),
            Err(SubmitError::TooLarge {
                len: 2 << 20,
                max: 1 << 20
            })
        );
        let message = SubmitError::OutOfRange {
            offset: size,
            len: 512,
            capacity: size,
        }
        .to_string();
        assert!(
            message.contains(&size.to_string()) && message.contains("bytes"),
            "{message}"
        );
        world
            .write(node, info.id, size - 512, &[9; 512], false)
            .unwrap();
        assert_eq!(
            world.read(node, info.id, size - 512, 512).unwrap(),
            vec![9; 512]
        );

        // Raw read of the sector just past the end.
        let mut device = info.device;
        device.nsectors += 8; // a client with a wrong idea of the size
        let mut header = [0u8; 64];
        let outgoing = device.read(size, 4096, &mut header).unwrap();
        let region = scratch(&mut world, node);
        world.nodes[node]
            .init
            .client_mut()
            .submit(ClientIo {
                tag: 78,
                header: &header[..outgoing.user_header_len],
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region,
                        offset: 0,
                        len: 4096,
                    },
                },
                admin: false,
                hint: None,
            })
            .unwrap();
        let raw = world.wait_event(node, "raw completion", 5 * SECOND, |e| {
            matches!(e, Event::RawCompleted { tag: 78, .. })
        });
        let Event::RawCompleted { errno, .. } = raw else {
            unreachable!()
        };
        assert_ne!(errno, 0, "a read past the end must fail remotely");
        let error = RemoteError::from_errno(errno).unwrap();
        assert!(
            matches!(error, RemoteError::Invalid | RemoteError::Io),
            "past-the-end read: {error:?}"
        );
        // The initiator maps remote errnos to typed errors.
        let typed = IoError::Remote(error);
        assert!(typed.to_string().contains(&errno.to_string()));
    });
}
