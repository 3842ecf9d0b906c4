//! CON_REQ and CONN_RSP: the RTRS private data of the CM REQ and REP/REJ.
//!
//! rtrs.md §2.3 (`struct rtrs_msg_conn_req`, 56 bytes) and §2.5
//! (`struct rtrs_msg_conn_rsp`, 56 bytes). With IP addressing the CON_REQ
//! follows the 36-byte RDMA-CM header in the REQ private data; the CONN_RSP
//! sits at offset 0 of the REP (or REJ) private data. All fields little-endian.
//!
//! # The uuid names
//!
//! Linux calls the CON_REQ uuids `sess_uuid` and `paths_uuid`, and both names
//! mislead: **`sess_uuid` (offset 12) is the PATH uuid** (random per path
//! object, kept across reconnects) and **`paths_uuid` (offset 28) is the
//! SESSION uuid** (shared by every path of one client session; the server
//! looks sessions up by it). [`ConnReq`] names them for what they are:
//! [`ConnReq::path_uuid`] and [`ConnReq::session_uuid`].

use core::fmt;

use static_assertions::{const_assert, const_assert_eq};
use zerocopy::byteorder::little_endian::{I16, U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{emit_raw, version_major, EmitError, ParseError, MAGIC, MAX_CID_NUM, VERSION_MAJOR};

/// A 16-byte UUID (Linux `uuid_t`): opaque, compared bytewise, never
/// interpreted. Displayed in the usual 8-4-4-4-12 hex form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// `struct rtrs_msg_conn_req` as laid out on the wire (rtrs.md §2.3).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawConnReq {
    /// `__cma_version`: 0 (reserved for the CMA with AF_IB).
    pub cma_version: u8,
    /// `__ip_version`: 0 (must be 0 on the sender, see rtrs.md §2.3).
    pub ip_version: u8,
    /// [`MAGIC`].
    pub magic: U16,
    /// `(major << 8) | minor`.
    pub version: U16,
    /// This connection's id.
    pub cid: U16,
    /// Connections in this path.
    pub cid_num: U16,
    /// Reconnect counter of the path.
    pub recon_cnt: U16,
    /// Linux `sess_uuid`: the **path** uuid.
    pub path_uuid: [u8; 16],
    /// Linux `paths_uuid`: the **session** uuid.
    pub session_uuid: [u8; 16],
    /// Bit 0: `first_conn`. Bits 1..7 reserved.
    pub first_conn: u8,
    /// Reserved, zero.
    pub reserved: [u8; 11],
}

const_assert_eq!(core::mem::size_of::<RawConnReq>(), ConnReq::LEN);
const_assert_eq!(core::mem::offset_of!(RawConnReq, magic), 2);
const_assert_eq!(core::mem::offset_of!(RawConnReq, version), 4);
const_assert_eq!(core::mem::offset_of!(RawConnReq, cid), 6);
const_assert_eq!(core::mem::offset_of!(RawConnReq, cid_num), 8);
const_assert_eq!(core::mem::offset_of!(RawConnReq, recon_cnt), 10);
const_assert_eq!(core::mem::offset_of!(RawConnReq, path_uuid), 12);
const_assert_eq!(core::mem::offset_of!(RawConnReq, session_uuid), 28);
const_assert_eq!(core::mem::offset_of!(RawConnReq, first_conn), 44);
const_assert_eq!(core::mem::offset_of!(RawConnReq, reserved), 45);

/// A validated CON_REQ: one connection request of one path (rtrs.md §2.3).
///
/// `parse` performs the checks of rtrs.md §2.4 steps 1-3 (length, magic,
/// major version, `cid < cid_num <= 4096`); session and path lookups belong
/// to the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnReq {
    /// Version field; its major byte is [`VERSION_MAJOR`].
    pub version: u16,
    /// Connection id, `0 .. cid_num` (cid 0 is the service connection).
    pub cid: u16,
    /// Number of connections of this path (`nr_cpu_ids + nr_poll_queues + 1`).
    pub cid_num: u16,
    /// Reconnect counter (1 on a first connect); the Linux server ignores it.
    pub recon_cnt: u16,
    /// The path uuid (Linux field name `sess_uuid`, offset 12).
    pub path_uuid: Uuid,
    /// The session uuid (Linux field name `paths_uuid`, offset 28).
    pub session_uuid: Uuid,
    /// "A new server session may be created for this session uuid".
    pub first_conn: bool,
}

