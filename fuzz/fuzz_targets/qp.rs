//! RC queue pairs (`roce::qp`, requester and responder) of two software
//! HCAs connected to each other, driven by a script: work requests of
//! every kind on both sides (SEND, SEND with immediate or invalidate,
//! RDMA WRITE with and without immediate, RDMA READ, LOCAL_INV; keys and
//! addresses right or wrong), receives, and a wire the script controls:
//! deliver, drop, duplicate, reorder, mutate a byte (checksums fixed, so
//! the transport sees it), rewrite the BTH opcode/PSN of the last frame,
//! time jumps (retransmissions, RNR delays, retry exhaustion).
//!
//! Invariants: no panic; every completion names a work request that was
//! posted on that side and not completed yet, on that side's QP; every
//! frame an HCA sends parses; once the wire turns lossless (and receives
//! are posted), every send-side work request of a QP with bounded retry
//! counts completes.
#![no_main]

use std::collections::{HashSet, VecDeque};

use brick_fuzz::engine::fix_checksums;
use brick_fuzz::script::Script;
use libfuzzer_sys::fuzz_target;
use roce::hca::{Hca, HcaConfig};
use roce::qp::QpParams;
use roce::types::{Mtu, Psn};
use verbs::{
    AccessFlags, ConnId, KeySource, MemoryRegion, RecvWr, Rkey, SendOp, SendWr, Sge, Sgl, Verbs,
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

type FuzzHca = Hca<Vec<u8>, Keys, 16, 2, 256>;

/// Registered memory per side. Messages are at most half of it: 8 KiB is
/// 32 packets at the 256-byte MTU, enough for first/middle/last packets,
/// windows and go-back-N; the packets are what each input costs.
const REGION: u32 = 16 << 10;
/// Exchanges the final lossless phase may take (each moves every frame
/// and completion, or jumps to the next timer).
const MAX_SETTLE_ROUNDS: u32 = 1_000;
/// Receive work requests carry this bit in their id.
const RECV: u64 = 1 << 63;

struct Side {
    hca: Box<FuzzHca>,
    conn: ConnId,
    mr: MemoryRegion,
    mac: [u8; 6],
    ip: [u8; 4],
    /// Work requests posted and not completed.
    outstanding: HashSet<u64>,
    next_id: u64,
    /// Frames sent to the peer, not delivered yet.
    wire: VecDeque<Vec<u8>>,
    /// The last frame delivered from this side (template for rewrites).
    last: Option<Vec<u8>>,
}

fn side(last: u8, seed: u64) -> Side {
    let mac = [0x52, 0x54, 0, 0x77, 0, last];
    let ip = [10, 77, 0, last];
    let mut hca = Box::new(FuzzHca::new(
        vec![0u8; 2 * REGION as usize],
        Keys(seed),
        HcaConfig { mac, ip },
    ));
    let conn = hca.create_qp().expect("qp");
    let handle = hca.alloc(REGION, 4096).expect("memory");
    let mr = hca
        .reg_mr(
            handle,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .expect("region");
    Side {
        hca,
        conn,
        mr,
        mac,
        ip,
        outstanding: HashSet::new(),
        next_id: 1,
        wire: VecDeque::new(),
        last: None,
    }
}

fn params(
    local: &Side,
    peer: &Side,
    send_psn: u32,
    recv_psn: u32,
    script: &mut Script<'_>,
) -> QpParams {
    let qpn = local.hca.qpn(local.conn).unwrap();
    QpParams {
        peer_qpn: peer.hca.qpn(peer.conn).unwrap(),
        send_psn: Psn::new_truncate(send_psn),
        recv_psn: Psn::new_truncate(recv_psn),
        mtu: [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][usize::from(script.below(3))],
        local_ack_timeout: 1 + script.below(20),
        retry_count: script.below(8),
        rnr_retry: script.below(8),
        min_rnr_timer: script.below(32),
        max_rd_atomic: 1 + script.below(4),
        max_dest_rd_atomic: 1 + script.below(4),
        remote_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path: local.hca.path_to(qpn, peer.mac, peer.ip),
        selective_retransmission: false,
    }
}

fn sge(side: &Side, script: &mut Script<'_>) -> Sgl {
    let len = u32::from(script.u16()) % (REGION / 2 + 1);
    let offset = u32::from(script.u16()) % (REGION - len + 1);
    Sgl::single(Sge::new(side.mr.lkey, offset, len))
}

fn post_send(local: &mut Side, peer: &Side, script: &mut Script<'_>) {
    let kind = script.below(8);
    let wrong = script.u8();
    let sgl = sge(local, script);
    let len = sgl.total_len().unwrap_or(0);
    let rkey = if wrong & 1 != 0 {
        Rkey(script.u32())
    } else {
        peer.mr.rkey
    };
    let remote_addr = if wrong & 2 != 0 {
        script.u64()
    } else {
        peer.mr.iova + u64::from(u32::from(script.u16()) % (REGION - len + 1))
    };
    let imm = (wrong & 4 != 0).then(|| script.u32());
    let op = match kind {
        0 => SendOp::Send { sgl, imm },
        1 => SendOp::SendWithInv {
            sgl,
            invalidate: rkey,
        },
        2 | 3 => SendOp::RdmaWrite {
            sgl,
            remote_addr,
            rkey,
            imm,
        },
        4 | 5 => SendOp::RdmaRead {
            sgl,
            remote_addr,
            rkey,
        },
        6 => SendOp::LocalInv { rkey },
        _ => {
            let bytes = [script.u8(); verbs::MAX_INLINE];
            let len = usize::from(script.below(verbs::MAX_INLINE as u8 + 1));
            SendOp::SendInline {
                data: verbs::Inline::try_from_slice(&bytes[..len]).unwrap_or_default(),
                imm,
            }
        }
    };
    let id = local.next_id;
    local.next_id += 1;
    let wr = SendWr {
        wr_id: WrId(id),
        signaled: true,
        op,
    };
    if local.hca.post_send(local.conn, &[wr]).is_ok() {
        local.outstanding.insert(id);
    }
}

fn post_recv(local: &mut Side, script: &mut Script<'_>) {
    let sgl = sge(local, script);
    let id = RECV | local.next_id;
    local.next_id += 1;
    let wr = RecvWr {
        wr_id: WrId(id),
        sgl,
    };
    if local.hca.post_recv(local.conn, &[wr]).is_ok() {
        local.outstanding.insert(id);
    }
}

/// Polls a side's HCA, its frames onto its wire (checked to parse).
fn transmit(side: &mut Side, now: u64) {
    let wire = &mut side.wire;
    for _ in 0..64 {
        let busy = side.hca.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
            let len = h.len() + p.iter().map(|piece| piece.len()).sum::<usize>() + t.len();
            let mut frame = Vec::with_capacity(len);
            frame.extend_from_slice(h);
            for piece in p {
                frame.extend_from_slice(piece);
            }
            frame.extend_from_slice(t);
            if let Err(error) = roce::wire::parse_frame(&frame) {
                panic!("the HCA sent a frame it cannot parse: {error}");
            }
            if wire.len() < 512 {
                wire.push_back(frame);
            }
        });
        if !busy {
            break;
        }
    }
}

