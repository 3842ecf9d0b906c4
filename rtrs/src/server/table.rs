//! The server's fixed tables: sessions, paths and the per-chunk IO states.
//!
//! Every `Vec` here gets its capacity in `Server::new` and is only cleared
//! and refilled within it later, so nothing allocates after construction
//! (ARCHITECTURE.md §6). The IO state of each chunk is an enum whose variants
//! carry what is valid while the request waits (STYLE.md §5).

extern crate alloc;

use alloc::vec::Vec;
use core::net::{IpAddr, SocketAddr};

use verbs::{ConnId, MemoryRegion, Rkey, Sgl};

use super::{ServerConfig, Stats};
use crate::link::Heartbeat;
use crate::wire::{ConnReq, ReadFlags, ReadMsg, Uuid, PATHNAME_LEN};

/// Where the data of a successful read comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadData {
    /// The consumer filled the chunk from its start (the `data` handle of
    /// the event); also the value to pass for writes and errors.
    Chunk,
    /// The consumer's own registered memory; its length must equal the
    /// requested `read_len`. It must stay untouched until the path has
    /// sent it (the response's completion, or the path's teardown).
    Sgl(Sgl),
}

/// The client's read buffer, from the READ message (rtrs.md §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReadInfo {
    /// `desc[0].addr`.
    pub addr: u64,
    /// `desc[0].key`.
    pub rkey: Rkey,
    /// `desc[0].len`; 0 for a data-less read.
    pub len: u32,
    /// NEED_INVAL with a descriptor: a SEND_WITH_INV goes out.
    pub need_inval: bool,
}

impl ReadInfo {
    /// The buffer of a read with `sg_cnt == 1`, `None` without one.
    pub fn from_msg(msg: ReadMsg) -> Option<Self> {
        msg.desc.map(|desc| Self {
            addr: desc.addr,
            rkey: desc.rkey,
            len: desc.len,
            need_inval: msg.flags.contains(ReadFlags::NEED_INVAL),
        })
    }

    /// A read without a buffer (`sg_cnt == 0`).
    pub const fn dataless() -> Self {
        Self {
            addr: 0,
            rkey: Rkey(0),
            len: 0,
            need_inval: false,
        }
    }
}

/// A response being built (rtrs.md §4.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The connection (cid) the request came on; the answer goes there.
    pub(super) cid: u16,
    /// Positive errno, 0 = success.
    pub(super) errno: u16,
    /// The read's buffer, for reads.
    pub(super) read: Option<ReadInfo>,
    /// The read data.
    pub(super) data: ReadData,
    /// The chunk already has its fresh rkey (NEW_RKEY mode).
    pub(super) rekeyed: bool,
}

/// The state of the request on one chunk of a path.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IoState {
    /// No request on this chunk.
    #[default]
    Idle,
    /// always_invalidate: the LOCAL_INV of the chunk waits for send-queue
    /// room.
    WaitingForSendQueueToInvalidate {
        /// Connection of the request.
        cid: u16,
        /// Offset of the RTRS message in the chunk.
        offset: u32,
    },
    /// always_invalidate: the LOCAL_INV is posted; the request is parsed
    /// when it completes (rtrs.md §4.5 step 3).
    WaitingForInvalidate {
        /// Connection of the request.
        cid: u16,
        /// Offset of the RTRS message in the chunk.
        offset: u32,
    },
    /// Handed to the consumer as [`Event::Io`](super::Event::Io); waits for
    /// [`Server::complete_io`](super::Server::complete_io).
    WaitingForConsumer {
        /// Connection of the request.
        cid: u16,
        /// The read's buffer (reads only).
        #[allow(private_interfaces)]
        read: Option<ReadInfo>,
    },
    /// The answer is ready; the chunk's previous response has not completed
    /// yet (its memory is still pinned).
    WaitingForPreviousCompletion(Response),
    /// The answer is ready; the send queue had no room for the chain.
    WaitingForSendQueue(Response),
}

/// One chunk of a path's pool and its request.
#[derive(Clone, Debug)]
pub(super) struct ChunkSlot {
    /// The chunk's buffer and keys (the rkey is the currently advertised one).
    pub region: MemoryRegion,
    /// The request on it.
    pub state: IoState,
    /// Bumped for every request, so stale tokens are refused.
    pub generation: u32,
    /// Response chains posted and not yet completed.
    pub sends_in_flight: u16,
}

impl ChunkSlot {
    pub fn new(region: MemoryRegion) -> Self {
        Self {
            region,
            state: IoState::Idle,
            generation: 0,
            sends_in_flight: 0,
        }
    }
}

