//! The requester's adaptive retransmit timer (roce/src/qp/timer.rs,
//! module docs) between two software HCAs over a simulated link.
//!
//! rxe waits the negotiated Local ACK Timeout (2.15 s with the RDMA CM
//! default exponent 19) for every lost tail packet or lost ACK; Brick's timer
//! follows the measured round-trip time. These tests check that (1) a lossy
//! link at queue depth 1 costs milliseconds per loss, not seconds, with the
//! data intact; (2) the estimate converges to the link's round trip, stays
//! within [`MIN_RETRANSMIT_TIMEOUT_NS`, negotiated] and follows a change of
//! delay; (3) a dead peer still fails the QP with `RetryExcErr` after as many
//! *negotiated* timeouts as before, never sooner; (4) a jittery but loss-free
//! link sees no spurious retransmission.

mod rc_support;

use std::cell::Cell;
use std::rc::Rc;

use rc_support::{Pair, PairConfig, Rng, TestHca, Verdict, A_TO_B};
use roce::qp::config::{INITIAL_RETRANSMIT_TIMEOUT_NS, MIN_RETRANSMIT_TIMEOUT_NS};
use roce::qp::{Counters, QpState, RttEstimate};
use roce::types::Mtu;
use verbs::{
    AccessFlags, Memory, MemoryRegion, SendOp, SendWr, Sge, Sgl, Verbs, WcStatus, WorkCompletion,
    WrId,
};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// The I/O size of the workloads: 4 packets at MTU 1024, AckReq on the last.
const BLOCK: u32 = 4096;
/// The negotiated Local ACK Timeout exponent of the RDMA CM (≈2.15 s).
const CM_ACK_TIMEOUT: u8 = 19;

fn ack_timeout_ns(exponent: u8) -> u64 {
    4096 << exponent
}

/// A pair with `blocks` × [`BLOCK`] of random source memory on A and as much
/// target memory on B.
struct Rig {
    pair: Pair,
    src: MemoryRegion,
    dst: MemoryRegion,
    blocks: u32,
    next_id: u64,
}

impl Rig {
    fn new(config: PairConfig, blocks: u32) -> Self {
        let len = blocks * BLOCK;
        let mut pair = Pair::new(PairConfig {
            mtu: Mtu::Mtu1024,
            memory: len as usize + (1 << 16),
            ..config
        });
        let src = region(&mut pair.a.hca, len);
        let dst = region(&mut pair.b.hca, len);
        let mut data = vec![0u8; len as usize];
        Rng(config.seed ^ 0xda7a).fill(&mut data);
        pair.a.hca.write(src.handle, 0, &data).unwrap();
        Self {
            pair,
            src,
            dst,
            blocks,
            next_id: 1,
        }
    }

    /// Posts one work request on A and runs until it completes; returns the
    /// completion (None if nothing completed within `limit_ns`).
    fn run_one(&mut self, op: SendOp, limit_ns: u64) -> Option<WorkCompletion> {
        let request = SendWr {
            wr_id: WrId(self.next_id),
            signaled: true,
            op,
        };
        self.next_id += 1;
        self.pair
            .a
            .hca
            .post_send(self.pair.a.conn, &[request])
            .unwrap();
        let mut done = None;
        let limit = self.pair.now + limit_ns;
        self.pair.run_until(limit, |pair| {
            let mut out = [WorkCompletion::default(); 4];
            let n = pair.a.hca.poll_cq(&mut out);
            if n > 0 {
                done = Some(out[0]);
            }
            done.is_some()
        });
        done
    }

    /// RDMA WRITE of block `index` from A's source to the same place on B.
    fn write_op(&self, index: u32) -> SendOp {
        let offset = (index % self.blocks) * BLOCK;
        SendOp::RdmaWrite {
            sgl: Sgl::single(Sge::new(self.src.lkey, offset, BLOCK)),
            remote_addr: self.dst.remote_addr(offset),
            rkey: self.dst.rkey,
            imm: None,
        }
    }

    /// `count` WRITEs at queue depth 1 (each posted when the previous one
    /// completed); returns the virtual time taken.
    fn qd1_writes(&mut self, first: u32, count: u32) -> u64 {
        let start = self.pair.now;
        for index in first..first + count {
            let op = self.write_op(index);
            let wc = self
                .run_one(op, 600_000_000_000)
                .unwrap_or_else(|| panic!("WRITE {index} never completed"));
            assert_eq!(wc.status, WcStatus::Success, "WRITE {index}: {wc:?}");
        }
        self.pair.now - start
    }

