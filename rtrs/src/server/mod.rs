//! The RTRS server: sessions of paths of connections, chunks, IO dispatch.
//!
//! Sans-IO over the fabric seam ([`verbs::Verbs`], ARCHITECTURE.md §4): the owner
//! of the run loop calls [`Server::poll`] with the time, reads
//! [`Server::next_event`] and answers every [`Event::Io`] with
//! [`Server::complete_io`]. Behaviour follows `docs/protocol/rtrs.md`: §2
//! connection establishment, §3 INFO_REQ/INFO_RSP, §4 the IO path (§4.6
//! response pairing, §4.9 NEW_RKEY/always_invalidate), §5 heartbeats, §6
//! failure and reconnect, §7 multipath, with the extra checks of `rnbd.md`
//! §8.2.
//!
//! # Reading order
//!
//! This file holds the [`Server`], its public calls and `Lent` (the
//! server with the ports of one call, on which every internal step runs);
//! the rest is one file per concern: [`config`](ServerConfig) and the
//! public `types` (ids, events, counters), `poll` (the poll loop, the
//! dispatch of completions, the consumer's answers), `connect` (CON_REQ:
//! half-open paths, their limits, reconnects), `admission`
//! ([`Admission`]: who may carry a session, decided at INFO_REQ), `info`
//! (INFO_REQ/INFO_RSP), `pool` (registered memory), `io` (requests),
//! `respond` (their response chains), `close` (teardown), `timers`
//! (heartbeats, deadlines, parked work) and `table` (the fixed tables and
//! the per-chunk [`IoState`]). Heartbeats and work request ids are shared
//! with the client (`crate::link`).
//!
//! # Admission
//!
//! A CON_REQ proves nothing (its uuids travel in clear), so a connecting
//! ("half-open") path holds only its connections and its INFO_REQ receive
//! buffer, and no session slot. Half-open paths are bounded: at most
//! [`ServerConfig::max_half_open`] in all (a new one evicts the oldest) and
//! [`ServerConfig::max_half_open_per_source`] per client address (a new one
//! is refused with ENOMEM), each closed at
//! [`ServerConfig::setup_timeout_ns`] (5 s). At INFO_REQ the server checks
//! the session name and asks the [`Admission`] passed to [`Server::poll`]
//! about this path (every path, with its own address); only an admitted
//! path gets its session slot, its name and its chunk pool. A refused path
//! is closed, reported as [`Event::PathRefused`], and holds nothing
//! afterwards (module `admission`).
//!
//! # Ports
//!
//! One server serves one or more *ports*: verbs providers of the same type
//! `V`, one per interface (one software HCA with its own MAC and IP each).
//! The server does not own them: like a smoltcp `Interface` polled with its
//! `Device`, it is built without ports ([`Server::new`]) and every call
//! that touches the fabric is lent them as `&mut [V]` ([`Server::start`],
//! [`Server::poll`], [`Server::complete_io`], [`Server::close_path`],
//! [`Server::close_all`]), the same ports in the same order each time, so
//! the owner of the run loop (the engine) keeps its HCAs and reads an IO's
//! memory from them directly. They form one RTRS server, as Linux's
//! rtrs-srv is one server over every RDMA device: [`Server::start`] listens
//! on [`ServerConfig::port`] on each port, and a CON_REQ finds its session
//! by `paths_uuid` whatever port it came in on (rtrs.md §2.4 step 4), so
//! the paths of a multipath client that reach the target over different
//! interfaces form one session.
//!
//! * A path lives on the port its cid 0 ... cid_num-1 come in on: every
//!   connection of a path must arrive on the same port; one for a path
//!   being set up that arrives on another port is refused with ECONNRESET
//!   ([`ConnectRefusal::ConnectionMismatch`]), like any inconsistent
//!   CON_REQ. A reconnect (newer `recon_cnt`) may come on another port: the
//!   stale path is replaced and the new one lives on the new port.
//! * Connection ids are per provider, so connections are looked up by
//!   (port, `ConnId`), and a work completion counts only on the port of the
//!   path its work request id names.
//! * A path's chunk pool and control buffers are allocated from, registered
//!   on and freed on its port. [`Event::PathUp`] and [`Event::Io`] carry the
//!   `port`: the consumer reads the header and data of an IO from its own
//!   `ports[port]`; [`Server::path_port`] answers for a live path.
//! * Heartbeats, close deadlines, [`Server::close_path`],
//!   [`Server::close_all`], the stats and [`Server::usage`] cover every
//!   port.
//!
//! # Memory
//!
//! All tables (sessions, paths, connections, the per-chunk IO table, the
//! event queue) are allocated once in [`Server::new`] from the
//! [`ServerConfig`] capacities (they do not grow with the port count);
//! nothing allocates afterwards. Registered memory comes from the pool of
//! the path's port ([`Verbs::alloc`]): the INFO_REQ receive buffer when a
//! path is created, and once its INFO_REQ is admitted its chunk pool
//! (`queue_depth` buffers of `chunk_size` bytes, each registered on its own
//! so it can be re-keyed) and the INFO_RSP buffer; all of it
//! goes back when the path is freed. Each path has its own chunk memory,
//! which removes the multipath failover hazard of rtrs.md §7.
//!
//! # State diagram
//!
//! Server: `Idle --start()--> Listening`.
//!
//! Path (one per path uuid, rtrs.md §2.4, §3.2, §6.1):
//!
//! ```text
//!            CON_REQ (new path uuid, or newer recon_cnt from the path's own
//!            address while the old path is half-open or stale: it is closed)
//!   Free ───────────────────────────────────────────► Connecting (half-open: no session,
//!                                                     │  CON_REQ cid k: accept,    no chunks)
//!                                                     │  con[k] = conn
//!                                                     │  INFO_REQ on cid 0 (all cid_num up):
//!                                                     │  admission, session, chunk pool, IO
//!                                                     ▼  receives, INFO_RSP, heartbeats
//!                                                  Connected ──► PathUp (+ SessionOpened if first)
//!                                                     │  CM error/disconnect, WC error, heartbeat
//!                                                     │  timeout, protocol violation, replaced;
//!                                                     │  refused at INFO_REQ, setup timeout,
//!                                                     ▼  evicted (from Connecting)
//!                                                   Closing ──► PathDown (+ SessionClosed if last up)
//!                                                     │  every connection disconnected + destroyed,
//!                                                     │  every IO the consumer holds answered
//!                                                     ▼
//!                                                   Free (memory back to the pool; the session
//!                                                         slot is freed with its last path)
//! ```
//!
//! Session: taken when its first path is admitted, *open* while a path is
//! up; `SessionClosed` ends it for good (a later path of the same session
//! uuid opens a new session, with a new [`SessionId`]), and the slot is free
//! once its closing paths have drained.
//!
//! In-flight IO, one per chunk of a path (a fixed table indexed by chunk id;
//! every wait is a named [`IoState`] variant):
//!
//! ```text
//!  Idle ──IO_REQ imm──► [always_invalidate] WaitingForInvalidate ──LOCAL_INV done──┐
//!    ▲          │        (or WaitingForSendQueueToInvalidate while the SQ is full) │
//!    │          ├── [always_invalidate, provider revokes at once] ─────────────────┤
//!    │          └──────────────── (no invalidate) ─────────────────────────────────┤
//!    │                                          parse the request in the chunk     ▼
//!    │        malformed (usr_len, sg_cnt, desc.len) ───────────────┐    WaitingForConsumer
//!    │                                                             │      │ complete_io()
//!    │                                                             ▼      ▼
//!    │                      WaitingForPreviousCompletion ◄──── (previous response of
//!    │                      WaitingForSendQueue          ◄──── this chunk unacked / SQ full)
//!    │                                                             │
//!    └──────── response chain posted (RDMA WRITE, SEND_WITH_INV, completion) ┘
//! ```
//!
//! # Where Brick differs from the Linux 6.1 server
//!
//! On the wire Brick matches Linux (the CONN_RSP of the captured session is
//! reproduced byte for byte). Behaviour differs where rnbd.md §8.2 says
//! Linux is weak:
//!
//! * `usr_len > offset` (#17), read `sg_cnt > 1` (#18) and a read
//!   `desc.len` outside `1..=chunk_size` or different from the room the
//!   client left (#19) are answered with EINVAL instead of a silent drop; an
//!   error answer to a NEED_INVAL read still carries the SEND_WITH_INV.
//! * A second request on a chunk that has one outstanding (#20), a chunk id
//!   `>= qd` or offset beyond the chunk (#14), a message that does not fit
//!   the chunk (#15) and an unknown message type (#16) close the path.
//! * The session and the chunk pool are made when the INFO_REQ is
//!   admitted, not at the first CON_REQ (Linux allocates 64 MiB there,
//!   before any authentication, rtrs.md §2.4 step 4); a half-open path is
//!   timed out (Linux keeps it until a CM event, §6.1) and bounded in
//!   number. A path refused at INFO_REQ, for any reason, is closed.
//! * A CON_REQ for a path uuid that is still up (or half-open) with a
//!   *newer* `recon_cnt` replaces the old path at once (rtrs.md §6.2
//!   suggests it) if it comes from the old path's client address and the
//!   old path is half-open or stale (no sign of life for a whole heartbeat
//!   interval); otherwise, and for an equal or older `recon_cnt`, it is
//!   refused with ECONNRESET as Linux does ([`ServerStats::paths_replaced`],
//!   [`ServerStats::takeovers_refused`]). The old path drains while the new
//!   one runs, so the provider's memory pool needs room for one extra path
//!   pool per reconnecting session, or the new path is refused at its
//!   INFO_REQ until the old path's memory is back.
//! * Limits from [`ServerConfig`] (sessions, paths per session, half-open
//!   paths per address, connections per path) reject the CON_REQ with
//!   ENOMEM (connections: ECONNRESET, as Linux's `cid_num > 4096`); the
//!   session and path limits are checked again, with the pool, at
//!   INFO_REQ.
//! * Every path registers chunk memory of its own (rtrs.md §7).
//! * With `always_invalidate`, a chunk's rkey is revoked when its request
//!   arrives through [`Verbs::revoke_remote`] where the provider can (the
//!   software HCA), so the request is parsed at once; Linux posts a
//!   signalled LOCAL_INV and waits for its completion (rtrs.md §4.9), as
//!   Brick does on a provider that cannot. Nothing of it is on the wire.
//!
//! A second path with the same (local, remote) IP address pair is refused
//! with EEXIST (rtrs.md §2.4 step 5); the RDMA CM port numbers are ignored,
//! since every connection has its own.
//!
//! # Bounded work
//!
//! [`Server::poll`] handles at most [`ServerConfig::cm_budget`] connection
//! events and [`ServerConfig::completion_budget`] completions per call, in
//! total over all ports (visited round robin, from a start port that
//! rotates every call, so no port starves the others), and
//! stops early while the event queue lacks room (the consumer must drain it
//! first; that back-pressure is the named wait of the event queue). It then
//! walks the path table once for heartbeat and close deadlines, and the
//! chunk table of a path only while that path has parked work (send-queue
//! room, a previous completion). [`Server::poll_at`] gives the next deadline,
//! so an idle server sleeps instead of spinning.

