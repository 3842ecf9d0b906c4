//! The frame relay: a host process between a VM's NIC and a target.
//!
//! Both sides connect to the relay's Unix sockets with QEMU's stream netdev
//! framing (4-byte big-endian length, then the Ethernet frame). QEMU 7.2
//! cannot reconnect a stream netdev, so the initiator VM always talks to the
//! relay, and the relay takes a new connection on either side whenever one
//! arrives (a restarted target, a rebooted image). While a side is absent,
//! frames towards it are dropped, as on an unplugged cable.
//!
//! Faults, per direction, seeded: drop, reorder (hold a frame until after
//! the next one), duplicate and corrupt frames by rate, drop every n-th
//! frame, and cut the link. By default only RoCEv2 data frames (UDP 4791,
//! BTH destination QP other than 1) are candidates, so ARP and CM traffic
//! pass; `all_frames` widens that. Every frame can be written to a pcap.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Largest frame accepted from a peer (jumbo frames plus slack).
const MAX_FRAME: usize = 65536;
/// How long a held (reordered) frame waits for a successor.
const REORDER_HOLD: Duration = Duration::from_millis(50);

/// Faults applied to one direction.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Probability of dropping a candidate frame.
    pub drop_rate: f64,
    /// Probability of holding a candidate frame behind the next one.
    pub reorder_rate: f64,
    /// Probability of sending a candidate frame twice.
    pub duplicate_rate: f64,
    /// Probability of flipping one byte past the IP header.
    pub corrupt_rate: f64,
    /// Drop candidate number n where n % every == offset (1-based count).
    pub drop_every: Option<(u64, u64)>,
    /// Only these BTH opcodes are candidates (empty: all).
    pub opcodes: Vec<u8>,
    /// Every frame is a candidate, not only RoCEv2 data.
    pub all_frames: bool,
    /// Hold every ARP frame this long before forwarding it (in order),
    /// e.g. to model a slow neighbour's ARP reply.
    pub arp_delay: Option<Duration>,
}

/// Counters for one direction.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectionStats {
    /// Frames received from the source side.
    pub frames: u64,
    /// Frames forwarded (duplicates included).
    pub forwarded: u64,
    /// Dropped by the fault rules.
    pub dropped: u64,
    /// Dropped because the link was cut or the destination absent.
    pub lost: u64,
    /// Reordered.
    pub reordered: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Corrupted.
    pub corrupted: u64,
    /// Largest frame seen, in bytes.
    pub largest: usize,
}

/// Direction index: 0 = a -> b (initiator to target), 1 = b -> a.
pub const A_TO_B: usize = 0;
/// Target to initiator.
pub const B_TO_A: usize = 1;

struct Control {
    faults: [Faults; 2],
    cut: bool,
    stats: [DirectionStats; 2],
    connected: [bool; 2],
    connections: [u64; 2],
}

/// A running relay (a thread of this process).
pub struct Relay {
    /// Socket the initiator side connects to.
    pub a: PathBuf,
    /// Socket the target side connects to.
    pub b: PathBuf,
    control: Arc<Mutex<Control>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Relay {
    /// Listens on `a` and `b` (removing stale sockets) and starts relaying.
    pub fn start(a: &Path, b: &Path, seed: u64, pcap: Option<&Path>) -> Result<Relay> {
        Relay::start_capturing(a, b, seed, pcap, MAX_FRAME)
    }

    /// As [`Relay::start`], keeping at most `snaplen` bytes of each frame
    /// in the pcap (the headers are enough to follow a long transfer).
    pub fn start_capturing(
        a: &Path,
        b: &Path,
        seed: u64,
        pcap: Option<&Path>,
        snaplen: usize,
    ) -> Result<Relay> {
        let listeners = [bind(a)?, bind(b)?];
        let control = Arc::new(Mutex::new(Control {
            faults: [Faults::default(), Faults::default()],
            cut: false,
            stats: [DirectionStats::default(); 2],
            connected: [false; 2],
            connections: [0; 2],
        }));
        let pcap = match pcap {
            Some(path) => Some(PcapWriter::create(path, snaplen)?),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            listeners,
            peers: [None, None],
            control: control.clone(),
            stop: stop.clone(),
            rng: Rng::new(seed),
            held: [None, None],
            delayed: Default::default(),
            counts: [0; 2],
            pcap,
        };
        let thread = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || worker.run())?;
        Ok(Relay {
            a: a.to_path_buf(),
            b: b.to_path_buf(),
            control,
            stop,
            thread: Some(thread),
        })
    }

