//! IO request trailers (WRITE, READ) and RKEY_RSP, plus locating a request in
//! its chunk.
//!
//! rtrs.md §4.3: a write request is one RDMA WRITE WITH IMM from the chunk
//! base: `[data (data_len)] [user header (usr_len)] [RTRS_MSG_RDMA_WRITE, 4]`.
//! §4.4: a read request writes only `[user header] [RTRS_MSG_RDMA_READ, 8 +
//! 16·sg_cnt]` at chunk offset `data_len`. In both the immediate carries
//! `offset = data_len + usr_len`, the position of the RTRS message;
//! [`IoRequest::parse`] goes from (chunk, offset) back to the pieces.
//! §4.6: `struct rtrs_msg_rkey_rsp` (8 bytes), the payload of the SEND WITH
//! IMM that answers a request when NEW_RKEY_F is on. All fields little-endian.

use core::fmt;

use static_assertions::const_assert_eq;
use verbs::Rkey;
use zerocopy::byteorder::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{emit_raw, read_u16_le, BufferDesc, EmitError, MsgType, ParseError, SgDesc};

/// `struct rtrs_msg_rdma_write` as laid out on the wire (4 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawWriteMsg {
    /// [`MsgType::Write`] (2).
    pub msg_type: U16,
    /// Length of the user header right before this message.
    pub usr_len: U16,
}

const_assert_eq!(core::mem::size_of::<RawWriteMsg>(), WriteMsg::LEN);

/// The trailer of a write request (rtrs.md §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteMsg {
    /// Length of the user (RNBD) header before the trailer.
    pub usr_len: u16,
}

impl WriteMsg {
    /// Wire length: 4 bytes.
    pub const LEN: usize = 4;

    /// Parses the trailer at the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`.
    pub fn parse(buf: &[u8]) -> Result<WriteMsg, ParseError> {
        let (raw, _) = RawWriteMsg::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if MsgType::from(raw.msg_type.get()) != MsgType::Write {
            return Err(ParseError::UnexpectedType);
        }
        Ok(WriteMsg {
            usr_len: raw.usr_len.get(),
        })
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 4 bytes at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let raw = RawWriteMsg {
            msg_type: U16::new(MsgType::Write.into()),
            usr_len: U16::new(self.usr_len),
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for WriteMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RTRS WRITE usr_len={}", self.usr_len)
    }
}

/// READ request `flags` (le16). Unknown bits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadFlags(pub u16);

impl ReadFlags {
    /// `RTRS_MSG_NEED_INVAL_F` (bit 0): invalidate `desc[0].key` with a
    /// SEND_WITH_INV and answer with IO_RSP_W_INV (rtrs.md §4.4, §4.6).
    pub const NEED_INVAL: ReadFlags = ReadFlags(1 << 0);

