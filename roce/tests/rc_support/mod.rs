//! Test kit for the RC transport: two HCAs over a simulated, seeded link.
//!
//! A [`Pair`] holds two software HCAs, each with one RC QP connected to the
//! other, and a link per direction that delays, drops, duplicates,
//! reorders or corrupts frames as a per-frame [`Verdict`] function decides.
//! Time is virtual (ns): [`Pair::step`] polls both HCAs, delivers due frames
//! and jumps the clock to the next event, so timeouts of seconds cost nothing.
#![allow(dead_code)]

use std::collections::BTreeMap;

use roce::hca::{Hca, HcaConfig, LinkMode};
use roce::qp::{QpParams, QpState};
use roce::types::{Mtu, Psn};
use roce::wire::{parse_frame, RoceFrame};
use roce::HcaCapacity;
use verbs::{AccessFlags, ConnId, KeySource};

/// Key source for tests: splitmix64, seeded.
pub struct TestKeys(pub u64);

impl KeySource for TestKeys {
    fn next_u32(&mut self) -> u32 {
        (splitmix(&mut self.0) >> 32) as u32
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small seeded RNG.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        splitmix(&mut self.0)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// The HCA type of the tests: 64 regions, 4 QPs, 4096 completions.
pub type TestHca = Hca<Vec<u8>, TestKeys, 64, 4, 4096>;

/// One side: its HCA and its QP.
pub struct Endpoint {
    pub hca: Box<TestHca>,
    pub conn: ConnId,
    pub mac: [u8; 6],
    pub ip: [u8; 4],
}

/// What the link does with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver after the base latency.
    Deliver,
    /// Lose it.
    Drop,
    /// Deliver twice.
    Duplicate,
    /// Deliver after this many extra ns (reordering).
    Delay(u64),
    /// Flip a byte of it (the ICRC check must catch it).
    Corrupt,
    /// Hold it until just after the next frame of the same direction, or
    /// [`HOLD_LIMIT_NS`] at most: the reordering of the xtask frame relay.
    Hold,
}

/// How long a [`Verdict::Hold`] frame waits for a successor (the relay's
/// `REORDER_HOLD`).
pub const HOLD_LIMIT_NS: u64 = 50_000_000;

/// Direction index: 0 = A to B, 1 = B to A.
pub const A_TO_B: usize = 0;
/// Direction index: 1 = B to A.
pub const B_TO_A: usize = 1;

/// The per-frame fault decision: (direction, parsed frame, rng) -> verdict.
pub type Filter = Box<dyn FnMut(usize, &RoceFrame<'_>, &mut Rng) -> Verdict>;

/// Connection settings of a pair.
#[derive(Debug, Clone, Copy)]
pub struct PairConfig {
    pub mtu: Mtu,
    pub psn_a: Psn,
    pub psn_b: Psn,
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub memory: usize,
    pub latency_ns: u64,
    pub seed: u64,
    /// Both QPs run Brick's selective retransmission.
    pub selective: bool,
    /// Reorder buffers of each HCA's pool (`None`: the default).
    pub reorder_buffers: Option<usize>,
    /// Both HCAs take their fast paths (the default; off only to show
    /// they change nothing).
    pub fast_paths: bool,
}

impl Default for PairConfig {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            psn_a: Psn::new(1000),
            psn_b: Psn::new(0x00ab_cdef),
            ack_timeout: 10,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            memory: 1 << 20,
            latency_ns: 2_000,
            seed: 1,
            selective: false,
            reorder_buffers: None,
            fast_paths: true,
        }
    }
}

/// Two connected endpoints and the link between them.
pub struct Pair {
    pub a: Endpoint,
    pub b: Endpoint,
    pub now: u64,
    pub latency_ns: u64,
    /// Frames in flight per direction: (delivery time, sequence) -> frame.
    links: [BTreeMap<(u64, u64), Vec<u8>>; 2],
    seq: u64,
    pub rng: Rng,
    pub filter: Filter,
    /// Every frame sent, per direction, when `record` is set.
    pub record: bool,
    pub sent: [Vec<Vec<u8>>; 2],
    /// Keep each direction in order: a frame delayed by the filter holds
    /// back the frames sent after it (jitter without reordering).
    pub fifo: bool,
    /// Latest delivery time scheduled per direction (for `fifo`).
    last_delivery: [u64; 2],
    /// Serialization time per byte in picoseconds (0: unlimited
    /// bandwidth). A frame occupies its direction's link for
    /// `len · byte_time_ps` after the previous one, then travels
    /// `latency_ns`; a dropped frame still used the link.
    pub byte_time_ps: u64,
    /// When each direction's link is free again (ns).
    link_free: [u64; 2],
    /// The key of the frame held per direction ([`Verdict::Hold`]).
    held: [Option<(u64, u64)>; 2],
}

