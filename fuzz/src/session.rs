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
use clients::{Fabric, Node, RawNode};

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
