//! RNBD server logic, sans-IO: sessions, device tables, OPEN/CLOSE/IO.
//!
//! The RTRS server delivers each request's user header (an RNBD message),
//! the length of the request's data area and its RTRS direction; this module
//! decides everything RNBD decides (rnbd.md §4) and hands back an [`Action`]:
//! answer now, or execute a [`BlockRequest`] on a volume and report its
//! result through [`Server::complete`]. It never touches a volume, a clock
//! or the network itself, and never allocates: device tables are fixed
//! arrays ([`crate::config`]).
//!
//! # Shape
//!
//! * [`Server`] holds what is server-wide: per-volume writer counts (the
//!   write-sharing rule of rnbd.md §4.2 step 6 spans sessions) and per-volume
//!   statistics.
//! * [`Session`] holds one RNBD session (one RTRS session): the negotiated
//!   version, the device table keyed by device id and the session's
//!   statistics. The engine owns one per RTRS session and passes it in.
//! * [`Exports`] is how the server resolves an OPEN's `device_path`: the
//!   engine implements it per session from the manifest
//!   (`Manifest::volume_by_device_path` + `Manifest::access`), so names are
//!   resolved through an explicit export table, never a file system
//!   (rnbd.md §8.3 #29).
//!
//! # Parse, then execute
//!
//! [`Server::process`] parses the message and checks every rnbd.md §8.3 item
//! before anything reaches a volume: message length and type (#24, #25),
//! RTRS direction (#26), response buffer size (#27), path rules (#28, #29),
//! access mode, access list and writer limits (#30, #31), device id (#32),
//! op (#33), `bi_size` against the data actually sent (#34), range with
//! checked arithmetic and logical-block alignment (#35), writes through a
//! read-only open (#36), discard support and size (#37); `prio` is ignored
//! (#38) and devices per session are capped (#39). Only then does it return
//! [`Action::Submit`]; the engine only does IO.
//!
//! # Status mapping
//!
//! Every refusal and every volume failure is an [`Error`]; [`status_for`] is
//! the one function that turns it into the errno of the RTRS response. The
//! table (rnbd.md §4.5, §8.3):
//!
//! | Error | errno | Why |
//! |---|---|---|
//! | `Malformed(e)` | `e.errno()`: EOPNOTSUPP for an unknown op, else EINVAL | §4.5, §8.3 #24-#35 |
//! | `NotARequest`, `WrongDirection`, `ResponseBufferTooSmall` | EINVAL | §8.3 #25-#27 |
//! | `NoSuchVolume` | ENOENT | what `blkdev_get_by_path` gives Linux (§4.2 step 5) |
//! | `AccessDenied` | EACCES | access list (§8.3 #30), as a permission error opening the device |
//! | `WriterLimit` | EPERM | Linux's writer rule (§4.2 step 6) |
//! | `ModeUpgrade` | EPERM | §8.3 #31 |
//! | `AlreadyMapped` | EEXIST | Linux's sysfs clash (§4.2 step 7) |
//! | `TooManyDevices` | EMFILE | §8.3 #39: a per-session cap, told apart from ENOMEM |
//! | `BadGeometry` | EIO | the engine described a volume OPEN_RSP cannot carry |
//! | `UnknownDevice` | ENOTCONN | §4.4 step 1, §8.3 #32 |
//! | `ReadOnly` | EPERM | §8.3 #36 (first choice there) |
//! | `FlushUnsupported`, `DiscardUnsupported` | EOPNOTSUPP | §8.3 #37, what the block layer gives Linux |
//! | `DataLengthMismatch`, `OutOfRange`, `Misaligned`, `DiscardTooLarge` | EINVAL | §8.3 #34, #35, #37 |
//! | `Io(Media / NoSpace / TimedOut / Unsupported / Resource / Again)` | EIO / ENOSPC / ETIMEDOUT / EOPNOTSUPP / ENOMEM / EAGAIN | `blk_status_to_errno` (§4.5) |
//!
//! Linux answers a range past the end with EIO (from the block layer); Brick
//! refuses it before submission with EINVAL, which the stock client maps to
//! the same `BLK_STS_IOERR` and Brick's client reports precisely.
//!
//! # Close with IO in flight (rnbd.md §4.3, §4.6)
//!
//! CLOSE takes the id out of service at once (new IO gets ENOTCONN); if IO
//! is in flight the device becomes [`DeviceState::Draining`] and
//! [`Action::CloseDeferred`] is returned; the completion of the last IO
//! names the CLOSE's tag in [`Completion::close_done`], and only then is the
//! success reply sent and the id freed. CLOSE of an unknown id succeeds
//! (Linux does the same). [`Server::end_session`] does the same for every
//! device when the session goes.
//!
//! # Example
//!
//! ```
//! use rnbd::server::{
//!     Action, Export, Exports, Grant, LookupError, Request, Server, Session, VolumeId,
//!     VolumeInfo,
//! };
//! use rnbd::wire::{AccessMode, Open, OpenRsp, RtrsDirection};
//!
//! /// The engine's export table for one session (normally from the manifest).
//! struct OneVolume;
//! impl Exports for OneVolume {
//!     fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
//!         match device_path {
//!             "vol0" => Ok(Export {
//!                 volume: VolumeInfo::new(VolumeId::try_new(0).unwrap(), 131_072),
//!                 grant: Grant::ReadWrite,
//!             }),
//!             _ => Err(LookupError::NotFound),
//!         }
//!     }
//! }
//!
//! let mut server = Server::new();
//! let mut session = Session::new();
//! let mut user_header = [0u8; Open::LEN];
//! Open { access_mode: AccessMode::ReadWrite, device_path: "vol0" }
//!     .emit(&mut user_header)
//!     .unwrap();
//! let request = Request {
//!     user_header: &user_header,
//!     data_len: OpenRsp::LEN,
//!     direction: RtrsDirection::Read,
//!     tag: 0,
//! };
//! let mut chunk = [0u8; OpenRsp::LEN];
//! let action = server.process(&mut session, &OneVolume, &request, &mut chunk);
//! assert_eq!(action, Action::Respond { len: OpenRsp::LEN });
//! assert_eq!(OpenRsp::parse(&chunk).unwrap().nsectors, 131_072);
//! ```
//!
//! # Device ids
//!
//! The lowest free id from 0 (rnbd.md §2.8), below
//! [`MAX_DEVICES_PER_SESSION`]; an id is reused only once its device has
//! fully closed.

