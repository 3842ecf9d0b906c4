//! The RTRS client against a hostile, scripted server on the loopback
//! fabric: malformed CONN_RSPs, INFO_RSPs, immediates, RKEY_RSPs and unknown
//! message ids are reported as errors or ignored, never a panic, and never a
//! double or phantom completion (property tests).

mod client_support;

use std::collections::HashSet;

use client_support::*;
use proptest::prelude::*;
use rtrs::client::{Client, ClientIo, Direction, Event, PathError, PathStatus};
use rtrs::wire::{BufferDesc, ConnRsp, ConnRspFlags, Imm, InfoRsp, RkeyRsp, SgDesc};
use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, Memory, MemoryRegion, RecvWr, SendOp, SendWr, Sgl,
    Verbs, WrId,
};

const QD: u16 = 8;
const CHUNK: u32 = 16 * 1024;
const HDR: u32 = 4096;

/// A scripted server on side 1 of the fabric.
struct RawServer {
    verbs: LoopVerbs,
    conns: Vec<ConnId>,
    chunks: MemoryRegion,
    send_buffer: MemoryRegion,
    info_req: MemoryRegion,
}

impl RawServer {
    fn new(fabric: &Fabric) -> Self {
        let mut verbs = fabric.verbs(1);
        verbs.listen(1234).unwrap();
        let handle = verbs.alloc(u32::from(QD) * CHUNK, 64).unwrap();
        let chunks = verbs
            .reg_mr(
                handle,
                AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
            )
            .unwrap();
        let handle = verbs.alloc(64 * 1024, 64).unwrap();
        let send_buffer = verbs.reg_mr(handle, AccessFlags::LOCAL_WRITE).unwrap();
        let handle = verbs.alloc(4096, 64).unwrap();
        let info_req = verbs.reg_mr(handle, AccessFlags::LOCAL_WRITE).unwrap();
        Self {
            verbs,
            conns: Vec::new(),
            chunks,
            send_buffer,
            info_req,
        }
    }

    fn good_conn_rsp(new_rkey: bool) -> Vec<u8> {
        let flags = if new_rkey {
            ConnRspFlags::NEW_RKEY
        } else {
            ConnRspFlags(0)
        };
        let rsp = ConnRsp::accept(QD, CHUNK - HDR, HDR, flags);
        let mut buf = vec![0u8; ConnRsp::LEN];
        rsp.emit(&mut buf).unwrap();
        buf
    }

    fn good_info_rsp(&self) -> Vec<u8> {
        let desc = SgDesc::new(BufferDesc {
            addr: self.chunks.iova,
            rkey: self.chunks.rkey,
            len: u32::from(QD) * CHUNK,
        });
        let descriptors = [desc];
        let rsp = InfoRsp {
            descriptors: &descriptors,
        };
        let mut buf = vec![0u8; rsp.buffer_len()];
        rsp.emit(&mut buf).unwrap();
        buf
    }

    /// Accepts every pending connect request with `conn_rsp`.
    fn accept_all(&mut self, conn_rsp: &[u8]) -> bool {
        let mut any = false;
        while let Some(event) = self.verbs.poll_cm_event() {
            any = true;
            if let CmEvent::ConnectRequest { conn, .. } = event {
                let recvs: Vec<RecvWr> = (0..64)
                    .map(|i| RecvWr {
                        wr_id: WrId(i),
                        sgl: if i == 0 && self.conns.is_empty() {
                            Sgl::single(self.info_req.sge(0, 4096))
                        } else {
                            Sgl::new()
                        },
                    })
                    .collect();
                self.verbs.post_recv(conn, &recvs).unwrap();
                let _ = self
                    .verbs
                    .accept(conn, &ConnParams::new(conn_rsp, 1024, 1024));
                self.conns.push(conn);
            }
        }
        any
    }

    /// Drains completions; whether an INFO_REQ arrived.
    fn info_req_arrived(&mut self) -> bool {
        let mut wcs = [verbs::WorkCompletion::default(); 64];
        let n = self.verbs.poll_cq(&mut wcs);
        wcs[..n]
            .iter()
            .any(|wc| wc.opcode == verbs::WcOpcode::Recv && wc.byte_len == 272)
    }

    fn send(&mut self, cid: usize, payload: &[u8], imm: Option<u32>) {
        let Some(&conn) = self.conns.get(cid) else {
            return;
        };
        self.verbs
            .write(self.send_buffer.handle, 0, payload)
            .unwrap();
        let sgl = if payload.is_empty() {
            Sgl::new()
        } else {
            Sgl::single(self.send_buffer.sge(0, payload.len() as u32))
        };
        let _ = self.verbs.post_send(
            conn,
            &[SendWr {
                wr_id: WrId(0),
                signaled: false,
                op: SendOp::Send { sgl, imm },
            }],
        );
    }

