//! `roce::cm` end to end: an active and a passive `Cm` wired back to back, with
//! losses, duplicates and timeouts (ib-cm.md §4.8 and §6).

use roce::cm::{
    Cm, CmError, Config, ConnId, ConnectParams, DisconnectCause, Event, LocalQp, Outbound,
    PeerAddr, RejectReason, Route, State, Waiting, MILLISECOND,
};
use roce::types::{Mtu, Psn, Qpn};
use roce::wire::cm::{self, Message, MessageKind};
use roce::wire::{EthernetAddress, Ipv4Address};

const CLIENT_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const SERVER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const CLIENT_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);
const SERVER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const PORT: u16 = 1234;
const SERVER_QPN: Qpn = Qpn::new(0x42);
const CLIENT_QPN: Qpn = Qpn::new(0x11);
/// The passive side's REP interval for a Linux-shaped REQ (timeout exponent 20).
const REP_TIMEOUT: u64 = 4_096 * MILLISECOND;
/// The active side's REQ interval (2 × 1024 + 4096 ms).
const REQ_TIMEOUT: u64 = 6_144 * MILLISECOND;

/// A small deterministic generator (xorshift32) for comm IDs, TIDs and losses.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

impl roce::cm::Random for Rng {
    fn next_u32(&mut self) -> u32 {
        self.next()
    }
}

/// Client (active) and server (passive) CMs and a clock.
struct Pair {
    client: Cm<4>,
    server: Cm<4>,
    rng: Rng,
    now: u64,
}

fn client_route() -> Route {
    Route {
        local_ip: CLIENT_IP,
        peer: PeerAddr {
            mac: SERVER_MAC,
            ip: SERVER_IP,
        },
    }
}

fn server_route() -> Route {
    Route {
        local_ip: SERVER_IP,
        peer: PeerAddr {
            mac: CLIENT_MAC,
            ip: CLIENT_IP,
        },
    }
}

fn local_qp(qpn: Qpn, psn: u32) -> LocalQp {
    LocalQp {
        qpn,
        starting_psn: Psn::new(psn),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
    }
}

fn attribute(out: &Outbound) -> u16 {
    u16::from_be_bytes([out.mad[16], out.mad[17]])
}

const REQ: u16 = 0x10;
const MRA: u16 = 0x11;
const REJ: u16 = 0x12;
const REP: u16 = 0x13;
const RTU: u16 = 0x14;
const DREQ: u16 = 0x15;
const DREP: u16 = 0x16;

impl Pair {
    fn new() -> Pair {
        let mut server = Cm::new(Config::new(0x0200_00ff_fe00_0001));
        server.listen(PORT).unwrap();
        Pair {
            client: Cm::new(Config::new(0x0200_00ff_fe00_0002)),
            server,
            rng: Rng(0x1234_5678),
            now: 0,
        }
    }

    fn connect(&mut self, port: u16, private_data: &[u8]) -> ConnId {
        self.client
            .connect(
                self.now,
                &mut self.rng,
                &ConnectParams {
                    route: client_route(),
                    port,
                    src_port: 40_000,
                    qp: local_qp(CLIENT_QPN, 100),
                    path_mtu: Mtu::Mtu1024,
                    retry_count: 7,
                    traffic_class: 0,
                    hop_limit: 64,
                    private_data,
                },
            )
            .unwrap()
    }

    /// Client → server: the MADs the client has, each dropped if `drop` says so.
    /// Returns the attribute IDs delivered.
    fn deliver_to_server(&mut self, mut drop: impl FnMut(u16) -> bool) -> Vec<u16> {
        let mut seen = Vec::new();
        while let Some(out) = self.client.dispatch() {
            assert_eq!(out.route, client_route());
            let attr = attribute(&out);
            if !drop(attr) {
                self.server
                    .process_mad(self.now, &mut self.rng, server_route(), &out.mad);
                seen.push(attr);
            }
        }
        seen
    }

    /// Server → client, likewise.
    fn deliver_to_client(&mut self, mut drop: impl FnMut(u16) -> bool) -> Vec<u16> {
        let mut seen = Vec::new();
        while let Some(out) = self.server.dispatch() {
            assert_eq!(out.route, server_route());
            let attr = attribute(&out);
            if !drop(attr) {
                self.client
                    .process_mad(self.now, &mut self.rng, client_route(), &out.mad);
                seen.push(attr);
            }
        }
        seen
    }

    fn advance_to(&mut self, at: u64) {
        self.now = self.now.max(at);
        self.client.poll(self.now);
        self.server.poll(self.now);
    }

