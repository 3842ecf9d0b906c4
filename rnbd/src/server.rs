//! RNBD server logic, sans-IO: sessions, device tables, OPEN/CLOSE/IO.
//!
//! The RTRS server delivers each request's user header (an RNBD message),
//! the length of the request's data area and its RTRS direction; this module
//! decides everything RNBD decides (rnbd.md §4) and hands back an [`Action`]:
//! answer now, or execute a [`BlockRequest`] on a volume and report its
//! result through [`Server::complete`]. It never touches a volume, a clock
//! or the network itself, and never allocates: device tables are fixed
//! arrays ([`crate::config`]).
//!
//! # Shape
//!
//! * [`Server`] holds what is server-wide: per-volume writer counts (the
//!   write-sharing rule of rnbd.md §4.2 step 6 spans sessions) and per-volume
//!   statistics.
//! * [`Session`] holds one RNBD session (one RTRS session): the negotiated
//!   version, the device table keyed by device id and the session's
//!   statistics. The engine owns one per RTRS session and passes it in.
//! * [`Exports`] is how the server resolves an OPEN's `device_path`: the
//!   engine implements it per session from the manifest
//!   (`Manifest::volume_by_device_path` + `Manifest::access`), so names are
//!   resolved through an explicit export table, never a file system
//!   (rnbd.md §8.3 #29).
//!
//! # Parse, then execute
//!
//! [`Server::process`] parses the message and checks every rnbd.md §8.3 item
//! before anything reaches a volume: message length and type (#24, #25),
//! RTRS direction (#26), response buffer size (#27), path rules (#28, #29),
//! access mode, access list and writer limits (#30, #31), device id (#32),
//! op (#33), `bi_size` against the data actually sent (#34), range with
//! checked arithmetic and logical-block alignment (#35), writes through a
//! read-only open (#36), discard support and size (#37); `prio` is ignored
//! (#38) and devices per session are capped (#39). Only then does it return
//! [`Action::Submit`]; the engine only does IO.
//!
//! # Status mapping
//!
//! Every refusal and every volume failure is an [`Error`]; [`status_for`] is
//! the one function that turns it into the errno of the RTRS response. The
//! table (rnbd.md §4.5, §8.3):
//!
//! | Error | errno | Why |
//! |---|---|---|
//! | `Malformed(e)` | `e.errno()`: EOPNOTSUPP for an unknown op, else EINVAL | §4.5, §8.3 #24-#35 |
//! | `NotARequest`, `WrongDirection`, `ResponseBufferTooSmall` | EINVAL | §8.3 #25-#27 |
//! | `NoSuchVolume` | ENOENT | what `blkdev_get_by_path` gives Linux (§4.2 step 5) |
//! | `AccessDenied` | EACCES | access list (§8.3 #30), as a permission error opening the device |
//! | `WriterLimit` | EPERM | Linux's writer rule (§4.2 step 6) |
//! | `ModeUpgrade` | EPERM | §8.3 #31 |
//! | `AlreadyMapped` | EEXIST | Linux's sysfs clash (§4.2 step 7) |
//! | `TooManyDevices` | EMFILE | §8.3 #39: a per-session cap, told apart from ENOMEM |
//! | `BadGeometry` | EIO | the engine described a volume OPEN_RSP cannot carry |
//! | `UnknownDevice` | ENOTCONN | §4.4 step 1, §8.3 #32 |
//! | `ReadOnly` | EPERM | §8.3 #36 (first choice there) |
//! | `FlushUnsupported`, `DiscardUnsupported` | EOPNOTSUPP | §8.3 #37, what the block layer gives Linux |
//! | `DataLengthMismatch`, `OutOfRange`, `Misaligned`, `DiscardTooLarge` | EINVAL | §8.3 #34, #35, #37 |
//! | `Io(Media / NoSpace / TimedOut / Unsupported / Resource / Again)` | EIO / ENOSPC / ETIMEDOUT / EOPNOTSUPP / ENOMEM / EAGAIN | `blk_status_to_errno` (§4.5) |
//!
//! Linux answers a range past the end with EIO (from the block layer); Brick
//! refuses it before submission with EINVAL, which the stock client maps to
//! the same `BLK_STS_IOERR` and Brick's client reports precisely.
//!
//! # Close with IO in flight (rnbd.md §4.3, §4.6)
//!
//! CLOSE takes the id out of service at once (new IO gets ENOTCONN); if IO
//! is in flight the device becomes [`DeviceState::Draining`] and
//! [`Action::CloseDeferred`] is returned; the completion of the last IO
//! names the CLOSE's tag in [`Completion::close_done`], and only then is the
//! success reply sent and the id freed. CLOSE of an unknown id succeeds
//! (Linux does the same). [`Server::end_session`] does the same for every
//! device when the session goes.
//!
//! # Example
//!
//! ```
//! use rnbd::server::{
//!     Action, Export, Exports, Grant, LookupError, Request, Server, Session, VolumeId,
//!     VolumeInfo,
//! };
//! use rnbd::wire::{AccessMode, Open, OpenRsp, RtrsDirection};
//!
//! /// The engine's export table for one session (normally from the manifest).
//! struct OneVolume;
//! impl Exports for OneVolume {
//!     fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
//!         match device_path {
//!             "vol0" => Ok(Export {
//!                 volume: VolumeInfo::new(VolumeId::try_new(0).unwrap(), 131_072),
//!                 grant: Grant::ReadWrite,
//!             }),
//!             _ => Err(LookupError::NotFound),
//!         }
//!     }
//! }
//!
//! let mut server = Server::new();
//! let mut session = Session::new();
//! let mut user_header = [0u8; Open::LEN];
//! Open { access_mode: AccessMode::ReadWrite, device_path: "vol0" }
//!     .emit(&mut user_header)
//!     .unwrap();
//! let request = Request {
//!     user_header: &user_header,
//!     data_len: OpenRsp::LEN,
//!     direction: RtrsDirection::Read,
//!     tag: 0,
//! };
//! let mut chunk = [0u8; OpenRsp::LEN];
//! let action = server.process(&mut session, &OneVolume, &request, &mut chunk);
//! assert_eq!(action, Action::Respond { len: OpenRsp::LEN });
//! assert_eq!(OpenRsp::parse(&chunk).unwrap().nsectors, 131_072);
//! ```
//!
//! # Device ids
//!
//! The lowest free id from 0 (rnbd.md §2.8), below
//! [`MAX_DEVICES_PER_SESSION`]; an id is reused only once its device has
//! fully closed.