    fn write_imm(&mut self, cid: usize, imm: u32) {
        let Some(&conn) = self.conns.get(cid) else {
            return;
        };
        let _ = self.verbs.post_send(
            conn,
            &[SendWr {
                wr_id: WrId(0),
                signaled: false,
                op: SendOp::RdmaWrite {
                    sgl: Sgl::new(),
                    remote_addr: 0,
                    rkey: verbs::Rkey(0),
                    imm: Some(imm),
                },
            }],
        );
    }
}

struct World {
    fabric: Fabric,
    client: Client<LoopVerbs>,
    server: RawServer,
    events: Vec<Event>,
    now: u64,
}

impl World {
    fn new() -> Self {
        let fabric = Fabric::new(&[server_addr(0).ip(), server_addr(1).ip()], 4 << 20);
        let server = RawServer::new(&fabric);
        let client = Client::new(fabric.verbs(0), client_config()).unwrap();
        Self {
            fabric,
            client,
            server,
            events: Vec::new(),
            now: 1,
        }
    }

    fn pump(&mut self) {
        for _ in 0..200 {
            let mut busy = self.client.poll(self.now);
            busy |= self.fabric.run();
            while let Some(e) = self.client.next_event() {
                self.events.push(e);
                busy = true;
            }
            if !busy {
                break;
            }
        }
    }

    /// Runs establishment with the given CONN_RSP and INFO_RSP bytes.
    fn establish(&mut self, conn_rsp: &[u8], info_rsp: Option<&[u8]>, cids: u16) {
        self.client
            .connect_session("hostile", &[server_addr(0)], cids, self.now)
            .unwrap();
        let mut sent_info = false;
        for _ in 0..50 {
            self.pump();
            let accepted = self.server.accept_all(conn_rsp);
            if !sent_info && self.server.info_req_arrived() {
                let good = self.server.good_info_rsp();
                self.server.send(0, info_rsp.unwrap_or(&good), None);
                sent_info = true;
            }
            self.pump();
            if !accepted && !self.fabric.run() && sent_info {
                break;
            }
        }
        self.pump();
    }

    fn write(&mut self, tag: u64) -> bool {
        self.client
            .submit(ClientIo {
                tag,
                header: &header(b'W', 0),
                direction: Direction::Write { data: Sgl::new() },
                admin: false,
                hint: None,
            })
            .is_ok()
    }
}

fn connect_failed(events: &[Event]) -> Option<PathError> {
    events.iter().find_map(|e| match e {
        Event::PathConnectFailed { reason, .. } => Some(*reason),
        _ => None,
    })
}

#[test]
fn scripted_server_establishes() {
    let mut world = World::new();
    world.establish(&RawServer::good_conn_rsp(true), None, 2);
    assert_eq!(world.client.path_status(0), Some(PathStatus::Connected));
    assert!(world.write(1));
    world.pump();
    // Answer with an RKEY_RSP carrying a new rkey on cid 1 (the first
    // request holds permit 0).
    let mut rsp = [0u8; 8];
    RkeyRsp {
        buf_id: 0,
        rkey: verbs::Rkey(0xabcd),
    }
    .emit(&mut rsp)
    .unwrap();
    let imm = Imm::IoRsp {
        msg_id: 0,
        errno: 0,
    }
    .encode()
    .unwrap();
    world.server.send(1, &rsp, Some(imm));
    world.pump();
    assert!(world.events.iter().any(|e| matches!(
        e,
        Event::IoCompleted {
            tag: 1,
            errno: 0,
            ..
        }
    )));
    assert_eq!(world.client.chunk(0, 0).unwrap().rkey, verbs::Rkey(0xabcd));
}

#[test]
fn bad_conn_rsp_fails_the_attempt() {
    let cases: Vec<Vec<u8>> = vec![
        vec![0; 10],
        {
            let mut b = RawServer::good_conn_rsp(false);
            b[0] = 0; // magic
            b
        },
        {
            let mut b = RawServer::good_conn_rsp(false);
            b[3] = 3; // major version 3
            b
        },
        {
            let mut b = RawServer::good_conn_rsp(false);
            b[6..8].copy_from_slice(&1000u16.to_le_bytes()); // qd over capacity
            b
        },
        {
            let mut b = RawServer::good_conn_rsp(false);
            b[8..12].copy_from_slice(&(1u32 << 30).to_le_bytes()); // imm bits
            b
        },
        {
            let mut b = RawServer::good_conn_rsp(false);
            b[4..6].copy_from_slice(&(-22i16).to_le_bytes()); // errno in an accept
            b
        },
    ];
    for case in cases {
        let mut world = World::new();
        world.establish(&case, None, 1);
        assert!(
            connect_failed(&world.events).is_some(),
            "{case:?}: {:?}",
            world.events
        );
        assert_ne!(world.client.path_status(0), Some(PathStatus::Connected));
        assert!(!world.write(1));
    }
}