mod request;
mod session;
mod stats;
mod volume;

pub use request::*;
pub use session::*;
pub use stats::*;
pub use volume::*;

use core::fmt;

use heapless::String;

use crate::config::{MAX_DEVICES_PER_SESSION, MAX_VOLUMES};
use crate::errno;
use crate::wire::{
    AccessMode, CachePolicy, Close, Io, IoFlags, IoOp, Message, Open, OpenRsp, ParseError,
    RtrsDirection, SessInfo, SessInfoRsp, DEVICE_PATH_LEN, PROTOCOL_VERSION_MAJOR, SECTOR_SIZE,
};
/// Server-wide state of one volume.
#[derive(Debug, Clone, Copy, Default)]
struct VolumeState {
    /// Open devices with write access, over all sessions.
    writers: u32,
    stats: VolumeStats,
}

/// Server-wide RNBD state: writer counts and statistics per volume.
#[derive(Debug, Clone)]
pub struct Server {
    volumes: [VolumeState; MAX_VOLUMES],
}

impl Default for Server {
    fn default() -> Self {
        Server::new()
    }
}

impl Server {
    /// A server with no open volumes.
    pub fn new() -> Server {
        Server {
            volumes: [VolumeState::default(); MAX_VOLUMES],
        }
    }

    /// Statistics of `volume`.
    pub fn volume_stats(&self, volume: VolumeId) -> &VolumeStats {
        &self.volumes[volume.index()].stats
    }

    /// Open devices with write access to `volume`, over all sessions.
    pub fn writers(&self, volume: VolumeId) -> u32 {
        self.volumes[volume.index()].writers
    }

