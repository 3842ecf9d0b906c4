//! The software HCA: registered memory, QP table, completions, frame IO.
//!
//! [`Hca`] is one RoCEv2 device with one protection domain, as the `verbs`
//! crate models it: it owns the registered-memory [`Arena`], a fixed table
//! of `Q` RC queue pairs ([`crate::qp::Qp`]) and one completion queue of `C`
//! entries, and implements [`verbs::Verbs`]. It is sans-IO like the rest of
//! the crate: frames come in through [`Hca::receive`] (parse, ICRC check,
//! address/P_Key/QPN checks, dispatch — everything else is a counted silent
//! drop, roce-v2.md §1.10 and checklist.md B) and go out through
//! [`Hca::poll`] into a [`FrameSink`]; time is passed in as `now`
//! (nanoseconds) and [`Hca::poll_at`] says when to call again.
//!
//! Connection management (IB CM / RDMA CM on QP1) is not wired in yet: the
//! CM calls of [`verbs::Verbs`] return errors (see their docs below), and QPs
//! are set up explicitly with [`Hca::create_qp`] + [`Hca::connect_qp`] (or
//! the two halves [`Hca::ready_to_receive`] / [`Hca::ready_to_send`], the
//! passive side's REP/RTU steps) using the parameters a CM exchange would
//! have negotiated (roce-v2.md §2.1). Frames for QP1 (UD, the CM's MADs) are
//! dropped as `drop_bad_opcode` until the CM module is wired in.
//!
//! QPNs start at a random per-instance base and count up, skipping 0, 1,
//! 0xFFFFFF and every QPN still in use. Nothing allocates after [`Hca::new`].

use core::net::SocketAddr;

use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, CmEvent, ConnId, ConnParams, ConnectError, KeySource,
    Lkey, Memory, MemoryHandle, MemoryRegion, PostError, RecvWr, RegError, Rkey, SendWr, Verbs,
    WorkCompletion,
};

use crate::qp::{
    CompletionQueue, ConnectQpError, Context, Counters, FrameSink, Path, Qp, QpParams, QpState,
};
use crate::types::Qpn;
use crate::wire::{parse_frame, udp, ParseError, Transport};

/// Most frames one [`Hca::poll`] call sends (over all QPs).
pub const MAX_TX_BURST: usize = 64;

/// The HCA's own addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcaConfig {
    /// Our Ethernet MAC.
    pub mac: [u8; 6],
    /// Our IPv4 address; frames to any other address are dropped.
    pub ip: [u8; 4],
}

/// Why a QP could not be created or connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpError {
    /// The QP table is full.
    TableFull,
    /// No QP with that id.
    UnknownQp,
    /// [`Qp::connect`] refused.
    Connect(ConnectQpError),
}

impl core::fmt::Display for QpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TableFull => f.write_str("queue pair table full"),
            Self::UnknownQp => f.write_str("unknown queue pair"),
            Self::Connect(error) => write!(f, "connect: {error}"),
        }
    }
}

impl core::error::Error for QpError {}

/// A software RoCEv2 HCA with `N` memory-region slots, `Q` queue pairs and a
/// completion queue of `C` entries (see the module docs).
///
/// The struct is large (QPs are inline): keep it in a `static`, a `Box` or a
/// long-lived owner rather than on a small stack.
pub struct Hca<S, K, const N: usize, const Q: usize, const C: usize = 1024> {
    arena: Arena<S, N>,
    keys: K,
    qps: [Option<Qp>; Q],
    cq: CompletionQueue<C>,
    counters: Counters,
    config: HcaConfig,
    next_qpn: u32,
    /// Where the next `poll` starts (round robin over QPs).
    next_poll: usize,
}