mod admission;
mod close;
mod config;
mod connect;
mod info;
mod io;
mod poll;
mod pool;
mod rate;
mod respond;
mod table;
mod timers;
mod types;

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use verbs::{ConnId, Verbs, WorkCompletion, WrId};

use crate::link;
use crate::wire::ImmLayout;

pub use self::admission::{Admission, AdmitAll, PathRefusal, PathRequest};
pub use self::config::{ConfigError, ServerConfig, StartError};
pub use self::table::{IoState, ReadData};
use self::table::{PathSlot, PathState, SessionSlot};
pub use self::types::{
    CloseReason, CompleteError, ConnectRefusal, Event, IoDirection, IoToken, PathId, ServerStats,
    SessionId, Stats, Usage,
};

/// The errno values the server sends (positive; negated on the wire):
/// EIO (an oversized consumer errno), ENXIO (no such session and
/// `first_conn` clear), ENOMEM (a configured limit), EEXIST (a path with
/// the same addresses), EINVAL (malformed request), ECONNRESET (malformed
/// CON_REQ, a connection that exists, a path still up or not the
/// requester's to replace). Refusals at INFO_REQ close the path instead
/// ([`PathRefusal`]).
pub use ::errno;

/// Largest errno an IO response immediate carries (9 bits, rtrs.md §4.2).
pub const MAX_RESPONSE_ERRNO: u16 = 511;