use core::fmt;

use heapless::String;

use crate::config::{MAX_DEVICES_PER_SESSION, MAX_VOLUMES};
use crate::errno;
use crate::wire::{
    AccessMode, CachePolicy, Close, Io, IoFlags, IoOp, Message, Open, OpenRsp, ParseError,
    RtrsDirection, SessInfo, SessInfoRsp, DEVICE_PATH_LEN, PROTOCOL_VERSION_MAJOR, SECTOR_SIZE,
};

/// Index of a volume in the engine's volume table (the manifest's volume
/// index). Always below [`MAX_VOLUMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VolumeId(u16);

impl VolumeId {
    /// The id of volume `index`, `None` if `index >= MAX_VOLUMES`.
    pub const fn try_new(index: usize) -> Option<VolumeId> {
        if index < MAX_VOLUMES {
            Some(VolumeId(index as u16))
        } else {
            None
        }
    }

    /// The volume index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Discard support of a volume, as advertised in OPEN_RSP (rnbd.md §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiscardLimits {
    /// Largest discard in 512-byte sectors; non-zero.
    pub max_sectors: u32,
    /// Discard granularity in bytes (0 or a multiple of the logical block
    /// size); discards are trimmed to whole granules.
    pub granularity: u32,
    /// Byte offset of the first granule boundary (usually 0).
    pub alignment: u32,
}

/// What the engine knows of a volume: identity, geometry and policy. The
/// OPEN_RSP is built from it, and every IO is checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VolumeInfo {
    /// The volume.
    pub id: VolumeId,
    /// Capacity in 512-byte sectors.
    pub nsectors: u64,
    /// Logical block size in bytes: a power of two in 512..=4096. IO must
    /// be aligned to it.
    pub logical_block_size: u16,
    /// Physical block size in bytes: a power of two, at least the logical.
    pub physical_block_size: u16,
    /// `max_hw_sectors` for OPEN_RSP (the 6.1 client ignores it).
    pub max_hw_sectors: u32,
    /// `max_segments` for OPEN_RSP (the 6.1 client ignores it).
    pub max_segments: u16,
    /// The volume has a volatile write cache: advertise `RNBD_WRITEBACK`
    /// and accept FLUSH.
    pub write_cache: bool,
    /// The volume honours FUA writes natively: advertise `RNBD_FUA` (only
    /// together with `write_cache`; without a volatile cache every write is
    /// durable and the client strips FUA anyway, rnbd.md §3).
    pub fua: bool,
    /// Discard support; `None` disables DISCARD (and SECURE_ERASE).
    pub discard: Option<DiscardLimits>,
    /// SECURE_ERASE supported (needs `discard`: the client uses
    /// `max_discard_sectors` as its limit). Executed as
    /// [`BlockOp::WriteZeroes`].
    pub secure_erase: bool,
}

impl VolumeInfo {
    /// A plain volume of `nsectors`: 512-byte logical and 4096-byte physical
    /// blocks, `max_hw_sectors` 255 and `max_segments` 128 (what Linux's
    /// brd reports), no volatile cache, no discard.
    pub const fn new(id: VolumeId, nsectors: u64) -> VolumeInfo {
        VolumeInfo {
            id,
            nsectors,
            logical_block_size: 512,
            physical_block_size: 4096,
            max_hw_sectors: 255,
            max_segments: 128,
            write_cache: false,
            fua: false,
            discard: None,
            secure_erase: false,
        }
    }

    /// The `cache_policy` byte: truthful write-back and FUA bits.
    pub const fn cache_policy(&self) -> CachePolicy {
        let mut bits = 0;
        if self.write_cache {
            bits |= CachePolicy::WRITEBACK.0;
            if self.fua {
                bits |= CachePolicy::FUA.0;
            }
        }
        CachePolicy(bits)
    }

    /// The OPEN_RSP announcing this volume as device `device_id`.
    pub const fn open_rsp(&self, device_id: u32) -> OpenRsp {
        let (max_discard_sectors, discard_granularity, discard_alignment) = match self.discard {
            Some(limits) => (limits.max_sectors, limits.granularity, limits.alignment),
            None => (0, 0, 0),
        };
        OpenRsp {
            device_id,
            nsectors: self.nsectors,
            max_hw_sectors: self.max_hw_sectors,
            max_write_same_sectors: 0,
            max_discard_sectors,
            discard_granularity,
            discard_alignment,
            physical_block_size: self.physical_block_size,
            logical_block_size: self.logical_block_size,
            max_segments: self.max_segments,
            secure_discard: (self.secure_erase && self.discard.is_some()) as u16,
            rotational: 0,
            cache_policy: self.cache_policy(),
        }
    }
}

/// The most a session may do with a volume (from the access list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grant {
    /// Read-only opens only.
    ReadOnly,
    /// RO, RW and MIGRATION opens (writer limits still apply).
    ReadWrite,
}

/// Why [`Exports::lookup`] found nothing to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LookupError {
    /// No volume has this `device_path` (ENOENT).
    NotFound,
    /// The volume exists but no access rule admits this session (EACCES).
    Denied,
}

/// A volume an OPEN may map: its description and what this session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Export {
    /// The volume.
    pub volume: VolumeInfo,
    /// The session's rights on it.
    pub grant: Grant,
}

/// The export table as one session sees it. The engine implements it from
/// the manifest for the session's name and source address.
pub trait Exports {
    /// The volume `device_path` names and this session's rights on it.
    ///
    /// # Errors
    /// [`LookupError::NotFound`] for an unknown path,
    /// [`LookupError::Denied`] if the access list refuses the session.
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError>;
}

/// One request as the RTRS server delivers it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The user header: the RNBD message.
    pub user_header: &'a [u8],
    /// Bytes of the chunk's data area: the data sent (RTRS WRITE) or the
    /// client's read buffer (RTRS READ, `desc[0].len`).
    pub data_len: usize,
    /// The RTRS request kind it arrived as.
    pub direction: RtrsDirection,
    /// The engine's name for the request (for instance the chunk id); handed
    /// back in [`Completion::close_done`] for a deferred CLOSE.
    pub tag: u32,
}