fn endpoint(memory: usize, seed: u64, last: u8, reorder_buffers: Option<usize>) -> Endpoint {
    let mac = [0x52, 0x54, 0, 0x77, 0, last];
    let ip = [10, 77, 0, last];
    let mut capacity = HcaCapacity::from_const::<64, 4, 4096>();
    if let Some(buffers) = reorder_buffers {
        capacity.reorder_buffers = buffers;
    }
    let mut hca = Box::new(
        TestHca::with_capacity(
            vec![0u8; memory],
            TestKeys(seed),
            HcaConfig { mac, ip },
            LinkMode::Ethernet,
            capacity,
        )
        .expect("test capacity"),
    );
    let conn = hca.create_qp().expect("qp");
    Endpoint { hca, conn, mac, ip }
}

pub fn params(local: &Endpoint, peer: &Endpoint, config: &PairConfig, a_side: bool) -> QpParams {
    let qpn = local.hca.qpn(local.conn).unwrap();
    let (send_psn, recv_psn) = if a_side {
        (config.psn_a, config.psn_b)
    } else {
        (config.psn_b, config.psn_a)
    };
    QpParams {
        peer_qpn: peer.hca.qpn(peer.conn).unwrap(),
        send_psn,
        recv_psn,
        mtu: config.mtu,
        local_ack_timeout: config.ack_timeout,
        retry_count: config.retry_count,
        rnr_retry: config.rnr_retry,
        min_rnr_timer: config.min_rnr_timer,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        remote_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path: local.hca.path_to(qpn, peer.mac, peer.ip),
        selective_retransmission: config.selective,
    }
}

impl Pair {
    pub fn new(config: PairConfig) -> Self {
        let mut a = endpoint(
            config.memory,
            config.seed.wrapping_mul(3) + 1,
            1,
            config.reorder_buffers,
        );
        let mut b = endpoint(
            config.memory,
            config.seed.wrapping_mul(5) + 2,
            2,
            config.reorder_buffers,
        );
        a.hca.set_fast_paths(config.fast_paths);
        b.hca.set_fast_paths(config.fast_paths);
        let pa = params(&a, &b, &config, true);
        let pb = params(&b, &a, &config, false);
        a.hca.connect_qp(a.conn, pa).unwrap();
        b.hca.connect_qp(b.conn, pb).unwrap();
        assert_eq!(a.hca.qp_state(a.conn), Some(QpState::Rts));
        Self {
            a,
            b,
            now: 0,
            latency_ns: config.latency_ns,
            links: [BTreeMap::new(), BTreeMap::new()],
            seq: 0,
            rng: Rng(config.seed ^ 0x5eed),
            filter: Box::new(|_, _, _| Verdict::Deliver),
            record: false,
            sent: [Vec::new(), Vec::new()],
            fifo: false,
            last_delivery: [0; 2],
            byte_time_ps: 0,
            link_free: [0; 2],
            held: [None; 2],
        }
    }

    pub fn side(&mut self, dir: usize) -> &mut Endpoint {
        if dir == A_TO_B {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// Polls both HCAs until they have nothing to send now, passing frames
    /// through the filter onto the links.
    fn transmit(&mut self) {
        for dir in [A_TO_B, B_TO_A] {
            for _ in 0..100_000 {
                let mut frames: Vec<Vec<u8>> = Vec::new();
                let now = self.now;
                let endpoint = if dir == A_TO_B {
                    &mut self.a
                } else {
                    &mut self.b
                };
                let busy = endpoint
                    .hca
                    .poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                        let mut frame = h.to_vec();
                        for piece in p {
                            frame.extend_from_slice(piece);
                        }
                        frame.extend_from_slice(t);
                        frames.push(frame);
                    });
                for frame in frames {
                    self.enqueue(dir, frame);
                }
                if !busy {
                    break;
                }
            }
        }
    }

