//! The sans-IO initiator core: RNBD volumes and IO slots over the RTRS
//! client.
//!
//! [`Initiator`] owns an [`rtrs::client::Client`] (and through it the
//! verbs provider) and builds every RNBD message with [`rnbd::client`].
//! The owner of the run loop feeds it time:
//!
//! ```text
//! loop {
//!     hca: frames in;  initiator.poll(now);  hca: frames out
//!     while let Some(event) = initiator.next_event() { … }      // control
//!     while initiator.next_completion(|c, data| …).is_some() {} // IO
//!     block until a frame or min(initiator.poll_at(), hca.poll_at(now))
//! }
//! ```
//!
//! # IO slots and memory
//!
//! The queue depth is a table of IO slots, each owning `max_transfer`
//! bytes of one registered data pool (allocated and registered once in
//! [`Initiator::new`], local + remote write). The caller's data is copied:
//! a write's bytes into the slot's buffer at submission, a read's bytes
//! handed to the closure of [`Initiator::next_completion`] straight from
//! the slot's buffer (the server RDMA-writes them there). One copy per IO
//! buys a safe API with no buffer registration on the caller's side and no
//! lifetime tying caller memory to the network. Nothing on the IO path
//! allocates: the slot table, the issue queue and the completion queue are
//! sized at construction.
//!
//! # An IO's life
//!
//! ```text
//!  submit ──volume open──► Issuing ──pieces answered──► Completed ──reap──► Free
//!     │                      │  ▲
//!     │  session down /      │  └─ FUA write on a write-back device without
//!     │  volume re-opening   │     FUA: the data pieces, then one FLUSH piece
//!     ▼                      ▼
//!  WaitingForVolume ◄── a piece came back ECONNABORTED (no path took it)
//!     │  volume open again: re-issued from the start
//!     └─ hold timeout / policy Fail / re-open failed ──► Completed(Err)
//! ```
//!
//! An IO is issued as pieces of at most the session's `max_io_size`
//! (rounded down to the volume's block size; the server's chunk minus its
//! header room, rtrs.md §2.5) for reads and writes and at most the volume's
//! discard limit for discards, each one RTRS request. Pieces wait for RTRS
//! permits in the issue queue (FIFO over slots). The first error of a piece
//! stops the IO (no more pieces are sent) and completes it once the pieces
//! in flight are back.
//!
//! # Sessions and volumes
//!
//! After `SessionUp` the initiator sends SESS_INFO, then OPEN for every
//! volume waiting for it. After `SessionDown` every open volume is
//! `Disconnected` (the server forgot it, rnbd.md §4.6); when the session
//! is up again SESS_INFO and OPEN are re-sent for each, transparently
//! (rnbd.md §5.2, §7.8), device ids and sizes are taken from the new
//! OPEN_RSPs, and held IO is re-issued. IO during the gap follows
//! [`OnDisconnect`].
//!
//! # Raw requests
//!
//! [`Initiator::client_mut`] gives the RTRS client for diagnostics (for
//! example a test sending a request the builders refuse). Tags of such
//! requests must be below [`RAW_TAG_LIMIT`]; their completions come back as
//! [`Event::RawCompleted`].

mod io;
mod volumes;

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;

use rnbd::client::{self as rnbd_client, ClientError, Device};
use rnbd::wire::{AccessMode, CachePolicy};
use rtrs::client::{
    Client, ClientIo, Direction, Event as RtrsEvent, PathError, ReadBuffer, SessionError,
    SubmitError as RtrsSubmitError,
};
use verbs::{AccessFlags, MemoryRegion, PostError, Sgl, Verbs};

use crate::config::{InitiatorConfig, OnDisconnect, ADMIN_SLOT};
use crate::error::{CloseError, ConnectError, InitError, IoError, OpenError, SubmitError};
use crate::stats::{PathReport, SessionStats, VolumeStats};

/// Tags of raw requests (see the module docs) must be below this.
pub const RAW_TAG_LIMIT: u64 = 0xB0 << 56;

/// RTRS events handled per [`Initiator::poll`].
const EVENT_BUDGET: usize = 256;
/// Bytes of the largest RNBD header the initiator builds (OPEN: 264).
const HEADER_LEN: usize = 272;

const KIND_IO: u64 = 0xB1;
const KIND_OPEN: u64 = 0xB2;
const KIND_SESS_INFO: u64 = 0xB3;
const KIND_CLOSE: u64 = 0xB4;

