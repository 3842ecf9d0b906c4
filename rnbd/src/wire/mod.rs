//! RNBD wire formats: every message, access modes, IO ops and flags.
//!
//! Source: `docs/protocol/rnbd.md` §2 (layouts, from Linux 6.1
//! `rnbd/rnbd-proto.h`), §3 (how block requests map to IO), §8 (what a server
//! must validate). Every message starts with the 4-byte [`RawHeader`] (le16
//! type + 2 bytes padding) and travels as the *user header* of an RTRS request
//! (`rtrs::wire::IoRequest::user_header`); responses (SESS_INFO_RSP, OPEN_RSP)
//! are RDMA-written into the client's read buffer.
//!
//! # Byte order
//!
//! **All multi-byte fields are little-endian.** Sectors are always 512 bytes.
//!
//! # Shape: zerocopy wire structs + validated `Repr`s
//!
//! As in `rtrs::wire`: `#[repr(C)]` structs of `zerocopy` little-endian field
//! types (`Raw*`) are the zero-copy views (all `Unaligned`, so they can be taken
//! at any offset of a chunk); `static_assertions` pin their sizes and offsets
//! to rnbd.md §2. The fixed C layouts make this simpler and safer than
//! hand-written field ranges. The `Repr`s ([`SessInfo`], [`SessInfoRsp`],
//! [`Open`], [`OpenRsp`], [`Close`], [`Io`], and [`Message`] over all of them)
//! exist only valid: `parse` checks what rnbd.md §8 lists at the wire level
//! (device path termination, length and characters; access mode; known op;
//! sector + size overflow with checked arithmetic; flush without data) and
//! `emit` refuses values `parse` would reject. Nothing panics on input.
//!
//! Checks that need server state (device id known, range within the device,
//! RTRS direction and `data_len` consistency, access rights) are left to the
//! server, with helpers: [`Io::check_range`], [`Message::rtrs_direction`].
//!
//! Padding and reserved bytes are not checked on input (the Linux client
//! builds messages on the stack without zeroing them) and are zero on output.
//!
//! # Example
//!
//! ```
//! use rnbd::wire::{AccessMode, Io, IoFlags, IoOp, Message, Open, ParseError};
//!
//! let open = Open { access_mode: AccessMode::ReadWrite, device_path: "ram0" };
//! let mut user_header = [0u8; Open::LEN];
//! open.emit(&mut user_header).unwrap();
//! assert_eq!(Message::parse(&user_header), Ok(Message::Open(open)));
//!
//! let io = Io {
//!     device_id: 0,
//!     sector: 2048,
//!     op: IoOp::Write,
//!     flags: IoFlags::SYNC,
//!     bi_size: 4096,
//!     prio: 0,
//! };
//! let mut buf = [0u8; Io::LEN];
//! io.emit(&mut buf).unwrap();
//! let Ok(Message::Io(parsed)) = Message::parse(&buf) else { unreachable!() };
//! assert_eq!(parsed.rw(), 0x101);
//! assert_eq!(parsed.check_range(2048 + 7), Err(ParseError::BeyondDeviceEnd));
//! assert_eq!(ParseError::BeyondDeviceEnd.errno(), 22);
//! ```

mod io;
mod open;
mod session;

use core::fmt;

use static_assertions::const_assert_eq;
use zerocopy::byteorder::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub use self::io::{Close, Io, IoFlags, IoOp, RawClose, RawIo};
pub use self::open::{
    AccessMode, CachePolicy, Open, OpenRsp, RawOpen, RawOpenRsp, DEVICE_PATH_LEN,
};
pub use self::session::{RawSessInfo, SessInfo, SessInfoRsp};

/// RNBD protocol major version (the only number exchanged, in SESS_INFO).
pub const PROTOCOL_VERSION_MAJOR: u8 = 2;
/// RNBD protocol minor version.
pub const PROTOCOL_VERSION_MINOR: u8 = 0;
/// Sector size of every sector field: 512 bytes, whatever the device's
/// logical block size.
pub const SECTOR_SIZE: u32 = 512;
/// Linux `PATH_MAX`: bound on the server's search path + device path.
pub const PATH_MAX: usize = 4096;