impl<S, K, const N: usize, const Q: usize, const C: usize> Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    /// An HCA over registered-memory `storage`, drawing keys and the QPN
    /// base from `keys` (a strong random source outside tests).
    pub fn new(storage: S, mut keys: K, config: HcaConfig) -> Self {
        let next_qpn = keys.next_u32() & 0x00ff_ffff;
        Self {
            arena: Arena::new(storage),
            keys,
            qps: core::array::from_fn(|_| None),
            cq: CompletionQueue::new(),
            counters: Counters::default(),
            config,
            next_qpn,
            next_poll: 0,
        }
    }

    /// Our addresses.
    pub fn config(&self) -> HcaConfig {
        self.config
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The registered memory.
    pub fn arena(&self) -> &Arena<S, N> {
        &self.arena
    }

    /// The registered memory, writable (CPU access through handles).
    pub fn arena_mut(&mut self) -> &mut Arena<S, N> {
        &mut self.arena
    }

    /// A path to a peer for a QP numbered `qpn`: our addresses, the peer's,
    /// rxe's per-QP UDP source port, TOS 0, TTL 64.
    pub fn path_to(&self, qpn: Qpn, peer_mac: [u8; 6], peer_ip: [u8; 4]) -> Path {
        Path {
            local_mac: self.config.mac,
            peer_mac,
            local_ip: self.config.ip,
            peer_ip,
            udp_src_port: udp::source_port_for_qpn(qpn),
            tos: 0,
            ttl: 64,
        }
    }

    /// Creates an RC QP in `Init` (receives may be posted) and returns its
    /// connection id; its QPN is [`Hca::qpn`].
    ///
    /// # Errors
    /// [`QpError::TableFull`].
    pub fn create_qp(&mut self) -> Result<ConnId, QpError> {
        let slot = self
            .qps
            .iter()
            .position(Option::is_none)
            .ok_or(QpError::TableFull)?;
        // At most Q QPNs are in use, so Q + 4 candidates always find a free one.
        let mut qpn = None;
        for _ in 0..Q + 4 {
            let candidate = self.next_qpn;
            self.next_qpn = (self.next_qpn + 1) & 0x00ff_ffff;
            let reserved = candidate <= 1 || candidate == 0x00ff_ffff;
            if !reserved && self.slot_of(ConnId(candidate)).is_none() {
                qpn = Some(candidate);
                break;
            }
        }
        let qpn = qpn.ok_or(QpError::TableFull)?;
        let mut qp = Qp::new(ConnId(qpn), Qpn::new_truncate(qpn));
        qp.init();
        self.qps[slot] = Some(qp);
        Ok(ConnId(qpn))
    }

    /// Brings QP `conn` to `Rts` with `params` (what the CM negotiated).
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn connect_qp(&mut self, conn: ConnId, params: QpParams) -> Result<(), QpError> {
        self.qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .connect(params)
            .map_err(QpError::Connect)
    }

    /// Brings QP `conn` to `Rtr` only (the passive side before sending the
    /// CM REP); [`Hca::ready_to_send`] completes the step to `Rts`.
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn ready_to_receive(&mut self, conn: ConnId, params: QpParams) -> Result<(), QpError> {
        self.qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .ready_to_receive(params)
            .map_err(QpError::Connect)
    }

    /// Moves QP `conn` from `Rtr` to `Rts`.
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn ready_to_send(&mut self, conn: ConnId) -> Result<(), QpError> {
        self.qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .ready_to_send()
            .map_err(QpError::Connect)
    }

    /// The QP number of `conn`.
    pub fn qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.qp(conn).map(Qp::qpn)
    }

    /// The QP of `conn`.
    pub fn qp(&self, conn: ConnId) -> Option<&Qp> {
        self.slot_of(conn).and_then(|slot| self.qps[slot].as_ref())
    }

    /// The state of QP `conn`.
    pub fn qp_state(&self, conn: ConnId) -> Option<QpState> {
        self.qp(conn).map(Qp::state)
    }

    fn qp_mut(&mut self, conn: ConnId) -> Option<&mut Qp> {
        let slot = self.slot_of(conn)?;
        self.qps[slot].as_mut()
    }

    fn slot_of(&self, conn: ConnId) -> Option<usize> {
        self.qps
            .iter()
            .position(|qp| qp.as_ref().is_some_and(|qp| qp.conn() == conn))
    }

    /// Handles one received Ethernet frame. Malformed frames, bad ICRCs,
    /// frames not for our IP, with a foreign P_Key, for an unknown or
    /// not-ready QPN, or not from the QP's peer are dropped silently and
    /// counted. Does bounded work (one frame).
    pub fn receive(&mut self, now: u64, frame: &[u8]) {
        self.counters.frames_in += 1;
        let parsed = match parse_frame(frame) {
            Ok(parsed) => parsed,
            Err(ParseError::BadChecksum) => {
                self.counters.drop_bad_checksum += 1;
                return;
            }
            Err(_) => {
                self.counters.drop_malformed += 1;
                return;
            }
        };
        if parsed.ip.dst_addr.octets() != self.config.ip {
            self.counters.drop_bad_address += 1;
            return;
        }
        if !parsed.bth.pkey.is_default_partition() {
            self.counters.drop_bad_pkey += 1;
            return;
        }
        if parsed.bth.opcode.transport() != Transport::Rc {
            self.counters.drop_bad_opcode += 1;
            return;
        }
        let conn = ConnId(parsed.bth.dest_qp.value());
        let Some(slot) = self.slot_of(conn) else {
            self.counters.drop_unknown_qpn += 1;
            return;
        };
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        if qp.peer_ip() != Some(parsed.ip.src_addr.octets()) {
            self.counters.drop_bad_address += 1;
            return;
        }
        let mut ctx = Context {
            arena: &mut self.arena,
            cq: &mut self.cq,
            counters: &mut self.counters,
        };
        qp.receive(now, &parsed, &mut ctx);
    }

    /// Runs every QP's timers and sends due frames through `sink`: at most
    /// [`MAX_TX_BURST`] frames per call, QPs served round robin. Returns
    /// whether any frame was sent (call again soon if so).
    pub fn poll<F: FrameSink + ?Sized>(&mut self, now: u64, sink: &mut F) -> bool {
        let mut budget = MAX_TX_BURST;
        let start = self.next_poll;
        for step in 0..Q {
            let slot = (start + step) % Q;
            let Some(qp) = self.qps[slot].as_mut() else {
                continue;
            };
            let mut ctx = Context {
                arena: &mut self.arena,
                cq: &mut self.cq,
                counters: &mut self.counters,
            };
            budget -= qp.poll(now, &mut ctx, sink, budget);
            if budget == 0 {
                self.next_poll = (slot + 1) % Q;
                break;
            }
        }
        budget < MAX_TX_BURST
    }

    /// When [`Hca::poll`] next has work: `Some(now)` if frames are waiting,
    /// the earliest timer otherwise, `None` if idle.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        self.qps
            .iter()
            .flatten()
            .filter_map(|qp| qp.poll_at(now))
            .min()
    }
}