/// Kinds of work request, in the top byte of [`WrId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum WrKind {
    RecvInfo = 1,
    RecvIo = 2,
    SendInfoRsp = 3,
    SendHeartbeat = 4,
    LocalInv = 5,
    IoResponse = 6,
    IoUnsignaled = 7,
}

impl WrKind {
    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::RecvInfo,
            2 => Self::RecvIo,
            3 => Self::SendInfoRsp,
            4 => Self::SendHeartbeat,
            5 => Self::LocalInv,
            6 => Self::IoResponse,
            7 => Self::IoUnsignaled,
            _ => return None,
        })
    }
}

/// A [`link::work_id`]: owner = path index, low = `generation:16 | chunk:16`.
fn wr_id(kind: WrKind, path: PathId, chunk: u16) -> WrId {
    link::work_id(
        kind as u8,
        u32::from(path.index),
        u32::from(path.generation) << 16 | u32::from(chunk),
    )
}

fn split_wr_id(id: WrId) -> Option<(WrKind, PathId, u16)> {
    let (kind, owner, low) = link::split_work_id(id);
    let path = PathId {
        index: u16::try_from(owner).ok()?,
        generation: (low >> 16) as u16,
    };
    Some((WrKind::from_u8(kind)?, path, low as u16))
}

/// Receives posted per `post_recv` call while filling a queue.
const RECV_BATCH: usize = 32;