pub(crate) use wire_enum::enum_with_unknown;

enum_with_unknown! {
    /// `enum rnbd_msg_type`: the le16 at the start of every message (rnbd.md §2.1).
    pub enum MsgType(u16) {
        /// `RNBD_MSG_SESS_INFO`: client -> server, protocol version.
        SessInfo = 0,
        /// `RNBD_MSG_SESS_INFO_RSP`: server -> client, negotiated version.
        SessInfoRsp = 1,
        /// `RNBD_MSG_OPEN`: client -> server, map a device.
        Open = 2,
        /// `RNBD_MSG_OPEN_RSP`: server -> client, device id and geometry.
        OpenRsp = 3,
        /// `RNBD_MSG_IO`: client -> server, one block request.
        Io = 4,
        /// `RNBD_MSG_CLOSE`: client -> server, unmap a device.
        Close = 5,
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgType::SessInfo => f.write_str("SESS_INFO"),
            MsgType::SessInfoRsp => f.write_str("SESS_INFO_RSP"),
            MsgType::Open => f.write_str("OPEN"),
            MsgType::OpenRsp => f.write_str("OPEN_RSP"),
            MsgType::Io => f.write_str("IO"),
            MsgType::Close => f.write_str("CLOSE"),
            MsgType::Unknown(value) => write!(f, "type {value}"),
        }
    }
}

/// `struct rnbd_msg_hdr`: type + padding (rnbd.md §2.1).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawHeader {
    /// [`MsgType`].
    pub msg_type: U16,
    /// Unspecified on input, zero on output.
    pub padding: U16,
}

/// Length of [`RawHeader`].
pub const HEADER_LEN: usize = 4;
const_assert_eq!(core::mem::size_of::<RawHeader>(), HEADER_LEN);

impl RawHeader {
    pub(crate) fn new(msg_type: MsgType) -> RawHeader {
        RawHeader {
            msg_type: U16::new(msg_type.into()),
            padding: U16::new(0),
        }
    }
}

/// Why received bytes are not a valid RNBD message. Each variant names the
/// invariant the peer broke; [`ParseError::errno`] gives the reply errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseError {
    /// The buffer (the RTRS user header) is shorter than the message
    /// (rnbd.md §8.3 #24).
    Truncated,
    /// The type is not the one this message must carry.
    UnexpectedType,
    /// The type is no RNBD message type (rnbd.md §8.3 #25).
    UnknownType,
    /// OPEN `access_mode` not RO/RW/MIGRATION (rnbd.md §8.3 #30).
    UnknownAccessMode,
    /// OPEN `dev_name` without a NUL in its 255 bytes (rnbd.md §8.3 #28).
    PathNotTerminated,
    /// OPEN `dev_name` empty.
    EmptyPath,
    /// OPEN `dev_name` holds a character outside the allowed set.
    ForbiddenPathChar,
    /// OPEN `dev_name` contains `..` (rnbd.md §4.2 step 3).
    PathTraversal,
    /// IO op not READ/WRITE/FLUSH/DISCARD/SECURE_ERASE (rnbd.md §8.3 #33).
    UnsupportedOp,
    /// IO `bi_size` is not a multiple of 512.
    UnalignedSize,
    /// IO `sector + bi_size / 512` overflows, or its byte offset does not fit
    /// 64 bits (rnbd.md §8.3 #35).
    SectorRangeOverflow,
    /// IO range ends beyond the device ([`Io::check_range`]).
    BeyondDeviceEnd,
    /// FLUSH with `bi_size != 0` (rnbd.md §8.3 #34).
    FlushWithData,
    /// OPEN_RSP `logical_block_size` not a power of two in 512..=4096 (0
    /// makes the Linux client fail the open).
    BadLogicalBlockSize,
    /// OPEN_RSP `physical_block_size` not a power of two at least the
    /// logical block size.
    BadPhysicalBlockSize,
}