impl ConnReq {
    /// Wire length: 56 bytes.
    pub const LEN: usize = 56;

    /// Parses a CON_REQ from the start of `buf` (the REQ private data after
    /// the 36-byte CMA header; bytes after the 56 are ignored).
    ///
    /// # Errors
    /// `Truncated`, `BadMagic`, `UnsupportedVersion`, `TooManyConnections`,
    /// `CidNotBelowCidNum`.
    pub fn parse(buf: &[u8]) -> Result<ConnReq, ParseError> {
        let (raw, _) = RawConnReq::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if raw.magic.get() != MAGIC {
            return Err(ParseError::BadMagic);
        }
        let req = ConnReq {
            version: raw.version.get(),
            cid: raw.cid.get(),
            cid_num: raw.cid_num.get(),
            recon_cnt: raw.recon_cnt.get(),
            path_uuid: Uuid(raw.path_uuid),
            session_uuid: Uuid(raw.session_uuid),
            first_conn: raw.first_conn & 1 != 0,
        };
        req.check()?;
        Ok(req)
    }

    fn check(&self) -> Result<(), ParseError> {
        if version_major(self.version) != VERSION_MAJOR {
            return Err(ParseError::UnsupportedVersion);
        }
        if self.cid_num > MAX_CID_NUM {
            return Err(ParseError::TooManyConnections);
        }
        if self.cid >= self.cid_num {
            return Err(ParseError::CidNotBelowCidNum);
        }
        Ok(())
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 56 bytes at the start of `buf`, reserved bytes zero.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` if the value would not parse.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let raw = RawConnReq {
            cma_version: 0,
            ip_version: 0,
            magic: U16::new(MAGIC),
            version: U16::new(self.version),
            cid: U16::new(self.cid),
            cid_num: U16::new(self.cid_num),
            recon_cnt: U16::new(self.recon_cnt),
            path_uuid: self.path_uuid.0,
            session_uuid: self.session_uuid.0,
            first_conn: u8::from(self.first_conn),
            reserved: [0; 11],
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for ConnReq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RTRS CON_REQ version={:#06x} cid={}/{} recon_cnt={} path_uuid={} session_uuid={} first_conn={}",
            self.version,
            self.cid,
            self.cid_num,
            self.recon_cnt,
            self.path_uuid,
            self.session_uuid,
            u8::from(self.first_conn)
        )
    }
}

/// CONN_RSP `flags` (le32). Unknown bits are kept, not rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnRspFlags(pub u32);

impl ConnRspFlags {
    /// `RTRS_MSG_NEW_RKEY_F` (bit 1): the server re-keys every chunk after
    /// each request and sends the new rkey in an RKEY_RSP (rtrs.md §4.9).
    pub const NEW_RKEY: ConnRspFlags = ConnRspFlags(1 << 1);

    /// True if every bit of `other` is set.
    pub const fn contains(self, other: ConnRspFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `struct rtrs_msg_conn_rsp` as laid out on the wire (rtrs.md §2.5).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawConnRsp {
    /// [`MAGIC`].
    pub magic: U16,
    /// `(major << 8) | minor`.
    pub version: U16,
    /// 0, or a negative errno (two's complement) on reject.
    pub errno: I16,
    /// Session queue depth (number of chunks).
    pub queue_depth: U16,
    /// `chunk_size - max_hdr_size`.
    pub max_io_size: U32,
    /// Room reserved for the user header and the RTRS message.
    pub max_hdr_size: U32,
    /// [`ConnRspFlags`].
    pub flags: U32,
    /// Reserved, zero.
    pub reserved: [u8; 36],
}

const_assert_eq!(core::mem::size_of::<RawConnRsp>(), ConnRsp::LEN);
const_assert_eq!(core::mem::offset_of!(RawConnRsp, errno), 4);
const_assert_eq!(core::mem::offset_of!(RawConnRsp, queue_depth), 6);
const_assert_eq!(core::mem::offset_of!(RawConnRsp, max_io_size), 8);
const_assert_eq!(core::mem::offset_of!(RawConnRsp, max_hdr_size), 12);
const_assert_eq!(core::mem::offset_of!(RawConnRsp, flags), 16);
const_assert!(ConnRsp::LEN <= 196); // fits the REP private data

/// A validated CONN_RSP: the server's accept (errno 0) or reject parameters
/// (rtrs.md §2.5).
///
/// `parse` performs the client checks of §2.5 that need no state: length,
/// magic, major version; and for an accept, `queue_depth != 0`,
/// `max_io_size != 0` and a chunk size (`max_io_size + max_hdr_size`) that
/// fits 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRsp {
    /// Version field; its major byte is [`VERSION_MAJOR`].
    pub version: u16,
    /// 0 = accept; otherwise a negative errno (e.g. -104 ECONNRESET).
    pub errno: i16,
    /// Session queue depth: the number of chunks (and client permits).
    pub queue_depth: u16,
    /// Largest IO payload per request.
    pub max_io_size: u32,
    /// Header room per chunk for the user header + RTRS message.
    pub max_hdr_size: u32,
    /// [`ConnRspFlags::NEW_RKEY`] or none.
    pub flags: ConnRspFlags,
}

impl ConnRsp {
    /// Wire length: 56 bytes.
    pub const LEN: usize = 56;

    /// An accepting CONN_RSP, as the server sends in the REP.
    pub const fn accept(
        queue_depth: u16,
        max_io_size: u32,
        max_hdr_size: u32,
        flags: ConnRspFlags,
    ) -> ConnRsp {
        ConnRsp {
            version: super::VERSION,
            errno: 0,
            queue_depth,
            max_io_size,
            max_hdr_size,
            flags,
        }
    }

    /// A rejecting CONN_RSP for the REJ private data: `errno` is the positive
    /// errno (e.g. 104), sent negated; everything else 0.
    pub const fn reject(errno: i16) -> ConnRsp {
        ConnRsp {
            version: super::VERSION,
            errno: errno.wrapping_neg(),
            queue_depth: 0,
            max_io_size: 0,
            max_hdr_size: 0,
            flags: ConnRspFlags(0),
        }
    }

    /// True for an accept (`errno == 0`).
    pub const fn is_accept(&self) -> bool {
        self.errno == 0
    }

    /// The chunk stride the client derives: `max_io_size + max_hdr_size`,
    /// `None` on overflow (never for a parsed accept).
    pub const fn chunk_size(&self) -> Option<u32> {
        self.max_io_size.checked_add(self.max_hdr_size)
    }

    /// Parses a CONN_RSP from the start of `buf` (REP/REJ private data).
    ///
    /// # Errors
    /// `Truncated`, `BadMagic`, `UnsupportedVersion`; for accepts also
    /// `ZeroQueueDepth`, `ZeroMaxIoSize`, `ChunkSizeOverflow`.
    pub fn parse(buf: &[u8]) -> Result<ConnRsp, ParseError> {
        let (raw, _) = RawConnRsp::ref_from_prefix(buf).map_err(|_| ParseError::Truncated)?;
        if raw.magic.get() != MAGIC {
            return Err(ParseError::BadMagic);
        }
        let rsp = ConnRsp {
            version: raw.version.get(),
            errno: raw.errno.get(),
            queue_depth: raw.queue_depth.get(),
            max_io_size: raw.max_io_size.get(),
            max_hdr_size: raw.max_hdr_size.get(),
            flags: ConnRspFlags(raw.flags.get()),
        };
        rsp.check()?;
        Ok(rsp)
    }

    fn check(&self) -> Result<(), ParseError> {
        if version_major(self.version) != VERSION_MAJOR {
            return Err(ParseError::UnsupportedVersion);
        }
        if self.is_accept() {
            if self.queue_depth == 0 {
                return Err(ParseError::ZeroQueueDepth);
            }
            if self.max_io_size == 0 {
                return Err(ParseError::ZeroMaxIoSize);
            }
            if self.chunk_size().is_none() {
                return Err(ParseError::ChunkSizeOverflow);
            }
        }
        Ok(())
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 56 bytes at the start of `buf`, reserved bytes zero.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` if the value would not parse.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let raw = RawConnRsp {
            magic: U16::new(MAGIC),
            version: U16::new(self.version),
            errno: I16::new(self.errno),
            queue_depth: U16::new(self.queue_depth),
            max_io_size: U32::new(self.max_io_size),
            max_hdr_size: U32::new(self.max_hdr_size),
            flags: U32::new(self.flags.0),
            reserved: [0; 36],
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for ConnRsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RTRS CONN_RSP version={:#06x} errno={} queue_depth={} max_io_size={} max_hdr_size={} flags={:#x}{}",
            self.version,
            self.errno,
            self.queue_depth,
            self.max_io_size,
            self.max_hdr_size,
            self.flags.0,
            if self.flags.contains(ConnRspFlags::NEW_RKEY) { " (NEW_RKEY)" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame 5 of rnbd-multipath.pcap: REQ private data bytes 36..92.
    static CON_REQ_BYTES: [u8; 56] = [
        0x00, 0x00, 0xbd, 0x1b, 0x00, 0x02, 0x01, 0x00, 0x02, 0x00, 0x01, 0x00, //
        0x57, 0x90, 0x7b, 0x03, 0x89, 0xc8, 0x41, 0xd3, 0xa8, 0xf5, 0x21, 0x25, 0x90, 0x9f, 0xc7,
        0x62, //
        0xc1, 0x6c, 0x20, 0x53, 0x65, 0x54, 0x4b, 0xef, 0xa5, 0x5a, 0x47, 0x2e, 0x48, 0x06, 0x71,
        0x65, //
        0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    fn con_req_repr() -> ConnReq {
        ConnReq {
            version: 0x0200,
            cid: 1,
            cid_num: 2,
            recon_cnt: 1,
            path_uuid: Uuid([
                0x57, 0x90, 0x7b, 0x03, 0x89, 0xc8, 0x41, 0xd3, 0xa8, 0xf5, 0x21, 0x25, 0x90, 0x9f,
                0xc7, 0x62,
            ]),
            session_uuid: Uuid([
                0xc1, 0x6c, 0x20, 0x53, 0x65, 0x54, 0x4b, 0xef, 0xa5, 0x5a, 0x47, 0x2e, 0x48, 0x06,
                0x71, 0x65,
            ]),
            first_conn: true,
        }
    }

    static CONN_RSP_BYTES: [u8; 56] = {
        let mut b = [0u8; 56];
        b[0] = 0xbd;
        b[1] = 0x1b;
        b[3] = 0x02;
        b[7] = 0x02; // qd 512
        b[8] = 0x00;
        b[9] = 0xf0;
        b[10] = 0x01; // 126976 = 0x1f000
        b[13] = 0x10; // 4096
        b[16] = 0x02; // NEW_RKEY
        b
    };

    #[test]
    fn test_deconstruct() {
        let (raw, _) = RawConnReq::ref_from_prefix(&CON_REQ_BYTES[..]).unwrap();
        assert_eq!(raw.magic.get(), MAGIC);
        assert_eq!(raw.cid.get(), 1);
        assert_eq!(raw.cid_num.get(), 2);
        assert_eq!(raw.first_conn, 1);
        let (raw, _) = RawConnRsp::ref_from_prefix(&CONN_RSP_BYTES[..]).unwrap();
        assert_eq!(raw.max_io_size.get(), 126_976);
        assert_eq!(raw.max_hdr_size.get(), 4096);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 60];
        assert_eq!(con_req_repr().emit(&mut buf), Ok(56));
        assert_eq!(&buf[..56], &CON_REQ_BYTES[..]);
        assert_eq!(&buf[56..], &[0xa5; 4]);
        let rsp = ConnRsp::accept(512, 126_976, 4096, ConnRspFlags::NEW_RKEY);
        let mut buf = [0xa5u8; 56];
        assert_eq!(rsp.emit(&mut buf), Ok(56));
        assert_eq!(buf, CONN_RSP_BYTES);
    }

    #[test]
    fn test_parse() {
        assert_eq!(ConnReq::parse(&CON_REQ_BYTES), Ok(con_req_repr()));
        let rsp = ConnRsp::parse(&CONN_RSP_BYTES).unwrap();
        assert_eq!(rsp.queue_depth, 512);
        assert_eq!(rsp.chunk_size(), Some(131_072));
        assert!(rsp.flags.contains(ConnRspFlags::NEW_RKEY));
    }

    #[test]
    fn test_emit_buffer_too_small() {
        assert_eq!(
            con_req_repr().emit(&mut [0; 55]),
            Err(EmitError::BufferTooSmall)
        );
    }

    #[test]
    fn test_rejects() {
        assert_eq!(
            ConnReq::parse(&CON_REQ_BYTES[..55]),
            Err(ParseError::Truncated)
        );
        let mut bad = CON_REQ_BYTES;
        bad[2] = 0;
        assert_eq!(ConnReq::parse(&bad), Err(ParseError::BadMagic));
        let mut bad = CON_REQ_BYTES;
        bad[5] = 3;
        assert_eq!(ConnReq::parse(&bad), Err(ParseError::UnsupportedVersion));
        let mut minor = CON_REQ_BYTES;
        minor[4] = 7; // minor versions are accepted
        assert!(ConnReq::parse(&minor).is_ok());
        let mut bad = CON_REQ_BYTES;
        bad[6] = 2; // cid 2 of 2
        assert_eq!(ConnReq::parse(&bad), Err(ParseError::CidNotBelowCidNum));
        let mut bad = CON_REQ_BYTES;
        bad[6] = 0;
        bad[8] = 0; // cid 0 of 0
        assert_eq!(ConnReq::parse(&bad), Err(ParseError::CidNotBelowCidNum));
        let mut bad = CON_REQ_BYTES;
        bad[8] = 0x01;
        bad[9] = 0x10; // 4097
        assert_eq!(ConnReq::parse(&bad), Err(ParseError::TooManyConnections));
        let mut bad = CONN_RSP_BYTES;
        bad[7] = 0;
        assert_eq!(ConnRsp::parse(&bad), Err(ParseError::ZeroQueueDepth));
        let mut bad = CONN_RSP_BYTES;
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(ConnRsp::parse(&bad), Err(ParseError::ChunkSizeOverflow));
    }

    #[test]
    fn test_reject_rsp() {
        let rsp = ConnRsp::reject(104);
        let mut buf = [0u8; 56];
        rsp.emit(&mut buf).unwrap();
        assert_eq!(&buf[4..6], &[0x98, 0xff]); // -104 as le16
        let parsed = ConnRsp::parse(&buf).unwrap();
        assert_eq!(parsed.errno, -104);
        assert!(!parsed.is_accept());
    }

    #[test]
    fn test_display() {
        let text = con_req_repr().to_string();
        assert!(
            text.contains("path_uuid=57907b03-89c8-41d3-a8f5-2125909fc762"),
            "{text}"
        );
        assert!(text.contains("session_uuid=c16c2053-6554-4bef-a55a-472e48067165"));
    }
}
