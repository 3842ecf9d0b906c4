//! Lossy-link soak: thousands of mixed work requests between two HCAs.
//!
//! Two software HCAs exchange SEND, SEND_WITH_IMM, SEND_WITH_INV,
//! RDMA_WRITE, RDMA_WRITE_WITH_IMM (also zero-length with rkey 0),
//! RDMA_READ and LOCAL_INV in both directions, sizes log-uniform from 0 B to
//! 1 MiB, over a seeded link that drops, duplicates, reorders and corrupts
//! frames. A model checks every byte that lands (WRITE targets, READ
//! destinations, receive buffers), the order and status of every completion
//! (send queues complete in order; unsignaled requests complete silently) and
//! the invalidated rkeys; the run fails if the transport stalls (nothing
//! scheduled while work is outstanding) — the rnbd-lossy-stall property.
//!
//! `cargo test` runs a small seed set; the full soak (≥ 10,000 work requests
//! per configuration) is `#[ignore]`d and runs in the xtask `--full` tier or
//! with `cargo test -p brick-roce --test rc_sim -- --ignored`.

mod rc_support;

use std::collections::VecDeque;

use rc_support::{Pair, PairConfig, Rng, TestHca, Verdict};
use roce::qp::Counters;
use roce::types::{Mtu, Psn};
use verbs::{
    AccessFlags, Inline, Memory, MemoryRegion, RecvWr, Rkey, SendOp, SendWr, Sge, Sgl, Verbs,
    WcOpcode, WcStatus, WorkCompletion, WrId, MAX_INLINE,
};

/// Work requests in flight per side (each owns a slot of source and of the
/// peer's target memory).
const SLOTS: usize = 8;
/// Receive buffers per side (fewer than SLOTS: RNR NAKs happen).
const RECVS: usize = 4;
/// Regions the peer may name in SEND_WITH_INV.
const INV_REGIONS: usize = 4;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

#[derive(Debug, Clone, Copy)]
struct Faults {
    drop: f64,
    duplicate: f64,
    reorder: f64,
    corrupt: f64,
}

const CLEAN: Faults = Faults {
    drop: 0.0,
    duplicate: 0.0,
    reorder: 0.0,
    corrupt: 0.0,
};

const LOSSY: Faults = Faults {
    drop: 0.01,
    duplicate: 0.005,
    reorder: 0.01,
    corrupt: 0.002,
};

/// The link the software-HCA issue names: 2 % drop, reordering,
/// duplication, 0.1 % corruption.
const SPEC: Faults = Faults {
    drop: 0.02,
    duplicate: 0.01,
    reorder: 0.02,
    corrupt: 0.001,
};

const HOSTILE: Faults = Faults {
    drop: 0.05,
    duplicate: 0.02,
    reorder: 0.05,
    corrupt: 0.01,
};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Send {
        imm: Option<u32>,
        inv: Option<usize>,
    },
    Write {
        imm: Option<u32>,
    },
    WriteZero,
    Read {
        remote_offset: u32,
    },
    LocalInv,
}

#[derive(Debug)]
struct Posted {
    id: u64,
    slot: usize,
    signaled: bool,
    kind: Kind,
    len: u32,
}

/// What a receive completion must look like.
#[derive(Debug)]
enum Expect {
    Send {
        payload: Vec<u8>,
        imm: Option<u32>,
        inv: Option<(usize, Rkey)>,
    },
    WriteImm {
        len: u32,
        imm: u32,
    },
}

/// One side's memory and model.
struct Side {
    slot_size: u32,
    src: MemoryRegion,
    dst: MemoryRegion,
    rsrc: MemoryRegion,
    recv: MemoryRegion,
    inv: Vec<MemoryRegion>,
    /// Whether the peer may name inv region i (not in flight).
    inv_free: Vec<bool>,
    local_inv: MemoryRegion,
    local_inv_busy: bool,
    free_slots: Vec<usize>,
    posted: VecDeque<Posted>,
    /// Receive completions this side must see, in order.
    expect: VecDeque<Expect>,
    next_id: u64,
    to_post: usize,
    completed: usize,
    received: usize,
}

