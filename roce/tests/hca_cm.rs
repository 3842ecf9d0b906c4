//! The CM wired into the HCA: two `Hca`s connect through IB CM / RDMA CM
//! (ARP, REQ/REP/RTU, DREQ/DREP), move data, and disconnect, over a perfect
//! and a lossy simulated link.

mod hca_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use hca_support::{attr, cm_attribute, region, Net, Verdict, SERVER_IP};
use roce::qp::QpState;
use verbs::{
    CmEvent, ConnId, ConnParams, Memory, MemoryRegion, RecvWr, RejectReason, SendOp, SendWr, Sge,
    Sgl, Verbs, WcOpcode, WcStatus, WrId,
};

const CLIENT: usize = 0;
const SERVER: usize = 1;
const PORT: u16 = 7174;
const SECOND: u64 = 1_000_000_000;

fn server_addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(SERVER_IP)), port)
}

fn params(private_data: &[u8]) -> ConnParams<'_> {
    ConnParams {
        responder_resources: 1,
        initiator_depth: 1,
        ..ConnParams::new(private_data, 16, 16)
    }
}

fn recv(region: &MemoryRegion, id: u64, offset: u32) -> RecvWr {
    RecvWr {
        wr_id: WrId(id),
        sgl: Sgl::single(Sge::new(region.lkey, offset, 256)),
    }
}

/// A connected pair: client and server connection ids and each side's region.
struct Connected {
    client: ConnId,
    server: ConnId,
    client_region: MemoryRegion,
    server_region: MemoryRegion,
}

