//! The initiator's errors, one enum per operation (STYLE.md §7).
//!
//! Remote failures keep the server's errno as [`RemoteError`]; local
//! refusals by the RNBD builders keep [`ClientError`]; everything the
//! initiator checks itself names what was expected and what was found.

use core::fmt;

use rnbd::client::{ClientError, RemoteError};

use crate::engine::{VolumeId, VolumeState};

/// Why [`crate::Initiator::new`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitError {
    /// A capacity is zero or too large.
    Limits {
        /// Which setting.
        what: &'static str,
        /// The value given.
        found: u64,
        /// The allowed range, inclusive.
        min: u64,
        /// The allowed range, inclusive.
        max: u64,
    },
    /// The RTRS client refused its configuration.
    Client(rtrs::client::ConfigError),
    /// The provider could not allocate or register the data pool.
    Memory {
        /// Bytes asked for.
        bytes: u64,
    },
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limits {
                what,
                found,
                min,
                max,
            } => write!(f, "{what} is {found}; expected {min}..={max}"),
            Self::Client(error) => write!(f, "RTRS client configuration refused: {error:?}"),
            Self::Memory { bytes } => {
                write!(
                    f,
                    "could not allocate and register {bytes} bytes of IO buffers"
                )
            }
        }
    }
}

impl std::error::Error for InitError {}

/// Why [`crate::Initiator::connect`] refused (nothing was started).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// A session was already started on this initiator.
    AlreadyStarted,
    /// The session name is empty, over 63 bytes, or contains `/` or `.`
    /// (rtrs.md §3.2).
    BadName,
    /// No paths, or more than the configured `max_paths`.
    BadPaths {
        /// Paths given.
        found: usize,
        /// Most paths allowed.
        max: u16,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyStarted => f.write_str("a session was already started"),
            Self::BadName => {
                f.write_str("bad session name: expected 1..=63 bytes without '/', '.' or NUL")
            }
            Self::BadPaths { found, max } => {
                write!(f, "{found} paths given; expected 1..={max}")
            }
        }
    }
}

impl std::error::Error for ConnectError {}

/// Why opening a volume failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpenError {
    /// Every volume slot is in use.
    TooManyVolumes {
        /// The configured `max_volumes`.
        max: u16,
    },
    /// This device path is already open in this session (rnbd.md §5.1:
    /// EEXIST).
    AlreadyOpen(VolumeId),
    /// The device path is not valid on the wire (empty, too long, `..`).
    BadPath(ClientError),
    /// The server refused the OPEN with this errno (not found, access
    /// denied, writer limit …).
    Remote(RemoteError),
    /// The OPEN_RSP was malformed.
    BadResponse(ClientError),
    /// The session was closed, or the OPEN could not be carried.
    Disconnected,
    /// The volume was closed before its OPEN was answered.
    Closed,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyVolumes { max } => write!(f, "all {max} volume slots are in use"),
            Self::AlreadyOpen(volume) => write!(f, "already open as {volume}"),
            Self::BadPath(error) => write!(f, "bad device path: {error}"),
            Self::Remote(error) => write!(
                f,
                "the target refused the open: {error:?} (errno {})",
                error.errno()
            ),
            Self::BadResponse(error) => write!(f, "malformed OPEN_RSP: {error}"),
            Self::Disconnected => f.write_str("the session is closed"),
            Self::Closed => f.write_str("the volume was closed while opening"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Why [`crate::Initiator::close`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseError {
    /// No such volume.
    UnknownVolume(VolumeId),
    /// IO of this volume is still in flight; reap it first.
    Busy {
        /// IOs submitted and not yet completed.
        in_flight: u32,
    },
    /// A CLOSE is already pending.
    AlreadyClosing,
    /// The volume's OPEN is in flight; wait for its answer.
    Opening,
}

impl fmt::Display for CloseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownVolume(volume) => write!(f, "no {volume}"),
            Self::Busy { in_flight } => write!(
                f,
                "{in_flight} IOs of the volume are in flight; expected none"
            ),
            Self::AlreadyClosing => f.write_str("the volume is already closing"),
            Self::Opening => f.write_str("the volume's OPEN is in flight; expected it answered"),
        }
    }
}

impl std::error::Error for CloseError {}

