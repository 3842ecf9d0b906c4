//! RNBD client logic, sans-IO: the messages an initiator sends, and answers.
//!
//! What Brick's userspace initiator needs above RTRS (rnbd.md §3, §5): build
//! SESS_INFO and OPEN, read SESS_INFO_RSP and OPEN_RSP into a [`Device`],
//! build IO (read, write with or without FUA, flush, discard) with the
//! sector arithmetic checked against the device, build CLOSE, and turn the
//! errno of every RTRS response into a typed [`RemoteError`].
//!
//! Every builder writes the RNBD message into the caller's user-header
//! buffer and returns an [`Outgoing`]: how long the header is, which RTRS
//! request kind must carry it and how much data goes with it (the data sent
//! for an RTRS WRITE, the read buffer for an RTRS READ), exactly as the
//! Linux client sends them (rnbd.md §1.1). Nothing here allocates, blocks or
//! touches the network; the caller owns the buffers and the transport.
//!
//! The client refuses locally what the server would refuse (writes through a
//! read-only mapping, ranges beyond the device, misalignment to the logical
//! block size, ops the device does not advertise), so a correct initiator
//! never sees those errnos from a correct server.

use core::fmt;

use crate::errno;
use crate::wire::{
    AccessMode, CachePolicy, Close, EmitError, Io, IoFlags, IoOp, Open, OpenRsp, ParseError,
    RtrsDirection, SessInfo, SessInfoRsp, PROTOCOL_VERSION_MAJOR, SECTOR_SIZE,
};

/// A message built for sending: how the RTRS layer must carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Outgoing {
    /// Bytes of the user header written (the RNBD message).
    pub user_header_len: usize,
    /// The RTRS request kind to send it as (rnbd.md §1.1).
    pub direction: RtrsDirection,
    /// For an RTRS WRITE, the data bytes sent with it; for an RTRS READ, the
    /// length of the buffer the server writes the reply into.
    pub data_len: u32,
}

/// What a server's errno means (rnbd.md §4.5). `Other` keeps any value not
/// listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoteError {
    /// EPERM: writer limit, mode upgrade, or a write through a read-only open.
    NotPermitted,
    /// ENOENT: no such volume.
    NotFound,
    /// EIO: the volume failed (or, from Linux, an IO past the end).
    Io,
    /// EAGAIN: transient, retry.
    Again,
    /// ENOMEM: server out of resources.
    NoMemory,
    /// EACCES: the access list refuses the volume or the mode.
    AccessDenied,
    /// EEXIST: the volume is mapped by this session under another path.
    AlreadyMapped,
    /// EINVAL: the server found the request malformed or out of range.
    Invalid,
    /// EMFILE: the session's device table is full.
    TooManyDevices,
    /// ENOSPC: the volume is out of space.
    NoSpace,
    /// EROFS: read-only.
    ReadOnly,
    /// EOPNOTSUPP: the op is not supported by the device.
    Unsupported,
    /// ENOTCONN: the device id is not open on the server (closed, or
    /// force-closed).
    NotConnected,
    /// ETIMEDOUT: the volume timed out.
    TimedOut,
    /// Any other non-zero errno.
    Other(u16),
}

impl RemoteError {
    /// The error for a non-zero errno; `None` for 0.
    pub const fn from_errno(value: u16) -> Option<RemoteError> {
        Some(match value {
            errno::OK => return None,
            errno::EPERM => RemoteError::NotPermitted,
            errno::ENOENT => RemoteError::NotFound,
            errno::EIO => RemoteError::Io,
            errno::EAGAIN => RemoteError::Again,
            errno::ENOMEM => RemoteError::NoMemory,
            errno::EACCES => RemoteError::AccessDenied,
            errno::EEXIST => RemoteError::AlreadyMapped,
            errno::EINVAL => RemoteError::Invalid,
            errno::EMFILE => RemoteError::TooManyDevices,
            errno::ENOSPC => RemoteError::NoSpace,
            errno::EROFS => RemoteError::ReadOnly,
            errno::EOPNOTSUPP => RemoteError::Unsupported,
            errno::ENOTCONN => RemoteError::NotConnected,
            errno::ETIMEDOUT => RemoteError::TimedOut,
            other => RemoteError::Other(other),
        })
    }

