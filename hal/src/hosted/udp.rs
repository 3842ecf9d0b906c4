//! `UdpNic`: RoCEv2 over a host UDP socket (the kernel does IP and UDP).
//!
//! The socket is bound to `ADDR:4791` (the RoCEv2 port, configurable for
//! tests) and exchanges datagrams whose payload is the IB part of a RoCEv2
//! packet: BTH, extension headers, payload, pad, ICRC. It implements
//! [`DatagramNic`] rather than [`Nic`](crate::Nic): see the `nic` module for
//! why Ethernet is not faked.
//!
//! Limits of this mode, for the `roce` glue: the ICRC covers the IPv4
//! header including the Identification field, which the kernel chooses and
//! a UDP socket does not reveal, so the ICRC of received packets cannot be
//! recomputed exactly and a Linux rxe peer's cannot be matched. The mode is
//! for Brick-to-Brick links (initiator and target on one host, say
//! 127.0.0.1 and 127.0.0.2), whose ends agree on a canonical IP header in
//! the ICRC.
//!
//! Batching, so a burst costs one system call, not one per packet:
//!
//! * Receive takes up to [`BATCH`] receives with one recvmmsg(2) into a
//!   ring of slots allocated at bind time and hands them out one datagram
//!   per [`DatagramNic::receive`]; the socket is read again when the ring
//!   is empty. A batch that did not fill the ring drained the socket: the
//!   call after its last datagram answers "nothing" without a system call
//!   (the end of the burst), and the one after that reads again. The
//!   socket asks for UDP receive offload (`UDP_GRO`): the kernel may hand
//!   a run of equal-sized datagrams from one sender — a GSO send of the
//!   peer — up in one piece, one pass up its stack for the run, with the
//!   datagram size beside it; each slot is then [`GRO_SLOT_LEN`] (64 KiB,
//!   the largest such run) and a coalesced receive is cut back into its
//!   datagrams, handed out in order before the socket is read again
//!   ([`UdpStats::coalesced_in`] counts them; [`UdpNic::without_gro`]
//!   turns it off, and a kernel that refuses it, before Linux 5.0, runs
//!   without). A datagram longer than the MTU's (the slot length without
//!   GRO, as a NIC's RX buffer holds one MTU frame) is dropped and counted
//!   ([`UdpStats::oversized_in`]) — each one alone, also inside a
//!   coalesced receive, whatever segment size the kernel reports.
//! * [`UdpNic::queue`] copies a datagram into a TX slot (the engine's
//!   slices are borrowed for the call only); [`UdpNic::flush`] sends every
//!   queued datagram with one sendmmsg(2). Runs of datagrams to one peer
//!   whose sizes are equal (the middle packets of an RDMA WRITE or READ
//!   response), the last possibly shorter, go as one UDP GSO send
//!   (`UDP_SEGMENT`): one pass down the kernel's stack for the run. A
//!   kernel or device that refuses GSO turns it off for the socket.
//! * [`DatagramNic::transmit`] sends at once with sendmsg(2), one iovec
//!   per slice (no copy), after the queue.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};

use super::os_error;
use super::sys::{self, Outgoing, ReceiveScratch, Received, MAX_BATCH, MAX_GSO_SEGMENTS};
use crate::{DatagramNic, NicError};

/// The RoCEv2 UDP destination port.
pub const ROCE_V2_PORT: u16 = 4791;
/// Largest UDP payload (IPv4).
const MAX_DATAGRAM_LEN: usize = 65507;
/// Payload slices sent per datagram, besides the header.
const MAX_IOVECS: usize = 16;
/// Socket buffer asked for in each direction: a burst of a queue depth of
/// 128 KiB IOs (4 MiB) must not overflow the receive buffer, or the
/// transport's retransmission timer, not the link, sets the pace.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Datagrams per receive batch, and queued for one flush.
pub const BATCH: usize = MAX_BATCH;
/// Default IP MTU.
const DEFAULT_MTU: usize = 1500;
/// Smallest slot: a 576-byte IP MTU's datagram, rounded up.
const MIN_SLOT_LEN: usize = 576;
/// Bytes per receive slot with UDP GRO: the largest run of datagrams the
/// kernel coalesces into one receive (64 KiB, a GSO packet's limit).
pub const GRO_SLOT_LEN: usize = 64 << 10;

