//! The IB CM / RDMA CM state machine (`roce::cm::Cm`): a passive CM
//! (listening, the target's side) and an active one (the client's) joined
//! by a lossy, mutating wire, driven by a script of operations: connects,
//! MAD deliveries (as sent, mutated, dropped, replayed), raw MADs, the
//! consumer's answers (accept, reject, MRA, RTU, disconnect, "first data
//! packet"), time jumps.
//!
//! Invariants: no panic; every established connection's local QPN maps
//! back to it (`conn_by_qpn`) and is reported in use; the statistics
//! never go backwards; events and MADs come out in bounded numbers.
#![no_main]

use std::collections::VecDeque;

use brick_fuzz::script::Script;
use libfuzzer_sys::fuzz_target;
use roce::cm::{
    Cm, Config, ConnId, ConnectParams, Event, LocalQp, PeerAddr, RejectReason, Route, State,
    MAD_LEN,
};
use roce::types::{Mtu, Psn, Qpn};
use roce::wire::{EthernetAddress, Ipv4Address};

/// Connections per CM (small: the tables fill up).
const CONNS: usize = 4;
/// Events or MADs one drain may see before the CM is deemed to flood.
const FLOOD: usize = 256;

fn route(local: u8, peer: u8) -> Route {
    Route {
        local_ip: Ipv4Address::new(10, 77, 0, local),
        peer: PeerAddr {
            mac: EthernetAddress([0x52, 0x54, 0, 0x77, 0, peer]),
            ip: Ipv4Address::new(10, 77, 0, peer),
        },
    }
}

fn local_qp(qpn: u32, script: &mut Script<'_>) -> LocalQp {
    LocalQp {
        qpn: Qpn::new_truncate(qpn),
        starting_psn: Psn::new_truncate(script.u32()),
        responder_resources: script.below(8),
        initiator_depth: script.below(8),
        rnr_retry_count: script.below(8),
        srq: false,
    }
}

struct Side {
    cm: Cm<CONNS>,
    route: Route,
    /// MADs sent and not yet delivered, with their route.
    wire: VecDeque<[u8; MAD_LEN]>,
    /// The last MAD delivered to this side (for replays and mutations).
    last_in: Option<[u8; MAD_LEN]>,
    /// Connections named by events (requests, replies, established).
    conns: Vec<ConnId>,
    stats: roce::cm::Stats,
}

impl Side {
    fn new(guid: u64, route: Route) -> Self {
        Self {
            cm: Cm::new(Config::new(guid)),
            route,
            wire: VecDeque::new(),
            last_in: None,
            conns: Vec::new(),
            stats: roce::cm::Stats::default(),
        }
    }

    /// Moves its MADs onto the wire and takes its events.
    fn drain(&mut self) {
        for _ in 0..FLOOD {
            let Some(out) = self.cm.dispatch() else {
                break;
            };
            if self.wire.len() < 64 {
                self.wire.push_back(out.mad);
            }
        }
        let mut events = 0;
        while let Some(event) = self.cm.poll_event() {
            events += 1;
            assert!(events < FLOOD, "the CM emits events without end");
            match event {
                Event::ConnectRequest { conn, .. }
                | Event::Reply { conn, .. }
                | Event::Established { conn }
                    if !self.conns.contains(&conn) =>
                {
                    self.conns.push(conn);
                }
                _ => {}
            }
        }
        self.check();
    }

    fn check(&mut self) {
        let stats = self.cm.stats();
        let before = self.stats;
        assert!(
            stats.malformed >= before.malformed
                && stats.unmatched >= before.unmatched
                && stats.rejected_requests >= before.rejected_requests
                && stats.stateless_dropped >= before.stateless_dropped
                && stats.retransmissions >= before.retransmissions,
            "CM statistics went backwards: {before:?} -> {stats:?}"
        );
        self.stats = stats;
        for &conn in &self.conns {
            if self.cm.state(conn) == Some(State::Established) {
                let qpn = self
                    .cm
                    .local_qpn(conn)
                    .expect("an established connection has a local QPN");
                assert_eq!(
                    self.cm.conn_by_qpn(qpn),
                    Some(conn),
                    "QPN {qpn:?} of established {conn:?} maps elsewhere"
                );
                assert!(
                    self.cm.qpn_in_use(qpn),
                    "QPN {qpn:?} of {conn:?} not in use"
                );
            }
        }
    }

    fn pick(&self, script: &mut Script<'_>) -> Option<ConnId> {
        if self.conns.is_empty() {
            return None;
        }
        let at = usize::from(script.u8()) % self.conns.len();
        Some(self.conns[at])
    }
}

