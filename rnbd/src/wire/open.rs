//! OPEN and OPEN_RSP: map a device by path; its id and geometry.
//!
//! rnbd.md §2.4 (`struct rnbd_msg_open`, 264 bytes: header, access mode,
//! 1 reserved, 255-byte NUL-terminated `dev_name`, 3 reserved) and §2.5
//! (`struct rnbd_msg_open_rsp`, 56 bytes). All fields little-endian.
//!
//! # Device path rules (rnbd.md §8.3 #28, #29)
//!
//! `dev_name` must hold a NUL within its 255 bytes (Linux does not check),
//! be non-empty, contain no `..` (Linux rejects the substring anywhere) and
//! use only `[A-Za-z0-9._/+:@,=-]`: enough for `ram0`, `vg/lv`,
//! `disk/by-id/...`, and nothing that could smuggle control characters into
//! logs or paths. Names are resolved through the export table, never the
//! file system (rnbd.md §8.3 #29), so the set can stay this narrow.

use core::fmt;

use static_assertions::const_assert_eq;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{emit_raw, view, EmitError, MsgType, ParseError, RawHeader};

/// Length of the OPEN `dev_name` field (at most 254 characters + NUL).
pub const DEVICE_PATH_LEN: usize = 255;

/// `enum rnbd_access_mode` (rnbd.md §2.4, §4.2 step 6). Values other than
/// these are rejected by parse (`UnknownAccessMode`, EINVAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// `RNBD_ACCESS_RO` (0): read only, always allowed.
    ReadOnly,
    /// `RNBD_ACCESS_RW` (1): read-write, only if the device has no writer.
    ReadWrite,
    /// `RNBD_ACCESS_MIGRATION` (2): read-write, allowed with fewer than 2
    /// writers (a second writer during live migration).
    Migration,
}

impl AccessMode {
    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            AccessMode::ReadOnly => 0,
            AccessMode::ReadWrite => 1,
            AccessMode::Migration => 2,
        }
    }

    /// From the wire value.
    ///
    /// # Errors
    /// `UnknownAccessMode` for values above 2.
    pub const fn from_u8(value: u8) -> Result<AccessMode, ParseError> {
        match value {
            0 => Ok(AccessMode::ReadOnly),
            1 => Ok(AccessMode::ReadWrite),
            2 => Ok(AccessMode::Migration),
            _ => Err(ParseError::UnknownAccessMode),
        }
    }

    /// True for the modes that may write.
    pub const fn is_writable(self) -> bool {
        !matches!(self, AccessMode::ReadOnly)
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessMode::ReadOnly => "ro",
            AccessMode::ReadWrite => "rw",
            AccessMode::Migration => "migration",
        })
    }
}

/// `struct rnbd_msg_open` on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawOpen {
    /// Type 2.
    pub header: RawHeader,
    /// [`AccessMode`].
    pub access_mode: u8,
    /// Reserved.
    pub resv1: u8,
    /// The device path, NUL-terminated.
    pub dev_name: [u8; DEVICE_PATH_LEN],
    /// Reserved.
    pub reserved: [u8; 3],
}

const_assert_eq!(core::mem::size_of::<RawOpen>(), Open::LEN);
const_assert_eq!(core::mem::offset_of!(RawOpen, access_mode), 4);
const_assert_eq!(core::mem::offset_of!(RawOpen, dev_name), 6);
const_assert_eq!(core::mem::offset_of!(RawOpen, reserved), 261);

/// OPEN: map `device_path` with `access_mode` (rnbd.md §2.4, §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Open<'a> {
    /// Requested access.
    pub access_mode: AccessMode,
    /// The `device_path=` string, relative to the server's export namespace.
    pub device_path: &'a str,
}

impl<'a> Open<'a> {
    /// Wire length: 264 bytes.
    pub const LEN: usize = 264;

