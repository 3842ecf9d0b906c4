//! RC transport scenarios between two software HCAs over a scripted link.
//!
//! Each test sets up a connected pair (tests/rc_support), scripts losses or
//! reorderings of particular frames and checks data, completions, wire
//! reactions (ACK/NAK codes, PSNs) and counters against roce-v2.md §2 and the
//! behaviours recorded in tests/vectors/README.md (lost ACK, lost NAK, stale
//! ACK, go-back-N, and the rnbd-lossy-stall bug Brick must not share).

mod rc_support;

use proptest::prelude::*;
use rc_support::{Pair, PairConfig, Verdict, A_TO_B, B_TO_A};
use roce::qp::QpState;
use roce::types::{Msn, Mtu, Psn};
use roce::wire::{parse_frame, NakCode, Opcode, RoceFrame, Syndrome};
use verbs::{
    AccessFlags, Inline, Memory, MemoryRegion, RecvWr, SendOp, SendWr, Sge, Sgl, Verbs, WcOpcode,
    WcStatus, WorkCompletion, WrId,
};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn region(hca: &mut rc_support::TestHca, len: u32, access: AccessFlags) -> MemoryRegion {
    let handle = hca.alloc(len, 64).unwrap();
    hca.reg_mr(handle, access).unwrap()
}

fn fill(hca: &mut rc_support::TestHca, mr: &MemoryRegion, seed: u8) {
    let bytes: Vec<u8> = (0..mr.len())
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    hca.write(mr.handle, 0, &bytes).unwrap();
}

fn read(hca: &rc_support::TestHca, mr: &MemoryRegion, offset: u32, len: u32) -> Vec<u8> {
    let mut out = vec![0; len as usize];
    hca.read(mr.handle, offset, &mut out).unwrap();
    out
}

fn completions(hca: &mut rc_support::TestHca) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 64];
    let n = hca.poll_cq(&mut out);
    out[..n].to_vec()
}

fn wr(id: u64, op: SendOp) -> SendWr {
    SendWr {
        wr_id: WrId(id),
        signaled: true,
        op,
    }
}

fn sgl(mr: &MemoryRegion, offset: u32, len: u32) -> Sgl {
    Sgl::single(Sge::new(mr.lkey, offset, len))
}

/// Runs until both endpoints are idle (nothing in flight, nothing due).
fn settle(pair: &mut Pair) {
    let limit = pair.now + 60_000_000_000;
    pair.run_until(limit, |pair| {
        pair.in_flight() == 0
            && pair.a.hca.poll_at(pair.now).is_none()
            && pair.b.hca.poll_at(pair.now).is_none()
    });
}

/// Collects completions of `side` until `count` arrived (or time runs out).
fn wait_completions(pair: &mut Pair, side: usize, count: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let limit = pair.now + 120_000_000_000;
    pair.run_until(limit, |pair| {
        got.extend(completions(&mut pair.side(side).hca));
        got.len() >= count
    });
    got
}

fn parsed_acks(frames: &[Vec<u8>]) -> Vec<(Psn, Syndrome, Msn)> {
    frames
        .iter()
        .filter_map(|frame| {
            let parsed = parse_frame(frame).ok()?;
            if parsed.bth.opcode != Opcode::RcAcknowledge {
                return None;
            }
            let aeth = parsed.ext.aeth?;
            Some((parsed.bth.psn, aeth.syndrome, aeth.msn))
        })
        .collect()
}

fn is_data(frame: &RoceFrame<'_>) -> bool {
    !matches!(frame.bth.opcode, Opcode::RcAcknowledge)
}

