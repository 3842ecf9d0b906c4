//! Test harness: the real target engine (`target_image::Engine`) and any
//! number of initiators, each on its own software HCA, on one in-memory
//! Ethernet segment under a fake clock.
//!
//! Frames from the engine go to the node whose MAC they name (broadcasts to
//! every node); frames from a node go to the engine interface whose MAC
//! they name (broadcasts to every interface). The segment can be lossy
//! (drop, duplicate, reorder, seeded), an interface can be cut (both
//! directions dropped), and the engine can be taken down and rebuilt from
//! the same manifest (a target restart: RAM volumes come back empty).
//!
//! Time advances by [`STEP`] while frames move and jumps to the next
//! deadline (engine, HCAs, initiators) when nothing does, so seconds of
//! heartbeats and reconnect delays cost little real time.

#![allow(dead_code)] // each test binary uses a different subset

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;

use hal::block::BlockDevice;
use initiator::{
    AccessMode, Completion, Event, Initiator, InitiatorConfig, IoError, OpenError, SubmitError,
    VolumeId, VolumeInfo,
};
use manifest::binary::{Manifest, Volume};
use roce::hca::{Hca, HcaConfig};
use rtrs::server::ServerConfig;
use target_image::{BuildError, Chunk, Engine, HcaEngine, RamVolume};
use verbs::KeySource;

thread_local! {
    /// Non-zero while initiator code that must not allocate runs (the
    /// `no_alloc` test's allocator counts allocations then).
    pub static COUNTING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with [`COUNTING`] raised.
pub fn counted<R>(f: impl FnOnce() -> R) -> R {
    COUNTING.with(|c| c.set(c.get() + 1));
    let result = f();
    COUNTING.with(|c| c.set(c.get() - 1));
    result
}

/// Fake time per step while frames move.
pub const STEP: u64 = 10_000;
/// One second of fake time.
pub const SECOND: u64 = 1_000_000_000;

/// Seeded key source (R_Keys, QPNs, PSNs, CM ids).
pub struct Keys(pub u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

/// The initiators' HCA: 64 regions, 16 QPs, 4096 completions.
pub type TestHca = Hca<Vec<u8>, Keys, 64, 16, 4096>;

/// A small deterministic generator for workloads and the lossy link.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A deterministic byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut out = vec![0; len];
    for chunk in out.chunks_mut(8) {
        let bytes = rng.next().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    out
}

/// Faults of the segment, per frame, both directions.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Drop probability, per mille.
    pub drop: u64,
    /// Duplicate probability, per mille.
    pub duplicate: u64,
    /// Reorder (hold back behind the next frame) probability, per mille.
    pub reorder: u64,
}

/// Counters of what the segment did.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkCounters {
    /// Frames carried.
    pub frames: u64,
    /// Frames dropped by faults.
    pub dropped: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames reordered.
    pub reordered: u64,
}

struct Segment {
    faults: Faults,
    rng: Rng,
    counters: LinkCounters,
}

impl Segment {
    /// Delivers `frame` into `queue` subject to the faults; `held` is the
    /// direction's frame held back for reordering.
    fn deliver<T: Clone>(&mut self, queue: &mut VecDeque<T>, held: &mut Option<T>, item: T) {
        self.counters.frames += 1;
        if self.rng.chance(self.faults.drop) {
            self.counters.dropped += 1;
            return;
        }
        if self.rng.chance(self.faults.duplicate) {
            self.counters.duplicated += 1;
            queue.push_back(item.clone());
        }
        if held.is_none() && self.rng.chance(self.faults.reorder) {
            self.counters.reordered += 1;
            *held = Some(item);
            return;
        }
        queue.push_back(item);
        if let Some(late) = held.take() {
            queue.push_back(late);
        }
    }
}