/// Completions taken from one port per visit of [`Server::poll`]'s round.
const COMPLETION_BATCH: usize = 16;

/// One accepted connection: where it lives and which path/cid it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Connection {
    /// The port (provider) the ConnId belongs to.
    port: usize,
    /// The provider's id.
    conn: ConnId,
    /// Path slot index.
    path: u16,
    /// Connection id within the path.
    cid: u16,
}

/// The RTRS server over one or more verbs providers ("ports") of type `V`.
///
/// The server does not own its ports: the owner of the run loop keeps them
/// (one per interface) and lends them to every call that touches the
/// fabric ([`start`](Self::start), [`poll`](Self::poll),
/// [`complete_io`](Self::complete_io), [`close_path`](Self::close_path),
/// [`close_all`](Self::close_all)), always the same ports in the same order
/// (port `i` is `ports[i]`). The tables hold handles (connection ids,
/// memory regions) of those providers, hence the type parameter.
pub struct Server<V: Verbs> {
    config: ServerConfig,
    layout: ImmLayout,
    /// How many ports [`start`](Self::start) was given.
    port_count: usize,
    /// Ports `0..listening` listen on `config.port`.
    listening: usize,
    /// Port the next `poll` starts with (round robin).
    next_port: usize,
    sessions: Vec<SessionSlot>,
    paths: Vec<PathSlot>,
    /// Indices of the paths that are not `Free`, ascending: what the
    /// per-poll walks visit (room for every path, reserved in `new`).
    live_paths: Vec<u16>,
    /// (port, ConnId) -> (path index, cid); linear lookup. ConnIds are per
    /// provider, so the port is part of the key.
    // TODO(perf): a hash or a provider-assigned dense id once paths grow large.
    connections: Vec<Connection>,
    events: VecDeque<Event>,
    stats: ServerStats,
    /// Path setups per client address (module `rate`).
    setup_rate: rate::SetupRate,
    /// Any path with parked work (send-queue room, acks, closing).
    pending: bool,
    /// No path has timed work before this instant, so `poll` skips the walk
    /// of the paths until then (module `timers`). Every change of a path's
    /// state or deadline sets it to 0; the walk sets it again.
    timers_due: u64,
    /// Where [`Server::poll`] takes completions into: kept here so that a
    /// poll does not clear a fresh batch every call.
    completions: [WorkCompletion; COMPLETION_BATCH],
    /// The handles in the tables are `V`'s.
    provider: PhantomData<fn(&mut V)>,
}

/// The server with the ports of one call lent to it: every internal step
/// that posts, allocates or reads memory runs on this (modules `connect`,
/// `info`, `io`, `pool`, `close`, `timers`, `admission`). It dereferences
/// to the [`Server`], so the tables read as `self.paths`.
struct Lent<'a, V: Verbs> {
    server: &'a mut Server<V>,
    ports: &'a mut [V],
}