    /// The errno.
    pub const fn errno(self) -> u16 {
        match self {
            RemoteError::NotPermitted => errno::EPERM,
            RemoteError::NotFound => errno::ENOENT,
            RemoteError::Io => errno::EIO,
            RemoteError::Again => errno::EAGAIN,
            RemoteError::NoMemory => errno::ENOMEM,
            RemoteError::AccessDenied => errno::EACCES,
            RemoteError::AlreadyMapped => errno::EEXIST,
            RemoteError::Invalid => errno::EINVAL,
            RemoteError::TooManyDevices => errno::EMFILE,
            RemoteError::NoSpace => errno::ENOSPC,
            RemoteError::ReadOnly => errno::EROFS,
            RemoteError::Unsupported => errno::EOPNOTSUPP,
            RemoteError::NotConnected => errno::ENOTCONN,
            RemoteError::TimedOut => errno::ETIMEDOUT,
            RemoteError::Other(value) => value,
        }
    }
}

/// `Ok` for errno 0, else the typed error.
///
/// # Errors
/// The [`RemoteError`] of a non-zero errno.
pub const fn check_status(status: u16) -> Result<(), RemoteError> {
    match RemoteError::from_errno(status) {
        None => Ok(()),
        Some(error) => Err(error),
    }
}

/// Why a client operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClientError {
    /// The user-header buffer is too short for the message.
    BufferTooSmall,
    /// The arguments make no valid message (for example a device path the
    /// wire rules reject).
    Invalid(ParseError),
    /// The server answered with an errno.
    Remote(RemoteError),
    /// The server's response bytes are malformed.
    BadResponse(ParseError),
    /// Offset or length not a multiple of the logical block size.
    Misaligned,
    /// The range ends beyond the device, or overflows.
    OutOfRange,
    /// Zero-length read, write or discard.
    Empty,
    /// Longer than the session's `max_io_size` or the device's discard limit.
    TooLarge,
    /// A write-type op on a read-only mapping.
    ReadOnly,
    /// FLUSH, but the device has no write-back cache (nothing to flush).
    FlushUnsupported,
    /// FUA write on a write-back device that does not advertise FUA: write,
    /// then flush.
    FuaUnsupported,
    /// DISCARD, but the device does not advertise it.
    DiscardUnsupported,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::BufferTooSmall => f.write_str("buffer too small"),
            ClientError::Invalid(error) => write!(f, "invalid request: {error}"),
            ClientError::Remote(error) => write!(f, "server error: errno {}", error.errno()),
            ClientError::BadResponse(error) => write!(f, "bad response: {error}"),
            ClientError::Misaligned => f.write_str("not aligned to the logical block size"),
            ClientError::OutOfRange => f.write_str("beyond the end of the device"),
            ClientError::Empty => f.write_str("empty request"),
            ClientError::TooLarge => f.write_str("request too large"),
            ClientError::ReadOnly => f.write_str("device mapped read-only"),
            ClientError::FlushUnsupported => f.write_str("device has no write-back cache"),
            ClientError::FuaUnsupported => f.write_str("device does not support FUA"),
            ClientError::DiscardUnsupported => f.write_str("device does not support discard"),
        }
    }
}

impl core::error::Error for ClientError {}

impl From<EmitError> for ClientError {
    fn from(error: EmitError) -> Self {
        match error {
            EmitError::Invalid(error) => ClientError::Invalid(error),
            _ => ClientError::BufferTooSmall,
        }
    }
}

/// Builds SESS_INFO with version 2 into `user_header` (rnbd.md §2.2): an
/// RTRS READ with a 36-byte reply buffer.
///
/// # Errors
/// `BufferTooSmall`.
pub fn sess_info(user_header: &mut [u8]) -> Result<Outgoing, ClientError> {
    let user_header_len = SessInfo {
        ver: PROTOCOL_VERSION_MAJOR,
    }
    .emit(user_header)?;
    Ok(Outgoing {
        user_header_len,
        direction: RtrsDirection::Read,
        data_len: SessInfoRsp::LEN as u32,
    })
}

/// Reads the answer to SESS_INFO: the session version, `min(ver, 2)`
/// (rnbd.md §2.3).
///
/// # Errors
/// `Remote` for a non-zero status, `BadResponse` for malformed bytes.
pub fn sess_info_rsp(status: u16, response: &[u8]) -> Result<u8, ClientError> {
    check_status(status).map_err(ClientError::Remote)?;
    let rsp = SessInfoRsp::parse(response).map_err(ClientError::BadResponse)?;
    Ok(rsp.ver.min(PROTOCOL_VERSION_MAJOR))
}

/// Builds OPEN of `device_path` with `access_mode` (rnbd.md §2.4): an RTRS
/// READ with a 56-byte reply buffer.
///
/// # Errors
/// `BufferTooSmall`, `Invalid` for a path the wire rules reject.
pub fn open(
    device_path: &str,
    access_mode: AccessMode,
    user_header: &mut [u8],
) -> Result<Outgoing, ClientError> {
    let user_header_len = Open {
        access_mode,
        device_path,
    }
    .emit(user_header)?;
    Ok(Outgoing {
        user_header_len,
        direction: RtrsDirection::Read,
        data_len: OpenRsp::LEN as u32,
    })
}

