//! The RTRS client: a session of paths of connections, permits, IO
//! submission, heartbeats, failover and reconnect (Brick's userspace
//! initiator, issue 5).
//!
//! Sans-IO over the fabric seam ([`verbs::Verbs`]): the owner of the run loop
//! calls [`Client::poll`] with the time (nanoseconds), sleeps until
//! [`Client::poll_at`], reads [`Client::next_event`] and submits requests with
//! [`Client::submit`]. Behaviour follows `docs/protocol/rtrs.md` from the
//! client side: §2 establishment (one connection at a time in cid order,
//! CON_REQ with the shared session uuid and a per-path uuid, `first_conn` and
//! `recon_cnt` as Linux sets them, CONN_RSP checks), §3 INFO_REQ/INFO_RSP
//! (validated per §3.3), §4 the IO path (permits = chunks, WRITE and READ
//! layouts, IO_RSP immediates, RKEY_RSP in NEW_RKEY mode), §5 heartbeats,
//! §6.2 error recovery and reconnect, §7 multipath and failover.
//!
//! # Reading order
//!
//! This file holds the [`Client`], its tables and its public calls
//! (construction, session and path control, `poll`); the rest is one file
//! per concern: `types` (configuration, requests, events, errors),
//! `establish` (CON_REQ/CONN_RSP, INFO_REQ/INFO_RSP, receive queues),
//! `io` (path choice, requests, responses, completions), `failover`
//! (failed paths, failover, reconnect) and `timers` (heartbeats,
//! deadlines).
//!
//! # Memory
//!
//! Every table (paths, connections, the permit table, chunk tables, the event
//! queue) is allocated once in [`Client::new`] from the [`ClientConfig`]
//! capacities, and so is the registered memory: one header buffer per permit
//! (the user header plus the RTRS message, copied in at submission) and, per
//! path slot, one control buffer (INFO_REQ, INFO_RSP and the 8-byte receive
//! slots). Nothing allocates afterwards.
//!
//! # Read buffers
//!
//! A READ names one consumer buffer already registered with remote-write
//! access ([`ReadBuffer`]). The client sends it with `flags = 0` (no
//! `NEED_INVAL`), as rtrs.md §9 recommends for a userspace client: the buffer
//! is pre-registered, not a per-IO fast-reg MR, so it cannot be invalidated
//! remotely. The server answers with RDMA WRITE + a type-1 completion. The
//! same applies to RNBD admin messages (SESS_INFO, OPEN), whose response the
//! server RDMA-writes into the read buffer: the completion event hands the
//! [`ReadBuffer`] back, and [`Client::read_response`] copies the bytes out.
//!
//! # State diagram
//!
//! ```text
//!  Pending ──(its turn: paths come up one at a time)──► Connecting{cid}
//!  Connecting{cid} ──Established + CONN_RSP ok──► Connecting{cid+1} … ──all up──►
//!  WaitingForInfoRsp ──INFO_RSP ok──► Connected ──► PathUp (+ SessionUp)
//!  any state ──CM error / WC error / heartbeat timeout / bad CONN_RSP or
//!              INFO_RSP / timeout──► Disconnecting ──all conns gone──►
//!  WaitingToReconnect{at} ──at──► Connecting{0} (recon_cnt + 1)
//!                         (or Closed when the attempts are exhausted)
//! ```
//!
//! Paths are brought up one at a time (as Linux's `rtrs_clt_open` does), so
//! a second path's cid 0 finds the server session the first one created
//! (`first_conn = 0` until the path has been up once, rtrs.md §2.3). A path
//! waiting for its connect timeout therefore delays the others' attempts.
//! [`Client::close_session`] moves every path to `Closed`.
//!
//! A request (one per permit) is `Free` or `InFlight { path, send_done,
//! response }`; it completes when both its send completion and its response
//! have arrived. When its path fails it is re-posted on another connected
//! path with the same permit (chunk id), or completed with `ECONNABORTED`.
//!
//! Every request work request is signalled (no selective signalling), so the
//! header buffer is known free when the request completes.
//!
//! # Using it
//!
//! ```text
//! let mut client = Client::new(verbs, ClientConfig::default_with_seed(entropy))?;
//! client.connect_session("sess", &[path_a, path_b], 1 + cpus, now)?;
//! loop {
//!     client.poll(now);
//!     while let Some(event) = client.next_event() { /* SessionUp, IoCompleted … */ }
//!     client.submit(ClientIo { tag, header: &rnbd_msg, direction, admin, hint })?;
//!     sleep_until(client.poll_at());
//! }
//! ```
//!
//! # Limits
//!
//! * Writes carry at most `MAX_SGE - 1` data SGEs (the last SGE is the
//!   header buffer); reads one contiguous registered buffer (`sg_cnt <= 1`,
//!   as the protocol allows).
//! * No per-IO fast registration and so no `NEED_INVAL` (see above); no
//!   min-latency multipath policy (the heartbeat RTT is in [`PathStats`]).
//! * A failed-over request reuses its permit, so its chunk id, on the other
//!   path (rtrs.md §7); Brick's server gives each path its own chunk memory,
//!   a Linux server shares it (the §7 hazard is the server's to handle).

