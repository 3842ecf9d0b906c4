//! The engine over slow volumes, whose completions are held behind a gate
//! the test opens: a client that reconnects while its old path still has
//! device IO in flight gets a session of its own (rtrs.md §6.2: RNBD
//! re-sends SESS_INFO and OPEN) while the old one drains, and one session's
//! deferred CLOSEs (rnbd.md §4.4: answered when the device's IO drains)
//! cannot take the room of another's.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{pattern, Fabric, Keys, World, ADHOC};
use hal::block::{
    BlockDevice, BufferAccess, Completion, DeviceInfo, Request as DeviceRequest, SubmitError,
};
use manifest::binary::Manifest;
use rnbd::wire::AccessMode;
use rtrs::client::{ClientIo, Direction, Event};
use target_image::{ram_volume, Chunk, Engine, RamVolume};
use verbs::{Memory, Sge, Sgl};

const MANIFEST: &str = r#"
[target]
name = "brick-reconnect"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "s*"
volumes = "*"
mode = "rw"
"#;

/// A RAM volume whose completions wait until `open` is set, and whose
/// queue holds at most `room` requests (more are refused with
/// `QueueFull`).
struct Gated {
    inner: RamVolume,
    open: Arc<AtomicBool>,
    room: usize,
}

impl BlockDevice<Chunk> for Gated {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn submit<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        request: DeviceRequest<Chunk>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        if self.inner.in_flight() >= self.room {
            return Err(SubmitError::QueueFull);
        }
        self.inner.submit(request, buffers)
    }

    fn poll<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<Chunk>),
    ) -> usize {
        if !self.open.load(Ordering::Relaxed) {
            return 0;
        }
        self.inner.poll(now, buffers, max, on_completion)
    }

    fn poll_at(&self) -> Option<u64> {
        self.open
            .load(Ordering::Relaxed)
            .then(|| self.inner.poll_at())
            .flatten()
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

/// Runs `test` with an engine over gated volumes (closed at first, with
/// queues of `room` requests) built from `manifest`.
fn with_gated_world(
    manifest: String,
    room: usize,
    test: impl FnOnce(&mut World<'_, Gated>, &AtomicBool) + Send + 'static,
) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let gate = Arc::new(AtomicBool::new(false));
            let blob = manifest::build(&manifest, "slow.toml").expect("manifest");
            let manifest = Manifest::parse(&blob).expect("manifest blob");
            let opened = Arc::clone(&gate);
            let engine = Engine::with_volumes(
                manifest,
                |i| Keys(1000 + i as u64),
                move |_, volume| {
                    Ok(Gated {
                        inner: ram_volume(volume)?,
                        open: Arc::clone(&opened),
                        room,
                    })
                },
            )
            .expect("engine over gated volumes");
            let mut world = World::with_engine(engine);
            test(&mut world, &gate);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn reconnect_while_the_old_path_has_io_in_flight_is_a_new_session() {
    with_gated_world(MANIFEST.to_owned(), usize::MAX, |world, gate| {
        gate.store(true, Ordering::Relaxed);
        let c = world.add_client(2, 16, 7);
        world.connect(c, "s1", 1).expect("session up");
        let vol0 = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        assert_eq!(world.write(c, 2, &vol0, 0, &pattern(1, 4096)), 0);

        // A write the volume holds: its completion waits behind the gate.
        gate.store(false, Ordering::Relaxed);
        let mut header = [0u8; 64];
        let out = vol0.write(8192, 4096, false, &mut header).unwrap();
        let node = &mut world.clients[c];
        let region = node.buffer;
        node.client
            .verbs_mut()
            .write(region.handle, ADHOC, &pattern(2, 4096))
            .unwrap();
        node.client
            .submit(ClientIo {
                tag: 3,
                header: &header[..out.user_header_len],
                direction: Direction::Write {
                    data: Sgl::single(Sge::new(region.lkey, ADHOC, 4096)),
                },
                admin: false,
                hint: None,
            })
            .expect("submit");
        world.run_until("the volume holds the write", |w| {
            w.engine.volume_requests_in_flight() == 1
        });

        // The client drops its path and reconnects (same uuids, newer
        // recon_cnt) while the engine still waits for the volume.
        let now = world.now;
        world.clients[c].client.disconnect_path(0, now);
        world.run_until("the client reconnected", |w| {
            w.clients[c].events.iter().any(|e| {
                matches!(
                    e,
                    Event::SessionUp {
                        reconnected: true,
                        ..
                    }
                )
            })
        });
        assert_eq!(world.engine.volume_requests_in_flight(), 1, "still held");

        // RNBD re-sends SESS_INFO and OPEN on the new session: served by
        // the new session, not refused as the closed one's (ENXIO).
        assert_eq!(world.sess_info(c, 4), 2);
        let vol1 = world
            .open(c, 5, "vol1", AccessMode::ReadWrite)
            .expect("OPEN on the new session");
        assert_eq!(world.engine.session_count(), 1, "the old one is closed");

        // The old session's write drains; its writer goes with it, and the
        // new session can open vol0 read-write again.
        gate.store(true, Ordering::Relaxed);
        world.run_until("the held write drained", |w| {
            w.engine.volume_requests_in_flight() == 0
        });
        let data = pattern(3, 8192);
        assert_eq!(world.write(c, 6, &vol1, 0, &data), 0);
        assert_eq!(world.read(c, 7, &vol1, 0, 8192), (0, data));
        let vol0 = world
            .open(c, 8, "vol0", AccessMode::ReadWrite)
            .expect("vol0 read-write again once the old session drained");
        let (errno, back) = world.read(c, 9, &vol0, 0, 4096);
        assert_eq!((errno, back), (0, pattern(1, 4096)));
        let stats = world.engine.stats().to_string();
        assert_eq!(
            stats.matches("session \"s1\"").count(),
            1,
            "one session entry left:\n{stats}"
        );
        world.close_session(c);
        world.run_until("nothing held", |w| w.engine.is_idle());
    });
}

/// Submits an RTRS request of node `c` without waiting: a WRITE of `data`
/// (from the node's ad-hoc buffer) with `header`.
fn submit_write(world: &mut World<'_, Gated>, c: usize, tag: u64, header: &[u8], data: &[u8]) {
    let node = &mut world.clients[c];
    let region = node.buffer;
    let mut sgl = Sgl::new();
    if !data.is_empty() {
        node.client
            .verbs_mut()
            .write(region.handle, ADHOC, data)
            .unwrap();
        sgl = Sgl::single(Sge::new(region.lkey, ADHOC, data.len() as u32));
    }
    node.client
        .submit(ClientIo {
            tag,
            header,
            direction: Direction::Write { data: sgl },
            admin: header.len() < 64 && data.is_empty(),
            hint: None,
        })
        .expect("submit");
}

/// Whether node `c` has seen the completion of `tag`.
fn completed(world: &World<'_, Gated>, c: usize, tag: u64) -> bool {
    world.clients[c]
        .events
        .iter()
        .any(|e| matches!(e, Event::IoCompleted { tag: t, .. } if *t == tag))
}

/// Sessions with many devices, each with a write the volume holds, CLOSE
/// them all: each session holds at most its share of the deferred CLOSEs
/// (the rest are answered at once), so another session's CLOSE still waits
/// for its device's IO as it must. Two such sessions of 32 devices (RNBD's
/// most per session) used to fill the engine's whole table of 64.
#[test]
fn sessions_cannot_use_up_the_deferred_closes_of_the_others() {
    const GREEDY: usize = 2;
    const DEVICES: usize = 32;
    let mut text = String::from(
        "[target]\nname = \"brick-deferred\"\n[limits]\nqueue_depth = 80\nchunk_size = \"16KiB\"\n\
         [[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\
         [[access]]\nsessions = \"s*\"\nvolumes = \"*\"\nmode = \"rw\"\n",
    );
    for n in 0..=GREEDY * DEVICES {
        text.push_str(&format!(
            "[[volumes]]\nname = \"v{n}\"\nkind = \"ram\"\nsize = \"64KiB\"\n"
        ));
    }
    with_gated_world(text, usize::MAX, |world, gate| {
        gate.store(true, Ordering::Relaxed);
        let mut greedy = Vec::new();
        for g in 0..GREEDY {
            let c = world.add_client(2 + g as u8, 80, 7 + g as u64);
            world
                .connect(c, &format!("s-greedy{g}"), 1)
                .expect("greedy session");
            let mut devices = Vec::new();
            for n in 0..DEVICES {
                let volume = format!("v{}", g * DEVICES + n);
                let device = world
                    .open(c, n as u64, &volume, AccessMode::ReadWrite)
                    .unwrap();
                devices.push(device);
            }
            greedy.push((c, devices));
        }
        let other = world.add_client(9, 80, 9);
        world.connect(other, "s-other", 1).expect("other session");
        let mine = world
            .open(
                other,
                1,
                &format!("v{}", GREEDY * DEVICES),
                AccessMode::ReadWrite,
            )
            .unwrap();

        // Every device gets a write the volume holds, then its CLOSE.
        gate.store(false, Ordering::Relaxed);
        let mut header = [0u8; 64];
        for (c, devices) in &greedy {
            for (n, device) in devices.iter().enumerate() {
                let out = device.write(0, 4096, false, &mut header).unwrap();
                let tag = 1000 + n as u64;
                submit_write(world, *c, tag, &header[..out.user_header_len], &[7; 4096]);
            }
        }
        let out = mine.write(0, 4096, false, &mut header).unwrap();
        submit_write(
            world,
            other,
            1000,
            &header[..out.user_header_len],
            &[8; 4096],
        );
        world.run_until("every write held", |w| {
            w.engine.volume_requests_in_flight() == GREEDY * DEVICES + 1
        });
        for (c, devices) in &greedy {
            for (n, device) in devices.iter().enumerate() {
                let out = device.close(&mut header).unwrap();
                let tag = 2000 + n as u64;
                submit_write(world, *c, tag, &header[..out.user_header_len], &[]);
            }
        }
        world.run_steps(200);
        for (c, _) in &greedy {
            let answered = (0..DEVICES)
                .filter(|&n| completed(world, *c, 2000 + n as u64))
                .count();
            assert!(
                answered > 0 && answered < DEVICES,
                "a session holds its share of deferred CLOSEs: {answered} of {DEVICES} answered at once"
            );
        }
        // The other session's CLOSE waits for its write, as it must.
        let out = mine.close(&mut header).unwrap();
        submit_write(world, other, 2000, &header[..out.user_header_len], &[]);
        world.run_steps(200);
        assert!(
            !completed(world, other, 2000),
            "the other session's CLOSE was answered before its IO drained"
        );
        gate.store(true, Ordering::Relaxed);
        world.run_until("every CLOSE answered", |w| {
            completed(w, other, 2000)
                && greedy
                    .iter()
                    .all(|(c, _)| (0..DEVICES).all(|n| completed(w, *c, 2000 + n as u64)))
        });
        assert!(completed(world, other, 1000), "the write completed first");
        for (c, _) in &greedy {
            world.close_session(*c);
        }
        world.close_session(other);
        world.run_until("nothing held", |w| w.engine.is_idle());
    });
}

/// The errno node `c` saw for `tag`, once completed.
fn completion_errno(world: &World<'_, Gated>, c: usize, tag: u64) -> Option<u16> {
    world.clients[c].events.iter().find_map(|e| match e {
        Event::IoCompleted { tag: t, errno, .. } if *t == tag => Some(*errno),
        _ => None,
    })
}

/// A device queue narrower than the requests that arrive at once: the
/// engine parks the rest, hands them to the device as room frees, and
/// answers every one; the data lands where each write said.
#[test]
fn a_full_device_queue_parks_requests_until_room_frees() {
    const ROOM: usize = 2;
    const WRITES: u64 = 8;
    with_gated_world(MANIFEST.to_owned(), ROOM, |world, gate| {
        gate.store(true, Ordering::Relaxed);
        let c = world.add_client(2, 16, 7);
        world.connect(c, "s1", 1).expect("session up");
        let vol0 = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        assert_eq!(world.engine.volume_counters(0).unwrap().parked, 0);
        // Eight writes of the same bytes (one client buffer) to eight
        // blocks, submitted before the engine runs.
        let data = pattern(5, 4096);
        let mut header = [0u8; 64];
        for n in 0..WRITES {
            let out = vol0.write(n * 4096, 4096, false, &mut header).unwrap();
            submit_write(world, c, 100 + n, &header[..out.user_header_len], &data);
        }
        world.run_until("every write answered", |w| {
            (0..WRITES).all(|n| completed(w, c, 100 + n))
        });
        for n in 0..WRITES {
            assert_eq!(completion_errno(world, c, 100 + n), Some(0), "write {n}");
        }
        let counters = world.engine.volume_counters(0).unwrap();
        assert!(
            counters.parked >= WRITES - ROOM as u64,
            "the requests beyond the device's room waited: {counters:?}"
        );
        assert_eq!(counters.device_errors, 0);
        assert_eq!(world.engine.volume_requests_in_flight(), 0);
        for n in 0..WRITES {
            assert_eq!(
                world.read(c, 200 + n, &vol0, n * 4096, 4096),
                (0, data.clone()),
                "block {n}"
            );
        }
        // The block after them was never written.
        assert_eq!(
            world.read(c, 300, &vol0, WRITES * 4096, 4096),
            (0, vec![0; 4096])
        );
        world.close_session(c);
        world.run_until("nothing held", |w| w.engine.is_idle());
    });
}