/// Path states (rtrs.md §2.4, §6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PathState {
    /// Unused slot.
    Free,
    /// Connections arriving; waiting for INFO_REQ.
    Connecting,
    /// INFO exchanged; carries IO and heartbeats.
    Connected,
    /// Disconnecting; waiting for the connections and consumer answers.
    Closing {
        /// When connections are destroyed without waiting further.
        deadline: u64,
    },
}

/// One path: its connections, chunk pool, IO table and heartbeat.
pub(super) struct PathSlot {
    pub state: PathState,
    pub generation: u16,
    /// The port (provider) of every connection and buffer of the path.
    pub port: usize,
    /// The session slot, once the path passed admission at INFO_REQ; a
    /// half-open path belongs to no session (it holds no session slot).
    pub session: Option<u16>,
    /// `paths_uuid` of the CON_REQ: the session the path asks for.
    pub session_uuid: Uuid,
    /// The path may create its session at INFO_REQ: its CON_REQ had
    /// `first_conn`, or the session was known (open, or asked for by
    /// another half-open path) when it came.
    pub first_conn: bool,
    pub uuid: Uuid,
    pub recon_cnt: u16,
    pub cid_num: u16,
    /// `con[cid]`, `cid_num` entries while in use.
    pub conns: Vec<Option<ConnId>>,
    pub remote: Option<SocketAddr>,
    /// (local, remote) of the request that created the path.
    pub addresses: Option<(SocketAddr, SocketAddr)>,
    pub chunks: Vec<ChunkSlot>,
    pub info_req: Option<MemoryRegion>,
    pub info_rsp: Option<MemoryRegion>,
    /// Liveness (rtrs.md §5), once connected.
    pub heartbeat: Heartbeat,
    /// While connecting: when the path is closed if its setup is not done.
    pub setup_deadline: u64,
    /// An HB_ACK is owed and waits for send-queue room.
    pub ack_pending: bool,
    pub stats: Stats,
}

impl PathSlot {
    /// Connecting or connected: the path uuid is taken.
    pub fn is_live(&self) -> bool {
        matches!(self.state, PathState::Connecting | PathState::Connected)
    }

    /// The client address of the path (of the CON_REQ that created it).
    pub fn source(&self) -> Option<IpAddr> {
        self.addresses.map(|(_, remote)| remote.ip())
    }
}

impl PathSlot {
    pub fn new(config: &ServerConfig) -> Self {
        Self {
            state: PathState::Free,
            generation: 0,
            port: 0,
            session: None,
            session_uuid: Uuid([0; 16]),
            first_conn: false,
            uuid: Uuid([0; 16]),
            recon_cnt: 0,
            cid_num: 0,
            conns: Vec::with_capacity(usize::from(config.max_connections_per_path)),
            remote: None,
            addresses: None,
            chunks: Vec::with_capacity(usize::from(config.queue_depth)),
            info_req: None,
            info_rsp: None,
            heartbeat: Heartbeat::default(),
            setup_deadline: 0,
            ack_pending: false,
            stats: Stats::default(),
        }
    }

    /// Takes the free slot for a new half-open path on `port` (within
    /// capacity: `cid_num` was checked against the configured maximum).
    /// `setup_deadline`: when a path still connecting is closed.
    pub fn reset(&mut self, port: usize, req: &ConnReq, setup_deadline: u64) {
        self.state = PathState::Connecting;
        self.setup_deadline = setup_deadline;
        self.port = port;
        self.session = None;
        self.session_uuid = req.session_uuid;
        self.first_conn = req.first_conn;
        self.uuid = req.path_uuid;
        self.recon_cnt = req.recon_cnt;
        self.cid_num = req.cid_num;
        self.conns.clear();
        self.conns.resize(usize::from(req.cid_num), None);
        self.remote = None;
        self.addresses = None;
        self.chunks.clear();
        self.heartbeat = Heartbeat::default();
        self.ack_pending = false;
        self.stats = Stats::default();
    }
}

/// One session: the paths sharing a session uuid (rtrs.md §7).
///
/// A slot is taken when the first path of a session passes admission and
/// is *open* while it has a path up; once its last path went down
/// (`SessionClosed`) it is no longer open: a later path of the same
/// session uuid starts a new session (a new [`SessionId`](super::SessionId)),
/// while this slot lingers until the closing paths have drained.
pub(super) struct SessionSlot {
    pub live: bool,
    /// Has a path up, or is being set up by its first path; new paths may
    /// join.
    pub open: bool,
    pub generation: u16,
    pub uuid: Uuid,
    pub name: heapless::String<PATHNAME_LEN>,
    pub paths_up: u16,
    pub stats: Stats,
}

impl SessionSlot {
    pub fn new() -> Self {
        Self {
            live: false,
            open: false,
            generation: 0,
            uuid: Uuid([0; 16]),
            name: heapless::String::new(),
            paths_up: 0,
            stats: Stats::default(),
        }
    }
}