    /// Connects and returns (client conn, server conn) after REQ/REP, with the RTU
    /// still queued at the client.
    fn handshake_until_rtu(&mut self) -> (ConnId, ConnId) {
        let client_conn = self.connect(PORT, b"hello");
        assert_eq!(self.deliver_to_server(|_| false), [REQ]);
        let Some(Event::ConnectRequest { conn, request }) = self.server.poll_event() else {
            panic!("no request")
        };
        assert_eq!(&request.private_data.as_slice()[..5], b"hello");
        assert_eq!(request.qp.remote_qpn, CLIENT_QPN);
        assert_eq!(request.qp.send_psn, Psn::new(100));
        assert_eq!(request.port, PORT);
        assert_eq!(request.cma_src_port, 40_000);
        self.server
            .accept(self.now, conn, local_qp(SERVER_QPN, 200), b"welcome")
            .unwrap();
        assert_eq!(self.deliver_to_client(|_| false), [REP]);
        let Some(Event::Reply { conn: c, reply }) = self.client.poll_event() else {
            panic!("no reply")
        };
        assert_eq!(c, client_conn);
        assert_eq!(reply.qp.remote_qpn, SERVER_QPN);
        assert_eq!(reply.qp.send_psn, Psn::new(200));
        assert_eq!(reply.qp.ack_timeout, 19);
        assert_eq!(&reply.private_data.as_slice()[..7], b"welcome");
        assert_eq!(reply.private_data.as_slice().len(), 196);
        self.client.ready_to_use(client_conn).unwrap();
        assert_eq!(self.client.state(client_conn), Some(State::Established));
        (client_conn, conn)
    }

    fn established(&mut self) -> (ConnId, ConnId) {
        let (client_conn, server_conn) = self.handshake_until_rtu();
        assert_eq!(self.deliver_to_server(|_| false), [RTU]);
        assert_eq!(
            self.server.poll_event(),
            Some(Event::Established { conn: server_conn })
        );
        (client_conn, server_conn)
    }
}

/// The REQ of the client after a restart: a new comm ID, the same GUID and
/// QPN.
fn restarted_client_req(pair: &mut Pair) -> Outbound {
    let mut other = Cm::<1>::new(Config::new(0x0200_00ff_fe00_0002));
    other
        .connect(
            0,
            &mut pair.rng,
            &ConnectParams {
                route: client_route(),
                port: PORT,
                src_port: 40_001,
                qp: local_qp(CLIENT_QPN, 7),
                path_mtu: Mtu::Mtu1024,
                retry_count: 7,
                traffic_class: 0,
                hop_limit: 64,
                private_data: &[],
            },
        )
        .unwrap();
    other.dispatch().unwrap()
}

#[test]
fn passive_exchange_req_rep_rtu_established() {
    let mut pair = Pair::new();
    let (client_conn, server_conn) = pair.established();
    assert_eq!(pair.server.state(server_conn), Some(State::Established));
    assert_eq!(pair.client.state(client_conn), Some(State::Established));
    // No timers left: nothing is retransmitted.
    assert_eq!(pair.server.poll_at(), None);
    assert_eq!(pair.client.poll_at(), None);
    assert_eq!(pair.server.conn_by_qpn(SERVER_QPN), Some(server_conn));
    // A duplicate RTU is ignored.
    let mut rtu = [0u8; 256];
    cm::Repr {
        transaction_id: 0,
        attribute_modifier: 0,
        message: Message::Rtu(cm::RtuRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: &[],
        }),
    }
    .emit(&mut rtu);
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &rtu);
    assert_eq!(pair.server.poll_event(), None);
    assert!(pair.server.dispatch().is_none());
}

#[test]
fn rtu_lost_first_data_packet_establishes() {
    let mut pair = Pair::new();
    let (_, server_conn) = pair.handshake_until_rtu();
    assert!(pair.deliver_to_server(|attr| attr == RTU).is_empty());
    assert_eq!(pair.server.state(server_conn), Some(State::RepSent));
    // The HCA sees the client's first SEND on the QP.
    let conn = pair.server.conn_by_qpn(SERVER_QPN).unwrap();
    pair.server.notify_data_received(conn).unwrap();
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::Established { conn: server_conn })
    );
    assert_eq!(pair.server.poll_at(), None, "the REP timer is stopped");
    // A late RTU changes nothing.
    pair.server.notify_data_received(conn).unwrap();
    assert_eq!(pair.server.poll_event(), None);
}

#[test]
fn rep_lost_is_retransmitted() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let Some(Event::ConnectRequest { conn, .. }) = pair.server.poll_event() else {
        panic!()
    };
    pair.server
        .accept(pair.now, conn, local_qp(SERVER_QPN, 200), &[])
        .unwrap();
    assert!(pair.deliver_to_client(|attr| attr == REP).is_empty());
    assert_eq!(pair.server.poll_at(), Some(REP_TIMEOUT));
    pair.advance_to(REP_TIMEOUT);
    assert_eq!(pair.deliver_to_client(|_| false), [REP]);
    assert!(matches!(
        pair.client.poll_event(),
        Some(Event::Reply { .. })
    ));
    pair.client.ready_to_use(client_conn).unwrap();
    assert_eq!(pair.deliver_to_server(|_| false), [RTU]);
    assert_eq!(pair.server.poll_event(), Some(Event::Established { conn }));
    assert_eq!(pair.server.stats().retransmissions, 1);
}