fn completions(side: &mut Side) {
    let mut out = [WorkCompletion::new(
        WrId(0),
        side.conn,
        verbs::WcOpcode::Send,
        verbs::WcStatus::Success,
    ); 16];
    loop {
        let n = side.hca.poll_cq(&mut out);
        for wc in &out[..n] {
            assert_eq!(wc.conn, side.conn, "completion on a foreign QP: {wc:?}");
            assert!(
                side.outstanding.remove(&wc.wr_id.0),
                "completion of a work request not outstanding: {wc:?}"
            );
        }
        if n < out.len() {
            break;
        }
    }
}

fn deliver(from: &mut Side, to: &mut Side, now: u64, frame: Vec<u8>) {
    to.hca.receive(now, &frame);
    from.last = Some(frame);
}

/// After the script: receives posted on both sides for every SEND still to
/// come, then a lossless wire, the clock jumping to the next timer, until
/// no send-side work request of a bounded side is outstanding or ten
/// minutes of fake time pass. Every one must have completed (successfully or with an error) on
/// a side whose retry counts are bounded: a QP that stops retransmitting
/// with packets unacknowledged, or retries past its count, stalls here.
fn settle(a: &mut Side, b: &mut Side, mut now: u64) {
    // Retry and RNR retry counts of 7 mean "retry for ever" (as rxe does):
    // a peer that answers wrongly then keeps the requester retrying.
    let bounded = |side: &Side| {
        side.hca
            .qp(side.conn)
            .and_then(|qp| qp.params().copied())
            .is_some_and(|p| p.retry_count < 7 && p.rnr_retry < 7)
    };
    if !bounded(a) && !bounded(b) {
        return;
    }
    for side in [&mut *a, &mut *b] {
        for _ in 0..32 {
            let id = RECV | side.next_id;
            side.next_id += 1;
            let wr = RecvWr {
                wr_id: WrId(id),
                sgl: Sgl::single(Sge::new(side.mr.lkey, 0, REGION / 2)),
            };
            if side.hca.post_recv(side.conn, &[wr]).is_err() {
                break;
            }
            side.outstanding.insert(id);
        }
    }
    let limit = now + 600_000_000_000;
    // Only the bounded sides are waited for: nothing is asserted about a
    // side retrying for ever (it may never finish), and it keeps answering
    // the other side's requests while the loop runs.
    let sends = |side: &Side| {
        if bounded(side) {
            side.outstanding.iter().filter(|id| *id & RECV == 0).count()
        } else {
            0
        }
    };
    let mut rounds = 0;
    while now < limit && sends(a) + sends(b) > 0 {
        rounds += 1;
        if rounds > MAX_SETTLE_ROUNDS {
            // Still busy (retrying for ever, or a storm): no verdict.
            return;
        }
        transmit(a, now);
        transmit(b, now);
        let moved = !a.wire.is_empty() || !b.wire.is_empty();
        while let Some(frame) = a.wire.pop_front() {
            b.hca.receive(now, &frame);
        }
        while let Some(frame) = b.wire.pop_front() {
            a.hca.receive(now, &frame);
        }
        completions(a);
        completions(b);
        if !moved {
            let next = [a.hca.poll_at(now), b.hca.poll_at(now)]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(at) => now = at.max(now + 1),
                None => break,
            }
        }
    }
    let stuck: Vec<(&str, u64)> = [("a", &*a), ("b", &*b)]
        .into_iter()
        .filter(|(_, side)| bounded(side))
        .flat_map(|(name, side)| {
            side.outstanding
                .iter()
                .filter(|id| *id & RECV == 0)
                .map(move |id| (name, *id))
        })
        .collect();
    assert!(
        stuck.is_empty(),
        "send work requests never completed on a lossless wire: {stuck:?}\na: {:?}\nb: {:?}",
        a.hca.qp(a.conn).map(|qp| qp.snapshot()),
        b.hca.qp(b.conn).map(|qp| qp.snapshot())
    );
}