    /// Whether B's target memory equals A's source, byte for byte.
    fn data_matches(&self) -> bool {
        let len = (self.blocks * BLOCK) as usize;
        let mut sent = vec![0u8; len];
        let mut landed = vec![0u8; len];
        self.pair.a.hca.read(self.src.handle, 0, &mut sent).unwrap();
        self.pair
            .b
            .hca
            .read(self.dst.handle, 0, &mut landed)
            .unwrap();
        sent == landed
    }

    fn estimate(&self) -> RttEstimate {
        self.pair.a.hca.qp(self.pair.a.conn).unwrap().rtt_estimate()
    }

    fn counters(&self) -> Counters {
        *self.pair.a.hca.counters()
    }
}

fn region(hca: &mut TestHca, len: u32) -> MemoryRegion {
    let handle = hca.alloc(len, 64).unwrap();
    hca.reg_mr(handle, RW).unwrap()
}

/// Drops each frame (both directions) with probability `rate`, counting.
fn lossy(rate: f64, drops: Rc<Cell<u64>>) -> rc_support::Filter {
    Box::new(move |_, _, rng| {
        if rng.chance(rate) {
            drops.set(drops.get() + 1);
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    })
}

/// (1) 1 % frame loss in both directions at a steady 100 µs round trip:
/// 1024 QD1 4 KiB WRITEs (4 MiB) finish with every byte in place, and each
/// loss costs less than 10 × MIN_RETRANSMIT_TIMEOUT_NS (50 ms) of virtual
/// time over the loss-free run — against 2.15 s per loss with rxe's timer.
#[test]
fn lossy_qd1_writes_cost_milliseconds_per_loss() {
    const WRITES: u32 = 1024;
    let config = PairConfig {
        ack_timeout: CM_ACK_TIMEOUT,
        latency_ns: 50_000,
        seed: 41,
        ..PairConfig::default()
    };
    let mut clean = Rig::new(config, WRITES);
    let clean_ns = clean.qd1_writes(0, WRITES);
    assert!(clean.data_matches());
    assert_eq!(clean.counters().timeouts, 0);
    assert_eq!(clean.counters().retransmissions, 0);

    for seed in [41, 42, 43] {
        let mut rig = Rig::new(PairConfig { seed, ..config }, WRITES);
        let drops = Rc::new(Cell::new(0));
        rig.pair.filter = lossy(0.01, drops.clone());
        let lossy_ns = rig.qd1_writes(0, WRITES);
        assert!(rig.data_matches(), "seed {seed}: data landed wrong");
        let a = rig.counters();
        let losses = drops.get();
        let per_loss = (lossy_ns - clean_ns) / losses.max(1);
        eprintln!(
            "seed {seed}: {WRITES} QD1 writes: clean {} µs, {losses} frames lost: {} µs \
             ({} µs per loss; rxe's timer: {} s per loss); {a:?}; {:?}",
            clean_ns / 1000,
            lossy_ns / 1000,
            per_loss / 1000,
            ack_timeout_ns(CM_ACK_TIMEOUT) / 1_000_000_000,
            rig.estimate(),
        );
        assert!(losses >= 20, "seed {seed}: the link lost only {losses}");
        assert!(
            lossy_ns < clean_ns + losses * 10 * MIN_RETRANSMIT_TIMEOUT_NS,
            "seed {seed}: {lossy_ns} ns with {losses} losses (clean {clean_ns} ns)"
        );
        assert!(a.timeouts > 0, "seed {seed}: tail losses need the timer");
        // Not one expiry waited for the negotiated 2.15 s.
        assert_eq!(a.timeouts, a.early_timeouts, "seed {seed}: {a:?}");
        assert_eq!(rig.pair.a.hca.qp_state(rig.pair.a.conn), Some(QpState::Rts));
    }
}

/// (1b) The same for RDMA READs (A reads B's memory back): lost READ
/// requests and lost READ responses cost milliseconds too, and duplicate
/// READs are replayed, not refused.
#[test]
fn lossy_qd1_reads_cost_milliseconds_per_loss() {
    const READS: u32 = 512;
    let config = PairConfig {
        ack_timeout: CM_ACK_TIMEOUT,
        latency_ns: 50_000,
        seed: 51,
        ..PairConfig::default()
    };
    let mut rig = Rig::new(config, READS);
    // B's memory gets random bytes, A's source is zeroed: the READs must
    // bring every byte back.
    let len = READS * BLOCK;
    let mut data = vec![0u8; len as usize];
    Rng(99).fill(&mut data);
    rig.pair.b.hca.write(rig.dst.handle, 0, &data).unwrap();
    rig.pair
        .a
        .hca
        .write(rig.src.handle, 0, &vec![0; len as usize])
        .unwrap();
    let drops = Rc::new(Cell::new(0));
    rig.pair.filter = lossy(0.01, drops.clone());
    let start = rig.pair.now;
    for index in 0..READS {
        let offset = index * BLOCK;
        let op = SendOp::RdmaRead {
            sgl: Sgl::single(Sge::new(rig.src.lkey, offset, BLOCK)),
            remote_addr: rig.dst.remote_addr(offset),
            rkey: rig.dst.rkey,
        };
        let wc = rig.run_one(op, 600_000_000_000).expect("READ completes");
        assert_eq!(wc.status, WcStatus::Success, "READ {index}: {wc:?}");
    }
    let took = rig.pair.now - start;
    assert!(rig.data_matches(), "READ data landed wrong");
    let losses = drops.get();
    // Loss-free, each READ takes one round trip.
    let clean_ns = u64::from(READS) * 2 * config.latency_ns;
    eprintln!(
        "{READS} QD1 reads: {} µs with {losses} frames lost; {:?}; B {:?}",
        took / 1000,
        rig.counters(),
        rig.pair.b.hca.counters()
    );
    assert!(losses >= 10, "the link lost only {losses}");
    assert!(took < clean_ns + losses * 10 * MIN_RETRANSMIT_TIMEOUT_NS);
    assert!(
        rig.pair.b.hca.counters().duplicates > 0,
        "READs were replayed"
    );
}

/// (2) The estimate converges to the link's round trip and the timeout
/// stays within [MIN_RETRANSMIT_TIMEOUT_NS, negotiated].
#[test]
fn rtt_estimate_converges_to_the_link_delay() {
    let negotiated = ack_timeout_ns(CM_ACK_TIMEOUT);

    // Before the first sample: the initial timeout.
    let rig = Rig::new(
        PairConfig {
            ack_timeout: CM_ACK_TIMEOUT,
            ..PairConfig::default()
        },
        4,
    );
    let initial = rig.estimate();
    assert_eq!(initial.smoothed_rtt, None);
    assert_eq!(initial.retransmit_timeout, INITIAL_RETRANSMIT_TIMEOUT_NS);
    assert_eq!(initial.negotiated_timeout, negotiated);

    // A 3 ms one-way delay: every sample is exactly 6 ms of virtual time.
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout: CM_ACK_TIMEOUT,
            latency_ns: 3_000_000,
            ..PairConfig::default()
        },
        64,
    );
    rig.qd1_writes(0, 64);
    let estimate = rig.estimate();
    assert_eq!(estimate.smoothed_rtt, Some(6_000_000), "{estimate:?}");
    assert!(estimate.rtt_variation < 10_000, "{estimate:?}");
    assert_eq!(estimate.backoff, 0);
    assert_eq!(
        estimate.retransmit_timeout,
        6_000_000 + MIN_RETRANSMIT_TIMEOUT_NS,
        "{estimate:?}"
    );
    assert_eq!(rig.counters().rtt_samples, 64);
    assert_eq!(rig.counters().timeouts, 0);

    // A 20 µs one-way delay: the floor.
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout: CM_ACK_TIMEOUT,
            latency_ns: 20_000,
            ..PairConfig::default()
        },
        16,
    );
    rig.qd1_writes(0, 16);
    let estimate = rig.estimate();
    assert_eq!(estimate.smoothed_rtt, Some(40_000), "{estimate:?}");
    assert_eq!(
        estimate.retransmit_timeout,
        40_000 + MIN_RETRANSMIT_TIMEOUT_NS
    );

    // A negotiated timeout below the floor wins (4.096 µs · 2^10 ≈ 4.2 ms).
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout: 10,
            latency_ns: 20_000,
            ..PairConfig::default()
        },
        16,
    );
    rig.qd1_writes(0, 16);
    assert_eq!(rig.estimate().retransmit_timeout, ack_timeout_ns(10));

    // The delay jumps from 6 ms to 60 ms round trip: a few early expiries
    // (the responder re-ACKs the duplicates), then the estimate follows.
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout: CM_ACK_TIMEOUT,
            latency_ns: 3_000_000,
            ..PairConfig::default()
        },
        64,
    );
    rig.qd1_writes(0, 32);
    rig.pair.latency_ns = 30_000_000;
    let took = rig.qd1_writes(32, 64);
    assert!(rig.data_matches());
    let a = rig.counters();
    let estimate = rig.estimate();
    eprintln!("delay step: {took} ns for 64 writes; {a:?}; {estimate:?}");
    let srtt = estimate.smoothed_rtt.unwrap();
    assert!((59_000_000..=61_000_000).contains(&srtt), "{estimate:?}");
    assert!(estimate.retransmit_timeout >= srtt, "{estimate:?}");
    assert!(estimate.retransmit_timeout <= negotiated, "{estimate:?}");
    assert!(a.early_timeouts >= 1, "{a:?}");
    assert!(a.early_timeouts <= 8, "adapts within a few writes: {a:?}");
    assert_eq!(a.timeouts, a.early_timeouts, "no retry consumed: {a:?}");
    assert!(rig.pair.b.hca.counters().duplicates > 0);
    assert_eq!(rig.pair.b.hca.counters().naks_sent, 0);
}