/// The operation a [`BlockRequest`] asks of the volume. Offsets and lengths
/// are in bytes, checked against the volume and aligned to its logical
/// block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockOp {
    /// Read `len` bytes at `offset` into the chunk's data area.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Write the chunk's first `len` bytes at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Durable before completion (only set on write-back volumes).
        fua: bool,
    },
    /// Make every completed write durable (write-back volumes only).
    Flush,
    /// The range may be deallocated; contents afterwards are unspecified.
    Discard {
        /// Byte offset (granule-aligned).
        offset: u64,
        /// Bytes (whole granules), non-zero.
        len: u32,
    },
    /// Overwrite the range with zeroes (SECURE_ERASE).
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
}

/// A checked block request for the engine to execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRequest {
    /// The volume.
    pub volume: VolumeId,
    /// What to do.
    pub op: BlockOp,
}

/// Kinds of IO, for statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum IoKind {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

/// The obligation to report a submitted [`BlockRequest`]'s result through
/// [`Server::complete`] exactly once. Not `Clone`: completing consumes it.
#[must_use = "hand the ticket back to Server::complete"]
#[derive(Debug, PartialEq, Eq)]
pub struct IoTicket {
    device_id: u32,
    volume: VolumeId,
    kind: IoKind,
    bytes: u32,
}

impl IoTicket {
    /// The device id the IO was for.
    pub const fn device_id(&self) -> u32 {
        self.device_id
    }
}

/// Why a volume failed a request (the engine's report, mapped to the errno
/// Linux's `blk_status_to_errno` would give).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoError {
    /// Media or backend failure (EIO).
    Media,
    /// A thin or file volume ran out of space (ENOSPC).
    NoSpace,
    /// The backend did not answer in time (ETIMEDOUT).
    TimedOut,
    /// The backend cannot do this operation (EOPNOTSUPP).
    Unsupported,
    /// Out of backend resources (ENOMEM, `BLK_STS_RESOURCE`).
    Resource,
    /// Transiently refused, retry (EAGAIN).
    Again,
}

/// Why the server refused a request or a request failed. Each variant names
/// the invariant that was broken; [`status_for`] gives the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// The user header is no valid RNBD message (rnbd.md §8.3 #24, #25,
    /// #28-#30, #33-#35 at the wire level).
    Malformed(ParseError),
    /// A response type (SESS_INFO_RSP, OPEN_RSP) was sent to the server.
    NotARequest,
    /// The message arrived in the wrong RTRS direction (§8.3 #26).
    WrongDirection,
    /// The read buffer of a SESS_INFO/OPEN cannot hold the response (#27).
    ResponseBufferTooSmall,
    /// OPEN: no volume has this `device_path`.
    NoSuchVolume,
    /// OPEN: the access list refuses this session the volume or the mode.
    AccessDenied,
    /// OPEN: RW while the volume has a writer, or MIGRATION with two
    /// (§4.2 step 6).
    WriterLimit,
    /// OPEN: re-open of a path this session has open read-only, asking for
    /// write access (§8.3 #31).
    ModeUpgrade,
    /// OPEN: the volume is mapped by this session under another path
    /// (§4.2 step 7).
    AlreadyMapped,
    /// OPEN: the session's device table is full (§8.3 #39).
    TooManyDevices,
    /// OPEN: the engine's volume description does not fit an OPEN_RSP (bad
    /// block sizes); an engine bug, refused rather than sent.
    BadGeometry,
    /// IO: the device id is not open in this session, or is closing
    /// (§4.4 step 1, §8.3 #32).
    UnknownDevice,
    /// IO: WRITE, DISCARD or SECURE_ERASE through a read-only open (#36).
    ReadOnly,
    /// IO: FLUSH on a volume that does not advertise a write-back cache.
    FlushUnsupported,
    /// IO: DISCARD or SECURE_ERASE the volume does not advertise (#37).
    DiscardUnsupported,
    /// IO: `bi_size` disagrees with the data sent or the read buffer; or
    /// data came with FLUSH/DISCARD/SECURE_ERASE (#34).
    DataLengthMismatch,
    /// IO: the range ends beyond the device (#35).
    OutOfRange,
    /// IO: sector or size not a multiple of the logical block size (#35).
    Misaligned,
    /// IO: DISCARD/SECURE_ERASE beyond `max_discard_sectors` (#37).
    DiscardTooLarge,
    /// IO: the volume failed the request.
    Io(IoError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed(error) => write!(f, "malformed message: {error}"),
            Error::NotARequest => f.write_str("response type sent to the server"),
            Error::WrongDirection => f.write_str("message in the wrong RTRS direction"),
            Error::ResponseBufferTooSmall => f.write_str("read buffer too small for the response"),
            Error::NoSuchVolume => f.write_str("no such volume"),
            Error::AccessDenied => f.write_str("access denied"),
            Error::WriterLimit => f.write_str("volume already has its writers"),
            Error::ModeUpgrade => f.write_str("re-open asks for more access"),
            Error::AlreadyMapped => f.write_str("volume mapped under another path"),
            Error::TooManyDevices => f.write_str("device table full"),
            Error::BadGeometry => f.write_str("volume geometry not representable"),
            Error::UnknownDevice => f.write_str("unknown device id"),
            Error::ReadOnly => f.write_str("write through a read-only open"),
            Error::FlushUnsupported => f.write_str("flush without write-back cache"),
            Error::DiscardUnsupported => f.write_str("discard not supported"),
            Error::DataLengthMismatch => f.write_str("bi_size does not match the data"),
            Error::OutOfRange => f.write_str("IO beyond device end"),
            Error::Misaligned => f.write_str("IO not aligned to the logical block size"),
            Error::DiscardTooLarge => f.write_str("discard larger than advertised"),
            Error::Io(error) => write!(f, "volume error: {error:?}"),
        }
    }
}

impl core::error::Error for Error {}

