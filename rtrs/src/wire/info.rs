//! INFO_REQ and INFO_RSP: session name and chunk descriptors, on cid 0.
//!
//! rtrs.md §3.1 (`struct rtrs_msg_info_req`, 272 bytes: type, 255-byte
//! session name, 15 reserved) and §3.3 (`struct rtrs_msg_info_rsp`: type,
//! `sg_cnt`, 4 reserved, then `sg_cnt` × `struct rtrs_sg_desc` {le64 addr,
//! le32 key, le32 len}). All fields little-endian.
//!
//! [`InfoRsp`] borrows its descriptor list straight from the received bytes
//! (`&[SgDesc]`, zero-copy); [`InfoRsp::check_layout`] runs the client's
//! checks of §3.3 against the CONN_RSP parameters.

use core::fmt;

use static_assertions::const_assert_eq;
use verbs::Rkey;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{emit_raw, EmitError, ImmLayout, MsgType, ParseError, PATHNAME_LEN};

/// `struct rtrs_msg_info_req` as laid out on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawInfoReq {
    /// [`MsgType::InfoReq`] (0).
    pub msg_type: U16,
    /// The session name, NUL-padded.
    pub pathname: [u8; PATHNAME_LEN],
    /// Reserved, zero.
    pub reserved: [u8; 15],
}

const_assert_eq!(core::mem::size_of::<RawInfoReq>(), InfoReq::LEN);
const_assert_eq!(core::mem::offset_of!(RawInfoReq, pathname), 2);
const_assert_eq!(core::mem::offset_of!(RawInfoReq, reserved), 257);

/// A validated INFO_REQ: the client's session name (rtrs.md §3.1, §3.2).
///
/// `parse` requires `type == 0`, at least 272 bytes, and a session name that
/// is NUL-terminated within its 255 bytes, non-empty and made of
/// `[A-Za-z0-9_-]` (Linux only forbids `/` and `.`; rnbd.md §8.1 #10 asks
/// for the stricter set, because the name ends up in paths and sysfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InfoReq<'a> {
    /// The session name (at most 254 characters).
    pub session_name: &'a str,
}

impl<'a> InfoReq<'a> {
    /// Wire length: 272 bytes.
    pub const LEN: usize = 272;

    /// Parses an INFO_REQ from the start of `buf` (the received SEND).
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `NameNotTerminated`, `EmptyName`,
    /// `ForbiddenNameChar`.
    pub fn parse(buf: &'a [u8]) -> Result<InfoReq<'a>, ParseError> {
        let (raw, _) = RawInfoReq::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if MsgType::from(raw.msg_type.get()) != MsgType::InfoReq {
            return Err(ParseError::UnexpectedType);
        }
        let name = &raw.pathname;
        let end = name
            .iter()
            .position(|&b| b == 0)
            .ok_or(ParseError::NameNotTerminated)?;
        let session_name =
            core::str::from_utf8(&name[..end]).map_err(|_| ParseError::ForbiddenNameChar)?;
        let req = InfoReq { session_name };
        req.check()?;
        Ok(req)
    }

    fn check(&self) -> Result<(), ParseError> {
        let name = self.session_name.as_bytes();
        if name.is_empty() {
            return Err(ParseError::EmptyName);
        }
        if name.len() >= PATHNAME_LEN {
            return Err(ParseError::NameNotTerminated);
        }
        if !name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ParseError::ForbiddenNameChar);
        }
        Ok(())
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 272 bytes at the start of `buf`, the name NUL-padded.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` for a name `parse` would reject.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let mut raw = RawInfoReq {
            msg_type: U16::new(MsgType::InfoReq.into()),
            pathname: [0; PATHNAME_LEN],
            reserved: [0; 15],
        };
        let name = self.session_name.as_bytes();
        raw.pathname[..name.len()].copy_from_slice(name);
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for InfoReq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RTRS INFO_REQ session_name={:?}", self.session_name)
    }
}

/// `struct rtrs_msg_info_rsp` without its descriptors.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawInfoRspHeader {
    /// [`MsgType::InfoRsp`] (1).
    pub msg_type: U16,
    /// Number of descriptors that follow.
    pub sg_cnt: U16,
    /// Reserved, zero.
    pub reserved: [u8; 4],
}

const_assert_eq!(
    core::mem::size_of::<RawInfoRspHeader>(),
    InfoRsp::HEADER_LEN
);

/// `struct rtrs_sg_desc`: one registered buffer region, as on the wire
/// (INFO_RSP list, READ request). Read it through [`SgDesc::to_repr`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct SgDesc {
    /// Remote virtual address (iova) where the region starts.
    pub addr: U64,
    /// Remote key of the region.
    pub key: U32,
    /// Length of the region in bytes.
    pub len: U32,
}

const_assert_eq!(core::mem::size_of::<SgDesc>(), SgDesc::LEN);
const_assert_eq!(core::mem::offset_of!(SgDesc, key), 8);
const_assert_eq!(core::mem::offset_of!(SgDesc, len), 12);

impl SgDesc {
    /// Wire length: 16 bytes.
    pub const LEN: usize = 16;

    /// The wire form of `desc`.
    pub fn new(desc: BufferDesc) -> SgDesc {
        SgDesc {
            addr: U64::new(desc.addr),
            key: U32::new(desc.rkey.0),
            len: U32::new(desc.len),
        }
    }

    /// The host-order values.
    pub fn to_repr(&self) -> BufferDesc {
        BufferDesc {
            addr: self.addr.get(),
            rkey: Rkey(self.key.get()),
            len: self.len.get(),
        }
    }
}

/// A remote buffer: address, rkey, length (the host form of [`SgDesc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BufferDesc {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Length in bytes.
    pub len: u32,
}

impl fmt::Display for BufferDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{addr={:#x} rkey={} len={}}}",
            self.addr, self.rkey, self.len
        )
    }
}