/// What the NIC did, for tests and statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams received and handed out.
    pub datagrams_in: u64,
    /// recvmmsg calls that returned datagrams.
    pub receive_batches: u64,
    /// Datagrams dropped on receive: longer than the MTU's datagram.
    pub oversized_in: u64,
    /// Receives that held more than one datagram (coalesced by UDP GRO).
    pub coalesced_in: u64,
    /// Datagrams the kernel took.
    pub datagrams_out: u64,
    /// sendmmsg / sendmsg calls that sent something.
    pub send_calls: u64,
    /// Runs of datagrams sent as one GSO send.
    pub gso_runs: u64,
    /// Datagrams dropped on transmit: refused by the socket, or the queue
    /// full while the socket would block.
    pub dropped_out: u64,
}

/// A queued datagram: where to, and its length in its slot.
#[derive(Clone, Copy, Debug)]
struct Queued {
    to: SocketAddr,
    len: usize,
}

/// A UDP socket carrying RoCEv2 payloads; see the module docs.
pub struct UdpNic {
    socket: UdpSocket,
    local: SocketAddr,
    mtu: usize,
    /// The slots and their state, boxed so that a link stays small.
    ring: Box<Ring>,
}

/// The receive and transmit slots of a [`UdpNic`].
struct Ring {
    /// Bytes per TX slot, and the longest datagram received: the largest
    /// datagram of the MTU.
    slot_len: usize,
    /// Bytes per RX slot: `slot_len`, or [`GRO_SLOT_LEN`] with GRO.
    rx_slot_len: usize,
    /// [`BATCH`] receive slots.
    rx: Box<[u8]>,
    rx_meta: Box<[Received]>,
    /// The senders' addresses and control messages of a receive batch.
    rx_scratch: Box<ReceiveScratch>,
    /// The next slot to hand out, and how many the last batch filled.
    rx_next: usize,
    rx_count: usize,
    /// Bytes of slot `rx_next` already handed out (a coalesced receive
    /// leaves datagram by datagram).
    rx_offset: usize,
    /// The last batch did not fill the ring: the socket was empty then,
    /// so the next empty-ring call answers "nothing" without reading.
    rx_drained: bool,
    /// [`BATCH`] transmit slots; the first `tx_count` are queued.
    tx: Box<[u8]>,
    tx_meta: Box<[Option<Queued>]>,
    tx_count: usize,
    /// UDP GSO is used (until the kernel refuses it).
    gso: bool,
    /// The socket has UDP GRO on (the RX slots are [`GRO_SLOT_LEN`]).
    gro: bool,
    stats: UdpStats,
}

impl Ring {
    fn new(slot_len: usize, gso: bool, gro: bool) -> Self {
        let rx_slot_len = if gro {
            GRO_SLOT_LEN.max(slot_len)
        } else {
            slot_len
        };
        Self {
            slot_len,
            rx_slot_len,
            rx: vec![0; BATCH * rx_slot_len].into_boxed_slice(),
            rx_meta: vec![Received::default(); BATCH].into_boxed_slice(),
            rx_scratch: Box::new(ReceiveScratch::new()),
            rx_next: 0,
            rx_count: 0,
            rx_offset: 0,
            rx_drained: false,
            tx: vec![0; BATCH * slot_len].into_boxed_slice(),
            tx_meta: vec![None; BATCH].into_boxed_slice(),
            tx_count: 0,
            gso,
            gro,
            stats: UdpStats::default(),
        }
    }