#[test]
fn rep_retries_exhausted_times_out_with_rej() {
    let mut pair = Pair::new();
    pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server
        .accept(0, conn, local_qp(SERVER_QPN, 200), &[])
        .unwrap();
    let mut sent = Vec::new();
    while let Some(out) = pair.server.dispatch() {
        sent.push(attribute(&out));
    }
    for _ in 0..16 {
        let at = pair.server.poll_at().unwrap();
        pair.server.poll(at);
        while let Some(out) = pair.server.dispatch() {
            sent.push(attribute(&out));
        }
    }
    // 1 + 15 REPs (REQ Max CM Retries = 15), then REJ reason 4.
    assert_eq!(sent.iter().filter(|&&a| a == REP).count(), 16);
    assert_eq!(sent.last(), Some(&REJ));
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::TimedOut {
            conn,
            waiting_for: Waiting::ForReadyToUse
        })
    );
    assert_eq!(pair.server.state(conn), Some(State::Timewait));
    assert!(pair.server.qpn_in_use(SERVER_QPN));
}

#[test]
fn duplicate_req_at_each_stage() {
    let mut pair = Pair::new();
    pair.connect(PORT, &[]);
    let req = pair.client.dispatch().unwrap();
    let deliver = |pair: &mut Pair| {
        pair.server
            .process_mad(pair.now, &mut pair.rng, server_route(), &req.mad)
    };
    deliver(&mut pair);
    let conn = pair.server.poll_event().unwrap().conn();
    // Waiting for the consumer: ignored, no second event.
    deliver(&mut pair);
    assert!(pair.server.dispatch().is_none());
    assert_eq!(pair.server.poll_event(), None);
    // After an MRA: the MRA is re-sent.
    pair.server.delay(pair.now, conn, 22).unwrap();
    assert_eq!(attribute(&pair.server.dispatch().unwrap()), MRA);
    deliver(&mut pair);
    assert_eq!(attribute(&pair.server.dispatch().unwrap()), MRA);
    // After the REP: the REP is re-sent, same bytes.
    pair.server
        .accept(pair.now, conn, local_qp(SERVER_QPN, 200), &[])
        .unwrap();
    let rep = pair.server.dispatch().unwrap();
    deliver(&mut pair);
    assert_eq!(pair.server.dispatch(), Some(rep.clone()));
    // Established: ignored.
    pair.server.notify_data_received(conn).unwrap();
    pair.server.poll_event();
    deliver(&mut pair);
    assert!(pair.server.dispatch().is_none());
    // Timewait: REJ 10 (stale).
    pair.client
        .process_mad(0, &mut pair.rng, client_route(), &rep.mad);
    let client_conn = pair.client.poll_event().unwrap().conn();
    pair.client.ready_to_use(client_conn).unwrap();
    pair.client.dispatch();
    pair.client
        .disconnect(pair.now, &mut pair.rng, client_conn)
        .unwrap();
    pair.deliver_to_server(|_| false);
    assert_eq!(pair.server.state(conn), Some(State::Timewait));
    pair.server.dispatch().unwrap();
    deliver(&mut pair);
    let rej = pair.server.dispatch().unwrap();
    let Message::Rej(rej) = cm::Repr::parse(&rej.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(rej.reason, RejectReason::StaleConnection);
    assert_eq!(rej.message_rejected, MessageKind::Req);
}

#[test]
fn client_disconnects_and_drep_is_lost() {
    let mut pair = Pair::new();
    let (client_conn, server_conn) = pair.established();
    pair.client
        .disconnect(pair.now, &mut pair.rng, client_conn)
        .unwrap();
    assert_eq!(pair.client.state(client_conn), Some(State::DreqSent));
    assert_eq!(pair.deliver_to_server(|_| false), [DREQ]);
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::Disconnected {
            conn: server_conn,
            cause: DisconnectCause::PeerRequest
        })
    );
    assert!(pair.deliver_to_client(|attr| attr == DREP).is_empty());
    // The client's DREQ timer resends; the server (timewait) answers again.
    pair.advance_to(REQ_TIMEOUT);
    assert_eq!(pair.deliver_to_server(|_| false), [DREQ]);
    assert_eq!(pair.deliver_to_client(|_| false), [DREP]);
    assert_eq!(
        pair.client.poll_event(),
        Some(Event::Disconnected {
            conn: client_conn,
            cause: DisconnectCause::Reply
        })
    );
    assert_eq!(pair.server.poll_event(), None, "reported once");
    assert_eq!(pair.client.state(client_conn), Some(State::Timewait));
}