/// One initiator host.
pub struct Node {
    /// The initiator under test.
    pub init: Box<Initiator<TestHca>>,
    /// Its MAC.
    pub mac: [u8; 6],
    /// Control events seen, oldest first (tests remove what they consume).
    pub events: Vec<Event>,
    /// Completions reaped, with a copy of the read data.
    pub completions: Vec<(Completion, Vec<u8>)>,
    inbox: VecDeque<Vec<u8>>,
    held: Option<Vec<u8>>,
}

/// Why a harness IO failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Refused at submission.
    Submit(SubmitError),
    /// Completed with an error.
    Io(IoError),
}

/// Opens a volume of the engine (see `Engine::with_volumes`).
pub type OpenVolume<D> = Box<dyn FnMut(&ServerConfig, &Volume<'_>) -> Result<D, BuildError>>;

/// Engine + nodes + clock.
pub struct World<D: BlockDevice<Chunk> = RamVolume> {
    /// The engine, `None` while the target is down.
    pub engine: Option<HcaEngine<'static, Keys, D>>,
    manifest: Manifest<'static>,
    open_volume: OpenVolume<D>,
    /// Engine interface MACs, by index.
    pub interface_macs: Vec<[u8; 6]>,
    /// Interfaces whose frames are dropped both ways.
    pub cut: Vec<bool>,
    /// Fake time, ns.
    pub now: u64,
    /// Initiator hosts.
    pub nodes: Vec<Node>,
    to_engine: VecDeque<(usize, Vec<u8>)>,
    engine_held: Option<(usize, Vec<u8>)>,
    segment: Segment,
    boots: u64,
    /// Every line the engine logged.
    pub log: Rc<RefCell<Vec<String>>>,
}

/// Runs `test` in a thread with a big stack (HCAs and the engine are
/// large), propagating its panic.
pub fn run(test: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(test)
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

/// The test initiator configuration: queue depth 16, 1 MiB transfers.
pub fn config(seed: u64) -> InitiatorConfig {
    let mut uuid_seed = [0u8; 16];
    uuid_seed[..8].copy_from_slice(&seed.to_le_bytes());
    uuid_seed[8..].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
    let mut config = InitiatorConfig::new(uuid_seed);
    config.queue_depth = 16;
    config.max_transfer = 1 << 20;
    config
}

fn mac_of(text: &str) -> [u8; 6] {
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(text.split(':')) {
        *byte = u8::from_str_radix(part, 16).unwrap();
    }
    mac
}

impl World<RamVolume> {
    /// A world serving `manifest` (TOML) from RAM volumes.
    pub fn new(manifest: &str) -> Self {
        World::with_volumes(
            manifest,
            Box::new(|_, volume| target_image::ram_volume(volume)),
        )
    }
}

impl<D: BlockDevice<Chunk>> World<D> {
    /// A world serving `manifest` (TOML) from the volumes `open` makes.
    pub fn with_volumes(manifest: &str, open_volume: OpenVolume<D>) -> Self {
        let blob: &'static [u8] = Box::leak(
            manifest::build(manifest, "test.toml")
                .expect("manifest")
                .into_boxed_slice(),
        );
        let parsed = Manifest::parse(blob).expect("manifest blob");
        let interface_macs: Vec<[u8; 6]> = manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("mac = \""))
            .map(|m| mac_of(m.trim_end_matches('"')))
            .collect();
        let mut world = Self {
            engine: None,
            manifest: parsed,
            open_volume,
            cut: vec![false; interface_macs.len()],
            interface_macs,
            now: 1_000_000,
            nodes: Vec::new(),
            to_engine: VecDeque::new(),
            engine_held: None,
            segment: Segment {
                faults: Faults::default(),
                rng: Rng(0x5eed_1234_abcd_0001),
                counters: LinkCounters::default(),
            },
            boots: 0,
            log: Rc::new(RefCell::new(Vec::new())),
        };
        world.start_target();
        world
    }

    /// Builds a fresh engine from the manifest (new keys, empty RAM).
    pub fn start_target(&mut self) {
        self.boots += 1;
        let boot = self.boots;
        let open = &mut self.open_volume;
        let mut engine = Engine::with_volumes(
            self.manifest,
            move |i| Keys(1000 * boot + i as u64),
            |config, volume| open(config, volume),
        )
        .expect("engine");
        let sink = Rc::clone(&self.log);
        let verbose = std::env::var_os("BRICK_TEST_LOG").is_some();
        engine.set_logger(move |line| {
            let line = line.to_string();
            if verbose {
                eprintln!("engine: {line}");
            }
            sink.borrow_mut().push(line);
        });
        self.engine = Some(engine);
    }

    /// Serves `manifest` (TOML) from the next [`World::start_target`] on
    /// (a target restarted with another configuration).
    pub fn set_manifest(&mut self, manifest: &str) {
        let blob: &'static [u8] = Box::leak(
            manifest::build(manifest, "test.toml")
                .expect("manifest")
                .into_boxed_slice(),
        );
        self.manifest = Manifest::parse(blob).expect("manifest blob");
    }

    /// Drops the engine (the target process died: no DREQ, nothing).
    pub fn stop_target(&mut self) {
        self.engine = None;
        self.to_engine.clear();
        self.engine_held = None;
    }

    /// Sets the segment's faults (seeded).
    pub fn set_faults(&mut self, faults: Faults, seed: u64) {
        self.segment.faults = faults;
        self.segment.rng = Rng(seed | 1);
    }

    /// What the segment did so far.
    pub fn link_counters(&self) -> LinkCounters {
        self.segment.counters
    }

    /// Adds an initiator at 10.77.0.`host`; returns its index.
    pub fn add_node(&mut self, host: u8, config: InitiatorConfig) -> usize {
        let mac = [0x52, 0x54, 0x00, 0x77, 0x01, host];
        let pool = usize::try_from(config.pool_bytes()).unwrap() + (8 << 20);
        let hca = Hca::new(
            vec![0u8; pool],
            Keys(u64::from(host) * 7919),
            HcaConfig {
                mac,
                ip: [10, 77, 0, host],
            },
        );
        let init = Box::new(Initiator::new(hca, config).expect("initiator"));
        self.nodes.push(Node {
            init,
            mac,
            events: Vec::new(),
            completions: Vec::new(),
            inbox: VecDeque::new(),
            held: None,
        });
        self.nodes.len() - 1
    }

    /// Moves frames and polls everything once at the current time.
    /// Returns whether anything moved.
    fn exchange(&mut self) -> bool {
        let now = self.now;
        let mut moved = false;
        let Self {
            engine,
            nodes,
            to_engine,
            engine_held,
            segment,
            cut,
            interface_macs,
            ..
        } = self;
        if let Some((iface, frame)) = engine_held.take() {
            to_engine.push_back((iface, frame));
        }
        if let Some(engine) = engine.as_mut() {
            while let Some((iface, frame)) = to_engine.pop_front() {
                moved = true;
                engine.receive(iface, now, &frame);
            }
            moved |= engine.poll(now, &mut |iface: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                if cut.get(iface).copied().unwrap_or(false) {
                    return;
                }
                let mut frame = h.to_vec();
                for piece in p {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(t);
                let dest = [h[0], h[1], h[2], h[3], h[4], h[5]];
                for node in nodes.iter_mut() {
                    if dest == [0xff; 6] || dest == node.mac {
                        segment.deliver(&mut node.inbox, &mut node.held, frame.clone());
                    }
                }
            });
        } else {
            to_engine.clear();
        }
        for node in nodes.iter_mut() {
            if let Some(late) = node.held.take() {
                node.inbox.push_back(late);
            }
            while let Some(frame) = node.inbox.pop_front() {
                moved = true;
                node.init.verbs_mut().receive(now, &frame);
            }
            moved |= counted(|| node.init.poll(now));
            moved |= node
                .init
                .verbs_mut()
                .poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                    let mut frame = h.to_vec();
                    for piece in p {
                        frame.extend_from_slice(piece);
                    }
                    frame.extend_from_slice(t);
                    let dest = [h[0], h[1], h[2], h[3], h[4], h[5]];
                    for (iface, mac) in interface_macs.iter().enumerate() {
                        if (dest == [0xff; 6] || dest == *mac) && !cut[iface] {
                            segment.deliver(to_engine, engine_held, (iface, frame.clone()));
                        }
                    }
                });
            while let Some(event) = node.init.next_event() {
                moved = true;
                node.events.push(event);
            }
            while let Some(reaped) = node
                .init
                .next_completion(|completion, data| (*completion, data.to_vec()))
            {
                moved = true;
                node.completions.push(reaped);
            }
        }
        moved
    }

    /// The earliest deadline of anything in the world.
    fn next_deadline(&self) -> Option<u64> {
        let now = self.now;
        let engine = self.engine.as_ref().and_then(|e| e.poll_at(now));
        self.nodes
            .iter()
            .flat_map(|n| [n.init.poll_at(), n.init.verbs().poll_at(now)])
            .chain([engine])
            .flatten()
            .min()
    }

    /// One step: exchange, then advance the clock by [`STEP`] if anything
    /// moved, else to the next deadline (at most `limit`).
    pub fn step_until(&mut self, limit: u64) {
        let moved = self.exchange();
        let next = if moved {
            self.now + STEP
        } else {
            self.next_deadline()
                .unwrap_or(self.now + SECOND / 10)
                .max(self.now + STEP)
        };
        self.now = next.min(limit.max(self.now + STEP));
    }

    /// Runs until `done`, for at most `max_ns` of fake time; panics naming
    /// `what` otherwise.
    pub fn run_until(&mut self, what: &str, max_ns: u64, mut done: impl FnMut(&mut Self) -> bool) {
        let deadline = self.now + max_ns;
        while self.now < deadline {
            if done(self) {
                return;
            }
            self.step_until(deadline);
        }
        if done(self) {
            return;
        }
        let events: Vec<_> = self.nodes.iter().map(|n| n.events.clone()).collect();
        panic!(
            "timed out after {} ms of fake time waiting for {what}\nevents {events:?}\nlog tail {:?}",
            max_ns / 1_000_000,
            self.log.borrow().iter().rev().take(20).collect::<Vec<_>>()
        );
    }

    /// Runs for `ns` of fake time.
    pub fn run_for(&mut self, ns: u64) {
        let deadline = self.now + ns;
        while self.now < deadline {
            self.step_until(deadline);
        }
    }

    /// Removes and returns node `i`'s first event matching `pick`.
    pub fn take_event(&mut self, i: usize, pick: impl Fn(&Event) -> bool) -> Option<Event> {
        let events = &mut self.nodes[i].events;
        let at = events.iter().position(pick)?;
        Some(events.remove(at))
    }

    /// Waits for node `i`'s first event matching `pick` (at most `max_ns`).
    pub fn wait_event(
        &mut self,
        i: usize,
        what: &str,
        max_ns: u64,
        pick: impl Fn(&Event) -> bool,
    ) -> Event {
        let mut found = None;
        self.run_until(what, max_ns, |w| {
            found = w.take_event(i, &pick);
            found.is_some()
        });
        found.unwrap()
    }

    /// Connects node `i` as session `name` over `paths` and waits for
    /// `SessionUp`.
    pub fn connect(&mut self, i: usize, name: &str, paths: &[&str]) {
        let paths: Vec<SocketAddr> = paths.iter().map(|p| p.parse().unwrap()).collect();
        let now = self.now;
        self.nodes[i]
            .init
            .connect(name, &paths, now)
            .expect("connect");
        self.wait_event(i, "SessionUp", 10 * SECOND, |e| {
            matches!(e, Event::SessionUp { .. })
        });
    }

    /// Opens `path` on node `i` and waits for the answer.
    pub fn open(
        &mut self,
        i: usize,
        path: &str,
        mode: AccessMode,
    ) -> Result<VolumeInfo, OpenError> {
        let volume = self.nodes[i].init.open(path, mode)?;
        match self.wait_event(
            i,
            "Opened",
            10 * SECOND,
            |e| matches!(e, Event::Opened { volume: v, .. } if *v == volume),
        ) {
            Event::Opened { result, .. } => result,
            _ => unreachable!(),
        }
    }

    /// Waits for node `i`'s completion of `tag`.
    pub fn completion(&mut self, i: usize, tag: u64, max_ns: u64) -> (Completion, Vec<u8>) {
        let mut found = None;
        self.run_until("IO completion", max_ns, |w| {
            let list = &mut w.nodes[i].completions;
            if let Some(at) = list.iter().position(|(c, _)| c.tag == tag) {
                found = Some(list.remove(at));
            }
            found.is_some()
        });
        found.unwrap()
    }

    /// Writes and waits.
    pub fn write(
        &mut self,
        i: usize,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), Failure> {
        let (now, tag) = (self.now, next_tag());
        self.nodes[i]
            .init
            .submit_write(now, tag, volume, offset, data, fua)
            .map_err(Failure::Submit)?;
        self.completion(i, tag, 60 * SECOND)
            .0
            .result
            .map_err(Failure::Io)
    }

    /// Reads and waits.
    pub fn read(
        &mut self,
        i: usize,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, Failure> {
        let (now, tag) = (self.now, next_tag());
        self.nodes[i]
            .init
            .submit_read(now, tag, volume, offset, len)
            .map_err(Failure::Submit)?;
        let (completion, data) = self.completion(i, tag, 60 * SECOND);
        completion.result.map_err(Failure::Io)?;
        assert_eq!(data.len(), len as usize, "read data length");
        Ok(data)
    }

    /// Flushes and waits.
    pub fn flush(&mut self, i: usize, volume: VolumeId) -> Result<(), Failure> {
        let (now, tag) = (self.now, next_tag());
        self.nodes[i]
            .init
            .submit_flush(now, tag, volume)
            .map_err(Failure::Submit)?;
        self.completion(i, tag, 60 * SECOND)
            .0
            .result
            .map_err(Failure::Io)
    }

    /// Discards and waits.
    pub fn discard(
        &mut self,
        i: usize,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<(), Failure> {
        let (now, tag) = (self.now, next_tag());
        self.nodes[i]
            .init
            .submit_discard(now, tag, volume, offset, len)
            .map_err(Failure::Submit)?;
        self.completion(i, tag, 60 * SECOND)
            .0
            .result
            .map_err(Failure::Io)
    }
}

/// A fresh tag for harness IO.
pub fn next_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A byte model of a volume and a random, verified workload against it:
/// rounds of up to `depth` IOs on disjoint ranges (writes of random
/// patterns, reads checked byte for byte, now and then a discard or a
/// flush), all submitted before any is reaped.
pub struct Workload {
    /// What the volume must hold.
    pub model: Vec<u8>,
    rng: Rng,
    /// IOs completed.
    pub completed: u64,
    /// Bytes compared.
    pub verified_bytes: u64,
    /// Largest IO issued.
    pub largest: u32,
}

#[derive(Clone, Copy, Debug)]
enum PlannedOp {
    Read(u64, u32),
    Write(u64, u32, u64),
    Discard(u64, u32),
    Flush,
}

impl Workload {
    /// A workload for a volume of `size` bytes, starting from `model`.
    pub fn new(size: u64, seed: u64) -> Self {
        Self {
            model: vec![0; size as usize],
            rng: Rng(seed | 1),
            completed: 0,
            verified_bytes: 0,
            largest: 0,
        }
    }

    fn random_len(&mut self) -> u32 {
        // 512 B .. 1 MiB in sectors, biased towards small and the largest.
        match self.rng.below(10) {
            0..=4 => (1 + self.rng.below(16) as u32) * 512,
            5..=7 => (1 + self.rng.below(512) as u32) * 512,
            8 => (1 + self.rng.below(2048) as u32) * 512,
            _ => 1 << 20,
        }
    }

    /// Runs `rounds` rounds on node `i`'s `volume` (discards only if
    /// `discard`). Panics on any error or mismatch.
    pub fn run(
        &mut self,
        world: &mut World,
        i: usize,
        volume: VolumeId,
        rounds: usize,
        depth: usize,
        discard: bool,
    ) {
        let size = self.model.len() as u64;
        for _ in 0..rounds {
            let mut planned: Vec<(u64, PlannedOp)> = Vec::new();
            let mut taken: Vec<(u64, u64)> = Vec::new();
            let count = 1 + self.rng.below(depth as u64) as usize;
            for _ in 0..count {
                let len = self.random_len();
                let offset = self.rng.below((size - u64::from(len)) / 512 + 1) * 512;
                let end = offset + u64::from(len);
                if taken.iter().any(|&(a, b)| offset < b && a < end) {
                    continue;
                }
                let op = match self.rng.below(20) {
                    0 if discard => PlannedOp::Discard(offset, len),
                    1 => PlannedOp::Flush,
                    2..=10 => PlannedOp::Write(offset, len, self.rng.next()),
                    _ => PlannedOp::Read(offset, len),
                };
                if !matches!(op, PlannedOp::Flush) {
                    taken.push((offset, end));
                }
                let tag = next_tag();
                let now = world.now;
                let init = &mut world.nodes[i].init;
                let submitted = match op {
                    PlannedOp::Read(o, l) => init.submit_read(now, tag, volume, o, l),
                    PlannedOp::Write(o, l, seed) => init.submit_write(
                        now,
                        tag,
                        volume,
                        o,
                        &pattern(seed, l as usize),
                        seed % 5 == 0,
                    ),
                    PlannedOp::Discard(o, l) => init.submit_discard(now, tag, volume, o, l),
                    PlannedOp::Flush => init.submit_flush(now, tag, volume),
                };
                submitted.unwrap_or_else(|e| panic!("submit {op:?}: {e}"));
                self.largest = self.largest.max(len);
                planned.push((tag, op));
            }
            for (tag, op) in planned {
                let (completion, data) = world.completion(i, tag, 120 * SECOND);
                if let Err(error) = completion.result {
                    panic!("{op:?} failed: {error}");
                }
                self.completed += 1;
                match op {
                    PlannedOp::Read(o, l) => {
                        let want = &self.model[o as usize..(o + u64::from(l)) as usize];
                        if data != want {
                            let first = data.iter().zip(want).position(|(a, b)| a != b);
                            panic!("read {o}+{l} differs from the model at byte {first:?}");
                        }
                        self.verified_bytes += u64::from(l);
                    }
                    PlannedOp::Write(o, l, seed) => {
                        self.model[o as usize..(o + u64::from(l)) as usize]
                            .copy_from_slice(&pattern(seed, l as usize));
                    }
                    PlannedOp::Discard(o, l) => {
                        self.model[o as usize..(o + u64::from(l)) as usize].fill(0);
                    }
                    PlannedOp::Flush => {}
                }
            }
        }
    }

    /// Reads the whole volume back (1 MiB at a time) and compares.
    pub fn verify_all<D: BlockDevice<Chunk>>(
        &mut self,
        world: &mut World<D>,
        i: usize,
        volume: VolumeId,
    ) {
        let size = self.model.len() as u64;
        let mut offset = 0;
        while offset < size {
            let len = (size - offset).min(1 << 20) as u32;
            let data = world.read(i, volume, offset, len).expect("verify read");
            assert!(
                data == self.model[offset as usize..(offset + u64::from(len)) as usize],
                "volume differs from the model in {offset}+{len}"
            );
            self.verified_bytes += u64::from(len);
            offset += u64::from(len);
        }
    }
}