impl<S, K, const N: usize, const Q: usize, const C: usize> Memory for Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice(handle, offset, len, f)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice_mut(handle, offset, len, f)
    }
}

/// The verbs provider. Connection management is not wired in yet (the IB CM
/// module is a separate piece of work): `listen` and `connect` return
/// [`ConnectError::AddressUnsupported`], `accept`/`reject` return
/// [`ConnectError::InvalidState`] (no QP ever awaits an answer), and
/// `poll_cm_event` returns `None`. `disconnect` moves a QP to `Err` (its work
/// requests flush), `destroy` releases it.
impl<S, K, const N: usize, const Q: usize, const C: usize> Verbs for Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        self.arena.alloc(len, align)
    }

    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        self.arena.free(buffer)
    }

    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        self.arena.register(buffer, access, &mut self.keys)
    }

    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError> {
        self.arena.rekey(lkey, &mut self.keys)
    }

    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        self.arena.deregister(lkey)
    }

    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        let slot = self.slot_of(conn).ok_or(PostError::UnknownConnection)?;
        let qp = self.qps[slot]
            .as_mut()
            .ok_or(PostError::UnknownConnection)?;
        qp.post_send(requests, &mut self.arena)
    }

    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        let slot = self.slot_of(conn).ok_or(PostError::UnknownConnection)?;
        let qp = self.qps[slot]
            .as_mut()
            .ok_or(PostError::UnknownConnection)?;
        qp.post_recv(requests, &mut self.arena)
    }

    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        let mut count = 0;
        for entry in out.iter_mut() {
            let Some(completion) = self.cq.pop() else {
                break;
            };
            *entry = completion;
            count += 1;
        }
        count
    }

    fn listen(&mut self, _port: u16) -> Result<(), ConnectError> {
        Err(ConnectError::AddressUnsupported)
    }

    fn connect(
        &mut self,
        _remote: SocketAddr,
        _params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError> {
        Err(ConnectError::AddressUnsupported)
    }

    fn accept(&mut self, conn: ConnId, _params: &ConnParams<'_>) -> Result<(), ConnectError> {
        self.slot_of(conn)
            .ok_or(ConnectError::UnknownConnection)
            .and(Err(ConnectError::InvalidState))
    }

    fn reject(&mut self, conn: ConnId, _private_data: &[u8]) -> Result<(), ConnectError> {
        self.slot_of(conn)
            .ok_or(ConnectError::UnknownConnection)
            .and(Err(ConnectError::InvalidState))
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        if let Some(qp) = self.qps[slot].as_mut() {
            let mut ctx = Context {
                arena: &mut self.arena,
                cq: &mut self.cq,
                counters: &mut self.counters,
            };
            qp.enter_error(&mut ctx, verbs::WcStatus::WrFlushErr);
        }
        Ok(())
    }

    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        if let Some(mut qp) = self.qps[slot].take() {
            qp.release(&mut self.arena);
        }
        Ok(())
    }

    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        None
    }
}