/// Runs a dead-peer scenario: `warm` successful WRITEs (RTT samples), then
/// A→B goes dead and one more WRITE is posted. Returns (time from its first
/// send to the RetryExcErr completion, counters since the link died).
fn dead_peer(ack_timeout: u8, retry_count: u8, warm: u32) -> (u64, Counters) {
    let dead = Rc::new(Cell::new(false));
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout,
            retry_count,
            latency_ns: 50_000,
            ..PairConfig::default()
        },
        warm + 1,
    );
    let flag = dead.clone();
    rig.pair.filter = Box::new(move |dir, _, _| {
        if dir == A_TO_B && flag.get() {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    rig.qd1_writes(0, warm);
    let before = rig.counters();
    dead.set(true);
    let start = rig.pair.now;
    let op = rig.write_op(warm);
    let wc = rig
        .run_one(op, 1_000 * ack_timeout_ns(ack_timeout))
        .expect("the QP gives up");
    assert_eq!(wc.status, WcStatus::RetryExcErr, "{wc:?}");
    assert_eq!(rig.pair.a.hca.qp_state(rig.pair.a.conn), Some(QpState::Err));
    let after = rig.counters();
    let delta = Counters {
        timeouts: after.timeouts - before.timeouts,
        early_timeouts: after.early_timeouts - before.early_timeouts,
        retransmissions: after.retransmissions - before.retransmissions,
        ..Counters::default()
    };
    (rig.pair.now - start, delta)
}

/// (3) Against a dead peer the QP fails with RetryExcErr after
/// retry_count + 1 *negotiated* timeouts without progress, as with rxe's
/// fixed timer (which fails at exactly that time): never sooner, and less
/// than one negotiated timeout later, however many early retransmissions
/// the adaptive timer made in between.
#[test]
fn dead_peer_fails_after_the_negotiated_retries_never_sooner() {
    // (exponent, retry count, warm-up writes): warm QPs retransmit from
    // 5 ms on; a cold one starts at the initial 100 ms (below 268 ms).
    for (ack_timeout, retry_count, warm) in [
        (14, 0, 8),
        (14, 1, 8),
        (14, 3, 8),
        (16, 2, 8),
        (16, 2, 0),
        (CM_ACK_TIMEOUT, 1, 8),
    ] {
        let negotiated = ack_timeout_ns(ack_timeout);
        let (took, counters) = dead_peer(ack_timeout, retry_count, warm);
        let rxe = (u64::from(retry_count) + 1) * negotiated;
        eprintln!(
            "t={ack_timeout} retry_count={retry_count} warm={warm}: failed after {} ms \
             (rxe: {} ms); {counters:?}",
            took / 1_000_000,
            rxe / 1_000_000
        );
        assert!(took >= rxe, "failed sooner than rxe: {took} < {rxe}");
        assert!(took < rxe + negotiated, "{took} vs {rxe}");
        // Exactly retry_count + 1 expiries of negotiated length, the last of
        // which fails the QP — what the fixed timer counted.
        assert_eq!(
            counters.timeouts - counters.early_timeouts,
            u64::from(retry_count) + 1,
            "{counters:?}"
        );
        assert!(counters.early_timeouts > 0, "{counters:?}");
    }
}

/// (3b) Retry count 7 is infinite as before: a dead peer never fails the QP,
/// the timer settles at the negotiated period, and the QP recovers when the
/// peer comes back.
#[test]
fn dead_peer_with_infinite_retries_keeps_trying() {
    let dead = Rc::new(Cell::new(true));
    let ack_timeout = 14;
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout,
            retry_count: 7,
            latency_ns: 50_000,
            ..PairConfig::default()
        },
        3,
    );
    rig.qd1_writes(0, 2);
    let flag = dead.clone();
    rig.pair.filter = Box::new(move |dir, _, _| {
        if dir == A_TO_B && flag.get() {
            Verdict::Drop
        } else {
            Verdict::Deliver
        }
    });
    let op = rig.write_op(2);
    let negotiated = ack_timeout_ns(ack_timeout);
    assert!(rig.run_one(op, 50 * negotiated).is_none());
    assert_eq!(rig.pair.a.hca.qp_state(rig.pair.a.conn), Some(QpState::Rts));
    let estimate = rig.estimate();
    assert_eq!(estimate.retransmit_timeout, negotiated, "{estimate:?}");
    dead.set(false);
    let mut out = [WorkCompletion::default(); 4];
    let limit = rig.pair.now + 2 * negotiated;
    let mut done = 0;
    rig.pair.run_until(limit, |pair| {
        done += pair.a.hca.poll_cq(&mut out);
        done > 0
    });
    assert_eq!(out[0].status, WcStatus::Success);
    assert!(rig.data_matches());
}