fn region(hca: &mut TestHca, len: u32, access: AccessFlags) -> MemoryRegion {
    let handle = hca.alloc(len, 64).unwrap();
    hca.reg_mr(handle, access).unwrap()
}

impl Side {
    fn new(
        hca: &mut TestHca,
        conn: verbs::ConnId,
        slot_size: u32,
        rng: &mut Rng,
        total: usize,
    ) -> Self {
        let src = region(hca, slot_size * SLOTS as u32, RW);
        let dst = region(hca, slot_size * SLOTS as u32, RW);
        let rsrc = region(hca, slot_size, RW);
        let mut pattern = vec![0u8; slot_size as usize];
        rng.fill(&mut pattern);
        hca.write(rsrc.handle, 0, &pattern).unwrap();
        let recv = region(hca, slot_size * RECVS as u32, RW);
        let inv = (0..INV_REGIONS).map(|_| region(hca, 64, RW)).collect();
        let local_inv = region(hca, 64, RW);
        for slot in 0..RECVS {
            post_recv(hca, conn, &recv, slot, slot_size);
        }
        Self {
            slot_size,
            src,
            dst,
            rsrc,
            recv,
            inv,
            inv_free: vec![true; INV_REGIONS],
            local_inv,
            local_inv_busy: false,
            free_slots: (0..SLOTS).collect(),
            posted: VecDeque::new(),
            expect: VecDeque::new(),
            next_id: 1,
            to_post: total,
            completed: 0,
            received: 0,
        }
    }
}

fn post_recv(hca: &mut TestHca, conn: verbs::ConnId, recv: &MemoryRegion, slot: usize, size: u32) {
    let request = RecvWr {
        wr_id: WrId(slot as u64),
        sgl: Sgl::single(Sge::new(recv.lkey, slot as u32 * size, size)),
    };
    hca.post_recv(conn, &[request]).unwrap();
}

fn log_uniform(rng: &mut Rng, max: u32) -> u32 {
    if rng.chance(0.03) {
        return 0;
    }
    let bits = f64::from(max).log2();
    let exponent = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * bits;
    (2f64.powf(exponent) as u32).min(max)
}

fn read_bytes(hca: &TestHca, mr: &MemoryRegion, offset: u32, len: u32) -> Vec<u8> {
    let mut out = vec![0; len as usize];
    hca.read(mr.handle, offset, &mut out).unwrap();
    out
}

struct Sim {
    pair: Pair,
    sides: [Side; 2],
    rng: Rng,
    max_len: u32,
}

impl Sim {
    fn hcas(&mut self, index: usize) -> (&mut TestHca, &mut TestHca) {
        if index == 0 {
            (&mut self.pair.a.hca, &mut self.pair.b.hca)
        } else {
            (&mut self.pair.b.hca, &mut self.pair.a.hca)
        }
    }

