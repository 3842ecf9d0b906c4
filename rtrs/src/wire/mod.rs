//! RTRS wire formats: every message, the immediate data, the constants.
//!
//! Source: `docs/protocol/rtrs.md` (§0 constants, §2.3 CON_REQ, §2.5 CONN_RSP,
//! §3 INFO_REQ/INFO_RSP, §4.2 immediate data, §4.3 WRITE, §4.4 READ, §4.6
//! RKEY_RSP), itself written from Linux 6.1 `rtrs/rtrs-pri.h`.
//!
//! # Byte order
//!
//! **Every multi-byte field of every RTRS message is little-endian** (`__le16`,
//! `__le32`, `__le64` in the Linux header). The one exception is the 32-bit
//! immediate data, which travels big-endian in the IB ImmDt header; [`Imm`]
//! works on the host value that `roce` already converted.
//!
//! # Shape: zerocopy wire structs + validated `Repr`s
//!
//! Each message has a `#[repr(C)]` struct of `zerocopy` little-endian field
//! types (`Raw*`, e.g. [`RawConnReq`]). They are the zero-copy views: a
//! `&RawConnReq` is taken straight from received bytes with
//! `zerocopy::FromBytes::ref_from_prefix` (all fields are byte arrays, so the
//! structs are `Unaligned` and any offset works, also inside a chunk). We chose
//! them over hand-written smoltcp `Packet<T>` views because the RTRS messages
//! *are* fixed C structs: the struct is the spec table, `static_assertions`
//! pin every size and offset to rtrs.md at compile time, and there are no field
//! ranges to get wrong, with no `unsafe` of our own.
//!
//! On top sit the `Repr`s ([`ConnReq`], [`ConnRsp`], [`InfoReq`], [`InfoRsp`],
//! [`WriteMsg`], [`ReadMsg`], [`RkeyRsp`], [`IoRequest`]): plain values that
//! only exist valid. `parse` checks what a peer must not get away with (magic,
//! version, type, counts and lengths, with checked arithmetic) and `emit`
//! refuses to write a value that `parse` would reject, so what Brick sends is
//! what Brick accepts. Neither ever panics; every error is a [`ParseError`]
//! variant named after the broken invariant.
//!
//! Reserved fields are written as zero and not checked on input (the Linux
//! client does not always zero them).
//!
//! # Example
//!
//! A server answering a CON_REQ and locating a write request in its chunk:
//!
//! ```
//! use rtrs::wire::{ConnRsp, ConnRspFlags, Imm, ImmLayout, IoMsg, IoRequest, WriteMsg};
//!
//! let rsp = ConnRsp::accept(512, 126_976, 4096, ConnRspFlags::NEW_RKEY);
//! let mut private_data = [0u8; 196];
//! let len = rsp.emit(&mut private_data).unwrap();
//! assert_eq!(ConnRsp::parse(&private_data[..len]), Ok(rsp));
//!
//! // Client side: 4 KiB of data, a 32-byte user header, the trailer.
//! let mut chunk = vec![0u8; 131_072];
//! WriteMsg { usr_len: 32 }.emit(&mut chunk[4128..]).unwrap();
//! let layout = ImmLayout::for_queue_depth(512).unwrap();
//! let imm = Imm::IoReq { payload: layout.join(5, 4128).unwrap() }.encode().unwrap();
//! assert_eq!(imm, 0x0028_1020);
//!
//! // Server side: decode the immediate, find the request.
//! let Imm::IoReq { payload } = Imm::decode(imm) else { unreachable!() };
//! let (buf_id, offset) = layout.split(payload);
//! assert_eq!(buf_id, 5);
//! let request = IoRequest::parse(&chunk, offset as usize).unwrap();
//! assert!(matches!(request.msg, IoMsg::Write(_)));
//! assert_eq!((request.data_len, request.user_header.len()), (4096, 32));
//! ```

mod conn;
mod imm;
mod info;
mod io;

use core::fmt;

pub use self::conn::{ConnReq, ConnRsp, ConnRspFlags, RawConnReq, RawConnRsp, Uuid};
pub use self::imm::{Imm, ImmLayout};
pub use self::info::{BufferDesc, InfoReq, InfoRsp, RawInfoReq, RawInfoRspHeader, SgDesc};
pub use self::io::{
    IoMsg, IoRequest, RawReadHeader, RawRkeyRsp, RawWriteMsg, ReadFlags, ReadMsg, RkeyRsp, WriteMsg,
};

