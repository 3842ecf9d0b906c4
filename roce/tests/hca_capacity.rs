//! An HCA sized at run time ([`HcaCapacity`]): more QPs than any const
//! table had, QPs found by QPN, and a completion queue that cannot
//! overflow. The flood posts a full send depth of signalled RDMA WRITEs on
//! every one of 1,024 QPs, lets the peer answer each QP's burst with one
//! cumulative ACK (its queued ACKs coalesce), and polls nothing until every
//! ACK has landed: every completion must then be in the CQ, once.

use std::collections::HashMap;

use roce::capacity::CapacityError;
use roce::hca::{Hca, HcaConfig, QpError};
use roce::qp::QpParams;
use roce::types::{Mtu, Psn};
use roce::HcaCapacity;
use verbs::{
    AccessFlags, ConnId, KeySource, MemoryRegion, PostError, SendOp, SendWr, Sgl, Verbs, WcStatus,
    WorkCompletion, WrId,
};

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

type RuntimeHca = Hca<Vec<u8>, Keys>;

const A_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const B_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const A_IP: [u8; 4] = [10, 9, 0, 1];
const B_IP: [u8; 4] = [10, 9, 0, 2];

fn hca(mac: [u8; 6], ip: [u8; 4], seed: u64, capacity: HcaCapacity) -> Box<RuntimeHca> {
    Box::new(
        Hca::with_capacity(
            vec![0u8; 1 << 20],
            Keys(seed),
            HcaConfig { mac, ip },
            roce::hca::LinkMode::Ethernet,
            capacity,
        )
        .expect("capacity in range"),
    )
}

fn params(local: &RuntimeHca, conn: ConnId, peer: &RuntimeHca, peer_conn: ConnId) -> QpParams {
    let qpn = local.qpn(conn).unwrap();
    QpParams {
        peer_qpn: peer.qpn(peer_conn).unwrap(),
        send_psn: Psn::new(100),
        recv_psn: Psn::new(100),
        mtu: Mtu::Mtu1024,
        local_ack_timeout: 14,
        retry_count: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        remote_access: AccessFlags::REMOTE_WRITE,
        path: local.path_to(qpn, peer.config().mac, peer.config().ip),
        selective_retransmission: false,
    }
}