fn tag_of(kind: u64, generation: u16, index: u16) -> u64 {
    kind << 56 | u64::from(generation) << 16 | u64::from(index)
}

fn split_tag(tag: u64) -> (u64, u16, u16) {
    (tag >> 56, (tag >> 16) as u16, tag as u16)
}

/// A volume of this initiator (slot index + generation: a closed volume's
/// id never names a later one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VolumeId {
    index: u16,
    generation: u16,
}

impl VolumeId {
    /// The volume table index.
    pub const fn index(self) -> u16 {
        self.index
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume {}", self.index)
    }
}

/// A volume's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolumeState {
    /// First open: waiting for the session (SESS_INFO) or an RTRS permit.
    WaitingForSession,
    /// First open: OPEN sent, not answered.
    Opening,
    /// Open: IO flows.
    Open,
    /// The session went down; the volume is re-opened when it is back.
    Disconnected,
    /// OPEN re-sent after a reconnect, not answered.
    Reopening,
    /// The re-open failed: IO fails with [`IoError::VolumeLost`]; close it.
    Lost(OpenError),
    /// CLOSE pending or sent.
    Closing,
}

/// What an open volume looks like (from its OPEN_RSP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VolumeInfo {
    /// The volume.
    pub id: VolumeId,
    /// Size in bytes.
    pub size: u64,
    /// Logical block size in bytes: offsets and lengths are multiples of it.
    pub logical_block_size: u32,
    /// Physical block size in bytes.
    pub physical_block_size: u32,
    /// Largest discard in bytes; 0: no discard.
    pub max_discard_bytes: u64,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
    /// The volume has a volatile write cache (FLUSH is sent to it).
    pub write_cache: bool,
    /// The volume honours FUA writes natively.
    pub fua: bool,
    /// How it is mapped.
    pub mode: AccessMode,
    /// Largest piece one RTRS request carries; longer IOs are split.
    pub max_io_size: u32,
    /// The RNBD device (server device id, raw geometry).
    pub device: Device,
}

impl VolumeInfo {
    fn new(id: VolumeId, device: Device) -> Self {
        Self {
            id,
            size: device.capacity_bytes(),
            logical_block_size: u32::from(device.geometry.logical_block_size.max(512)),
            physical_block_size: u32::from(device.geometry.physical_block_size),
            max_discard_bytes: u64::from(device.geometry.max_discard_sectors) * 512,
            discard_granularity: device.geometry.discard_granularity,
            write_cache: device.has_write_cache(),
            fua: device.has_write_cache() && device.policy.contains(CachePolicy::FUA),
            mode: device.mode,
            max_io_size: device.max_io_size,
            device,
        }
    }
}

/// The kind of an IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// Read.
    Read,
    /// Write (FUA or not).
    Write,
    /// Flush the volume's write cache.
    Flush,
    /// Discard a range.
    Discard,
}

/// A finished IO, handed to the closure of [`Initiator::next_completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The caller's tag.
    pub tag: u64,
    /// The volume.
    pub volume: VolumeId,
    /// What it was.
    pub kind: IoKind,
    /// First byte (0 for a flush).
    pub offset: u64,
    /// Bytes (0 for a flush).
    pub len: u32,
    /// How it ended.
    pub result: Result<(), IoError>,
    /// Submission to completion, ns.
    pub latency_ns: u64,
}