use core::net::SocketAddr;

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, MemoryRegion, PostError, RecvWr, SendOp, SendWr, Sgl,
    Verbs, WcOpcode, WcStatus, WorkCompletion, WrId,
};

use crate::link::{self, Beat, Heartbeat};
use crate::wire::{
    BufferDesc, ConnReq, ConnRsp, ConnRspFlags, Imm, ImmLayout, InfoReq, InfoRsp, ReadFlags,
    ReadMsg, RkeyRsp, Uuid, WriteMsg, PATHNAME_LEN, VERSION,
};

/// The errno values the client reports: EIO, and ECONNABORTED when no path
/// took a failed-over request (as Linux's client).
pub use ::errno;

mod establish;
mod failover;
mod io;
mod timers;
mod types;

pub use self::types::{
    ClientConfig, ClientIo, ConfigError, Direction, Event, MultipathPolicy, PathError, PathStats,
    PathStatus, ReadBuffer, SessionError, SubmitError,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PathState {
    Unused,
    Pending,
    Connecting { cid: u16, deadline: u64 },
    WaitingForInfoRsp { deadline: u64 },
    Connected,
    Disconnecting { deadline: u64, close: bool },
    WaitingToReconnect { at: u64 },
    Closed,
}

/// Work request kinds in the top byte of a `WrId`.
const KIND_REQUEST: u8 = 1;
const KIND_RECV: u8 = 2;
const KIND_INFO_RSP: u8 = 3;
const KIND_CONTROL: u8 = 4;

/// A [`link::work_id`]: owner = `path:8 | cid:16`.
fn wr_id(kind: u8, path: u16, cid: u16, low: u32) -> WrId {
    link::work_id(kind, u32::from(path & 0xff) << 16 | u32::from(cid), low)
}

fn split_wr_id(id: WrId) -> (u8, u16, u16, u32) {
    let (kind, owner, low) = link::split_work_id(id);
    (kind, (owner >> 16) as u16, owner as u16, low)
}

/// Bytes of one receive slot (`sizeof(rtrs_msg_rkey_rsp)`, rtrs.md §9).
const RECV_SLOT: u32 = RkeyRsp::LEN as u32;
/// INFO_REQ area in a path's control buffer.
const INFO_REQ_AREA: u32 = 512;
/// READ message with one descriptor.
const READ_MSG_LEN: u32 = (ReadMsg::HEADER_LEN + 16) as u32;

struct PathSlot {
    state: PathState,
    remote: SocketAddr,
    uuid: Uuid,
    recon_cnt: u16,
    first_conn: bool,
    ever_up: bool,
    cid_num: u16,
    conns: Vec<Option<ConnId>>,
    chunks: Vec<BufferDesc>,
    chunk_size: u32,
    max_hdr_size: u32,
    max_io_size: u32,
    new_rkey: bool,
    /// Liveness (rtrs.md §5), while connected.
    heartbeat: Heartbeat,
    heartbeat_sent_at: u64,
    rr_cid: u16,
    attempts: u32,
    control: Option<MemoryRegion>,
    stats: PathStats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RequestState {
    Free,
    InFlight {
        path: u16,
        send_done: bool,
        response: Option<u16>,
    },
}

struct RequestSlot {
    state: RequestState,
    generation: u16,
    tag: u64,
    /// Local SGL: data SGEs (writes) + the header SGE.
    sgl: Sgl,
    /// Where in the chunk the write starts (0 for writes, `len` for reads).
    remote_offset: u32,
    /// The IO_REQ offset (data + user header).
    imm_offset: u32,
    admin: bool,
    hint: Option<u16>,
    read: Option<ReadBuffer>,
    data_len: u32,
    /// User header + RTRS message bytes.
    header_len: u32,
}

struct Session {
    name: heapless::String<PATHNAME_LEN>,
    uuid: Uuid,
    queue_depth: Option<u16>,
    layout: Option<ImmLayout>,
    paths: u16,
    up: bool,
    was_up: bool,
    max_io_size: u32,
    /// `close_session` was called: no failover, no reconnect.
    closing: bool,
}

/// The RTRS client over a verbs provider `V`.
pub struct Client<V: Verbs> {
    verbs: V,
    config: ClientConfig,
    session: Option<Session>,
    paths: Vec<PathSlot>,
    requests: Vec<RequestSlot>,
    free_permits: Vec<u16>,
    headers: MemoryRegion,
    header_stride: u32,
    recv_per_conn: u32,
    events: VecDeque<Event>,
    events_dropped: u64,
    rr_path: u16,
    uuid_counter: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl<V: Verbs> Client<V> {
    /// Builds a client: allocates every table and the registered header and
    /// control buffers from `config`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`].
    pub fn new(mut verbs: V, config: ClientConfig) -> Result<Self, ConfigError> {
        if config.max_paths == 0
            || usize::from(config.max_paths) > crate::wire::MAX_PATHS_NUM
            || config.max_connections_per_path == 0
            || config.max_connections_per_path > crate::wire::MAX_CID_NUM
            || config.max_queue_depth < 2
            || config.max_header_len == 0
            || config.max_header_len > 1 << 20
            || config.event_capacity == 0
        {
            return Err(ConfigError::Limits);
        }
        let qd = u32::from(config.max_queue_depth);
        let header_stride = (config.max_header_len + READ_MSG_LEN + 63) & !63;
        let headers_len = header_stride.checked_mul(qd).ok_or(ConfigError::Limits)?;
        let headers = Self::alloc_region(&mut verbs, headers_len)?;
        // Two receives per outstanding request, plus heartbeats and acks.
        let recv_per_conn = 2 * qd + 8;
        let control_len = u64::from(INFO_REQ_AREA)
            + 8
            + 16 * u64::from(qd)
            + u64::from(config.max_connections_per_path)
                * u64::from(recv_per_conn)
                * u64::from(RECV_SLOT);
        let control_len = u32::try_from(control_len).map_err(|_| ConfigError::Limits)?;
        let mut paths = Vec::with_capacity(usize::from(config.max_paths));
        for _ in 0..config.max_paths {
            let control = Self::alloc_region(&mut verbs, control_len)?;
            paths.push(PathSlot {
                state: PathState::Unused,
                remote: SocketAddr::from(([0, 0, 0, 0], 0)),
                uuid: Uuid([0; 16]),
                recon_cnt: 0,
                first_conn: false,
                ever_up: false,
                cid_num: 0,
                conns: alloc::vec![None; usize::from(config.max_connections_per_path)],
                chunks: alloc::vec![
                    BufferDesc {
                        addr: 0,
                        rkey: verbs::Rkey(0),
                        len: 0
                    };
                    usize::from(config.max_queue_depth)
                ],
                chunk_size: 0,
                max_hdr_size: 0,
                max_io_size: 0,
                new_rkey: false,
                heartbeat: Heartbeat::default(),
                heartbeat_sent_at: 0,
                rr_cid: 0,
                attempts: 0,
                control: Some(control),
                stats: PathStats::default(),
            });
        }
        let requests = (0..config.max_queue_depth)
            .map(|_| RequestSlot {
                state: RequestState::Free,
                generation: 0,
                tag: 0,
                sgl: Sgl::new(),
                remote_offset: 0,
                imm_offset: 0,
                admin: false,
                hint: None,
                read: None,
                data_len: 0,
                header_len: 0,
            })
            .collect();
        Ok(Self {
            verbs,
            config,
            session: None,
            paths,
            requests,
            free_permits: Vec::with_capacity(usize::from(config.max_queue_depth)),
            headers,
            header_stride,
            recv_per_conn,
            events: VecDeque::with_capacity(config.event_capacity),
            events_dropped: 0,
            rr_path: 0,
            uuid_counter: u64::from_le_bytes([
                config.uuid_seed[0],
                config.uuid_seed[1],
                config.uuid_seed[2],
                config.uuid_seed[3],
                config.uuid_seed[4],
                config.uuid_seed[5],
                config.uuid_seed[6],
                config.uuid_seed[7],
            ]) ^ u64::from_le_bytes([
                config.uuid_seed[8],
                config.uuid_seed[9],
                config.uuid_seed[10],
                config.uuid_seed[11],
                config.uuid_seed[12],
                config.uuid_seed[13],
                config.uuid_seed[14],
                config.uuid_seed[15],
            ]),
        })
    }

    fn alloc_region(verbs: &mut V, len: u32) -> Result<MemoryRegion, ConfigError> {
        let buffer = verbs.alloc(len, 64).map_err(|_| ConfigError::Memory)?;
        verbs
            .reg_mr(buffer, AccessFlags::LOCAL_WRITE)
            .map_err(|_| ConfigError::Memory)
    }

    fn next_uuid(&mut self) -> Uuid {
        let a = splitmix(&mut self.uuid_counter).to_le_bytes();
        let b = splitmix(&mut self.uuid_counter).to_le_bytes();
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a);
        out[8..].copy_from_slice(&b);
        Uuid(out)
    }

    /// The provider (to read response buffers, or for tests).
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// The provider, mutably (to register consumer buffers).
    pub fn verbs_mut(&mut self) -> &mut V {
        &mut self.verbs
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The session uuid (`paths_uuid` of every CON_REQ), once started.
    pub fn session_uuid(&self) -> Option<Uuid> {
        self.session.as_ref().map(|s| s.uuid)
    }

    /// The path uuid (`sess_uuid` of its CON_REQs).
    pub fn path_uuid(&self, path: u16) -> Option<Uuid> {
        self.live_path(path).map(|p| p.uuid)
    }

    /// The session queue depth (permits), once the first CONN_RSP arrived.
    pub fn queue_depth(&self) -> Option<u16> {
        self.session.as_ref().and_then(|s| s.queue_depth)
    }

    /// Whether at least one path is connected.
    pub fn is_up(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.up)
    }

    /// The state of path `path`.
    pub fn path_status(&self, path: u16) -> Option<PathStatus> {
        self.live_path(path).map(|p| match p.state {
            PathState::Unused => PathStatus::Closed,
            PathState::Pending => PathStatus::Pending,
            PathState::Connecting { .. } => PathStatus::Connecting,
            PathState::WaitingForInfoRsp { .. } => PathStatus::WaitingForInfoRsp,
            PathState::Connected => PathStatus::Connected,
            PathState::Disconnecting { .. } => PathStatus::Disconnecting,
            PathState::WaitingToReconnect { .. } => PathStatus::WaitingToReconnect,
            PathState::Closed => PathStatus::Closed,
        })
    }

    /// Counters of path `path`.
    pub fn path_stats(&self, path: u16) -> Option<PathStats> {
        self.live_path(path).map(|p| p.stats)
    }

    /// The chunk table of a connected path (for tests and diagnostics).
    pub fn chunk(&self, path: u16, id: u16) -> Option<BufferDesc> {
        let q = self.queue_depth()?;
        if id >= q {
            return None;
        }
        self.live_path(path)
            .filter(|p| p.state == PathState::Connected)
            .and_then(|p| p.chunks.get(usize::from(id)).copied())
    }

    /// Events dropped because the queue was full.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.requests
            .iter()
            .filter(|r| r.state != RequestState::Free)
            .count()
    }

    fn live_path(&self, path: u16) -> Option<&PathSlot> {
        let count = self.session.as_ref()?.paths;
        if path >= count {
            return None;
        }
        self.paths.get(usize::from(path))
    }

    /// The next event, oldest first.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn push_event(&mut self, event: Event) {
        if self.events.len() < self.config.event_capacity {
            self.events.push_back(event);
        } else {
            self.events_dropped += 1;
        }
    }

    /// Copies the bytes the server wrote into a read buffer (the READ data,
    /// or an RNBD admin response) into `dst` (at most `read.len` bytes).
    ///
    /// # Errors
    ///
    /// [`verbs::AccessError`] if the buffer is gone or `dst` is too long.
    pub fn read_response(
        &self,
        read: &ReadBuffer,
        dst: &mut [u8],
    ) -> Result<(), verbs::AccessError> {
        if dst.len() > read.len as usize {
            return Err(verbs::AccessError::OutOfBounds);
        }
        self.verbs.read(read.region.handle, read.offset, dst)
    }

    /// Starts session `name` over `paths` (server addresses), each with
    /// `connections_per_path` connections (cid 0 admin + IO cids). Paths come
    /// up one at a time, in order; watch for [`Event::SessionUp`]. `now`
    /// starts the first connect timeout. The session uuid is shared by all
    /// paths; each path gets its own uuid, kept across reconnects.
    ///
    /// # Errors
    ///
    /// [`SessionError`].
    pub fn connect_session(
        &mut self,
        name: &str,
        paths: &[SocketAddr],
        connections_per_path: u16,
        now: u64,
    ) -> Result<(), SessionError> {
        if self.session.is_some() {
            return Err(SessionError::AlreadyStarted);
        }
        if name.is_empty()
            || name.len() >= PATHNAME_LEN
            || name.contains('/')
            || name.contains('.')
            || name.contains('\0')
        {
            return Err(SessionError::BadName);
        }
        if paths.is_empty()
            || paths.len() > usize::from(self.config.max_paths)
            || connections_per_path == 0
            || connections_per_path > self.config.max_connections_per_path
        {
            return Err(SessionError::BadPaths);
        }
        let mut session_name = heapless::String::new();
        session_name
            .push_str(name)
            .map_err(|()| SessionError::BadName)?;
        let uuid = self.next_uuid();
        for (index, remote) in paths.iter().enumerate() {
            let path_uuid = self.next_uuid();
            let slot = &mut self.paths[index];
            slot.state = PathState::Pending;
            slot.remote = *remote;
            slot.uuid = path_uuid;
            slot.recon_cnt = 0;
            // rtrs.md §2.3: only the first path may create the server session.
            slot.first_conn = index == 0;
            slot.ever_up = false;
            slot.cid_num = connections_per_path;
            slot.stats = PathStats::default();
        }
        self.session = Some(Session {
            name: session_name,
            uuid,
            queue_depth: None,
            layout: None,
            paths: paths.len() as u16,
            up: false,
            was_up: false,
            max_io_size: 0,
            closing: false,
        });
        self.start_pending(now);
        Ok(())
    }

    /// Closes path `path` at once (as a failure, `PathError::Local`); it
    /// reconnects after the delay like any failed path.
    pub fn disconnect_path(&mut self, path: u16, now: u64) {
        if self.live_path(path).is_some() {
            self.fail_path(path, PathError::Local, now);
        }
    }

    /// Closes the session (rtrs.md §6.3): every path is disconnected and not
    /// reconnected, requests in flight complete with `ECONNABORTED`, and
    /// each path ends with [`Event::PathClosed`].
    pub fn close_session(&mut self, now: u64) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        session.closing = true;
        for path in 0..session.paths {
            match self.paths[usize::from(path)].state {
                PathState::Connected
                | PathState::Connecting { .. }
                | PathState::WaitingForInfoRsp { .. } => {
                    self.fail_path(path, PathError::Local, now);
                }
                PathState::Pending | PathState::WaitingToReconnect { .. } => {
                    self.paths[usize::from(path)].state = PathState::Closed;
                    self.push_event(Event::PathClosed { path });
                }
                _ => {}
            }
        }
    }

    // ----- the run loop -----------------------------------------------------

    /// The earliest time `poll` has timer work to do, if any.
    pub fn poll_at(&self) -> Option<u64> {
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        self.paths
            .iter()
            .take(usize::from(count))
            .filter_map(|p| match p.state {
                PathState::Connecting { deadline, .. }
                | PathState::WaitingForInfoRsp { deadline }
                | PathState::Disconnecting { deadline, .. } => Some(deadline),
                PathState::WaitingToReconnect { at } => Some(at),
                PathState::Connected => Some(p.heartbeat.next()),
                _ => None,
            })
            .min()
    }

    /// Does a bounded amount of work: at most `cm_budget` connection events,
    /// `completion_budget` work completions, and one timer pass over the
    /// paths. Returns whether anything was done.
    pub fn poll(&mut self, now: u64) -> bool {
        let mut busy = false;
        for _ in 0..self.config.cm_budget {
            let Some(event) = self.verbs.poll_cm_event() else {
                break;
            };
            busy = true;
            self.handle_cm_event(event, now);
        }
        let mut left = self.config.completion_budget;
        while left > 0 {
            let mut batch = [WorkCompletion::default(); 16];
            let want = left.min(batch.len());
            let n = self.verbs.poll_cq(&mut batch[..want]);
            if n == 0 {
                break;
            }
            busy = true;
            left -= n;
            for wc in &batch[..n] {
                self.handle_completion(*wc, now);
            }
        }
        busy |= self.timers(now);
        busy
    }
}