    /// True if every bit of `other` is set.
    pub const fn contains(self, other: ReadFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `struct rtrs_msg_rdma_read` without its descriptors (8 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawReadHeader {
    /// [`MsgType::Read`] (3).
    pub msg_type: U16,
    /// Length of the user header right before this message.
    pub usr_len: U16,
    /// [`ReadFlags`].
    pub flags: U16,
    /// Number of [`SgDesc`] that follow (0 or 1 in practice).
    pub sg_cnt: U16,
}

const_assert_eq!(core::mem::size_of::<RawReadHeader>(), ReadMsg::HEADER_LEN);

/// The trailer of a read request: where the server RDMA-writes the data
/// (rtrs.md §4.4).
///
/// `parse` accepts `sg_cnt` 0 or 1 only: that is all Linux serves, and
/// rnbd.md §8.2 #18 says reject the rest. The descriptor's `len` is checked
/// against the chunk by the server state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadMsg {
    /// Length of the user (RNBD) header before the trailer.
    pub usr_len: u16,
    /// [`ReadFlags::NEED_INVAL`] or none.
    pub flags: ReadFlags,
    /// The client buffer (`sg_cnt == 1`), or `None` for data-less reads
    /// (`sg_cnt == 0`, e.g. RNBD FLUSH).
    pub desc: Option<BufferDesc>,
}

impl ReadMsg {
    /// Length of the fixed part: 8 bytes.
    pub const HEADER_LEN: usize = 8;

    /// Parses the trailer at the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `TooManyReadDescriptors`.
    pub fn parse(buf: &[u8]) -> Result<ReadMsg, ParseError> {
        let (raw, rest) = RawReadHeader::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if MsgType::from(raw.msg_type.get()) != MsgType::Read {
            return Err(ParseError::UnexpectedType);
        }
        let desc = match raw.sg_cnt.get() {
            0 => None,
            1 => {
                let (desc, _) = SgDesc::ref_from_prefix(rest).map_err(|_| ParseError::Truncated)?;
                Some(desc.to_repr())
            }
            _ => return Err(ParseError::TooManyReadDescriptors),
        };
        Ok(ReadMsg {
            usr_len: raw.usr_len.get(),
            flags: ReadFlags(raw.flags.get()),
            desc,
        })
    }

    /// Length of the emitted message: 8, or 24 with a descriptor.
    pub const fn buffer_len(&self) -> usize {
        match self.desc {
            Some(_) => Self::HEADER_LEN + SgDesc::LEN,
            None => Self::HEADER_LEN,
        }
    }

    /// Writes the message at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let len = self.buffer_len();
        let out = buf.get_mut(..len).ok_or(EmitError::BufferTooSmall)?;
        let raw = RawReadHeader {
            msg_type: U16::new(MsgType::Read.into()),
            usr_len: U16::new(self.usr_len),
            flags: U16::new(self.flags.0),
            sg_cnt: U16::new(u16::from(self.desc.is_some())),
        };
        let (head, tail) = out.split_at_mut(Self::HEADER_LEN);
        head.copy_from_slice(raw.as_bytes());
        if let Some(desc) = self.desc {
            tail.copy_from_slice(SgDesc::new(desc).as_bytes());
        }
        Ok(len)
    }
}

impl fmt::Display for ReadMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RTRS READ usr_len={} flags={:#x}",
            self.usr_len, self.flags.0
        )?;
        if self.flags.contains(ReadFlags::NEED_INVAL) {
            f.write_str(" (NEED_INVAL)")?;
        }
        match self.desc {
            Some(desc) => write!(f, " sg_cnt=1 desc={desc}"),
            None => f.write_str(" sg_cnt=0"),
        }
    }
}

/// `struct rtrs_msg_rkey_rsp` as laid out on the wire (8 bytes).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawRkeyRsp {
    /// [`MsgType::RkeyRsp`] (4).
    pub msg_type: U16,
    /// The chunk id (equals the imm's msg_id).
    pub buf_id: U16,
    /// The chunk's new rkey.
    pub rkey: U32,
}

const_assert_eq!(core::mem::size_of::<RawRkeyRsp>(), RkeyRsp::LEN);
const_assert_eq!(core::mem::offset_of!(RawRkeyRsp, rkey), 4);

/// RKEY_RSP: chunk `buf_id` is now reachable under `rkey` (rtrs.md §4.6).
///
/// `buf_id < qd` and `buf_id == msg_id` of the immediate are checked by the
/// client state machine, which knows both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RkeyRsp {
    /// The chunk id.
    pub buf_id: u16,
    /// The new rkey for the next request on this chunk.
    pub rkey: Rkey,
}

impl RkeyRsp {
    /// Wire length: 8 bytes (also the size of every client receive buffer
    /// under NEW_RKEY_F).
    pub const LEN: usize = 8;

    /// Parses an RKEY_RSP from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`.
    pub fn parse(buf: &[u8]) -> Result<RkeyRsp, ParseError> {
        let (raw, _) = RawRkeyRsp::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if MsgType::from(raw.msg_type.get()) != MsgType::RkeyRsp {
            return Err(ParseError::UnexpectedType);
        }
        Ok(RkeyRsp {
            buf_id: raw.buf_id.get(),
            rkey: Rkey(raw.rkey.get()),
        })
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 8 bytes at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let raw = RawRkeyRsp {
            msg_type: U16::new(MsgType::RkeyRsp.into()),
            buf_id: U16::new(self.buf_id),
            rkey: U32::new(self.rkey.0),
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for RkeyRsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RTRS RKEY_RSP buf_id={} rkey={}", self.buf_id, self.rkey)
    }
}

/// The RTRS message of an IO request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoMsg {
    /// A write: the data is in the chunk.
    Write(WriteMsg),
    /// A read: the server fills the chunk and writes it to the client.
    Read(ReadMsg),
}