#[test]
fn bad_info_rsp_fails_the_attempt() {
    let world = World::new();
    let good = world.server.good_info_rsp();
    let mut cases = Vec::new();
    let mut b = good.clone();
    b[0] = 4; // type
    cases.push(b);
    let mut b = good.clone();
    b[2..4].copy_from_slice(&0u16.to_le_bytes()); // sg_cnt 0
    cases.push(b);
    let mut b = good.clone();
    b[2..4].copy_from_slice(&3u16.to_le_bytes()); // qd % sg_cnt != 0, truncated
    cases.push(b);
    let mut b = good.clone();
    b[20..24].copy_from_slice(&(CHUNK * 8 + 1).to_le_bytes()); // len not a multiple
    cases.push(b);
    let mut b = good.clone();
    b[20..24].copy_from_slice(&(CHUNK * 4).to_le_bytes()); // too few chunks
    cases.push(b);
    cases.push(good[..6].to_vec()); // truncated
    for case in cases {
        let mut world = World::new();
        world.establish(&RawServer::good_conn_rsp(false), Some(&case), 2);
        assert_eq!(
            connect_failed(&world.events),
            Some(PathError::BadInfoRsp),
            "{case:?}: {:?}",
            world.events
        );
    }
}

#[test]
fn malformed_rkey_rsp_starts_error_recovery() {
    let mut world = World::new();
    world.establish(&RawServer::good_conn_rsp(true), None, 2);
    assert!(world.write(1));
    world.pump();
    let mut rsp = [0u8; 8];
    RkeyRsp {
        buf_id: 3,
        rkey: verbs::Rkey(1),
    }
    .emit(&mut rsp)
    .unwrap();
    // msg_id differs from buf_id.
    let imm = Imm::IoRsp {
        msg_id: 7,
        errno: 0,
    }
    .encode()
    .unwrap();
    world.server.send(1, &rsp, Some(imm));
    world.pump();
    assert!(world.events.iter().any(|e| matches!(
        e,
        Event::PathDown {
            reason: PathError::ProtocolViolation,
            ..
        }
    )));
    // The request failed (no path left) exactly once.
    let done: Vec<_> = world
        .events
        .iter()
        .filter(|e| matches!(e, Event::IoCompleted { tag: 1, .. }))
        .collect();
    assert_eq!(done.len(), 1);
}