    /// Posts new work on side `index` while it has free slots.
    fn post(&mut self, index: usize) {
        loop {
            let side = &self.sides[index];
            if side.to_post == 0 || side.free_slots.is_empty() {
                return;
            }
            let conn = if index == 0 {
                self.pair.a.conn
            } else {
                self.pair.b.conn
            };
            let roll = self.rng.below(100);
            let mut len = log_uniform(&mut self.rng, self.max_len);
            let imm = self.rng.next_u64() as u32;
            let peer = 1 - index;
            let kind = match roll {
                0..=19 => Kind::Send {
                    imm: None,
                    inv: None,
                },
                20..=29 => Kind::Send {
                    imm: Some(imm),
                    inv: None,
                },
                30..=34 => match self.sides[peer].inv_free.iter().position(|free| *free) {
                    Some(inv) => Kind::Send {
                        imm: None,
                        inv: Some(inv),
                    },
                    None => Kind::Send {
                        imm: None,
                        inv: None,
                    },
                },
                35..=59 => Kind::Write { imm: None },
                60..=69 => Kind::Write { imm: Some(imm) },
                70..=72 => Kind::WriteZero,
                73..=94 => Kind::Read { remote_offset: 0 },
                _ if !self.sides[index].local_inv_busy => Kind::LocalInv,
                _ => Kind::Write { imm: None },
            };
            let kind = match kind {
                Kind::Read { .. } => Kind::Read {
                    remote_offset: self.rng.below(u64::from(self.max_len - len) + 1) as u32,
                },
                other => other,
            };
            if matches!(kind, Kind::WriteZero | Kind::LocalInv) {
                len = 0;
            }
            // Now and then a SEND carries its bytes in the request itself.
            let inline = matches!(kind, Kind::Send { inv: None, .. }) && self.rng.chance(0.3);
            if inline {
                len = len.min(MAX_INLINE as u32);
            }
            let side = &mut self.sides[index];
            let slot = side.free_slots.pop().unwrap();
            let slot_offset = slot as u32 * side.slot_size;
            let id = side.next_id;
            side.next_id += 1;
            side.to_post -= 1;
            // Unsignaled now and then, but never the last one.
            let signaled = side.to_post == 0 || !self.rng.chance(0.2);
            let mut payload = vec![0u8; len as usize];
            self.rng.fill(&mut payload);
            let src = side.src;
            let sgl = if len == 0 {
                Sgl::new()
            } else if len >= 4 && self.rng.chance(0.3) {
                // Two entries: the message is gathered across SGEs.
                let split = self.rng.below(u64::from(len)) as u32;
                let mut list = Sgl::single(Sge::new(src.lkey, slot_offset, split));
                list.push(Sge::new(src.lkey, slot_offset + split, len - split))
                    .unwrap();
                list
            } else {
                Sgl::single(Sge::new(src.lkey, slot_offset, len))
            };
            let peer_dst = self.sides[peer].dst;
            let peer_rsrc = self.sides[peer].rsrc;
            let op = match kind {
                Kind::Send { imm, inv: None } if inline => SendOp::SendInline {
                    data: Inline::try_from_slice(&payload).unwrap(),
                    imm,
                },
                Kind::Send { imm, inv: None } => SendOp::Send { sgl, imm },
                Kind::Send { inv: Some(inv), .. } => SendOp::SendWithInv {
                    sgl,
                    invalidate: self.sides[peer].inv[inv].rkey,
                },
                Kind::Write { imm } => SendOp::RdmaWrite {
                    sgl,
                    remote_addr: peer_dst.remote_addr(slot_offset),
                    rkey: peer_dst.rkey,
                    imm,
                },
                Kind::WriteZero => SendOp::RdmaWrite {
                    sgl,
                    remote_addr: 0,
                    rkey: Rkey(0),
                    imm: None,
                },
                Kind::Read { remote_offset } => SendOp::RdmaRead {
                    sgl,
                    remote_addr: peer_rsrc.remote_addr(remote_offset),
                    rkey: peer_rsrc.rkey,
                },
                Kind::LocalInv => SendOp::LocalInv {
                    rkey: self.sides[index].local_inv.rkey,
                },
            };
            let (local, _) = self.hcas(index);
            if !matches!(kind, Kind::Read { .. }) && len > 0 {
                local.write(src.handle, slot_offset, &payload).unwrap();
            }
            local
                .post_send(
                    conn,
                    &[SendWr {
                        wr_id: WrId(id),
                        signaled,
                        op,
                    }],
                )
                .unwrap();
            match kind {
                Kind::Send { imm, inv } => {
                    let inv = inv.map(|inv| {
                        self.sides[peer].inv_free[inv] = false;
                        (inv, self.sides[peer].inv[inv].rkey)
                    });
                    self.sides[peer]
                        .expect
                        .push_back(Expect::Send { payload, imm, inv });
                }
                Kind::Write { imm: Some(imm) } => {
                    self.sides[peer]
                        .expect
                        .push_back(Expect::WriteImm { len, imm });
                }
                Kind::LocalInv => self.sides[index].local_inv_busy = true,
                _ => {}
            }
            self.sides[index].posted.push_back(Posted {
                id,
                slot,
                signaled,
                kind,
                len,
            });
        }
    }

