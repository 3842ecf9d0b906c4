//! Brick's own client (the engine tests' `Node`,
//! `target-image/tests/common/clients.rs`, included as it is) talking to
//! the fuzz engine in process under the fake clock: `fuzz-seeds` records
//! its sessions as `engine_frames` inputs, and `engine_frames` checks that
//! after any input the engine still serves such a session.

#[path = "../../target-image/tests/common/clients.rs"]
#[allow(clippy::all, dead_code, unused_imports)]
pub mod clients;

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::engine::{self, FuzzEngine, START, STEP};
use clients::{Fabric, Keys, Node, RawNode};
use roce::hca::{Hca, HcaConfig};
use rtrs::client::{Client, ClientConfig};
use verbs::{AccessFlags, Verbs};

/// Key seed of a light node. Not [`Recorder::add_client`]'s 7: a node's
/// CM comm ids, QPNs and PSNs follow from its seed, and with the recorded
/// client's seed the healthy session's first REQ carried the comm id of
/// every recorded session's REQ, so an input whose REQ differed from a
/// recorded one only in the CA GUID's last byte (02 -> 03) forged the
/// healthy client's (comm id, CA GUID): its REQ was then a duplicate of a
/// connection still in DREQ-sent and was ignored (ib-cm.md §4.8, as
/// Linux cm.c does) until the wait timed out. The CM now also matches the
/// sender's address, so such a copy from another host no longer holds the
/// healthy client off (the committed seed
/// `req-forging-the-healthy-client-comm-id` keeps it tried); the seeds stay
/// apart all the same.
const LIGHT_SEED: u64 = 0x6865_616c_7468;
/// Largest ad-hoc IO of a [`Recorder::add_light_client`] node.
pub const LIGHT_IO: u32 = 64 << 10;
/// Registered memory of a light node's HCA (its buffer and the RTRS
/// client's own buffers).
const LIGHT_POOL: usize = 1 << 20;

/// Steps one wait may take.
const MAX_STEPS: usize = 200_000;
/// A delay byte holds at most this many steps; longer gaps get empty
/// records.
const MAX_DELAY: u64 = 200;

/// The fuzz engine and Brick clients, recording every frame the engine
/// receives.
pub struct Recorder {
    /// The engine.
    pub engine: FuzzEngine,
    /// The fake clock.
    pub now: u64,
    step: u64,
    last_recorded: u64,
    /// The client nodes.
    pub clients: Vec<Node>,
    raws: Vec<RawNode>,
    to_engine: VecDeque<Vec<u8>>,
    /// The frames the engine received, as an `engine_frames` input (when
    /// recording).
    pub record: Option<Vec<u8>>,
}

impl Recorder {
    /// A fresh engine at the start of the clock, recording.
    pub fn recording() -> Self {
        let mut world = Self::around(engine::engine(), START);
        world.record = Some(Vec::new());
        world
    }

    /// `engine` at time `now`, not recording.
    pub fn around(engine: FuzzEngine, now: u64) -> Self {
        Self {
            engine,
            now,
            step: 0,
            last_recorded: 0,
            clients: Vec::new(),
            raws: Vec::new(),
            to_engine: VecDeque::new(),
            record: None,
        }
    }

    /// Adds a client node at 10.77.0.`host` (the engine accepts queue
    /// depths up to 8); returns its index.
    pub fn add_client(&mut self, host: u8) -> usize {
        self.clients.push(Node::new(
            [0x52, 0x54, 0x00, 0x77, 0x00, host],
            [10, 77, 0, host],
            8,
            7,
        ));
        self.clients.len() - 1
    }