#[test]
fn server_disconnects() {
    let mut pair = Pair::new();
    let (client_conn, server_conn) = pair.established();
    pair.server
        .disconnect(pair.now, &mut pair.rng, server_conn)
        .unwrap();
    let dreq = pair.server.dispatch().unwrap();
    let Message::Dreq(d) = cm::Repr::parse(&dreq.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(d.remote_qpn, CLIENT_QPN, "the DREQ names the client's QPN");
    pair.client
        .process_mad(0, &mut pair.rng, client_route(), &dreq.mad);
    assert_eq!(
        pair.client.poll_event(),
        Some(Event::Disconnected {
            conn: client_conn,
            cause: DisconnectCause::PeerRequest
        })
    );
    assert_eq!(pair.deliver_to_server(|_| false), [DREP]);
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::Disconnected {
            conn: server_conn,
            cause: DisconnectCause::Reply
        })
    );
    // Disconnecting again is a no-op.
    pair.server
        .disconnect(pair.now, &mut pair.rng, server_conn)
        .unwrap();
    assert!(pair.server.dispatch().is_none());
}

#[test]
fn dreq_unanswered_times_out() {
    let mut pair = Pair::new();
    let (_, server_conn) = pair.established();
    pair.server
        .disconnect(pair.now, &mut pair.rng, server_conn)
        .unwrap();
    let mut dreqs = 0;
    while pair.server.state(server_conn) == Some(State::DreqSent) {
        while let Some(out) = pair.server.dispatch() {
            assert_eq!(attribute(&out), DREQ);
            dreqs += 1;
        }
        let at = pair.server.poll_at().unwrap();
        pair.server.poll(at);
    }
    assert_eq!(dreqs, 16);
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::Disconnected {
            conn: server_conn,
            cause: DisconnectCause::TimedOut
        })
    );
}

#[test]
fn dreq_for_unknown_ids_gets_a_drep_and_wrong_qpn_is_ignored() {
    let mut pair = Pair::new();
    let (client_conn, server_conn) = pair.established();
    let mut mad = [0u8; 256];
    let emit_dreq = |mad: &mut [u8; 256], local, remote, qpn| {
        cm::Repr {
            transaction_id: 77,
            attribute_modifier: 0,
            message: Message::Dreq(cm::DreqRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn: qpn,
                private_data: &[],
            }),
        }
        .emit(mad)
    };
    emit_dreq(&mut mad, 5, 6, SERVER_QPN);
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mad);
    let drep = pair.server.dispatch().unwrap();
    let parsed = cm::Repr::parse(&drep.mad).unwrap();
    assert_eq!(parsed.transaction_id, 77);
    let Message::Drep(d) = parsed.message else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (6, 5));
    // Right IDs, wrong QPN: silently ignored.
    let rep = {
        // Recover the IDs from a DREQ the client would send.
        pair.client
            .disconnect(0, &mut pair.rng, client_conn)
            .unwrap();
        let out = pair.client.dispatch().unwrap();
        let Message::Dreq(d) = cm::Repr::parse(&out.mad).unwrap().message else {
            panic!()
        };
        (d.local_comm_id, d.remote_comm_id)
    };
    emit_dreq(&mut mad, rep.0, rep.1, Qpn::new(0x999));
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mad);
    assert!(pair.server.dispatch().is_none());
    assert_eq!(pair.server.state(server_conn), Some(State::Established));
}

#[test]
fn unknown_service_is_rejected_without_the_consumer() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(4321, &[]);
    pair.deliver_to_server(|_| false);
    assert_eq!(pair.server.poll_event(), None);
    assert_eq!(pair.deliver_to_client(|_| false), [REJ]);
    assert_eq!(
        pair.client.poll_event(),
        Some(Event::Rejected {
            conn: client_conn,
            reason: RejectReason::InvalidServiceId,
            private_data: roce::cm::PrivateData::try_from_slice(&[0; 148]).unwrap(),
        })
    );
    assert_eq!(pair.client.state(client_conn), None);
    assert_eq!(pair.server.stats().rejected_requests, 1);
    assert!(!pair.client.qpn_in_use(CLIENT_QPN));
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server
        .reject(0, conn, RejectReason::ConsumerDefined, b"no thanks")
        .unwrap();
    assert_eq!(
        pair.server.accept(0, conn, local_qp(SERVER_QPN, 1), &[]),
        Err(CmError::UnknownConnection)
    );
    pair.deliver_to_client(|_| false);
    let Some(Event::Rejected {
        reason,
        private_data,
        ..
    }) = pair.client.poll_event()
    else {
        panic!()
    };
    assert_eq!(reason, RejectReason::ConsumerDefined);
    assert_eq!(&private_data.as_slice()[..9], b"no thanks");
    assert_eq!(pair.client.state(client_conn), None);
}