/// `RTRS_MAGIC`: first field of CON_REQ and CONN_RSP (rtrs.md §0).
pub const MAGIC: u16 = 0x1bbd;
/// Protocol major version (rtrs.md §0). Only the major byte is checked.
pub const VERSION_MAJOR: u8 = 2;
/// Protocol minor version.
pub const VERSION_MINOR: u8 = 0;
/// The version field as sent: `(major << 8) | minor` = `0x0200`.
pub const VERSION: u16 = ((VERSION_MAJOR as u16) << 8) | VERSION_MINOR as u16;
/// Default port in the TCP port space (`RTRS_PORT`, rtrs.md §0).
pub const DEFAULT_PORT: u16 = 1234;
/// Largest `cid_num` the Linux server accepts in a CON_REQ (rtrs.md §2.4 step 3).
pub const MAX_CID_NUM: u16 = 4096;
/// Receive depth of the service connection, cid 0 (`SERVICE_CON_QUEUE_DEPTH`).
pub const SERVICE_CON_QUEUE_DEPTH: u16 = 512;
/// Largest session queue depth: the field is an le16 (rtrs.md §0).
pub const MAX_SESS_QUEUE_DEPTH: u16 = u16::MAX;
/// Paths per session (`MAX_PATHS_NUM`).
pub const MAX_PATHS_NUM: usize = 128;
/// Smallest chunk size the Linux server allows (rtrs.md §0).
pub const MIN_CHUNK_SIZE: u32 = 8192;
/// Client limit of scatter-gather segments per IO (`RTRS_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: u32 = 128;
/// Heartbeat interval in milliseconds (rtrs.md §5).
pub const HEARTBEAT_INTERVAL_MS: u32 = 5000;
/// Missed heartbeats tolerated before a path is declared dead (rtrs.md §5).
pub const HEARTBEAT_MISSED_MAX: u32 = 5;
/// Client connect / route / info timeout in milliseconds (`RTRS_CONNECT_TIMEOUT_MS`).
pub const CONNECT_TIMEOUT_MS: u32 = 30_000;
/// Bits of the immediate holding its type (rtrs.md §4.2).
pub const IMM_TYPE_BITS: u32 = 4;
/// Bits of the immediate holding its payload (rtrs.md §4.2).
pub const IMM_PAYLOAD_BITS: u32 = 28;
/// Length of the session-name field of INFO_REQ (rtrs.md §3.1).
pub const PATHNAME_LEN: usize = 255;

use wire_enum::enum_with_unknown;

enum_with_unknown! {
    /// `enum rtrs_msg_types`: the le16 `type` that starts INFO_REQ, INFO_RSP,
    /// the IO trailers and RKEY_RSP (rtrs.md §0). CON_REQ and CONN_RSP have none.
    pub enum MsgType(u16) {
        /// `RTRS_MSG_INFO_REQ`: client -> server, session name (§3.1).
        InfoReq = 0,
        /// `RTRS_MSG_INFO_RSP`: server -> client, chunk descriptors (§3.3).
        InfoRsp = 1,
        /// `RTRS_MSG_WRITE`: trailer of a write request (§4.3).
        Write = 2,
        /// `RTRS_MSG_READ`: trailer of a read request (§4.4).
        Read = 3,
        /// `RTRS_MSG_RKEY_RSP`: new chunk rkey with an IO response (§4.6).
        RkeyRsp = 4,
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgType::InfoReq => f.write_str("INFO_REQ"),
            MsgType::InfoRsp => f.write_str("INFO_RSP"),
            MsgType::Write => f.write_str("WRITE"),
            MsgType::Read => f.write_str("READ"),
            MsgType::RkeyRsp => f.write_str("RKEY_RSP"),
            MsgType::Unknown(value) => write!(f, "type {value}"),
        }
    }
}

