//! The cost probe of `cargo xtask bench-cost`: the target engine
//! (`target_image::Engine`: its software HCA, RTRS server, RNBD server and
//! one RAM volume) and Brick's initiator in one thread, joined by an
//! in-memory Ethernet link under a fake clock.
//!
//! Everything the target does, and only that, runs inside [`target_side`]
//! (frames handed to [`Engine::receive`], one [`Engine::poll`], the frames
//! it transmits copied into link buffers by [`link::transmit`]), so
//! callgrind's `--toggle-collect=cost_probe::target_side` counts the
//! target and nothing of the initiator. One thread and a fake clock make
//! the run deterministic: the same arguments execute the same
//! instructions, so the cost of `ios` IOs is the difference of two runs
//! with the same warm-up (xtask/src/bench_cost.rs).
//!
//! ```text
//! cost_probe read|write|idle BYTES WARMUP IOS [DEPTH [image|default [invalidate|keep [MTU]]]]
//! ```
//!
//! The target's tables are sized from its manifest's `[limits]`: `image`
//! (the default) takes those the judge boots the image with, `default`
//! the manifest defaults (16 sessions of 4 paths of 65 connections).
//! `invalidate` (the default, as the manifest's) serves with
//! `always_invalidate` (a fresh rkey per chunk after every IO), `keep`
//! without it. `MTU` (default 1500) is the link MTU of both sides: the
//! target's interface in its manifest, the initiator's path MTU after it
//! (1500: 1024, 9000: 4096).
//!
//! The volume is written first (so reads return data), then `WARMUP` IOs
//! of the workload, then `IOS` measured ones, `DEPTH` in flight. Every
//! read is checked against what was written. `idle` runs `WARMUP` then
//! `IOS` loop turns with nothing to do instead (the target polled once
//! each, its session open). The probe prints one line:
//! `cost-probe: ... measured_ios=IOS allocations=A` where `A` counts the
//! allocator calls the target made during the measured IOs.

use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use initiator::{AccessMode, Event, Initiator, InitiatorConfig, IoKind, VolumeId};
use manifest::binary::Manifest;
use roce::hca::{Hca, HcaConfig};
use roce::types::Mtu;
use target_image::{Engine, HcaEngine};
use verbs::KeySource;

static TARGET_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Raised during the measured IOs.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Raised while the target side runs.
    static IN_TARGET: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    let on = |flag: &'static std::thread::LocalKey<Cell<bool>>| {
        flag.try_with(Cell::get).unwrap_or(false)
    };
    if on(&COUNTING) && on(&IN_TARGET) {
        TARGET_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts allocator calls (alloc, realloc) made while [`COUNTING`] and
/// [`IN_TARGET`] are raised on the calling thread (`note`).
#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting::new(note);

/// The limits of the manifests the judge boots the image with
/// (xtask/src/image.rs `image_limits!`): what `bench-vm` measured.
const IMAGE_LIMITS: &str =
    "[limits]\nmax_sessions = 4\nqueue_depth = 128\nmax_connections_per_path = 9\n";

/// The target after its `[limits]` and its interface's first lines (name,
/// MTU): one RAM volume, the default chunk (128 KiB of data).
const MANIFEST: &str = r#"mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "data"
kind = "ram"
size = "16MiB"

[[access]]
sessions = "*"
volumes = ["data"]
mode = "rw"
"#;

/// Bytes of the volume the workload covers.
const SPAN: u64 = 8 << 20;
/// Fake time per loop turn (ns).
const STEP: u64 = 1_000;
/// Loop turns any one wait may take.
const MAX_TURNS: u64 = 10_000_000;

/// Seeded key source (R_Keys, QPNs, PSNs, CM ids): the run is the same
/// every time.
struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

type ClientHca = Hca<Vec<u8>, Keys, 64, 16, 4096>;

/// The link's frames and their recycled buffers (nothing allocated once
/// warm).
#[derive(Default)]
struct Wire {
    to_engine: VecDeque<Vec<u8>>,
    to_client: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
}

/// The link: the target's transmit side (the stand-in of its NIC driver).
mod link {
    use std::collections::VecDeque;

    /// Copies one frame the engine sends into a recycled buffer.
    #[inline(never)]
    pub fn transmit(
        pool: &mut Vec<Vec<u8>>,
        out: &mut VecDeque<Vec<u8>>,
        headers: &[u8],
        payload: &[&[u8]],
        trailer: &[u8],
    ) {
        let mut frame = pool.pop().unwrap_or_else(|| Vec::with_capacity(9216));
        frame.clear();
        frame.extend_from_slice(headers);
        for piece in payload {
            frame.extend_from_slice(piece);
        }
        frame.extend_from_slice(trailer);
        out.push_back(frame);
    }
}

/// Everything the target does in one turn of its loop: the frames that
/// arrived, one poll, the frames it sends. Callgrind collects inside this
/// function only.
#[inline(never)]
fn target_side(engine: &mut HcaEngine<'static, Keys>, wire: &mut Wire, now: u64) -> bool {
    let mut busy = false;
    while let Some(frame) = wire.to_engine.pop_front() {
        busy = true;
        engine.receive(0, now, &frame);
        wire.pool.push(frame);
    }
    let Wire {
        to_client, pool, ..
    } = wire;
    busy |= engine.poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
        link::transmit(pool, to_client, h, p, t)
    });
    busy
}