/// Device geometry from OPEN_RSP (rnbd.md §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Logical block size in bytes (IO alignment).
    pub logical_block_size: u16,
    /// Physical block size in bytes.
    pub physical_block_size: u16,
    /// Largest discard in sectors; 0: no discard.
    pub max_discard_sectors: u32,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
    /// Discard alignment in bytes.
    pub discard_alignment: u32,
    /// Secure erase supported.
    pub secure_erase: bool,
}

/// An opened device: what OPEN_RSP said and how it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// Device id for IO and CLOSE.
    pub id: u32,
    /// Capacity in 512-byte sectors.
    pub nsectors: u64,
    /// Block sizes and discard limits.
    pub geometry: Geometry,
    /// Write-back cache and FUA.
    pub policy: CachePolicy,
    /// How it was opened.
    pub mode: AccessMode,
    /// Largest read or write in bytes: the RTRS session's `max_io_size`
    /// (rnbd.md §2.5: `max_hw_sectors` is not what limits IO). `u32::MAX`
    /// until [`Device::with_max_io_size`].
    pub max_io_size: u32,
}

impl Device {
    /// Reads the answer to an OPEN sent with `mode`.
    ///
    /// # Errors
    /// `Remote` for a non-zero status; `BadResponse` for malformed bytes or
    /// a capacity whose byte size overflows 64 bits.
    pub fn from_open_rsp(
        status: u16,
        response: &[u8],
        mode: AccessMode,
    ) -> Result<Device, ClientError> {
        check_status(status).map_err(ClientError::Remote)?;
        let rsp = OpenRsp::parse(response).map_err(ClientError::BadResponse)?;
        if rsp.capacity_bytes().is_none() {
            return Err(ClientError::BadResponse(ParseError::SectorRangeOverflow));
        }
        Ok(Device {
            id: rsp.device_id,
            nsectors: rsp.nsectors,
            geometry: Geometry {
                logical_block_size: rsp.logical_block_size,
                physical_block_size: rsp.physical_block_size,
                max_discard_sectors: rsp.max_discard_sectors,
                discard_granularity: rsp.discard_granularity,
                discard_alignment: rsp.discard_alignment,
                secure_erase: rsp.secure_discard != 0 && rsp.max_discard_sectors != 0,
            },
            policy: rsp.cache_policy,
            mode,
            max_io_size: u32::MAX,
        })
    }

    /// The same device, limited to `max_io_size` bytes per read or write.
    pub const fn with_max_io_size(self, max_io_size: u32) -> Device {
        Device {
            max_io_size,
            ..self
        }
    }

    /// Capacity in bytes.
    pub const fn capacity_bytes(&self) -> u64 {
        // Checked in `from_open_rsp`.
        self.nsectors.saturating_mul(SECTOR_SIZE as u64)
    }

    /// True if the device has a volatile cache that FLUSH empties.
    pub const fn has_write_cache(&self) -> bool {
        self.policy.contains(CachePolicy::WRITEBACK)
    }

    /// Builds a READ of `len` bytes at byte `offset`: an RTRS READ with a
    /// `len`-byte buffer.
    ///
    /// # Errors
    /// `Empty`, `Misaligned`, `OutOfRange`, `TooLarge`, `BufferTooSmall`.
    pub fn read(
        &self,
        offset: u64,
        len: u32,
        user_header: &mut [u8],
    ) -> Result<Outgoing, ClientError> {
        let sector = self.checked_range(offset, len)?;
        if len > self.max_io_size {
            return Err(ClientError::TooLarge);
        }
        self.emit_io(IoOp::Read, IoFlags::SYNC, sector, len, len, user_header)
    }

    /// Builds a WRITE of `len` bytes at byte `offset`, durable before
    /// completion if `fua`: an RTRS WRITE carrying the `len` data bytes.
    /// On a device without write-back cache every write is durable and the
    /// FUA flag is not sent (as Linux does, rnbd.md §3).
    ///
    /// # Errors
    /// `ReadOnly`, `FuaUnsupported`, `Empty`, `Misaligned`, `OutOfRange`,
    /// `TooLarge`, `BufferTooSmall`.
    pub fn write(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        user_header: &mut [u8],
    ) -> Result<Outgoing, ClientError> {
        if !self.mode.is_writable() {
            return Err(ClientError::ReadOnly);
        }
        let flags = match (fua, self.has_write_cache()) {
            (true, true) if self.policy.contains(CachePolicy::FUA) => {
                IoFlags::SYNC.union(IoFlags::FUA)
            }
            (true, true) => return Err(ClientError::FuaUnsupported),
            _ => IoFlags::NONE,
        };
        let sector = self.checked_range(offset, len)?;
        if len > self.max_io_size {
            return Err(ClientError::TooLarge);
        }
        self.emit_io(IoOp::Write, flags, sector, len, len, user_header)
    }