/// A server message in the property test.
#[derive(Debug, Clone)]
enum Hostile {
    Imm {
        cid: usize,
        imm: u32,
    },
    Send {
        cid: usize,
        payload: Vec<u8>,
        imm: Option<u32>,
    },
    Submit,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let rsp_imm = (0u32..3, 0u32..12, 0u32..600)
        .prop_map(|(kind, msg_id, errno)| (kind << 28) | ((errno & 0x1ff) << 19) | msg_id);
    prop_oneof![
        (0usize..3, any::<u32>()).prop_map(|(cid, imm)| Hostile::Imm { cid, imm }),
        (0usize..3, rsp_imm.clone()).prop_map(|(cid, imm)| Hostile::Imm { cid, imm }),
        (
            0usize..3,
            prop::collection::vec(any::<u8>(), 0..12),
            prop::option::of(rsp_imm)
        )
            .prop_map(|(cid, payload, imm)| Hostile::Send { cid, payload, imm }),
        (0usize..3, 0u16..10, any::<u32>(), 0u32..12).prop_map(|(cid, buf_id, rkey, msg_id)| {
            let mut payload = vec![0u8; 8];
            RkeyRsp {
                buf_id,
                rkey: verbs::Rkey(rkey),
            }
            .emit(&mut payload)
            .unwrap();
            Hostile::Send {
                cid,
                payload,
                imm: Some((1 << 28) | msg_id),
            }
        }),
        Just(Hostile::Submit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn hostile_traffic_never_panics_or_double_completes(
        new_rkey in any::<bool>(),
        script in prop::collection::vec(hostile(), 1..40),
    ) {
        let mut world = World::new();
        world.establish(&RawServer::good_conn_rsp(new_rkey), None, 3);
        prop_assert_eq!(world.client.path_status(0), Some(PathStatus::Connected));
        let mut submitted = HashSet::new();
        let mut next_tag = 0u64;
        for step in script {
            match step {
                Hostile::Imm { cid, imm } => world.server.write_imm(cid, imm),
                Hostile::Send { cid, payload, imm } => world.server.send(cid, &payload, imm),
                Hostile::Submit => {
                    if world.write(next_tag) {
                        submitted.insert(next_tag);
                    }
                    next_tag += 1;
                }
            }
            world.pump();
            world.now += 10 * MS;
            prop_assert!(world.client.inflight() <= usize::from(QD));
        }
        let mut done = HashSet::new();
        for event in &world.events {
            if let Event::IoCompleted { tag, .. } = event {
                prop_assert!(submitted.contains(tag), "phantom completion {}", tag);
                prop_assert!(done.insert(*tag), "double completion {}", tag);
            }
        }
        prop_assert_eq!(world.client.inflight() + done.len(), submitted.len());
    }
}

#[test]
fn queue_depth_change_on_reconnect_closes_the_path() {
    let mut world = World::new();
    world.establish(&RawServer::good_conn_rsp(false), None, 1);
    assert_eq!(world.client.path_status(0), Some(PathStatus::Connected));
    world.fabric.kill(server_addr(0).ip());
    world.pump();
    assert!(world.events.contains(&Event::SessionDown));
    let mut changed = RawServer::good_conn_rsp(false);
    changed[6..8].copy_from_slice(&16u16.to_le_bytes());
    world.now += 2 * SECOND;
    for _ in 0..4 {
        world.pump();
        world.server.accept_all(&changed);
    }
    world.pump();
    assert_eq!(
        connect_failed(&world.events),
        Some(PathError::QueueDepthChanged),
        "{:?}",
        world.events
    );
    assert!(world.events.contains(&Event::PathClosed { path: 0 }));
    assert_eq!(world.client.path_status(0), Some(PathStatus::Closed));
    // Closed for good: no further attempts.
    let reqs = world.fabric.con_reqs().len();
    world.now += 10 * SECOND;
    world.pump();
    assert_eq!(world.fabric.con_reqs().len(), reqs);
}

#[test]
fn unknown_and_stale_responses_are_ignored() {
    let mut world = World::new();
    world.establish(&RawServer::good_conn_rsp(false), None, 2);
    assert!(world.write(1));
    world.pump();
    let rsp = |msg_id, errno| Imm::IoRsp { msg_id, errno }.encode().unwrap();
    // msg_id beyond qd, a free permit, a request-type imm, an unknown type.
    world.server.write_imm(1, rsp(100, 0));
    world.server.write_imm(1, rsp(5, 0));
    world.server.write_imm(0, 0x0000_1234);
    world.server.write_imm(0, 0xf000_0000);
    world.pump();
    let stats = world.client.path_stats(0).unwrap();
    assert_eq!(stats.protocol_errors, 4);
    assert_eq!(world.client.path_status(0), Some(PathStatus::Connected));
    assert!(!world
        .events
        .iter()
        .any(|e| matches!(e, Event::IoCompleted { .. })));
    // The real answer completes it, with its errno; a repeat is ignored.
    world.server.write_imm(1, rsp(0, 5));
    world.server.write_imm(1, rsp(0, 0));
    world.pump();
    let done: Vec<_> = world
        .events
        .iter()
        .filter(|e| matches!(e, Event::IoCompleted { .. }))
        .collect();
    assert_eq!(
        done,
        [&Event::IoCompleted {
            tag: 1,
            errno: 5,
            answered_on: Some(0),
            read: None
        }]
    );
    // A SEND with payload in NEW_RKEY-less mode is a protocol violation.
    world.server.send(1, &[1, 2, 3, 4, 5, 6, 7, 8], None);
    world.pump();
    assert!(world.events.iter().any(|e| matches!(
        e,
        Event::PathDown {
            reason: PathError::ProtocolViolation,
            ..
        }
    )));
}

#[test]
fn silent_server_times_out() {
    // No answer to the CON_REQ.
    let mut world = World::new();
    world
        .client
        .connect_session("hostile", &[server_addr(0)], 2, world.now)
        .unwrap();
    world.pump();
    world.now += 31 * SECOND;
    world.pump();
    assert_eq!(connect_failed(&world.events), Some(PathError::Timeout));
    // Connections accepted, but INFO_RSP never comes.
    let mut world = World::new();
    world
        .client
        .connect_session("hostile", &[server_addr(0)], 2, world.now)
        .unwrap();
    for _ in 0..4 {
        world.pump();
        world.server.accept_all(&RawServer::good_conn_rsp(false));
    }
    world.pump();
    assert_eq!(
        world.client.path_status(0),
        Some(PathStatus::WaitingForInfoRsp)
    );
    world.now += 31 * SECOND;
    world.pump();
    assert_eq!(connect_failed(&world.events), Some(PathError::Timeout));
    assert_eq!(
        world.client.path_status(0),
        Some(PathStatus::WaitingToReconnect)
    );
}