/// Runs the whole connect sequence and checks both sides' events.
fn connect(net: &mut Net) -> Connected {
    if !net.hcas[SERVER].cm().is_listening(PORT) {
        net.hcas[SERVER].listen(PORT).expect("listen");
    }
    let client_region = region(&mut net.hcas[CLIENT]);
    let server_region = region(&mut net.hcas[SERVER]);
    let client = net.hcas[CLIENT]
        .connect(server_addr(PORT), &params(b"hello from the client"))
        .expect("connect");
    net.hcas[CLIENT]
        .post_recv(client, &[recv(&client_region, 1, 0)])
        .expect("client post_recv");

    assert!(net.run_until(60 * SECOND, |net| net.events[SERVER]
        .iter()
        .any(|e| matches!(e, CmEvent::ConnectRequest { .. }))));
    let Some(CmEvent::ConnectRequest {
        conn: server,
        local,
        remote,
        private_data,
    }) = net.take_event(SERVER, |e| matches!(e, CmEvent::ConnectRequest { .. }))
    else {
        unreachable!()
    };
    assert!(private_data
        .as_slice()
        .starts_with(b"hello from the client"));
    assert_eq!(local, server_addr(PORT));
    assert_eq!(remote.ip(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
    assert_eq!(net.hcas[SERVER].qp_state(server), Some(QpState::Init));
    net.hcas[SERVER]
        .post_recv(server, &[recv(&server_region, 2, 0)])
        .expect("server post_recv");
    net.hcas[SERVER]
        .accept(server, &params(b"welcome"))
        .expect("accept");
    assert_eq!(net.hcas[SERVER].qp_state(server), Some(QpState::Rtr));

    assert!(net.run_until(60 * SECOND, |net| net.events[CLIENT]
        .iter()
        .any(|e| matches!(e, CmEvent::Established { .. }))));
    let Some(CmEvent::Established { conn, private_data }) =
        net.take_event(CLIENT, |e| matches!(e, CmEvent::Established { .. }))
    else {
        unreachable!()
    };
    assert_eq!(conn, client);
    assert!(private_data.as_slice().starts_with(b"welcome"));
    assert_eq!(net.hcas[CLIENT].qp_state(client), Some(QpState::Rts));
    Connected {
        client,
        server,
        client_region,
        server_region,
    }
}

/// Waits for the passive side's `Established` (RTU or first data).
fn server_established(net: &mut Net, server: ConnId) {
    assert!(
        net.run_until(60 * SECOND, |net| net.events[SERVER].iter().any(|e| *e
            == CmEvent::Established {
                conn: server,
                private_data: Default::default()
            }))
    );
    net.events[SERVER].retain(|e| !matches!(e, CmEvent::Established { .. }));
    assert_eq!(net.hcas[SERVER].qp_state(server), Some(QpState::Rts));
}

fn wait_completion(net: &mut Net, side: usize, id: u64) -> verbs::WorkCompletion {
    assert!(
        net.run_until(120 * SECOND, |net| net.completions[side]
            .iter()
            .any(|wc| wc.wr_id == WrId(id))),
        "no completion {id} on side {side}"
    );
    let index = net.completions[side]
        .iter()
        .position(|wc| wc.wr_id == WrId(id))
        .unwrap();
    net.completions[side].remove(index)
}

/// SEND client → server, RDMA WRITE and READ server → client.
fn exchange_data(net: &mut Net, c: &Connected) {
    // SEND.
    net.hcas[CLIENT]
        .write(c.client_region.handle, 1024, b"ping over the CM")
        .unwrap();
    net.hcas[CLIENT]
        .post_send(
            c.client,
            &[SendWr {
                wr_id: WrId(10),
                signaled: true,
                op: SendOp::Send {
                    sgl: Sgl::single(Sge::new(c.client_region.lkey, 1024, 16)),
                    imm: None,
                },
            }],
        )
        .unwrap();
    let wc = wait_completion(net, SERVER, 2);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 16);
    let mut got = [0u8; 16];
    net.hcas[SERVER]
        .read(c.server_region.handle, 0, &mut got)
        .unwrap();
    assert_eq!(&got, b"ping over the CM");
    assert_eq!(wait_completion(net, CLIENT, 10).status, WcStatus::Success);
    server_established(net, c.server);

    // RDMA WRITE server → client.
    net.hcas[SERVER]
        .write(c.server_region.handle, 512, &[0xab; 300])
        .unwrap();
    net.hcas[SERVER]
        .post_send(
            c.server,
            &[SendWr {
                wr_id: WrId(20),
                signaled: true,
                op: SendOp::RdmaWrite {
                    sgl: Sgl::single(Sge::new(c.server_region.lkey, 512, 300)),
                    remote_addr: c.client_region.iova + 2048,
                    rkey: c.client_region.rkey,
                    imm: None,
                },
            }],
        )
        .unwrap();
    assert_eq!(wait_completion(net, SERVER, 20).status, WcStatus::Success);
    let mut got = [0u8; 300];
    net.hcas[CLIENT]
        .read(c.client_region.handle, 2048, &mut got)
        .unwrap();
    assert!(got.iter().all(|&b| b == 0xab));

    // RDMA READ server ← client.
    net.hcas[CLIENT]
        .write(c.client_region.handle, 3000, b"read me back")
        .unwrap();
    net.hcas[SERVER]
        .post_send(
            c.server,
            &[SendWr {
                wr_id: WrId(30),
                signaled: true,
                op: SendOp::RdmaRead {
                    sgl: Sgl::single(Sge::new(c.server_region.lkey, 3500, 12)),
                    remote_addr: c.client_region.iova + 3000,
                    rkey: c.client_region.rkey,
                },
            }],
        )
        .unwrap();
    let wc = wait_completion(net, SERVER, 30);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::RdmaRead);
    let mut got = [0u8; 12];
    net.hcas[SERVER]
        .read(c.server_region.handle, 3500, &mut got)
        .unwrap();
    assert_eq!(&got, b"read me back");
}