impl<V: Verbs> Deref for Lent<'_, V> {
    type Target = Server<V>;
    fn deref(&self) -> &Server<V> {
        self.server
    }
}

impl<V: Verbs> DerefMut for Lent<'_, V> {
    fn deref_mut(&mut self) -> &mut Server<V> {
        self.server
    }
}

impl<V: Verbs> Server<V> {
    /// Builds a server and allocates every table once (they do not depend
    /// on the number of ports). Registered memory is taken from the ports
    /// per path, later.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for parameters the protocol cannot carry.
    pub fn new(config: ServerConfig) -> Result<Self, ConfigError> {
        let layout = config.check()?;
        // Twice the open sessions: a closed session lingers while its paths
        // drain, and a reconnect of it opens a new one meanwhile.
        let sessions = (0..usize::from(config.max_sessions) * 2)
            .map(|_| SessionSlot::new())
            .collect();
        // Twice the live paths (a replaced path drains while its successor
        // runs) plus the half-open ones.
        let path_count =
            usize::from(config.max_sessions) * usize::from(config.max_paths_per_session) * 2
                + usize::from(config.max_half_open);
        let paths = (0..path_count).map(|_| PathSlot::new(&config)).collect();
        let live_paths = Vec::with_capacity(path_count);
        let connections =
            Vec::with_capacity(path_count * usize::from(config.max_connections_per_path));
        Ok(Self {
            config,
            layout,
            port_count: 0,
            listening: 0,
            next_port: 0,
            sessions,
            paths,
            live_paths,
            connections,
            events: VecDeque::with_capacity(config.event_capacity),
            stats: ServerStats::default(),
            setup_rate: rate::SetupRate::new(&config),
            pending: false,
            timers_due: 0,
            completions: [WorkCompletion::default(); COMPLETION_BATCH],
            provider: PhantomData,
        })
    }

    /// Lends `ports` to one call.
    ///
    /// # Panics
    ///
    /// If `ports` has fewer ports than [`start`](Self::start) was given (a
    /// caller that lends other ports than it started with).
    fn lend<'a>(&'a mut self, ports: &'a mut [V]) -> Lent<'a, V> {
        assert!(
            ports.len() >= self.port_count,
            "the server was started on {} ports, lent {}",
            self.port_count,
            ports.len()
        );
        Lent {
            server: self,
            ports,
        }
    }

    /// Starts listening on the configured RDMA CM port on every one of
    /// `ports` (`Idle -> Listening`); they are the server's ports from now
    /// on: every later call is lent the same ones in the same order. All of
    /// them form one RTRS server: a session's paths may arrive on different
    /// ports, and a path's registered memory is taken from the port its
    /// connections arrive on. If a port fails, the ports before it stay
    /// listening and a later call continues with the failed one.
    ///
    /// # Errors
    ///
    /// [`StartError::NoPorts`] for an empty `ports` (nothing listens), or
    /// [`StartError::Listen`] with the first failing provider's
    /// [`ConnectError`](verbs::ConnectError).
    pub fn start(&mut self, ports: &mut [V]) -> Result<(), StartError> {
        if ports.is_empty() {
            return Err(StartError::NoPorts);
        }
        self.port_count = self.port_count.max(ports.len());
        while let Some(port) = ports.get_mut(self.listening) {
            port.listen(self.config.port).map_err(StartError::Listen)?;
            self.listening += 1;
        }
        Ok(())
    }

    /// Whether [`start`](Self::start) succeeded on every port.
    pub fn is_listening(&self) -> bool {
        self.port_count > 0 && self.listening == self.port_count
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// How many ports the server was started on.
    pub fn port_count(&self) -> usize {
        self.port_count
    }

    /// The port a live path's connections (and its chunk memory) are on.
    pub fn path_port(&self, path: PathId) -> Option<usize> {
        self.path(path).map(|slot| slot.port)
    }

    /// The connections of a live path (one per RTRS connection id that
    /// is set up).
    pub fn path_conns(&self, path: PathId) -> impl Iterator<Item = ConnId> + '_ {
        self.path(path)
            .into_iter()
            .flat_map(|slot| slot.conns.iter().flatten().copied())
    }

