//! The engine-test harness: the engine's interface 0 and any number of
//! client software HCAs on one in-memory Ethernet segment, under a fake clock.
//!
//! The clients are those of [`clients`] (shared with
//! `examples/hostile_probe/`): [`Node`], Brick's own RTRS client with an
//! optional background [`Workload`], and [`RawNode`], a bare HCA driven by
//! the test (raw CM connects with any CON_REQ bytes, RDMA WRITE WITH IMM
//! requests built from `rtrs::wire` encoders). [`World`] is their
//! [`Fabric`]: it owns the engine, moves frames and keeps the fake clock.
//!
//! Frames from the engine are routed by destination MAC (broadcasts go to
//! every node); frames from nodes go to the engine. A node that is not
//! `alive` neither sends nor receives (a crashed host). Frame buffers are
//! recycled so a steady-state window allocates nothing in the harness
//! either (`lifecycle.rs` counts allocations). [`IN_ENGINE`] and
//! [`EXCLUDED`] mark, per thread, when the engine runs and when the harness
//! callbacks it calls (sink, logger) run, so allocations can be attributed.

#![allow(dead_code)] // each test binary uses a different subset

pub mod clients;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;

use hal::block::BlockDevice;
use manifest::binary::Manifest;
use target_image::{Chunk, Engine, HcaEngine, RamVolume};

pub use clients::*;

thread_local! {
    /// Non-zero while the engine runs (`receive`, `poll`) on this thread.
    pub static IN_ENGINE: Cell<u32> = const { Cell::new(0) };
    /// Non-zero while a harness callback the engine calls (frame sink,
    /// logger) runs: its allocations are the harness's, not the engine's.
    pub static EXCLUDED: Cell<u32> = const { Cell::new(0) };
}

/// Increments a thread-local depth until dropped.
struct Depth(&'static std::thread::LocalKey<Cell<u32>>);

impl Depth {
    fn enter(key: &'static std::thread::LocalKey<Cell<u32>>) -> Self {
        key.with(|d| d.set(d.get() + 1));
        Depth(key)
    }
}

impl Drop for Depth {
    fn drop(&mut self) {
        self.0.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `f` as if inside the engine (for checking allocation attribution).
pub fn as_engine<R>(f: impl FnOnce() -> R) -> R {
    let _engine = Depth::enter(&IN_ENGINE);
    f()
}

/// Nanoseconds of fake time per [`World::step`].
pub const STEP: u64 = 10_000;
/// One second of fake time.
pub const SECOND: u64 = 1_000_000_000;
/// Steps a single wait may take before the harness gives up.
pub const MAX_STEPS: usize = 200_000;

/// The engine's interface 0 (the manifests of the tests use it).
pub const ENGINE_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];
/// The engine's RTRS listener.
pub fn server() -> SocketAddr {
    "10.77.0.1:1234".parse().unwrap()
}

fn host_mac(host: u8) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0x77, 0x01, host]
}

/// The RTRS server posts `SERVICE_CON_QUEUE_DEPTH` (512) receives on cid 0
/// and `queue_depth` on every IO connection; a software HCA whose receive
/// queues are shallower closes every path at INFO_REQ (PostFailed).
pub fn assert_hca_can_serve_rtrs() {
    let needed = usize::from(rtrs::wire::SERVICE_CON_QUEUE_DEPTH);
    assert!(
        roce::qp::config::RQ_DEPTH > needed,
        "roce RQ_DEPTH {} cannot hold the {needed} receives the RTRS server posts on cid 0",
        roce::qp::config::RQ_DEPTH
    );
}

/// Runs `test` on a world built from `manifest` (TOML), in a thread with a
/// 256 MiB stack (the HCAs are large), propagating its panic.
pub fn with_world(manifest: &'static str, test: impl FnOnce(&mut World<'_>) + Send + 'static) {
    assert_hca_can_serve_rtrs();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(manifest, "test.toml").expect("manifest");
            let manifest = Manifest::parse(&blob).expect("manifest blob");
            let mut world = World::new(manifest);
            test(&mut world);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