/// `side` disconnects; both sides see `Disconnected` and flush.
fn disconnect(net: &mut Net, c: &Connected, side: usize) {
    let conns = [c.client, c.server];
    net.hcas[side].disconnect(conns[side]).unwrap();
    assert!(net.run_until(120 * SECOND, |net| {
        (0..2).all(|s| {
            net.events[s]
                .iter()
                .any(|e| *e == CmEvent::Disconnected { conn: conns[s] })
        })
    }));
    for (s, conn) in conns.into_iter().enumerate() {
        assert_eq!(net.hcas[s].qp_state(conn), Some(QpState::Err));
        net.events[s].clear();
        net.hcas[s].destroy(conn).unwrap();
    }
}

#[test]
fn connect_exchange_disconnect_both_ways() {
    let mut net = Net::new(1);
    let first = connect(&mut net);
    exchange_data(&mut net, &first);
    disconnect(&mut net, &first, CLIENT);
    let client_flushed = net.completions[CLIENT]
        .iter()
        .any(|wc| wc.wr_id == WrId(1) && wc.status == WcStatus::WrFlushErr);
    assert!(client_flushed, "the client's receive was flushed");

    // A second connection on the same listener, closed by the server.
    let second = connect(&mut net);
    assert_ne!(second.client, first.client, "timewait QPN is not reused");
    exchange_data(&mut net, &second);
    disconnect(&mut net, &second, SERVER);

    // The CM exchange used exactly one of each message (no loss).
    let count = |a: u16| {
        net.sent
            .iter()
            .filter(|(_, f)| cm_attribute(f) == Some(a))
            .count()
    };
    assert_eq!(count(attr::REQ), 2);
    assert_eq!(count(attr::REP), 2);
    assert_eq!(count(attr::RTU), 2);
    assert_eq!(count(attr::DREQ), 2);
    assert_eq!(count(attr::DREP), 2);
}

#[test]
fn lossy_cm_converges() {
    let mut net = Net::new(7);
    // Lose the first copy of every CM message and the first ARP request.
    let mut seen = std::collections::HashSet::new();
    net.set_verdict(move |_, frame| {
        let key = if frame.get(12..14) == Some(&[0x08, 0x06]) {
            Some(0xffff)
        } else {
            cm_attribute(frame)
        };
        match key {
            Some(key) if seen.insert(key) => Verdict::Drop,
            _ => Verdict::Deliver,
        }
    });
    let c = connect(&mut net);
    exchange_data(&mut net, &c);
    disconnect(&mut net, &c, CLIENT);
    let count = |a: u16| {
        net.sent
            .iter()
            .filter(|(_, f)| cm_attribute(f) == Some(a))
            .count()
    };
    assert!(count(attr::REQ) >= 2, "REQ retransmitted");
    assert!(count(attr::REP) >= 2, "REP retransmitted");
    assert!(count(attr::DREQ) >= 2, "DREQ retransmitted");
}

