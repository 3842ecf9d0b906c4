//! `roce::cm` against the Linux captures: the REP (and the REQ, DREP) it emits for
//! the captured REQs equal the captured ones byte for byte.
//!
//! ib-cm.md §4.3/§6.1: the fields of a REP for an rdma_cm client. The random
//! choices (our comm ID, the REP PSN, the QPN) are fed from the capture, so the
//! whole 256-byte MAD can be compared, TID included.

mod common;

use std::cell::Cell;

use common::Capture;
use roce::cm::{guid_from_mac, Cm, Config, ConnectParams, Event, LocalQp, PeerAddr, Route, State};
use roce::types::Qpn;
use roce::wire::cm::{self, Message};
use roce::wire::{parse_frame, rdma_cm, EthernetAddress};

/// The server of every capture: 10.77.0.1 / 52:54:00:77:00:01.
const SERVER_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x77, 0x00, 0x01]);

/// One CM MAD of a capture: the route as the receiver sees it and the MAD bytes.
struct CapturedMad<'a> {
    route: Route,
    mad: &'a [u8],
}

fn mad_at<'a>(frames: &[&'a [u8]], number: usize) -> CapturedMad<'a> {
    let roce = parse_frame(frames[number - 1]).unwrap();
    assert_eq!(roce.payload.len(), 256, "frame {number}");
    CapturedMad {
        route: Route {
            local_ip: roce.ip.dst_addr,
            peer: PeerAddr {
                mac: roce.eth.src_addr,
                ip: roce.ip.src_addr,
            },
        },
        mad: roce.payload,
    }
}

/// A random source that hands out the given values, then panics.
fn script(values: &[u32]) -> impl FnMut() -> u32 + '_ {
    let next = Cell::new(0);
    move || {
        let i = next.get();
        next.set(i + 1);
        *values.get(i).expect("the test's random values ran out")
    }
}

/// Feeds the captured REQ (frame `req`) into a passive `Cm`, accepts with the
/// captured REP's choices and checks the REP (frame `rep`) byte for byte.
fn check_rep(capture: &str, req_frame: usize, rep_frame: usize) {
    let capture = Capture::load(capture);
    let frames = capture.frames();
    let req = mad_at(&frames, req_frame);
    let rep = mad_at(&frames, rep_frame);
    let Message::Req(req_repr) = cm::Repr::parse(req.mad).unwrap().message else {
        panic!("frame {req_frame} is not a REQ")
    };
    let Message::Rep(rep_repr) = cm::Repr::parse(rep.mad).unwrap().message else {
        panic!("frame {rep_frame} is not a REP")
    };

    let mut config = Config::new(guid_from_mac(SERVER_MAC));
    assert_eq!(config.local_ca_guid, rep_repr.local_ca_guid);
    config.target_ack_delay = rep_repr.target_ack_delay;
    let mut cm = Cm::<4>::new(config);
    cm.listen(rdma_cm::tcp_port(req_repr.service_id).unwrap())
        .unwrap();

    let comm_id = [rep_repr.local_comm_id];
    let mut rng = script(&comm_id);
    cm.process_mad(1_000, &mut rng, req.route, req.mad);
    assert!(cm.dispatch().is_none(), "nothing is sent before accept");
    let Some(Event::ConnectRequest { conn, request }) = cm.poll_event() else {
        panic!("no connect request")
    };
    assert_eq!(request.qp.remote_qpn, req_repr.local_qpn);
    assert_eq!(request.qp.send_psn, req_repr.starting_psn);
    assert_eq!(request.qp.path_mtu, req_repr.path_mtu);
    assert_eq!(request.qp.ack_timeout, 19);
    assert_eq!(request.qp.retry_count, req_repr.retry_count);
    assert_eq!(request.qp.rnr_retry_count, req_repr.rnr_retry_count);
    assert_eq!(request.cma_dst_addr, req.route.local_ip);
    assert_eq!(request.cma_src_addr, req.route.peer.ip);
    assert_eq!(
        request.private_data.as_slice(),
        &req_repr.private_data[rdma_cm::HEADER_LEN..]
    );

    let accepted = cm
        .accept(
            2_000,
            conn,
            LocalQp {
                qpn: rep_repr.local_qpn,
                starting_psn: rep_repr.starting_psn,
                responder_resources: rep_repr.responder_resources,
                initiator_depth: rep_repr.initiator_depth,
                rnr_retry_count: rep_repr.rnr_retry_count,
                srq: rep_repr.srq,
            },
            rep_repr.private_data,
        )
        .unwrap();
    assert_eq!(accepted.responder_resources, rep_repr.responder_resources);
    assert_eq!(accepted.initiator_depth, rep_repr.initiator_depth);
    let out = cm.dispatch().expect("a REP");
    assert_eq!(out.route, req.route);
    assert_eq!(
        cm::Repr::parse(&out.mad).unwrap(),
        cm::Repr::parse(rep.mad).unwrap(),
        "{} frame {rep_frame}",
        capture.name
    );
    assert_eq!(&out.mad[..], rep.mad, "{} frame {rep_frame}", capture.name);
    let rep_ip = parse_frame(frames[rep_frame - 1]).unwrap().ip;
    assert_eq!(out.hop_limit, rep_ip.ttl);
    assert_eq!(out.traffic_class, rep_ip.tos);
    assert_eq!(out.traffic_class, 0);
    assert_eq!(cm.state(conn), Some(State::RepSent));
}

