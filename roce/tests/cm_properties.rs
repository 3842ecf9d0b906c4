//! Property tests: `roce::cm` never panics on network input, whatever the bytes,
//! and stays within its bounds (checklist B: malformed MADs are dropped).

use proptest::prelude::*;
use roce::cm::{Cm, Config, ConnectParams, Event, LocalQp, PeerAddr, Route, State};
use roce::types::{Mtu, Psn, Qpn};
use roce::wire::{EthernetAddress, Ipv4Address};

fn route() -> Route {
    Route {
        local_ip: Ipv4Address::new(10, 0, 0, 1),
        peer: PeerAddr {
            mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ip: Ipv4Address::new(10, 0, 0, 2),
        },
    }
}

/// A passive CM with one accepted connection and an active CM with one REQ out,
/// so that messages with matching comm IDs reach every state handler.
fn setup(seed: u32) -> (Cm<3>, Vec<u32>, impl FnMut() -> u32) {
    let mut state = seed | 1;
    let mut rng = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let mut cm = Cm::<3>::new(Config::new(1));
    cm.listen(1234).unwrap();
    let qp = LocalQp {
        qpn: Qpn::new(0x11),
        starting_psn: Psn::new(1),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
    };
    let params = ConnectParams {
        route: route(),
        port: 1234,
        src_port: 5,
        qp,
        path_mtu: Mtu::Mtu1024,
        retry_count: 7,
        traffic_class: 0,
        hop_limit: 64,
        private_data: b"x",
    };
    let mut peer = Cm::<1>::new(Config::new(2));
    peer.connect(0, &mut rng, &params).unwrap();
    let req = peer.dispatch().unwrap();
    cm.process_mad(0, &mut rng, route(), &req.mad);
    let conn = match cm.poll_event() {
        Some(Event::ConnectRequest { conn, .. }) => conn,
        other => panic!("{other:?}"),
    };
    cm.accept(
        0,
        conn,
        LocalQp {
            qpn: Qpn::new(0x20),
            ..qp
        },
        &[],
    )
    .unwrap();
    cm.connect(0, &mut rng, &params).unwrap();
    let mut ids = Vec::new();
    while let Some(out) = cm.dispatch() {
        ids.push(u32::from_be_bytes(out.mad[24..28].try_into().unwrap()));
    }
    ids.push(u32::from_be_bytes(req.mad[24..28].try_into().unwrap()));
    (cm, ids, rng)
}

fn drain(cm: &mut Cm<3>) {
    // Bounded: a handful of events and MADs at most per input.
    for _ in 0..64 {
        if cm.poll_event().is_none() && cm.dispatch().is_none() {
            return;
        }
    }
    panic!("outputs did not drain");
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (mut cm, _, mut rng) = setup(7);
        cm.process_mad(1, &mut rng, route(), &bytes);
        drain(&mut cm);
    }

    /// Well-formed CM headers with arbitrary bodies; the comm IDs are often those
    /// of live connections, so every handler and state sees garbage.
    #[test]
    fn arbitrary_cm_bodies_never_panic(
        seed in any::<u32>(),
        inputs in proptest::collection::vec(
            (0x10u16..=0x16, proptest::collection::vec(any::<u8>(), 232), any::<u8>(), any::<u8>(), 0u64..200_000_000_000),
            1..12,
        ),
    ) {
        let (mut cm, ids, mut rng) = setup(seed);
        let mut now = 0;
        for (attr, body, a, b, dt) in inputs {
            let mut mad = [0u8; 256];
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
            mad[16..18].copy_from_slice(&attr.to_be_bytes());
            mad[24..].copy_from_slice(&body);
            if attr == 0x10 && a % 3 == 0 {
                // A REQ for the listened port, RC: reaches the stateful checks.
                mad[32..40].copy_from_slice(&0x0106_04d2u64.to_be_bytes());
                mad[67] &= !0x06;
            }
            if a % 2 == 0 {
                mad[24..28].copy_from_slice(&ids[usize::from(a) % ids.len()].to_be_bytes());
            }
            if b % 2 == 0 {
                mad[28..32].copy_from_slice(&ids[usize::from(b) % ids.len()].to_be_bytes());
            }
            cm.process_mad(now, &mut rng, route(), &mad);
            drain(&mut cm);
            now += dt;
            cm.poll(now);
            drain(&mut cm);
        }
    }
}

/// One direction of a faulty link: drops, duplicates and swaps neighbours.
struct Faults {
    state: u32,
    drop_pct: u32,
    dup_pct: u32,
    reorder: bool,
}