    /// Handles one request of `session` (rnbd.md §4). `response` is the
    /// chunk's data area (at least `request.data_len` bytes for the reply of
    /// an RTRS READ); SESS_INFO_RSP and OPEN_RSP are written at its start.
    /// Bounded work: one table scan at most.
    pub fn process<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Action {
        match self.dispatch(session, exports, request, response) {
            Ok(action) => action,
            Err(error) => {
                session.stats.errors.record(&error);
                Action::Refuse(error)
            }
        }
    }

    fn dispatch<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Result<Action, Error> {
        let message = Message::parse(request.user_header).map_err(Error::Malformed)?;
        let direction = message.rtrs_direction().ok_or(Error::NotARequest)?;
        if direction != request.direction {
            return Err(Error::WrongDirection);
        }
        match message {
            Message::SessInfo(sess_info) => sess_info_rsp(session, sess_info, request, response),
            Message::Open(open) => self.open(session, exports, open, request, response),
            Message::Close(close) => Ok(self.close(session, close, request.tag)),
            Message::Io(io) => self.io(session, io, request.data_len),
            Message::SessInfoRsp(_) | Message::OpenRsp(_) => Err(Error::NotARequest),
        }
    }

    /// OPEN (rnbd.md §4.2, with §8.3 #28-#31, #39).
    fn open<E: Exports + ?Sized>(
        &mut self,
        session: &mut Session,
        exports: &E,
        open: Open<'_>,
        request: &Request<'_>,
        response: &mut [u8],
    ) -> Result<Action, Error> {
        let response = response_buffer(request, response, OpenRsp::LEN)?;
        // Re-open of the identical path: the same id, but unlike Linux the
        // mode is rechecked (§8.3 #31).
        if let Some((id, device)) = session.find_open_path(open.device_path) {
            if open.access_mode.is_writable() && !device.mode.is_writable() {
                return Err(Error::ModeUpgrade);
            }
            let len = emit_open_rsp(&device.volume, id, response)?;
            session.stats.opens += 1;
            return Ok(Action::Respond { len });
        }
        let export = exports
            .lookup(open.device_path)
            .map_err(|error| match error {
                LookupError::NotFound => Error::NoSuchVolume,
                LookupError::Denied => Error::AccessDenied,
            })?;
        let volume = export.volume;
        if open.access_mode.is_writable() && export.grant != Grant::ReadWrite {
            return Err(Error::AccessDenied);
        }
        if session.holds_volume(volume.id) {
            return Err(Error::AlreadyMapped);
        }
        let state = &mut self.volumes[volume.id.index()];
        let writer_limit_reached = match open.access_mode {
            AccessMode::ReadOnly => false,
            AccessMode::ReadWrite => state.writers > 0,
            AccessMode::Migration => state.writers >= 2,
        };
        if writer_limit_reached {
            return Err(Error::WriterLimit);
        }
        let id = session.free_id().ok_or(Error::TooManyDevices)?;
        let path = String::try_from(open.device_path)
            .map_err(|_| Error::Malformed(ParseError::PathNotTerminated))?;
        let len = emit_open_rsp(&volume, id as u32, response)?;
        if open.access_mode.is_writable() {
            state.writers += 1;
        }
        state.stats.opens += 1;
        session.devices[id] = DeviceState::Open(Device {
            path,
            volume,
            mode: open.access_mode,
            in_flight: 0,
        });
        session.stats.opens += 1;
        Ok(Action::Respond { len })
    }

    /// CLOSE (rnbd.md §4.3): always success; deferred while IO is in flight.
    fn close(&mut self, session: &mut Session, close: Close, tag: u32) -> Action {
        session.stats.closes += 1;
        let Some(state) = usize::try_from(close.device_id)
            .ok()
            .and_then(|id| session.devices.get_mut(id))
        else {
            return Action::Respond { len: 0 };
        };
        match core::mem::take(state) {
            DeviceState::Open(device) if device.in_flight > 0 => {
                *state = DeviceState::Draining {
                    device,
                    close_tag: Some(tag),
                };
                Action::CloseDeferred
            }
            DeviceState::Open(device) => {
                self.release(&device);
                Action::Respond { len: 0 }
            }
            // Unknown or already closing: Linux no longer finds the id and
            // answers success at once.
            other => {
                *state = other;
                Action::Respond { len: 0 }
            }
        }
    }