#[test]
fn rep_equals_the_rnbd_server_rep_con0() {
    check_rep("rnbd-linux-srv-linux-clt", 5, 6);
}

#[test]
fn rep_equals_the_rnbd_server_rep_con1() {
    check_rep("rnbd-linux-srv-linux-clt", 8, 9);
}

#[test]
fn rep_equals_the_rping_server_rep() {
    check_rep("rping-linux", 5, 6);
}

#[test]
fn rep_equals_the_rnbd_2cpu_reps() {
    for (req, rep) in [(5, 6), (8, 9), (11, 12)] {
        check_rep("rnbd-2cpu", req, rep);
    }
}

/// The whole rping exchange: REQ, REP, the captured RTU, the captured DREQ and our
/// DREP equal to the captured one.
#[test]
fn rping_passive_exchange_to_timewait() {
    let capture = Capture::load("rping-linux");
    let frames = capture.frames();
    let req = mad_at(&frames, 5);
    let rep = mad_at(&frames, 6);
    let Message::Rep(rep_repr) = cm::Repr::parse(rep.mad).unwrap().message else {
        panic!()
    };
    let mut cm = Cm::<4>::new(Config::new(guid_from_mac(SERVER_MAC)));
    cm.listen(7174).unwrap();
    let ids = [rep_repr.local_comm_id];
    let mut rng = script(&ids);
    cm.process_mad(0, &mut rng, req.route, req.mad);
    let conn = cm.poll_event().unwrap().conn();
    let local = LocalQp {
        qpn: rep_repr.local_qpn,
        starting_psn: rep_repr.starting_psn,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
    };
    cm.accept(0, conn, local, &[]).unwrap();
    assert_eq!(&cm.dispatch().unwrap().mad[..], rep.mad);

    let rtu = mad_at(&frames, 7);
    cm.process_mad(1, &mut rng, rtu.route, rtu.mad);
    assert_eq!(cm.poll_event(), Some(Event::Established { conn }));
    assert_eq!(cm.state(conn), Some(State::Established));
    assert_eq!(cm.conn_by_qpn(Qpn::new(0x11)), Some(conn));

    let dreq = mad_at(&frames, 44);
    cm.process_mad(2, &mut rng, dreq.route, dreq.mad);
    let drep = mad_at(&frames, 45);
    assert_eq!(&cm.dispatch().unwrap().mad[..], drep.mad);
    assert!(matches!(
        cm.poll_event(),
        Some(Event::Disconnected { conn: c, .. }) if c == conn
    ));
    assert_eq!(cm.state(conn), Some(State::Timewait));
    assert!(cm.qpn_in_use(Qpn::new(0x11)));
    // A retransmitted DREQ gets the same DREP again.
    cm.process_mad(3, &mut rng, dreq.route, dreq.mad);
    assert_eq!(&cm.dispatch().unwrap().mad[..], drep.mad);
    // Timewait ends; the QPN is free.
    let end = cm.poll_at().unwrap();
    assert!(cm.poll(end));
    assert_eq!(cm.state(conn), None);
    assert!(!cm.qpn_in_use(Qpn::new(0x11)));
}

