//! IO and CLOSE: block requests on an opened device, and unmapping it.
//!
//! rnbd.md §2.6 (`struct rnbd_msg_close`, 8 bytes) and §2.7
//! (`struct rnbd_msg_io`, 32 bytes including 6 bytes of tail padding):
//! device id, start `sector` (512-byte units), `rw` (op in bits 0-7, flags
//! above), `bi_size` in bytes, `prio`. §3 describes how Linux block requests
//! become ops and flags. All fields little-endian.
//!
//! There is no write-zeroes op in Linux 6.1 (rnbd.md §2.7): the client does
//! not advertise it, so zero-outs arrive as ordinary WRITEs.

use core::fmt;

use static_assertions::const_assert_eq;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{
    emit_raw, enum_with_unknown, view, EmitError, MsgType, ParseError, RawHeader, RtrsDirection,
    SECTOR_SIZE,
};

/// `struct rnbd_msg_close` on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawClose {
    /// Type 5.
    pub header: RawHeader,
    /// Device id from OPEN_RSP.
    pub device_id: U32,
}

const_assert_eq!(core::mem::size_of::<RawClose>(), Close::LEN);

/// CLOSE: unmap a device (rnbd.md §2.6, §4.3). The reply is always success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Close {
    /// Device id from OPEN_RSP.
    pub device_id: u32,
}

impl Close {
    /// Wire length: 8 bytes.
    pub const LEN: usize = 8;

    /// Parses a CLOSE from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`.
    pub fn parse(buf: &[u8]) -> Result<Close, ParseError> {
        let raw: &RawClose = view(buf, MsgType::Close)?;
        Ok(Close {
            device_id: raw.device_id.get(),
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
        let raw = RawClose {
            header: RawHeader::new(MsgType::Close),
            device_id: U32::new(self.device_id),
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for Close {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RNBD CLOSE device_id={}", self.device_id)
    }
}

enum_with_unknown! {
    /// The op in bits 0-7 of `rw` (`enum rnbd_io_flags`, rnbd.md §2.7).
    pub enum IoOp(u8) {
        /// `RNBD_OP_READ`.
        Read = 0,
        /// `RNBD_OP_WRITE`.
        Write = 1,
        /// `RNBD_OP_FLUSH`: flush the volatile cache; `bi_size` 0, sector all ones.
        Flush = 2,
        /// `RNBD_OP_DISCARD`: the range may be deallocated.
        Discard = 3,
        /// `RNBD_OP_SECURE_ERASE`: the range must be erased securely.
        SecureErase = 4,
        /// `RNBD_OP_WRITE_SAME`: defined, never sent by 6.1; rejected
        /// (`UnsupportedOp`, rnbd.md §8.3 #33).
        WriteSame = 5,
    }
}

impl IoOp {
    /// The RTRS request kind this op must arrive as (rnbd.md §1.1): the
    /// block layer's data direction, so READ and FLUSH are RTRS reads.
    pub const fn rtrs_direction(self) -> RtrsDirection {
        match self {
            IoOp::Read | IoOp::Flush => RtrsDirection::Read,
            _ => RtrsDirection::Write,
        }
    }

    /// True for the ops this implementation serves (0..=4).
    pub const fn is_supported(self) -> bool {
        matches!(
            self,
            IoOp::Read | IoOp::Write | IoOp::Flush | IoOp::Discard | IoOp::SecureErase
        )
    }

    /// True for the ops that change the device (refused on RO mappings,
    /// rnbd.md §8.3 #36).
    pub const fn is_write(self) -> bool {
        matches!(self, IoOp::Write | IoOp::Discard | IoOp::SecureErase)
    }
}

impl fmt::Display for IoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoOp::Read => f.write_str("READ"),
            IoOp::Write => f.write_str("WRITE"),
            IoOp::Flush => f.write_str("FLUSH"),
            IoOp::Discard => f.write_str("DISCARD"),
            IoOp::SecureErase => f.write_str("SECURE_ERASE"),
            IoOp::WriteSame => f.write_str("WRITE_SAME"),
            IoOp::Unknown(op) => write!(f, "op {op}"),
        }
    }
}

/// The flag bits of `rw` (bits 8-31; the op bits are never set here).
/// Unknown bits are kept and ignored (rnbd.md §8.3 #33).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IoFlags(u32);

impl IoFlags {
    /// `RNBD_F_SYNC` (0x100): every READ, and writes with SYNC/FUA/PREFLUSH.
    pub const SYNC: IoFlags = IoFlags(1 << 8);
    /// `RNBD_F_FUA` (0x200): FUA or PREFLUSH on the client.
    pub const FUA: IoFlags = IoFlags(1 << 9);
    /// No flags.
    pub const NONE: IoFlags = IoFlags(0);