#[test]
fn mra_stretches_the_req_timer() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server.delay(0, conn, 22).unwrap(); // 2^14 ms ≈ 16.4 s
    assert_eq!(pair.deliver_to_client(|_| false), [MRA]);
    assert_eq!(pair.client.state(client_conn), Some(State::MraReqRcvd));
    assert_eq!(pair.client.poll_at(), Some((16_384 + 2_048) * MILLISECOND));
    // No REQ retransmission at the normal 6144 ms.
    pair.advance_to(REQ_TIMEOUT);
    assert!(pair.client.dispatch().is_none());
    pair.server
        .accept(pair.now, conn, local_qp(SERVER_QPN, 5), &[])
        .unwrap();
    pair.deliver_to_client(|_| false);
    assert!(matches!(
        pair.client.poll_event(),
        Some(Event::Reply { .. })
    ));
}

#[test]
fn req_unanswered_times_out() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    let mut reqs = 0;
    while pair.client.state(client_conn) == Some(State::ReqSent) {
        while let Some(out) = pair.client.dispatch() {
            assert_eq!(attribute(&out), REQ);
            reqs += 1;
        }
        let at = pair.client.poll_at().unwrap();
        pair.client.poll(at);
    }
    assert_eq!(reqs, 16);
    // The final REJ reason 4 (what Linux sends when it destroys the id).
    let rej = pair.client.dispatch().unwrap();
    let Message::Rej(rej) = cm::Repr::parse(&rej.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(rej.reason, RejectReason::Timeout);
    assert_eq!(rej.ari, &0x0200_00ff_fe00_0002u64.to_be_bytes());
    assert_eq!(
        pair.client.poll_event(),
        Some(Event::TimedOut {
            conn: client_conn,
            waiting_for: Waiting::ForReply
        })
    );
}

#[test]
fn unanswered_request_times_out_at_the_server() {
    let mut pair = Pair::new();
    pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    let at = pair.server.poll_at().unwrap();
    assert_eq!(at, Config::new(0).accept_timeout);
    pair.server.poll(at);
    assert_eq!(attribute(&pair.server.dispatch().unwrap()), REJ);
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::TimedOut {
            conn,
            waiting_for: Waiting::ForConsumer
        })
    );
    assert_eq!(pair.server.state(conn), None);
}

#[test]
fn client_gives_up_with_rej_timeout() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    // The client's consumer destroys the connection before any REP.
    pair.client
        .disconnect(0, &mut pair.rng, client_conn)
        .unwrap();
    assert_eq!(pair.deliver_to_server(|_| false), [REJ]);
    assert!(matches!(
        pair.server.poll_event(),
        Some(Event::Rejected { conn: c, reason: RejectReason::Timeout, .. }) if c == conn
    ));
    assert_eq!(pair.server.state(conn), None);
}

#[test]
fn timewait_keeps_the_qpn_until_it_ends() {
    let mut pair = Pair::new();
    let (client_conn, server_conn) = pair.established();
    pair.client
        .disconnect(0, &mut pair.rng, client_conn)
        .unwrap();
    pair.deliver_to_server(|_| false);
    pair.deliver_to_client(|_| false);
    assert!(pair.server.qpn_in_use(SERVER_QPN));
    assert!(pair.client.qpn_in_use(CLIENT_QPN));
    assert_eq!(pair.server.conn_by_qpn(SERVER_QPN), None);
    let timewait = Config::new(0).timewait;
    pair.advance_to(timewait - 1);
    assert!(pair.server.qpn_in_use(SERVER_QPN));
    pair.advance_to(timewait);
    assert!(!pair.server.qpn_in_use(SERVER_QPN));
    assert!(!pair.client.qpn_in_use(CLIENT_QPN));
    assert_eq!(pair.server.state(server_conn), None);
    // The old ids stay dead even though the slot is reused.
    pair.server.poll_event();
    pair.client.poll_event();
    let (_, new_server_conn) = pair.established();
    assert_ne!(new_server_conn, server_conn);
    assert_eq!(
        pair.server.notify_data_received(server_conn),
        Err(CmError::UnknownConnection)
    );
}

#[test]
fn stale_request_rejects_and_tears_down_the_old_connection() {
    let mut pair = Pair::new();
    let (_, server_conn) = pair.established();
    let req = restarted_client_req(&mut pair);
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &req.mad);
    let mut sent = Vec::new();
    while let Some(out) = pair.server.dispatch() {
        sent.push(attribute(&out));
    }
    sent.sort_unstable();
    assert_eq!(sent, [REJ, DREQ]);
    assert_eq!(
        pair.server.poll_event(),
        Some(Event::Disconnected {
            conn: server_conn,
            cause: DisconnectCause::Stale
        })
    );
}

