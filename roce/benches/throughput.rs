//! RC throughput: RDMA WRITE 64 KiB and SEND 64 B, in process and over UDP.
//!
//! In process: two software HCAs connected back to back in one thread (no
//! loss): every frame is gathered once into a "wire" buffer (what a NIC's
//! DMA would do) and handed to the peer's `receive`, which verifies the ICRC
//! and places the payload into registered memory. Printed beside a plain
//! `memcpy` of the same sizes measured in the same run, as ratios.
//!
//! Over UDP loopback: the same two HCAs in UDP mode (`LinkMode::Udp`), each
//! on a `hal::hosted::UdpNic` (127.0.0.1 and 127.0.0.2, one port), one
//! thread polling both: a datagram goes out with `sendmsg` (header, payload
//! pieces from registered memory, trailer) and the peer's socket is drained
//! after every `BURST` datagrams. Printed beside a raw blaster measured in the same run: plain
//! `std::net::UdpSocket` `send_to`/`recv_from` of datagrams of the same size
//! (the Brick datagram: BTH + MTU + ICRC; and 64 B), in bursts, one thread
//! too, as ratios (Brick over UDP / raw UDP).
//!
//! Not a test: `cargo bench -p brick-roce` (`BRICK_BENCH_MS` sets each
//! measurement's length, default 1000).

use std::collections::VecDeque;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use hal::hosted::UdpNic;
use hal::{DatagramNic, NicError};
use roce::hca::{Hca, HcaConfig, LinkMode};
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

/// Datagrams sent over UDP before the receiving socket is drained (raw and
/// Brick alike): 16 of 4 KiB fit a default socket buffer.
const BURST: usize = 16;

/// How the two HCAs of a [`Bench`] reach each other.
enum Wire {
    /// Frames gathered into buffers and handed over in process.
    InProcess {
        wire: VecDeque<Vec<u8>>,
        pool: Vec<Vec<u8>>,
    },
    /// Datagrams over two loopback UDP sockets.
    Udp {
        nic_a: UdpNic,
        nic_b: UdpNic,
        /// Datagrams the socket refused (lost; the transport resends).
        refused: u64,
    },
}

struct Bench {
    a: Box<BenchHca>,
    b: Box<BenchHca>,
    conn_a: ConnId,
    conn_b: ConnId,
    start: Instant,
    wire: Wire,
}