    /// IO (rnbd.md §4.4, §8.3 #32-#37): every check, then the block request.
    fn io(&mut self, session: &mut Session, io: Io, data_len: usize) -> Result<Action, Error> {
        let device = session
            .open_device_mut(io.device_id)
            .ok_or(Error::UnknownDevice)?;
        let volume = device.volume;
        let checked = check_io(&io, &volume, device.mode, data_len);
        let (op, kind, bytes) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                self.volumes[volume.id.index()].stats.errors.record(&error);
                return Err(error);
            }
        };
        let Some(op) = op else {
            // A discard trimmed to no whole granule: done, nothing to do.
            session.stats.io.record(kind, 0, true);
            self.volumes[volume.id.index()]
                .stats
                .io
                .record(kind, 0, true);
            return Ok(Action::Respond { len: 0 });
        };
        device.in_flight += 1;
        Ok(Action::Submit {
            request: BlockRequest {
                volume: volume.id,
                op,
            },
            ticket: IoTicket {
                device_id: io.device_id,
                volume: volume.id,
                kind,
                bytes,
            },
        })
    }

    /// Reports the result of a submitted request: the errno of its reply,
    /// and a CLOSE whose reply is now due if this was the device's last IO.
    pub fn complete(
        &mut self,
        session: &mut Session,
        ticket: IoTicket,
        result: Result<(), IoError>,
    ) -> Completion {
        let ok = result.is_ok();
        session.stats.io.record(ticket.kind, ticket.bytes, ok);
        self.volumes[ticket.volume.index()]
            .stats
            .io
            .record(ticket.kind, ticket.bytes, ok);
        let status = match result {
            Ok(()) => errno::OK,
            Err(error) => {
                let error = Error::Io(error);
                session.stats.errors.record(&error);
                self.volumes[ticket.volume.index()]
                    .stats
                    .errors
                    .record(&error);
                status_for(&error)
            }
        };
        let data_len = if ok && ticket.kind == IoKind::Read {
            ticket.bytes as usize
        } else {
            0
        };
        let mut close_done = None;
        if let Some(state) = usize::try_from(ticket.device_id)
            .ok()
            .and_then(|id| session.devices.get_mut(id))
        {
            match state {
                DeviceState::Open(device) => {
                    device.in_flight = device.in_flight.saturating_sub(1);
                }
                DeviceState::Draining { device, close_tag } => {
                    device.in_flight = device.in_flight.saturating_sub(1);
                    if device.in_flight == 0 {
                        close_done = *close_tag;
                        if let DeviceState::Draining { device, .. } = core::mem::take(state) {
                            self.release(&device);
                        }
                    }
                }
                DeviceState::Free => {}
            }
        }
        Completion {
            status,
            data_len,
            close_done,
        }
    }

    /// Ends `session` (its last RTRS path is gone, rnbd.md §4.6): every
    /// device is closed; devices with IO in flight drain first (their
    /// completions still go through [`Server::complete`], the replies are
    /// dropped by RTRS). Returns the number of devices still draining; the
    /// session may be dropped once [`Session::is_idle`].
    pub fn end_session(&mut self, session: &mut Session) -> usize {
        let mut draining = 0;
        for state in session.devices.iter_mut() {
            match core::mem::take(state) {
                DeviceState::Free => {}
                DeviceState::Open(device) | DeviceState::Draining { device, .. } => {
                    if device.in_flight == 0 {
                        self.release(&device);
                    } else {
                        draining += 1;
                        *state = DeviceState::Draining {
                            device,
                            close_tag: None,
                        };
                    }
                }
            }
        }
        draining
    }

    fn release(&mut self, device: &Device) {
        if device.mode.is_writable() {
            let state = &mut self.volumes[device.volume.id.index()];
            state.writers = state.writers.saturating_sub(1);
        }
    }
}