/// Engine + nodes + clock; the engine's volumes are `D` (RAM unless a
/// test builds the engine itself, [`World::with_engine`]).
pub struct World<'m, D: BlockDevice<Chunk> = RamVolume> {
    /// The engine under test.
    pub engine: HcaEngine<'m, Keys, D>,
    /// Fake time, nanoseconds.
    pub now: u64,
    /// Brick-client nodes.
    pub clients: Vec<Node>,
    /// Raw nodes.
    pub raws: Vec<RawNode>,
    to_engine: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
    /// Every line the engine logged.
    pub log: Rc<RefCell<Vec<String>>>,
    /// Sees every frame on its way to the engine and may hand the engine
    /// frames of its own first (a forger on the wire).
    pub tap: Option<Tap>,
}

/// [`World::tap`]: called with a node's frame before the engine gets it;
/// the frames it returns reach the engine just before that frame.
pub type Tap = Box<dyn FnMut(&[u8]) -> Vec<Vec<u8>>>;

fn frame_into(
    pool: &mut Vec<Vec<u8>>,
    headers: &[u8],
    payload: &[&[u8]],
    trailer: &[u8],
) -> Vec<u8> {
    let mut out = pool.pop().unwrap_or_else(|| Vec::with_capacity(2048));
    out.clear();
    out.extend_from_slice(headers);
    for piece in payload {
        out.extend_from_slice(piece);
    }
    out.extend_from_slice(trailer);
    out
}

impl<'m> World<'m> {
    /// The engine from `manifest` (RAM volumes), logging into
    /// [`World::log`] (and to stderr with `BRICK_TEST_LOG` set).
    pub fn new(manifest: Manifest<'m>) -> Self {
        let engine = Engine::new(manifest, |i| Keys(1000 + i as u64)).expect("engine");
        Self::with_engine(engine)
    }
}