    /// Flags from a whole `rw` value (the op byte is dropped).
    pub const fn from_rw(rw: u32) -> IoFlags {
        IoFlags(rw & !0xff)
    }

    /// The bits, positioned as in `rw`.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True if every bit of `other` is set.
    pub const fn contains(self, other: IoFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub const fn union(self, other: IoFlags) -> IoFlags {
        IoFlags(self.0 | other.0)
    }
}

/// `struct rnbd_msg_io` on the wire (32 bytes with the tail padding).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawIo {
    /// Type 4.
    pub header: RawHeader,
    /// Device id from OPEN_RSP.
    pub device_id: U32,
    /// Start sector (512 bytes).
    pub sector: U64,
    /// Op (bits 0-7) | flags.
    pub rw: U32,
    /// Bytes covered.
    pub bi_size: U32,
    /// Linux ioprio.
    pub prio: U16,
    /// Tail padding of the C struct.
    pub padding: [u8; 6],
}

const_assert_eq!(core::mem::size_of::<RawIo>(), Io::LEN);
const_assert_eq!(core::mem::offset_of!(RawIo, device_id), 4);
const_assert_eq!(core::mem::offset_of!(RawIo, sector), 8);
const_assert_eq!(core::mem::offset_of!(RawIo, rw), 16);
const_assert_eq!(core::mem::offset_of!(RawIo, bi_size), 20);
const_assert_eq!(core::mem::offset_of!(RawIo, prio), 24);

/// IO: one block request (rnbd.md §2.7, §4.4).
///
/// `parse` requires at least [`Io::MIN_LEN`] bytes (`prio` is read only from
/// a full 32-byte message, else 0), a supported op, `bi_size` a multiple of
/// 512, and for every op but FLUSH a sector range whose end and byte offset
/// fit 64 bits; a FLUSH must have `bi_size == 0` and its sector (all ones
/// from Linux) is not checked. Device bounds: [`Io::check_range`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Io {
    /// Device id from OPEN_RSP.
    pub device_id: u32,
    /// Start sector in 512-byte units (`u64::MAX` for a Linux FLUSH).
    pub sector: u64,
    /// The op.
    pub op: IoOp,
    /// SYNC / FUA (and unknown bits, kept).
    pub flags: IoFlags,
    /// Bytes covered: data length for READ/WRITE, range length for
    /// DISCARD/SECURE_ERASE, 0 for FLUSH.
    pub bi_size: u32,
    /// Linux ioprio (class in bits 13-15); clamp before use.
    pub prio: u16,
}

impl Io {
    /// Wire length as sent: 32 bytes.
    pub const LEN: usize = 32;
    /// Shortest IO accepted: up to `bi_size` (rnbd.md §8.3 #24).
    pub const MIN_LEN: usize = 24;