    /// Sets the faults of one direction.
    pub fn set_faults(&self, direction: usize, faults: Faults) {
        self.lock().faults[direction] = faults;
    }

    /// Cuts (true) or restores (false) the link in both directions.
    pub fn set_cut(&self, cut: bool) {
        self.lock().cut = cut;
    }

    /// Counters of one direction.
    pub fn stats(&self, direction: usize) -> DirectionStats {
        self.lock().stats[direction]
    }

    /// Whether side a (0) or b (1) has a peer connected, and how many
    /// connections that side has seen.
    pub fn side(&self, side: usize) -> (bool, u64) {
        let control = self.lock();
        (control.connected[side], control.connections[side])
    }

    /// One-line summary.
    pub fn summary(&self) -> String {
        let control = self.lock();
        let [ab, ba] = control.stats;
        format!(
            "a->b {} frames, {} fwd, {} dropped, {} lost, {} reord, {} dup, {} corrupt; \
             b->a {} frames, {} fwd, {} dropped, {} lost, {} reord, {} dup, {} corrupt",
            ab.frames,
            ab.forwarded,
            ab.dropped,
            ab.lost,
            ab.reordered,
            ab.duplicated,
            ab.corrupted,
            ba.frames,
            ba.forwarded,
            ba.dropped,
            ba.lost,
            ba.reordered,
            ba.duplicated,
            ba.corrupted
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.a);
        let _ = std::fs::remove_file(&self.b);
    }
}

fn bind(path: &Path) -> Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("relay: listen on {}", path.display()))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// One connected side: a non-blocking stream with framing buffers.
struct Peer {
    stream: UnixStream,
    input: Vec<u8>,
    output: Vec<u8>,
}

struct Worker {
    listeners: [UnixListener; 2],
    peers: [Option<Peer>; 2],
    control: Arc<Mutex<Control>>,
    stop: Arc<AtomicBool>,
    rng: Rng,
    /// A frame held back for reordering, per direction, with its deadline.
    held: [Option<(Vec<u8>, Instant)>; 2],
    /// ARP frames held by `Faults::arp_delay`, per direction, in order.
    delayed: [std::collections::VecDeque<(Instant, Vec<u8>)>; 2],
    /// Candidate frames seen per direction (for drop_every).
    counts: [u64; 2],
    pcap: Option<PcapWriter>,
}

impl Worker {
    fn run(mut self) -> Result<()> {
        while !self.stop.load(Ordering::Relaxed) {
            let mut fds = Vec::with_capacity(4);
            for listener in &self.listeners {
                fds.push(libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            for peer in self.peers.iter().flatten() {
                let mut events = libc::POLLIN;
                if !peer.output.is_empty() {
                    events |= libc::POLLOUT;
                }
                fds.push(libc::pollfd {
                    fd: peer.stream.as_raw_fd(),
                    events,
                    revents: 0,
                });
            }
            let timeout = if self.delayed.iter().any(|queue| !queue.is_empty()) {
                1
            } else {
                20
            };
            // SAFETY: `fds` is a live, correctly sized array of pollfd for
            // the duration of the call.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error.into());
                }
            }
            for side in 0..2 {
                self.accept(side)?;
            }
            for side in 0..2 {
                self.service(side);
            }
            for direction in 0..2 {
                while self.delayed[direction]
                    .front()
                    .is_some_and(|(due, _)| Instant::now() >= *due)
                {
                    if let Some((_, frame)) = self.delayed[direction].pop_front() {
                        self.deliver(direction, &frame);
                    }
                }
                if let Some((_, deadline)) = &self.held[direction] {
                    if Instant::now() >= *deadline {
                        let (frame, _) = self.held[direction].take().expect("checked above");
                        self.deliver(direction, &frame);
                    }
                }
            }
            if let Some(pcap) = &mut self.pcap {
                pcap.flush_if_due();
            }
        }
        if let Some(pcap) = &mut self.pcap {
            pcap.flush();
        }
        Ok(())
    }