impl<'m, D: BlockDevice<Chunk>> World<'m, D> {
    /// A world around `engine` (its keys should be `Keys(1000 + i)`, as
    /// [`World::new`] makes them), logging as [`World::new`] does.
    pub fn with_engine(mut engine: HcaEngine<'m, Keys, D>) -> Self {
        let log = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&log);
        let verbose = std::env::var_os("BRICK_TEST_LOG").is_some();
        engine.set_logger(move |line| {
            let _excluded = Depth::enter(&EXCLUDED);
            let line = line.to_string();
            if verbose {
                eprintln!("engine: {line}");
            }
            sink.borrow_mut().push(line);
        });
        Self {
            engine,
            now: 1_000_000,
            clients: Vec::new(),
            raws: Vec::new(),
            to_engine: VecDeque::with_capacity(1024),
            pool: Vec::with_capacity(1024),
            log,
            tap: None,
        }
    }

    /// Log lines containing `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .borrow()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Adds a Brick-client node at 10.77.0.`host` whose client accepts a
    /// server queue depth up to `max_queue_depth`; returns its index.
    pub fn add_client(&mut self, host: u8, max_queue_depth: u16, seed: u64) -> usize {
        let node = Node::new(host_mac(host), [10, 77, 0, host], max_queue_depth, seed);
        self.clients.push(node);
        self.clients.len() - 1
    }

    /// Adds a raw node at 10.77.0.`host`; returns its index.
    pub fn add_raw(&mut self, host: u8, seed: u64) -> usize {
        let node = RawNode::new(host_mac(host), [10, 77, 0, host], seed);
        self.raws.push(node);
        self.raws.len() - 1
    }

    /// One step of fake time: frames both ways, every poll.
    pub fn step(&mut self) {
        self.advance(STEP);
    }

    /// Moves the clock by `ns`, then exchanges frames and polls once.
    pub fn advance(&mut self, ns: u64) {
        self.now += ns;
        self.exchange();
    }

    fn exchange(&mut self) {
        let now = self.now;
        let Self {
            engine,
            clients,
            raws,
            to_engine,
            pool,
            tap,
            ..
        } = self;
        {
            let _engine = Depth::enter(&IN_ENGINE);
            while let Some(frame) = to_engine.pop_front() {
                if let Some(tap) = tap.as_mut() {
                    for forged in tap(&frame) {
                        engine.receive(0, now, &forged);
                    }
                }
                engine.receive(0, now, &frame);
                pool.push(frame);
            }
            engine.poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                let _excluded = Depth::enter(&EXCLUDED);
                let dest = [h[0], h[1], h[2], h[3], h[4], h[5]];
                let broadcast = dest == [0xff; 6];
                let targets = clients
                    .iter_mut()
                    .filter(|n| n.alive && (broadcast || n.mac == dest))
                    .map(|n| &mut n.inbox)
                    .chain(
                        raws.iter_mut()
                            .filter(|n| n.alive && (broadcast || n.mac == dest))
                            .map(|n| &mut n.inbox),
                    );
                for inbox in targets {
                    inbox.push_back(frame_into(pool, h, p, t));
                }
            });
        }
        for node in clients.iter_mut().filter(|n| n.alive) {
            while let Some(frame) = node.inbox.pop_front() {
                node.receive(now, &frame);
                pool.push(frame);
            }
            node.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                to_engine.push_back(frame_into(pool, h, p, t))
            });
        }
        for node in raws.iter_mut().filter(|n| n.alive) {
            while let Some(frame) = node.inbox.pop_front() {
                node.receive(now, &frame);
                pool.push(frame);
            }
            node.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                to_engine.push_back(frame_into(pool, h, p, t))
            });
        }
        // Frames for dead nodes are dropped (recycled).
        for node in clients.iter_mut().filter(|n| !n.alive) {
            pool.extend(node.inbox.drain(..));
        }
        for node in raws.iter_mut().filter(|n| !n.alive) {
            pool.extend(node.inbox.drain(..));
        }
    }
}

impl<D: BlockDevice<Chunk>> Fabric for World<'_, D> {
    fn now(&self) -> u64 {
        self.now
    }

    fn server(&self) -> SocketAddr {
        server()
    }

    fn clients(&self) -> &[Node] {
        &self.clients
    }

    fn clients_mut(&mut self) -> &mut Vec<Node> {
        &mut self.clients
    }

    fn raws(&self) -> &[RawNode] {
        &self.raws
    }

    fn raws_mut(&mut self) -> &mut Vec<RawNode> {
        &mut self.raws
    }

    /// One step of fake time ([`World::step`]).
    fn step(&mut self) {
        World::step(self);
    }

    /// Steps until `done(world)`, at most [`MAX_STEPS`] times; panics with
    /// the engine statistics otherwise.
    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..MAX_STEPS {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!(
            "timed out waiting for {what}\n{}\nusage {:?}\nlog tail {:?}",
            self.engine.stats(),
            self.engine.rtrs(0).unwrap().usage(),
            self.log.borrow().iter().rev().take(20).collect::<Vec<_>>()
        );
    }
}

/// A manifest named `name`: one interface (10.77.0.1/24), a 16 MiB file
/// pool at `pool` (7 extents) under the 16 MiB thin volume `thin0`, the
/// 1 MiB RAM volume `ram0`, open to every session; `extra` (e.g. an
/// `[admin]` section) goes before the pools.
pub fn thin_and_ram_manifest(name: &str, pool: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
[target]
name = "{name}"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

{extra}
[[pools]]
name = "pool0"
kind = "file"
path = "{}"
size = "16MiB"

[[volumes]]
name = "thin0"
kind = "thin"
pool = "pool0"
size = "16MiB"

[[volumes]]
name = "ram0"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#,
        pool.display()
    )
}