/// SESS_INFO (rnbd.md §4.1): `min(ver, 2)` stored and returned.
fn sess_info_rsp(
    session: &mut Session,
    sess_info: SessInfo,
    request: &Request<'_>,
    response: &mut [u8],
) -> Result<Action, Error> {
    let response = response_buffer(request, response, SessInfoRsp::LEN)?;
    let ver = sess_info.ver.min(PROTOCOL_VERSION_MAJOR);
    let len = SessInfoRsp { ver }
        .emit(response)
        .map_err(|_| Error::ResponseBufferTooSmall)?;
    session.version = ver;
    Ok(Action::Respond { len })
}

/// The part of `response` a reply of `len` bytes goes to, after checking
/// that the client's read buffer holds it (§8.3 #27).
fn response_buffer<'b>(
    request: &Request<'_>,
    response: &'b mut [u8],
    len: usize,
) -> Result<&'b mut [u8], Error> {
    if request.data_len < len {
        return Err(Error::ResponseBufferTooSmall);
    }
    response.get_mut(..len).ok_or(Error::ResponseBufferTooSmall)
}

fn emit_open_rsp(volume: &VolumeInfo, device_id: u32, response: &mut [u8]) -> Result<usize, Error> {
    volume
        .open_rsp(device_id)
        .emit(response)
        .map_err(|_| Error::BadGeometry)
}

/// The checks of one IO against its device (§8.3 #33-#37), in a fixed
/// order: op advertised, write permission, data length, range, alignment,
/// size limits. `Ok((None, ..))` is a discard with nothing left to do.
fn check_io(
    io: &Io,
    volume: &VolumeInfo,
    mode: AccessMode,
    data_len: usize,
) -> Result<(Option<BlockOp>, IoKind, u32), Error> {
    // Advertised?
    let discard = match io.op {
        IoOp::Read | IoOp::Write => None,
        IoOp::Flush if volume.write_cache => None,
        IoOp::Flush => return Err(Error::FlushUnsupported),
        IoOp::Discard => Some(volume.discard.ok_or(Error::DiscardUnsupported)?),
        IoOp::SecureErase if volume.secure_erase => {
            Some(volume.discard.ok_or(Error::DiscardUnsupported)?)
        }
        IoOp::SecureErase => return Err(Error::DiscardUnsupported),
        IoOp::WriteSame | IoOp::Unknown(_) => {
            return Err(Error::Malformed(ParseError::UnsupportedOp))
        }
    };
    if io.op.is_write() && !mode.is_writable() {
        return Err(Error::ReadOnly);
    }
    // Data length (#34): the data sent (or the read buffer) is exactly
    // bi_size for READ/WRITE, and nothing for the others.
    let expected_data = match io.op {
        IoOp::Read | IoOp::Write => io.bi_size as usize,
        _ => 0,
    };
    if data_len != expected_data {
        return Err(Error::DataLengthMismatch);
    }
    if io.op == IoOp::Flush {
        return Ok((Some(BlockOp::Flush), IoKind::Flush, 0));
    }
    // Range (#35), with checked arithmetic.
    let end = io
        .end_sector()
        .ok_or(Error::Malformed(ParseError::SectorRangeOverflow))?;
    if end > volume.nsectors {
        return Err(Error::OutOfRange);
    }
    let offset = io
        .byte_offset()
        .ok_or(Error::Malformed(ParseError::SectorRangeOverflow))?;
    let block = u64::from(volume.logical_block_size.max(SECTOR_SIZE as u16));
    if offset % block != 0 || u64::from(io.bi_size) % block != 0 {
        return Err(Error::Misaligned);
    }
    let len = io.bi_size;
    match (io.op, discard) {
        (IoOp::Read, _) => Ok((Some(BlockOp::Read { offset, len }), IoKind::Read, len)),
        (IoOp::Write, _) => {
            let fua = io.flags.contains(IoFlags::FUA) && volume.write_cache;
            Ok((
                Some(BlockOp::Write { offset, len, fua }),
                IoKind::Write,
                len,
            ))
        }
        (IoOp::SecureErase, Some(limits)) => {
            check_discard_size(io, &limits)?;
            Ok((
                Some(BlockOp::WriteZeroes { offset, len }),
                IoKind::WriteZeroes,
                len,
            ))
        }
        (_, Some(limits)) => {
            check_discard_size(io, &limits)?;
            Ok(match trim_to_granules(offset, len, &limits) {
                Some((offset, len)) => {
                    (Some(BlockOp::Discard { offset, len }), IoKind::Discard, len)
                }
                None => (None, IoKind::Discard, 0),
            })
        }
        // Unreachable: only DISCARD and SECURE_ERASE have limits.
        _ => Err(Error::Malformed(ParseError::UnsupportedOp)),
    }
}