impl fmt::Display for IoMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoMsg::Write(msg) => msg.fmt(f),
            IoMsg::Read(msg) => msg.fmt(f),
        }
    }
}

/// An IO request located in its chunk (rtrs.md §4.5 steps 2-7, with the
/// checks Linux skips, rnbd.md §8.2 #14-#18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoRequest<'a> {
    /// The trailer.
    pub msg: IoMsg,
    /// The user (RNBD) header: `chunk[data_len .. offset]`.
    pub user_header: &'a [u8],
    /// Length of the data area at the chunk start: `offset - usr_len` (the
    /// write data, or the room for the read data).
    pub data_len: usize,
}

impl<'a> IoRequest<'a> {
    /// Finds the request whose RTRS message is at `offset` of `chunk` (the
    /// whole chunk, from its base): checks `offset < chunk.len()`, that the
    /// whole message fits the chunk, type WRITE or READ, and
    /// `usr_len <= offset`.
    ///
    /// # Errors
    /// `OffsetBeyondChunk`, `MessageBeyondChunk`, `UnexpectedType`,
    /// `TooManyReadDescriptors`, `UserHeaderBeyondChunkStart`.
    pub fn parse(chunk: &'a [u8], offset: usize) -> Result<IoRequest<'a>, ParseError> {
        let msg = chunk.get(offset..).ok_or(ParseError::OffsetBeyondChunk)?;
        if msg.is_empty() {
            return Err(ParseError::OffsetBeyondChunk);
        }
        let beyond = |error| match error {
            ParseError::Truncated => ParseError::MessageBeyondChunk,
            other => other,
        };
        let (msg, usr_len) = match MsgType::from(read_u16_le(msg, 0).map_err(beyond)?) {
            MsgType::Write => {
                let write = WriteMsg::parse(msg).map_err(beyond)?;
                (IoMsg::Write(write), write.usr_len)
            }
            MsgType::Read => {
                let read = ReadMsg::parse(msg).map_err(beyond)?;
                (IoMsg::Read(read), read.usr_len)
            }
            _ => return Err(ParseError::UnexpectedType),
        };
        let data_len = offset
            .checked_sub(usize::from(usr_len))
            .ok_or(ParseError::UserHeaderBeyondChunkStart)?;
        Ok(IoRequest {
            msg,
            user_header: &chunk[data_len..offset],
            data_len,
        })
    }
}

impl fmt::Display for IoRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} data_len={}", self.msg, self.data_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 24-byte READ trailer of frame 23 of rnbd-linux-srv-linux-clt.pcap
    /// (SESS_INFO: usr_len 36, NEED_INVAL, one 36-byte descriptor); the
    /// address bytes are illustrative.
    static READ_BYTES: [u8; 24] = [
        3, 0, 36, 0, 1, 0, 1, 0, //
        0x00, 0x20, 0x43, 0x02, 0x80, 0x88, 0xff, 0xff, 0x14, 0x03, 0, 0, 36, 0, 0, 0,
    ];

    fn read_repr() -> ReadMsg {
        ReadMsg {
            usr_len: 36,
            flags: ReadFlags::NEED_INVAL,
            desc: Some(BufferDesc {
                addr: 0xffff_8880_0243_2000,
                rkey: Rkey(0x314),
                len: 36,
            }),
        }
    }

    #[test]
    fn test_deconstruct() {
        let (raw, rest) = RawReadHeader::ref_from_prefix(&READ_BYTES[..]).unwrap();
        assert_eq!(raw.msg_type.get(), 3);
        assert_eq!(raw.sg_cnt.get(), 1);
        assert_eq!(rest.len(), 16);
        let (raw, _) = RawRkeyRsp::ref_from_prefix(&[4u8, 0, 5, 0, 0x15, 3, 0, 0][..]).unwrap();
        assert_eq!(raw.buf_id.get(), 5);
        assert_eq!(raw.rkey.get(), 0x315);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 25];
        assert_eq!(read_repr().emit(&mut buf), Ok(24));
        assert_eq!(&buf[..24], &READ_BYTES[..]);
        assert_eq!(buf[24], 0xa5);
        let mut buf = [0xa5u8; 9];
        assert_eq!(
            RkeyRsp {
                buf_id: 5,
                rkey: Rkey(0x315)
            }
            .emit(&mut buf),
            Ok(8)
        );
        assert_eq!(buf, [4, 0, 5, 0, 0x15, 3, 0, 0, 0xa5]);
        let mut buf = [0xa5u8; 4];
        assert_eq!(WriteMsg { usr_len: 32 }.emit(&mut buf), Ok(4));
        assert_eq!(buf, [2, 0, 32, 0]);
    }

    #[test]
    fn test_parse() {
        assert_eq!(ReadMsg::parse(&READ_BYTES), Ok(read_repr()));
        assert_eq!(WriteMsg::parse(&[2, 0, 8, 0]), Ok(WriteMsg { usr_len: 8 }));
        assert_eq!(
            RkeyRsp::parse(&[4, 0, 5, 0, 0x15, 3, 0, 0]),
            Ok(RkeyRsp {
                buf_id: 5,
                rkey: Rkey(0x315)
            })
        );
        // A flush: READ without descriptor.
        assert_eq!(
            ReadMsg::parse(&[3, 0, 32, 0, 0, 0, 0, 0]),
            Ok(ReadMsg {
                usr_len: 32,
                flags: ReadFlags(0),
                desc: None
            })
        );
    }

    #[test]
    fn test_emit_buffer_too_small() {
        assert_eq!(
            read_repr().emit(&mut [0; 23]),
            Err(EmitError::BufferTooSmall)
        );
        assert_eq!(
            WriteMsg { usr_len: 0 }.emit(&mut [0; 3]),
            Err(EmitError::BufferTooSmall)
        );
    }

    #[test]
    fn test_rejects() {
        assert_eq!(
            ReadMsg::parse(&READ_BYTES[..23]),
            Err(ParseError::Truncated)
        );
        let mut bad = READ_BYTES;
        bad[6] = 2;
        assert_eq!(
            ReadMsg::parse(&bad),
            Err(ParseError::TooManyReadDescriptors)
        );
        assert_eq!(
            WriteMsg::parse(&[3, 0, 8, 0]),
            Err(ParseError::UnexpectedType)
        );
        assert_eq!(
            RkeyRsp::parse(&[4, 0, 5, 0, 0x15, 3, 0]),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_io_request_in_chunk() {
        // A 4 KiB write on a 8 KiB chunk: data, 32-byte user header, trailer.
        let mut chunk = [0u8; 8192];
        chunk[4096] = 0xee;
        WriteMsg { usr_len: 32 }.emit(&mut chunk[4128..]).unwrap();
        let request = IoRequest::parse(&chunk, 4128).unwrap();
        assert_eq!(request.msg, IoMsg::Write(WriteMsg { usr_len: 32 }));
        assert_eq!(request.data_len, 4096);
        assert_eq!(request.user_header.len(), 32);
        assert_eq!(request.user_header[0], 0xee);

        assert_eq!(
            IoRequest::parse(&chunk, 8192),
            Err(ParseError::OffsetBeyondChunk)
        );
        chunk[8190] = 2; // a WRITE trailer needs 4 bytes, 2 are left
        assert_eq!(
            IoRequest::parse(&chunk, 8190),
            Err(ParseError::MessageBeyondChunk)
        );
        assert_eq!(IoRequest::parse(&chunk, 0), Err(ParseError::UnexpectedType));
        // A read whose descriptor would run past the chunk (rnbd.md §8.2 #15).
        read_repr().emit(&mut chunk[8170..]).unwrap_err();
        chunk[8180..8188].copy_from_slice(&[3, 0, 0, 0, 1, 0, 1, 0]);
        assert_eq!(
            IoRequest::parse(&chunk, 8180),
            Err(ParseError::MessageBeyondChunk)
        );
        // usr_len larger than the offset.
        WriteMsg { usr_len: 33 }.emit(&mut chunk[32..]).unwrap();
        assert_eq!(
            IoRequest::parse(&chunk, 32),
            Err(ParseError::UserHeaderBeyondChunkStart)
        );
    }
}