    fn enqueue(&mut self, dir: usize, mut frame: Vec<u8>) {
        if self.record {
            self.sent[dir].push(frame.clone());
        }
        let verdict = match parse_frame(&frame) {
            Ok(parsed) => (self.filter)(dir, &parsed, &mut self.rng),
            Err(error) => panic!("HCA sent an unparsable frame: {error}"),
        };
        let mut at = self.now + self.latency_ns;
        if self.byte_time_ps > 0 {
            let start = self.now.max(self.link_free[dir]);
            let done = start + (frame.len() as u64 * self.byte_time_ps).div_ceil(1000);
            self.link_free[dir] = done;
            at = done + self.latency_ns;
        }
        let fifo = self.fifo;
        let last_delivery = &mut self.last_delivery[dir];
        let mut push = |links: &mut [BTreeMap<(u64, u64), Vec<u8>>; 2], at: u64, frame: Vec<u8>| {
            let at = if fifo { at.max(*last_delivery) } else { at };
            *last_delivery = (*last_delivery).max(at);
            self.seq += 1;
            links[dir].insert((at, self.seq), frame);
        };
        // A held frame goes right after this one (whatever this one's fate).
        let release = self.held[dir].take();
        let mut hold_key = None;
        match verdict {
            Verdict::Hold if release.is_none() => {
                self.seq += 1;
                let key = (self.now + HOLD_LIMIT_NS, self.seq);
                self.links[dir].insert(key, frame);
                hold_key = Some(key);
            }
            Verdict::Deliver | Verdict::Hold => push(&mut self.links, at, frame),
            Verdict::Drop => {}
            Verdict::Duplicate => {
                push(&mut self.links, at, frame.clone());
                push(&mut self.links, at + 1, frame);
            }
            Verdict::Delay(extra) => push(&mut self.links, at + extra, frame),
            Verdict::Corrupt => {
                let index = 14 + self.rng.below((frame.len() - 14) as u64) as usize;
                frame[index] ^= 1 << self.rng.below(8);
                push(&mut self.links, at, frame);
            }
        }
        if let Some(key) = release {
            if let Some(held) = self.links[dir].remove(&key) {
                self.seq += 1;
                let after = at.max(self.now) + 1;
                self.links[dir].insert((after, self.seq), held);
            }
        }
        self.held[dir] = hold_key;
    }

    /// Delivers every frame due at `now`.
    fn deliver(&mut self) {
        for dir in [A_TO_B, B_TO_A] {
            while let Some(entry) = self.links[dir].first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let frame = entry.remove();
                let now = self.now;
                let target = if dir == A_TO_B {
                    &mut self.b
                } else {
                    &mut self.a
                };
                target.hca.receive(now, &frame);
            }
        }
    }

    /// The next time something happens, if anything is scheduled.
    pub fn next_event(&self) -> Option<u64> {
        let link = self
            .links
            .iter()
            .filter_map(|link| link.keys().next().map(|key| key.0))
            .min();
        let a = self.a.hca.poll_at(self.now);
        let b = self.b.hca.poll_at(self.now);
        [link, a, b].into_iter().flatten().min()
    }

    /// Sends what is due, delivers what arrived, sends the answers.
    pub fn exchange(&mut self) {
        self.transmit();
        self.deliver();
        self.transmit();
    }

    /// Moves the clock to the next event; false if nothing is scheduled.
    pub fn advance(&mut self) -> bool {
        match self.next_event() {
            Some(at) => {
                self.now = self.now.max(at);
                true
            }
            None => false,
        }
    }

    /// One round: exchange, then advance the clock to the next event.
    /// Returns false if nothing at all is scheduled (idle or stalled).
    pub fn step(&mut self) -> bool {
        self.exchange();
        self.advance()
    }

    /// Runs rounds until `done` holds (true) or nothing is scheduled / the
    /// virtual time limit passes (false). `done` is checked after each
    /// exchange, before the clock moves.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        loop {
            self.exchange();
            if done(self) {
                return true;
            }
            if self.now > limit_ns || !self.advance() {
                return done(self);
            }
        }
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.links.iter().map(BTreeMap::len).sum()
    }
}
