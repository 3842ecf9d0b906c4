//! SESS_INFO and SESS_INFO_RSP: protocol version negotiation.
//!
//! rnbd.md §2.2 and §2.3: 36 bytes each, header + `ver` (u8) + 31 reserved.
//! The server answers `min(client ver, 2)`; the version only gates `prio` in
//! IO messages (§2.3).

use core::fmt;

use static_assertions::const_assert_eq;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{emit_raw, view, EmitError, MsgType, ParseError, RawHeader};

/// `struct rnbd_msg_sess_info` / `rnbd_msg_sess_info_rsp` on the wire
/// (identical layouts, different types).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawSessInfo {
    /// Type 0 (SESS_INFO) or 1 (SESS_INFO_RSP).
    pub header: RawHeader,
    /// Protocol major version.
    pub ver: u8,
    /// Reserved.
    pub reserved: [u8; 31],
}

const_assert_eq!(core::mem::size_of::<RawSessInfo>(), SessInfo::LEN);
const_assert_eq!(core::mem::offset_of!(RawSessInfo, ver), 4);

/// SESS_INFO: the client's protocol major version (rnbd.md §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessInfo {
    /// The client's major version (2 for Linux 6.1).
    pub ver: u8,
}

impl SessInfo {
    /// Wire length: 36 bytes.
    pub const LEN: usize = 36;

    /// Parses a SESS_INFO from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`.
    pub fn parse(buf: &[u8]) -> Result<SessInfo, ParseError> {
        let raw: &RawSessInfo = view(buf, MsgType::SessInfo)?;
        Ok(SessInfo { ver: raw.ver })
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 36 bytes at the start of `buf`.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        emit_raw(&raw(MsgType::SessInfo, self.ver), buf)
    }
}

impl fmt::Display for SessInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RNBD SESS_INFO ver={}", self.ver)
    }
}

/// SESS_INFO_RSP: the negotiated version (rnbd.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessInfoRsp {
    /// `min(client ver, 2)`.
    pub ver: u8,
}

impl SessInfoRsp {
    /// Wire length: 36 bytes.
    pub const LEN: usize = 36;

    /// Parses a SESS_INFO_RSP from the start of `buf`. The type is checked
    /// (the Linux client does not check it; Brick's client does).
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`.
    pub fn parse(buf: &[u8]) -> Result<SessInfoRsp, ParseError> {
        let raw: &RawSessInfo = view(buf, MsgType::SessInfoRsp)?;
        Ok(SessInfoRsp { ver: raw.ver })
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 36 bytes at the start of `buf`, reserved bytes zero.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        emit_raw(&raw(MsgType::SessInfoRsp, self.ver), buf)
    }
}

impl fmt::Display for SessInfoRsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RNBD SESS_INFO_RSP ver={}", self.ver)
    }
}

fn raw(msg_type: MsgType, ver: u8) -> RawSessInfo {
    RawSessInfo {
        header: RawHeader::new(msg_type),
        ver,
        reserved: [0; 31],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(msg_type: u8) -> [u8; 36] {
        let mut b = [0u8; 36];
        b[0] = msg_type;
        b[4] = 2;
        b
    }

    #[test]
    fn test_deconstruct() {
        let b = bytes(0);
        let (raw, _) = RawSessInfo::ref_from_prefix(&b[..]).unwrap();
        assert_eq!(raw.header.msg_type.get(), 0);
        assert_eq!(raw.ver, 2);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 37];
        assert_eq!(SessInfoRsp { ver: 2 }.emit(&mut buf), Ok(36));
        assert_eq!(&buf[..36], &bytes(1)[..]);
        assert_eq!(buf[36], 0xa5);
    }

    #[test]
    fn test_parse() {
        assert_eq!(SessInfo::parse(&bytes(0)), Ok(SessInfo { ver: 2 }));
        assert_eq!(SessInfoRsp::parse(&bytes(1)), Ok(SessInfoRsp { ver: 2 }));
        assert_eq!(SessInfo::parse(&bytes(1)), Err(ParseError::UnexpectedType));
        assert_eq!(SessInfo::parse(&bytes(0)[..35]), Err(ParseError::Truncated));
    }

    #[test]
    fn test_emit_buffer_too_small() {
        assert_eq!(
            SessInfo { ver: 2 }.emit(&mut [0; 35]),
            Err(EmitError::BufferTooSmall)
        );
    }
}