/// Why received bytes are not a valid RTRS message. Each variant names the
/// invariant the peer broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseError {
    /// The buffer is shorter than the message (or its descriptor list).
    Truncated,
    /// CON_REQ/CONN_RSP `magic` is not [`MAGIC`].
    BadMagic,
    /// The version's major byte is not [`VERSION_MAJOR`].
    UnsupportedVersion,
    /// The le16 `type` is not the one this message must carry.
    UnexpectedType,
    /// CON_REQ `cid >= cid_num` (this also rejects `cid_num == 0`).
    CidNotBelowCidNum,
    /// CON_REQ `cid_num` above [`MAX_CID_NUM`].
    TooManyConnections,
    /// An accepting CONN_RSP (errno 0) with `queue_depth == 0`.
    ZeroQueueDepth,
    /// An accepting CONN_RSP with `max_io_size == 0`.
    ZeroMaxIoSize,
    /// `max_io_size + max_hdr_size` does not fit 32 bits.
    ChunkSizeOverflow,
    /// INFO_RSP with `sg_cnt == 0`.
    NoDescriptors,
    /// READ request with `sg_cnt > 1` (Linux serves 0 or 1 only).
    TooManyReadDescriptors,
    /// INFO_REQ session name without a NUL in its 255 bytes.
    NameNotTerminated,
    /// INFO_REQ session name is empty.
    EmptyName,
    /// INFO_REQ session name holds a character outside `[A-Za-z0-9_-]`
    /// (Linux forbids `/` and `.`; rnbd.md §8.1 #10 asks for this set).
    ForbiddenNameChar,
    /// IO request offset at or beyond the end of the chunk.
    OffsetBeyondChunk,
    /// The RTRS message at the offset does not fit in the chunk (rnbd.md §8.2 #15).
    MessageBeyondChunk,
    /// `usr_len > offset`: the user header would start before the chunk.
    UserHeaderBeyondChunkStart,
    /// INFO_RSP `qd % sg_cnt != 0`, or more descriptors than queue depth.
    DescriptorCountMismatch,
    /// An INFO_RSP descriptor with `len == 0` or `len % chunk_size != 0`.
    DescriptorLenNotChunkMultiple,
    /// INFO_RSP descriptors do not add up to exactly `qd` chunks.
    ChunkCountMismatch,
    /// `ceil(log2(chunks)) + ceil(log2(chunk_size)) > 28`: the immediate cannot
    /// address every byte (rtrs.md §4.2).
    ImmBitsExceeded,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::Truncated => "truncated",
            ParseError::BadMagic => "bad magic",
            ParseError::UnsupportedVersion => "unsupported version",
            ParseError::UnexpectedType => "unexpected message type",
            ParseError::CidNotBelowCidNum => "cid not below cid_num",
            ParseError::TooManyConnections => "cid_num above limit",
            ParseError::ZeroQueueDepth => "zero queue depth",
            ParseError::ZeroMaxIoSize => "zero max_io_size",
            ParseError::ChunkSizeOverflow => "chunk size overflows",
            ParseError::NoDescriptors => "no buffer descriptors",
            ParseError::TooManyReadDescriptors => "more than one read descriptor",
            ParseError::NameNotTerminated => "session name not NUL-terminated",
            ParseError::EmptyName => "empty session name",
            ParseError::ForbiddenNameChar => "forbidden character in session name",
            ParseError::OffsetBeyondChunk => "offset beyond chunk",
            ParseError::MessageBeyondChunk => "message beyond chunk",
            ParseError::UserHeaderBeyondChunkStart => "user header before chunk start",
            ParseError::DescriptorCountMismatch => "descriptor count does not divide queue depth",
            ParseError::DescriptorLenNotChunkMultiple => "descriptor length not a chunk multiple",
            ParseError::ChunkCountMismatch => "descriptors do not cover queue depth chunks",
            ParseError::ImmBitsExceeded => "chunk id and offset exceed 28 immediate bits",
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
    /// The value breaks an invariant `parse` checks; emitting it would send
    /// what Brick itself rejects.
    Invalid(ParseError),
    /// A field does not fit its wire width (for example an immediate's
    /// 19-bit msg_id, or more than 65535 descriptors).
    FieldTooWide,
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmitError::BufferTooSmall => f.write_str("buffer too small"),
            EmitError::Invalid(error) => write!(f, "invalid value: {error}"),
            EmitError::FieldTooWide => f.write_str("field too wide for the wire"),
        }
    }
}

impl core::error::Error for EmitError {}

impl From<ParseError> for EmitError {
    fn from(error: ParseError) -> Self {
        EmitError::Invalid(error)
    }
}

/// Reads the le16 `type` at the start of `buf`: what kind of message follows
/// (INFO_REQ, INFO_RSP, the IO trailers, RKEY_RSP).
///
/// # Errors
/// [`ParseError::Truncated`] if `buf` is shorter than 2 bytes.
pub fn peek_type(buf: &[u8]) -> Result<MsgType, ParseError> {
    read_u16_le(buf, 0).map(MsgType::from)
}

/// Reads a little-endian u16 at `offset`, or `Truncated`.
pub(crate) fn read_u16_le(buf: &[u8], offset: usize) -> Result<u16, ParseError> {
    let end = offset.checked_add(2).ok_or(ParseError::Truncated)?;
    match buf.get(offset..end) {
        Some(&[a, b]) => Ok(u16::from_le_bytes([a, b])),
        _ => Err(ParseError::Truncated),
    }
}

/// Writes `raw` (a wire struct) at the start of `buf`; returns its length.
pub(crate) fn emit_raw<T: zerocopy::IntoBytes + zerocopy::Immutable>(
    raw: &T,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    let bytes = raw.as_bytes();
    buf.get_mut(..bytes.len())
        .ok_or(EmitError::BufferTooSmall)?
        .copy_from_slice(bytes);
    Ok(bytes.len())
}

/// Major byte of an RTRS version field.
pub(crate) const fn version_major(version: u16) -> u8 {
    (version >> 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_version_constant() {
        assert_eq!(VERSION, 0x0200);
        assert_eq!(version_major(VERSION), 2);
    }

    #[test]
    fn test_msg_type_unknown() {
        assert_eq!(MsgType::from(3), MsgType::Read);
        assert_eq!(MsgType::from(7), MsgType::Unknown(7));
        assert_eq!(u16::from(MsgType::Unknown(7)), 7);
        assert_eq!(peek_type(&[4, 0, 9]), Ok(MsgType::RkeyRsp));
        assert_eq!(peek_type(&[4]), Err(ParseError::Truncated));
    }
}