    /// The next datagram of the receive at `rx_next` (which must be one
    /// the last batch filled): its range in `rx` and its sender, or `None`
    /// when it is dropped (longer than the MTU's datagram, cut short by
    /// the slot, or from an unknown address family), counted. Moves on.
    fn take_datagram(&mut self) -> Option<(std::ops::Range<usize>, SocketAddr)> {
        let index = self.rx_next;
        let meta = self.rx_meta[index];
        let offset = self.rx_offset;
        let remaining = meta.len.saturating_sub(offset);
        // A receive without a segment size is one datagram; with one, the
        // kernel cut it into datagrams of that size, the last possibly
        // shorter (a size of 0 is no size).
        let len = meta
            .segment
            .filter(|&size| size > 0)
            .map_or(remaining, |size| size.min(remaining));
        let last = len == remaining;
        if last {
            self.rx_next += 1;
            self.rx_offset = 0;
        } else {
            self.rx_offset += len;
        }
        // The slot's end cut the last datagram (or what followed it) off.
        let intact = !(last && meta.truncated);
        match meta.from {
            Some(from) if intact && len <= self.slot_len => {
                let start = index * self.rx_slot_len + offset;
                Some((start..start + len, from))
            }
            _ => {
                self.stats.oversized_in += 1;
                None
            }
        }
    }
}

/// The slot length for an IP MTU: the datagram it allows, rounded up to
/// a cache line.
fn slot_len_for(mtu: usize) -> usize {
    mtu.clamp(MIN_SLOT_LEN, MAX_DATAGRAM_LEN)
        .next_multiple_of(64)
}