/// The errno the RTRS response carries for `error` (the table in the module
/// docs). The one place where errors become wire statuses.
pub const fn status_for(error: &Error) -> u16 {
    match error {
        Error::Malformed(parse) => parse.errno(),
        Error::NotARequest | Error::WrongDirection | Error::ResponseBufferTooSmall => errno::EINVAL,
        Error::NoSuchVolume => errno::ENOENT,
        Error::AccessDenied => errno::EACCES,
        Error::WriterLimit | Error::ModeUpgrade | Error::ReadOnly => errno::EPERM,
        Error::AlreadyMapped => errno::EEXIST,
        Error::TooManyDevices => errno::EMFILE,
        Error::BadGeometry => errno::EIO,
        Error::UnknownDevice => errno::ENOTCONN,
        Error::FlushUnsupported | Error::DiscardUnsupported => errno::EOPNOTSUPP,
        Error::DataLengthMismatch
        | Error::OutOfRange
        | Error::Misaligned
        | Error::DiscardTooLarge => errno::EINVAL,
        Error::Io(IoError::Media) => errno::EIO,
        Error::Io(IoError::NoSpace) => errno::ENOSPC,
        Error::Io(IoError::TimedOut) => errno::ETIMEDOUT,
        Error::Io(IoError::Unsupported) => errno::EOPNOTSUPP,
        Error::Io(IoError::Resource) => errno::ENOMEM,
        Error::Io(IoError::Again) => errno::EAGAIN,
    }
}

/// What the engine must do with a request.
#[must_use = "every request needs an answer"]
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer now with status 0. For an RTRS READ, the first `len` bytes of
    /// the response buffer passed to [`Server::process`] are the reply data
    /// (SESS_INFO_RSP, OPEN_RSP); `len` is 0 otherwise.
    Respond {
        /// Reply data length.
        len: usize,
    },
    /// Answer now with `status_for(&error)` and no data.
    Refuse(Error),
    /// Execute `request` (read data goes to the chunk's data area, write data
    /// comes from it), then hand `ticket` to [`Server::complete`].
    Submit {
        /// The checked block request.
        request: BlockRequest,
        /// The completion obligation.
        ticket: IoTicket,
    },
    /// CLOSE accepted while IO is in flight: its success reply is due when a
    /// [`Completion::close_done`] names this request's tag (rnbd.md §4.3).
    CloseDeferred,
}

impl Action {
    /// The errno to answer with now, `None` for `Submit`/`CloseDeferred`.
    pub const fn immediate_status(&self) -> Option<u16> {
        match self {
            Action::Respond { .. } => Some(errno::OK),
            Action::Refuse(error) => Some(status_for(error)),
            Action::Submit { .. } | Action::CloseDeferred => None,
        }
    }
}

/// The answer to a completed IO.
#[must_use = "the IO's reply, and perhaps a CLOSE's, are due"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// errno for the IO's RTRS response.
    pub status: u16,
    /// Bytes of read data to return (RTRS READ of a successful READ), else 0.
    pub data_len: usize,
    /// The tag of a deferred CLOSE whose success reply is now due.
    pub close_done: Option<u32>,
}

/// Completed-IO counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCounters {
    /// READs completed successfully.
    pub reads: u64,
    /// WRITEs completed successfully.
    pub writes: u64,
    /// FLUSHes completed successfully.
    pub flushes: u64,
    /// DISCARDs completed successfully (including ones trimmed to nothing).
    pub discards: u64,
    /// SECURE_ERASEs (write-zeroes) completed successfully.
    pub write_zeroes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Bytes discarded or zeroed.
    pub discard_bytes: u64,
    /// IOs the volume failed.
    pub failed: u64,
}

impl IoCounters {
    fn record(&mut self, kind: IoKind, bytes: u32, ok: bool) {
        if !ok {
            self.failed += 1;
            return;
        }
        let bytes = u64::from(bytes);
        match kind {
            IoKind::Read => {
                self.reads += 1;
                self.read_bytes += bytes;
            }
            IoKind::Write => {
                self.writes += 1;
                self.write_bytes += bytes;
            }
            IoKind::Flush => self.flushes += 1,
            IoKind::Discard => {
                self.discards += 1;
                self.discard_bytes += bytes;
            }
            IoKind::WriteZeroes => {
                self.write_zeroes += 1;
                self.discard_bytes += bytes;
            }
        }
    }
}

/// Refusals, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounters {
    /// Malformed messages ([`Error::Malformed`], [`Error::NotARequest`]).
    pub malformed: u64,
    /// Wrong RTRS direction or too small a response buffer.
    pub transport_mismatch: u64,
    /// OPENs refused (unknown path, access, writers, table full, ...).
    pub open_refused: u64,
    /// IO for unknown or closing device ids.
    pub unknown_device: u64,
    /// Writes through read-only opens.
    pub read_only: u64,
    /// Ops the volume does not advertise.
    pub unsupported: u64,
    /// `bi_size` / data length disagreements.
    pub length_mismatch: u64,
    /// Ranges beyond the device, misaligned, or discards too large.
    pub out_of_range: u64,
    /// IOs the volume failed.
    pub io_failed: u64,
}

impl ErrorCounters {
    fn record(&mut self, error: &Error) {
        let counter = match error {
            Error::Malformed(_) | Error::NotARequest => &mut self.malformed,
            Error::WrongDirection | Error::ResponseBufferTooSmall => &mut self.transport_mismatch,
            Error::NoSuchVolume
            | Error::AccessDenied
            | Error::WriterLimit
            | Error::ModeUpgrade
            | Error::AlreadyMapped
            | Error::TooManyDevices
            | Error::BadGeometry => &mut self.open_refused,
            Error::UnknownDevice => &mut self.unknown_device,
            Error::ReadOnly => &mut self.read_only,
            Error::FlushUnsupported | Error::DiscardUnsupported => &mut self.unsupported,
            Error::DataLengthMismatch => &mut self.length_mismatch,
            Error::OutOfRange | Error::Misaligned | Error::DiscardTooLarge => {
                &mut self.out_of_range
            }
            Error::Io(_) => &mut self.io_failed,
        };
        *counter += 1;
    }
}

/// Per-session statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// OPENs answered with a device (including re-opens).
    pub opens: u64,
    /// CLOSEs answered (including unknown ids).
    pub closes: u64,
    /// Completed IO.
    pub io: IoCounters,
    /// Refusals by reason.
    pub errors: ErrorCounters,
}