/// (4) A loss-free link with a jittery delay, kept in order: one-way 3 ms
/// plus 0..`jitter_ns` per frame. Returns A's counters after 1000 QD1
/// WRITEs (data checked) and the estimate at the end.
fn jittery(seed: u64, jitter_ns: u64) -> (Counters, RttEstimate) {
    const WRITES: u32 = 1000;
    let mut rig = Rig::new(
        PairConfig {
            ack_timeout: CM_ACK_TIMEOUT,
            latency_ns: 3_000_000,
            seed,
            ..PairConfig::default()
        },
        WRITES,
    );
    rig.pair.fifo = true;
    rig.pair.filter = Box::new(move |_, _, rng| Verdict::Delay(rng.below(jitter_ns)));
    rig.qd1_writes(0, WRITES);
    assert!(rig.data_matches());
    let a = rig.counters();
    assert_eq!(a.rtt_samples + a.timeouts, u64::from(WRITES), "{a:?}");
    assert_eq!(a.timeouts, a.early_timeouts, "no retry consumed: {a:?}");
    (a, rig.estimate())
}

/// (4a) Jitter of 0..3 ms each way (RTT 6..12 ms): not one retransmission.
#[test]
fn jittery_link_causes_no_spurious_retransmissions() {
    for seed in [61, 62, 63] {
        let (a, estimate) = jittery(seed, 3_000_000);
        eprintln!("seed {seed}: {a:?}; {estimate:?}");
        assert_eq!(a.timeouts, 0, "seed {seed}: {a:?}");
        assert_eq!(a.retransmissions, 0, "seed {seed}: {a:?}");
    }
}

/// (4b) Jitter of 0..10 ms each way (RTT 6..26 ms), more than
/// MIN_RETRANSMIT_TIMEOUT_NS covers: 4·RTTVAR takes over, and spurious
/// timeouts stay within 1 % of the messages (RFC 6298's estimator lets a
/// rare sample in the far tail through: 1, 5 and 3 per 1000 for these
/// seeds), none of them consuming the retry count.
#[test]
fn heavy_jitter_causes_few_spurious_retransmissions() {
    for seed in [71, 72, 73] {
        let (a, estimate) = jittery(seed, 10_000_000);
        eprintln!("seed {seed}: {a:?}; {estimate:?}");
        assert!(a.timeouts <= 10, "seed {seed}: {a:?}");
        assert!(
            estimate.retransmit_timeout
                > estimate.smoothed_rtt.unwrap() + MIN_RETRANSMIT_TIMEOUT_NS,
            "seed {seed}: 4·RTTVAR above the floor: {estimate:?}"
        );
    }
}