impl UdpNic {
    /// Binds a non-blocking socket to `addr` (normally port
    /// [`ROCE_V2_PORT`]; port 0 picks a free one) with
    /// [`SOCKET_BUFFER_BYTES`] of buffer each way (as much as the system
    /// allows: `net.core.rmem_max` caps it unless we are root). The IP MTU
    /// defaults to 1500.
    ///
    /// # Errors
    ///
    /// The bind or setsockopt error.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        sys::set_socket_buffers(socket.as_fd(), SOCKET_BUFFER_BYTES)?;
        let local = socket.local_addr()?;
        // A kernel without UDP GRO (before 5.0) delivers datagram by
        // datagram: run like that.
        let gro = sys::enable_udp_gro(socket.as_fd()).is_ok();
        Ok(Self {
            socket,
            local,
            mtu: DEFAULT_MTU,
            ring: Box::new(Ring::new(slot_len_for(DEFAULT_MTU), true, gro)),
        })
    }

    /// Sets the IP MTU reported by [`DatagramNic::mtu`]; the slots grow or
    /// shrink to its datagram (call before traffic: what is buffered is
    /// dropped).
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu;
        let slot_len = slot_len_for(mtu);
        if slot_len != self.ring.slot_len {
            self.ring = Box::new(Ring::new(slot_len, self.ring.gso, self.ring.gro));
        }
        self
    }

    /// The effective receive and send buffer sizes in bytes, as the kernel
    /// reports them.
    ///
    /// # Errors
    ///
    /// The getsockopt error.
    pub fn buffer_sizes(&self) -> io::Result<(usize, usize)> {
        sys::socket_buffers(self.socket.as_fd())
    }

    /// The descriptor to poll for readability.
    pub fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// What the NIC did so far.
    pub fn stats(&self) -> UdpStats {
        self.ring.stats
    }

    /// Turns UDP GSO off (on by default), e.g. to measure what it saves.
    pub fn without_gso(mut self) -> Self {
        self.ring.gso = false;
        self
    }

    /// Turns UDP GRO off (on by default where the kernel has it), e.g. to
    /// measure what it saves: every receive is then one datagram, into
    /// MTU-sized slots (call before traffic: what is buffered is dropped).
    pub fn without_gro(mut self) -> Self {
        if self.ring.gro && sys::disable_udp_gro(self.socket.as_fd()).is_ok() {
            self.ring = Box::new(Ring::new(self.ring.slot_len, self.ring.gso, false));
        }
        self
    }

    /// Whether the kernel may coalesce received datagrams (UDP GRO is on).
    pub fn coalesces(&self) -> bool {
        self.ring.gro
    }

    /// Whether queued datagrams wait for [`UdpNic::flush`].
    pub fn has_queued(&self) -> bool {
        self.ring.tx_count > 0
    }

    /// Queues one datagram to `to`: `header` then the `payload` slices,
    /// copied into a TX slot. A full queue is flushed first. A datagram
    /// longer than a slot is sent at once, after the queue.
    ///
    /// # Errors
    ///
    /// `FrameTooLong` (over [`MAX_IOVECS`] slices or the UDP maximum),
    /// `Busy` (the queue full and the socket would block), and a sendmsg
    /// error of a datagram sent at once.
    pub fn queue(
        &mut self,
        to: SocketAddr,
        header: &[u8],
        payload: &[&[u8]],
    ) -> Result<(), NicError> {
        let len = datagram_len(header, payload)?;
        if len > self.ring.slot_len {
            self.flush()?;
            return self.send_now(to, header, payload);
        }
        if self.ring.tx_count == BATCH {
            // Flushed as far as the socket takes it; still full: drop.
            let _ = self.flush();
            if self.ring.tx_count == BATCH {
                self.ring.stats.dropped_out += 1;
                return Err(NicError::Busy);
            }
        }
        let slot = &mut self.ring.tx[self.ring.tx_count * self.ring.slot_len..][..len];
        let mut at = 0;
        for piece in [header].into_iter().chain(payload.iter().copied()) {
            slot[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        self.ring.tx_meta[self.ring.tx_count] = Some(Queued { to, len });
        self.ring.tx_count += 1;
        Ok(())
    }

    /// Sends every queued datagram, as few system calls as the socket
    /// allows (one sendmmsg for the whole queue, GSO runs inside it).
    /// Datagrams the socket refuses are dropped and counted; those it
    /// would block on stay queued.
    ///
    /// # Errors
    ///
    /// `Busy` when the socket would block with datagrams still queued.
    pub fn flush(&mut self) -> Result<(), NicError> {
        let mut start = 0;
        while start < self.ring.tx_count {
            let mut runs = [(0usize, 0usize, 0usize); BATCH];
            let run_count = self.plan_runs(start, &mut runs);
            if run_count == 0 {
                break;
            }
            // One iovec per queued datagram from `start`, one message per
            // run: only the entries this send uses are filled.
            let queued = self.ring.tx_count - start;
            let mut iovecs = [IoSlice::new(&[]); BATCH];
            for ((iovec, meta), slot) in iovecs
                .iter_mut()
                .zip(&self.ring.tx_meta[start..self.ring.tx_count])
                .zip(self.ring.tx[start * self.ring.slot_len..].chunks(self.ring.slot_len))
                .take(queued)
            {
                let len = meta.map_or(0, |queued| queued.len);
                *iovec = IoSlice::new(&slot[..len.min(slot.len())]);
            }
            let mut outgoing: heapless::Vec<Outgoing<'_>, BATCH> = heapless::Vec::new();
            for &(first, count, segment) in &runs[..run_count] {
                let _ = outgoing.push(Outgoing {
                    to: self.ring.tx_meta[first].map_or(self.local, |queued| queued.to),
                    buffers: &iovecs[first - start..first - start + count],
                    segment: (count > 1).then(|| u16::try_from(segment).unwrap_or(u16::MAX)),
                });
            }
            match sys::send_batch(self.socket.as_fd(), &outgoing) {
                Ok(sent) => {
                    self.ring.stats.send_calls += 1;
                    for &(_, count, _) in &runs[..sent.min(run_count)] {
                        start += count;
                        self.ring.stats.datagrams_out += count as u64;
                        self.ring.stats.gso_runs += u64::from(count > 1);
                    }
                }
                Err(error) if is_transient(&error) => break,
                Err(error) => {
                    let (_, count, _) = runs[0];
                    if count > 1 && self.ring.gso && refuses_gso(&error) {
                        self.ring.gso = false;
                        continue;
                    }
                    // The first message is the one refused: drop it.
                    start += count;
                    self.ring.stats.dropped_out += count as u64;
                }
            }
        }
        self.ring.tx.copy_within(
            start * self.ring.slot_len..self.ring.tx_count * self.ring.slot_len,
            0,
        );
        self.ring.tx_meta.copy_within(start..self.ring.tx_count, 0);
        self.ring.tx_count -= start;
        if self.ring.tx_count > 0 {
            Err(NicError::Busy)
        } else {
            Ok(())
        }
    }

    /// Splits the queue from `start` into sends: `(first, count, size)`
    /// per run of `count` datagrams to one peer, all `size` bytes but the
    /// last (which may be shorter). Returns the number of runs.
    fn plan_runs(&self, start: usize, runs: &mut [(usize, usize, usize); BATCH]) -> usize {
        let mut run_count = 0;
        let mut closed = true;
        let mut total = 0;
        for index in start..self.ring.tx_count {
            let Some(queued) = self.ring.tx_meta[index] else {
                continue;
            };
            if run_count > 0 && !closed {
                let (first, count, size) = &mut runs[run_count - 1];
                let same_peer = self.ring.tx_meta[*first].is_some_and(|q| q.to == queued.to);
                if self.ring.gso
                    && same_peer
                    && queued.len <= *size
                    && *count < MAX_GSO_SEGMENTS
                    && total + queued.len <= MAX_DATAGRAM_LEN
                {
                    *count += 1;
                    total += queued.len;
                    closed = queued.len < *size;
                    continue;
                }
            }
            runs[run_count] = (index, 1, queued.len);
            run_count += 1;
            total = queued.len;
            closed = false;
        }
        run_count
    }

    /// One datagram now, with sendmsg (no copy).
    fn send_now(
        &mut self,
        to: SocketAddr,
        header: &[u8],
        payload: &[&[u8]],
    ) -> Result<(), NicError> {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS + 1];
        slices[0] = IoSlice::new(header);
        for (slot, piece) in slices[1..].iter_mut().zip(payload) {
            *slot = IoSlice::new(piece);
        }
        match sys::send_to_vectored(self.socket.as_fd(), &to, &slices[..1 + payload.len()]) {
            Ok(_) => {
                self.ring.stats.send_calls += 1;
                self.ring.stats.datagrams_out += 1;
                Ok(())
            }
            Err(error) if is_transient(&error) => Err(NicError::Busy),
            Err(error) if error.raw_os_error() == Some(libc::EMSGSIZE) => {
                Err(NicError::FrameTooLong)
            }
            Err(error) => Err(os_error(&error)),
        }
    }
}