#[test]
fn capacity_full_rejects_with_no_resources() {
    let mut pair = Pair::new();
    let mut server = Cm::<1>::new(Config::new(1));
    server.listen(PORT).unwrap();
    for qpn in [0x11, 0x12] {
        let mut client = Cm::<1>::new(Config::new(u64::from(qpn)));
        client
            .connect(
                0,
                &mut pair.rng,
                &ConnectParams {
                    route: client_route(),
                    port: PORT,
                    src_port: 1,
                    qp: local_qp(Qpn::new(qpn), 7),
                    path_mtu: Mtu::Mtu1024,
                    retry_count: 7,
                    traffic_class: 0,
                    hop_limit: 64,
                    private_data: &[],
                },
            )
            .unwrap();
        let req = client.dispatch().unwrap();
        server.process_mad(0, &mut pair.rng, server_route(), &req.mad);
    }
    assert!(matches!(
        server.poll_event(),
        Some(Event::ConnectRequest { .. })
    ));
    assert_eq!(server.poll_event(), None);
    let rej = server.dispatch().unwrap();
    let Message::Rej(rej) = cm::Repr::parse(&rej.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(rej.reason, RejectReason::NoResources);
}

/// Both sides through a link that loses MADs at random (seeded): the handshake and
/// the disconnect still complete, through retransmissions alone.
#[test]
fn back_to_back_with_random_losses() {
    let mut retransmissions = 0;
    for seed in 1..=40u32 {
        let mut pair = Pair::new();
        let mut loss = Rng(seed.wrapping_mul(0x9e37_79b9) | 1);
        let client_conn = pair.connect(PORT, &[]);
        let mut server_conn = None;
        let mut client_up = false;
        let mut server_up = false;
        let mut client_down = false;
        let mut server_down = false;
        let mut disconnect_sent = false;
        for _ in 0..400 {
            let mut drop = |_| loss.next() % 3 == 0;
            pair.deliver_to_server(&mut drop);
            pair.deliver_to_client(&mut drop);
            while let Some(event) = pair.server.poll_event() {
                match event {
                    Event::ConnectRequest { conn, .. } => {
                        server_conn = Some(conn);
                        pair.server
                            .accept(pair.now, conn, local_qp(SERVER_QPN, 9), &[])
                            .unwrap();
                    }
                    Event::Established { .. } => server_up = true,
                    Event::Disconnected { .. } => server_down = true,
                    other => panic!("seed {seed}: server {other:?}"),
                }
            }
            while let Some(event) = pair.client.poll_event() {
                match event {
                    Event::Reply { conn, .. } => pair.client.ready_to_use(conn).unwrap(),
                    Event::Disconnected { .. } => client_down = true,
                    other => panic!("seed {seed}: client {other:?}"),
                }
            }
            if pair.client.state(client_conn) == Some(State::Established) {
                client_up = true;
            }
            // Once both are up (the server may learn it from "data" instead of
            // the RTU), the client disconnects.
            if client_up
                && !server_up
                && pair.server.state(server_conn.unwrap()) == Some(State::RepSent)
                && loss.next() % 2 == 0
            {
                pair.server
                    .notify_data_received(server_conn.unwrap())
                    .unwrap();
            }
            if client_up && server_up && !disconnect_sent {
                pair.client
                    .disconnect(pair.now, &mut pair.rng, client_conn)
                    .unwrap();
                disconnect_sent = true;
            }
            if client_down && server_down {
                break;
            }
            let next = [pair.client.poll_at(), pair.server.poll_at()]
                .into_iter()
                .flatten()
                .min();
            if pair.client.poll_at().is_none()
                && pair.server.poll_at().is_none()
                && !disconnect_sent
            {
                continue;
            }
            if let Some(at) = next {
                pair.advance_to(at);
            }
        }
        retransmissions +=
            pair.client.stats().retransmissions + pair.server.stats().retransmissions;
        assert!(client_up && server_up, "seed {seed}: never established");
        assert!(
            client_down && server_down,
            "seed {seed}: disconnect incomplete ({client_down}, {server_down})"
        );
    }
    assert!(
        retransmissions > 20,
        "losses were recovered by retransmission"
    );
}

#[test]
fn duplicate_rep_after_rtu_resends_the_rtu() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server
        .accept(0, conn, local_qp(SERVER_QPN, 3), &[])
        .unwrap();
    let rep = pair.server.dispatch().unwrap();
    pair.client
        .process_mad(0, &mut pair.rng, client_route(), &rep.mad);
    pair.client.poll_event().unwrap();
    // A duplicate before the QP is ready adds nothing.
    pair.client
        .process_mad(0, &mut pair.rng, client_route(), &rep.mad);
    assert!(pair.client.dispatch().is_none());
    assert_eq!(pair.client.poll_event(), None);
    pair.client.ready_to_use(client_conn).unwrap();
    let rtu = pair.client.dispatch().unwrap();
    assert_eq!(attribute(&rtu), RTU);
    // The RTU is lost; the server's REP retransmission brings it back.
    pair.advance_to(REP_TIMEOUT);
    assert_eq!(pair.deliver_to_client(|_| false), [REP]);
    assert_eq!(pair.client.dispatch(), Some(rtu));
    assert_eq!(pair.client.poll_event(), None, "no second Reply");
}