    /// Checks a finished send WR's data and frees its slot.
    fn finish(&mut self, index: usize, posted: Posted) {
        let peer = 1 - index;
        let slot_offset = posted.slot as u32 * self.sides[index].slot_size;
        let src = self.sides[index].src;
        let peer_dst = self.sides[peer].dst;
        let peer_rsrc = self.sides[peer].rsrc;
        let local_inv = self.sides[index].local_inv;
        let (local, remote) = self.hcas(index);
        match posted.kind {
            Kind::Write { .. } => {
                assert!(
                    read_bytes(local, &src, slot_offset, posted.len)
                        == read_bytes(remote, &peer_dst, slot_offset, posted.len),
                    "WRITE {} of {} bytes landed wrong",
                    posted.id,
                    posted.len
                );
            }
            Kind::Read { remote_offset } => {
                assert!(
                    read_bytes(local, &src, slot_offset, posted.len)
                        == read_bytes(remote, &peer_rsrc, remote_offset, posted.len),
                    "READ {} of {} bytes landed wrong",
                    posted.id,
                    posted.len
                );
            }
            Kind::LocalInv => {
                let new = local.rekey(local_inv.lkey).unwrap();
                self.sides[index].local_inv.rkey = new;
                self.sides[index].local_inv_busy = false;
            }
            _ => {}
        }
        self.sides[index].free_slots.push(posted.slot);
        self.sides[index].completed += 1;
    }

    fn poll_completions(&mut self, index: usize) {
        let mut out = [WorkCompletion::default(); 64];
        loop {
            let n = self.hcas(index).0.poll_cq(&mut out);
            if n == 0 {
                return;
            }
            for wc in &out[..n] {
                if wc.opcode.is_receive() {
                    self.check_receive(index, wc);
                    continue;
                }
                assert_eq!(wc.status, WcStatus::Success, "side {index}: {wc:?}");
                loop {
                    let posted = self.sides[index]
                        .posted
                        .pop_front()
                        .unwrap_or_else(|| panic!("completion for nothing posted: {wc:?}"));
                    if posted.id == wc.wr_id.0 {
                        assert!(posted.signaled, "unsignaled WR completed: {wc:?}");
                        let opcode = match posted.kind {
                            Kind::Send { .. } => WcOpcode::Send,
                            Kind::Write { .. } | Kind::WriteZero => WcOpcode::RdmaWrite,
                            Kind::Read { .. } => WcOpcode::RdmaRead,
                            Kind::LocalInv => WcOpcode::LocalInv,
                        };
                        assert_eq!(wc.opcode, opcode);
                        if opcode == WcOpcode::RdmaRead {
                            assert_eq!(wc.byte_len, posted.len);
                        }
                        self.finish(index, posted);
                        break;
                    }
                    assert!(
                        !posted.signaled,
                        "completion order: {wc:?} before signaled {}",
                        posted.id
                    );
                    self.finish(index, posted);
                }
            }
        }
    }