    fn accept(&mut self, side: usize) -> Result<()> {
        loop {
            match self.listeners[side].accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(true)?;
                    // A new peer replaces the old one: the old one is gone
                    // (QEMU never opens a second connection while alive).
                    self.peers[side] = Some(Peer {
                        stream,
                        input: Vec::new(),
                        output: Vec::new(),
                    });
                    let mut control = self.lock();
                    control.connected[side] = true;
                    control.connections[side] += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads and forwards what a side sent, flushes what it is owed.
    fn service(&mut self, side: usize) {
        let Some(peer) = self.peers[side].as_mut() else {
            return;
        };
        let mut closed = false;
        let mut buffer = [0u8; 65536];
        loop {
            match peer.stream.read(&mut buffer) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => peer.input.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut frames = Vec::new();
        let mut bad = false;
        loop {
            if peer.input.len() < 4 {
                break;
            }
            let len =
                u32::from_be_bytes([peer.input[0], peer.input[1], peer.input[2], peer.input[3]])
                    as usize;
            if len > MAX_FRAME {
                bad = true;
                break;
            }
            if peer.input.len() < 4 + len {
                break;
            }
            frames.push(peer.input[4..4 + len].to_vec());
            peer.input.drain(..4 + len);
        }
        if !peer.output.is_empty() {
            match peer.stream.write(&peer.output) {
                Ok(n) => {
                    peer.output.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => closed = true,
            }
        }
        if closed || bad {
            self.peers[side] = None;
            self.lock().connected[side] = false;
        }
        let direction = side; // frames from side a travel a -> b
        for frame in frames {
            self.forward(direction, frame);
        }
    }

    fn forward(&mut self, direction: usize, mut frame: Vec<u8>) {
        let (faults, cut) = {
            let mut control = self.lock();
            control.stats[direction].frames += 1;
            let largest = &mut control.stats[direction].largest;
            *largest = (*largest).max(frame.len());
            (control.faults[direction].clone(), control.cut)
        };
        if cut {
            self.lock().stats[direction].lost += 1;
            return;
        }
        if let Some(delay) = faults
            .arp_delay
            .filter(|_| frame.get(12..14) == Some(&[0x08, 0x06]))
        {
            self.delayed[direction].push_back((Instant::now() + delay, frame));
            return;
        }
        let candidate = faults.all_frames || is_roce_data(&frame, &faults.opcodes);
        if candidate {
            self.counts[direction] += 1;
            let n = self.counts[direction];
            if let Some((every, offset)) = faults.drop_every {
                if every > 0 && n % every == offset % every {
                    self.lock().stats[direction].dropped += 1;
                    return;
                }
            }
            if self.rng.chance(faults.drop_rate) {
                self.lock().stats[direction].dropped += 1;
                return;
            }
            if self.rng.chance(faults.corrupt_rate) && frame.len() > 34 {
                let index = 34 + self.rng.below((frame.len() - 34) as u64) as usize;
                frame[index] ^= 1 << self.rng.below(8);
                self.lock().stats[direction].corrupted += 1;
            }
            if self.rng.chance(faults.duplicate_rate) {
                self.lock().stats[direction].duplicated += 1;
                self.deliver(direction, &frame);
            }
            if self.held[direction].is_none() && self.rng.chance(faults.reorder_rate) {
                self.lock().stats[direction].reordered += 1;
                self.held[direction] = Some((frame, Instant::now() + REORDER_HOLD));
                return;
            }
        }
        self.deliver(direction, &frame);
        if let Some((held, _)) = self.held[direction].take() {
            self.deliver(direction, &held);
        }
    }

    fn deliver(&mut self, direction: usize, frame: &[u8]) {
        let destination = 1 - direction;
        if let Some(pcap) = &mut self.pcap {
            pcap.write(frame);
        }
        let Some(peer) = self.peers[destination].as_mut() else {
            self.lock().stats[direction].lost += 1;
            return;
        };
        peer.output
            .extend_from_slice(&(frame.len() as u32).to_be_bytes());
        peer.output.extend_from_slice(frame);
        // Try to send now; what does not fit waits for POLLOUT.
        match peer.stream.write(&peer.output) {
            Ok(n) => {
                peer.output.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                self.peers[destination] = None;
                self.lock().connected[destination] = false;
                return;
            }
        }
        self.lock().stats[direction].forwarded += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether a frame is RoCEv2 data (not a CM MAD on QP1) with an accepted opcode.
fn is_roce_data(frame: &[u8], opcodes: &[u8]) -> bool {
    // Ethernet(14) IPv4(ihl) UDP(8) BTH(12).
    if frame.len() < 14 + 20 + 8 + 12 || frame[12..14] != [0x08, 0x00] || frame[14 + 9] != 17 {
        return false;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let udp = 14 + ihl;
    let bth = udp + 8;
    if frame.len() < bth + 12 || frame[udp + 2..udp + 4] != 4791u16.to_be_bytes() {
        return false;
    }
    let dest_qp = u32::from_be_bytes([0, frame[bth + 5], frame[bth + 6], frame[bth + 7]]);
    dest_qp != 1 && (opcodes.is_empty() || opcodes.contains(&frame[bth]))
}

/// A small seeded xorshift generator: fault patterns repeat for a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Classic pcap (microsecond timestamps, LINKTYPE_ETHERNET).
struct PcapWriter {
    out: BufWriter<File>,
    last_flush: Instant,
    snaplen: usize,
}

impl PcapWriter {
    fn create(path: &Path, snaplen: usize) -> Result<PcapWriter> {
        let snaplen = snaplen.clamp(64, MAX_FRAME);
        let mut out = BufWriter::new(
            File::create(path).with_context(|| format!("create pcap {}", path.display()))?,
        );
        let mut header = Vec::with_capacity(24);
        header.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        header.extend_from_slice(&2u16.to_le_bytes());
        header.extend_from_slice(&4u16.to_le_bytes());
        header.extend_from_slice(&0i32.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&(snaplen as u32).to_le_bytes());
        header.extend_from_slice(&1u32.to_le_bytes());
        out.write_all(&header)?;
        Ok(PcapWriter {
            out,
            last_flush: Instant::now(),
            snaplen,
        })
    }

    fn write(&mut self, frame: &[u8]) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut record = Vec::with_capacity(16);
        record.extend_from_slice(&(now.as_secs() as u32).to_le_bytes());
        record.extend_from_slice(&now.subsec_micros().to_le_bytes());
        let kept = &frame[..frame.len().min(self.snaplen)];
        record.extend_from_slice(&(kept.len() as u32).to_le_bytes());
        record.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        let _ = self.out.write_all(&record);
        let _ = self.out.write_all(kept);
    }

    fn flush_if_due(&mut self) {
        if self.last_flush.elapsed() > Duration::from_secs(1) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let _ = self.out.flush();
        self.last_flush = Instant::now();
    }
}

/// `cargo xtask relay`: run a relay until interrupted, printing counters.
#[derive(clap::Args)]
pub struct RelayArgs {
    /// Socket for side a (the initiator VM connects here).
    #[arg(long)]
    a: PathBuf,
    /// Socket for side b (the target connects here).
    #[arg(long)]
    b: PathBuf,
    /// Write every forwarded frame to this pcap.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Seed for the fault patterns.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Drop probability (both directions).
    #[arg(long, default_value_t = 0.0)]
    drop: f64,
    /// Reorder probability (both directions).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Duplicate probability (both directions).
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Corrupt probability (both directions).
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Drop every N-th data frame a->b (`N` or `N:OFFSET`).
    #[arg(long)]
    drop_every_a2b: Option<String>,
    /// Drop every N-th data frame b->a (`N` or `N:OFFSET`).
    #[arg(long)]
    drop_every_b2a: Option<String>,
    /// Apply faults to every frame, not only RoCEv2 data.
    #[arg(long)]
    all_frames: bool,
}

fn parse_every(spec: &Option<String>) -> Result<Option<(u64, u64)>> {
    let Some(spec) = spec else { return Ok(None) };
    let (every, offset) = spec.split_once(':').unwrap_or((spec, "0"));
    let every = every
        .parse()
        .with_context(|| format!("drop-every: expected N[:OFFSET], found {spec:?}"))?;
    let offset = offset
        .parse()
        .with_context(|| format!("drop-every: expected N[:OFFSET], found {spec:?}"))?;
    Ok(Some((every, offset)))
}

pub fn run_standalone(args: RelayArgs) -> Result<()> {
    let relay = Relay::start(&args.a, &args.b, args.seed, args.pcap.as_deref())?;
    let base = Faults {
        drop_rate: args.drop,
        reorder_rate: args.reorder,
        duplicate_rate: args.duplicate,
        corrupt_rate: args.corrupt,
        all_frames: args.all_frames,
        ..Faults::default()
    };
    relay.set_faults(
        A_TO_B,
        Faults {
            drop_every: parse_every(&args.drop_every_a2b)?,
            ..base.clone()
        },
    );
    relay.set_faults(
        B_TO_A,
        Faults {
            drop_every: parse_every(&args.drop_every_b2a)?,
            ..base
        },
    );
    eprintln!(
        "relay: a={} b={} (Ctrl-C to stop)",
        args.a.display(),
        args.b.display()
    );
    loop {
        std::thread::sleep(Duration::from_secs(5));
        eprintln!("relay: {}", relay.summary());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dest_qp: u32, opcode: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len.max(14 + 20 + 8 + 12 + 4)];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[34 + 2..34 + 4].copy_from_slice(&4791u16.to_be_bytes());
        f[42] = opcode;
        f[42 + 5..42 + 8].copy_from_slice(&dest_qp.to_be_bytes()[1..]);
        f
    }

    fn send(stream: &mut UnixStream, payload: &[u8]) {
        stream
            .write_all(&(payload.len() as u32).to_be_bytes())
            .unwrap();
        stream.write_all(payload).unwrap();
    }

    fn recv(stream: &mut UnixStream) -> Option<Vec<u8>> {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).ok()?;
        let mut data = vec![0u8; u32::from_be_bytes(len) as usize];
        stream.read_exact(&mut data).ok()?;
        Some(data)
    }

    fn connect(path: &Path) -> UnixStream {
        let stream = UnixStream::connect(path).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        stream
    }

    fn wait_connected(relay: &Relay, side: usize, connections: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while relay.side(side) != (true, connections) {
            assert!(Instant::now() < deadline, "relay never saw the connection");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn forwards_both_ways_and_survives_reconnect() {
        let dir = crate::paths::scratch("relay-test");
        let relay =
            Relay::start(&dir.join("a"), &dir.join("b"), 7, Some(&dir.join("x.pcap"))).unwrap();
        let mut a = connect(&relay.a);
        let mut b = connect(&relay.b);
        wait_connected(&relay, 0, 1);
        wait_connected(&relay, 1, 1);
        let f = frame(0x11, 4, 1100);
        send(&mut a, &f);
        assert_eq!(recv(&mut b).unwrap(), f);
        send(&mut b, &f[..60]);
        assert_eq!(recv(&mut a).unwrap(), &f[..60]);
        // The target goes away and comes back: the initiator's link stays.
        drop(b);
        let mut b = connect(&relay.b);
        wait_connected(&relay, 1, 2);
        send(&mut a, &f);
        assert_eq!(recv(&mut b).unwrap(), f);
        // Cut: nothing passes; restored: traffic flows again.
        relay.set_cut(true);
        send(&mut a, &f);
        assert!(recv(&mut b).is_none());
        relay.set_cut(false);
        send(&mut a, &f);
        assert_eq!(recv(&mut b).unwrap(), f);
        assert_eq!(relay.stats(A_TO_B).lost, 1);
        drop(relay);
        let pcap = std::fs::read(dir.join("x.pcap")).unwrap();
        // Global header + 4 records (the cut frame is not forwarded).
        assert_eq!(pcap.len(), 24 + 4 * 16 + 3 * 1100 + 60);
    }

    #[test]
    fn drop_every_spares_cm_and_counts_only_data() {
        let dir = crate::paths::scratch("relay-test");
        let relay = Relay::start(&dir.join("a"), &dir.join("b"), 7, None).unwrap();
        relay.set_faults(
            A_TO_B,
            Faults {
                drop_every: Some((3, 0)),
                ..Faults::default()
            },
        );
        let mut a = connect(&relay.a);
        let mut b = connect(&relay.b);
        wait_connected(&relay, 0, 1);
        wait_connected(&relay, 1, 1);
        for psn in 0..6u8 {
            let mut f = frame(0x11, 4, 80);
            f[60] = psn;
            send(&mut a, &f);
            send(&mut a, &frame(1, 0x64, 80)); // CM MAD on QP1: never dropped
        }
        let mut data = Vec::new();
        let mut cm = 0;
        while let Some(f) = recv(&mut b) {
            if f[42] == 0x64 {
                cm += 1;
            } else {
                data.push(f[60]);
            }
        }
        assert_eq!(cm, 6);
        assert_eq!(data, vec![0, 1, 3, 4]);
        assert_eq!(relay.stats(A_TO_B).dropped, 2);
    }

    #[test]
    fn seeded_faults_repeat() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..1000).filter(|_| rng.chance(0.1)).count()
        };
        assert_eq!(run(3), run(3));
        let hits = run(3);
        assert!((50..150).contains(&hits), "10% of 1000 draws gave {hits}");
    }
}