#[test]
fn every_opcode_both_directions() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096] {
        let mut pair = Pair::new(PairConfig {
            mtu,
            ..PairConfig::default()
        });
        for (dir, _) in [(A_TO_B, ()), (B_TO_A, ())] {
            let (local, remote) = if dir == A_TO_B {
                (&mut pair.a, &mut pair.b)
            } else {
                (&mut pair.b, &mut pair.a)
            };
            let src = region(&mut local.hca, 64 << 10, RW);
            fill(&mut local.hca, &src, 7);
            let dst = region(&mut remote.hca, 64 << 10, RW);
            let recv = region(&mut remote.hca, 64 << 10, RW);
            let inv = region(&mut remote.hca, 4096, RW);
            fill(&mut remote.hca, &dst, 9);
            for i in 0..4u32 {
                remote
                    .hca
                    .post_recv(
                        remote.conn,
                        &[RecvWr {
                            wr_id: WrId(100 + u64::from(i)),
                            sgl: sgl(&recv, i * 16384, 16384),
                        }],
                    )
                    .unwrap();
            }
            let ops = vec![
                wr(
                    1,
                    SendOp::Send {
                        sgl: sgl(&src, 0, 5000),
                        imm: None,
                    },
                ),
                wr(
                    2,
                    SendOp::Send {
                        sgl: sgl(&src, 10, 0),
                        imm: Some(0xdead_beef),
                    },
                ),
                wr(
                    3,
                    SendOp::RdmaWrite {
                        sgl: sgl(&src, 100, 9000),
                        remote_addr: dst.remote_addr(50),
                        rkey: dst.rkey,
                        imm: None,
                    },
                ),
                wr(
                    4,
                    SendOp::RdmaWrite {
                        sgl: sgl(&src, 200, 3000),
                        remote_addr: dst.remote_addr(20000),
                        rkey: dst.rkey,
                        imm: Some(42),
                    },
                ),
                wr(
                    5,
                    SendOp::RdmaWrite {
                        sgl: Sgl::new(),
                        remote_addr: 0,
                        rkey: verbs::Rkey(0),
                        imm: None,
                    },
                ),
                wr(
                    6,
                    SendOp::RdmaRead {
                        sgl: sgl(&src, 30000, 7777),
                        remote_addr: dst.remote_addr(40000),
                        rkey: dst.rkey,
                    },
                ),
                wr(
                    7,
                    SendOp::SendWithInv {
                        sgl: sgl(&src, 0, 1),
                        invalidate: inv.rkey,
                    },
                ),
                wr(
                    8,
                    SendOp::RdmaRead {
                        sgl: Sgl::new(),
                        remote_addr: 0,
                        rkey: verbs::Rkey(0),
                    },
                ),
            ];
            local.hca.post_send(local.conn, &ops).unwrap();
            let sent = wait_completions(&mut pair, dir, 8);
            let ids: Vec<u64> = sent.iter().map(|wc| wc.wr_id.0).collect();
            assert_eq!(ids, [1, 2, 3, 4, 5, 6, 7, 8], "{mtu:?} {sent:?}");
            assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
            assert_eq!(sent[5].opcode, WcOpcode::RdmaRead);
            assert_eq!(sent[5].byte_len, 7777);
            let received = wait_completions(&mut pair, 1 - dir, 4);
            let (local, remote) = if dir == A_TO_B {
                (&mut pair.a, &mut pair.b)
            } else {
                (&mut pair.b, &mut pair.a)
            };
            assert_eq!(received.len(), 4);
            assert_eq!(received[0].byte_len, 5000);
            assert_eq!(received[0].opcode, WcOpcode::Recv);
            assert_eq!(
                read(&remote.hca, &recv, 0, 5000),
                read(&local.hca, &src, 0, 5000)
            );
            assert_eq!(received[1].imm, Some(0xdead_beef));
            assert_eq!(received[1].byte_len, 0);
            assert_eq!(received[2].opcode, WcOpcode::RecvRdmaWithImm);
            assert_eq!(received[2].imm, Some(42));
            assert_eq!(received[2].byte_len, 3000);
            assert_eq!(received[3].invalidated_rkey, Some(inv.rkey));
            assert_eq!(
                read(&remote.hca, &dst, 50, 9000),
                read(&local.hca, &src, 100, 9000)
            );
            assert_eq!(
                read(&remote.hca, &dst, 20000, 3000),
                read(&local.hca, &src, 200, 3000)
            );
            assert_eq!(
                read(&local.hca, &src, 30000, 7777),
                read(&remote.hca, &dst, 40000, 7777)
            );
            // The invalidated rkey no longer works: a WRITE with it fails.
            let bad = wr(
                9,
                SendOp::RdmaWrite {
                    sgl: sgl(&src, 0, 8),
                    remote_addr: inv.remote_addr(0),
                    rkey: inv.rkey,
                    imm: None,
                },
            );
            if dir == B_TO_A {
                local.hca.post_send(local.conn, &[bad]).unwrap();
                let failed = wait_completions(&mut pair, dir, 1);
                assert_eq!(failed[0].status, WcStatus::RemAccessErr);
            }
        }
    }
}

/// Memory for the scenarios: A's source, B's target, B's receive buffers and
/// an rkey B will be asked to invalidate.
struct Setup {
    src: MemoryRegion,
    dst: MemoryRegion,
    recv: MemoryRegion,
    inv: MemoryRegion,
}

fn setup(pair: &mut Pair, recvs: u32) -> Setup {
    let src = region(&mut pair.a.hca, 256 << 10, RW);
    fill(&mut pair.a.hca, &src, 3);
    let dst = region(&mut pair.b.hca, 256 << 10, RW);
    fill(&mut pair.b.hca, &dst, 5);
    let recv = region(&mut pair.b.hca, 64 << 10, RW);
    let inv = region(&mut pair.b.hca, 4096, RW);
    post_recvs(pair, &recv, recvs);
    Setup {
        src,
        dst,
        recv,
        inv,
    }
}

fn post_recvs(pair: &mut Pair, recv: &MemoryRegion, count: u32) {
    for i in 0..count {
        let request = RecvWr {
            wr_id: WrId(1000 + u64::from(i)),
            sgl: sgl(recv, (i % 8) * 8192, 8192),
        };
        pair.b.hca.post_recv(pair.b.conn, &[request]).unwrap();
    }
}

fn write(id: u64, s: &Setup, offset: u32, len: u32) -> SendWr {
    wr(
        id,
        SendOp::RdmaWrite {
            sgl: sgl(&s.src, offset, len),
            remote_addr: s.dst.remote_addr(offset),
            rkey: s.dst.rkey,
            imm: None,
        },
    )
}