    fn check_receive(&mut self, index: usize, wc: &WorkCompletion) {
        assert_eq!(wc.status, WcStatus::Success, "side {index} receive: {wc:?}");
        let expect = self.sides[index]
            .expect
            .pop_front()
            .unwrap_or_else(|| panic!("unexpected receive {wc:?}"));
        let slot = wc.wr_id.0 as usize;
        let size = self.sides[index].slot_size;
        let recv = self.sides[index].recv;
        let conn = if index == 0 {
            self.pair.a.conn
        } else {
            self.pair.b.conn
        };
        match expect {
            Expect::Send { payload, imm, inv } => {
                assert_eq!(wc.opcode, WcOpcode::Recv);
                assert_eq!(wc.byte_len as usize, payload.len());
                assert_eq!(wc.imm, imm);
                let (local, _) = self.hcas(index);
                assert!(
                    read_bytes(local, &recv, slot as u32 * size, wc.byte_len) == payload,
                    "SEND of {} bytes received wrong",
                    payload.len()
                );
                if let Some((region, rkey)) = inv {
                    assert_eq!(wc.invalidated_rkey, Some(rkey));
                    let lkey = self.sides[index].inv[region].lkey;
                    let fresh = self.hcas(index).0.rekey(lkey).unwrap();
                    self.sides[index].inv[region].rkey = fresh;
                    self.sides[index].inv_free[region] = true;
                } else {
                    assert_eq!(wc.invalidated_rkey, None);
                }
            }
            Expect::WriteImm { len, imm } => {
                assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                assert_eq!(wc.byte_len, len);
                assert_eq!(wc.imm, Some(imm));
            }
        }
        self.sides[index].received += 1;
        post_recv(self.hcas(index).0, conn, &recv, slot, size);
    }

    fn done(&self) -> bool {
        self.sides
            .iter()
            .all(|side| side.to_post == 0 && side.posted.is_empty() && side.expect.is_empty())
    }
}

/// Runs `total` WRs per side with `faults`; returns both sides' counters.
fn soak(seed: u64, mtu: Mtu, total: usize, max_len: u32, faults: Faults) -> [Counters; 2] {
    soak_with(seed, mtu, total, max_len, faults, false)
}

/// [`soak`] with both QPs running Brick's selective retransmission or not.
fn soak_with(
    seed: u64,
    mtu: Mtu,
    total: usize,
    max_len: u32,
    faults: Faults,
    selective: bool,
) -> [Counters; 2] {
    soak_run(seed, mtu, total, max_len, faults, selective, true, false).0
}

/// One soak run; `fast_paths` as [`PairConfig::fast_paths`]; with
/// `record`, every frame sent, per direction.
#[allow(clippy::too_many_arguments)]
fn soak_run(
    seed: u64,
    mtu: Mtu,
    total: usize,
    max_len: u32,
    faults: Faults,
    selective: bool,
    fast_paths: bool,
    record: bool,
) -> ([Counters; 2], [Vec<Vec<u8>>; 2]) {
    let slot_size = max_len.max(64);
    let memory = slot_size as usize * (2 * SLOTS + 1 + RECVS) + (1 << 16);
    let mut pair = Pair::new(PairConfig {
        mtu,
        psn_a: Psn::new_truncate(seed.wrapping_mul(0x9e37_79b9) as u32),
        psn_b: Psn::new_truncate(0x00ff_ff00u32.wrapping_add(seed as u32 * 7)),
        ack_timeout: 8,
        memory,
        seed,
        selective,
        fast_paths,
        ..PairConfig::default()
    });
    pair.record = record;
    pair.filter = Box::new(move |_, _, rng| {
        if rng.chance(faults.drop) {
            Verdict::Drop
        } else if rng.chance(faults.duplicate) {
            Verdict::Duplicate
        } else if rng.chance(faults.reorder) {
            Verdict::Delay(1 + rng.below(20_000))
        } else if rng.chance(faults.corrupt) {
            Verdict::Corrupt
        } else {
            Verdict::Deliver
        }
    });
    let mut rng = Rng(seed.wrapping_mul(0x1234_5678_9abc_def1) | 1);
    let side_a = Side::new(&mut pair.a.hca, pair.a.conn, slot_size, &mut rng, total);
    let side_b = Side::new(&mut pair.b.hca, pair.b.conn, slot_size, &mut rng, total);
    let mut sim = Sim {
        pair,
        sides: [side_a, side_b],
        rng,
        max_len,
    };
    let limit = 100_000_000_000_000u64;
    loop {
        sim.post(0);
        sim.post(1);
        let scheduled = sim.pair.step();
        sim.poll_completions(0);
        sim.poll_completions(1);
        if !scheduled {
            // Completions just freed slots: new work may be posted now.
            sim.post(0);
            sim.post(1);
        }
        if !scheduled && sim.pair.next_event().is_none() && !sim.done() {
            panic!(
                "stall (seed {seed}, {mtu:?}): nothing scheduled with work outstanding\nA {:?}\nB {:?}\nA posted {:?}\nB posted {:?}\nA {:?}\nB {:?}",
                sim.pair.a.hca.counters(),
                sim.pair.b.hca.counters(),
                (sim.sides[0].posted.front(), sim.sides[0].expect.front(), sim.sides[0].to_post, sim.sides[0].received),
                (sim.sides[1].posted.front(), sim.sides[1].expect.front(), sim.sides[1].to_post, sim.sides[1].received),
                sim.pair.a.hca.qp(sim.pair.a.conn).unwrap().snapshot(),
                sim.pair.b.hca.qp(sim.pair.b.conn).unwrap().snapshot(),
            );
        }
        sim.poll_completions(0);
        sim.poll_completions(1);
        if sim.done() {
            break;
        }
        assert!(sim.pair.now < limit, "virtual time limit (seed {seed})");
    }
    assert_eq!(sim.sides[0].completed, total);
    assert_eq!(sim.sides[1].completed, total);
    (
        [*sim.pair.a.hca.counters(), *sim.pair.b.hca.counters()],
        core::mem::take(&mut sim.pair.sent),
    )
}