/// Why a submission was refused at once (nothing was queued, the tag will
/// not complete).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubmitError {
    /// All IO slots are taken (submitted or completed and not reaped).
    QueueFull {
        /// The configured queue depth.
        queue_depth: u16,
    },
    /// No such volume.
    UnknownVolume(VolumeId),
    /// The volume is not usable in its current state.
    NotOpen {
        /// The volume.
        volume: VolumeId,
        /// Its state.
        state: VolumeState,
    },
    /// A write or discard through a read-only mapping.
    ReadOnly(VolumeId),
    /// Zero-length read, write or discard.
    Empty,
    /// The range does not end inside the volume.
    OutOfRange {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The volume's size in bytes.
        capacity: u64,
    },
    /// Offset or length not a multiple of the logical block size.
    Misaligned {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The volume's logical block size.
        block_size: u32,
    },
    /// Longer than one IO slot's buffer (`max_transfer`).
    TooLarge {
        /// Bytes asked for.
        len: u64,
        /// The configured `max_transfer`.
        max: u32,
    },
    /// The volume does not advertise discard.
    DiscardUnsupported(VolumeId),
    /// The session is down and the policy is [`crate::OnDisconnect::Fail`].
    Disconnected,
    /// The RNBD builder refused the request.
    Refused(ClientError),
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::QueueFull { queue_depth } => {
                write!(f, "all {queue_depth} IO slots are in use")
            }
            Self::UnknownVolume(volume) => write!(f, "no {volume}"),
            Self::NotOpen { volume, state } => {
                write!(f, "{volume} is {state:?}; expected open")
            }
            Self::ReadOnly(volume) => write!(
                f,
                "{volume} is mapped read-only; expected a read-write mapping"
            ),
            Self::Empty => f.write_str("zero-length request"),
            Self::OutOfRange {
                offset,
                len,
                capacity,
            } => write!(
                f,
                "bytes {offset}..{} requested; the volume has {capacity} bytes",
                u128::from(*offset) + u128::from(*len)
            ),
            Self::Misaligned {
                offset,
                len,
                block_size,
            } => write!(
                f,
                "offset {offset} length {len}: expected multiples of the {block_size}-byte block"
            ),
            Self::TooLarge { len, max } => {
                write!(f, "{len} bytes requested; at most {max} per IO")
            }
            Self::DiscardUnsupported(volume) => {
                write!(f, "{volume} does not support discard")
            }
            Self::Disconnected => f.write_str("the session is down"),
            Self::Refused(error) => write!(f, "refused: {error}"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// How a submitted IO failed (the completion's error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoError {
    /// The server answered with this errno.
    Remote(RemoteError),
    /// The RNBD builder refused a piece (for example the volume shrank
    /// when it was re-opened).
    Refused(ClientError),
    /// The RTRS client refused a piece for a reason other than the session
    /// being down (should not happen with a well-behaved server).
    Transport(rtrs::client::SubmitError),
    /// The session stayed down (or the policy is to fail at once).
    Disconnected {
        /// How long the IO was held, in nanoseconds.
        held_ns: u64,
    },
    /// The volume could not be re-opened after a reconnect.
    VolumeLost(OpenError),
    /// The volume or the session was closed while the IO waited.
    Closed,
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Remote(error) => write!(
                f,
                "the target failed the IO: {error:?} (errno {})",
                error.errno()
            ),
            Self::Refused(error) => write!(f, "refused: {error}"),
            Self::Transport(error) => write!(f, "RTRS refused the request: {error:?}"),
            Self::Disconnected { held_ns } => write!(
                f,
                "the session is down (IO held {} ms)",
                held_ns / 1_000_000
            ),
            Self::VolumeLost(error) => write!(f, "the volume could not be re-opened: {error}"),
            Self::Closed => f.write_str("the volume or session was closed"),
        }
    }
}

impl std::error::Error for IoError {}

impl From<SubmitError> for IoError {
    /// A refusal at submission as a completion error (for callers that
    /// treat both alike).
    fn from(error: SubmitError) -> Self {
        match error {
            SubmitError::Disconnected => IoError::Disconnected { held_ns: 0 },
            SubmitError::Refused(error) => IoError::Refused(error),
            SubmitError::ReadOnly(_) => IoError::Refused(ClientError::ReadOnly),
            SubmitError::Empty => IoError::Refused(ClientError::Empty),
            SubmitError::OutOfRange { .. } => IoError::Refused(ClientError::OutOfRange),
            SubmitError::Misaligned { .. } => IoError::Refused(ClientError::Misaligned),
            SubmitError::TooLarge { .. } => IoError::Refused(ClientError::TooLarge),
            SubmitError::DiscardUnsupported(_) => IoError::Refused(ClientError::DiscardUnsupported),
            SubmitError::QueueFull { .. }
            | SubmitError::UnknownVolume(_)
            | SubmitError::NotOpen { .. } => IoError::Closed,
        }
    }
}