impl ParseError {
    /// The errno to answer with (the positive value the RTRS immediate
    /// carries): `EOPNOTSUPP` for an unsupported op, `EINVAL` for the rest
    /// (rnbd.md §4.5, §8.3).
    pub const fn errno(self) -> u16 {
        match self {
            ParseError::UnsupportedOp => ::errno::EOPNOTSUPP,
            _ => ::errno::EINVAL,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::Truncated => "truncated",
            ParseError::UnexpectedType => "unexpected message type",
            ParseError::UnknownType => "unknown message type",
            ParseError::UnknownAccessMode => "unknown access mode",
            ParseError::PathNotTerminated => "device path not NUL-terminated",
            ParseError::EmptyPath => "empty device path",
            ParseError::ForbiddenPathChar => "forbidden character in device path",
            ParseError::PathTraversal => "device path contains ..",
            ParseError::UnsupportedOp => "unsupported IO op",
            ParseError::UnalignedSize => "IO size not a multiple of 512",
            ParseError::SectorRangeOverflow => "sector range overflows",
            ParseError::BeyondDeviceEnd => "IO beyond device end",
            ParseError::FlushWithData => "flush with data",
            ParseError::BadLogicalBlockSize => "bad logical block size",
            ParseError::BadPhysicalBlockSize => "bad physical block size",
        })
    }
}

impl core::error::Error for ParseError {}

/// Why a value could not be emitted. Every variant is a caller error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EmitError {
    /// The buffer is shorter than `buffer_len()`.
    BufferTooSmall,
    /// The value breaks an invariant `parse` checks.
    Invalid(ParseError),
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmitError::BufferTooSmall => f.write_str("buffer too small"),
            EmitError::Invalid(error) => write!(f, "invalid value: {error}"),
        }
    }
}

impl core::error::Error for EmitError {}

impl From<ParseError> for EmitError {
    fn from(error: ParseError) -> Self {
        EmitError::Invalid(error)
    }
}

/// The RTRS request kind a message must arrive as (rnbd.md §1.1, §8.3 #26).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrsDirection {
    /// An RTRS READ: the server answers with data RDMA-written to the client.
    Read,
    /// An RTRS WRITE: the data (if any) is in the chunk; the answer is the
    /// immediate only.
    Write,
}

/// Any RNBD message (dispatch on the header type, rnbd.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message<'a> {
    /// SESS_INFO.
    SessInfo(SessInfo),
    /// SESS_INFO_RSP.
    SessInfoRsp(SessInfoRsp),
    /// OPEN.
    Open(Open<'a>),
    /// OPEN_RSP.
    OpenRsp(OpenRsp),
    /// CLOSE.
    Close(Close),
    /// IO.
    Io(Io),
}