/// Per-volume statistics (all sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeStats {
    /// Opens of the volume (not counting re-opens).
    pub opens: u64,
    /// Completed IO.
    pub io: IoCounters,
    /// IO on this volume refused before submission, and failed by it, by
    /// reason.
    pub errors: ErrorCounters,
}

/// Server-wide state of one volume.
#[derive(Debug, Clone, Copy, Default)]
struct VolumeState {
    /// Open devices with write access, over all sessions.
    writers: u32,
    stats: VolumeStats,
}

/// One mapped device of a session.
#[derive(Debug, Clone)]
pub struct Device {
    path: String<{ DEVICE_PATH_LEN - 1 }>,
    volume: VolumeInfo,
    mode: AccessMode,
    in_flight: u32,
}

impl Device {
    /// The `device_path` it was opened with.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// The volume.
    pub const fn volume(&self) -> &VolumeInfo {
        &self.volume
    }
    /// The access mode it was opened with.
    pub const fn mode(&self) -> AccessMode {
        self.mode
    }
    /// IOs submitted and not yet completed.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

/// State of one device id of a session.
#[derive(Debug, Clone, Default)]
pub enum DeviceState {
    /// The id is free.
    #[default]
    Free,
    /// Opened: accepts IO.
    Open(Device),
    /// CLOSE received (or the session ended) while IO was in flight: new IO
    /// gets ENOTCONN, the id stays reserved until `in_flight` reaches 0.
    Draining {
        /// The device.
        device: Device,
        /// The CLOSE to answer when drained (`None` at session end).
        close_tag: Option<u32>,
    },
}

/// One RNBD session: negotiated version, device table, statistics.
#[derive(Debug, Clone)]
pub struct Session {
    version: u8,
    devices: [DeviceState; MAX_DEVICES_PER_SESSION],
    stats: SessionStats,
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

impl Session {
    /// A new session: version 0 until SESS_INFO (rnbd.md §2.3), no devices.
    pub fn new() -> Session {
        Session {
            version: 0,
            devices: core::array::from_fn(|_| DeviceState::Free),
            stats: SessionStats::default(),
        }
    }

    /// The negotiated protocol version (0 before SESS_INFO).
    pub const fn version(&self) -> u8 {
        self.version
    }

    /// Statistics.
    pub const fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// The state of `device_id`.
    pub fn device(&self, device_id: u32) -> Option<&DeviceState> {
        self.devices.get(usize::try_from(device_id).ok()?)
    }

    /// Device ids not free (open or draining).
    pub fn devices_in_use(&self) -> usize {
        self.devices
            .iter()
            .filter(|state| !matches!(state, DeviceState::Free))
            .count()
    }

    /// True when no device is open or draining.
    pub fn is_idle(&self) -> bool {
        self.devices_in_use() == 0
    }

    fn open_device_mut(&mut self, device_id: u32) -> Option<&mut Device> {
        match self.devices.get_mut(usize::try_from(device_id).ok()?)? {
            DeviceState::Open(device) => Some(device),
            _ => None,
        }
    }

    fn find_open_path(&self, path: &str) -> Option<(u32, &Device)> {
        self.devices
            .iter()
            .enumerate()
            .find_map(|(id, state)| match state {
                DeviceState::Open(device) if device.path == path => Some((id as u32, device)),
                _ => None,
            })
    }

    fn holds_volume(&self, volume: VolumeId) -> bool {
        self.devices.iter().any(|state| match state {
            DeviceState::Open(device) | DeviceState::Draining { device, .. } => {
                device.volume.id == volume
            }
            DeviceState::Free => false,
        })
    }

    fn free_id(&self) -> Option<usize> {
        self.devices
            .iter()
            .position(|state| matches!(state, DeviceState::Free))
    }
}

/// Server-wide RNBD state: writer counts and statistics per volume.
#[derive(Debug, Clone)]
pub struct Server {
    volumes: [VolumeState; MAX_VOLUMES],
}

impl Default for Server {
    fn default() -> Self {
        Server::new()
    }
}

impl Server {
    /// A server with no open volumes.
    pub fn new() -> Server {
        Server {
            volumes: [VolumeState::default(); MAX_VOLUMES],
        }
    }

    /// Statistics of `volume`.
    pub fn volume_stats(&self, volume: VolumeId) -> &VolumeStats {
        &self.volumes[volume.index()].stats
    }

    /// Open devices with write access to `volume`, over all sessions.
    pub fn writers(&self, volume: VolumeId) -> u32 {
        self.volumes[volume.index()].writers
    }

    /// Handles one request of `session` (rnbd.md §4). `response` is the
    /// chunk's data area (at least `request.data_len` bytes for the reply of
    /// an RTRS READ); SESS_INFO_RSP and OPEN_RSP are written at its start.
    /// Bounded work: one table scan at most.
    pub fn process<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Action {
        match self.dispatch(session, exports, request, response) {
            Ok(action) => action,
            Err(error) => {
                session.stats.errors.record(&error);
                Action::Refuse(error)
            }
        }
    }

    fn dispatch<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Result<Action, Error> {
        let message = Message::parse(request.user_header).map_err(Error::Malformed)?;
        let direction = message.rtrs_direction().ok_or(Error::NotARequest)?;
        if direction != request.direction {
            return Err(Error::WrongDirection);
        }
        match message {
            Message::SessInfo(sess_info) => sess_info_rsp(session, sess_info, request, response),
            Message::Open(open) => self.open(session, exports, open, request, response),
            Message::Close(close) => Ok(self.close(session, close, request.tag)),
            Message::Io(io) => self.io(session, io, request.data_len),
            Message::SessInfoRsp(_) | Message::OpenRsp(_) => Err(Error::NotARequest),
        }
    }