    /// Server-wide counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// Counters of a live session.
    pub fn session_stats(&self, session: SessionId) -> Option<Stats> {
        let slot = self.sessions.get(usize::from(session.index))?;
        (slot.live && slot.generation == session.generation).then_some(slot.stats)
    }

    /// Counters of a live path.
    pub fn path_stats(&self, path: PathId) -> Option<Stats> {
        let slot = self.path(path)?;
        Some(slot.stats)
    }

    /// The session name, once INFO_REQ named it.
    pub fn session_name(&self, session: SessionId) -> Option<&str> {
        let slot = self.sessions.get(usize::from(session.index))?;
        (slot.live && slot.generation == session.generation && !slot.name.is_empty())
            .then_some(slot.name.as_str())
    }

    /// The state of the request `token` names, while it is not idle.
    pub fn io_state(&self, token: IoToken) -> Option<&IoState> {
        let chunk = self
            .path(token.path)?
            .chunks
            .get(usize::from(token.chunk))?;
        (chunk.generation == token.generation && chunk.state != IoState::Idle)
            .then_some(&chunk.state)
    }

    /// Table usage; all zero when nothing is connected.
    pub fn usage(&self) -> Usage {
        let mut usage = Usage {
            sessions: self.sessions.iter().filter(|s| s.live).count(),
            connections: self.connections.len(),
            ..Usage::default()
        };
        for path in &self.paths {
            if path.state != PathState::Free {
                usage.paths += 1;
            }
            usage.ios += path
                .chunks
                .iter()
                .filter(|c| !matches!(c.state, IoState::Idle))
                .count();
            usage.buffers += path.chunks.len()
                + usize::from(path.info_req.is_some())
                + usize::from(path.info_rsp.is_some());
        }
        usage
    }