impl<'a> Message<'a> {
    /// Parses the message at the start of `buf` (an RTRS user header, or a
    /// response buffer), dispatching on its type.
    ///
    /// # Errors
    /// `Truncated`, `UnknownType`, or the message's own errors.
    pub fn parse(buf: &'a [u8]) -> Result<Message<'a>, ParseError> {
        let (header, _) = RawHeader::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        Ok(match MsgType::from(header.msg_type.get()) {
            MsgType::SessInfo => Message::SessInfo(SessInfo::parse(buf)?),
            MsgType::SessInfoRsp => Message::SessInfoRsp(SessInfoRsp::parse(buf)?),
            MsgType::Open => Message::Open(Open::parse(buf)?),
            MsgType::OpenRsp => Message::OpenRsp(OpenRsp::parse(buf)?),
            MsgType::Io => Message::Io(Io::parse(buf)?),
            MsgType::Close => Message::Close(Close::parse(buf)?),
            MsgType::Unknown(_) => return Err(ParseError::UnknownType),
        })
    }

    /// The message's type.
    pub const fn msg_type(&self) -> MsgType {
        match self {
            Message::SessInfo(_) => MsgType::SessInfo,
            Message::SessInfoRsp(_) => MsgType::SessInfoRsp,
            Message::Open(_) => MsgType::Open,
            Message::OpenRsp(_) => MsgType::OpenRsp,
            Message::Close(_) => MsgType::Close,
            Message::Io(_) => MsgType::Io,
        }
    }

    /// The RTRS request kind a client message must arrive as: SESS_INFO,
    /// OPEN, IO READ and FLUSH as READ; CLOSE and the other IO ops as WRITE.
    /// `None` for the responses, which are not requests.
    pub const fn rtrs_direction(&self) -> Option<RtrsDirection> {
        match self {
            Message::SessInfo(_) | Message::Open(_) => Some(RtrsDirection::Read),
            Message::Close(_) => Some(RtrsDirection::Write),
            Message::Io(io) => Some(io.op.rtrs_direction()),
            Message::SessInfoRsp(_) | Message::OpenRsp(_) => None,
        }
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        match self {
            Message::SessInfo(_) | Message::SessInfoRsp(_) => SessInfo::LEN,
            Message::Open(_) => Open::LEN,
            Message::OpenRsp(_) => OpenRsp::LEN,
            Message::Close(_) => Close::LEN,
            Message::Io(_) => Io::LEN,
        }
    }

    /// Writes the message at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` if the value would not parse.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        match self {
            Message::SessInfo(msg) => msg.emit(buf),
            Message::SessInfoRsp(msg) => msg.emit(buf),
            Message::Open(msg) => msg.emit(buf),
            Message::OpenRsp(msg) => msg.emit(buf),
            Message::Close(msg) => msg.emit(buf),
            Message::Io(msg) => msg.emit(buf),
        }
    }
}

impl fmt::Display for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::SessInfo(msg) => msg.fmt(f),
            Message::SessInfoRsp(msg) => msg.fmt(f),
            Message::Open(msg) => msg.fmt(f),
            Message::OpenRsp(msg) => msg.fmt(f),
            Message::Close(msg) => msg.fmt(f),
            Message::Io(msg) => msg.fmt(f),
        }
    }
}

/// Writes `raw` (a wire struct) at the start of `buf`; returns its length.
pub(crate) fn emit_raw<T: IntoBytes + Immutable>(
    raw: &T,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    let bytes = raw.as_bytes();
    buf.get_mut(..bytes.len())
        .ok_or(EmitError::BufferTooSmall)?
        .copy_from_slice(bytes);
    Ok(bytes.len())
}

/// Takes a `T` view from the start of `buf` after checking its type.
pub(crate) fn view<T: FromBytes + KnownLayout + Immutable + Unaligned>(
    buf: &[u8],
    expected: MsgType,
) -> Result<&T, ParseError> {
    let (header, _) = RawHeader::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
    if MsgType::from(header.msg_type.get()) != expected {
        return Err(ParseError::UnexpectedType);
    }
    T::ref_from_prefix(buf)
        .map(|(raw, _)| raw)
        .map_err(|_| ParseError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_message_dispatch() {
        let mut buf = [0u8; 8];
        buf[0] = 5;
        buf[4] = 7;
        assert_eq!(
            Message::parse(&buf),
            Ok(Message::Close(Close { device_id: 7 }))
        );
        buf[0] = 9;
        assert_eq!(Message::parse(&buf), Err(ParseError::UnknownType));
        assert_eq!(Message::parse(&buf[..3]), Err(ParseError::Truncated));
        assert_eq!(MsgType::from(9), MsgType::Unknown(9));
    }

    #[test]
    fn test_errno_mapping() {
        assert_eq!(ParseError::UnsupportedOp.errno(), 95);
        assert_eq!(ParseError::PathTraversal.errno(), 22);
        assert_eq!(ParseError::Truncated.errno(), 22);
    }
}