/// The rnbd-lossy-stall scenario (tests/vectors/README.md): a multi-packet
/// WRITE loses a middle packet while a SEND_WITH_INV and a SEND_WITH_IMM
/// wait behind it. rxe resends only the rest of the WRITE and stalls; Brick
/// must resend every packet from the NAK'd PSN, including both SENDs.
fn lossy_stall(drop_nak: bool) {
    let config = PairConfig {
        ack_timeout: 14,
        ..PairConfig::default()
    };
    let mut pair = Pair::new(config);
    pair.record = true;
    let s = setup(&mut pair, 2);
    let lost = config.psn_a.wrapping_add(3);
    let mut dropped_data = false;
    let mut dropped_nak = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == A_TO_B && frame.bth.psn == lost && !dropped_data {
            dropped_data = true;
            return Verdict::Drop;
        }
        let nak = frame
            .ext
            .aeth
            .is_some_and(|aeth| aeth.syndrome == Syndrome::Nak(NakCode::PsnSequenceError));
        if dir == B_TO_A && nak && drop_nak && !dropped_nak {
            dropped_nak = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let mut data = write(1, &s, 0, 8 * 1024);
    data.signaled = false;
    let requests = [
        data,
        wr(
            2,
            SendOp::SendWithInv {
                sgl: sgl(&s.src, 100, 64),
                invalidate: s.inv.rkey,
            },
        ),
        wr(
            3,
            SendOp::Send {
                sgl: sgl(&s.src, 200, 0),
                imm: Some(0x1000_0000),
            },
        ),
    ];
    pair.a.hca.post_send(pair.a.conn, &requests).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    assert_eq!(
        sent.iter()
            .map(|wc| (wc.wr_id.0, wc.status))
            .collect::<Vec<_>>(),
        [(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    let received = wait_completions(&mut pair, B_TO_A, 2);
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].invalidated_rkey, Some(s.inv.rkey));
    assert_eq!(received[0].byte_len, 64);
    assert_eq!(received[1].imm, Some(0x1000_0000));
    assert_eq!(
        read(&pair.b.hca, &s.dst, 0, 8192),
        read(&pair.a.hca, &s.src, 0, 8192)
    );
    let a = *pair.a.hca.counters();
    let b = *pair.b.hca.counters();
    assert_eq!(b.naks_sent, 1, "one NAK per gap: {b:?}");
    // Both SENDs went out twice: once behind the gap, once in the go-back.
    let sends_with_inv = pair.sent[A_TO_B]
        .iter()
        .filter(|frame| parse_frame(frame).unwrap().bth.opcode == Opcode::RcSendOnlyWithInvalidate)
        .count();
    assert_eq!(sends_with_inv, 2);
    if drop_nak {
        assert_eq!(a.naks_received, 0);
        assert!(a.timeouts >= 1, "{a:?}");
    } else {
        assert_eq!(a.naks_received, 1);
        assert_eq!(a.timeouts, 0, "recovered by the NAK, not the timer: {a:?}");
        // Go-back-N from the lost PSN: 5 WRITE packets + 2 SENDs.
        assert_eq!(a.retransmissions, 7, "{a:?}");
    }
    settle(&mut pair);
    assert_eq!(pair.a.hca.qp(pair.a.conn).unwrap().snapshot().send_queue, 0);
    assert!(
        pair.a.hca.poll_at(pair.now).is_none(),
        "timer disarmed when idle"
    );
}

#[test]
fn rnbd_lossy_stall_recovers_by_nak() {
    lossy_stall(false);
}

#[test]
fn rnbd_lossy_stall_lost_nak_recovers_by_timeout() {
    lossy_stall(true);
}

#[test]
fn inline_send_is_the_same_send_on_the_wire_and_survives_a_resend() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 4);
    let payload = [0x5a, 1, 2, 3, 4, 5, 6, 7];
    pair.a.hca.write(s.src.handle, 0, &payload).unwrap();
    // The first data frame (the inline SEND) is lost: the resend is
    // rebuilt from the bytes in the WQE.
    let mut dropped = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == A_TO_B && is_data(frame) && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let inline = SendOp::SendInline {
        data: Inline::try_from_slice(&payload).unwrap(),
        imm: Some(9),
    };
    let gathered = SendOp::Send {
        sgl: sgl(&s.src, 0, 8),
        imm: Some(9),
    };
    pair.a
        .hca
        .post_send(pair.a.conn, &[wr(1, inline), wr(2, gathered)])
        .unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    assert!(sent.iter().all(|wc| wc.opcode == WcOpcode::Send));
    let received = wait_completions(&mut pair, B_TO_A, 2);
    assert_eq!(received.len(), 2);
    assert_eq!((received[0].imm, received[0].byte_len), (Some(9), 8));
    assert_eq!((received[1].imm, received[1].byte_len), (Some(9), 8));
    assert_eq!(read(&pair.b.hca, &s.recv, 0, 8), payload);
    assert_eq!(read(&pair.b.hca, &s.recv, 8192, 8), payload);
    // On the wire both are SEND_ONLY_WITH_IMMEDIATE with the same bytes.
    let sends: Vec<(Opcode, Vec<u8>)> = pair.sent[A_TO_B]
        .iter()
        .filter_map(|frame| {
            let parsed = parse_frame(frame).ok()?;
            is_data(&parsed).then(|| (parsed.bth.opcode, parsed.payload.to_vec()))
        })
        .collect();
    assert!(sends.len() >= 3, "the lost SEND was resent: {sends:?}");
    assert!(
        sends
            .iter()
            .all(|(op, bytes)| *op == Opcode::RcSendOnlyWithImmediate && *bytes == payload),
        "{sends:?}"
    );
}