/// A validated INFO_RSP: the server's chunk regions (rtrs.md §3.3).
///
/// `parse` requires `type == 1`, `sg_cnt != 0` and all `sg_cnt` descriptors
/// present. The checks against the session parameters are
/// [`InfoRsp::check_layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InfoRsp<'a> {
    /// The descriptors, borrowed from the message.
    pub descriptors: &'a [SgDesc],
}

impl<'a> InfoRsp<'a> {
    /// Length of the fixed part: 8 bytes.
    pub const HEADER_LEN: usize = 8;

    /// Parses an INFO_RSP from the start of `buf` (the reassembled SEND).
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `NoDescriptors`.
    pub fn parse(buf: &'a [u8]) -> Result<InfoRsp<'a>, ParseError> {
        let (header, rest) =
            RawInfoRspHeader::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if MsgType::from(header.msg_type.get()) != MsgType::InfoRsp {
            return Err(ParseError::UnexpectedType);
        }
        let count = usize::from(header.sg_cnt.get());
        if count == 0 {
            return Err(ParseError::NoDescriptors);
        }
        let (descriptors, _) = <[SgDesc]>::ref_from_prefix_with_elems(rest, count)
            .map_err(|_| ParseError::Truncated)?;
        Ok(InfoRsp { descriptors })
    }

    /// Runs the client's checks of rtrs.md §3.3 for a session of
    /// `queue_depth` chunks of `chunk_size` bytes: `qd % sg_cnt == 0`,
    /// `sg_cnt <= qd`, the immediate bit budget, every `len` a non-zero
    /// multiple of `chunk_size`, and exactly `qd` chunks in total (checked
    /// arithmetic throughout).
    ///
    /// # Errors
    /// `ZeroQueueDepth`, `DescriptorCountMismatch`, `ImmBitsExceeded`,
    /// `DescriptorLenNotChunkMultiple`, `ChunkCountMismatch`.
    pub fn check_layout(&self, queue_depth: u16, chunk_size: u32) -> Result<(), ParseError> {
        let count = self.descriptors.len();
        if queue_depth == 0 {
            return Err(ParseError::ZeroQueueDepth);
        }
        if count > usize::from(queue_depth) || usize::from(queue_depth) % count != 0 {
            return Err(ParseError::DescriptorCountMismatch);
        }
        // Linux checks the bit budget with sg_cnt; count <= qd <= u16::MAX.
        let layout = ImmLayout::for_queue_depth(u16::try_from(count).unwrap_or(u16::MAX))?;
        layout.check_chunk_size(chunk_size)?;
        if chunk_size == 0 {
            return Err(ParseError::DescriptorLenNotChunkMultiple);
        }
        let mut chunks: u64 = 0;
        for desc in self.descriptors {
            let len = desc.len.get();
            if len == 0 || len % chunk_size != 0 {
                return Err(ParseError::DescriptorLenNotChunkMultiple);
            }
            chunks = chunks
                .checked_add(u64::from(len / chunk_size))
                .ok_or(ParseError::ChunkCountMismatch)?;
        }
        if chunks != u64::from(queue_depth) {
            return Err(ParseError::ChunkCountMismatch);
        }
        Ok(())
    }

    /// Where chunk `id` lives, given `chunk_size`: chunks are numbered
    /// globally in descriptor order, `chunk_size` apart inside each region
    /// (rtrs.md §3.3). `None` if `id` is beyond the regions or an address
    /// overflows.
    pub fn chunk(&self, chunk_size: u32, id: u32) -> Option<BufferDesc> {
        if chunk_size == 0 {
            return None;
        }
        let mut first = 0u32;
        for desc in self.descriptors {
            let desc = desc.to_repr();
            let count = desc.len / chunk_size;
            if id < first.checked_add(count)? {
                let index = id - first;
                let addr = desc
                    .addr
                    .checked_add(u64::from(index).checked_mul(u64::from(chunk_size))?)?;
                return Some(BufferDesc {
                    addr,
                    rkey: desc.rkey,
                    len: chunk_size,
                });
            }
            first = first.checked_add(count)?;
        }
        None
    }

    /// Length of the emitted message: `8 + 16 * sg_cnt`.
    pub fn buffer_len(&self) -> usize {
        Self::HEADER_LEN + SgDesc::LEN * self.descriptors.len()
    }

    /// Writes the message at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`; `Invalid(NoDescriptors)` for an empty list;
    /// `FieldTooWide` for more than 65535 descriptors.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        if self.descriptors.is_empty() {
            return Err(EmitError::Invalid(ParseError::NoDescriptors));
        }
        let count = u16::try_from(self.descriptors.len()).map_err(|_| EmitError::FieldTooWide)?;
        let len = self.buffer_len();
        let out = buf.get_mut(..len).ok_or(EmitError::BufferTooSmall)?;
        let header = RawInfoRspHeader {
            msg_type: U16::new(MsgType::InfoRsp.into()),
            sg_cnt: U16::new(count),
            reserved: [0; 4],
        };
        let (head, tail) = out.split_at_mut(Self::HEADER_LEN);
        head.copy_from_slice(header.as_bytes());
        tail.copy_from_slice(self.descriptors.as_bytes());
        Ok(len)
    }
}