    /// Builds a FLUSH (rnbd.md §7.5: rw 0x302, sector all ones, no data):
    /// an RTRS READ with no buffer.
    ///
    /// # Errors
    /// `FlushUnsupported` without write-back cache, `BufferTooSmall`.
    pub fn flush(&self, user_header: &mut [u8]) -> Result<Outgoing, ClientError> {
        if !self.has_write_cache() {
            return Err(ClientError::FlushUnsupported);
        }
        self.emit_io(
            IoOp::Flush,
            IoFlags::SYNC.union(IoFlags::FUA),
            u64::MAX,
            0,
            0,
            user_header,
        )
    }

    /// Builds a DISCARD of `len` bytes at byte `offset` (rnbd.md §7.6): an
    /// RTRS WRITE with no data.
    ///
    /// # Errors
    /// `ReadOnly`, `DiscardUnsupported`, `Empty`, `Misaligned`,
    /// `OutOfRange`, `TooLarge`, `BufferTooSmall`.
    pub fn discard(
        &self,
        offset: u64,
        len: u32,
        user_header: &mut [u8],
    ) -> Result<Outgoing, ClientError> {
        if !self.mode.is_writable() {
            return Err(ClientError::ReadOnly);
        }
        if self.geometry.max_discard_sectors == 0 {
            return Err(ClientError::DiscardUnsupported);
        }
        let sector = self.checked_range(offset, len)?;
        if u64::from(len) > u64::from(self.geometry.max_discard_sectors) * u64::from(SECTOR_SIZE) {
            return Err(ClientError::TooLarge);
        }
        self.emit_io(IoOp::Discard, IoFlags::NONE, sector, len, 0, user_header)
    }

    /// Builds CLOSE of this device (rnbd.md §2.6): an RTRS WRITE, no data.
    ///
    /// # Errors
    /// `BufferTooSmall`.
    pub fn close(&self, user_header: &mut [u8]) -> Result<Outgoing, ClientError> {
        let user_header_len = Close { device_id: self.id }.emit(user_header)?;
        Ok(Outgoing {
            user_header_len,
            direction: RtrsDirection::Write,
            data_len: 0,
        })
    }

    /// The start sector of `[offset, offset + len)` after checking it is
    /// non-empty, block-aligned and inside the device.
    fn checked_range(&self, offset: u64, len: u32) -> Result<u64, ClientError> {
        if len == 0 {
            return Err(ClientError::Empty);
        }
        let block = u64::from(self.geometry.logical_block_size.max(SECTOR_SIZE as u16));
        if offset % block != 0 || u64::from(len) % block != 0 {
            return Err(ClientError::Misaligned);
        }
        let end = offset
            .checked_add(u64::from(len))
            .ok_or(ClientError::OutOfRange)?;
        if end > self.capacity_bytes() {
            return Err(ClientError::OutOfRange);
        }
        Ok(offset / u64::from(SECTOR_SIZE))
    }

    fn emit_io(
        &self,
        op: IoOp,
        flags: IoFlags,
        sector: u64,
        bi_size: u32,
        data_len: u32,
        user_header: &mut [u8],
    ) -> Result<Outgoing, ClientError> {
        let io = Io {
            device_id: self.id,
            sector,
            op,
            flags,
            bi_size,
            prio: 0,
        };
        let user_header_len = io.emit(user_header)?;
        Ok(Outgoing {
            user_header_len,
            direction: op.rtrs_direction(),
            data_len,
        })
    }
}

/// Reads the answer to an IO or CLOSE: `Ok` for errno 0.
///
/// # Errors
/// `Remote` with the typed error.
pub const fn io_status(status: u16) -> Result<(), ClientError> {
    match check_status(status) {
        Ok(()) => Ok(()),
        Err(error) => Err(ClientError::Remote(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errno_round_trip() {
        for value in 0..512u16 {
            match RemoteError::from_errno(value) {
                None => assert_eq!(value, 0),
                Some(error) => assert_eq!(error.errno(), value),
            }
        }
        assert_eq!(
            RemoteError::from_errno(107),
            Some(RemoteError::NotConnected)
        );
        assert_eq!(RemoteError::from_errno(300), Some(RemoteError::Other(300)));
    }
}