#[test]
fn lost_ack_duplicate_is_reacked_not_redelivered() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 4);
    let mut dropped = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == B_TO_A && !is_data(frame) && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    pair.a
        .hca
        .post_send(
            pair.a.conn,
            &[wr(
                1,
                SendOp::Send {
                    sgl: sgl(&s.src, 0, 100),
                    imm: Some(7),
                },
            )],
        )
        .unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    settle(&mut pair);
    let received = completions(&mut pair.b.hca);
    assert_eq!(received.len(), 1, "delivered exactly once");
    let a = *pair.a.hca.counters();
    let b = *pair.b.hca.counters();
    assert_eq!(a.timeouts, 1);
    assert_eq!(b.duplicates, 1);
    let acks = parsed_acks(&pair.sent[B_TO_A]);
    let psn = PairConfig::default().psn_a;
    assert_eq!(
        acks,
        [
            (psn, Syndrome::ACK_UNLIMITED, Msn::new(1)),
            (psn, Syndrome::ACK_UNLIMITED, Msn::new(1))
        ],
        "the duplicate is re-ACKed with the MSN unchanged"
    );
}

#[test]
fn stale_ack_is_ignored() {
    let mut pair = Pair::new(PairConfig::default());
    let s = setup(&mut pair, 4);
    let mut delayed = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == B_TO_A && !is_data(frame) && !delayed {
            delayed = true;
            // Arrives after the ACK of the next message: stale by then.
            return Verdict::Delay(50_000);
        }
        Verdict::Deliver
    });
    pair.record = true;
    let first = wr(
        1,
        SendOp::Send {
            sgl: sgl(&s.src, 0, 10),
            imm: None,
        },
    );
    pair.a.hca.post_send(pair.a.conn, &[first]).unwrap();
    let limit = pair.now + 1_000_000;
    pair.run_until(limit, |pair| !pair.sent[B_TO_A].is_empty());
    let second = wr(
        2,
        SendOp::Send {
            sgl: sgl(&s.src, 0, 20),
            imm: None,
        },
    );
    pair.a.hca.post_send(pair.a.conn, &[second]).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    assert_eq!(sent.iter().map(|wc| wc.wr_id.0).collect::<Vec<_>>(), [1, 2]);
    settle(&mut pair);

    let a = *pair.a.hca.counters();
    assert_eq!(a.stale_acks, 1, "{a:?}");
    assert_eq!(a.timeouts, 0);
    assert_eq!(a.retransmissions, 0);
}

#[test]
fn rnr_nak_then_success() {
    let mut pair = Pair::new(PairConfig {
        min_rnr_timer: 14, // 1.28 ms
        ..PairConfig::default()
    });
    pair.record = true;
    let s = setup(&mut pair, 0);
    pair.a
        .hca
        .post_send(
            pair.a.conn,
            &[wr(
                1,
                SendOp::Send {
                    sgl: sgl(&s.src, 0, 3000),
                    imm: Some(9),
                },
            )],
        )
        .unwrap();
    let limit = pair.now + 5_000_000;
    pair.run_until(limit, |pair| pair.b.hca.counters().rnr_naks_sent >= 3);
    let rnr: Vec<_> = parsed_acks(&pair.sent[B_TO_A])
        .into_iter()
        .filter(|(_, syndrome, _)| matches!(syndrome, Syndrome::RnrNak { .. }))
        .collect();
    assert!(rnr.len() >= 3);
    assert!(rnr
        .iter()
        .all(|(psn, syndrome, _)| *psn == PairConfig::default().psn_a
            && *syndrome == Syndrome::RnrNak { timer: 14 }));
    // The RNR wait is honoured: three NAKs take at least two delays.
    assert!(pair.now >= 2 * 1_280_000, "{}", pair.now);
    post_recvs(&mut pair, &s.recv, 1);
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = wait_completions(&mut pair, B_TO_A, 1);
    assert_eq!(received[0].imm, Some(9));
    assert_eq!(received[0].byte_len, 3000);
    assert!(pair.a.hca.counters().rnr_naks_received >= 3);
}