#[test]
fn mra_of_our_rep_stretches_the_rep_timer() {
    let mut pair = Pair::new();
    pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server
        .accept(0, conn, local_qp(SERVER_QPN, 3), &[])
        .unwrap();
    let rep = pair.server.dispatch().unwrap();
    let Message::Rep(r) = cm::Repr::parse(&rep.mad).unwrap().message else {
        panic!()
    };
    // What a Linux rdma_cm client sends for a duplicate REP: MRA(REP), timeout 24.
    let mut mra = [0u8; 256];
    cm::Repr {
        transaction_id: 1,
        attribute_modifier: 0,
        message: Message::Mra(cm::MraRepr {
            local_comm_id: r.remote_comm_id,
            remote_comm_id: r.local_comm_id,
            message_mraed: MessageKind::Rep,
            service_timeout: 24,
            private_data: &[],
        }),
    }
    .emit(&mut mra);
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mra);
    assert_eq!(pair.server.state(conn), Some(State::MraRepRcvd));
    assert_eq!(
        pair.server.poll_at(),
        Some((65_536 * MILLISECOND) + REP_TIMEOUT)
    );
    // The RTU still establishes.
    pair.client
        .process_mad(0, &mut pair.rng, client_route(), &rep.mad);
    let client_conn = pair.client.poll_event().unwrap().conn();
    pair.client.ready_to_use(client_conn).unwrap();
    pair.deliver_to_server(|_| false);
    assert_eq!(pair.server.poll_event(), Some(Event::Established { conn }));
}

#[test]
fn active_side_rejects_an_unusable_rep() {
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    let conn = pair.server.poll_event().unwrap().conn();
    pair.server
        .accept(0, conn, local_qp(SERVER_QPN, 3), &[])
        .unwrap();
    pair.deliver_to_client(|_| false);
    pair.client.poll_event().unwrap();
    pair.client
        .reject(0, client_conn, RejectReason::ConsumerDefined, &[])
        .unwrap();
    assert_eq!(pair.client.state(client_conn), Some(State::Timewait));
    assert_eq!(pair.deliver_to_server(|_| false), [REJ]);
    assert!(matches!(
        pair.server.poll_event(),
        Some(Event::Rejected { conn: c, reason: RejectReason::ConsumerDefined, .. }) if c == conn
    ));
    assert_eq!(pair.server.state(conn), Some(State::Timewait));
    assert!(pair.server.qpn_in_use(SERVER_QPN));
}

#[test]
fn malformed_mads_are_counted_and_dropped() {
    let mut pair = Pair::new();
    let (_, server_conn) = pair.established();
    let mut mad = [0u8; 256];
    mad[..4].copy_from_slice(&[1, 7, 2, 3]);
    mad[16..18].copy_from_slice(&0x0017u16.to_be_bytes()); // SIDR_REQ
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mad);
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mad[..255]);
    mad[2] = 1; // class version 1
    mad[17] = 0x10;
    pair.server
        .process_mad(0, &mut pair.rng, server_route(), &mad);
    assert_eq!(pair.server.stats().malformed, 3);
    assert!(pair.server.dispatch().is_none());
    assert_eq!(pair.server.poll_event(), None);
    assert_eq!(pair.server.state(server_conn), Some(State::Established));
}

#[test]
fn path_mtu_above_the_nic_is_rejected() {
    let mut pair = Pair::new();
    let mut config = Config::new(0x0200_00ff_fe00_0001);
    config.max_path_mtu = Mtu::Mtu512;
    pair.server = Cm::new(config);
    pair.server.listen(PORT).unwrap();
    let client_conn = pair.connect(PORT, &[]);
    pair.deliver_to_server(|_| false);
    assert_eq!(pair.server.poll_event(), None);
    pair.deliver_to_client(|_| false);
    assert!(matches!(
        pair.client.poll_event(),
        Some(Event::Rejected { conn, reason: RejectReason::InvalidMtu, .. }) if conn == client_conn
    ));
}

