//! In-process RC throughput: RDMA WRITE 64 KiB and SEND 64 B vs memcpy.
//!
//! Two software HCAs connected back to back in one thread (no loss): every
//! frame is gathered once into a "wire" buffer (what a NIC's DMA would do)
//! and handed to the peer's `receive`, which verifies the ICRC and places the
//! payload into registered memory. Printed beside a plain `memcpy` of the
//! same sizes measured in the same run, as ratios, so the numbers mean
//! something on any machine. Not a test: `cargo bench -p brick-roce`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use roce::hca::{Hca, HcaConfig};
use roce::qp::QpParams;
use roce::types::{Mtu, Psn};
use verbs::{
    AccessFlags, ConnId, KeySource, MemoryRegion, RecvWr, SendOp, SendWr, Sge, Sgl, Verbs,
    WorkCompletion, WrId,
};

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (self.0 >> 33) as u32
    }
}

type BenchHca = Hca<Vec<u8>, Keys, 16, 2, 4096>;

const DEPTH: usize = 32;

struct Bench {
    a: Box<BenchHca>,
    b: Box<BenchHca>,
    conn_a: ConnId,
    conn_b: ConnId,
    start: Instant,
    wire: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
}

fn endpoint(last: u8, memory: usize) -> (Box<BenchHca>, ConnId) {
    let config = HcaConfig {
        mac: [0x52, 0x54, 0, 0, 0, last],
        ip: [10, 0, 0, last],
    };
    let mut hca = Box::new(BenchHca::new(
        vec![0; memory],
        Keys(u64::from(last)),
        config,
    ));
    let conn = hca.create_qp().unwrap();
    (hca, conn)
}

fn params(
    local: &BenchHca,
    conn: ConnId,
    peer: &BenchHca,
    peer_conn: ConnId,
    mtu: Mtu,
) -> QpParams {
    let qpn = local.qpn(conn).unwrap();
    let peer_config = peer.config();
    QpParams {
        peer_qpn: peer.qpn(peer_conn).unwrap(),
        send_psn: Psn::new(100),
        recv_psn: Psn::new(100),
        mtu,
        local_ack_timeout: 19,
        retry_count: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        remote_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path: local.path_to(qpn, peer_config.mac, peer_config.ip),
    }
}