#[test]
fn rnr_retry_exceeded() {
    let mut pair = Pair::new(PairConfig {
        rnr_retry: 2,
        ..PairConfig::default()
    });
    let s = setup(&mut pair, 0);
    let requests = [
        wr(
            1,
            SendOp::Send {
                sgl: sgl(&s.src, 0, 10),
                imm: None,
            },
        ),
        write(2, &s, 0, 10),
    ];
    pair.a.hca.post_send(pair.a.conn, &requests).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    assert_eq!(
        sent.iter()
            .map(|wc| (wc.wr_id.0, wc.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.a.hca.counters().rnr_naks_received, 3);
    assert_eq!(pair.a.hca.qp_state(pair.a.conn), Some(QpState::Err));
}

#[test]
fn retry_exceeded_then_flush() {
    let mut pair = Pair::new(PairConfig {
        retry_count: 2,
        ..PairConfig::default()
    });
    let s = setup(&mut pair, 4);
    pair.filter = Box::new(|dir, _, _| {
        if dir == A_TO_B {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    let requests = [write(1, &s, 0, 5000), write(2, &s, 0, 10)];
    pair.a.hca.post_send(pair.a.conn, &requests).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    assert_eq!(
        sent.iter()
            .map(|wc| (wc.wr_id.0, wc.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.a.hca.counters().timeouts, 3);
    // Posting on a QP in error fails.
    assert!(pair
        .a
        .hca
        .post_send(pair.a.conn, &[write(3, &s, 0, 1)])
        .is_err());
}

#[test]
fn psn_wraps_across_2_pow_24() {
    let config = PairConfig {
        psn_a: Psn::new(0x00ff_fff8),
        psn_b: Psn::new(0x00ff_fffe),
        ..PairConfig::default()
    };
    let mut pair = Pair::new(config);
    let s = setup(&mut pair, 4);
    let mut dropped = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == A_TO_B && frame.bth.psn == Psn::new(1) && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let requests = [
        write(1, &s, 0, 16 * 1024),
        wr(
            2,
            SendOp::RdmaRead {
                sgl: sgl(&s.src, 100_000, 10_000),
                remote_addr: s.dst.remote_addr(50_000),
                rkey: s.dst.rkey,
            },
        ),
        wr(
            3,
            SendOp::Send {
                sgl: sgl(&s.src, 0, 4000),
                imm: None,
            },
        ),
    ];
    pair.a.hca.post_send(pair.a.conn, &requests).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 3);
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    assert_eq!(
        read(&pair.b.hca, &s.dst, 0, 16 * 1024),
        read(&pair.a.hca, &s.src, 0, 16 * 1024)
    );
    assert_eq!(
        read(&pair.a.hca, &s.src, 100_000, 10_000),
        read(&pair.b.hca, &s.dst, 50_000, 10_000)
    );
    // B -> A across the wrap too.
    let back = region(&mut pair.b.hca, 8192, RW);
    fill(&mut pair.b.hca, &back, 77);
    let request = wr(
        9,
        SendOp::RdmaWrite {
            sgl: sgl(&back, 0, 8192),
            remote_addr: s.src.remote_addr(0),
            rkey: s.src.rkey,
            imm: None,
        },
    );
    let receives = completions(&mut pair.b.hca);
    assert_eq!(receives.len(), 1);
    assert_eq!(receives[0].byte_len, 4000);
    pair.b.hca.post_send(pair.b.conn, &[request]).unwrap();
    let sent = wait_completions(&mut pair, B_TO_A, 1);
    assert_eq!(sent[0].wr_id, WrId(9));
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(
        read(&pair.a.hca, &s.src, 0, 8192),
        read(&pair.b.hca, &back, 0, 8192)
    );
    let snapshot = pair.a.hca.qp(pair.a.conn).unwrap().snapshot();
    assert!(snapshot.una.value() < 0x100, "wrapped: {snapshot:?}");
}

/// Runs one WR that B must refuse; returns A's completions and B's NAKs.
fn refused(
    request: impl FnOnce(&Setup, &MemoryRegion, &MemoryRegion) -> SendWr,
) -> (Vec<WorkCompletion>, Vec<(Psn, Syndrome, Msn)>, Pair) {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 4);
    let read_only = region(
        &mut pair.b.hca,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    );
    let write_only = region(
        &mut pair.b.hca,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    let first = request(&s, &read_only, &write_only);
    pair.a
        .hca
        .post_send(pair.a.conn, &[first, write(2, &s, 0, 10)])
        .unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 2);
    settle(&mut pair);
    let acks = parsed_acks(&pair.sent[B_TO_A]);
    (sent, acks, pair)
}

fn assert_access_error(sent: &[WorkCompletion], acks: &[(Psn, Syndrome, Msn)], pair: &Pair) {
    assert_eq!(
        sent.iter()
            .map(|wc| (wc.wr_id.0, wc.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        acks,
        [(
            PairConfig::default().psn_a,
            Syndrome::Nak(NakCode::RemoteAccessError),
            Msn::new(0)
        )]
    );
    assert_eq!(pair.a.hca.qp_state(pair.a.conn), Some(QpState::Err));
    assert_eq!(pair.b.hca.qp_state(pair.b.conn), Some(QpState::Err));
}

#[test]
fn bad_rkey_naks_remote_access_error() {
    let (sent, acks, pair) = refused(|s, _, _| {
        wr(
            1,
            SendOp::RdmaWrite {
                sgl: sgl(&s.src, 0, 3000),
                remote_addr: s.dst.remote_addr(0),
                rkey: verbs::Rkey(s.dst.rkey.0 ^ 0x100),
                imm: None,
            },
        )
    });
    assert_access_error(&sent, &acks, &pair);
}

#[test]
fn write_to_read_only_region_naks() {
    let (sent, acks, pair) = refused(|s, read_only, _| {
        wr(
            1,
            SendOp::RdmaWrite {
                sgl: sgl(&s.src, 0, 100),
                remote_addr: read_only.remote_addr(0),
                rkey: read_only.rkey,
                imm: None,
            },
        )
    });
    assert_access_error(&sent, &acks, &pair);
}

#[test]
fn read_of_write_only_region_naks() {
    let (sent, acks, pair) = refused(|s, _, write_only| {
        wr(
            1,
            SendOp::RdmaRead {
                sgl: sgl(&s.src, 0, 100),
                remote_addr: write_only.remote_addr(0),
                rkey: write_only.rkey,
            },
        )
    });
    assert_access_error(&sent, &acks, &pair);
}

#[test]
fn write_out_of_range_naks() {
    let (sent, acks, pair) = refused(|s, _, _| {
        wr(
            1,
            SendOp::RdmaWrite {
                sgl: sgl(&s.src, 0, 2000),
                remote_addr: s.dst.remote_addr(s.dst.len() - 1000),
                rkey: s.dst.rkey,
                imm: None,
            },
        )
    });
    assert_access_error(&sent, &acks, &pair);
}

#[test]
fn read_out_of_range_naks() {
    let (sent, acks, pair) = refused(|s, _, _| {
        wr(
            1,
            SendOp::RdmaRead {
                sgl: sgl(&s.src, 0, 100),
                remote_addr: s.dst.remote_addr(0).wrapping_sub(1),
                rkey: s.dst.rkey,
            },
        )
    });
    assert_access_error(&sent, &acks, &pair);
}

#[test]
fn send_longer_than_receive_buffer_naks_invalid_request() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 1);
    pair.a
        .hca
        .post_send(
            pair.a.conn,
            &[wr(
                1,
                SendOp::Send {
                    sgl: sgl(&s.src, 0, 9000),
                    imm: None,
                },
            )],
        )
        .unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::RemInvReqErr);
    let received = wait_completions(&mut pair, B_TO_A, 1);
    assert_eq!(received[0].status, WcStatus::LocLenErr);
    let acks = parsed_acks(&pair.sent[B_TO_A]);
    assert_eq!(
        acks.last().unwrap().1,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
}

#[test]
fn lost_read_response_is_replayed_from_the_read_resource() {
    let mut pair = Pair::new(PairConfig::default());
    let s = setup(&mut pair, 0);
    let lost = PairConfig::default().psn_a.wrapping_add(2);
    let mut dropped = false;
    pair.filter = Box::new(move |dir, frame, _| {
        if dir == B_TO_A && frame.bth.psn == lost && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let request = wr(
        1,
        SendOp::RdmaRead {
            sgl: sgl(&s.src, 0, 5000),
            remote_addr: s.dst.remote_addr(1000),
            rkey: s.dst.rkey,
        },
    );
    pair.a.hca.post_send(pair.a.conn, &[request]).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].byte_len, 5000);
    assert_eq!(
        read(&pair.a.hca, &s.src, 0, 5000),
        read(&pair.b.hca, &s.dst, 1000, 5000)
    );
    let b = *pair.b.hca.counters();
    assert_eq!(b.duplicates, 1, "the re-request is a duplicate READ: {b:?}");
    assert_eq!(
        pair.a.hca.counters().timeouts,
        0,
        "gap detected, no timeout"
    );
}

#[test]
fn unknown_qpn_and_foreign_frames_are_dropped() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 4);
    pair.a
        .hca
        .post_send(
            pair.a.conn,
            &[wr(
                1,
                SendOp::Send {
                    sgl: sgl(&s.src, 0, 10),
                    imm: None,
                },
            )],
        )
        .unwrap();
    wait_completions(&mut pair, A_TO_B, 1);
    settle(&mut pair);
    let frame = pair.sent[A_TO_B][0].clone();
    let before = *pair.b.hca.counters();
    let parsed = parse_frame(&frame).unwrap();
    let mut other_qp = parsed.headers();
    other_qp.bth.dest_qp = roce::types::Qpn::new(parsed.bth.dest_qp.value() ^ 0x55);
    let mut buf = vec![0u8; 2048];
    let len = other_qp.emit_frame(&mut buf, parsed.payload).unwrap();
    pair.b.hca.receive(pair.now, &buf[..len]);
    let mut bad_pkey = parsed.headers();
    bad_pkey.bth.pkey = roce::types::Pkey(0x8001);
    let len = bad_pkey.emit_frame(&mut buf, parsed.payload).unwrap();
    pair.b.hca.receive(pair.now, &buf[..len]);
    let mut foreign = parsed.headers();
    foreign.ip.src_addr = [10, 77, 0, 99].into();
    let len = foreign.emit_frame(&mut buf, parsed.payload).unwrap();
    pair.b.hca.receive(pair.now, &buf[..len]);
    let mut corrupted = frame.clone();
    let last = corrupted.len() - 1;
    corrupted[last] ^= 0xff;
    pair.b.hca.receive(pair.now, &corrupted);
    let after = *pair.b.hca.counters();
    assert_eq!(after.drop_unknown_qpn, before.drop_unknown_qpn + 1);
    assert_eq!(after.drop_bad_pkey, before.drop_bad_pkey + 1);
    assert_eq!(after.drop_bad_address, before.drop_bad_address + 1);
    assert_eq!(after.drop_bad_checksum, before.drop_bad_checksum + 1);
    assert_eq!(pair.b.hca.poll_at(pair.now), None, "nothing to answer");
    assert!(completions(&mut pair.b.hca).len() <= 1);
}

/// Frames recorded from a short exchange: seeds for the mutation test.
fn seed_frames() -> Vec<Vec<u8>> {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 4);
    let requests = [
        write(1, &s, 0, 3000),
        wr(
            2,
            SendOp::Send {
                sgl: sgl(&s.src, 0, 100),
                imm: Some(1),
            },
        ),
        wr(
            3,
            SendOp::RdmaRead {
                sgl: sgl(&s.src, 0, 2000),
                remote_addr: s.dst.remote_addr(0),
                rkey: s.dst.rkey,
            },
        ),
        wr(
            4,
            SendOp::SendWithInv {
                sgl: sgl(&s.src, 0, 0),
                invalidate: s.inv.rkey,
            },
        ),
    ];
    pair.a.hca.post_send(pair.a.conn, &requests).unwrap();
    wait_completions(&mut pair, A_TO_B, 4);
    settle(&mut pair);
    let mut frames = pair.sent[A_TO_B].clone();
    frames.extend(pair.sent[B_TO_A].iter().cloned());
    frames
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes never panic the HCA.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let mut pair = Pair::new(PairConfig::default());
        pair.b.hca.receive(0, &bytes);
        pair.a.hca.receive(0, &bytes);
        let _ = pair.step();
    }

    /// Valid frames with mutated transport fields (and a fixed-up ICRC, so
    /// they reach the QPs) never panic either side, in any order.
    #[test]
    fn mutated_frames_never_panic(
        picks in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u8>(), any::<bool>()), 1..40)
    ) {
        thread_local! {
            static SEEDS: Vec<Vec<u8>> = seed_frames();
        }
        let seeds = SEEDS.with(Clone::clone);
        let mut pair = Pair::new(PairConfig::default());
        let s = setup(&mut pair, 2);
        pair.a
            .hca
            .post_send(pair.a.conn, &[write(1, &s, 0, 5000)])
            .unwrap();
        for (index, position, value, to_a) in picks {
            let mut frame = seeds[index % seeds.len()].clone();
            // Mutate the IB transport part (BTH onwards), keep it parseable.
            let start = 42;
            let span = frame.len().saturating_sub(start + 4).max(1);
            let at = start + position % span;
            if at < frame.len() {
                frame[at] = value;
            }
            let _ = roce::wire::fill_icrc(&mut frame);
            let now = pair.now;
            if to_a {
                pair.a.hca.receive(now, &frame);
            } else {
                pair.b.hca.receive(now, &frame);
            }
            let _ = pair.step();
        }
        let limit = pair.now + 10_000_000_000;
        pair.run_until(limit, |_| false);
    }
}