fn reason(script: &mut Script<'_>) -> RejectReason {
    RejectReason::from(u16::from(script.u8()))
}

fuzz_target!(|input: &[u8]| {
    let mut script = Script::new(input);
    let mut rng_state = 0x9e37_79b9u32 | u32::from(script.u8());
    let mut rng = move || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 17;
        rng_state ^= rng_state << 5;
        rng_state
    };
    let mut server = Side::new(1, route(1, 2));
    let mut client = Side::new(2, route(2, 1));
    server.cm.listen(1234).unwrap();
    let mut now = 1_000_000u64;
    let mut next_qpn = 0x11u32;
    let mut private = [0u8; 64];
    while !script.done() {
        let op = script.below(14);
        match op {
            0 => {
                let len = usize::from(script.below(57));
                for byte in private.iter_mut().take(len) {
                    *byte = script.u8();
                }
                next_qpn += 1;
                let params = ConnectParams {
                    route: client.route,
                    port: if script.u8() < 240 { 1234 } else { 4321 },
                    src_port: script.u16(),
                    qp: local_qp(next_qpn, &mut script),
                    path_mtu: Mtu::Mtu1024,
                    retry_count: script.below(8),
                    traffic_class: 0,
                    hop_limit: 64,
                    private_data: &private[..len],
                };
                if let Ok(conn) = client.cm.connect(now, &mut rng, &params) {
                    client.conns.push(conn);
                }
            }
            // Deliver (1, 2), mutate then deliver (3, 4), drop (5).
            1..=4 => {
                let (from, to) = if op % 2 == 1 {
                    (&mut client, &mut server)
                } else {
                    (&mut server, &mut client)
                };
                if let Some(mut mad) = from.wire.pop_front() {
                    if op >= 3 {
                        for _ in 0..=script.below(4) {
                            let at = usize::from(script.u8());
                            mad[at] ^= script.u8();
                        }
                    }
                    to.cm.process_mad(now, &mut rng, to.route, &mad);
                    to.last_in = Some(mad);
                }
            }
            5 => {
                let side = if script.u8() & 1 == 0 {
                    &mut client
                } else {
                    &mut server
                };
                side.wire.pop_front();
            }
            // Replay the last MAD a side received (duplicates, stale ids).
            6 => {
                let side = if script.u8() & 1 == 0 {
                    &mut client
                } else {
                    &mut server
                };
                if let Some(mad) = side.last_in {
                    side.cm.process_mad(now, &mut rng, side.route, &mad);
                }
            }
            // A MAD of raw bytes to the passive side.
            7 => {
                let mut mad = [0u8; MAD_LEN];
                let bytes = script.bytes(MAD_LEN);
                mad[..bytes.len()].copy_from_slice(bytes);
                mad[0] = 1; // base version, so the CM header is read on
                server.cm.process_mad(now, &mut rng, server.route, &mad[..]);
            }
            8 => {
                if let Some(conn) = server.pick(&mut script) {
                    next_qpn += 1;
                    let qp = local_qp(0x100 + next_qpn, &mut script);
                    let data = script.bytes(200);
                    let _ = server.cm.accept(now, conn, qp, data);
                }
            }
            9 => {
                let side = if script.u8() & 1 == 0 {
                    &mut client
                } else {
                    &mut server
                };
                if let Some(conn) = side.pick(&mut script) {
                    let why = reason(&mut script);
                    let data = script.bytes(160);
                    let _ = side.cm.reject(now, conn, why, data);
                }
            }
            10 => {
                if let Some(conn) = server.pick(&mut script) {
                    let timeout = script.u8();
                    let _ = server.cm.delay(now, conn, timeout);
                }
            }
            11 => {
                if let Some(conn) = client.pick(&mut script) {
                    let _ = client.cm.ready_to_use(conn);
                }
            }
            12 => {
                let side = if script.u8() & 1 == 0 {
                    &mut client
                } else {
                    &mut server
                };
                if let Some(conn) = side.pick(&mut script) {
                    if script.u8() & 1 == 0 {
                        let _ = side.cm.disconnect(now, &mut rng, conn);
                    } else {
                        let _ = side.cm.notify_data_received(conn);
                    }
                }
            }
            _ => {
                let ms = u64::from(script.u8()).pow(2);
                now += ms * 1_000_000 + 1;
                client.cm.poll(now);
                server.cm.poll(now);
            }
        }
        client.drain();
        server.drain();
    }
});
