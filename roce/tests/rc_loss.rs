//! Throughput under loss, in virtual time: the request/response pattern of
//! an RTRS read (a small SEND asks, the peer RDMA WRITEs the data and SENDs
//! a response) at queue depth 1, over a link with a bandwidth (1 Gb/s) and
//! a latency (20 µs each way), lossless and with the loss mix of the
//! issue (2 % drop, 2 % reorder, 1 % duplicate, 0.1 % corrupt, both
//! directions; reordering as the xtask relay does it: a frame is held until
//! the next one of its direction has passed, 50 ms at most). Every byte
//! that lands is checked; the throughput ratio
//! lossy/lossless and the transport counters are printed
//! (`cargo test -p brick-roce --test rc_loss -- --nocapture`).
//!
//! Time is the simulator's, so the ratios are deterministic per seed: the
//! assertions on them are not timing assertions.

mod rc_support;

use rc_support::{Pair, PairConfig, Rng, TestHca, Verdict};
use roce::qp::Counters;
use roce::types::{Mtu, Psn};
use verbs::{
    AccessFlags, Memory, MemoryRegion, RecvWr, SendOp, SendWr, Sge, Sgl, Verbs, WcOpcode, WcStatus,
    WorkCompletion, WrId,
};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

const MAX_LEN: u32 = 1 << 20;
const REQUEST_LEN: u32 = 64;

/// Fault rates of one run.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub drop: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
}

pub const CLEAN: Faults = Faults {
    drop: 0.0,
    reorder: 0.0,
    duplicate: 0.0,
    corrupt: 0.0,
};

/// The mix the issue measures through the relay.
pub const MIX: Faults = Faults {
    drop: 0.02,
    reorder: 0.02,
    duplicate: 0.01,
    corrupt: 0.001,
};

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub bytes: u64,
    pub ns: u64,
    pub ios: usize,
    /// Counters of the side that writes the data (the target's role).
    pub writer: Counters,
    /// Counters of the side that asks (the initiator's role).
    pub asker: Counters,
}

impl Run {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 * 1e3 / self.ns as f64
    }
}

fn region(hca: &mut TestHca, len: u32) -> MemoryRegion {
    let handle = hca.alloc(len, 64).unwrap();
    hca.reg_mr(handle, RW).unwrap()
}

fn post_recv(hca: &mut TestHca, conn: verbs::ConnId, mr: &MemoryRegion, id: u64) {
    let request = RecvWr {
        wr_id: WrId(id),
        sgl: Sgl::single(Sge::new(mr.lkey, 0, REQUEST_LEN)),
    };
    hca.post_recv(conn, &[request]).unwrap();
}

fn completions(hca: &mut TestHca) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 16];
    let n = hca.poll_cq(&mut out);
    out[..n].to_vec()
}