/// rxe ignores a NAK that arrives while a NAK-triggered retry is running
/// (rnbd-lossy.pcap frame 228) and waits for its timer; Brick acts on it.
#[test]
fn nak_during_retry_is_acted_on() {
    let config = PairConfig::default();
    let mut pair = Pair::new(config);
    let s = setup(&mut pair, 4);
    let first_loss = config.psn_a.wrapping_add(2);
    let second_loss = config.psn_a.wrapping_add(6);
    let mut seen = std::collections::HashMap::new();
    pair.filter = Box::new(move |dir, frame, _| {
        if dir != A_TO_B {
            return Verdict::Deliver;
        }
        let count = seen.entry(frame.bth.psn.value()).or_insert(0u32);
        *count += 1;
        // PSN +2 is lost the first time, +6 the second time (in the retry).
        let lost = (frame.bth.psn == first_loss && *count == 1)
            || (frame.bth.psn == second_loss && *count == 2);
        if lost {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    pair.a
        .hca
        .post_send(pair.a.conn, &[write(1, &s, 0, 12 * 1024)])
        .unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(
        read(&pair.b.hca, &s.dst, 0, 12 * 1024),
        read(&pair.a.hca, &s.src, 0, 12 * 1024)
    );
    let a = *pair.a.hca.counters();
    assert_eq!(a.naks_received, 2, "{a:?}");
    assert_eq!(a.timeouts, 0, "the second NAK is acted on: {a:?}");
    assert!(
        pair.now < 1_000_000,
        "recovered in round trips, not timeouts"
    );
}

#[test]
fn qpns_are_unique_and_never_reserved() {
    let mut hca = rc_support::TestHca::new(
        vec![0; 4096],
        rc_support::TestKeys(0xffff_fffe_0000_0000),
        roce::hca::HcaConfig {
            mac: [2, 0, 0, 0, 0, 1],
            ip: [10, 0, 0, 1],
        },
    );
    let mut live = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for round in 0..50 {
        while let Ok(conn) = hca.create_qp() {
            let qpn = hca.qpn(conn).unwrap().value();
            assert!(qpn > 1 && qpn < 0x00ff_ffff, "reserved QPN {qpn:#x}");
            assert!(!live.contains(&conn), "QPN {qpn:#x} handed out twice");
            seen.insert(qpn);
            live.push(conn);
        }
        assert_eq!(live.len(), 4, "table capacity");
        // Free one (round robin) and allocate again.
        let conn = live.remove(round % live.len());
        hca.destroy(conn).unwrap();
        assert!(hca.qp(conn).is_none());
    }
    assert!(
        seen.len() > 4,
        "QPNs advance instead of being reused at once"
    );
}

/// roce-v2.md §2.4: a SEND_WITH_INV naming an rkey the responder cannot
/// invalidate gets no NAK (rxe even ACKs it); the receive fails with
/// RemInvReqErr and the responder's QP goes to error.
#[test]
fn send_with_bad_invalidate_fails_the_receive() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 2);
    let request = wr(
        1,
        SendOp::SendWithInv {
            sgl: sgl(&s.src, 0, 16),
            invalidate: verbs::Rkey(s.inv.rkey.0 ^ 0x55),
        },
    );
    pair.a.hca.post_send(pair.a.conn, &[request]).unwrap();
    let sent = wait_completions(&mut pair, A_TO_B, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = wait_completions(&mut pair, B_TO_A, 2);
    assert_eq!(received[0].status, WcStatus::RemInvReqErr);
    assert_eq!(received[1].status, WcStatus::WrFlushErr);
    assert_eq!(pair.b.hca.qp_state(pair.b.conn), Some(QpState::Err));
    let acks = parsed_acks(&pair.sent[B_TO_A]);
    assert_eq!(
        acks,
        [(
            PairConfig::default().psn_a,
            Syndrome::ACK_UNLIMITED,
            Msn::new(1)
        )]
    );
}

#[test]
fn atomic_request_naks_invalid_request() {
    let mut pair = Pair::new(PairConfig::default());
    pair.record = true;
    let s = setup(&mut pair, 1);
    pair.a
        .hca
        .post_send(pair.a.conn, &[write(1, &s, 0, 8)])
        .unwrap();
    wait_completions(&mut pair, A_TO_B, 1);
    settle(&mut pair);
    // Turn the WRITE_ONLY into a FETCH_ADD at the next expected PSN.
    let original = pair.sent[A_TO_B][0].clone();
    let parsed = parse_frame(&original).unwrap();
    let mut headers = parsed.headers();
    headers.bth.opcode = Opcode::RcFetchAdd;
    headers.bth.psn = parsed.bth.psn.wrapping_add(1);
    headers.ext = roce::wire::ExtHeaders {
        atomic_eth: Some(roce::wire::AtomicEthRepr {
            virtual_address: s.dst.remote_addr(0),
            rkey: s.dst.rkey,
            swap_add: 1,
            compare: 0,
        }),
        ..Default::default()
    };
    let mut buf = vec![0u8; 256];
    let len = headers.emit_frame(&mut buf, &[]).unwrap();
    pair.b.hca.receive(pair.now, &buf[..len]);
    settle(&mut pair);
    let acks = parsed_acks(&pair.sent[B_TO_A]);
    assert_eq!(
        acks.last().map(|ack| (ack.0, ack.1)),
        Some((
            parsed.bth.psn.wrapping_add(1),
            Syndrome::Nak(NakCode::InvalidRequest)
        ))
    );
    assert_eq!(pair.b.hca.qp_state(pair.b.conn), Some(QpState::Err));
}

/// A LOCAL_INV posted on an idle send queue executes and completes at
/// post time (no poll needed: a target revoking a chunk answers in the
/// same loop turn); behind an unacknowledged WRITE it waits its turn, and
/// the rkey it names is refused afterwards either way.
#[test]
fn local_inv_on_an_idle_queue_completes_at_post() {
    let mut pair = Pair::new(PairConfig::default());
    let s = setup(&mut pair, 1);
    let own = region(&mut pair.a.hca, 4096, RW);
    let inv = |id, mr: &MemoryRegion| wr(id, SendOp::LocalInv { rkey: mr.rkey });
    pair.a.hca.post_send(pair.a.conn, &[inv(1, &own)]).unwrap();
    let done = completions(&mut pair.a.hca);
    assert_eq!(done.len(), 1, "completed without a poll: {done:?}");
    assert_eq!(done[0].wr_id, WrId(1));
    assert_eq!(done[0].opcode, verbs::WcOpcode::LocalInv);
    assert_eq!(done[0].status, WcStatus::Success);
    // Behind a WRITE not yet sent, the LOCAL_INV waits for it in order.
    let other = region(&mut pair.a.hca, 4096, RW);
    pair.a
        .hca
        .post_send(pair.a.conn, &[write(2, &s, 0, 64), inv(3, &other)])
        .unwrap();
    assert!(
        completions(&mut pair.a.hca).is_empty(),
        "nothing before the WRITE's ACK"
    );
    let done = wait_completions(&mut pair, A_TO_B, 2);
    let ids: Vec<WrId> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [WrId(2), WrId(3)]);
    // A WRITE that names the invalidated rkey from the peer fails.
    let reused = wr(
        4,
        SendOp::RdmaWrite {
            sgl: sgl(&s.dst, 0, 16),
            remote_addr: own.remote_addr(0),
            rkey: own.rkey,
            imm: None,
        },
    );
    pair.b.hca.post_send(pair.b.conn, &[reused]).unwrap();
    let failed = wait_completions(&mut pair, B_TO_A, 1);
    assert_eq!(failed[0].status, WcStatus::RemAccessErr);
}