/// A full connection table ends the oldest timewait early for a new REQ
/// instead of refusing it (REJ no resources): timewait only guards against
/// stray packets of a connection that is gone.
#[test]
fn full_table_cuts_a_timewait_for_a_new_request() {
    let mut pair = Pair::new();
    let mut server = Cm::<4>::with_capacity(Config::new(0x0200_00ff_fe00_0001), 1);
    server.listen(PORT).unwrap();
    assert_eq!(server.capacity(), 1);
    pair.server = server;
    let (client_conn, server_conn) = pair.established();
    pair.client
        .disconnect(pair.now, &mut pair.rng, client_conn)
        .unwrap();
    assert_eq!(pair.deliver_to_server(|_| false), [DREQ]);
    assert_eq!(pair.server.state(server_conn), Some(State::Timewait));
    assert_eq!(pair.deliver_to_client(|_| false), [DREP]);
    while pair.server.poll_event().is_some() {}
    while pair.client.poll_event().is_some() {}
    // The only slot is in timewait; a new client connection still gets in.
    let again = pair.connect(PORT, b"again");
    assert_eq!(pair.deliver_to_server(|_| false), [REQ]);
    let Some(Event::ConnectRequest { conn, .. }) = pair.server.poll_event() else {
        panic!("the REQ was refused: {:?}", pair.server.stats())
    };
    assert_ne!(conn, server_conn);
    assert_eq!(pair.server.state(server_conn), None);
    assert_eq!(pair.server.stats().timewaits_cut, 1);
    assert_eq!(pair.server.stats().rejected_requests, 0);
    assert_ne!(again, client_conn);
}

/// Another host that copies a connection's IDs (its comm ID and CA GUID, its
/// GUID and QPN, both comm IDs) cannot move that connection: its REQ is a
/// request of its own, and its DREQ does not reach the connection.
#[test]
fn another_address_cannot_move_a_connection() {
    let forger = Route {
        local_ip: SERVER_IP,
        peer: PeerAddr {
            mac: EthernetAddress([2, 0, 0, 0, 0, 9]),
            ip: Ipv4Address::new(10, 0, 0, 9),
        },
    };
    let mut pair = Pair::new();
    let client_conn = pair.connect(PORT, &[]);
    let req = pair.client.dispatch().unwrap();
    // The forger's copy of the REQ lands first: a request of its own.
    pair.server
        .process_mad(pair.now, &mut pair.rng, forger, &req.mad);
    let Some(Event::ConnectRequest { conn: forged, .. }) = pair.server.poll_event() else {
        panic!("the forged REQ is not a request of its own")
    };
    // The real REQ, while the forged one waits for the consumer, is not taken
    // for its duplicate.
    pair.server
        .process_mad(pair.now, &mut pair.rng, server_route(), &req.mad);
    let Some(Event::ConnectRequest { conn, .. }) = pair.server.poll_event() else {
        panic!("the real REQ was held off by the forged copy")
    };
    assert_ne!(conn, forged);
    pair.server
        .reject(pair.now, forged, RejectReason::ConsumerDefined, &[])
        .unwrap();
    let rej = pair.server.dispatch().unwrap();
    assert_eq!(rej.route, forger, "the REJ goes to the forger");
    pair.server
        .accept(pair.now, conn, local_qp(SERVER_QPN, 200), &[])
        .unwrap();
    assert_eq!(pair.deliver_to_client(|_| false), [REP]);
    pair.client.poll_event();
    pair.client.ready_to_use(client_conn).unwrap();
    assert_eq!(pair.deliver_to_server(|_| false), [RTU]);
    assert_eq!(pair.server.poll_event(), Some(Event::Established { conn }));

    // A "restarted client" (new comm ID, same GUID and QPN) from the forger's
    // address: no REJ 10, no DREQ on the real connection.
    let stale = restarted_client_req(&mut pair);
    pair.server
        .process_mad(pair.now, &mut pair.rng, forger, &stale.mad);
    assert!(matches!(
        pair.server.poll_event(),
        Some(Event::ConnectRequest { .. })
    ));
    assert!(pair.server.dispatch().is_none(), "nothing sent to anyone");
    assert_eq!(pair.server.state(conn), Some(State::Established));

    // The client's own DREQ, replayed from the forger's address first: answered
    // (ib-cm.md §4.7) but the connection stays up; from the client it ends it.
    pair.client
        .disconnect(pair.now, &mut pair.rng, client_conn)
        .unwrap();
    let dreq = pair.client.dispatch().unwrap();
    assert_eq!(attribute(&dreq), DREQ);
    pair.server
        .process_mad(pair.now, &mut pair.rng, forger, &dreq.mad);
    let answer = pair.server.dispatch().unwrap();
    assert_eq!((attribute(&answer), answer.route), (DREP, forger));
    assert_eq!(pair.server.state(conn), Some(State::Established));
    assert_eq!(pair.server.poll_event(), None);
    pair.server
        .process_mad(pair.now, &mut pair.rng, server_route(), &dreq.mad);
    assert_eq!(pair.server.state(conn), Some(State::Timewait));
}