    /// OPEN (rnbd.md §4.2, with §8.3 #28-#31, #39).
    fn open<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        open: Open<'_>,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Result<Action, Error> {
        let response = response_buffer(request, response, OpenRsp::LEN)?;
        // Re-open of the identical path: the same id, but unlike Linux the
        // mode is rechecked (§8.3 #31).
        if let Some((id, device)) = session.find_open_path(open.device_path) {
            if open.access_mode.is_writable() && !device.mode.is_writable() {
                return Err(Error::ModeUpgrade);
            }
            let len = emit_open_rsp(&device.volume, id, response)?;
            session.stats.opens += 1;
            return Ok(Action::Respond { len });
        }
        let export = exports
            .lookup(open.device_path)
            .map_err(|error| match error {
                LookupError::NotFound => Error::NoSuchVolume,
                LookupError::Denied => Error::AccessDenied,
            })?;
        let volume = export.volume;
        if open.access_mode.is_writable() && export.grant != Grant::ReadWrite {
            return Err(Error::AccessDenied);
        }
        if session.holds_volume(volume.id) {
            return Err(Error::AlreadyMapped);
        }
        let state = &mut self.volumes[volume.id.index()];
        let writer_limit_reached = match open.access_mode {
            AccessMode::ReadOnly => false,
            AccessMode::ReadWrite => state.writers > 0,
            AccessMode::Migration => state.writers >= 2,
        };
        if writer_limit_reached {
            return Err(Error::WriterLimit);
        }
        let id = session.free_id().ok_or(Error::TooManyDevices)?;
        let path = String::try_from(open.device_path)
            .map_err(|_| Error::Malformed(ParseError::PathNotTerminated))?;
        let len = emit_open_rsp(&volume, id as u32, response)?;
        if open.access_mode.is_writable() {
            state.writers += 1;
        }
        state.stats.opens += 1;
        session.devices[id] = DeviceState::Open(Device {
            path,
            volume,
            mode: open.access_mode,
            in_flight: 0,
        });
        session.stats.opens += 1;
        Ok(Action::Respond { len })
    }

    /// CLOSE (rnbd.md §4.3): always success; deferred while IO is in flight.
    fn close(&mut self, session: &mut Session, close: Close, tag: u32) -> Action {
        session.stats.closes += 1;
        let Some(state) = usize::try_from(close.device_id)
            .ok()
            .and_then(|id| session.devices.get_mut(id))
        else {
            return Action::Respond { len: 0 };
        };
        match core::mem::take(state) {
            DeviceState::Open(device) if device.in_flight > 0 => {
                *state = DeviceState::Draining {
                    device,
                    close_tag: Some(tag),
                };
                Action::CloseDeferred
            }
            DeviceState::Open(device) => {
                self.release(&device);
                Action::Respond { len: 0 }
            }
            // Unknown or already closing: Linux no longer finds the id and
            // answers success at once.
            other => {
                *state = other;
                Action::Respond { len: 0 }
            }
        }
    }

    /// IO (rnbd.md §4.4, §8.3 #32-#37): every check, then the block request.
    fn io(&mut self, session: &mut Session, io: Io, data_len: usize) -> Result<Action, Error> {
        let device = session
            .open_device_mut(io.device_id)
            .ok_or(Error::UnknownDevice)?;
        let volume = device.volume;
        let checked = check_io(&io, &volume, device.mode, data_len);
        let (op, kind, bytes) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                self.volumes[volume.id.index()].stats.errors.record(&error);
                return Err(error);
            }
        };
        let Some(op) = op else {
            // A discard trimmed to no whole granule: done, nothing to do.
            session.stats.io.record(kind, 0, true);
            self.volumes[volume.id.index()]
                .stats
                .io
                .record(kind, 0, true);
            return Ok(Action::Respond { len: 0 });
        };
        device.in_flight += 1;
        Ok(Action::Submit {
            request: BlockRequest {
                volume: volume.id,
                op,
            },
            ticket: IoTicket {
                device_id: io.device_id,
                volume: volume.id,
                kind,
                bytes,
            },
        })
    }

    /// Reports the result of a submitted request: the errno of its reply,
    /// and a CLOSE whose reply is now due if this was the device's last IO.
    pub fn complete(
        &mut self,
        session: &mut Session,
        ticket: IoTicket,
        result: Result<(), IoError>,
    ) -> Completion {
        let ok = result.is_ok();
        session.stats.io.record(ticket.kind, ticket.bytes, ok);
        self.volumes[ticket.volume.index()]
            .stats
            .io
            .record(ticket.kind, ticket.bytes, ok);
        let status = match result {
            Ok(()) => errno::OK,
            Err(error) => {
                let error = Error::Io(error);
                session.stats.errors.record(&error);
                self.volumes[ticket.volume.index()]
                    .stats
                    .errors
                    .record(&error);
                status_for(&error)
            }
        };
        let data_len = if ok && ticket.kind == IoKind::Read {
            ticket.bytes as usize
        } else {
            0
        };
        let mut close_done = None;
        if let Some(state) = usize::try_from(ticket.device_id)
            .ok()
            .and_then(|id| session.devices.get_mut(id))
        {
            match state {
                DeviceState::Open(device) => {
                    device.in_flight = device.in_flight.saturating_sub(1);
                }
                DeviceState::Draining { device, close_tag } => {
                    device.in_flight = device.in_flight.saturating_sub(1);
                    if device.in_flight == 0 {
                        close_done = *close_tag;
                        if let DeviceState::Draining { device, .. } = core::mem::take(state) {
                            self.release(&device);
                        }
                    }
                }
                DeviceState::Free => {}
            }
        }
        Completion {
            status,
            data_len,
            close_done,
        }
    }

    /// Ends `session` (its last RTRS path is gone, rnbd.md §4.6): every
    /// device is closed; devices with IO in flight drain first (their
    /// completions still go through [`Server::complete`], the replies are
    /// dropped by RTRS). Returns the number of devices still draining; the
    /// session may be dropped once [`Session::is_idle`].
    pub fn end_session(&mut self, session: &mut Session) -> usize {
        let mut draining = 0;
        for state in session.devices.iter_mut() {
            match core::mem::take(state) {
                DeviceState::Free => {}
                DeviceState::Open(device) | DeviceState::Draining { device, .. } => {
                    if device.in_flight == 0 {
                        self.release(&device);
                    } else {
                        draining += 1;
                        *state = DeviceState::Draining {
                            device,
                            close_tag: None,
                        };
                    }
                }
            }
        }
        draining
    }

    fn release(&mut self, device: &Device) {
        if device.mode.is_writable() {
            let state = &mut self.volumes[device.volume.id.index()];
            state.writers = state.writers.saturating_sub(1);
        }
    }
}