/// The HCA's fast paths (in-order WRITE MIDDLE/LAST received straight
/// from the fixed headers; middle packets sent in runs) do exactly what the
/// general paths do: the same seeded runs, with them and without, send the
/// same frames byte for byte and end with the same counters, on clean,
/// lossy and hostile links and with selective retransmission (the soak's
/// model checks the data).
#[test]
fn fast_paths_change_nothing_on_the_wire() {
    for (seed, mtu, faults, selective) in [
        (21, Mtu::Mtu1024, CLEAN, false),
        (22, Mtu::Mtu256, LOSSY, false),
        (23, Mtu::Mtu1024, HOSTILE, false),
        (24, Mtu::Mtu1024, LOSSY, true),
        (25, Mtu::Mtu4096, HOSTILE, true),
    ] {
        let run = |fast| soak_run(seed, mtu, 120, 64 << 10, faults, selective, fast, true);
        let (fast_counters, fast_frames) = run(true);
        let (general_counters, general_frames) = run(false);
        assert_eq!(fast_counters, general_counters, "seed {seed}: counters");
        for dir in 0..2 {
            assert_eq!(
                fast_frames[dir].len(),
                general_frames[dir].len(),
                "seed {seed}: frames sent in direction {dir}"
            );
            for (i, (fast, general)) in fast_frames[dir]
                .iter()
                .zip(&general_frames[dir])
                .enumerate()
            {
                assert!(
                    fast == general,
                    "seed {seed}: frame {i} of direction {dir} differs"
                );
            }
        }
        assert!(
            fast_frames.iter().map(Vec::len).sum::<usize>() > 1000,
            "seed {seed}: the run moved data"
        );
    }
}

#[test]
fn soak_clean_link() {
    for (seed, mtu) in [(1, Mtu::Mtu1024), (2, Mtu::Mtu4096), (3, Mtu::Mtu256)] {
        for counters in soak(seed, mtu, 150, 256 << 10, CLEAN) {
            // Without loss the only go-backs follow RNR NAKs (and the NAK
            // 0x60 for the packets already behind the refused one).
            assert_eq!(counters.timeouts, 0, "{counters:?}");
            assert_eq!(counters.duplicates, 0, "{counters:?}");
            assert_eq!(counters.drop_bad_checksum, 0, "{counters:?}");
        }
    }
}