/// Binds 127.0.0.1 and 127.0.0.2 on one free port, with a jumbo IP MTU
/// (a UdpNic drops datagrams over its MTU; path MTU 4096 needs 9000).
fn udp_pair() -> (UdpNic, UdpNic) {
    for _ in 0..20 {
        let a = UdpNic::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = a.local_addr().port();
        if let Ok(b) = UdpNic::bind(SocketAddr::from(([127, 0, 0, 2], port))) {
            return (a.with_mtu(9000), b.with_mtu(9000));
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

fn endpoint(last: u8, memory: usize, link: LinkMode) -> (Box<BenchHca>, ConnId) {
    let ip = match link {
        LinkMode::Udp { .. } => [127, 0, 0, last],
        _ => [10, 0, 0, last],
    };
    let config = HcaConfig {
        mac: [0x52, 0x54, 0, 0, 0, last],
        ip,
    };
    let mut hca = Box::new(BenchHca::with_link(
        vec![0; memory],
        Keys(u64::from(last)),
        config,
        link,
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
        // 67 ms: a datagram the loopback drops is resent soon.
        local_ack_timeout: 14,
        retry_count: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        remote_access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path: local.path_to(qpn, peer_config.mac, peer_config.ip),
        selective_retransmission: false,
    }
}

impl Bench {
    fn new(mtu: Mtu, udp: bool) -> Self {
        let (wire, link) = if udp {
            let (nic_a, nic_b) = udp_pair();
            let port = nic_a.local_addr().port();
            let wire = Wire::Udp {
                nic_a,
                nic_b,
                refused: 0,
            };
            (wire, LinkMode::Udp { port })
        } else {
            let wire = Wire::InProcess {
                wire: VecDeque::new(),
                pool: Vec::new(),
            };
            (wire, LinkMode::Ethernet)
        };
        let (mut a, conn_a) = endpoint(1, 8 << 20, link);
        let (mut b, conn_b) = endpoint(2, 8 << 20, link);
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
            wire,
        }
    }

    /// Moves frames both ways until both sides are quiet.
    fn pump(&mut self) {
        if matches!(self.wire, Wire::Udp { .. }) {
            return self.pump_udp();
        }
        let Wire::InProcess { wire, pool } = &mut self.wire else {
            return;
        };
        loop {
            let now = self.start.elapsed().as_nanos() as u64;
            let mut moved = false;
            for from_a in [true, false] {
                let (sender, receiver) = if from_a {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
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
                while let Some(frame) = wire.pop_front() {
                    moved = true;
                    receiver.receive(now, &frame);
                    pool.push(frame);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// [`Bench::pump`] over the sockets: each side's datagrams are sent,
    /// then the peer's socket drained, until a round moves nothing.
    fn pump_udp(&mut self) {
        let Wire::Udp {
            nic_a,
            nic_b,
            refused,
        } = &mut self.wire
        else {
            return;
        };
        loop {
            let now = self.start.elapsed().as_nanos() as u64;
            let mut moved = false;
            for from_a in [true, false] {
                let (sender, receiver, tx, rx) = if from_a {
                    (&mut self.a, &mut self.b, &mut *nic_a, &mut *nic_b)
                } else {
                    (&mut self.b, &mut self.a, &mut *nic_b, &mut *nic_a)
                };
                let mut in_burst = 0;
                sender.poll_datagrams(
                    now,
                    &mut |to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                        let mut pieces: [&[u8]; 16] = [&[]; 16];
                        pieces[..payload.len()].copy_from_slice(payload);
                        pieces[payload.len()] = trailer;
                        let sent =
                            tx.transmit(SocketAddr::V4(to), header, &pieces[..=payload.len()]);
                        match sent {
                            Ok(()) => {}
                            Err(NicError::Busy) => *refused += 1,
                            Err(error) => panic!("transmit: {error}"),
                        }
                        // A poll sends up to 64 packets; 64 of 4 KiB overflow
                        // the peer's socket buffer, so drain it as we go.
                        in_burst += 1;
                        if in_burst == BURST {
                            in_burst = 0;
                            drain(rx, receiver, now);
                        }
                    },
                );
                moved |= drain(rx, receiver, now);
            }
            if !moved {
                return;
            }
        }
    }

    /// What the transport had to resend, and what the socket refused.
    fn losses(&self) -> String {
        let refused = match self.wire {
            Wire::Udp { refused, .. } => refused,
            Wire::InProcess { .. } => 0,
        };
        let (a, b) = (self.a.counters(), self.b.counters());
        format!(
            "retransmissions {}, timeouts {}, refused {}",
            a.retransmissions + b.retransmissions,
            a.timeouts + b.timeouts,
            refused
        )
    }
}

fn region(hca: &mut BenchHca, len: u32) -> MemoryRegion {
    let handle = hca.alloc(len, 4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    hca.reg_mr(handle, access).unwrap()
}

/// RDMA WRITE of `size`-byte messages for `duration`, in process or over
/// UDP; returns bytes/s and the losses.
fn write_rate(mtu: Mtu, size: u32, duration: Duration, udp: bool) -> (f64, String) {
    let mut bench = Bench::new(mtu, udp);
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
    let rate = done as f64 * f64::from(size) / start.elapsed().as_secs_f64();
    (rate, bench.losses())
}

/// SEND of `size`-byte messages for `duration`, in process or over UDP;
/// returns messages/s and the losses.
fn send_rate(size: u32, duration: Duration, udp: bool) -> (f64, String) {
    let mut bench = Bench::new(Mtu::Mtu1024, udp);
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
    (done as f64 / start.elapsed().as_secs_f64(), bench.losses())
}

/// Hands every datagram waiting on `nic` to `hca`; returns whether there
/// was any.
fn drain(nic: &mut UdpNic, hca: &mut BenchHca, now: u64) -> bool {
    let mut any = false;
    while nic
        .receive(|datagram, from| hca.receive_datagram(now, from, datagram))
        .expect("receive")
        .is_some()
    {
        any = true;
    }
    any
}

/// Raw UDP loopback: `size`-byte datagrams from 127.0.0.1 to 127.0.0.2 with
/// plain `send_to`/`recv_from`, in bursts of `BURST`, one thread (as the
/// Brick measurement). Returns (bytes/s, datagrams/s) received, and how
/// many of the datagrams sent were lost.
fn raw_udp_rate(size: usize, duration: Duration) -> (f64, f64, f64) {
    let (a, b) = loop {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if let Ok(b) = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 2], port))) {
            break (a, b);
        }
    };
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let to = b.local_addr().unwrap();
    let datagram = vec![0x5au8; size];
    let mut buffer = vec![0u8; 65536];
    let (mut sent, mut received, mut bytes) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < duration {
        for _ in 0..BURST {
            if a.send_to(std::hint::black_box(&datagram), to).is_ok() {
                sent += 1;
            }
        }
        while let Ok((len, _)) = b.recv_from(&mut buffer) {
            received += 1;
            bytes += len as u64;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let lost = 1.0 - received as f64 / sent.max(1) as f64;
    (bytes as f64 / seconds, received as f64 / seconds, lost)
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
    println!("# in process: memcpy, ICRC, two HCAs back to back");
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
        let (write, _) = write_rate(mtu, 64 << 10, duration, false);
        println!(
            "RDMA WRITE 64 KiB, MTU {:4}:  {:8.2} GiB/s   = {:.3} x memcpy",
            mtu.bytes().unwrap_or(0),
            write / gib,
            write / copy_64k
        );
    }
    let (sends, _) = send_rate(64, duration, false);
    println!(
        "SEND 64 B, MTU 1024:          {:8.3} M msgs/s  = {:.4} x memcpy of 64 B",
        sends / 1e6,
        sends / copy_64b
    );

    println!("# UDP loopback (127.0.0.1 -> 127.0.0.2), one thread");
    // The Brick datagram of a full packet: BTH 12 + MTU + ICRC 4 (a WRITE's
    // first packet also has a RETH; 1040 B stands for them all).
    let mut raw = Vec::new();
    for (mtu, datagram) in [(Mtu::Mtu1024, 12 + 1024 + 4), (Mtu::Mtu4096, 12 + 4096 + 4)] {
        let (bytes, per_second, lost) = raw_udp_rate(datagram, duration);
        println!(
            "raw UDP {datagram:4} B datagrams:   {:8.3} GiB/s   ({:.3} M/s, {:.1}% lost)",
            bytes / gib,
            per_second / 1e6,
            lost * 100.0
        );
        raw.push((mtu, bytes));
    }
    let (_, raw_64, lost) = raw_udp_rate(64, duration);
    println!(
        "raw UDP   64 B datagrams:     {:8.3} M/s      ({:.1}% lost)",
        raw_64 / 1e6,
        lost * 100.0
    );
    for (mtu, raw_bytes) in raw {
        let (write, losses) = write_rate(mtu, 64 << 10, duration, true);
        println!(
            "RDMA WRITE 64 KiB, MTU {:4}:  {:8.3} GiB/s   = {:.3} x raw UDP of {} B  ({losses})",
            mtu.bytes().unwrap_or(0),
            write / gib,
            write / raw_bytes,
            12 + mtu.bytes().unwrap_or(0) + 4,
        );
    }
    let (sends, losses) = send_rate(64, duration, true);
    println!(
        "SEND 64 B, MTU 1024:          {:8.3} M msgs/s  = {:.3} x raw UDP of 64 B  ({losses})",
        sends / 1e6,
        sends / raw_64
    );
}