    /// The next event for the consumer.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Events waiting, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter()
    }

    /// The oldest event, left in the queue: a consumer that needs only a
    /// few fields of it reads them here and drops it with
    /// [`skip_event`](Self::skip_event), instead of moving the whole
    /// [`Event`] (sized for the session names of the rare ones) out.
    pub fn peek_event(&self) -> Option<&Event> {
        self.events.front()
    }

    /// Drops the oldest event (see [`peek_event`](Self::peek_event)).
    pub fn skip_event(&mut self) {
        self.events.pop_front();
    }

    /// When `poll` next has timed work (a heartbeat or close deadline), or
    /// `Some(0)` if work is parked and `poll` should run again at once.
    pub fn poll_at(&self) -> Option<u64> {
        if self.pending {
            return Some(0);
        }
        self.live_paths
            .iter()
            .filter_map(|&index| self.paths.get(usize::from(index)))
            .filter_map(|path| match path.state {
                PathState::Connected => Some(path.heartbeat.next()),
                PathState::Connecting => Some(path.setup_deadline),
                PathState::Closing { deadline } => Some(deadline),
                _ => None,
            })
            .min()
    }

    /// Advances: drains up to `cm_budget` connection events and
    /// `completion_budget` completions, retries parked responses, runs
    /// heartbeats and close deadlines. Returns whether anything happened.
    ///
    /// The budgets are totals over all ports, per call. Ports are visited
    /// in rounds (one connection event, or up to 16 completions, per port
    /// per round) starting with a port that rotates every call, so a busy
    /// port cannot starve the others; a pass stops when the budget is
    /// spent or every port came up empty in a row.
    ///
    /// `admission` decides, at each path's INFO_REQ, whether the path may
    /// carry its session (see [`Admission`]); nothing of a session exists
    /// before it said yes.
    ///
    /// `ports` are the ports given to [`start`](Self::start), in the same
    /// order.
    pub fn poll(&mut self, now: u64, ports: &mut [V], admission: &mut impl Admission) -> bool {
        if self.port_count == 0 {
            return false;
        }
        self.lend(ports).poll(now, admission)
    }

    /// Closes a path on request (admin action).
    pub fn close_path(&mut self, path: PathId, now: u64, ports: &mut [V]) {
        if self.path(path).is_some() {
            self.lend(ports)
                .begin_close(path.index, CloseReason::Local, now);
        }
    }

    /// Closes every path (shutdown). Paths free themselves as their
    /// connections go and the consumer answers what it holds; poll until
    /// [`usage`](Self::usage) is all zero.
    pub fn close_all(&mut self, now: u64, ports: &mut [V]) {
        let mut lent = self.lend(ports);
        for index in 0..lent.paths.len() {
            lent.begin_close(index as u16, CloseReason::Local, now);
            lent.maybe_free_path(index as u16);
        }
    }

    /// Answers request `token` with `errno` (0 = success, otherwise the
    /// positive errno; above [`MAX_RESPONSE_ERRNO`] is sent as EIO). For a
    /// successful read, `read_data` says where the bytes are (in the
    /// memory of the request's port). The response goes out at once on
    /// `ports`, or as soon as send-queue room / the chunk's previous
    /// response allow (see [`IoState`]). If the path is closing the answer
    /// is accepted and dropped. A read SGL the provider refuses when the
    /// response is posted closes the path (`PostFailed`).
    ///
    /// # Errors
    ///
    /// [`CompleteError`]; the request stays outstanding on
    /// `ReadLengthMismatch`.
    #[inline]
    pub fn complete_io(
        &mut self,
        token: IoToken,
        errno: u16,
        read_data: ReadData,
        now: u64,
        ports: &mut [V],
    ) -> Result<(), CompleteError> {
        self.lend(ports).complete_io(token, errno, read_data, now)
    }

    // ----- internals: lookup -------------------------------------------------

    fn path(&self, id: PathId) -> Option<&PathSlot> {
        self.paths
            .get(usize::from(id.index))
            .filter(|p| p.state != PathState::Free && p.generation == id.generation)
    }

    fn path_mut(&mut self, id: PathId) -> Option<&mut PathSlot> {
        self.paths
            .get_mut(usize::from(id.index))
            .filter(|p| p.state != PathState::Free && p.generation == id.generation)
    }

    fn path_id(&self, index: u16) -> PathId {
        PathId {
            index,
            generation: self.paths[usize::from(index)].generation,
        }
    }

    fn session_id(&self, index: u16) -> SessionId {
        SessionId {
            index,
            generation: self.sessions[usize::from(index)].generation,
        }
    }

    /// Path slot `index` left `Free`: the per-poll walks visit it.
    fn path_taken(&mut self, index: usize) {
        let Ok(index) = u16::try_from(index) else {
            return;
        };
        if let Err(at) = self.live_paths.binary_search(&index) {
            // Room for every path slot was reserved: no allocation.
            self.live_paths.insert(at, index);
        }
        self.timers_due = 0;
    }

    /// Path slot `index` is `Free` again.
    fn path_freed(&mut self, index: usize) {
        let Ok(index) = u16::try_from(index) else {
            return;
        };
        if let Ok(at) = self.live_paths.binary_search(&index) {
            self.live_paths.remove(at);
        }
    }

    /// The smallest index of a path that is not `Free`, at or above `from`.
    fn next_live_path(&self, from: usize) -> Option<usize> {
        let at = self.live_paths.partition_point(|&p| usize::from(p) < from);
        self.live_paths.get(at).map(|&p| usize::from(p))
    }

    fn lookup_conn(&self, port: usize, conn: ConnId) -> Option<(u16, u16)> {
        self.connections
            .iter()
            .find(|c| c.port == port && c.conn == conn)
            .map(|c| (c.path, c.cid))
    }

    fn forget_conn(&mut self, port: usize, conn: ConnId) {
        if let Some(at) = self
            .connections
            .iter()
            .position(|c| c.port == port && c.conn == conn)
        {
            self.connections.swap_remove(at);
        }
    }

    /// The port of path slot `path`.
    fn port_of(&self, path: u16) -> usize {
        self.paths[usize::from(path)].port
    }

    fn event_room(&self) -> bool {
        self.events.len() + 4 <= self.config.event_capacity
    }

    fn push_event(&mut self, event: Event) {
        // Callers check `event_room` before work that can emit events; a full
        // queue here would be a bug in that accounting, and the event is
        // dropped rather than allocating.
        if self.events.len() < self.config.event_capacity {
            self.events.push_back(event);
        } else {
            self.stats.events_dropped += 1;
        }
    }
}