/// `ios` requests at QD1, each for `sizes(rng)` bytes, over `faults`.
fn run(
    seed: u64,
    selective: bool,
    buffers: Option<usize>,
    mtu: Mtu,
    ios: usize,
    faults: Faults,
    mut size: impl FnMut(&mut Rng) -> u32,
) -> Run {
    let mut pair = Pair::new(PairConfig {
        mtu,
        psn_a: Psn::new_truncate(seed.wrapping_mul(0x9e37_79b9) as u32),
        psn_b: Psn::new_truncate(0x00ff_fff0),
        ack_timeout: 14,
        memory: 4 << 20,
        latency_ns: 20_000,
        seed,
        selective,
        reorder_buffers: buffers,
        ..PairConfig::default()
    });
    pair.byte_time_ps = 8_000;
    pair.filter = Box::new(move |_, _, rng| {
        if rng.chance(faults.drop) {
            Verdict::Drop
        } else if rng.chance(faults.reorder) {
            Verdict::Hold
        } else if rng.chance(faults.duplicate) {
            Verdict::Duplicate
        } else if rng.chance(faults.corrupt) {
            Verdict::Corrupt
        } else {
            Verdict::Deliver
        }
    });
    let (a_conn, b_conn) = (pair.a.conn, pair.b.conn);
    // A asks (initiator), B writes (target).
    let a_dst = region(&mut pair.a.hca, MAX_LEN);
    let a_req = region(&mut pair.a.hca, REQUEST_LEN);
    let a_resp = region(&mut pair.a.hca, REQUEST_LEN);
    let b_src = region(&mut pair.b.hca, MAX_LEN);
    let b_req = region(&mut pair.b.hca, REQUEST_LEN);
    let b_resp = region(&mut pair.b.hca, REQUEST_LEN);
    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    post_recv(&mut pair.b.hca, b_conn, &b_req, 0);

    let mut bytes = 0u64;
    let mut done = 0usize;
    let mut expected: Vec<u8> = Vec::new();
    let mut ask = |pair: &mut Pair, rng: &mut Rng, expected: &mut Vec<u8>| {
        let len = size(rng);
        expected.resize(len as usize, 0);
        rng.fill(expected);
        // The data the target will send (its "disk").
        pair.b.hca.write(b_src.handle, 0, expected).unwrap();
        post_recv(&mut pair.a.hca, a_conn, &a_resp, 1);
        pair.a
            .hca
            .write(a_req.handle, 0, &len.to_le_bytes())
            .unwrap();
        let send = SendWr {
            wr_id: WrId(10),
            signaled: true,
            op: SendOp::Send {
                sgl: Sgl::single(Sge::new(a_req.lkey, 0, REQUEST_LEN)),
                imm: None,
            },
        };
        pair.a.hca.post_send(a_conn, &[send]).unwrap();
    };
    ask(&mut pair, &mut rng, &mut expected);
    let limit = 3_600_000_000_000u64;
    while done < ios {
        let scheduled = pair.step();
        for wc in completions(&mut pair.b.hca) {
            assert_eq!(wc.status, WcStatus::Success, "target: {wc:?}");
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            let mut len = [0u8; 4];
            pair.b.hca.read(b_req.handle, 0, &mut len).unwrap();
            let len = u32::from_le_bytes(len);
            post_recv(&mut pair.b.hca, b_conn, &b_req, 0);
            let write = SendWr {
                wr_id: WrId(20),
                signaled: false,
                op: SendOp::RdmaWrite {
                    sgl: Sgl::single(Sge::new(b_src.lkey, 0, len)),
                    remote_addr: 0,
                    rkey: a_dst.rkey,
                    imm: None,
                },
            };
            let response = SendWr {
                wr_id: WrId(21),
                signaled: true,
                op: SendOp::Send {
                    sgl: Sgl::single(Sge::new(b_resp.lkey, 0, REQUEST_LEN)),
                    imm: Some(len),
                },
            };
            pair.b.hca.post_send(b_conn, &[write, response]).unwrap();
        }
        for wc in completions(&mut pair.a.hca) {
            assert_eq!(wc.status, WcStatus::Success, "initiator: {wc:?}");
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            assert_eq!(wc.imm, Some(expected.len() as u32));
            let mut landed = vec![0u8; expected.len()];
            pair.a.hca.read(a_dst.handle, 0, &mut landed).unwrap();
            assert!(landed == expected, "data error in IO {done} (seed {seed})");
            bytes += expected.len() as u64;
            done += 1;
            if done < ios {
                ask(&mut pair, &mut rng, &mut expected);
            }
        }
        assert!(
            scheduled || pair.next_event().is_some() || done == ios,
            "stall at IO {done} (seed {seed})"
        );
        assert!(pair.now < limit, "virtual time limit (seed {seed})");
    }
    let ns = pair.now;
    // Let late duplicates and ACKs settle: every reorder buffer comes back.
    while pair.step() {
        assert!(pair.now < limit, "no quiescence (seed {seed})");
    }
    for hca in [&pair.a.hca, &pair.b.hca] {
        let (available, capacity) = hca.reorder_buffers();
        assert_eq!(available, capacity, "a reorder buffer was not given back");
    }
    Run {
        bytes,
        ns,
        ios,
        writer: *pair.b.hca.counters(),
        asker: *pair.a.hca.counters(),
    }
}

