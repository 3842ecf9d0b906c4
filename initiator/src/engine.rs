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

    // ----- volumes -----------------------------------------------------------

    fn id_of(&self, index: usize) -> VolumeId {
        VolumeId {
            index: index as u16,
            generation: self.volumes[index].generation,
        }
    }

    fn free_volume(&mut self, index: usize) {
        let slot = &mut self.volumes[index];
        slot.state = None;
        slot.device = None;
        slot.close_sent = false;
        slot.generation = slot.generation.wrapping_add(1);
    }

    /// Opens `device_path` (relative to the server's device search path)
    /// as `mode`. The answer arrives as [`Event::Opened`] for the returned
    /// id; the OPEN is sent once the session is ready.
    ///
    /// # Errors
    ///
    /// [`OpenError::BadPath`], [`OpenError::AlreadyOpen`],
    /// [`OpenError::TooManyVolumes`], [`OpenError::Disconnected`] after
    /// [`Initiator::close_session`].
    pub fn open(&mut self, device_path: &str, mode: AccessMode) -> Result<VolumeId, OpenError> {
        let mut header = [0u8; HEADER_LEN];
        rnbd_client::open(device_path, mode, &mut header).map_err(OpenError::BadPath)?;
        if self.session == SessionState::Closed {
            return Err(OpenError::Disconnected);
        }
        if let Some(index) = self
            .volumes
            .iter()
            .position(|v| v.state.is_some() && v.device_path == device_path)
        {
            return Err(OpenError::AlreadyOpen(self.id_of(index)));
        }
        let index = self.volumes.iter().position(|v| v.state.is_none()).ok_or(
            OpenError::TooManyVolumes {
                max: self.config.max_volumes,
            },
        )?;
        let slot = &mut self.volumes[index];
        slot.state = Some(VolumeState::WaitingForSession);
        slot.device_path.clear();
        slot.device_path.push_str(device_path);
        slot.mode = mode;
        slot.device = None;
        slot.close_sent = false;
        slot.stats = VolumeStats::default();
        let id = self.id_of(index);
        self.admin();
        Ok(id)
    }

    /// Closes a volume: sends CLOSE (answered with [`Event::Closed`]), or,
    /// if the session is down or the volume lost, forgets it at once (the
    /// server already did) and queues [`Event::Closed`].
    ///
    /// # Errors
    ///
    /// [`CloseError`]: unknown volume, IO of the volume not yet completed,
    /// an OPEN in flight, or already closing.
    pub fn close(&mut self, volume: VolumeId) -> Result<(), CloseError> {
        let state = self
            .volume_state(volume)
            .ok_or(CloseError::UnknownVolume(volume))?;
        let in_flight = self
            .slots
            .iter()
            .filter(|s| {
                s.volume == volume
                    && !matches!(s.state, SlotState::Free | SlotState::Completed { .. })
            })
            .count() as u32;
        if in_flight > 0 {
            return Err(CloseError::Busy { in_flight });
        }
        let index = usize::from(volume.index);
        match state {
            VolumeState::Closing => Err(CloseError::AlreadyClosing),
            VolumeState::Opening | VolumeState::Reopening => Err(CloseError::Opening),
            VolumeState::Open => {
                self.volumes[index].state = Some(VolumeState::Closing);
                self.volumes[index].close_sent = false;
                self.admin();
                Ok(())
            }
            VolumeState::WaitingForSession | VolumeState::Disconnected | VolumeState::Lost(_) => {
                self.free_volume(index);
                self.events.push_back(Event::Closed {
                    volume,
                    result: Ok(()),
                });
                Ok(())
            }
        }
    }

    /// Sends what the control path owes: SESS_INFO after `SessionUp`, then
    /// OPEN for volumes waiting for it and CLOSE for closing ones, as far
    /// as RTRS permits allow. Returns whether anything was sent.
    fn admin(&mut self) -> bool {
        let mut sent = false;
        if self.session == SessionState::SendingSessInfo {
            let mut header = [0u8; HEADER_LEN];
            let Ok(outgoing) = rnbd_client::sess_info(&mut header) else {
                return false;
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(KIND_SESS_INFO, 0, 0),
                header: &header[..outgoing.user_header_len],
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: self.admin,
                        offset: u32::from(self.config.max_volumes) * ADMIN_SLOT,
                        len: outgoing.data_len,
                    },
                },
                admin: true,
                hint: None,
            });
            match result {
                Ok(()) => {
                    sent = true;
                    self.session = SessionState::WaitingForSessInfo;
                }
                Err(RtrsSubmitError::NoPermit | RtrsSubmitError::Post(PostError::QueueFull)) => {
                    return false
                }
                Err(
                    RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(PostError::NotConnected | PostError::UnknownConnection),
                ) => {
                    // SessionDown follows; SessionUp sends it again.
                    return false;
                }
                // The server's header room cannot hold 36 bytes: it cannot
                // serve RNBD at all. Carry on without SESS_INFO (version 0).
                Err(_) => self.session_ready(),
            }
        }
        if self.session != SessionState::Ready {
            return sent;
        }
        for index in 0..self.volumes.len() {
            let slot = &self.volumes[index];
            let generation = slot.generation;
            let mut header = [0u8; HEADER_LEN];
            let (kind, next, outgoing, read) = match slot.state {
                Some(VolumeState::WaitingForSession | VolumeState::Disconnected) => {
                    let Ok(outgoing) = rnbd_client::open(&slot.device_path, slot.mode, &mut header)
                    else {
                        continue;
                    };
                    let next = if slot.state == Some(VolumeState::WaitingForSession) {
                        VolumeState::Opening
                    } else {
                        VolumeState::Reopening
                    };
                    (KIND_OPEN, next, outgoing, true)
                }
                Some(VolumeState::Closing) if !slot.close_sent => {
                    let Some(Ok(outgoing)) = slot.device.map(|d| d.close(&mut header)) else {
                        continue;
                    };
                    (KIND_CLOSE, VolumeState::Closing, outgoing, false)
                }
                _ => continue,
            };
            let direction = if read {
                Direction::Read {
                    dest: ReadBuffer {
                        region: self.admin,
                        offset: index as u32 * ADMIN_SLOT,
                        len: outgoing.data_len,
                    },
                }
            } else {
                Direction::Write { data: Sgl::new() }
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(kind, generation, index as u16),
                header: &header[..outgoing.user_header_len],
                direction,
                admin: true,
                hint: None,
            });
            match result {
                Ok(()) => {
                    sent = true;
                    let slot = &mut self.volumes[index];
                    slot.state = Some(next);
                    slot.close_sent = kind == KIND_CLOSE;
                }
                Err(
                    RtrsSubmitError::NoPermit
                    | RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(
                        PostError::QueueFull
                        | PostError::NotConnected
                        | PostError::UnknownConnection,
                    ),
                ) => break,
                Err(_) => {
                    // Cannot be carried (header room): fail it.
                    let id = self.id_of(index);
                    if kind == KIND_CLOSE {
                        self.free_volume(index);
                        self.events.push_back(Event::Closed {
                            volume: id,
                            result: Ok(()),
                        });
                    } else {
                        self.open_failed(index, OpenError::Disconnected);
                    }
                }
            }
        }
        sent
    }

    fn session_ready(&mut self) {
        self.session = SessionState::Ready;
        let reconnected = core::mem::take(&mut self.reconnected);
        self.events.push_back(Event::SessionUp { reconnected });
    }

    fn open_failed(&mut self, index: usize, error: OpenError) {
        let id = self.id_of(index);
        match self.volumes[index].state {
            Some(VolumeState::Opening | VolumeState::WaitingForSession) => {
                self.free_volume(index);
                self.events.push_back(Event::Opened {
                    volume: id,
                    result: Err(error),
                });
            }
            Some(_) => {
                self.volumes[index].state = Some(VolumeState::Lost(error));
                self.events
                    .push_back(Event::ReopenFailed { volume: id, error });
            }
            None => {}
        }
    }

    fn piece_max(&self, logical_block_size: u16) -> u32 {
        let block = u32::from(logical_block_size).max(512);
        let max = self.max_io_size.min(self.config.max_transfer);
        (max / block * block).max(block)
    }

    fn open_answered(
        &mut self,
        index: usize,
        generation: u16,
        errno: u16,
        aborted: bool,
        read: Option<ReadBuffer>,
    ) {
        let Some(slot) = self
            .volumes
            .get(index)
            .filter(|v| v.generation == generation)
        else {
            self.stats.stale_completions += 1;
            return;
        };
        let (state, mode) = (slot.state, slot.mode);
        if !matches!(state, Some(VolumeState::Opening | VolumeState::Reopening)) {
            self.stats.stale_completions += 1;
            return;
        }
        if aborted {
            // No path carried it: send it again once the session is ready.
            self.volumes[index].state = Some(if state == Some(VolumeState::Opening) {
                VolumeState::WaitingForSession
            } else {
                VolumeState::Disconnected
            });
            return;
        }
        let mut response = [0u8; rnbd::wire::OpenRsp::LEN];
        let copied = read.is_some_and(|read| {
            read.len as usize >= response.len()
                && self.client.read_response(&read, &mut response).is_ok()
        });
        let result = if errno != 0 || copied {
            Device::from_open_rsp(errno, &response, mode)
        } else {
            Err(ClientError::BadResponse(rnbd::wire::ParseError::Truncated))
        };
        match result {
            Ok(device) => {
                let device =
                    device.with_max_io_size(self.piece_max(device.geometry.logical_block_size));
                let id = self.id_of(index);
                let slot = &mut self.volumes[index];
                slot.device = Some(device);
                slot.state = Some(VolumeState::Open);
                let info = VolumeInfo::new(id, device);
                if state == Some(VolumeState::Opening) {
                    self.events.push_back(Event::Opened {
                        volume: id,
                        result: Ok(info),
                    });
                } else {
                    slot.stats.reopens += 1;
                    self.events.push_back(Event::Reopened { volume: id, info });
                }
            }
            Err(ClientError::Remote(error)) => self.open_failed(index, OpenError::Remote(error)),
            Err(error) => self.open_failed(index, OpenError::BadResponse(error)),
        }
    }

    fn close_answered(&mut self, index: usize, generation: u16, errno: u16, aborted: bool) {
        let matches = self
            .volumes
            .get(index)
            .is_some_and(|v| v.generation == generation && v.state == Some(VolumeState::Closing));
        if !matches {
            self.stats.stale_completions += 1;
            return;
        }
        let id = self.id_of(index);
        self.free_volume(index);
        let result = if aborted {
            // The session went away: the server forgot the device anyway.
            Ok(())
        } else {
            rnbd_client::io_status(errno).map_err(|error| match error {
                ClientError::Remote(remote) => IoError::Remote(remote),
                other => IoError::Refused(other),
            })
        };
        self.events.push_back(Event::Closed { volume: id, result });
    }

    // ----- IO submission ---------------------------------------------------

    /// Submits a read of `len` bytes at byte `offset`; the data comes with
    /// the completion ([`Initiator::next_completion`]).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_read(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Read, offset, u64::from(len))?;
        self.start(index, now, tag, volume, IoKind::Read, offset, len, false);
        Ok(())
    }

    /// Submits a write of `data` at byte `offset` (copied into the IO
    /// slot's registered buffer now), durable before completion if `fua`.
    /// On a volume without write cache every write is durable and no FUA
    /// flag is sent; on a write-back volume without native FUA the write
    /// is followed by a FLUSH before it completes.
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_write(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), SubmitError> {
        let len = data.len() as u64;
        let index = self.prepare(volume, IoKind::Write, offset, len)?;
        let base = index as u32 * self.config.max_transfer;
        let handle = self.data.handle;
        if self.client.verbs_mut().write(handle, base, data).is_err() {
            // `prepare` checked the length against the slot: cannot happen.
            self.release(index);
            return Err(SubmitError::TooLarge {
                len,
                max: self.config.max_transfer,
            });
        }
        self.start(
            index,
            now,
            tag,
            volume,
            IoKind::Write,
            offset,
            len as u32,
            fua,
        );
        Ok(())
    }

    /// Submits a flush of the volume's write cache. On a volume without one
    /// it completes at once, successfully, without a request (nothing is
    /// volatile; Linux strips such flushes too, rnbd.md §3).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_flush(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Flush, 0, 0)?;
        self.start(index, now, tag, volume, IoKind::Flush, 0, 0, false);
        Ok(())
    }

    /// Submits a discard of `len` bytes at byte `offset` (split into
    /// pieces of at most the volume's discard limit). Reads of a discarded
    /// range return what the volume says (zeroes on Brick RAM volumes).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_discard(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Discard, offset, u64::from(len))?;
        self.start(index, now, tag, volume, IoKind::Discard, offset, len, false);
        Ok(())
    }

    /// Checks a submission against the volume and takes an IO slot.
    fn prepare(
        &mut self,
        volume: VolumeId,
        kind: IoKind,
        offset: u64,
        len: u64,
    ) -> Result<usize, SubmitError> {
        let slot = self
            .volume_slot(volume)
            .ok_or(SubmitError::UnknownVolume(volume))?;
        let state = slot.state.ok_or(SubmitError::UnknownVolume(volume))?;
        let usable = match state {
            VolumeState::Open => true,
            VolumeState::Disconnected | VolumeState::Reopening => false,
            _ => return Err(SubmitError::NotOpen { volume, state }),
        };
        if !usable && self.config.on_disconnect == OnDisconnect::Fail {
            return Err(SubmitError::Disconnected);
        }
        let device = slot.device.ok_or(SubmitError::NotOpen { volume, state })?;
        let writes = matches!(kind, IoKind::Write | IoKind::Discard);
        if writes && !slot.mode.is_writable() {
            return Err(SubmitError::ReadOnly(volume));
        }
        if kind != IoKind::Flush {
            if len == 0 {
                return Err(SubmitError::Empty);
            }
            let block = u64::from(device.geometry.logical_block_size.max(512));
            if offset % block != 0 || len % block != 0 {
                return Err(SubmitError::Misaligned {
                    offset,
                    len,
                    block_size: block as u32,
                });
            }
            let capacity = device.capacity_bytes();
            if offset.checked_add(len).is_none_or(|end| end > capacity) {
                return Err(SubmitError::OutOfRange {
                    offset,
                    len,
                    capacity,
                });
            }
        }
        match kind {
            IoKind::Read | IoKind::Write if len > u64::from(self.config.max_transfer) => {
                return Err(SubmitError::TooLarge {
                    len,
                    max: self.config.max_transfer,
                });
            }
            IoKind::Discard if device.geometry.max_discard_sectors == 0 => {
                return Err(SubmitError::DiscardUnsupported(volume));
            }
            _ => {}
        }
        let index = self.free_slots.pop().ok_or(SubmitError::QueueFull {
            queue_depth: self.config.queue_depth,
        })?;
        Ok(usize::from(index))
    }

    fn release(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(index as u16);
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        index: usize,
        now: u64,
        tag: u64,
        volume: VolumeId,
        kind: IoKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) {
        let device = self.volumes[usize::from(volume.index)].device;
        let write_cache = device.is_some_and(|d| d.has_write_cache());
        let native_fua = device.is_some_and(|d| d.policy.contains(CachePolicy::FUA));
        let slot = &mut self.slots[index];
        slot.tag = tag;
        slot.volume = volume;
        slot.kind = kind;
        slot.fua = fua && write_cache && native_fua;
        slot.flush_after = kind == IoKind::Write && fua && write_cache && !native_fua;
        slot.offset = offset;
        slot.len = len;
        slot.submitted_at = now;
        slot.held_since = None;
        if kind == IoKind::Flush && !write_cache {
            self.complete(index, Ok(()), now);
            return;
        }
        if self.volume_ready(volume) {
            self.begin(index);
            self.issue(now);
        } else {
            self.hold(index, now);
        }
    }

    fn volume_ready(&self, volume: VolumeId) -> bool {
        self.session == SessionState::Ready && self.volume_state(volume) == Some(VolumeState::Open)
    }

    /// Puts slot `index` into `Issuing` from the start and queues it.
    fn begin(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Issuing {
            issued: 0,
            in_flight: 0,
            phase: if slot.kind == IoKind::Flush {
                Phase::Flush { sent: false }
            } else {
                Phase::Data
            },
            failure: None,
            retry: false,
        };
        self.enqueue(index);
    }

    fn enqueue(&mut self, index: usize) {
        if !self.slots[index].queued {
            self.slots[index].queued = true;
            self.issue_queue.push_back(index as u16);
        }
    }

    /// Holds slot `index` until its volume is open again, or completes it
    /// with the reason it cannot wait.
    fn hold(&mut self, index: usize, now: u64) {
        let volume = self.slots[index].volume;
        let state = self.volume_state(volume);
        let since = *self.slots[index].held_since.get_or_insert(now);
        let held_ns = now.saturating_sub(since);
        let error = match (state, self.config.on_disconnect) {
            _ if self.session == SessionState::Closed => Some(IoError::Closed),
            (None | Some(VolumeState::Closing), _) => Some(IoError::Closed),
            (Some(VolumeState::Lost(error)), _) => Some(IoError::VolumeLost(error)),
            (_, OnDisconnect::Fail) => Some(IoError::Disconnected { held_ns }),
            (_, OnDisconnect::Hold { hold_timeout_ns }) if held_ns >= hold_timeout_ns => {
                Some(IoError::Disconnected { held_ns })
            }
            _ => None,
        };
        match error {
            Some(error) => self.complete(index, Err(error), now),
            None => {
                if self.slots[index].state != SlotState::WaitingForVolume {
                    self.slots[index].state = SlotState::WaitingForVolume;
                    self.volumes[usize::from(volume.index)].stats.held += 1;
                }
            }
        }
    }

    /// Finishes slot `index` and queues its completion.
    fn complete(&mut self, index: usize, result: Result<(), IoError>, now: u64) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Completed { result };
        slot.completed_at = now;
        let latency = now.saturating_sub(slot.submitted_at);
        let (kind, len, volume) = (slot.kind, u64::from(slot.len), slot.volume);
        self.completions.push_back(index as u16);
        let Some(volume) = self
            .volumes
            .get_mut(usize::from(volume.index))
            .filter(|v| v.generation == volume.generation && v.state.is_some())
        else {
            return;
        };
        let stats = &mut volume.stats;
        if result.is_err() {
            stats.errors += 1;
            return;
        }
        stats.latency.record(latency);
        match kind {
            IoKind::Read => {
                stats.reads += 1;
                stats.read_bytes += len;
            }
            IoKind::Write => {
                stats.writes += 1;
                stats.written_bytes += len;
            }
            IoKind::Flush => stats.flushes += 1,
            IoKind::Discard => {
                stats.discards += 1;
                stats.discarded_bytes += len;
            }
        }
    }

    /// Sends pieces from the issue queue while RTRS has permits.
    fn issue(&mut self, now: u64) -> bool {
        let mut sent = false;
        while let Some(&index) = self.issue_queue.front() {
            let index = usize::from(index);
            let (progress, blocked) = self.issue_slot(index, now);
            sent |= progress;
            if blocked {
                break;
            }
            self.issue_queue.pop_front();
            self.slots[index].queued = false;
        }
        sent
    }

    /// Sends slot `index`'s next pieces. Returns (sent any, blocked on
    /// permits).
    fn issue_slot(&mut self, index: usize, now: u64) -> (bool, bool) {
        let mut sent = false;
        loop {
            let slot = &self.slots[index];
            let SlotState::Issuing {
                issued,
                in_flight,
                phase,
                failure,
                retry,
            } = slot.state
            else {
                return (sent, false);
            };
            if failure.is_some() || retry {
                return (sent, false);
            }
            let volume = slot.volume;
            let device = match (
                self.volume_ready(volume),
                self.volumes[usize::from(volume.index)].device,
            ) {
                (true, Some(device)) => device,
                _ => {
                    // The volume went away under the IO: re-issue it later.
                    self.set_retry(index, now);
                    return (sent, false);
                }
            };
            let base = index as u32 * self.config.max_transfer;
            let mut header = [0u8; HEADER_LEN];
            let (built, direction, piece, next_phase) = match phase {
                Phase::Data => {
                    if issued >= slot.len {
                        return (sent, false);
                    }
                    let remaining = slot.len - issued;
                    let at = slot.offset + u64::from(issued);
                    match slot.kind {
                        IoKind::Read => {
                            let piece = remaining.min(device.max_io_size);
                            (
                                device.read(at, piece, &mut header),
                                Direction::Read {
                                    dest: ReadBuffer {
                                        region: self.data,
                                        offset: base + issued,
                                        len: piece,
                                    },
                                },
                                piece,
                                Phase::Data,
                            )
                        }
                        IoKind::Write => {
                            let piece = remaining.min(device.max_io_size);
                            (
                                device.write(at, piece, slot.fua, &mut header),
                                Direction::Write {
                                    data: Sgl::single(self.data.sge(base + issued, piece)),
                                },
                                piece,
                                Phase::Data,
                            )
                        }
                        IoKind::Discard | IoKind::Flush => {
                            let max = device.geometry.max_discard_sectors.saturating_mul(512);
                            let block = u32::from(device.geometry.logical_block_size.max(512));
                            let piece = remaining.min((max / block * block).max(block));
                            (
                                device.discard(at, piece, &mut header),
                                Direction::Write { data: Sgl::new() },
                                piece,
                                Phase::Data,
                            )
                        }
                    }
                }
                Phase::Flush { sent: true } => return (sent, false),
                Phase::Flush { sent: false } => (
                    device.flush(&mut header),
                    Direction::Read {
                        dest: ReadBuffer {
                            region: self.data,
                            offset: base,
                            len: 0,
                        },
                    },
                    0,
                    Phase::Flush { sent: true },
                ),
            };
            let outgoing = match built {
                Ok(outgoing) => outgoing,
                Err(error) => {
                    self.set_failure(index, IoError::Refused(error), now);
                    return (sent, false);
                }
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(KIND_IO, self.slots[index].generation, index as u16),
                header: &header[..outgoing.user_header_len],
                direction,
                admin: false,
                hint: Some(index as u16),
            });
            match result {
                Ok(()) => {
                    sent = true;
                    self.slots[index].state = SlotState::Issuing {
                        issued: issued + piece,
                        in_flight: in_flight + 1,
                        phase: next_phase,
                        failure: None,
                        retry: false,
                    };
                    self.volumes[usize::from(volume.index)].stats.requests += 1;
                }
                // Out of permits or send-queue room: wait for completions.
                Err(RtrsSubmitError::NoPermit | RtrsSubmitError::Post(PostError::QueueFull)) => {
                    self.stats.permit_waits += 1;
                    return (sent, true);
                }
                // The path went away under us: re-issue once it is back.
                Err(
                    RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(PostError::NotConnected | PostError::UnknownConnection),
                ) => {
                    self.set_retry(index, now);
                    return (sent, false);
                }
                Err(error) => {
                    self.set_failure(index, IoError::Transport(error), now);
                    return (sent, false);
                }
            }
        }
    }

    fn set_retry(&mut self, index: usize, now: u64) {
        if let SlotState::Issuing { retry, .. } = &mut self.slots[index].state {
            *retry = true;
        }
        self.settle(index, now);
    }

    fn set_failure(&mut self, index: usize, error: IoError, now: u64) {
        if let SlotState::Issuing { failure, .. } = &mut self.slots[index].state {
            failure.get_or_insert(error);
        }
        self.settle(index, now);
    }

    /// Ends slot `index` if nothing of it is in flight and nothing more is
    /// to be sent: completes it, holds it for a retry, or moves an
    /// emulated FUA write on to its FLUSH.
    fn settle(&mut self, index: usize, now: u64) {
        let slot = &self.slots[index];
        let SlotState::Issuing {
            issued,
            in_flight,
            phase,
            failure,
            retry,
        } = slot.state
        else {
            return;
        };
        if in_flight > 0 {
            return;
        }
        if let Some(error) = failure {
            self.complete(index, Err(error), now);
        } else if retry {
            self.hold(index, now);
        } else {
            match phase {
                Phase::Data if issued < slot.len => {}
                Phase::Data if slot.flush_after => {
                    self.slots[index].state = SlotState::Issuing {
                        issued,
                        in_flight: 0,
                        phase: Phase::Flush { sent: false },
                        failure: None,
                        retry: false,
                    };
                    self.enqueue(index);
                }
                Phase::Flush { sent: false } => {}
                _ => self.complete(index, Ok(()), now),
            }
        }
    }

    fn io_answered(&mut self, index: usize, generation: u16, errno: u16, aborted: bool, now: u64) {
        let Some(slot) = self
            .slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
        else {
            self.stats.stale_completions += 1;
            return;
        };
        let SlotState::Issuing {
            in_flight,
            failure,
            retry,
            ..
        } = &mut slot.state
        else {
            self.stats.stale_completions += 1;
            return;
        };
        if *in_flight == 0 {
            self.stats.stale_completions += 1;
            return;
        }
        *in_flight -= 1;
        match errno {
            0 => {}
            // The RTRS client's own "no path took it" (rtrs.md §7).
            _ if aborted => *retry = true,
            errno => {
                let error = match rnbd_client::io_status(errno) {
                    Err(ClientError::Remote(remote)) => IoError::Remote(remote),
                    Err(other) => IoError::Refused(other),
                    Ok(()) => IoError::Refused(ClientError::Empty),
                };
                failure.get_or_insert(error);
            }
        }
        self.settle(index, now);
    }

    /// Re-issues held IO whose volume is open again; completes held IO
    /// that timed out or whose volume is lost or closed.
    fn resume_held(&mut self, now: u64) -> bool {
        let mut busy = false;
        for index in 0..self.slots.len() {
            if self.slots[index].state != SlotState::WaitingForVolume {
                continue;
            }
            let volume = self.slots[index].volume;
            if self.volume_ready(volume) {
                busy = true;
                self.volumes[usize::from(volume.index)].stats.reissued += 1;
                self.begin(index);
            } else {
                self.hold(index, now);
                busy |= self.slots[index].state != SlotState::WaitingForVolume;
            }
        }
        busy
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