    /// Parses an OPEN from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `UnknownAccessMode`,
    /// `PathNotTerminated`, `EmptyPath`, `ForbiddenPathChar`, `PathTraversal`.
    pub fn parse(buf: &'a [u8]) -> Result<Open<'a>, ParseError> {
        let raw: &'a RawOpen = view(buf, MsgType::Open)?;
        let access_mode = AccessMode::from_u8(raw.access_mode)?;
        let end = raw
            .dev_name
            .iter()
            .position(|&b| b == 0)
            .ok_or(ParseError::PathNotTerminated)?;
        let device_path = core::str::from_utf8(&raw.dev_name[..end])
            .map_err(|_| ParseError::ForbiddenPathChar)?;
        let open = Open {
            access_mode,
            device_path,
        };
        open.check()?;
        Ok(open)
    }

    fn check(&self) -> Result<(), ParseError> {
        let path = self.device_path.as_bytes();
        if path.is_empty() {
            return Err(ParseError::EmptyPath);
        }
        if path.len() >= DEVICE_PATH_LEN {
            return Err(ParseError::PathNotTerminated);
        }
        if !path.iter().all(|&b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'.' | b'_' | b'/' | b'+' | b':' | b'@' | b',' | b'=' | b'-'
                )
        }) {
            return Err(ParseError::ForbiddenPathChar);
        }
        if path.windows(2).any(|pair| pair == b"..") {
            return Err(ParseError::PathTraversal);
        }
        Ok(())
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 264 bytes at the start of `buf`, the path NUL-padded.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` for a path `parse` would reject.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let mut raw = RawOpen {
            header: RawHeader::new(MsgType::Open),
            access_mode: self.access_mode.to_u8(),
            resv1: 0,
            dev_name: [0; DEVICE_PATH_LEN],
            reserved: [0; 3],
        };
        let path = self.device_path.as_bytes();
        raw.dev_name[..path.len()].copy_from_slice(path);
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for Open<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RNBD OPEN access_mode={} device_path={:?}",
            self.access_mode, self.device_path
        )
    }
}

/// OPEN_RSP `cache_policy` bits (rnbd.md §2.5). Unknown bits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CachePolicy(pub u8);

impl CachePolicy {
    /// `RNBD_FUA` (bit 0): the device honours FUA writes.
    pub const FUA: CachePolicy = CachePolicy(1 << 0);
    /// `RNBD_WRITEBACK` (bit 1): the device has a volatile cache; the client
    /// sends FLUSH.
    pub const WRITEBACK: CachePolicy = CachePolicy(1 << 1);

    /// True if every bit of `other` is set.
    pub const fn contains(self, other: CachePolicy) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `struct rnbd_msg_open_rsp` on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawOpenRsp {
    /// Type 3.
    pub header: RawHeader,
    /// Per-session device id.
    pub device_id: U32,
    /// Capacity in 512-byte sectors.
    pub nsectors: U64,
    /// Queue max_hw_sectors (ignored by the 6.1 client).
    pub max_hw_sectors: U32,
    /// Obsolete, 0.
    pub max_write_same_sectors: U32,
    /// 0 disables discard.
    pub max_discard_sectors: U32,
    /// Bytes.
    pub discard_granularity: U32,
    /// Bytes.
    pub discard_alignment: U32,
    /// Bytes.
    pub physical_block_size: U16,
    /// Bytes.
    pub logical_block_size: U16,
    /// Ignored by the 6.1 client.
    pub max_segments: U16,
    /// Non-zero: secure erase supported.
    pub secure_discard: U16,
    /// Ignored.
    pub obsolete_rotational: u8,
    /// [`CachePolicy`].
    pub cache_policy: u8,
    /// Reserved, zero.
    pub reserved: [u8; 10],
}

const_assert_eq!(core::mem::size_of::<RawOpenRsp>(), OpenRsp::LEN);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, device_id), 4);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, nsectors), 8);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, max_hw_sectors), 16);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, max_discard_sectors), 24);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, physical_block_size), 36);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, logical_block_size), 38);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, secure_discard), 42);
const_assert_eq!(core::mem::offset_of!(RawOpenRsp, cache_policy), 45);

/// OPEN_RSP: the opened device's id and geometry (rnbd.md §2.5).
///
/// `parse` requires type 3 and sane block sizes: `logical_block_size` a
/// power of two in 512..=4096 (0 makes the Linux client fail), and
/// `physical_block_size` a power of two not below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpenRsp {
    /// Per-session device id, used in every IO and CLOSE.
    pub device_id: u32,
    /// Capacity in 512-byte sectors.
    pub nsectors: u64,
    /// Queue max_hw_sectors (informational; the client uses RTRS max_io_size).
    pub max_hw_sectors: u32,
    /// Obsolete; 0.
    pub max_write_same_sectors: u32,
    /// Largest discard in sectors; 0 disables discard.
    pub max_discard_sectors: u32,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
    /// Discard alignment in bytes.
    pub discard_alignment: u32,
    /// Physical block size in bytes.
    pub physical_block_size: u16,
    /// Logical block size in bytes.
    pub logical_block_size: u16,
    /// Max segments (informational).
    pub max_segments: u16,
    /// Non-zero if secure erase is supported.
    pub secure_discard: u16,
    /// Obsolete rotational flag (the client ignores it).
    pub rotational: u8,
    /// FUA / write-back cache.
    pub cache_policy: CachePolicy,
}

impl OpenRsp {
    /// Wire length: 56 bytes.
    pub const LEN: usize = 56;

    /// Capacity in bytes, `None` on overflow.
    pub const fn capacity_bytes(&self) -> Option<u64> {
        self.nsectors.checked_mul(super::SECTOR_SIZE as u64)
    }

    /// Parses an OPEN_RSP from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `BadLogicalBlockSize`,
    /// `BadPhysicalBlockSize`.
    pub fn parse(buf: &[u8]) -> Result<OpenRsp, ParseError> {
        let raw: &RawOpenRsp = view(buf, MsgType::OpenRsp)?;
        let rsp = OpenRsp {
            device_id: raw.device_id.get(),
            nsectors: raw.nsectors.get(),
            max_hw_sectors: raw.max_hw_sectors.get(),
            max_write_same_sectors: raw.max_write_same_sectors.get(),
            max_discard_sectors: raw.max_discard_sectors.get(),
            discard_granularity: raw.discard_granularity.get(),
            discard_alignment: raw.discard_alignment.get(),
            physical_block_size: raw.physical_block_size.get(),
            logical_block_size: raw.logical_block_size.get(),
            max_segments: raw.max_segments.get(),
            secure_discard: raw.secure_discard.get(),
            rotational: raw.obsolete_rotational,
            cache_policy: CachePolicy(raw.cache_policy),
        };
        rsp.check()?;
        Ok(rsp)
    }

    fn check(&self) -> Result<(), ParseError> {
        let logical = self.logical_block_size;
        if !logical.is_power_of_two() || !(512..=4096).contains(&logical) {
            return Err(ParseError::BadLogicalBlockSize);
        }
        let physical = self.physical_block_size;
        if !physical.is_power_of_two() || physical < logical {
            return Err(ParseError::BadPhysicalBlockSize);
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
    /// `BufferTooSmall`, or `Invalid` for block sizes `parse` would reject.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let raw = RawOpenRsp {
            header: RawHeader::new(MsgType::OpenRsp),
            device_id: U32::new(self.device_id),
            nsectors: U64::new(self.nsectors),
            max_hw_sectors: U32::new(self.max_hw_sectors),
            max_write_same_sectors: U32::new(self.max_write_same_sectors),
            max_discard_sectors: U32::new(self.max_discard_sectors),
            discard_granularity: U32::new(self.discard_granularity),
            discard_alignment: U32::new(self.discard_alignment),
            physical_block_size: U16::new(self.physical_block_size),
            logical_block_size: U16::new(self.logical_block_size),
            max_segments: U16::new(self.max_segments),
            secure_discard: U16::new(self.secure_discard),
            obsolete_rotational: self.rotational,
            cache_policy: self.cache_policy.0,
            reserved: [0; 10],
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for OpenRsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RNBD OPEN_RSP device_id={} nsectors={} max_hw_sectors={} max_discard_sectors={} \
             discard_granularity={} discard_alignment={} physical_block_size={} \
             logical_block_size={} max_segments={} secure_discard={} cache_policy={:#x}",
            self.device_id,
            self.nsectors,
            self.max_hw_sectors,
            self.max_discard_sectors,
            self.discard_granularity,
            self.discard_alignment,
            self.physical_block_size,
            self.logical_block_size,
            self.max_segments,
            self.secure_discard,
            self.cache_policy.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_bytes() -> [u8; 264] {
        let mut b = [0u8; 264];
        b[0] = 2;
        b[4] = 1;
        b[6..10].copy_from_slice(b"ram0");
        b
    }

    fn open_rsp() -> OpenRsp {
        OpenRsp {
            device_id: 0,
            nsectors: 131_072,
            max_hw_sectors: 255,
            max_write_same_sectors: 0,
            max_discard_sectors: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            physical_block_size: 4096,
            logical_block_size: 512,
            max_segments: 128,
            secure_discard: 0,
            rotational: 0,
            cache_policy: CachePolicy(0),
        }
    }

    fn open_rsp_bytes() -> [u8; 56] {
        let mut b = [0u8; 56];
        b[0] = 3;
        b[8..16].copy_from_slice(&131_072u64.to_le_bytes());
        b[16] = 255;
        b[36..38].copy_from_slice(&4096u16.to_le_bytes());
        b[38..40].copy_from_slice(&512u16.to_le_bytes());
        b[40] = 128;
        b
    }

    #[test]
    fn test_deconstruct() {
        let bytes = open_bytes();
        let (raw, _) = RawOpen::ref_from_prefix(&bytes[..]).unwrap();
        assert_eq!(raw.access_mode, 1);
        assert_eq!(&raw.dev_name[..5], b"ram0\0");
        let bytes = open_rsp_bytes();
        let (raw, _) = RawOpenRsp::ref_from_prefix(&bytes[..]).unwrap();
        assert_eq!(raw.nsectors.get(), 131_072);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 265];
        let open = Open {
            access_mode: AccessMode::ReadWrite,
            device_path: "ram0",
        };
        assert_eq!(open.emit(&mut buf), Ok(264));
        assert_eq!(&buf[..264], &open_bytes()[..]);
        assert_eq!(buf[264], 0xa5);
        let mut buf = [0xa5u8; 56];
        assert_eq!(open_rsp().emit(&mut buf), Ok(56));
        assert_eq!(buf, open_rsp_bytes());
    }

    #[test]
    fn test_parse() {
        let bytes = open_bytes();
        assert_eq!(
            Open::parse(&bytes),
            Ok(Open {
                access_mode: AccessMode::ReadWrite,
                device_path: "ram0"
            })
        );
        assert_eq!(OpenRsp::parse(&open_rsp_bytes()), Ok(open_rsp()));
        assert_eq!(open_rsp().capacity_bytes(), Some(64 << 20));
    }

    #[test]
    fn test_emit_buffer_too_small() {
        let open = Open {
            access_mode: AccessMode::ReadOnly,
            device_path: "ram0",
        };
        assert_eq!(open.emit(&mut [0; 263]), Err(EmitError::BufferTooSmall));
        assert_eq!(
            open_rsp().emit(&mut [0; 55]),
            Err(EmitError::BufferTooSmall)
        );
    }

    #[test]
    fn test_open_rejects() {
        let bytes = open_bytes();
        assert_eq!(Open::parse(&bytes[..263]), Err(ParseError::Truncated));
        let mut bad = bytes;
        bad[4] = 3;
        assert_eq!(Open::parse(&bad), Err(ParseError::UnknownAccessMode));
        let mut bad = bytes;
        bad[6..261].fill(b'a');
        assert_eq!(Open::parse(&bad), Err(ParseError::PathNotTerminated));
        let mut bad = bytes;
        bad[6] = 0;
        assert_eq!(Open::parse(&bad), Err(ParseError::EmptyPath));
        let mut bad = bytes;
        bad[6..13].copy_from_slice(b"a/../b\0");
        assert_eq!(Open::parse(&bad), Err(ParseError::PathTraversal));
        for forbidden in [b' ', b'\n', b'\\', b'%', 0x80] {
            let mut bad = bytes;
            bad[7] = forbidden;
            assert_eq!(Open::parse(&bad), Err(ParseError::ForbiddenPathChar));
        }
        // Bytes after the NUL are not looked at.
        let mut tail = bytes;
        tail[20] = 0xff;
        assert!(Open::parse(&tail).is_ok());
        let mut max = bytes;
        max[6..260].fill(b'x');
        assert_eq!(Open::parse(&max).map(|o| o.device_path.len()), Ok(254));
    }

    #[test]
    fn test_open_rsp_rejects() {
        let mut bad = open_rsp_bytes();
        bad[38] = 0;
        bad[39] = 0;
        assert_eq!(OpenRsp::parse(&bad), Err(ParseError::BadLogicalBlockSize));
        let mut bad = open_rsp_bytes();
        bad[36..38].copy_from_slice(&256u16.to_le_bytes());
        assert_eq!(OpenRsp::parse(&bad), Err(ParseError::BadPhysicalBlockSize));
        let mut bad = open_rsp_bytes();
        bad[0] = 1;
        assert_eq!(OpenRsp::parse(&bad), Err(ParseError::UnexpectedType));
    }
}