    /// Parses an IO from the start of `buf`.
    ///
    /// # Errors
    /// `Truncated`, `UnexpectedType`, `UnsupportedOp`, `UnalignedSize`,
    /// `FlushWithData`, `SectorRangeOverflow`.
    pub fn parse(buf: &[u8]) -> Result<Io, ParseError> {
        view::<RawHeader>(buf, MsgType::Io)?;
        let fixed = buf.get(..Self::MIN_LEN).ok_or(ParseError::Truncated)?;
        let read_u32 = |at: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&fixed[at..at + 4]);
            u32::from_le_bytes(bytes)
        };
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&fixed[8..16]);
        let rw = read_u32(16);
        let prio = match RawIo::ref_from_prefix(buf) {
            Ok((raw, _)) => raw.prio.get(),
            Err(_) => 0,
        };
        let io = Io {
            device_id: read_u32(4),
            sector: u64::from_le_bytes(sector),
            op: IoOp::from((rw & 0xff) as u8),
            flags: IoFlags::from_rw(rw),
            bi_size: read_u32(20),
            prio,
        };
        io.check()?;
        Ok(io)
    }

    fn check(&self) -> Result<(), ParseError> {
        if !self.op.is_supported() {
            return Err(ParseError::UnsupportedOp);
        }
        if self.bi_size % SECTOR_SIZE != 0 {
            return Err(ParseError::UnalignedSize);
        }
        if self.op == IoOp::Flush {
            if self.bi_size != 0 {
                return Err(ParseError::FlushWithData);
            }
            return Ok(());
        }
        self.end_sector().ok_or(ParseError::SectorRangeOverflow)?;
        Ok(())
    }

    /// Sectors covered: `bi_size / 512`.
    pub const fn nsectors(&self) -> u64 {
        (self.bi_size / SECTOR_SIZE) as u64
    }

    /// The sector after the range, `None` if it (or its byte offset)
    /// overflows 64 bits.
    pub const fn end_sector(&self) -> Option<u64> {
        match self.sector.checked_add(self.nsectors()) {
            Some(end) if end <= u64::MAX / SECTOR_SIZE as u64 => Some(end),
            _ => None,
        }
    }

    /// Byte offset of the first sector, `None` on overflow (always `Some`
    /// for a parsed non-FLUSH IO).
    pub const fn byte_offset(&self) -> Option<u64> {
        self.sector.checked_mul(SECTOR_SIZE as u64)
    }

    /// Checks the range against a device of `capacity_sectors` (rnbd.md
    /// §8.3 #35); FLUSH has no range and always passes.
    ///
    /// # Errors
    /// `SectorRangeOverflow`, `BeyondDeviceEnd`.
    pub const fn check_range(&self, capacity_sectors: u64) -> Result<(), ParseError> {
        if matches!(self.op, IoOp::Flush) {
            return Ok(());
        }
        match self.end_sector() {
            None => Err(ParseError::SectorRangeOverflow),
            Some(end) if end > capacity_sectors => Err(ParseError::BeyondDeviceEnd),
            Some(_) => Ok(()),
        }
    }

    /// The `rw` word: op | flags.
    pub fn rw(&self) -> u32 {
        u32::from(u8::from(self.op)) | self.flags.bits()
    }

    /// Length of the emitted message.
    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Writes the 32 bytes at the start of `buf`, padding zero.
    ///
    /// # Errors
    /// `BufferTooSmall`, or `Invalid` if the value would not parse.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let raw = RawIo {
            header: RawHeader::new(MsgType::Io),
            device_id: U32::new(self.device_id),
            sector: U64::new(self.sector),
            rw: U32::new(self.rw()),
            bi_size: U32::new(self.bi_size),
            prio: U16::new(self.prio),
            padding: [0; 6],
        };
        emit_raw(&raw, buf)
    }
}