struct Probe {
    engine: HcaEngine<'static, Keys>,
    client: Box<Initiator<ClientHca>>,
    wire: Wire,
    now: u64,
    events: Vec<Event>,
    /// Completions: (tag, ok, read data matched the pattern).
    done: Vec<(u64, bool, bool)>,
}

/// The bytes written at `offset` (reads are checked against them).
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) * 31 / 7) as u8)
        .collect()
}

impl Probe {
    /// The probe's target with the image's limits, or the manifest
    /// defaults (`default_limits`); `always_invalidate` as the manifest's.
    fn new(default_limits: bool, always_invalidate: bool, mtu: u16) -> Self {
        let limits = if default_limits { "" } else { IMAGE_LIMITS };
        let text = format!(
            "[target]\nname = \"brick-cost\"\nalways_invalidate = {always_invalidate}\n\n{limits}\
             [[interfaces]]\nname = \"eth0\"\nmtu = {mtu}\n{MANIFEST}"
        );
        let blob: &'static [u8] = Box::leak(
            manifest::build(&text, "cost.toml")
                .expect("the probe's manifest compiles")
                .into_boxed_slice(),
        );
        let manifest = Manifest::parse(blob).expect("manifest blob");
        let engine = Engine::new(manifest, |i| Keys(1000 + i as u64)).expect("engine");
        let mut seed = [7u8; 16];
        seed[0] = 2;
        let mut config = InitiatorConfig::new(seed);
        config.queue_depth = 32;
        config.max_transfer = 128 << 10;
        let pool = usize::try_from(config.pool_bytes()).expect("pool size") + (8 << 20);
        let mut hca = Hca::new(
            vec![0u8; pool],
            Keys(7919),
            HcaConfig {
                mac: [0x52, 0x54, 0x00, 0x77, 0x01, 2],
                ip: [10, 77, 0, 2],
            },
        );
        hca.set_path_mtu(Mtu::for_ethernet_mtu(usize::from(mtu)).expect("MTU of at least 576"));
        let client = Box::new(Initiator::new(hca, config).expect("initiator"));
        Self {
            engine,
            client,
            wire: Wire::default(),
            now: 1_000_000,
            events: Vec::new(),
            done: Vec::new(),
        }
    }

    /// One loop turn of both sides: the target while it has work, then
    /// the client.
    fn turn(&mut self) {
        self.turn_forced(false);
    }

    /// [`Probe::turn`]; `force` runs the target side even with nothing
    /// to do (an idle turn of its loop).
    fn turn_forced(&mut self, force: bool) {
        self.now += STEP;
        let now = self.now;
        let due = self.engine.poll_at(now).is_some_and(|at| at <= now);
        if force || !self.wire.to_engine.is_empty() || due {
            IN_TARGET.with(|t| t.set(true));
            while target_side(&mut self.engine, &mut self.wire, now) {}
            IN_TARGET.with(|t| t.set(false));
        }
        let Wire {
            to_engine,
            to_client,
            pool,
        } = &mut self.wire;
        let hca = self.client.verbs_mut();
        while let Some(frame) = to_client.pop_front() {
            hca.receive(now, &frame);
            pool.push(frame);
        }
        self.client.poll(now);
        self.client
            .verbs_mut()
            .poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                link::transmit(pool, to_engine, h, p, t)
            });
        while let Some(event) = self.client.next_event() {
            self.events.push(event);
        }
        while let Some(done) = self.client.next_completion(|c, data| {
            let matches = c.kind != IoKind::Read || data == pattern(c.offset, c.len as usize);
            (c.tag, c.result.is_ok(), matches)
        }) {
            self.done.push(done);
        }
    }

    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..MAX_TURNS {
            if done(self) {
                return;
            }
            self.turn();
        }
        panic!("no {what} after {MAX_TURNS} loop turns");
    }

    fn connect_and_open(&mut self) -> VolumeId {
        let server: SocketAddr = "10.77.0.1:1234".parse().unwrap();
        self.client
            .connect("cost", &[server], self.now)
            .expect("connect");
        self.run_until("SessionUp", |p| {
            p.events
                .iter()
                .any(|e| matches!(e, Event::SessionUp { .. }))
        });
        let volume = self
            .client
            .open("data", AccessMode::ReadWrite)
            .expect("open");
        let mut info = None;
        self.run_until("Opened", |p| {
            info = p.events.iter().find_map(|e| match e {
                Event::Opened { volume: v, result } if *v == volume => Some(*result),
                _ => None,
            });
            info.is_some()
        });
        info.unwrap().expect("the volume opens").id
    }

    /// Runs `count` IOs of `bytes`, `depth` in flight, over the span.
    fn run_ios(&mut self, volume: VolumeId, write: bool, bytes: u32, count: u64, depth: u64) {
        let slots = SPAN / u64::from(bytes);
        let data: Vec<Vec<u8>> = (0..slots.min(64))
            .map(|s| pattern(s * u64::from(bytes), bytes as usize))
            .collect();
        let (mut issued, mut completed) = (0u64, 0u64);
        let mut turns = 0u64;
        while completed < count {
            while issued < count && issued - completed < depth {
                // Offsets cycle over the first 64 slots (the written
                // patterns) so every read can be checked.
                let slot = issued % slots.min(64);
                let offset = slot * u64::from(bytes);
                let now = self.now;
                let submitted = if write {
                    self.client.submit_write(
                        now,
                        issued,
                        volume,
                        offset,
                        &data[slot as usize],
                        false,
                    )
                } else {
                    self.client.submit_read(now, issued, volume, offset, bytes)
                };
                submitted.expect("submit");
                issued += 1;
            }
            self.turn();
            for (tag, ok, matches) in self.done.drain(..) {
                assert!(ok, "IO {tag} failed");
                assert!(matches, "read {tag} returned other bytes than were written");
                completed += 1;
            }
            turns += 1;
            assert!(
                turns < MAX_TURNS,
                "IOs stalled: {completed} of {count} done"
            );
        }
    }
}

