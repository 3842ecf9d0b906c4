//! Test kit for the CM-wired HCA: two `Hca`s over a simulated link.
//!
//! [`Net`] holds two HCAs (side 0 = client 10.0.0.2, side 1 = server
//! 10.0.0.1) and a link that asks a per-frame [`Verdict`] function what to do
//! with each frame. Time is virtual (ns): [`Net::step`] polls both HCAs,
//! delivers due frames and jumps the clock to the next event, so CM timeouts
//! of seconds cost nothing. Connection events and completions are collected
//! per side.
#![allow(dead_code)]

use std::collections::BTreeMap;

use roce::hca::{Hca, HcaConfig};
use verbs::{AccessFlags, CmEvent, KeySource, MemoryRegion, Verbs, WorkCompletion};

/// Key source for tests: splitmix64, seeded.
pub struct TestKeys(pub u64);

impl KeySource for TestKeys {
    fn next_u32(&mut self) -> u32 {
        (splitmix(&mut self.0) >> 32) as u32
    }
}

/// splitmix64.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The HCA of the tests: 64 regions, 4 QPs, 4096 completions.
pub type TestHca = Hca<Vec<u8>, TestKeys, 64, 4, 4096>;

/// Side 0's addresses (the client).
pub const CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x02];
/// Side 0's IPv4 address.
pub const CLIENT_IP: [u8; 4] = [10, 0, 0, 2];
/// Side 1's addresses (the server).
pub const SERVER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];
/// Side 1's IPv4 address.
pub const SERVER_IP: [u8; 4] = [10, 0, 0, 1];

/// A new boxed HCA with 1 MiB of registered memory.
pub fn new_hca(mac: [u8; 6], ip: [u8; 4], seed: u64) -> Box<TestHca> {
    Box::new(Hca::new(
        vec![0u8; 1 << 20],
        TestKeys(seed),
        HcaConfig { mac, ip },
    ))
}

/// A 4 KiB buffer registered for every access.
pub fn region(hca: &mut TestHca) -> MemoryRegion {
    let handle = hca.alloc(4096, 64).expect("alloc");
    hca.reg_mr(
        handle,
        AccessFlags::LOCAL_WRITE
            .union(AccessFlags::REMOTE_WRITE)
            .union(AccessFlags::REMOTE_READ),
    )
    .expect("reg_mr")
}

/// What the link does with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver after the base latency.
    Deliver,
    /// Lose it.
    Drop,
}

/// The CM attribute ID of a QP1 frame, if it is one.
pub fn cm_attribute(frame: &[u8]) -> Option<u16> {
    // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + DETH 8 = 62; attribute at +16.
    if frame.len() != 322 || frame.get(12..14) != Some(&[0x08, 0x00]) {
        return None;
    }
    let dest_qp = &frame[42 + 5..42 + 8];
    if dest_qp != [0, 0, 1] {
        return None;
    }
    Some(u16::from_be_bytes([frame[62 + 16], frame[62 + 17]]))
}

/// CM attribute IDs (ib-cm.md §4).
pub mod attr {
    /// REQ.
    pub const REQ: u16 = 0x10;
    /// REJ.
    pub const REJ: u16 = 0x12;
    /// REP.
    pub const REP: u16 = 0x13;
    /// RTU.
    pub const RTU: u16 = 0x14;
    /// DREQ.
    pub const DREQ: u16 = 0x15;
    /// DREP.
    pub const DREP: u16 = 0x16;
}

type VerdictFn = Box<dyn FnMut(usize, &[u8]) -> Verdict>;

/// Two HCAs and the link between them.
pub struct Net {
    /// Side 0 (client) and side 1 (server).
    pub hcas: [Box<TestHca>; 2],
    /// Virtual time, ns.
    pub now: u64,
    /// Frames in flight: (delivery time, sequence) → (to side, frame).
    in_flight: BTreeMap<(u64, u64), (usize, Vec<u8>)>,
    seq: u64,
    /// One-way latency, ns.
    pub latency: u64,
    verdict: VerdictFn,
    /// Every frame sent: (from side, frame), before the verdict.
    pub sent: Vec<(usize, Vec<u8>)>,
    /// Connection events seen per side.
    pub events: [Vec<CmEvent>; 2],
    /// Completions seen per side.
    pub completions: [Vec<WorkCompletion>; 2],
}