/// The length of `header` + `payload` as one datagram, or `FrameTooLong`.
fn datagram_len(header: &[u8], payload: &[&[u8]]) -> Result<usize, NicError> {
    if payload.len() > MAX_IOVECS {
        return Err(NicError::FrameTooLong);
    }
    let len = header.len() + payload.iter().map(|piece| piece.len()).sum::<usize>();
    if len > MAX_DATAGRAM_LEN {
        return Err(NicError::FrameTooLong);
    }
    Ok(len)
}

impl DatagramNic for UdpNic {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn receive<R>(
        &mut self,
        f: impl FnOnce(&[u8], SocketAddr) -> R,
    ) -> Result<Option<R>, NicError> {
        loop {
            if self.ring.rx_next == self.ring.rx_count {
                self.ring.rx_next = 0;
                self.ring.rx_count = 0;
                if std::mem::take(&mut self.ring.rx_drained) {
                    // A burst ends here; the caller's next turn (or its
                    // level-triggered poll) reads the socket again.
                    return Ok(None);
                }
                let ring = &mut *self.ring;
                let got = sys::receive_batch(
                    self.socket.as_fd(),
                    &mut ring.rx,
                    ring.rx_slot_len,
                    &mut ring.rx_meta,
                    &mut ring.rx_scratch,
                )
                .map_err(|error| os_error(&error))?;
                if got == 0 {
                    return Ok(None);
                }
                ring.rx_count = got;
                ring.rx_drained = got < BATCH;
                ring.stats.receive_batches += 1;
                ring.stats.coalesced_in += ring.rx_meta[..got]
                    .iter()
                    .filter(|meta| meta.segment.is_some_and(|size| meta.len > size))
                    .count() as u64;
            }
            let Some((range, from)) = self.ring.take_datagram() else {
                continue;
            };
            self.ring.stats.datagrams_in += 1;
            return Ok(Some(f(&self.ring.rx[range], from)));
        }
    }

    fn transmit(
        &mut self,
        to: SocketAddr,
        header: &[u8],
        payload: &[&[u8]],
    ) -> Result<(), NicError> {
        datagram_len(header, payload)?;
        self.flush()?;
        self.send_now(to, header, payload)
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Whether a send failed because the kernel or device cannot segment
/// (no checksum offload: `EIO`; a segment over the route MTU or an
/// unsupported option: `EINVAL`, `ENOPROTOOPT`).
fn refuses_gso(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
    )
}