    /// Adds a client node as [`add_client`](Self::add_client) does, its
    /// HCA holding only what one session with ad-hoc IO of up to
    /// [`LIGHT_IO`] bytes needs (a 1 MiB pool instead of 4 MiB, a buffer
    /// of [`clients::ADHOC`] + [`LIGHT_IO`] bytes instead of 1 MiB): the
    /// healthy session `engine_frames` runs after every input, where
    /// zeroing the full pool cost a third of the input's time. Same client
    /// configuration; its own key seed ([`LIGHT_SEED`]). Returns its index.
    pub fn add_light_client(&mut self, host: u8) -> usize {
        self.clients.push(light_node(
            [0x52, 0x54, 0x00, 0x77, 0x00, host],
            [10, 77, 0, host],
            8,
            LIGHT_SEED,
        ));
        self.clients.len() - 1
    }

    fn note(&mut self, frame: &[u8]) {
        let Some(record) = self.record.as_mut() else {
            return;
        };
        let mut gap = self.step - self.last_recorded;
        while gap > MAX_DELAY {
            engine::push_record(record, MAX_DELAY as u8, &[], false);
            gap -= MAX_DELAY;
        }
        engine::push_record(record, gap as u8, frame, false);
        self.last_recorded = self.step;
    }
}

impl Fabric for Recorder {
    fn now(&self) -> u64 {
        self.now
    }

    fn server(&self) -> SocketAddr {
        "10.77.0.1:1234".parse().unwrap()
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

    /// As the engine tests' `World::step`: the clock moves one step, the
    /// engine takes the queued frames and polls, the clients take its
    /// frames and poll.
    fn step(&mut self) {
        self.now += STEP;
        self.step += 1;
        let now = self.now;
        while let Some(frame) = self.to_engine.pop_front() {
            self.note(&frame);
            self.engine.receive(0, now, &frame);
        }
        let clients = &mut self.clients;
        self.engine
            .poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut frame = h.to_vec();
                for piece in p {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(t);
                let broadcast = frame[..6] == [0xff; 6];
                for node in clients.iter_mut() {
                    if broadcast || node.mac == frame[..6] {
                        node.inbox.push_back(frame.clone());
                    }
                }
            });
        let to_engine = &mut self.to_engine;
        for node in self.clients.iter_mut() {
            while let Some(frame) = node.inbox.pop_front() {
                node.receive(now, &frame);
            }
            node.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                let mut frame = h.to_vec();
                for piece in p {
                    frame.extend_from_slice(piece);
                }
                frame.extend_from_slice(t);
                to_engine.push_back(frame);
            });
        }
    }

    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..MAX_STEPS {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!(
            "timed out waiting for {what}\n{}\nusage {:?}",
            self.engine.stats(),
            self.engine.server().usage()
        );
    }
}

/// `clients::Node::new` with a [`LIGHT_POOL`]-byte pool and a buffer
/// just past [`clients::ADHOC`] + [`LIGHT_IO`] (the client configuration and
/// uuid derivation are `Node::new`'s).
fn light_node(mac: [u8; 6], ip: [u8; 4], max_queue_depth: u16, seed: u64) -> Node {
    let mut hca: clients::ClientHca =
        Hca::new(vec![0u8; LIGHT_POOL], Keys(seed), HcaConfig { mac, ip });
    let handle = hca
        .alloc(clients::ADHOC + LIGHT_IO, 4096)
        .expect("light node buffer");
    let buffer = hca
        .reg_mr(
            handle,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .expect("light node region");
    let mut uuid_seed = [0u8; 16];
    uuid_seed[..8].copy_from_slice(&(seed << 8 | u64::from(ip[3])).to_le_bytes());
    uuid_seed[8..].copy_from_slice(&0x5555_0000_0000_0000u64.to_le_bytes());
    let mut config = ClientConfig::default_with_seed(uuid_seed);
    config.max_queue_depth = max_queue_depth;
    config.max_paths = 1;
    config.max_connections_per_path = 4;
    config.max_header_len = 1024;
    let client = Client::new(hca, config).expect("light node client");
    Node {
        client,
        mac,
        alive: true,
        events: Vec::with_capacity(256),
        inbox: VecDeque::with_capacity(1024),
        buffer,
        workload: None,
    }
}