#[test]
fn lossy_rtu_established_by_first_data() {
    let mut net = Net::new(11);
    // Lose every RTU: the server must establish on the first data packet.
    net.set_verdict(|_, frame| {
        if cm_attribute(frame) == Some(attr::RTU) {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    let c = connect(&mut net);
    exchange_data(&mut net, &c);
    disconnect(&mut net, &c, SERVER);
}

#[test]
fn unlistened_port_is_rejected() {
    let mut net = Net::new(3);
    net.hcas[SERVER].listen(PORT).unwrap();
    let client = net.hcas[CLIENT]
        .connect(server_addr(PORT + 1), &params(b"anyone?"))
        .unwrap();
    assert!(net.run_until(60 * SECOND, |net| !net.events[CLIENT].is_empty()));
    match &net.events[CLIENT][0] {
        CmEvent::Rejected { conn, reason, .. } => {
            assert_eq!(*conn, client);
            assert_eq!(*reason, RejectReason::INVALID_SERVICE_ID);
        }
        other => panic!("unexpected {other:?}"),
    }
    net.run_until(10 * SECOND, |_| false);
    assert!(
        net.events[SERVER].is_empty(),
        "the server consumer saw nothing"
    );
    assert_eq!(net.hcas[CLIENT].qp_state(client), Some(QpState::Err));
    net.hcas[CLIENT].destroy(client).unwrap();
}

#[test]
fn consumer_reject_reaches_the_client() {
    let mut net = Net::new(5);
    net.hcas[SERVER].listen(PORT).unwrap();
    let client = net.hcas[CLIENT]
        .connect(server_addr(PORT), &params(b"let me in"))
        .unwrap();
    assert!(net.run_until(60 * SECOND, |net| !net.events[SERVER].is_empty()));
    let server = net.events[SERVER][0].conn();
    net.hcas[SERVER].reject(server, b"go away").unwrap();
    assert!(
        net.hcas[SERVER].qp(server).is_none(),
        "reject releases the QP"
    );
    assert!(net.run_until(60 * SECOND, |net| !net.events[CLIENT].is_empty()));
    match &net.events[CLIENT][0] {
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
        } => {
            assert_eq!(*conn, client);
            assert_eq!(*reason, RejectReason::CONSUMER_DEFINED);
            assert!(private_data.as_slice().starts_with(b"go away"));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unreachable_when_arp_fails() {
    let mut net = Net::new(9);
    net.set_verdict(|_, _| Verdict::Drop);
    let client = net.hcas[CLIENT]
        .connect(server_addr(PORT), &params(b""))
        .unwrap();
    assert!(net.run_until(60 * SECOND, |net| !net.events[CLIENT].is_empty()));
    assert_eq!(net.events[CLIENT][0], CmEvent::Unreachable { conn: client });
}

#[test]
fn malformed_gsi_frames_are_dropped() {
    let mut net = Net::new(13);
    net.hcas[SERVER].listen(PORT).unwrap();
    net.hcas[CLIENT]
        .connect(server_addr(PORT), &params(b"x"))
        .unwrap();
    // Capture the REQ the client sends, then replay it mangled.
    net.set_verdict(|_, frame| {
        if cm_attribute(frame).is_some() {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    assert!(net.run_until(10 * SECOND, |net| net
        .sent
        .iter()
        .any(|(_, f)| cm_attribute(f) == Some(attr::REQ))));
    let req = net
        .sent
        .iter()
        .find(|(_, f)| cm_attribute(f) == Some(attr::REQ))
        .unwrap()
        .1
        .clone();
    // Wrong Q_Key (ICRC recomputed so only the Q_Key is wrong).
    let mut bad = req.clone();
    bad[54] ^= 0x01;
    fix_icrc(&mut bad);
    net.hcas[SERVER].receive(net.now, &bad);
    // Truncated MAD.
    net.hcas[SERVER].receive(net.now, &req[..req.len() - 8]);
    // Arbitrary bytes.
    for len in [0, 13, 42, 61, 322] {
        net.hcas[SERVER].receive(net.now, &vec![0x5a; len]);
    }
    assert_eq!(net.hcas[SERVER].control_counters().drop_bad_gsi, 1);
    assert_eq!(net.hcas[SERVER].poll_cm_event(), None);
    // The intact REQ still works.
    net.hcas[SERVER].receive(net.now, &req);
    assert!(matches!(
        net.hcas[SERVER].poll_cm_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
}

fn fix_icrc(frame: &mut [u8]) {
    let len = frame.len();
    let icrc = roce::wire::compute_icrc(frame).expect("a RoCEv2 frame");
    frame[len - 4..].copy_from_slice(&icrc.to_le_bytes());
}

#[test]
fn path_mtu_above_ours_is_rejected() {
    let mut net = Net::new(17);
    net.hcas[CLIENT].set_path_mtu(roce::types::Mtu::Mtu4096);
    net.hcas[SERVER].listen(PORT).unwrap();
    let client = net.hcas[CLIENT]
        .connect(server_addr(PORT), &params(b""))
        .unwrap();
    assert!(net.run_until(60 * SECOND, |net| !net.events[CLIENT].is_empty()));
    match &net.events[CLIENT][0] {
        CmEvent::Rejected { conn, reason, .. } => {
            assert_eq!(*conn, client);
            assert_eq!(*reason, RejectReason(26), "invalid MTU");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(net.events[SERVER].is_empty());
}

#[test]
fn jumbo_path_mtu_when_both_allow_it() {
    let mut net = Net::new(19);
    for hca in &mut net.hcas {
        hca.set_path_mtu(roce::types::Mtu::Mtu4096);
    }
    let c = connect(&mut net);
    assert_eq!(
        net.hcas[CLIENT]
            .qp(c.client)
            .and_then(|qp| qp.params())
            .map(|p| p.mtu),
        Some(roce::types::Mtu::Mtu4096)
    );
    exchange_data(&mut net, &c);
    disconnect(&mut net, &c, CLIENT);
}

#[test]
fn transport_failure_surfaces_disconnected() {
    let mut net = Net::new(23);
    net.hcas[SERVER].listen(PORT).unwrap();
    let client = net.hcas[CLIENT]
        .connect(
            server_addr(PORT),
            &ConnParams {
                retry_count: 1,
                ..params(b"")
            },
        )
        .unwrap();
    let client_region = region(&mut net.hcas[CLIENT]);
    assert!(net.run_until(60 * SECOND, |net| !net.events[SERVER].is_empty()));
    let server = net.events[SERVER].remove(0).conn();
    net.hcas[SERVER].accept(server, &params(b"")).unwrap();
    assert!(net.run_until(60 * SECOND, |net| !net.events[CLIENT].is_empty()));
    assert!(matches!(
        net.events[CLIENT].remove(0),
        CmEvent::Established { .. }
    ));
    // The server vanishes: nothing it sends arrives any more.
    net.set_verdict(|from, _| {
        if from == SERVER {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    net.hcas[CLIENT]
        .post_send(
            client,
            &[SendWr {
                wr_id: WrId(99),
                signaled: true,
                op: SendOp::Send {
                    sgl: Sgl::single(Sge::new(client_region.lkey, 0, 8)),
                    imm: None,
                },
            }],
        )
        .unwrap();
    assert!(net.run_until(600 * SECOND, |net| net.events[CLIENT]
        .contains(&CmEvent::Disconnected { conn: client })));
    let wc = net.completions[CLIENT]
        .iter()
        .find(|wc| wc.wr_id == WrId(99))
        .expect("the SEND completed");
    assert_eq!(wc.status, WcStatus::RetryExcErr);
}

/// Two Brick ends: the REQ offers selective retransmission (reserved MAD
/// byte 28, bit 0), the REP accepts it (reserved MAD byte 51, bit 0), and
/// both QPs run it (docs/protocol/selective-retransmission.md §2). The
/// Linux cases are the captures: a Linux REQ gets a REP equal to Linux's
/// (cm_capture), a Linux REP leaves Brick's client on go-back-N
/// (hca_rping_replay).
#[test]
fn two_brick_ends_negotiate_selective_retransmission() {
    let mut net = Net::new(7);
    let c = connect(&mut net);
    let mad = |attribute: u16| {
        net.sent
            .iter()
            .find(|(_, f)| cm_attribute(f) == Some(attribute))
            .map(|(_, f)| f[62..].to_vec())
            .expect("CM message sent")
    };
    assert_eq!(mad(attr::REQ)[28], 0x01, "REQ offer");
    assert_eq!(mad(attr::REP)[51] & 0x0f, 0x01, "REP acceptance");
    for (side, conn) in [(CLIENT, c.client), (SERVER, c.server)] {
        let params = net.hcas[side].qp(conn).unwrap().params().copied();
        assert_eq!(
            params.map(|p| p.selective_retransmission),
            Some(true),
            "side {side}"
        );
    }
    exchange_data(&mut net, &c);
}