#[test]
fn soak_lossy_link() {
    for (seed, mtu, max_len) in [(11, Mtu::Mtu1024, 1 << 20), (12, Mtu::Mtu4096, 256 << 10)] {
        soak(seed, mtu, 150, max_len, LOSSY);
    }
}

#[test]
fn soak_hostile_link() {
    for (seed, mtu) in [(21, Mtu::Mtu1024), (22, Mtu::Mtu4096), (23, Mtu::Mtu512)] {
        soak(seed, mtu, 150, 64 << 10, HOSTILE);
    }
}

/// The same mixed work (READs, RNR NAKs, invalidations included) with
/// selective retransmission on both ends: every byte and completion is
/// checked as with go-back-N, and packets were really kept out of order.
#[test]
fn soak_selective() {
    for (seed, mtu, max_len, faults) in [
        (31, Mtu::Mtu1024, 1 << 20, SPEC),
        (32, Mtu::Mtu4096, 256 << 10, SPEC),
        (33, Mtu::Mtu1024, 64 << 10, HOSTILE),
        (34, Mtu::Mtu512, 64 << 10, HOSTILE),
        (35, Mtu::Mtu256, 64 << 10, LOSSY),
    ] {
        let [a, b] = soak_with(seed, mtu, 150, max_len, faults, true);
        assert!(
            a.kept_out_of_order + b.kept_out_of_order > 0,
            "seed {seed}: nothing kept out of order\n{a:?}\n{b:?}"
        );
    }
    // Without loss only RNR NAKs cost a resend, of the refused packet
    // alone (go-back-N resends everything after it).
    let [a, b] = soak_with(36, Mtu::Mtu1024, 150, 256 << 10, CLEAN, true);
    assert!(a.rnr_naks_sent + b.rnr_naks_sent > 0, "{a:?}\n{b:?}");
    for counters in [a, b] {
        assert_eq!(counters.timeouts, 0, "{counters:?}");
        assert_eq!(counters.drop_bad_checksum, 0, "{counters:?}");
        assert!(
            counters.retransmissions <= counters.rnr_naks_received,
            "{counters:?}"
        );
    }
}

/// The full soak: 10,000 WRs per side and configuration. Sizes go up to
/// 1 MiB on the clean, 1 % and 2 % loss links; on the hostile link (5 % loss)
/// go-back-N resends up to a window per loss, so its messages stay smaller
/// to keep the run in minutes.
#[test]
#[ignore = "full soak (xtask --full tier)"]
fn soak_full() {
    let runs = [
        (101, Mtu::Mtu1024, LOSSY, 1 << 20),
        (102, Mtu::Mtu4096, LOSSY, 1 << 20),
        (106, Mtu::Mtu1024, SPEC, 1 << 20),
        (107, Mtu::Mtu4096, SPEC, 1 << 20),
        (103, Mtu::Mtu1024, HOSTILE, 64 << 10),
        (104, Mtu::Mtu4096, HOSTILE, 256 << 10),
        (105, Mtu::Mtu1024, CLEAN, 1 << 20),
    ];
    for ((seed, mtu, faults, max_len), selective) in
        runs.into_iter().flat_map(|run| [(run, false), (run, true)])
    {
        let started = std::time::Instant::now();
        let [a, b] = soak_with(seed, mtu, 10_000, max_len, faults, selective);
        eprintln!(
            "seed {seed} {mtu:?} {faults:?} selective {selective} up to {max_len} B: {} frames, {} retransmitted, \
             {} timeouts, {} NAKs, {} RNR NAKs, {:.1} s",
            a.frames_out + b.frames_out,
            a.retransmissions + b.retransmissions,
            a.timeouts + b.timeouts,
            a.naks_sent + b.naks_sent,
            a.rnr_naks_sent + b.rnr_naks_sent,
            started.elapsed().as_secs_f64()
        );
    }
}