fn check_discard_size(io: &Io, limits: &DiscardLimits) -> Result<(), Error> {
    if io.nsectors() > u64::from(limits.max_sectors) {
        return Err(Error::DiscardTooLarge);
    }
    Ok(())
}

/// The whole granules inside `[offset, offset + len)`; `None` if there are
/// none (or the arithmetic would overflow, which a checked range cannot).
fn trim_to_granules(offset: u64, len: u32, limits: &DiscardLimits) -> Option<(u64, u32)> {
    if len == 0 {
        return None;
    }
    let granule = u64::from(limits.granularity);
    let end = offset.checked_add(u64::from(len))?;
    if granule <= 1 {
        return Some((offset, len));
    }
    let phase = u64::from(limits.alignment) % granule;
    // Distance of `x` above the last granule boundary at or below it.
    let above = |x: u64| (x % granule + granule - phase) % granule;
    let start = match above(offset) {
        0 => offset,
        rest => offset.checked_add(granule - rest)?,
    };
    // No boundary at or below `end` (possible when the phase is large): no
    // whole granule.
    let end = end.checked_sub(above(end))?;
    if end <= start {
        return None;
    }
    Some((start, u32::try_from(end - start).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::*;

    #[test]
    fn test_trim_to_granules() {
        let limits = DiscardLimits {
            max_sectors: 1 << 20,
            granularity: 4096,
            alignment: 0,
        };
        assert_eq!(trim_to_granules(0, 8192, &limits), Some((0, 8192)));
        assert_eq!(trim_to_granules(512, 8192, &limits), Some((4096, 4096)));
        assert_eq!(trim_to_granules(512, 4096, &limits), None);
        let shifted = DiscardLimits {
            alignment: 512,
            ..limits
        };
        assert_eq!(trim_to_granules(512, 4096, &shifted), Some((512, 4096)));
        let none = DiscardLimits {
            granularity: 0,
            ..limits
        };
        assert_eq!(trim_to_granules(512, 512, &none), Some((512, 512)));
        let late = DiscardLimits {
            alignment: 1024,
            ..limits
        };
        assert_eq!(trim_to_granules(0, 512, &late), None);
        assert_eq!(trim_to_granules(0, 8192, &late), Some((1024, 4096)));
    }

    /// Every small combination: no panic, and the result is whole granules
    /// inside the request.
    #[test]
    fn test_trim_to_granules_small_exhaustive() {
        for granularity in [0u32, 512, 1024, 4096] {
            for alignment in (0..8192).step_by(512) {
                let limits = DiscardLimits {
                    max_sectors: 64,
                    granularity,
                    alignment,
                };
                for offset in (0..16384u64).step_by(512) {
                    for len in (0..16384u32).step_by(512) {
                        if let Some((start, trimmed)) = trim_to_granules(offset, len, &limits) {
                            assert!(start >= offset && trimmed > 0);
                            assert!(start + u64::from(trimmed) <= offset + u64::from(len));
                            if granularity > 1 {
                                let phase = u64::from(alignment % granularity);
                                let g = u64::from(granularity);
                                assert_eq!((start + g - phase) % g, 0);
                                assert_eq!(u64::from(trimmed) % g, 0);
                            }
                        }
                    }
                }
            }
        }
        let huge = DiscardLimits {
            max_sectors: 64,
            granularity: 4096,
            alignment: 512,
        };
        assert_eq!(trim_to_granules(u64::MAX - 600, 512, &huge), None);
    }

    #[test]
    fn test_cache_policy_truthful() {
        let id = VolumeId::try_new(0).unwrap();
        let mut volume = VolumeInfo::new(id, 8);
        assert_eq!(volume.cache_policy(), CachePolicy(0));
        volume.fua = true;
        assert_eq!(volume.cache_policy(), CachePolicy(0), "FUA needs a cache");
        volume.write_cache = true;
        assert_eq!(volume.cache_policy(), CachePolicy(3));
        volume.fua = false;
        assert_eq!(volume.cache_policy(), CachePolicy::WRITEBACK);
        assert_eq!(VolumeId::try_new(MAX_VOLUMES), None);
    }

    /// `status_for` over every error: the table of the module docs.
    #[test]
    fn status_for_is_exhaustive() {
        let parse_errors = [
            (ParseError::Truncated, EINVAL),
            (ParseError::UnexpectedType, EINVAL),
            (ParseError::UnknownType, EINVAL),
            (ParseError::UnknownAccessMode, EINVAL),
            (ParseError::PathNotTerminated, EINVAL),
            (ParseError::EmptyPath, EINVAL),
            (ParseError::ForbiddenPathChar, EINVAL),
            (ParseError::PathTraversal, EINVAL),
            (ParseError::UnsupportedOp, EOPNOTSUPP),
            (ParseError::UnalignedSize, EINVAL),
            (ParseError::SectorRangeOverflow, EINVAL),
            (ParseError::BeyondDeviceEnd, EINVAL),
            (ParseError::FlushWithData, EINVAL),
            (ParseError::BadLogicalBlockSize, EINVAL),
            (ParseError::BadPhysicalBlockSize, EINVAL),
        ];
        let mut table: std::vec::Vec<(Error, u16)> = parse_errors
            .iter()
            .map(|&(error, errno)| (Error::Malformed(error), errno))
            .collect();
        table.extend([
            (Error::NotARequest, EINVAL),
            (Error::WrongDirection, EINVAL),
            (Error::ResponseBufferTooSmall, EINVAL),
            (Error::NoSuchVolume, ENOENT),
            (Error::AccessDenied, EACCES),
            (Error::WriterLimit, EPERM),
            (Error::ModeUpgrade, EPERM),
            (Error::AlreadyMapped, EEXIST),
            (Error::TooManyDevices, EMFILE),
            (Error::BadGeometry, EIO),
            (Error::UnknownDevice, ENOTCONN),
            (Error::ReadOnly, EPERM),
            (Error::FlushUnsupported, EOPNOTSUPP),
            (Error::DiscardUnsupported, EOPNOTSUPP),
            (Error::DataLengthMismatch, EINVAL),
            (Error::OutOfRange, EINVAL),
            (Error::Misaligned, EINVAL),
            (Error::DiscardTooLarge, EINVAL),
            (Error::Io(IoError::Media), EIO),
            (Error::Io(IoError::NoSpace), ENOSPC),
            (Error::Io(IoError::TimedOut), ETIMEDOUT),
            (Error::Io(IoError::Unsupported), EOPNOTSUPP),
            (Error::Io(IoError::Resource), ENOMEM),
            (Error::Io(IoError::Again), EAGAIN),
        ]);
        for (error, errno) in &table {
            assert_eq!(status_for(error), *errno, "{error}");
            assert!(*errno > 0 && *errno < 512, "9-bit errno (§8.4)");
        }
        // Every variant is in the table: this match breaks when one is added.
        for (error, _) in &table {
            match error {
                Error::Malformed(_)
                | Error::NotARequest
                | Error::WrongDirection
                | Error::ResponseBufferTooSmall
                | Error::NoSuchVolume
                | Error::AccessDenied
                | Error::WriterLimit
                | Error::ModeUpgrade
                | Error::AlreadyMapped
                | Error::TooManyDevices
                | Error::BadGeometry
                | Error::UnknownDevice
                | Error::ReadOnly
                | Error::FlushUnsupported
                | Error::DiscardUnsupported
                | Error::DataLengthMismatch
                | Error::OutOfRange
                | Error::Misaligned
                | Error::DiscardTooLarge
                | Error::Io(
                    IoError::Media
                    | IoError::NoSpace
                    | IoError::TimedOut
                    | IoError::Unsupported
                    | IoError::Resource
                    | IoError::Again,
                ) => {}
            }
        }
    }
}