impl fmt::Display for InfoRsp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RTRS INFO_RSP sg_cnt={}", self.descriptors.len())?;
        if let Some(first) = self.descriptors.first() {
            write!(f, " desc[0]={}", first.to_repr())?;
        }
        if self.descriptors.len() > 1 {
            if let Some(last) = self.descriptors.last() {
                write!(
                    f,
                    " .. desc[{}]={}",
                    self.descriptors.len() - 1,
                    last.to_repr()
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_req_bytes() -> [u8; 272] {
        let mut b = [0u8; 272];
        b[2] = b's';
        b[3] = b'1';
        b
    }

    static INFO_RSP_BYTES: [u8; 40] = [
        1, 0, 2, 0, 0, 0, 0, 0, //
        0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x14, 0x03, 0, 0, 0, 0, 2, 0, //
        0x00, 0x10, 2, 0, 0, 0, 0, 0, 0x15, 0x03, 0, 0, 0, 0, 2, 0,
    ];

    fn descs() -> [SgDesc; 2] {
        [
            SgDesc::new(BufferDesc {
                addr: 0x1000,
                rkey: Rkey(0x314),
                len: 131_072,
            }),
            SgDesc::new(BufferDesc {
                addr: 0x2_1000,
                rkey: Rkey(0x315),
                len: 131_072,
            }),
        ]
    }

    #[test]
    fn test_deconstruct() {
        let bytes = info_req_bytes();
        let (raw, _) = RawInfoReq::ref_from_prefix(&bytes[..]).unwrap();
        assert_eq!(raw.msg_type.get(), 0);
        assert_eq!(&raw.pathname[..3], b"s1\0");
        let (header, rest) = RawInfoRspHeader::ref_from_prefix(&INFO_RSP_BYTES[..]).unwrap();
        assert_eq!(header.sg_cnt.get(), 2);
        assert_eq!(rest.len(), 32);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 273];
        assert_eq!(InfoReq { session_name: "s1" }.emit(&mut buf), Ok(272));
        assert_eq!(&buf[..272], &info_req_bytes()[..]);
        assert_eq!(buf[272], 0xa5);
        let descs = descs();
        let mut buf = [0xa5u8; 40];
        assert_eq!(
            InfoRsp {
                descriptors: &descs
            }
            .emit(&mut buf),
            Ok(40)
        );
        assert_eq!(buf, INFO_RSP_BYTES);
    }

    #[test]
    fn test_parse() {
        let bytes = info_req_bytes();
        assert_eq!(InfoReq::parse(&bytes), Ok(InfoReq { session_name: "s1" }));
        let rsp = InfoRsp::parse(&INFO_RSP_BYTES).unwrap();
        assert_eq!(rsp.descriptors, &descs());
        assert_eq!(rsp.check_layout(2, 131_072), Ok(()));
        assert_eq!(
            rsp.chunk(131_072, 1),
            Some(BufferDesc {
                addr: 0x2_1000,
                rkey: Rkey(0x315),
                len: 131_072
            })
        );
        assert_eq!(rsp.chunk(131_072, 2), None);
    }

    #[test]
    fn test_emit_buffer_too_small() {
        let descs = descs();
        assert_eq!(
            InfoRsp {
                descriptors: &descs
            }
            .emit(&mut [0; 39]),
            Err(EmitError::BufferTooSmall)
        );
        assert_eq!(
            InfoRsp { descriptors: &[] }.emit(&mut [0; 39]),
            Err(EmitError::Invalid(ParseError::NoDescriptors))
        );
    }

    #[test]
    fn test_info_req_rejects() {
        let bytes = info_req_bytes();
        assert_eq!(InfoReq::parse(&bytes[..271]), Err(ParseError::Truncated));
        let mut bad = bytes;
        bad[0] = 1;
        assert_eq!(InfoReq::parse(&bad), Err(ParseError::UnexpectedType));
        let mut bad = bytes;
        bad[2..257].fill(b'a');
        assert_eq!(InfoReq::parse(&bad), Err(ParseError::NameNotTerminated));
        let mut bad = bytes;
        bad[2] = 0;
        assert_eq!(InfoReq::parse(&bad), Err(ParseError::EmptyName));
        for forbidden in [b'/', b'.', b' ', 0xff] {
            let mut bad = bytes;
            bad[3] = forbidden;
            assert_eq!(InfoReq::parse(&bad), Err(ParseError::ForbiddenNameChar));
        }
        let mut max = bytes;
        max[2..256].fill(b'x'); // 254 characters + NUL
        assert_eq!(InfoReq::parse(&max).map(|r| r.session_name.len()), Ok(254));
    }

    #[test]
    fn test_info_rsp_rejects() {
        assert_eq!(
            InfoRsp::parse(&INFO_RSP_BYTES[..39]),
            Err(ParseError::Truncated)
        );
        let mut bad = INFO_RSP_BYTES;
        bad[2] = 0;
        assert_eq!(InfoRsp::parse(&bad), Err(ParseError::NoDescriptors));
        let mut bad = INFO_RSP_BYTES;
        bad[0] = 4;
        assert_eq!(InfoRsp::parse(&bad), Err(ParseError::UnexpectedType));
        let rsp = InfoRsp::parse(&INFO_RSP_BYTES).unwrap();
        assert_eq!(
            rsp.check_layout(3, 131_072),
            Err(ParseError::DescriptorCountMismatch)
        );
        assert_eq!(
            rsp.check_layout(1, 131_072),
            Err(ParseError::DescriptorCountMismatch)
        );
        assert_eq!(
            rsp.check_layout(4, 131_072),
            Err(ParseError::ChunkCountMismatch)
        );
        assert_eq!(
            rsp.check_layout(2, 4096 * 3),
            Err(ParseError::DescriptorLenNotChunkMultiple)
        );
        assert_eq!(
            rsp.check_layout(2, 0),
            Err(ParseError::DescriptorLenNotChunkMultiple)
        );
        assert_eq!(
            rsp.check_layout(2, 1 << 28),
            Err(ParseError::ImmBitsExceeded)
        );
    }

    #[test]
    fn test_display() {
        let rsp = InfoRsp::parse(&INFO_RSP_BYTES).unwrap();
        assert!(rsp
            .to_string()
            .starts_with("RTRS INFO_RSP sg_cnt=2 desc[0]={addr=0x1000"));
    }
}