/// SESS_INFO (rnbd.md §4.1): `min(ver, 2)` stored and returned.
fn sess_info_rsp(
    session: &mut Session,
    sess_info: SessInfo,
    request: &Request<'_>,
    response: &mut [u8],
) -> Result<Action, Error> {
    let response = response_buffer(request, response, SessInfoRsp::LEN)?;
    let ver = sess_info.ver.min(PROTOCOL_VERSION_MAJOR);
    let len = SessInfoRsp { ver }
        .emit(response)
        .map_err(|_| Error::ResponseBufferTooSmall)?;
    session.version = ver;
    Ok(Action::Respond { len })
}

/// The part of `response` a reply of `len` bytes goes to, after checking
/// that the client's read buffer holds it (§8.3 #27).
fn response_buffer<'b>(
    request: &Request<'_>,
    response: &'b mut [u8],
    len: usize,
) -> Result<&'b mut [u8], Error> {
    if request.data_len < len {
        return Err(Error::ResponseBufferTooSmall);
    }
    response.get_mut(..len).ok_or(Error::ResponseBufferTooSmall)
}

fn emit_open_rsp(volume: &VolumeInfo, device_id: u32, response: &mut [u8]) -> Result<usize, Error> {
    volume
        .open_rsp(device_id)
        .emit(response)
        .map_err(|_| Error::BadGeometry)
}

/// The checks of one IO against its device (§8.3 #33-#37), in a fixed
/// order: op advertised, write permission, data length, range, alignment,
/// size limits. `Ok((None, ..))` is a discard with nothing left to do.
fn check_io(
    io: &Io,
    volume: &VolumeInfo,
    mode: AccessMode,
    data_len: usize,
) -> Result<(Option<BlockOp>, IoKind, u32), Error> {
    // Advertised?
    let discard = match io.op {
        IoOp::Read | IoOp::Write => None,
        IoOp::Flush if volume.write_cache => None,
        IoOp::Flush => return Err(Error::FlushUnsupported),
        IoOp::Discard => Some(volume.discard.ok_or(Error::DiscardUnsupported)?),
        IoOp::SecureErase if volume.secure_erase => {
            Some(volume.discard.ok_or(Error::DiscardUnsupported)?)
        }
        IoOp::SecureErase => return Err(Error::DiscardUnsupported),
        IoOp::WriteSame | IoOp::Unknown(_) => {
            return Err(Error::Malformed(ParseError::UnsupportedOp))
        }
    };
    if io.op.is_write() && !mode.is_writable() {
        return Err(Error::ReadOnly);
    }
    // Data length (#34): the data sent (or the read buffer) is exactly
    // bi_size for READ/WRITE, and nothing for the others.
    let expected_data = match io.op {
        IoOp::Read | IoOp::Write => io.bi_size as usize,
        _ => 0,
    };
    if data_len != expected_data {
        return Err(Error::DataLengthMismatch);
    }
    if io.op == IoOp::Flush {
        return Ok((Some(BlockOp::Flush), IoKind::Flush, 0));
    }
    // Range (#35), with checked arithmetic.
    let end = io
        .end_sector()
        .ok_or(Error::Malformed(ParseError::SectorRangeOverflow))?;
    if end > volume.nsectors {
        return Err(Error::OutOfRange);
    }
    let offset = io
        .byte_offset()
        .ok_or(Error::Malformed(ParseError::SectorRangeOverflow))?;
    let block = u64::from(volume.logical_block_size.max(SECTOR_SIZE as u16));
    if offset % block != 0 || u64::from(io.bi_size) % block != 0 {
        return Err(Error::Misaligned);
    }
    let len = io.bi_size;
    match (io.op, discard) {
        (IoOp::Read, _) => Ok((Some(BlockOp::Read { offset, len }), IoKind::Read, len)),
        (IoOp::Write, _) => {
            let fua = io.flags.contains(IoFlags::FUA) && volume.write_cache;
            Ok((
                Some(BlockOp::Write { offset, len, fua }),
                IoKind::Write,
                len,
            ))
        }
        (IoOp::SecureErase, Some(limits)) => {
            check_discard_size(io, &limits)?;
            Ok((
                Some(BlockOp::WriteZeroes { offset, len }),
                IoKind::WriteZeroes,
                len,
            ))
        }
        (_, Some(limits)) => {
            check_discard_size(io, &limits)?;
            Ok(match trim_to_granules(offset, len, &limits) {
                Some((offset, len)) => {
                    (Some(BlockOp::Discard { offset, len }), IoKind::Discard, len)
                }
                None => (None, IoKind::Discard, 0),
            })
        }
        // Unreachable: only DISCARD and SECURE_ERASE have limits.
        _ => Err(Error::Malformed(ParseError::UnsupportedOp)),
    }
}

fn check_discard_size(io: &Io, limits: &DiscardLimits) -> Result<(), Error> {
    if io.nsectors() > u64::from(limits.max_sectors) {
        return Err(Error::DiscardTooLarge);
    }
    Ok(())
}

