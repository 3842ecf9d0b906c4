//! One request and its answer: the block operation handed to the
//! consumer, the ticket it completes with, the errors and their RNBD
//! statuses, and the [`Action`] the RTRS layer carries out.

use super::*;

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
pub(super) enum IoKind {
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
    pub(super) device_id: u32,
    pub(super) volume: VolumeId,
    pub(super) kind: IoKind,
    pub(super) bytes: u32,
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