impl Faults {
    fn roll(&mut self) -> u32 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        self.state % 100
    }

    /// Takes everything `from` wants to send and returns what arrives, in order.
    fn carry<const N: usize>(&mut self, from: &mut Cm<N>) -> Vec<[u8; 256]> {
        let mut arriving = Vec::new();
        while let Some(out) = from.dispatch() {
            if self.roll() < self.drop_pct {
                continue;
            }
            arriving.push(out.mad);
            if self.roll() < self.dup_pct {
                arriving.push(out.mad);
            }
        }
        if self.reorder && arriving.len() > 1 && self.roll() < 50 {
            let last = arriving.len() - 1;
            arriving.swap(0, last);
        }
        arriving
    }
}

fn other_side(route: Route) -> Route {
    Route {
        local_ip: route.peer.ip,
        peer: PeerAddr {
            mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            ip: route.local_ip,
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Connect, establish and disconnect through a link with losses, duplicates
    /// and reordering: every step happens exactly once on each side, through
    /// retransmissions and duplicate handling alone.
    #[test]
    fn handshake_and_teardown_survive_a_faulty_link(
        seed in 1u32..,
        drop_pct in 0u32..30,
        dup_pct in 0u32..30,
        reorder in any::<bool>(),
        server_closes in any::<bool>(),
        data_establishes in any::<bool>(),
    ) {
        let mut rng = { let mut x = seed; move || { x ^= x << 13; x ^= x >> 17; x ^= x << 5; x } };
        let mut c2s = Faults { state: seed ^ 0x5555_5555 | 1, drop_pct, dup_pct, reorder };
        let mut s2c = Faults { state: seed ^ 0xaaaa_aaaa | 1, drop_pct, dup_pct, reorder };
        let mut server = Cm::<2>::new(Config::new(1));
        server.listen(1234).unwrap();
        let mut client = Cm::<2>::new(Config::new(2));
        let client_route = other_side(route());
        let qp = |qpn| LocalQp {
            qpn: Qpn::new(qpn),
            starting_psn: Psn::new(1),
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 7,
            srq: false,
        };
        let client_conn = client
            .connect(0, &mut rng, &ConnectParams {
                route: client_route,
                port: 1234,
                src_port: 9,
                qp: qp(0x11),
                path_mtu: Mtu::Mtu1024,
                retry_count: 7,
                traffic_class: 0,
                hop_limit: 64,
                private_data: &[],
            })
            .unwrap();
        let mut server_conn = None;
        let (mut requests, mut replies, mut server_up, mut client_down, mut server_down) =
            (0, 0, 0, 0, 0);
        let mut closing = false;
        let mut now = 0u64;
        for _ in 0..5_000 {
            let to_server = c2s.carry(&mut client);
            let to_client = s2c.carry(&mut server);
            let idle = to_server.is_empty() && to_client.is_empty();
            for mad in to_server {
                server.process_mad(now, &mut rng, route(), &mad);
            }
            for mad in to_client {
                client.process_mad(now, &mut rng, client_route, &mad);
            }
            while let Some(event) = server.poll_event() {
                match event {
                    Event::ConnectRequest { conn, .. } => {
                        requests += 1;
                        server_conn = Some(conn);
                        server.accept(now, conn, qp(0x40), &[]).unwrap();
                    }
                    Event::Established { .. } => server_up += 1,
                    Event::Disconnected { .. } => server_down += 1,
                    other => prop_assert!(false, "server: {:?}", other),
                }
            }
            while let Some(event) = client.poll_event() {
                match event {
                    Event::Reply { conn, .. } => {
                        replies += 1;
                        client.ready_to_use(conn).unwrap();
                    }
                    Event::Disconnected { .. } => client_down += 1,
                    other => prop_assert!(false, "client: {:?}", other),
                }
            }
            let client_up = client.state(client_conn) == Some(State::Established);
            if data_establishes && client_up && server_up == 0 {
                // The client's first data packet reached the server's QP.
                if let Some(conn) = server_conn {
                    server.notify_data_received(conn).unwrap();
                }
            }
            if client_up && server_up == 1 && !closing {
                closing = true;
                if server_closes {
                    server.disconnect(now, &mut rng, server_conn.unwrap()).unwrap();
                } else {
                    client.disconnect(now, &mut rng, client_conn).unwrap();
                }
            }
            if client_down == 1 && server_down == 1 {
                break;
            }
            if idle {
                let next = [client.poll_at(), server.poll_at()].into_iter().flatten().min();
                if let Some(at) = next {
                    now = now.max(at);
                }
                client.poll(now);
                server.poll(now);
            }
        }
        prop_assert_eq!((requests, replies, server_up), (1, 1, 1));
        prop_assert_eq!((client_down, server_down), (1, 1));
    }
}