/// The whole granules inside `[offset, offset + len)`; `None` if there are
/// none (or the arithmetic would overflow, which a checked range cannot).
fn trim_to_granules(offset: u64, len: u32, limits: &DiscardLimits) -> Option<(u64, u32)> {
    if len == 0 {
        return None;
    }
    let granule = u64::from(limits.granularity);
    let end = offset.checked_add(u64::from(len))?;
    if granule <= 1 {
        return Some((offset, len));
    }
    let phase = u64::from(limits.alignment) % granule;
    // Distance of `x` above the last granule boundary at or below it.
    let above = |x: u64| (x % granule + granule - phase) % granule;
    let start = match above(offset) {
        0 => offset,
        rest => offset.checked_add(granule - rest)?,
    };
    // No boundary at or below `end` (possible when the phase is large): no
    // whole granule.
    let end = end.checked_sub(above(end))?;
    if end <= start {
        return None;
    }
    Some((start, u32::try_from(end - start).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::*;

    #[test]
    fn test_trim_to_granules() {
        let limits = DiscardLimits {
            max_sectors: 1 << 20,
            granularity: 4096,
            alignment: 0,
        };
        assert_eq!(trim_to_granules(0, 8192, &limits), Some((0, 8192)));
        assert_eq!(trim_to_granules(512, 8192, &limits), Some((4096, 4096)));
        assert_eq!(trim_to_granules(512, 4096, &limits), None);
        let shifted = DiscardLimits {
            alignment: 512,
            ..limits
        };
        assert_eq!(trim_to_granules(512, 4096, &shifted), Some((512, 4096)));
        let none = DiscardLimits {
            granularity: 0,
            ..limits
        };
        assert_eq!(trim_to_granules(512, 512, &none), Some((512, 512)));
        let late = DiscardLimits {
            alignment: 1024,
            ..limits
        };
        assert_eq!(trim_to_granules(0, 512, &late), None);
        assert_eq!(trim_to_granules(0, 8192, &late), Some((1024, 4096)));
    }

    /// Every small combination: no panic, and the result is whole granules
    /// inside the request.
    #[test]
    fn test_trim_to_granules_small_exhaustive() {
        for granularity in [0u32, 512, 1024, 4096] {
            for alignment in (0..8192).step_by(512) {
                let limits = DiscardLimits {
                    max_sectors: 64,
                    granularity,
                    alignment,
                };
                for offset in (0..16384u64).step_by(512) {
                    for len in (0..16384u32).step_by(512) {
                        if let Some((start, trimmed)) = trim_to_granules(offset, len, &limits) {
                            assert!(start >= offset && trimmed > 0);
                            assert!(start + u64::from(trimmed) <= offset + u64::from(len));
                            if granularity > 1 {
                                let phase = u64::from(alignment % granularity);
                                let g = u64::from(granularity);
                                assert_eq!((start + g - phase) % g, 0);
                                assert_eq!(u64::from(trimmed) % g, 0);
                            }
                        }
                    }
                }
            }
        }
        let huge = DiscardLimits {
            max_sectors: 64,
            granularity: 4096,
            alignment: 512,
        };
        assert_eq!(trim_to_granules(u64::MAX - 600, 512, &huge), None);
    }

    #[test]
    fn test_cache_policy_truthful() {
        let id = VolumeId::try_new(0).unwrap();
        let mut volume = VolumeInfo::new(id, 8);
        assert_eq!(volume.cache_policy(), CachePolicy(0));
        volume.fua = true;
        assert_eq!(volume.cache_policy(), CachePolicy(0), "FUA needs a cache");
        volume.write_cache = true;
        assert_eq!(volume.cache_policy(), CachePolicy(3));
        volume.fua = false;
        assert_eq!(volume.cache_policy(), CachePolicy::WRITEBACK);
        assert_eq!(VolumeId::try_new(MAX_VOLUMES), None);
    }

    /// `status_for` over every error: the table of the module docs.
    #[test]
    fn status_for_is_exhaustive() {
        let parse_errors = [
            (ParseError::Truncated, EINVAL),
            (ParseError::UnexpectedType, EINVAL),
            (ParseError::UnknownType, EINVAL),
            (ParseError::UnknownAccessMode, EINVAL),
            (ParseError::PathNotTerminated, EINVAL),
            (ParseError::EmptyPath, EINVAL),
            (ParseError::ForbiddenPathChar, EINVAL),
            (ParseError::PathTraversal, EINVAL),
            (ParseError::UnsupportedOp, EOPNOTSUPP),
            (ParseError::UnalignedSize, EINVAL),
            (ParseError::SectorRangeOverflow, EINVAL),
            (ParseError::BeyondDeviceEnd, EINVAL),
            (ParseError::FlushWithData, EINVAL),
            (ParseError::BadLogicalBlockSize, EINVAL),
            (ParseError::BadPhysicalBlockSize, EINVAL),
        ];
        let mut table: std::vec::Vec<(Error, u16)> = parse_errors
            .iter()
            .map(|&(error, errno)| (Error::Malformed(error), errno))
            .collect();
        table.extend([
            (Error::NotARequest, EINVAL),
            (Error::WrongDirection, EINVAL),
            (Error::ResponseBufferTooSmall, EINVAL),
            (Error::NoSuchVolume, ENOENT),
            (Error::AccessDenied, EACCES),
            (Error::WriterLimit, EPERM),
            (Error::ModeUpgrade, EPERM),
            (Error::AlreadyMapped, EEXIST),
            (Error::TooManyDevices, EMFILE),
            (Error::BadGeometry, EIO),
            (Error::UnknownDevice, ENOTCONN),
            (Error::ReadOnly, EPERM),
            (Error::FlushUnsupported, EOPNOTSUPP),
            (Error::DiscardUnsupported, EOPNOTSUPP),
            (Error::DataLengthMismatch, EINVAL),
            (Error::OutOfRange, EINVAL),
            (Error::Misaligned, EINVAL),
            (Error::DiscardTooLarge, EINVAL),
            (Error::Io(IoError::Media), EIO),
            (Error::Io(IoError::NoSpace), ENOSPC),
            (Error::Io(IoError::TimedOut), ETIMEDOUT),
            (Error::Io(IoError::Unsupported), EOPNOTSUPP),
            (Error::Io(IoError::Resource), ENOMEM),
            (Error::Io(IoError::Again), EAGAIN),
        ]);
        for (error, errno) in &table {
            assert_eq!(status_for(error), *errno, "{error}");
            assert!(*errno > 0 && *errno < 512, "9-bit errno (§8.4)");
        }
        // Every variant is in the table: this match breaks when one is added.
        for (error, _) in &table {
            match error {
                Error::Malformed(_)
                | Error::NotARequest
                | Error::WrongDirection
                | Error::ResponseBufferTooSmall
                | Error::NoSuchVolume
                | Error::AccessDenied
                | Error::WriterLimit
                | Error::ModeUpgrade
                | Error::AlreadyMapped
                | Error::TooManyDevices
                | Error::BadGeometry
                | Error::UnknownDevice
                | Error::ReadOnly
                | Error::FlushUnsupported
                | Error::DiscardUnsupported
                | Error::DataLengthMismatch
                | Error::OutOfRange
                | Error::Misaligned
                | Error::DiscardTooLarge
                | Error::Io(
                    IoError::Media
                    | IoError::NoSpace
                    | IoError::TimedOut
                    | IoError::Unsupported
                    | IoError::Resource
                    | IoError::Again,
                ) => {}
            }
        }
    }
}