impl fmt::Display for Io {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RNBD IO device_id={} op={}", self.device_id, self.op)?;
        if self.flags.contains(IoFlags::SYNC) {
            f.write_str("|SYNC")?;
        }
        if self.flags.contains(IoFlags::FUA) {
            f.write_str("|FUA")?;
        }
        write!(
            f,
            " rw={:#x} sector={} bi_size={} prio={:#x}",
            self.rw(),
            self.sector,
            self.bi_size,
            self.prio
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rnbd.md §7.2: a 4 KiB write at sector 2048.
    fn io_bytes() -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0] = 4;
        b[8..16].copy_from_slice(&2048u64.to_le_bytes());
        b[16] = 1;
        b[20..24].copy_from_slice(&4096u32.to_le_bytes());
        b[24] = 0x04;
        b
    }

    fn io() -> Io {
        Io {
            device_id: 0,
            sector: 2048,
            op: IoOp::Write,
            flags: IoFlags::NONE,
            bi_size: 4096,
            prio: 4,
        }
    }

    #[test]
    fn test_deconstruct() {
        let bytes = io_bytes();
        let (raw, _) = RawIo::ref_from_prefix(&bytes[..]).unwrap();
        assert_eq!(raw.sector.get(), 2048);
        assert_eq!(raw.rw.get(), 1);
        assert_eq!(raw.bi_size.get(), 4096);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 33];
        assert_eq!(io().emit(&mut buf), Ok(32));
        assert_eq!(&buf[..32], &io_bytes()[..]);
        assert_eq!(buf[32], 0xa5);
        let mut buf = [0xa5u8; 8];
        assert_eq!(Close { device_id: 3 }.emit(&mut buf), Ok(8));
        assert_eq!(buf, [5, 0, 0, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn test_parse() {
        assert_eq!(Io::parse(&io_bytes()), Ok(io()));
        // 24 bytes: no prio.
        assert_eq!(Io::parse(&io_bytes()[..24]), Ok(Io { prio: 0, ..io() }));
        assert_eq!(
            Close::parse(&[5, 0, 0, 0, 3, 0, 0, 0]),
            Ok(Close { device_id: 3 })
        );
    }

    #[test]
    fn test_emit_buffer_too_small() {
        assert_eq!(io().emit(&mut [0; 31]), Err(EmitError::BufferTooSmall));
        assert_eq!(
            Close { device_id: 0 }.emit(&mut [0; 7]),
            Err(EmitError::BufferTooSmall)
        );
    }

    #[test]
    fn test_flags() {
        let mut b = io_bytes();
        b[17] = 0x03; // rw 0x301: FUA write
        let io = Io::parse(&b).unwrap();
        assert!(io.flags.contains(IoFlags::SYNC.union(IoFlags::FUA)));
        assert_eq!(io.rw(), 0x301);
        b[18] = 0x80; // an unknown flag is kept
        assert_eq!(Io::parse(&b).unwrap().rw(), 0x0080_0301);
    }

    #[test]
    fn test_flush() {
        // rnbd.md §7.5: rw 0x302, bi_size 0, sector all ones.
        let mut b = [0u8; 32];
        b[0] = 4;
        b[8..16].fill(0xff);
        b[16] = 2;
        b[17] = 3;
        let flush = Io::parse(&b).unwrap();
        assert_eq!(flush.op, IoOp::Flush);
        assert_eq!(flush.check_range(0), Ok(()));
        assert_eq!(flush.op.rtrs_direction(), RtrsDirection::Read);
        b[21] = 0x10;
        assert_eq!(Io::parse(&b), Err(ParseError::FlushWithData));
    }

    #[test]
    fn test_rejects() {
        let mut b = io_bytes();
        b[16] = 5;
        assert_eq!(Io::parse(&b), Err(ParseError::UnsupportedOp));
        b[16] = 9;
        assert_eq!(Io::parse(&b), Err(ParseError::UnsupportedOp));
        let mut b = io_bytes();
        b[20] = 1;
        assert_eq!(Io::parse(&b), Err(ParseError::UnalignedSize));
        let mut b = io_bytes();
        b[8..16].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        assert_eq!(Io::parse(&b), Err(ParseError::SectorRangeOverflow));
        let mut b = io_bytes();
        b[8..16].copy_from_slice(&(u64::MAX / 512).to_le_bytes());
        assert_eq!(Io::parse(&b), Err(ParseError::SectorRangeOverflow));
        assert_eq!(Io::parse(&io_bytes()[..23]), Err(ParseError::Truncated));
        assert_eq!(io().check_range(2056), Ok(()));
        assert_eq!(io().check_range(2055), Err(ParseError::BeyondDeviceEnd));
    }

    #[test]
    fn test_display() {
        let text = Io {
            flags: IoFlags::SYNC,
            op: IoOp::Read,
            ..io()
        }
        .to_string();
        assert_eq!(
            text,
            "RNBD IO device_id=0 op=READ|SYNC rw=0x100 sector=2048 bi_size=4096 prio=0x4"
        );
    }
}