/// The counter sees an allocation made inside the target (so its 0 means
/// something); then starts from 0.
fn check_counter() {
    COUNTING.with(|c| c.set(true));
    IN_TARGET.with(|t| t.set(true));
    drop(std::hint::black_box(vec![0u8; 16]));
    IN_TARGET.with(|t| t.set(false));
    COUNTING.with(|c| c.set(false));
    let seen = TARGET_ALLOCATIONS.swap(0, Ordering::Relaxed);
    assert_eq!(
        seen, 1,
        "the allocation counter saw {seen} allocations, expected 1"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: cost_probe read|write|idle BYTES WARMUP IOS [DEPTH [image|default \
                 [invalidate|keep [MTU]]]]";
    let number = |i: usize, default: Option<u64>| -> u64 {
        match args.get(i) {
            Some(text) => text
                .parse()
                .unwrap_or_else(|_| panic!("expected a number, found {text:?}; {usage}")),
            None => default.unwrap_or_else(|| panic!("{usage}")),
        }
    };
    let kind = args.first().cloned().unwrap_or_default();
    let (write, idle) = match kind.as_str() {
        "read" => (false, false),
        "write" => (true, false),
        "idle" => (false, true),
        other => panic!("expected read, write or idle, found {other:?}; {usage}"),
    };
    let bytes = u32::try_from(number(1, None)).expect("BYTES fits 32 bits");
    let (warmup, ios, depth) = (number(2, None), number(3, None), number(4, Some(1)));
    let default_limits = match args.get(5).map(String::as_str) {
        None | Some("image") => false,
        Some("default") => true,
        Some(other) => panic!("expected image or default limits, found {other:?}; {usage}"),
    };
    let always_invalidate = match args.get(6).map(String::as_str) {
        None | Some("invalidate") => true,
        Some("keep") => false,
        Some(other) => panic!("expected invalidate or keep, found {other:?}; {usage}"),
    };
    let mtu = u16::try_from(number(7, Some(1500)))
        .ok()
        .filter(|mtu| (576..=9000).contains(mtu))
        .unwrap_or_else(|| panic!("expected an MTU of 576..=9000; {usage}"));
    assert!(
        bytes % 512 == 0 && (512..=128 << 10).contains(&bytes),
        "BYTES must be a multiple of 512 up to 128 KiB, found {bytes}"
    );
    // The HCAs and the initiator are large: a thread with a big stack.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let mut probe = Probe::new(default_limits, always_invalidate, mtu);
            let volume = probe.connect_and_open();
            // Fill the checked slots so reads return known bytes.
            probe.run_ios(volume, true, bytes, (SPAN / u64::from(bytes)).min(64), 1);
            check_counter();
            if idle {
                // Loop turns with nothing to do: the cost of one poll of
                // an idle target with one open session.
                (0..warmup).for_each(|_| probe.turn_forced(true));
                COUNTING.with(|c| c.set(true));
                (0..ios).for_each(|_| probe.turn_forced(true));
                COUNTING.with(|c| c.set(false));
            } else {
                probe.run_ios(volume, write, bytes, warmup, depth);
                COUNTING.with(|c| c.set(true));
                probe.run_ios(volume, write, bytes, ios, depth);
                COUNTING.with(|c| c.set(false));
            }
            println!(
                "cost-probe: kind={} bytes={bytes} depth={depth} warmup={warmup} \
                 limits={} always_invalidate={always_invalidate} mtu={mtu} measured_ios={ios} \
                 allocations={} answered={}",
                kind,
                if default_limits { "default" } else { "image" },
                TARGET_ALLOCATIONS.load(Ordering::Relaxed),
                probe.engine.answered(),
            );
        })
        .expect("probe thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}