fn report(name: &str, clean: &Run, lossy: &Run) -> f64 {
    let ratio = lossy.mb_per_s() / clean.mb_per_s();
    let (w, a) = (&lossy.writer, &lossy.asker);
    println!(
        "{name}: lossless {:.1} MB/s, loss mix {:.1} MB/s ({:.1} %); {} IOs; \
         retransmitted {} of {} frames, {} timeouts ({} early), NAKs {}/{}, \
         duplicates {}, out-of-sequence drops {}",
        clean.mb_per_s(),
        lossy.mb_per_s(),
        ratio * 100.0,
        lossy.ios,
        w.retransmissions + a.retransmissions,
        w.frames_out + a.frames_out,
        w.timeouts + a.timeouts,
        w.early_timeouts + a.early_timeouts,
        w.naks_sent + a.naks_sent,
        w.naks_received + a.naks_received,
        w.duplicates + a.duplicates,
        w.drop_out_of_sequence + a.drop_out_of_sequence,
    );
    ratio
}

fn pieces(rng: &mut Rng) -> u32 {
    512 + rng.below(u64::from(MAX_LEN - 512) + 1) as u32
}

/// Runs lossless and lossy, go-back-N and selective; returns the
/// selective ratio.
fn compare(name: &str, seed: u64, mtu: Mtu, ios: usize, size: fn(&mut Rng) -> u32) -> f64 {
    let mut ratios = [0.0; 2];
    let mut lossless = [0.0; 2];
    for (index, selective) in [false, true].into_iter().enumerate() {
        let clean = run(seed, selective, None, mtu, ios, CLEAN, size);
        lossless[index] = clean.mb_per_s();
        let lossy = run(seed, selective, None, mtu, ios, MIX, size);
        let scheme = if selective { "selective" } else { "go-back-N" };
        ratios[index] = report(&format!("{name} {mtu:?} {scheme}"), &clean, &lossy);
        if !selective {
            assert_eq!(lossy.writer.kept_out_of_order, 0);
            assert_eq!(lossy.asker.kept_out_of_order, 0);
        } else {
            assert!(lossy.writer.kept_out_of_order + lossy.asker.kept_out_of_order > 0);
        }
    }
    // The selective scheme costs nothing without loss.
    assert!(
        lossless[1] >= 0.95 * lossless[0],
        "{name} {mtu:?}: lossless selective {:.1} MB/s, go-back-N {:.1} MB/s",
        lossless[1],
        lossless[0]
    );
    ratios[1]
}

fn fixed_128k(_: &mut Rng) -> u32 {
    128 << 10
}

#[test]
fn reads_of_128k_under_the_loss_mix() {
    for (seed, mtu) in [(1, Mtu::Mtu1024), (2, Mtu::Mtu4096)] {
        let ratio = compare("128 KiB QD1", seed, mtu, 200, fixed_128k);
        assert!(
            ratio >= 0.5,
            "selective 128 KiB reads at {:.1} % of lossless",
            ratio * 100.0
        );
    }
}

#[test]
fn random_pieces_under_the_loss_mix() {
    for (seed, mtu) in [(3, Mtu::Mtu1024), (4, Mtu::Mtu4096)] {
        let ratio = compare("512 B..1 MiB pieces QD1", seed, mtu, 100, pieces);
        assert!(
            ratio >= 0.3,
            "selective random pieces at {:.1} % of lossless",
            ratio * 100.0
        );
    }
}

/// With no reorder buffer free (all lent to other QPs) a selective QP drops
/// out-of-order packets as the standard does; every byte still arrives and
/// the peer still resends only what the NAKs name.
#[test]
fn selective_without_a_free_reorder_buffer_still_delivers() {
    let clean = run(5, true, Some(0), Mtu::Mtu1024, 60, CLEAN, fixed_128k);
    let lossy = run(5, true, Some(0), Mtu::Mtu1024, 60, MIX, fixed_128k);
    report("128 KiB QD1 Mtu1024 selective, no buffer", &clean, &lossy);
    assert_eq!(
        lossy.writer.kept_out_of_order + lossy.asker.kept_out_of_order,
        0
    );
    assert!(lossy.asker.drop_out_of_sequence > 0);
}