fuzz_target!(|input: &[u8]| {
    let mut script = Script::new(input);
    let mut a = side(1, 3);
    let mut b = side(2, 5);
    let (psn_a, psn_b) = (script.u32(), script.u32());
    let pa = params(&a, &b, psn_a, psn_b, &mut script);
    let pb = params(&b, &a, psn_b, psn_a, &mut script);
    a.hca.connect_qp(a.conn, pa).expect("connect a");
    b.hca.connect_qp(b.conn, pb).expect("connect b");
    let mut now = 1_000_000u64;
    while !script.done() {
        let op = script.below(12);
        let a_side = script.u8() & 1 == 0;
        let (local, peer) = if a_side {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        match op {
            0 | 1 => post_send(local, peer, &mut script),
            2 => post_recv(local, &mut script),
            3 => transmit(local, now),
            4 | 5 => {
                if let Some(frame) = local.wire.pop_front() {
                    deliver(local, peer, now, frame);
                }
            }
            6 => {
                if let Some(mut frame) = local.wire.pop_front() {
                    if frame.len() > 14 {
                        let at = 14 + usize::from(script.u16()) % (frame.len() - 14);
                        frame[at] ^= script.u8() | 1;
                        if script.u8() & 1 == 0 {
                            fix_checksums(&mut frame);
                        }
                    }
                    deliver(local, peer, now, frame);
                }
            }
            7 => {
                local.wire.pop_front();
            }
            8 => {
                if let Some(frame) = local.wire.front().cloned() {
                    deliver(local, peer, now, frame);
                }
            }
            9 => {
                if let Some(frame) = local.wire.pop_front() {
                    local.wire.push_back(frame);
                }
            }
            10 => {
                // The last delivered frame with another BTH opcode / PSN.
                if let Some(mut frame) = local.last.clone() {
                    if frame.len() >= 54 {
                        frame[42] = script.u8();
                        let psn = script.u32().to_be_bytes();
                        if psn[0] & 1 != 0 {
                            frame[51..54].copy_from_slice(&psn[1..]);
                        }
                        fix_checksums(&mut frame);
                    }
                    deliver(local, peer, now, frame);
                }
            }
            _ => {
                now += u64::from(script.u16()) * 100_000 + 1;
                transmit(&mut a, now);
                transmit(&mut b, now);
            }
        }
        completions(&mut a);
        completions(&mut b);
    }
    settle(&mut a, &mut b, now);
});