impl Net {
    /// Two fresh HCAs over a perfect link.
    pub fn new(seed: u64) -> Net {
        Net {
            hcas: [
                new_hca(CLIENT_MAC, CLIENT_IP, seed),
                new_hca(SERVER_MAC, SERVER_IP, seed ^ 0x5555_aaaa),
            ],
            now: 1_000_000,
            in_flight: BTreeMap::new(),
            seq: 0,
            latency: 10_000,
            verdict: Box::new(|_, _| Verdict::Deliver),
            sent: Vec::new(),
            events: [Vec::new(), Vec::new()],
            completions: [Vec::new(), Vec::new()],
        }
    }

    /// Sets the link's verdict function: `(from side, frame) -> Verdict`.
    pub fn set_verdict(&mut self, verdict: impl FnMut(usize, &[u8]) -> Verdict + 'static) {
        self.verdict = Box::new(verdict);
    }

    /// Polls both sides, collects events/completions, delivers due frames.
    /// Returns whether events or completions were collected.
    fn exchange(&mut self) -> bool {
        let before = self.collected();
        for side in 0..2 {
            let mut out: Vec<Vec<u8>> = Vec::new();
            while self.hcas[side].poll(
                self.now,
                &mut |headers: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                    let mut frame = headers.to_vec();
                    for piece in payload {
                        frame.extend_from_slice(piece);
                    }
                    frame.extend_from_slice(trailer);
                    out.push(frame);
                },
            ) {}
            for frame in out {
                if std::env::var("NET_DEBUG").is_ok() {
                    eprintln!(
                        "t={} side={side} {}",
                        self.now,
                        roce::wire::PrettyPrinter::new(&frame)
                            .to_string()
                            .lines()
                            .next()
                            .unwrap_or("")
                    );
                }
                self.sent.push((side, frame.clone()));
                if (self.verdict)(side, &frame) == Verdict::Deliver {
                    self.seq += 1;
                    self.in_flight
                        .insert((self.now + self.latency, self.seq), (1 - side, frame));
                }
            }
            while let Some(event) = self.hcas[side].poll_cm_event() {
                if std::env::var("NET_DEBUG").is_ok() {
                    eprintln!("t={} side={side} event {event:?}", self.now);
                }
                self.events[side].push(event);
            }
            let mut wcs = [WorkCompletion::default(); 16];
            loop {
                let count = self.hcas[side].poll_cq(&mut wcs);
                self.completions[side].extend_from_slice(&wcs[..count]);
                if count == 0 {
                    break;
                }
            }
        }
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (to, frame) = entry.remove();
            self.hcas[to].receive(self.now, &frame);
        }
        self.collected() != before
    }

    fn collected(&self) -> usize {
        self.events.iter().map(Vec::len).sum::<usize>()
            + self.completions.iter().map(Vec::len).sum::<usize>()
    }

    /// One step: exchange, then jump to the next event. Returns false when
    /// nothing is scheduled any more.
    pub fn step(&mut self) -> bool {
        if self.exchange() {
            // Let the test react before time moves on.
            return true;
        }
        let next = [
            self.hcas[0].poll_at(self.now),
            self.hcas[1].poll_at(self.now),
            self.in_flight.keys().next().map(|key| key.0),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(next) => {
                self.now = next.max(self.now + 1);
                true
            }
            None => false,
        }
    }

    /// Steps until `done` holds or `limit_ns` of virtual time passed.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + limit_ns;
        while self.now < end {
            if done(self) {
                return true;
            }
            if !self.step() {
                self.exchange();
                return done(self);
            }
        }
        done(self)
    }

    /// Removes and returns the first event of `side` matching `pred`.
    pub fn take_event(&mut self, side: usize, pred: impl Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let index = self.events[side].iter().position(pred)?;
        Some(self.events[side].remove(index))
    }
}