/// The active side: a REQ built from the captured client's choices equals the
/// captured REQ byte for byte (Brick's initiator looks like a Linux client)
/// when it does not offer selective retransmission; offering it sets bit 0
/// of the reserved MAD byte 28 and changes nothing else.
fn check_req(capture: &str, req_frame: usize, selective: bool) {
    let capture = Capture::load(capture);
    let frames = capture.frames();
    let req = mad_at(&frames, req_frame);
    let parsed = cm::Repr::parse(req.mad).unwrap();
    let Message::Req(r) = parsed.message else {
        panic!()
    };
    let cma = rdma_cm::Repr::parse(&rdma_cm::Packet::new_unchecked(r.private_data)).unwrap();
    let client = req.route.peer;
    let mut cm = Cm::<2>::new(Config {
        selective_retransmission: selective,
        ..Config::new(r.local_ca_guid)
    });
    assert_eq!(r.local_ca_guid, guid_from_mac(client.mac));
    // Random values: the comm ID, then the TID's high half.
    let values = [r.local_comm_id, (parsed.transaction_id >> 32) as u32];
    let mut rng = script(&values);
    let route = Route {
        local_ip: client.ip,
        peer: PeerAddr {
            mac: SERVER_MAC,
            ip: req.route.local_ip,
        },
    };
    let user = &r.private_data[rdma_cm::HEADER_LEN..];
    let used = user.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let conn = cm
        .connect(
            0,
            &mut rng,
            &ConnectParams {
                route,
                port: rdma_cm::tcp_port(r.service_id).unwrap(),
                src_port: cma.src_port,
                qp: LocalQp {
                    qpn: r.local_qpn,
                    starting_psn: r.starting_psn,
                    responder_resources: r.responder_resources,
                    initiator_depth: r.initiator_depth,
                    rnr_retry_count: r.rnr_retry_count,
                    srq: r.srq,
                },
                path_mtu: r.path_mtu,
                retry_count: r.retry_count,
                traffic_class: r.primary_path.traffic_class,
                hop_limit: r.primary_path.hop_limit,
                private_data: &user[..used],
            },
        )
        .unwrap();
    let out = cm.dispatch().unwrap();
    assert_eq!(out.route, route);
    let mut expected = req.mad.to_vec();
    if selective {
        assert_eq!(expected[28], 0, "Linux leaves the reserved byte 0");
        expected[28] = 0x01;
    }
    let Message::Req(ours) = cm::Repr::parse(&out.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(ours.brick_selective, selective);
    assert_eq!(
        cm::ReqRepr {
            brick_selective: false,
            ..ours
        },
        r,
        "{} frame {req_frame}",
        capture.name
    );
    assert_eq!(&out.mad[..], &expected[..]);
    assert_eq!(cm.state(conn), Some(State::ReqSent));
}

#[test]
fn req_equals_the_linux_client_req() {
    for selective in [false, true] {
        check_req("rping-linux", 5, selective);
        check_req("rnbd-linux-srv-linux-clt", 5, selective);
        check_req("rnbd-linux-srv-linux-clt", 8, selective);
        check_req("rnbd-2cpu", 11, selective);
    }
}

/// The rnbd close: the client's two DREQs get DREPs equal to the Linux server's
/// (frame 395 answers frame 393).
#[test]
fn rnbd_drep_equals_the_linux_server_drep() {
    let capture = Capture::load("rnbd-linux-srv-linux-clt");
    let frames = capture.frames();
    let mut cm = Cm::<4>::new(Config::new(guid_from_mac(SERVER_MAC)));
    cm.listen(1234).unwrap();
    let mut conns = Vec::new();
    for (req_frame, rep_frame, rtu_frame) in [(5, 6, 7), (8, 9, 10)] {
        let req = mad_at(&frames, req_frame);
        let rep = mad_at(&frames, rep_frame);
        let Message::Rep(rep_repr) = cm::Repr::parse(rep.mad).unwrap().message else {
            panic!()
        };
        let ids = [rep_repr.local_comm_id];
        let mut rng = script(&ids);
        cm.process_mad(0, &mut rng, req.route, req.mad);
        let conn = cm.poll_event().unwrap().conn();
        let local = LocalQp {
            qpn: rep_repr.local_qpn,
            starting_psn: rep_repr.starting_psn,
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 7,
            srq: false,
        };
        cm.accept(0, conn, local, rep_repr.private_data).unwrap();
        assert_eq!(&cm.dispatch().unwrap().mad[..], rep.mad);
        let rtu = mad_at(&frames, rtu_frame);
        cm.process_mad(0, &mut rng, rtu.route, rtu.mad);
        assert_eq!(cm.poll_event(), Some(Event::Established { conn }));
        conns.push(conn);
    }
    let mut rng = script(&[]);
    let dreq = mad_at(&frames, 393);
    cm.process_mad(10, &mut rng, dreq.route, dreq.mad);
    let drep = mad_at(&frames, 395);
    assert_eq!(&cm.dispatch().unwrap().mad[..], drep.mad);
}