fn region(hca: &mut RuntimeHca) -> MemoryRegion {
    let handle = hca.alloc(4096, 64).unwrap();
    hca.reg_mr(handle, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap()
}

/// Moves every frame `from` has to send into `to`; returns how many.
fn carry(now: u64, from: &mut RuntimeHca, to: &mut RuntimeHca) -> usize {
    let mut frames: Vec<Vec<u8>> = Vec::new();
    while from.poll(now, &mut |headers: &[u8],
                               payload: &[&[u8]],
                               trailer: &[u8]| {
        let mut frame = headers.to_vec();
        for piece in payload {
            frame.extend_from_slice(piece);
        }
        frame.extend_from_slice(trailer);
        frames.push(frame);
    }) {}
    for frame in &frames {
        to.receive(now, frame);
    }
    frames.len()
}

/// `count` connected QP pairs between two HCAs of `capacity`.
fn pairs(
    capacity: HcaCapacity,
    count: usize,
) -> (Box<RuntimeHca>, Box<RuntimeHca>, Vec<(ConnId, ConnId)>) {
    let mut a = hca(A_MAC, A_IP, 1, capacity);
    let mut b = hca(B_MAC, B_IP, 2, capacity);
    let mut conns = Vec::new();
    for _ in 0..count {
        let ca = a.create_qp().expect("room for the QP");
        let cb = b.create_qp().expect("room for the QP");
        let pa = params(&a, ca, &b, cb);
        let pb = params(&b, cb, &a, ca);
        a.connect_qp(ca, pa).unwrap();
        b.connect_qp(cb, pb).unwrap();
        conns.push((ca, cb));
    }
    (a, b, conns)
}

fn write(id: u64, target: &MemoryRegion, source: &MemoryRegion) -> SendWr {
    SendWr {
        wr_id: WrId(id),
        signaled: true,
        op: SendOp::RdmaWrite {
            sgl: Sgl::single(source.sge(0, 64)),
            remote_addr: target.remote_addr(0),
            rkey: target.rkey,
            imm: None,
        },
    }
}

#[test]
fn cumulative_acks_on_a_thousand_qps_lose_no_completion() {
    const QPS: usize = 1024;
    const SEND_DEPTH: usize = 32;
    let capacity = HcaCapacity::new(QPS, 16, SEND_DEPTH, 4).unwrap();
    assert_eq!(capacity.cq_entries, QPS * (SEND_DEPTH + 4));
    let (mut a, mut b, conns) = pairs(capacity, QPS);
    assert_eq!(a.completion_queue().reserved(), capacity.cq_entries);
    let source = region(&mut a);
    let target = region(&mut b);
    for (index, &(ca, _)) in conns.iter().enumerate() {
        let wrs: Vec<SendWr> = (0..SEND_DEPTH)
            .map(|n| write((index * SEND_DEPTH + n) as u64, &target, &source))
            .collect();
        a.post_send(ca, &wrs).expect("a full send depth fits");
        // The depth is full: one more is refused, not queued.
        assert_eq!(
            a.post_send(ca, &[write(u64::MAX, &target, &source)]),
            Err(PostError::QueueFull)
        );
    }
    // Every WRITE reaches B before B sends anything: each QP's ACKs
    // coalesce into one cumulative ACK retiring its whole send depth.
    let now = 1_000_000;
    let writes = carry(now, &mut a, &mut b);
    assert_eq!(writes, QPS * SEND_DEPTH);
    let acks = carry(now, &mut b, &mut a);
    assert!(
        acks <= QPS + QPS / 8,
        "{acks} ACKs for {QPS} QPs: not cumulative"
    );
    assert_eq!(a.counters().cq_overflows, 0);
    assert_eq!(a.completion_queue().len(), QPS * SEND_DEPTH);
    // Unconsumed completions hold the depth: still no room to post.
    assert_eq!(
        a.post_send(conns[0].0, &[write(u64::MAX, &target, &source)]),
        Err(PostError::QueueFull)
    );
    let mut seen: HashMap<u64, ConnId> = HashMap::new();
    let mut batch = [WorkCompletion::default(); 64];
    loop {
        let got = a.poll_cq(&mut batch);
        if got == 0 {
            break;
        }
        for wc in &batch[..got] {
            assert_eq!(wc.status, WcStatus::Success);
            assert!(
                seen.insert(wc.wr_id.0, wc.conn).is_none(),
                "{:?} twice",
                wc.wr_id
            );
        }
    }
    assert_eq!(seen.len(), QPS * SEND_DEPTH);
    for (id, conn) in &seen {
        assert_eq!(
            *conn,
            conns[*id as usize / SEND_DEPTH].0,
            "wr {id} on the wrong QP"
        );
    }
    // Consumed: the depth is free again.
    a.post_send(conns[0].0, &[write(0, &target, &source)])
        .expect("room after polling");
}

#[test]
fn a_completion_queue_too_small_refuses_the_qp_by_name() {
    let mut capacity = HcaCapacity::new(8, 16, 32, 8).unwrap();
    capacity.cq_entries = 3 * 40 + 39;
    let mut a = hca(A_MAC, A_IP, 3, capacity);
    for _ in 0..3 {
        a.create_qp().expect("three budgets fit");
    }
    let error = a.create_qp().unwrap_err();
    let QpError::CompletionQueueFull(full) = error else {
        panic!("expected CompletionQueueFull, got {error:?}");
    };
    assert_eq!((full.needed, full.free, full.capacity), (40, 39, 159));
    assert_eq!(
        error.to_string(),
        "new queue pair: completion queue cannot reserve 40 entries: 39 of 159 unreserved"
    );
    // A CQ below one QP's budget is refused when building.
    capacity.cq_entries = 39;
    let refused = Hca::<Vec<u8>, Keys>::with_capacity(
        vec![0u8; 4096],
        Keys(4),
        HcaConfig {
            mac: A_MAC,
            ip: A_IP,
        },
        roce::hca::LinkMode::Ethernet,
        capacity,
    );
    assert_eq!(
        refused.err(),
        Some(CapacityError::CompletionQueue {
            entries: 39,
            per_qp: 40
        })
    );
}

#[test]
fn qp_table_is_full_at_its_capacity_and_slots_are_reused() {
    let capacity = HcaCapacity::new(5, 16, 4, 4).unwrap();
    let mut a = hca(A_MAC, A_IP, 5, capacity);
    let conns: Vec<ConnId> = (0..5).map(|_| a.create_qp().unwrap()).collect();
    assert_eq!(a.create_qp(), Err(QpError::TableFull));
    // The QPN names the slot: every slot once.
    let mut slots: Vec<usize> = conns.iter().map(|c| c.0 as usize % 5).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3, 4]);
    a.destroy(conns[2]).unwrap();
    let again = a.create_qp().unwrap();
    assert_ne!(again, conns[2], "a new QP gets a new QPN");
    assert_eq!(again.0 as usize % 5, conns[2].0 as usize % 5);
    assert!(a.qp(conns[2]).is_none());
    assert!(a.qp(again).is_some());
}

#[test]
fn destroyed_qps_keep_their_unconsumed_entries_reserved() {
    let capacity = HcaCapacity::new(2, 16, 4, 4).unwrap();
    let (mut a, mut b, conns) = pairs(capacity, 2);
    let source = region(&mut a);
    let target = region(&mut b);
    let (ca, _) = conns[0];
    let wrs: Vec<SendWr> = (0..4).map(|n| write(n, &target, &source)).collect();
    a.post_send(ca, &wrs).unwrap();
    carry(1_000_000, &mut a, &mut b);
    carry(1_000_000, &mut b, &mut a);
    assert_eq!(a.completion_queue().len(), 4);
    a.destroy(ca).unwrap();
    // The 4 completions still need their entries: a new QP must not be
    // able to reserve a full budget on top of them.
    assert_eq!(a.completion_queue().reserved(), 8 + 4);
    assert!(matches!(
        a.create_qp(),
        Err(QpError::CompletionQueueFull(_))
    ));
    let mut batch = [WorkCompletion::default(); 8];
    assert_eq!(a.poll_cq(&mut batch), 4);
    assert_eq!(a.completion_queue().reserved(), 8);
    a.create_qp().expect("entries given back once consumed");
}