/// What the initiator tells its owner (control path; IO completions come
/// from [`Initiator::next_completion`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The session is usable (SESS_INFO answered); `reconnected` after a
    /// [`Event::SessionDown`].
    SessionUp {
        /// Whether it had been down.
        reconnected: bool,
    },
    /// The last path went down. Open volumes are `Disconnected` until the
    /// session is back and they are re-opened.
    SessionDown,
    /// A path is up and carries IO.
    PathUp {
        /// Path index (order given to [`Initiator::connect`]).
        path: u16,
    },
    /// A path went down; its requests were failed over to another path,
    /// or held / failed.
    PathDown {
        /// Path index.
        path: u16,
        /// Why.
        reason: PathError,
    },
    /// A connect attempt failed; it is retried after the reconnect delay.
    PathConnectFailed {
        /// Path index.
        path: u16,
        /// Why.
        reason: PathError,
    },
    /// A path gave up for good (session closed, or the server changed its
    /// queue depth).
    PathClosed {
        /// Path index.
        path: u16,
    },
    /// The first OPEN of a volume was answered.
    Opened {
        /// The volume ([`Initiator::open`]'s return value).
        volume: VolumeId,
        /// Its geometry, or why it could not be opened (the id is then
        /// free again).
        result: Result<VolumeInfo, OpenError>,
    },
    /// A volume was re-opened after a reconnect; held IO resumes.
    Reopened {
        /// The volume.
        volume: VolumeId,
        /// Its geometry now (device id and size may have changed).
        info: VolumeInfo,
    },
    /// A volume could not be re-opened after a reconnect.
    ReopenFailed {
        /// The volume.
        volume: VolumeId,
        /// Why.
        error: OpenError,
    },
    /// A volume was closed (its id is free).
    Closed {
        /// The volume.
        volume: VolumeId,
        /// The CLOSE's answer (Ok if the session was gone: the server
        /// forgot the volume then).
        result: Result<(), IoError>,
    },
    /// A raw request (tag below [`RAW_TAG_LIMIT`]) completed.
    RawCompleted {
        /// Its tag.
        tag: u64,
        /// 0 or the errno.
        errno: u16,
        /// Its read buffer, if it was an RTRS READ.
        read: Option<ReadBuffer>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessionState {
    /// `connect` not called yet.
    Idle,
    /// Waiting for the RTRS session.
    Connecting,
    /// Up: SESS_INFO to send (waiting for a permit).
    SendingSessInfo,
    /// SESS_INFO sent.
    WaitingForSessInfo,
    /// Usable.
    Ready,
    /// All paths down; RTRS reconnects.
    Down,
    /// `close_session` called.
    Closed,
}

struct VolumeSlot {
    generation: u16,
    state: Option<VolumeState>,
    device_path: String,
    mode: AccessMode,
    device: Option<Device>,
    /// CLOSE sent (state `Closing`).
    close_sent: bool,
    stats: VolumeStats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Data pieces (reads, writes, discards).
    Data,
    /// One FLUSH piece (a flush, or the tail of an emulated FUA write).
    Flush { sent: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Held until the volume is open again.
    WaitingForVolume,
    /// Pieces being sent and answered.
    Issuing {
        /// Bytes covered by pieces sent so far.
        issued: u32,
        /// Pieces sent and not answered.
        in_flight: u16,
        phase: Phase,
        /// The first piece error: no more pieces are sent.
        failure: Option<IoError>,
        /// A piece lost its transport: hold and re-issue the whole IO.
        retry: bool,
    },
    /// Finished, waiting to be reaped.
    Completed {
        result: Result<(), IoError>,
    },
}

struct IoSlot {
    state: SlotState,
    generation: u16,
    tag: u64,
    volume: VolumeId,
    kind: IoKind,
    fua: bool,
    /// FUA requested on a write-back volume without FUA: write, then flush.
    flush_after: bool,
    offset: u64,
    len: u32,
    submitted_at: u64,
    /// When the IO was first held (the hold timeout counts from here).
    held_since: Option<u64>,
    /// In the issue queue.
    queued: bool,
    completed_at: u64,
}

/// The initiator over a verbs provider `V`. See the module docs.
pub struct Initiator<V: Verbs> {
    client: Client<V>,
    config: InitiatorConfig,
    session: SessionState,
    /// The pending `SessionUp` is a reconnect.
    reconnected: bool,
    /// The session's `max_io_size` (from `SessionUp`).
    max_io_size: u32,
    volumes: Vec<VolumeSlot>,
    slots: Vec<IoSlot>,
    free_slots: Vec<u16>,
    issue_queue: VecDeque<u16>,
    completions: VecDeque<u16>,
    events: VecDeque<Event>,
    data: MemoryRegion,
    admin: MemoryRegion,
    stats: SessionStats,
}

fn limit(what: &'static str, found: u64, min: u64, max: u64) -> Result<(), InitError> {
    if found < min || found > max {
        return Err(InitError::Limits {
            what,
            found,
            min,
            max,
        });
    }
    Ok(())
}

impl<V: Verbs> Initiator<V> {
    /// Builds the initiator: the RTRS client (its tables and buffers), the
    /// IO slots, the registered data pool (`queue_depth × max_transfer`
    /// bytes) and the admin reply buffers. Nothing allocates afterwards on
    /// the IO path.
    ///
    /// # Errors
    ///
    /// [`InitError`]: a capacity out of range, or memory the provider could
    /// not give.
    pub fn new(mut verbs: V, config: InitiatorConfig) -> Result<Self, InitError> {
        limit("queue_depth", config.queue_depth.into(), 1, 4096)?;
        limit("max_transfer", config.max_transfer.into(), 4096, 1 << 30)?;
        limit("max_volumes", config.max_volumes.into(), 1, 1024)?;
        limit(
            "connections_per_path",
            config.connections_per_path.into(),
            1,
            config.rtrs.max_connections_per_path.into(),
        )?;
        let data_len = u64::from(config.queue_depth) * u64::from(config.max_transfer);
        let data_len = u32::try_from(data_len).map_err(|_| InitError::Limits {
            what: "queue_depth × max_transfer",
            found: data_len,
            min: 4096,
            max: u64::from(u32::MAX),
        })?;
        let admin_len = (u32::from(config.max_volumes) + 1) * ADMIN_SLOT;
        let access = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
        let mut region = |len: u32| {
            let buffer = verbs.alloc(len, 4096).map_err(|_| InitError::Memory {
                bytes: u64::from(len),
            })?;
            verbs.reg_mr(buffer, access).map_err(|_| InitError::Memory {
                bytes: u64::from(len),
            })
        };
        let data = region(data_len)?;
        let admin = region(admin_len)?;
        let client = Client::new(verbs, config.rtrs).map_err(InitError::Client)?;
        let qd = usize::from(config.queue_depth);
        let volumes = (0..config.max_volumes)
            .map(|_| VolumeSlot {
                generation: 0,
                state: None,
                device_path: String::new(),
                mode: AccessMode::ReadOnly,
                device: None,
                close_sent: false,
                stats: VolumeStats::default(),
            })
            .collect();
        let slots = (0..qd)
            .map(|_| IoSlot {
                state: SlotState::Free,
                generation: 0,
                tag: 0,
                volume: VolumeId {
                    index: 0,
                    generation: 0,
                },
                kind: IoKind::Read,
                fua: false,
                flush_after: false,
                offset: 0,
                len: 0,
                submitted_at: 0,
                held_since: None,
                queued: false,
                completed_at: 0,
            })
            .collect();
        Ok(Self {
            client,
            config,
            session: SessionState::Idle,
            reconnected: false,
            max_io_size: 0,
            volumes,
            slots,
            free_slots: (0..config.queue_depth).rev().collect(),
            issue_queue: VecDeque::with_capacity(qd),
            completions: VecDeque::with_capacity(qd),
            events: VecDeque::with_capacity(256),
            data,
            admin,
            stats: SessionStats::default(),
        })
    }

    // ----- accessors ---------------------------------------------------------

    /// The configuration.
    pub fn config(&self) -> &InitiatorConfig {
        &self.config
    }

    /// The RTRS client (path states, queue depth, uuids).
    pub fn client(&self) -> &Client<V> {
        &self.client
    }

    /// The RTRS client, mutably: for raw requests (tags below
    /// [`RAW_TAG_LIMIT`], see the module docs). Submitting other tags, or
    /// closing the session here, confuses the initiator.
    pub fn client_mut(&mut self) -> &mut Client<V> {
        &mut self.client
    }

    /// The verbs provider (the software HCA: frames in and out).
    pub fn verbs(&self) -> &V {
        self.client.verbs()
    }

    /// The verbs provider, mutably.
    pub fn verbs_mut(&mut self) -> &mut V {
        self.client.verbs_mut()
    }

    /// Whether the session is usable (SESS_INFO answered, a path up).
    pub fn is_ready(&self) -> bool {
        self.session == SessionState::Ready
    }

    /// The session's largest RTRS request payload (0 before the first
    /// `SessionUp`).
    pub fn max_io_size(&self) -> u32 {
        self.max_io_size
    }

    /// Session counters.
    pub fn session_stats(&self) -> SessionStats {
        let mut stats = self.stats;
        stats.events_dropped = self.client.events_dropped();
        stats
    }

    /// State and counters of path `path`.
    pub fn path_report(&self, path: u16) -> Option<PathReport> {
        Some(PathReport {
            status: self.client.path_status(path)?,
            stats: self.client.path_stats(path)?,
        })
    }

    fn volume_slot(&self, volume: VolumeId) -> Option<&VolumeSlot> {
        self.volumes
            .get(usize::from(volume.index))
            .filter(|v| v.generation == volume.generation && v.state.is_some())
    }

    /// A volume's state (`None` once closed).
    pub fn volume_state(&self, volume: VolumeId) -> Option<VolumeState> {
        self.volume_slot(volume).and_then(|v| v.state)
    }

    /// A volume's geometry (once its first OPEN was answered).
    pub fn volume_info(&self, volume: VolumeId) -> Option<VolumeInfo> {
        self.volume_slot(volume)
            .and_then(|v| v.device)
            .map(|device| VolumeInfo::new(volume, device))
    }

    /// A volume's counters.
    pub fn volume_stats(&self, volume: VolumeId) -> Option<VolumeStats> {
        self.volume_slot(volume).map(|v| v.stats)
    }

    /// IOs submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        usize::from(self.config.queue_depth) - self.free_slots.len()
    }

    /// IO slots free for submission.
    pub fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    // ----- session -----------------------------------------------------------

    /// Starts session `name` over `paths` (the targets' RTRS addresses,
    /// e.g. `10.0.0.1:1234`), `connections_per_path` connections each.
    /// Watch for [`Event::SessionUp`]; volumes may be opened before it.
    ///
    /// # Errors
    ///
    /// [`ConnectError`].
    pub fn connect(
        &mut self,
        name: &str,
        paths: &[SocketAddr],
        now: u64,
    ) -> Result<(), ConnectError> {
        let max = self.config.rtrs.max_paths;
        self.client
            .connect_session(name, paths, self.config.connections_per_path, now)
            .map_err(|error| match error {
                SessionError::AlreadyStarted => ConnectError::AlreadyStarted,
                SessionError::BadName => ConnectError::BadName,
                SessionError::BadPaths => ConnectError::BadPaths {
                    found: paths.len(),
                    max,
                },
            })?;
        self.session = SessionState::Connecting;
        Ok(())
    }

    /// Closes the session: every path is disconnected for good, held IO
    /// completes with [`IoError::Closed`], IO in flight as RTRS fails it,
    /// and every volume is forgotten ([`Event::Closed`]). Volumes should be
    /// closed first if the session is to stay up for others.
    pub fn close_session(&mut self, now: u64) {
        self.client.close_session(now);
        self.session = SessionState::Closed;
        for index in 0..self.slots.len() {
            if self.slots[index].state == SlotState::WaitingForVolume {
                self.complete(index, Err(IoError::Closed), now);
            }
        }
        for index in 0..self.volumes.len() {
            if self.volumes[index].state.is_some() {
                let id = self.id_of(index);
                self.free_volume(index);
                self.events.push_back(Event::Closed {
                    volume: id,
                    result: Ok(()),
                });
            }
        }
    }

    // ----- the run loop ----------------------------------------------------

    /// Does a bounded amount of work: one [`rtrs::client::Client::poll`]
    /// (bounded by its budgets), at most 256 of its events, the control
    /// messages owed, held IO, and pieces while permits last (at most one
    /// per permit). Returns whether anything happened.
    pub fn poll(&mut self, now: u64) -> bool {
        let mut busy = self.client.poll(now);
        for _ in 0..EVENT_BUDGET {
            let Some(event) = self.client.next_event() else {
                break;
            };
            busy = true;
            self.handle(event, now);
        }
        busy |= self.admin();
        busy |= self.resume_held(now);
        busy |= self.issue(now);
        busy
    }

    /// When [`Initiator::poll`] next has timer work (RTRS heartbeats,
    /// connects, reconnects; the hold timeout of held IO), if ever. The
    /// provider's own deadlines (the HCA's `poll_at`) are the caller's to
    /// add.
    pub fn poll_at(&self) -> Option<u64> {
        let hold = match self.config.on_disconnect {
            OnDisconnect::Hold { hold_timeout_ns } => self
                .slots
                .iter()
                .filter(|s| s.state == SlotState::WaitingForVolume)
                .filter_map(|s| s.held_since)
                .map(|since| since.saturating_add(hold_timeout_ns))
                .min(),
            OnDisconnect::Fail => None,
        };
        match (self.client.poll_at(), hold) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle(&mut self, event: RtrsEvent, now: u64) {
        match event {
            RtrsEvent::SessionUp {
                reconnected,
                max_io_size,
            } => {
                self.max_io_size = max_io_size;
                if reconnected {
                    self.stats.reconnects += 1;
                    self.reconnected = true;
                }
                if self.session != SessionState::Closed {
                    self.session = SessionState::SendingSessInfo;
                }
            }
            RtrsEvent::SessionDown => {
                self.stats.disconnects += 1;
                if self.session != SessionState::Closed {
                    self.session = SessionState::Down;
                }
                for index in 0..self.volumes.len() {
                    let next = match self.volumes[index].state {
                        Some(VolumeState::Open | VolumeState::Reopening) => {
                            VolumeState::Disconnected
                        }
                        Some(VolumeState::Opening) => VolumeState::WaitingForSession,
                        Some(VolumeState::Closing) => {
                            let id = self.id_of(index);
                            self.free_volume(index);
                            self.events.push_back(Event::Closed {
                                volume: id,
                                result: Ok(()),
                            });
                            continue;
                        }
                        _ => continue,
                    };
                    self.volumes[index].state = Some(next);
                }
                self.events.push_back(Event::SessionDown);
            }
            RtrsEvent::PathUp { path } => self.events.push_back(Event::PathUp { path }),
            RtrsEvent::PathDown { path, reason } => {
                self.events.push_back(Event::PathDown { path, reason });
            }
            RtrsEvent::PathConnectFailed { path, reason } => {
                self.events
                    .push_back(Event::PathConnectFailed { path, reason });
            }
            RtrsEvent::PathClosed { path } => self.events.push_back(Event::PathClosed { path }),
            RtrsEvent::IoCompleted {
                tag,
                errno,
                answered_on,
                read,
            } => {
                if tag < RAW_TAG_LIMIT {
                    self.events
                        .push_back(Event::RawCompleted { tag, errno, read });
                    return;
                }
                // Completed by the RTRS client itself: no path took it
                // (rtrs.md §7); a server's own ECONNABORTED is an answer.
                let aborted = answered_on.is_none();
                let (kind, generation, index) = split_tag(tag);
                let index = usize::from(index);
                match kind {
                    KIND_IO => self.io_answered(index, generation, errno, aborted, now),
                    KIND_OPEN => self.open_answered(index, generation, errno, aborted, read),
                    KIND_CLOSE => self.close_answered(index, generation, errno, aborted),
                    KIND_SESS_INFO => self.sess_info_answered(aborted),
                    _ => self.stats.stale_completions += 1,
                }
            }
            _ => {}
        }
    }

    fn sess_info_answered(&mut self, aborted: bool) {
        if self.session != SessionState::WaitingForSessInfo {
            self.stats.stale_completions += 1;
            return;
        }
        if aborted {
            self.session = if self.client.is_up() {
                SessionState::SendingSessInfo
            } else {
                SessionState::Down
            };
            return;
        }
        // Any answer will do: the version only gates `prio` (rnbd.md §2.3),
        // and a server refusing SESS_INFO still serves OPEN.
        self.session_ready();
    }

    /// The next control event, oldest first.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Reaps the oldest completed IO: calls `f` with the completion and,
    /// for a successful read, the data (`len` bytes, straight from the IO
    /// slot's registered buffer; empty otherwise), frees the slot and
    /// returns `f`'s result. `None` if nothing has completed.
    pub fn next_completion<R>(&mut self, f: impl FnOnce(&Completion, &[u8]) -> R) -> Option<R> {
        let index = usize::from(self.completions.pop_front()?);
        let slot = &self.slots[index];
        let SlotState::Completed { result } = slot.state else {
            return None;
        };
        let completion = Completion {
            tag: slot.tag,
            volume: slot.volume,
            kind: slot.kind,
            offset: slot.offset,
            len: slot.len,
            result,
            latency_ns: slot.completed_at.saturating_sub(slot.submitted_at),
        };
        let data_len = if slot.kind == IoKind::Read && result.is_ok() {
            slot.len
        } else {
            0
        };
        let base = index as u32 * self.config.max_transfer;
        let mut call = Some(f);
        let mut out = None;
        let _ = self
            .client
            .verbs()
            .with_slice(self.data.handle, base, data_len, |data| {
                if let Some(f) = call.take() {
                    out = Some(f(&completion, data));
                }
            });
        if let Some(f) = call.take() {
            out = Some(f(&completion, &[]));
        }
        self.release(index);
        out
    }

    /// Completed IOs waiting to be reaped.
    pub fn completions_ready(&self) -> usize {
        self.completions.len()
    }
}