impl Bench {
    fn new(mtu: Mtu) -> Self {
        let (mut a, conn_a) = endpoint(1, 8 << 20);
        let (mut b, conn_b) = endpoint(2, 8 << 20);
        let pa = params(&a, conn_a, &b, conn_b, mtu);
        let pb = params(&b, conn_b, &a, conn_a, mtu);
        a.connect_qp(conn_a, pa).unwrap();
        b.connect_qp(conn_b, pb).unwrap();
        Self {
            a,
            b,
            conn_a,
            conn_b,
            start: Instant::now(),
            wire: VecDeque::new(),
            pool: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Moves frames both ways until both sides are quiet.
    fn pump(&mut self) {
        loop {
            let now = self.now();
            let mut moved = false;
            for from_a in [true, false] {
                let (sender, receiver) = if from_a {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                let wire = &mut self.wire;
                let pool = &mut self.pool;
                sender.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                    let mut frame = pool.pop().unwrap_or_default();
                    frame.clear();
                    frame.extend_from_slice(h);
                    for piece in p {
                        frame.extend_from_slice(piece);
                    }
                    frame.extend_from_slice(t);
                    wire.push_back(frame);
                });
                while let Some(frame) = self.wire.pop_front() {
                    moved = true;
                    receiver.receive(now, &frame);
                    self.pool.push(frame);
                }
            }
            if !moved {
                return;
            }
        }
    }
}

fn region(hca: &mut BenchHca, len: u32) -> MemoryRegion {
    let handle = hca.alloc(len, 4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    hca.reg_mr(handle, access).unwrap()
}

/// RDMA WRITE of `size`-byte messages for `duration`; returns bytes/s.
fn write_rate(mtu: Mtu, size: u32, duration: Duration) -> f64 {
    let mut bench = Bench::new(mtu);
    let src = region(&mut bench.a, size * DEPTH as u32);
    let dst = region(&mut bench.b, size * DEPTH as u32);
    let mut completions = [WorkCompletion::default(); 64];
    let mut in_flight = 0;
    let mut done = 0u64;
    let mut next = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        while in_flight < DEPTH {
            let slot = (next % DEPTH as u64) as u32;
            let request = SendWr {
                wr_id: WrId(next),
                signaled: true,
                op: SendOp::RdmaWrite {
                    sgl: Sgl::single(Sge::new(src.lkey, slot * size, size)),
                    remote_addr: dst.remote_addr(slot * size),
                    rkey: dst.rkey,
                    imm: None,
                },
            };
            bench.a.post_send(bench.conn_a, &[request]).unwrap();
            next += 1;
            in_flight += 1;
        }
        bench.pump();
        let n = bench.a.poll_cq(&mut completions);
        in_flight -= n;
        done += n as u64;
    }
    done as f64 * f64::from(size) / start.elapsed().as_secs_f64()
}

/// SEND of `size`-byte messages for `duration`; returns messages/s.
fn send_rate(size: u32, duration: Duration) -> f64 {
    let mut bench = Bench::new(Mtu::Mtu1024);
    let src = region(&mut bench.a, 4096);
    let recv = region(&mut bench.b, 4096 * DEPTH as u32);
    for slot in 0..DEPTH as u32 {
        let request = RecvWr {
            wr_id: WrId(u64::from(slot)),
            sgl: Sgl::single(Sge::new(recv.lkey, slot * 4096, 4096)),
        };
        bench.b.post_recv(bench.conn_b, &[request]).unwrap();
    }
    let mut completions = [WorkCompletion::default(); 64];
    let mut in_flight = 0;
    let mut done = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        while in_flight < DEPTH {
            let request = SendWr {
                wr_id: WrId(done),
                signaled: true,
                op: SendOp::Send {
                    sgl: Sgl::single(Sge::new(src.lkey, 0, size)),
                    imm: Some(1),
                },
            };
            bench.a.post_send(bench.conn_a, &[request]).unwrap();
            in_flight += 1;
        }
        bench.pump();
        let n = bench.a.poll_cq(&mut completions);
        in_flight -= n;
        done += n as u64;
        let n = bench.b.poll_cq(&mut completions);
        for wc in &completions[..n] {
            let slot = wc.wr_id.0 as u32;
            let request = RecvWr {
                wr_id: wc.wr_id,
                sgl: Sgl::single(Sge::new(recv.lkey, slot * 4096, 4096)),
            };
            bench.b.post_recv(bench.conn_b, &[request]).unwrap();
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

/// memcpy of `size`-byte blocks for `duration`; returns (bytes/s, copies/s).
fn memcpy_rate(size: usize, duration: Duration) -> (f64, f64) {
    let source = vec![0x5au8; size * DEPTH];
    let mut target = vec![0u8; size * DEPTH];
    let start = Instant::now();
    let mut copies = 0u64;
    while start.elapsed() < duration {
        for slot in 0..DEPTH {
            let range = slot * size..(slot + 1) * size;
            target[range.clone()].copy_from_slice(std::hint::black_box(&source[range]));
        }
        copies += DEPTH as u64;
        std::hint::black_box(&mut target);
    }
    let seconds = start.elapsed().as_secs_f64();
    (
        copies as f64 * size as f64 / seconds,
        copies as f64 / seconds,
    )
}

/// ICRC (CRC-32 over headers + payload) throughput in GiB-able bytes/s: the
/// transport computes it twice per payload byte (send, verify).
fn icrc_rate(duration: Duration) -> f64 {
    let headers = [0x45u8; 58];
    let payload = vec![0xa5u8; 64 << 10];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < duration {
        for chunk in payload.chunks(1024) {
            std::hint::black_box(roce::wire::icrc_over(
                &headers,
                &[std::hint::black_box(chunk)],
            ));
        }
        bytes += payload.len() as u64;
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let duration = Duration::from_millis(
        std::env::var("BRICK_BENCH_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(1000),
    );
    let gib = f64::from(1u32 << 30);
    let (copy_64k, _) = memcpy_rate(64 << 10, duration);
    let (_, copy_64b) = memcpy_rate(64, duration);
    println!("memcpy 64 KiB:                {:8.2} GiB/s", copy_64k / gib);
    println!(
        "memcpy 64 B:                  {:8.2} M copies/s",
        copy_64b / 1e6
    );
    let icrc = icrc_rate(duration);
    println!(
        "ICRC (CRC-32), 1 KiB pieces:  {:8.2} GiB/s   = {:.3} x memcpy",
        icrc / gib,
        icrc / copy_64k
    );
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let write = write_rate(mtu, 64 << 10, duration);
        println!(
            "RDMA WRITE 64 KiB, MTU {:4}:  {:8.2} GiB/s   = {:.3} x memcpy",
            mtu.bytes().unwrap_or(0),
            write / gib,
            write / copy_64k
        );
    }
    let sends = send_rate(64, duration);
    println!(
        "SEND 64 B, MTU 1024:          {:8.3} M msgs/s  = {:.4} x memcpy of 64 B",
        sends / 1e6,
        sends / copy_64b
    );
}
