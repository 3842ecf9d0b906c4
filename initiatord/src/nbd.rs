//! NBD server: fixed-newstyle handshake and simple-reply transmission.
//!
//! Serves one export over any byte stream (`Read + Write`: a unix or TCP
//! socket in the daemon, an in-memory pipe in the tests) on top of a small
//! [`NbdBackend`] trait, so `nbd-client`, `qemu-img` and `qemu-io` can use
//! a Brick volume the kernel's rnbd client does not map.
//!
//! Protocol: <https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>
//! ("Newstyle negotiation", "Option types", "Transmission"). Every integer
//! on the wire is big-endian (network byte order); the helpers say so
//! (`read_u32_be`, `put_u64_be`).
//!
//! What is implemented:
//!
//! * handshake: `NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES`; options
//!   `NBD_OPT_EXPORT_NAME`, `NBD_OPT_GO`, `NBD_OPT_INFO` (replies
//!   `NBD_INFO_EXPORT`, always `NBD_INFO_BLOCK_SIZE`, and `NBD_INFO_NAME`
//!   when asked), `NBD_OPT_LIST`, `NBD_OPT_ABORT`. Every other option
//!   (`STARTTLS`, `STRUCTURED_REPLY`, meta contexts, extended headers…) is
//!   answered `NBD_REP_ERR_UNSUP`, so clients fall back to simple replies.
//!   The export is known by its name and by the empty (default) name.
//! * transmission, simple replies only: `READ`, `WRITE` (+ `FUA`),
//!   `FLUSH`, `TRIM` (+ `FUA`), `WRITE_ZEROES` (+ `FUA`, `NO_HOLE`),
//!   `DISC`. The transmission flags follow the backend: `READ_ONLY` (then
//!   no `SEND_TRIM`/`SEND_WRITE_ZEROES`), `SEND_FLUSH`, `SEND_FUA`.
//!
//! Contract (the errors are chosen in one place, [`errno_for`]):
//!
//! * a request past the end gets `EINVAL` (`ENOSPC` for `WRITE` and
//!   `WRITE_ZEROES`, as the spec asks); a write, trim or write-zeroes on a
//!   read-only export `EPERM`; a backend failure `EIO`; a length or offset
//!   not a multiple of the minimum block size, a payload longer than
//!   [`MAX_REQUEST_LEN`], unknown flags or commands `EINVAL`;
//! * a bad magic, an unknown client flag, an oversized option or a stream
//!   that ends inside a message ends that connection with a
//!   [`ServeError`]: nothing the peer sends panics or allocates;
//! * one buffer of [`MAX_REQUEST_LEN`] bytes is allocated per
//!   [`Server`] and reused by every request and connection.
//!
//! Requests are served one at a time, in order: simple replies need no
//! reordering, and the backend (one Brick session) is single-threaded.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest READ/WRITE payload served (advertised as the maximum block
/// size); it is also the size of the connection buffer.
pub const MAX_REQUEST_LEN: u32 = 32 << 20;
/// Largest option payload read during the handshake (names are at most
/// 4096 bytes by the spec); longer ends the connection.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Largest export name served (the spec's limit).
pub const MAX_NAME_LEN: usize = 4096;

/// Wire constants of the NBD protocol (proto.md).
pub mod wire {
    /// `NBDMAGIC`, the first 8 bytes the server sends.
    pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
    /// `IHAVEOPT`: newstyle negotiation; also prefixes every option.
    pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
    /// Magic of an option reply.
    pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
    /// Magic of a transmission request.
    pub const REQUEST_MAGIC: u32 = 0x2560_9513;
    /// Magic of a simple reply.
    pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

    /// Handshake flag: the server speaks fixed newstyle.
    pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
    /// Handshake flag: the 124 zero bytes after `EXPORT_NAME` may be left out.
    pub const FLAG_NO_ZEROES: u16 = 1 << 1;
    /// Client flag: the client speaks fixed newstyle.
    pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
    /// Client flag: leave out the 124 zero bytes.
    pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

    /// `NBD_OPT_EXPORT_NAME`.
    pub const OPT_EXPORT_NAME: u32 = 1;
    /// `NBD_OPT_ABORT`.
    pub const OPT_ABORT: u32 = 2;
    /// `NBD_OPT_LIST`.
    pub const OPT_LIST: u32 = 3;
    /// `NBD_OPT_STARTTLS`.
    pub const OPT_STARTTLS: u32 = 5;
    /// `NBD_OPT_INFO`.
    pub const OPT_INFO: u32 = 6;
    /// `NBD_OPT_GO`.
    pub const OPT_GO: u32 = 7;
    /// `NBD_OPT_STRUCTURED_REPLY`.
    pub const OPT_STRUCTURED_REPLY: u32 = 8;

    /// `NBD_REP_ACK`.
    pub const REP_ACK: u32 = 1;
    /// `NBD_REP_SERVER`: one export of a `LIST`.
    pub const REP_SERVER: u32 = 2;
    /// `NBD_REP_INFO`.
    pub const REP_INFO: u32 = 3;
    /// `NBD_REP_ERR_UNSUP`: unknown option.
    pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
    /// `NBD_REP_ERR_INVALID`: malformed option.
    pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
    /// `NBD_REP_ERR_UNKNOWN`: no such export.
    pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

    /// `NBD_INFO_EXPORT`: size and transmission flags.
    pub const INFO_EXPORT: u16 = 0;
    /// `NBD_INFO_NAME`.
    pub const INFO_NAME: u16 = 1;
    /// `NBD_INFO_BLOCK_SIZE`: minimum, preferred, maximum.
    pub const INFO_BLOCK_SIZE: u16 = 3;

    /// Transmission flag: the flags field is valid.
    pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
    /// Transmission flag: the export is read-only.
    pub const FLAG_READ_ONLY: u16 = 1 << 1;
    /// Transmission flag: `NBD_CMD_FLUSH` is supported.
    pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
    /// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
    pub const FLAG_SEND_FUA: u16 = 1 << 3;
    /// Transmission flag: `NBD_CMD_TRIM` is supported.
    pub const FLAG_SEND_TRIM: u16 = 1 << 5;
    /// Transmission flag: `NBD_CMD_WRITE_ZEROES` is supported.
    pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;

    /// `NBD_CMD_READ`.
    pub const CMD_READ: u16 = 0;
    /// `NBD_CMD_WRITE`.
    pub const CMD_WRITE: u16 = 1;
    /// `NBD_CMD_DISC`.
    pub const CMD_DISC: u16 = 2;
    /// `NBD_CMD_FLUSH`.
    pub const CMD_FLUSH: u16 = 3;
    /// `NBD_CMD_TRIM`.
    pub const CMD_TRIM: u16 = 4;
    /// `NBD_CMD_WRITE_ZEROES`.
    pub const CMD_WRITE_ZEROES: u16 = 6;

    /// `NBD_CMD_FLAG_FUA`.
    pub const CMD_FLAG_FUA: u16 = 1 << 0;
    /// `NBD_CMD_FLAG_NO_HOLE`.
    pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

    // The NBD spec's error values (`NBD_EPERM`, ...) are Linux's errno
    // numbers, taken from the one errno table; the wire field is 32 bits.
    /// `NBD_EPERM`.
    pub const EPERM: u32 = errno::EPERM as u32;
    /// `NBD_EIO`.
    pub const EIO: u32 = errno::EIO as u32;
    /// `NBD_EINVAL`.
    pub const EINVAL: u32 = errno::EINVAL as u32;
    /// `NBD_ENOSPC`.
    pub const ENOSPC: u32 = errno::ENOSPC as u32;

    /// Length of a transmission request header.
    pub const REQUEST_LEN: usize = 28;
    /// Length of a simple reply header.
    pub const SIMPLE_REPLY_LEN: usize = 16;
}

use wire::*;

/// A backend's failure; the client gets `EIO`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BackendError {
    /// What failed, for the log.
    pub reason: String,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for BackendError {}

/// What the server asks of the volume it exports. Offsets and lengths
/// given to it are in range and multiples of [`NbdBackend::block_size`]
/// (the server checks before calling).
pub trait NbdBackend {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// The minimum block size (a power of two, at least 1).
    fn block_size(&self) -> u32;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    ///
    /// The device failed the read.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError>;
    /// Writes `data` at `offset`, durable before returning if `fua`.
    ///
    /// # Errors
    ///
    /// The device failed the write.
    fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError>;
    /// Makes completed writes durable.
    ///
    /// # Errors
    ///
    /// The device failed the flush.
    fn flush(&mut self) -> Result<(), BackendError>;
    /// Discards `len` bytes at `offset`.
    ///
    /// # Errors
    ///
    /// The device failed the discard.
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), BackendError>;
    /// Called while the client is silent (each time the stream's read
    /// times out): background work such as heartbeats. Returning
    /// [`Idle::Disconnect`] ends the connection (the daemon stopping).
    fn idle(&mut self) -> Idle {
        Idle::Continue
    }
}

/// What [`NbdBackend::idle`] wants.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Idle {
    /// Keep waiting for the client.
    Continue,
    /// End the connection now.
    Disconnect,
}

/// How a connection ended without a protocol error.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ending {
    /// The client sent `NBD_CMD_DISC`.
    Disconnected,
    /// The client sent `NBD_OPT_ABORT`.
    Aborted,
    /// The client closed the stream between two messages.
    ClientClosed,
    /// `NBD_OPT_EXPORT_NAME` named an unknown export; the spec's only
    /// answer is closing the connection.
    UnknownExport,
    /// [`NbdBackend::idle`] asked to stop.
    Stopped,
}

/// Why a connection was closed by the server.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// The stream failed (or timed out writing).
    Io(io::Error),
    /// The stream ended inside a message.
    Truncated,
    /// The client set flags this server does not know.
    BadClientFlags(u32),
    /// An option did not start with `IHAVEOPT`.
    BadOptionMagic(u64),
    /// An option payload longer than [`MAX_OPTION_LEN`].
    OptionTooLong(u32),
    /// An unknown option from a client that is not fixed-newstyle (the
    /// spec says to close, there is no error reply).
    UnsupportedOption(u32),
    /// A request did not start with the request magic.
    BadRequestMagic(u32),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(error) => write!(f, "connection failed: {error}"),
            Self::Truncated => f.write_str("the stream ended inside a message"),
            Self::BadClientFlags(flags) => write!(f, "unknown client flags {flags:#x}"),
            Self::BadOptionMagic(magic) => {
                write!(f, "option magic {magic:#x}, expected {IHAVEOPT:#x}")
            }
            Self::OptionTooLong(len) => {
                write!(f, "option of {len} bytes, at most {MAX_OPTION_LEN} served")
            }
            Self::UnsupportedOption(option) => write!(
                f,
                "unsupported option {option} from a client without fixed newstyle"
            ),
            Self::BadRequestMagic(magic) => {
                write!(f, "request magic {magic:#x}, expected {REQUEST_MAGIC:#x}")
            }
        }
    }
}

impl std::error::Error for ServeError {}

impl From<io::Error> for ServeError {
    fn from(error: io::Error) -> Self {
        if error.kind() == ErrorKind::UnexpectedEof {
            Self::Truncated
        } else {
            Self::Io(error)
        }
    }
}

/// Why a request was refused (the client gets an errno, the connection
/// goes on).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RequestError {
    /// `offset + length` is past the end of the export.
    PastEnd,
    /// Offset or length not a multiple of the minimum block size.
    Unaligned,
    /// A payload longer than [`MAX_REQUEST_LEN`].
    TooLong,
    /// A write, trim or write-zeroes on a read-only export.
    ReadOnly,
    /// A command flag this command does not take.
    BadFlags,
    /// A command this server does not serve.
    UnknownCommand,
    /// The backend failed.
    Backend(BackendError),
}

/// The errno a client gets for `error` on `command` (the one place
/// errors meet the wire). From the spec ("Error values"): "The server
/// SHOULD return `ENOSPC` if it receives a write request including one or
/// more sectors beyond the size of the device."
pub fn errno_for(command: u16, error: &RequestError) -> u32 {
    match error {
        RequestError::PastEnd if matches!(command, CMD_WRITE | CMD_WRITE_ZEROES) => ENOSPC,
        RequestError::PastEnd => EINVAL,
        RequestError::Unaligned
        | RequestError::TooLong
        | RequestError::BadFlags
        | RequestError::UnknownCommand => EINVAL,
        RequestError::ReadOnly => EPERM,
        RequestError::Backend(_) => EIO,
    }
}

/// Counters of one export, shared with whoever reports status.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections that reached transmission.
    pub connections: AtomicU64,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Bytes read by clients.
    pub bytes_read: AtomicU64,
    /// Bytes written by clients (WRITE payloads and zeroes).
    pub bytes_written: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
}

/// One request header, parsed (the magic checked).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Request {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub command: u16,
    /// Echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

impl Request {
    /// Parses a 28-byte header.
    ///
    /// # Errors
    ///
    /// [`ServeError::BadRequestMagic`].
    pub fn parse(header: &[u8; REQUEST_LEN]) -> Result<Self, ServeError> {
        let magic = read_u32_be(header, 0);
        if magic != REQUEST_MAGIC {
            return Err(ServeError::BadRequestMagic(magic));
        }
        Ok(Self {
            flags: read_u16_be(header, 4),
            command: read_u16_be(header, 6),
            cookie: read_u64_be(header, 8),
            offset: read_u64_be(header, 16),
            length: read_u32_be(header, 24),
        })
    }

    /// Emits the 28-byte header (clients; the tests).
    pub fn emit(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

fn read_u16_be(bytes: &[u8], at: usize) -> u16 {
    let mut out = [0u8; 2];
    if let Some(src) = bytes.get(at..at + 2) {
        out.copy_from_slice(src);
    }
    u16::from_be_bytes(out)
}

fn read_u32_be(bytes: &[u8], at: usize) -> u32 {
    let mut out = [0u8; 4];
    if let Some(src) = bytes.get(at..at + 4) {
        out.copy_from_slice(src);
    }
    u32::from_be_bytes(out)
}

fn read_u64_be(bytes: &[u8], at: usize) -> u64 {
    let mut out = [0u8; 8];
    if let Some(src) = bytes.get(at..at + 8) {
        out.copy_from_slice(src);
    }
    u64::from_be_bytes(out)
}

/// What a blocking read of a whole message found.
enum Filled {
    /// The buffer is full.
    Complete,
    /// The stream ended before the first byte (a clean close).
    Closed,
    /// [`NbdBackend::idle`] asked to stop.
    Stopped,
}

/// The server of one export: its name and the connection buffer.
pub struct Server {
    name: String,
    buffer: Vec<u8>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish()
    }
}

/// The negotiated state of a connection.
struct Negotiated {
    no_zeroes: bool,
    fixed: bool,
}

impl Server {
    /// A server of the export `name`; allocates the request buffer
    /// ([`MAX_REQUEST_LEN`] bytes) once.
    pub fn new(name: &str, counters: Arc<Counters>) -> Self {
        Self {
            name: name.to_owned(),
            buffer: vec![0u8; MAX_REQUEST_LEN as usize],
            counters,
        }
    }

    /// The counters this server updates.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Serves one connection to its end: handshake, then requests until
    /// `NBD_CMD_DISC`, a close, or [`NbdBackend::idle`] saying stop.
    ///
    /// A stream with a read timeout lets [`NbdBackend::idle`] run while
    /// the client is silent; timeouts are never errors while reading.
    ///
    /// # Errors
    ///
    /// The connection was closed for a [`ServeError`].
    pub fn serve<S: Read + Write>(
        &mut self,
        stream: &mut S,
        backend: &mut dyn NbdBackend,
    ) -> Result<Ending, ServeError> {
        match self.handshake(stream, backend)? {
            Some(ending) => Ok(ending),
            None => {
                self.counters.connections.fetch_add(1, Ordering::Relaxed);
                self.transmission(stream, backend)
            }
        }
    }

    fn transmission_flags(backend: &dyn NbdBackend) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA;
        if backend.read_only() {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
        }
        flags
    }

    fn knows(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }

    /// The handshake; `None` when transmission starts.
    fn handshake<S: Read + Write>(
        &mut self,
        stream: &mut S,
        backend: &mut dyn NbdBackend,
    ) -> Result<Option<Ending>, ServeError> {
        let mut hello = [0u8; 18];
        hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        stream.write_all(&hello)?;
        stream.flush()?;
        let mut flags = [0u8; 4];
        match fill(stream, &mut flags, backend)? {
            Filled::Complete => {}
            Filled::Closed => return Ok(Some(Ending::ClientClosed)),
            Filled::Stopped => return Ok(Some(Ending::Stopped)),
        }
        let client_flags = u32::from_be_bytes(flags);
        if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(ServeError::BadClientFlags(client_flags));
        }
        let negotiated = Negotiated {
            no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
            fixed: client_flags & FLAG_C_FIXED_NEWSTYLE != 0,
        };
        loop {
            let mut header = [0u8; 16];
            match fill(stream, &mut header, backend)? {
                Filled::Complete => {}
                Filled::Closed => return Ok(Some(Ending::ClientClosed)),
                Filled::Stopped => return Ok(Some(Ending::Stopped)),
            }
            let magic = read_u64_be(&header, 0);
            if magic != IHAVEOPT {
                return Err(ServeError::BadOptionMagic(magic));
            }
            let option = read_u32_be(&header, 8);
            let len = read_u32_be(&header, 12);
            if len > MAX_OPTION_LEN {
                return Err(ServeError::OptionTooLong(len));
            }
            let len = len as usize;
            // `len` <= MAX_OPTION_LEN < buffer length.
            let Some(data) = self.buffer.get_mut(..len) else {
                return Err(ServeError::OptionTooLong(len as u32));
            };
            match fill(stream, data, backend)? {
                Filled::Complete => {}
                Filled::Closed => return Err(ServeError::Truncated),
                Filled::Stopped => return Ok(Some(Ending::Stopped)),
            }
            match option {
                OPT_EXPORT_NAME => {
                    if !self.knows(&self.buffer[..len]) {
                        return Ok(Some(Ending::UnknownExport));
                    }
                    let mut reply = [0u8; 10 + 124];
                    reply[0..8].copy_from_slice(&backend.size().to_be_bytes());
                    reply[8..10].copy_from_slice(&Self::transmission_flags(backend).to_be_bytes());
                    let reply_len = if negotiated.no_zeroes { 10 } else { 134 };
                    stream.write_all(&reply[..reply_len])?;
                    stream.flush()?;
                    return Ok(None);
                }
                OPT_ABORT => {
                    // The client may already be gone: the ACK is a courtesy.
                    let _ = option_reply(stream, option, REP_ACK, &[]);
                    return Ok(Some(Ending::Aborted));
                }
                OPT_LIST => {
                    if len != 0 {
                        option_reply(stream, option, REP_ERR_INVALID, b"LIST takes no data")?;
                    } else {
                        let name = self.name.as_bytes();
                        let mut data = Vec::with_capacity(4 + name.len());
                        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
                        data.extend_from_slice(name);
                        option_reply(stream, option, REP_SERVER, &data)?;
                        option_reply(stream, option, REP_ACK, &[])?;
                    }
                }
                OPT_INFO | OPT_GO => {
                    if self.info(stream, option, len, backend)? && option == OPT_GO {
                        return Ok(None);
                    }
                }
                _ if negotiated.fixed => {
                    option_reply(stream, option, REP_ERR_UNSUP, b"option not supported")?;
                }
                _ => return Err(ServeError::UnsupportedOption(option)),
            }
            stream.flush()?;
        }
    }

    /// Answers `NBD_OPT_INFO`/`NBD_OPT_GO` whose data is
    /// `self.buffer[..len]`; returns whether the export was granted.
    fn info<S: Write>(
        &self,
        stream: &mut S,
        option: u32,
        len: usize,
        backend: &dyn NbdBackend,
    ) -> Result<bool, ServeError> {
        let data = &self.buffer[..len];
        // u32 name length, name, u16 count, count × u16.
        let name_len = read_u32_be(data, 0) as usize;
        let well_formed = len >= 6
            && name_len <= len - 6
            && len == 4 + name_len + 2 + 2 * usize::from(read_u16_be(data, 4 + name_len));
        if !well_formed {
            option_reply(stream, option, REP_ERR_INVALID, b"malformed INFO/GO")?;
            return Ok(false);
        }
        let name = &data[4..4 + name_len];
        if !self.knows(name) {
            option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export")?;
            return Ok(false);
        }
        let requests = &data[4 + name_len + 2..];
        let mut export = [0u8; 12];
        export[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
        export[2..10].copy_from_slice(&backend.size().to_be_bytes());
        export[10..12].copy_from_slice(&Self::transmission_flags(backend).to_be_bytes());
        option_reply(stream, option, REP_INFO, &export)?;
        // Sent whether asked or not (the spec allows it): clients must
        // then keep to the alignment.
        let minimum = backend.block_size().max(1);
        let preferred = minimum.max(4096);
        let mut sizes = [0u8; 14];
        sizes[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        sizes[2..6].copy_from_slice(&minimum.to_be_bytes());
        sizes[6..10].copy_from_slice(&preferred.to_be_bytes());
        sizes[10..14].copy_from_slice(&MAX_REQUEST_LEN.to_be_bytes());
        option_reply(stream, option, REP_INFO, &sizes)?;
        if requests
            .chunks_exact(2)
            .any(|r| read_u16_be(r, 0) == INFO_NAME)
        {
            let mut reply = Vec::with_capacity(2 + self.name.len());
            reply.extend_from_slice(&INFO_NAME.to_be_bytes());
            reply.extend_from_slice(self.name.as_bytes());
            option_reply(stream, option, REP_INFO, &reply)?;
        }
        option_reply(stream, option, REP_ACK, &[])?;
        Ok(true)
    }

    fn transmission<S: Read + Write>(
        &mut self,
        stream: &mut S,
        backend: &mut dyn NbdBackend,
    ) -> Result<Ending, ServeError> {
        loop {
            let mut header = [0u8; REQUEST_LEN];
            match fill(stream, &mut header, backend)? {
                Filled::Complete => {}
                Filled::Closed => return Ok(Ending::ClientClosed),
                Filled::Stopped => return Ok(Ending::Stopped),
            }
            let request = Request::parse(&header)?;
            if request.command == CMD_DISC {
                return Ok(Ending::Disconnected);
            }
            let result = match self.execute(stream, backend, &request)? {
                Some(result) => result,
                None => return Ok(Ending::Stopped),
            };
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let error = match &result {
                Ok(()) => 0,
                Err(error) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    errno_for(request.command, error)
                }
            };
            let mut reply = [0u8; SIMPLE_REPLY_LEN];
            reply[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
            reply[4..8].copy_from_slice(&error.to_be_bytes());
            reply[8..16].copy_from_slice(&request.cookie.to_be_bytes());
            stream.write_all(&reply)?;
            if request.command == CMD_READ && error == 0 {
                let len = request.length as usize;
                stream.write_all(&self.buffer[..len])?;
                self.counters
                    .bytes_read
                    .fetch_add(u64::from(request.length), Ordering::Relaxed);
            }
            stream.flush()?;
        }
    }

    /// Checks and performs one request (reading a WRITE's payload, even
    /// a refused one, so the stream stays in step). `None`: stop asked.
    fn execute<S: Read + Write>(
        &mut self,
        stream: &mut S,
        backend: &mut dyn NbdBackend,
        request: &Request,
    ) -> Result<Option<Result<(), RequestError>>, ServeError> {
        let size = backend.size();
        let block = u64::from(backend.block_size().max(1));
        let end = request.offset.checked_add(u64::from(request.length));
        let in_range = end.is_some_and(|end| end <= size);
        let aligned = request.offset % block == 0 && u64::from(request.length) % block == 0;
        let fua = request.flags & CMD_FLAG_FUA != 0;
        let len = request.length as usize;
        let read_only = backend.read_only();
        let check = |allowed_flags: u16, writes: bool| -> Result<(), RequestError> {
            if request.flags & !allowed_flags != 0 {
                Err(RequestError::BadFlags)
            } else if writes && read_only {
                Err(RequestError::ReadOnly)
            } else if !in_range {
                Err(RequestError::PastEnd)
            } else if !aligned {
                Err(RequestError::Unaligned)
            } else {
                Ok(())
            }
        };
        let result = match request.command {
            CMD_READ => {
                if request.length > MAX_REQUEST_LEN {
                    Err(RequestError::TooLong)
                } else {
                    check(0, false).and_then(|()| {
                        if len == 0 {
                            return Ok(());
                        }
                        backend
                            .read(request.offset, &mut self.buffer[..len])
                            .map_err(RequestError::Backend)
                    })
                }
            }
            CMD_WRITE => {
                if request.length > MAX_REQUEST_LEN {
                    // Drain the payload through the buffer, then refuse.
                    let mut left = u64::from(request.length);
                    while left > 0 {
                        let piece = left.min(self.buffer.len() as u64) as usize;
                        match fill(stream, &mut self.buffer[..piece], backend)? {
                            Filled::Complete => {}
                            Filled::Closed => return Err(ServeError::Truncated),
                            Filled::Stopped => return Ok(None),
                        }
                        left -= piece as u64;
                    }
                    Err(RequestError::TooLong)
                } else {
                    match fill(stream, &mut self.buffer[..len], backend)? {
                        Filled::Complete => {}
                        Filled::Closed => return Err(ServeError::Truncated),
                        Filled::Stopped => return Ok(None),
                    }
                    check(CMD_FLAG_FUA, true).and_then(|()| {
                        if len == 0 {
                            return Ok(());
                        }
                        backend
                            .write(request.offset, &self.buffer[..len], fua)
                            .map_err(RequestError::Backend)?;
                        self.counters
                            .bytes_written
                            .fetch_add(u64::from(request.length), Ordering::Relaxed);
                        Ok(())
                    })
                }
            }
            CMD_FLUSH => {
                if request.flags != 0 {
                    Err(RequestError::BadFlags)
                } else {
                    backend.flush().map_err(RequestError::Backend)
                }
            }
            CMD_TRIM => check(CMD_FLAG_FUA, true).and_then(|()| {
                if len > 0 {
                    backend
                        .discard(request.offset, u64::from(request.length))
                        .map_err(RequestError::Backend)?;
                }
                if fua {
                    backend.flush().map_err(RequestError::Backend)?;
                }
                Ok(())
            }),
            CMD_WRITE_ZEROES => check(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE, true)
                .and_then(|()| self.write_zeroes(backend, request.offset, len, fua)),
            _ => Err(RequestError::UnknownCommand),
        };
        Ok(Some(result))
    }

    /// Writes `len` zero bytes at `offset` through the (zeroed) buffer.
    /// Zeroes are always written, so `NO_HOLE` holds either way.
    fn write_zeroes(
        &mut self,
        backend: &mut dyn NbdBackend,
        offset: u64,
        len: usize,
        fua: bool,
    ) -> Result<(), RequestError> {
        let piece_max = len.min(self.buffer.len());
        self.buffer[..piece_max].fill(0);
        let mut done = 0usize;
        while done < len {
            let piece = (len - done).min(piece_max);
            backend
                .write(offset + done as u64, &self.buffer[..piece], fua)
                .map_err(RequestError::Backend)?;
            done += piece;
        }
        self.counters
            .bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Sends one option reply.
fn option_reply<S: Write>(
    stream: &mut S,
    option: u32,
    reply: u32,
    data: &[u8],
) -> Result<(), ServeError> {
    let mut header = [0u8; 20];
    header[0..8].copy_from_slice(&REPLY_MAGIC.to_be_bytes());
    header[8..12].copy_from_slice(&option.to_be_bytes());
    header[12..16].copy_from_slice(&reply.to_be_bytes());
    header[16..20].copy_from_slice(&(data.len() as u32).to_be_bytes());
    stream.write_all(&header)?;
    stream.write_all(data)?;
    Ok(())
}

/// Fills `buf` from `stream`, calling [`NbdBackend::idle`] whenever the
/// read times out. An end of stream before the first byte is a clean
/// close; after it, truncation.
fn fill<S: Read>(
    stream: &mut S,
    buf: &mut [u8],
    backend: &mut dyn NbdBackend,
) -> Result<Filled, ServeError> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(Filled::Closed),
            Ok(0) => return Err(ServeError::Truncated),
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if backend.idle() == Idle::Disconnect {
                    return Ok(Filled::Stopped);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ServeError::from(e)),
        }
    }
    Ok(Filled::Complete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// An in-memory volume that records what it was asked.
    struct MemoryBackend {
        data: Vec<u8>,
        block: u32,
        read_only: bool,
        fail: bool,
        flushes: usize,
        fua_writes: usize,
        discards: Vec<(u64, u64)>,
        idles: usize,
    }

    impl MemoryBackend {
        fn new(size: usize) -> Self {
            Self {
                data: (0..size).map(|i| (i % 251) as u8).collect(),
                block: 512,
                read_only: false,
                fail: false,
                flushes: 0,
                fua_writes: 0,
                discards: Vec::new(),
                idles: 0,
            }
        }

        fn failing(&self) -> Result<(), BackendError> {
            if self.fail {
                Err(BackendError {
                    reason: "injected".into(),
                })
            } else {
                Ok(())
            }
        }
    }

    impl NbdBackend for MemoryBackend {
        fn size(&self) -> u64 {
            self.data.len() as u64
        }
        fn block_size(&self) -> u32 {
            self.block
        }
        fn read_only(&self) -> bool {
            self.read_only
        }
        fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
            self.failing()?;
            let at = offset as usize;
            buf.copy_from_slice(&self.data[at..at + buf.len()]);
            Ok(())
        }
        fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
            self.failing()?;
            assert!(!self.read_only, "write reached a read-only backend");
            let at = offset as usize;
            self.data[at..at + data.len()].copy_from_slice(data);
            self.fua_writes += usize::from(fua);
            Ok(())
        }
        fn flush(&mut self) -> Result<(), BackendError> {
            self.failing()?;
            self.flushes += 1;
            Ok(())
        }
        fn discard(&mut self, offset: u64, len: u64) -> Result<(), BackendError> {
            self.failing()?;
            self.discards.push((offset, len));
            Ok(())
        }
        fn idle(&mut self) -> Idle {
            self.idles += 1;
            Idle::Disconnect
        }
    }

    /// A client's bytes, given in advance, and what the server wrote.
    struct Pipe {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Pipe {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Builds a client's side of a conversation.
    #[derive(Default)]
    struct Client {
        bytes: Vec<u8>,
    }

    impl Client {
        fn fixed() -> Self {
            let mut client = Self::default();
            client.flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
            client
        }
        fn flags(&mut self, flags: u32) -> &mut Self {
            self.bytes.extend_from_slice(&flags.to_be_bytes());
            self
        }
        fn option(&mut self, option: u32, data: &[u8]) -> &mut Self {
            self.bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
            self.bytes.extend_from_slice(&option.to_be_bytes());
            self.bytes
                .extend_from_slice(&(data.len() as u32).to_be_bytes());
            self.bytes.extend_from_slice(data);
            self
        }
        fn go(&mut self, option: u32, name: &str, infos: &[u16]) -> &mut Self {
            let mut data = (name.len() as u32).to_be_bytes().to_vec();
            data.extend_from_slice(name.as_bytes());
            data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
            for info in infos {
                data.extend_from_slice(&info.to_be_bytes());
            }
            self.option(option, &data)
        }
        fn request(
            &mut self,
            command: u16,
            flags: u16,
            cookie: u64,
            offset: u64,
            length: u32,
        ) -> &mut Self {
            let header = Request {
                flags,
                command,
                cookie,
                offset,
                length,
            }
            .emit();
            self.bytes.extend_from_slice(&header);
            self
        }
        fn payload(&mut self, data: &[u8]) -> &mut Self {
            self.bytes.extend_from_slice(data);
            self
        }
    }

    fn run(client: &Client, backend: &mut MemoryBackend) -> (Result<Ending, ServeError>, Reader) {
        let mut pipe = Pipe {
            input: Cursor::new(client.bytes.clone()),
            output: Vec::new(),
        };
        let mut server = Server::new("db", Arc::new(Counters::default()));
        let result = server.serve(&mut pipe, backend);
        (
            result,
            Reader {
                bytes: pipe.output,
                at: 0,
            },
        )
    }

    /// Walks the server's output.
    struct Reader {
        bytes: Vec<u8>,
        at: usize,
    }

    impl Reader {
        fn take(&mut self, n: usize) -> Vec<u8> {
            assert!(
                self.at + n <= self.bytes.len(),
                "server output ends at {}, wanted {} more",
                self.bytes.len(),
                self.at + n - self.bytes.len()
            );
            let out = self.bytes[self.at..self.at + n].to_vec();
            self.at += n;
            out
        }
        fn hello(&mut self) {
            let hello = self.take(18);
            assert_eq!(read_u64_be(&hello, 0), NBDMAGIC);
            assert_eq!(read_u64_be(&hello, 8), IHAVEOPT);
            assert_eq!(
                read_u16_be(&hello, 16),
                FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
            );
        }
        /// (option, reply type, data)
        fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
            let header = self.take(20);
            assert_eq!(read_u64_be(&header, 0), REPLY_MAGIC);
            let len = read_u32_be(&header, 16) as usize;
            (
                read_u32_be(&header, 8),
                read_u32_be(&header, 12),
                self.take(len),
            )
        }
        /// GO/INFO granted: returns (size, flags, block sizes).
        fn granted(&mut self, option: u32) -> (u64, u16, [u32; 3]) {
            let (o, kind, export) = self.option_reply();
            assert_eq!((o, kind), (option, REP_INFO));
            assert_eq!(read_u16_be(&export, 0), INFO_EXPORT);
            let (o, kind, sizes) = self.option_reply();
            assert_eq!((o, kind), (option, REP_INFO));
            assert_eq!(read_u16_be(&sizes, 0), INFO_BLOCK_SIZE);
            let (o, kind, ack) = self.option_reply();
            assert_eq!((o, kind, ack.len()), (option, REP_ACK, 0));
            (
                read_u64_be(&export, 2),
                read_u16_be(&export, 10),
                [
                    read_u32_be(&sizes, 2),
                    read_u32_be(&sizes, 6),
                    read_u32_be(&sizes, 10),
                ],
            )
        }
        /// A simple reply: (errno, cookie).
        fn reply(&mut self) -> (u32, u64) {
            let header = self.take(SIMPLE_REPLY_LEN);
            assert_eq!(read_u32_be(&header, 0), SIMPLE_REPLY_MAGIC);
            (read_u32_be(&header, 4), read_u64_be(&header, 8))
        }
        fn done(&self) {
            assert_eq!(self.at, self.bytes.len(), "unexpected server output");
        }
    }

    const SIZE: usize = 1 << 20;

    #[test]
    fn test_go_then_every_command() {
        let mut backend = MemoryBackend::new(SIZE);
        let data: Vec<u8> = (0..8192).map(|i| (i * 7 % 256) as u8).collect();
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[INFO_BLOCK_SIZE])
            .request(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 8192)
            .payload(&data)
            .request(CMD_READ, 0, 2, 4096, 8192)
            .request(CMD_FLUSH, 0, 3, 0, 0)
            .request(CMD_TRIM, 0, 4, 65536, 4096)
            .request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 5, 4096, 1024)
            .request(CMD_READ, 0, 6, 4096, 2048)
            .request(CMD_DISC, 0, 7, 0, 0);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        let (size, flags, sizes) = out.granted(OPT_GO);
        assert_eq!(size, SIZE as u64);
        assert_eq!(
            flags,
            FLAG_HAS_FLAGS
                | FLAG_SEND_FLUSH
                | FLAG_SEND_FUA
                | FLAG_SEND_TRIM
                | FLAG_SEND_WRITE_ZEROES
        );
        assert_eq!(sizes, [512, 4096, MAX_REQUEST_LEN]);
        assert_eq!(out.reply(), (0, 1));
        assert_eq!(out.reply(), (0, 2));
        assert_eq!(out.take(8192), data);
        assert_eq!(out.reply(), (0, 3));
        assert_eq!(out.reply(), (0, 4));
        assert_eq!(out.reply(), (0, 5));
        assert_eq!(out.reply(), (0, 6));
        let back = out.take(2048);
        assert!(back[..1024].iter().all(|&b| b == 0));
        assert_eq!(back[1024..], data[1024..2048]);
        out.done();
        assert_eq!(backend.fua_writes, 1);
        assert_eq!(backend.flushes, 1);
        assert_eq!(backend.discards, [(65536, 4096)]);
        assert_eq!(backend.data[4096 + 1024..4096 + 8192], data[1024..]);
    }

    #[test]
    fn test_export_name_with_and_without_zeroes() {
        for (flags, reply_len) in [
            (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10),
            (FLAG_C_FIXED_NEWSTYLE, 134),
            (0, 134),
        ] {
            let mut backend = MemoryBackend::new(SIZE);
            let mut client = Client::default();
            client
                .flags(flags)
                .option(OPT_EXPORT_NAME, b"db")
                .request(CMD_READ, 0, 9, 512, 512);
            let (result, mut out) = run(&client, &mut backend);
            // No DISC: the client just closes.
            assert_eq!(result.unwrap(), Ending::ClientClosed);
            out.hello();
            let export = out.take(reply_len);
            assert_eq!(read_u64_be(&export, 0), SIZE as u64);
            assert_eq!(read_u16_be(&export, 8) & FLAG_READ_ONLY, 0);
            assert!(export[10..].iter().all(|&b| b == 0));
            assert_eq!(out.reply(), (0, 9));
            assert_eq!(out.take(512), backend.data[512..1024]);
            out.done();
        }
    }

    #[test]
    fn test_default_export_name_is_served() {
        let mut backend = MemoryBackend::new(SIZE);
        let mut client = Client::fixed();
        client.go(OPT_GO, "", &[]).request(CMD_DISC, 0, 1, 0, 0);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        out.granted(OPT_GO);
        out.done();
    }

    #[test]
    fn test_unknown_export_refused() {
        // EXPORT_NAME: the only answer is closing.
        let mut backend = MemoryBackend::new(SIZE);
        let mut client = Client::fixed();
        client
            .option(OPT_EXPORT_NAME, b"nope")
            .request(CMD_READ, 0, 1, 0, 512);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::UnknownExport);
        out.hello();
        out.done();

        // GO and INFO: an error reply, negotiation goes on.
        let mut client = Client::fixed();
        client
            .go(OPT_INFO, "nope", &[])
            .go(OPT_GO, "nope", &[])
            .option(OPT_ABORT, &[]);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Aborted);
        out.hello();
        assert_eq!(out.option_reply().1, REP_ERR_UNKNOWN);
        assert_eq!(out.option_reply().1, REP_ERR_UNKNOWN);
        assert_eq!(out.option_reply(), (OPT_ABORT, REP_ACK, vec![]));
        out.done();
    }

    #[test]
    fn test_list_info_and_unsupported_options() {
        let mut backend = MemoryBackend::new(SIZE);
        let mut client = Client::fixed();
        client
            .option(OPT_LIST, &[])
            .option(OPT_LIST, b"x")
            .option(OPT_STRUCTURED_REPLY, &[])
            .option(OPT_STARTTLS, &[])
            .option(10, b"meta context data")
            .go(OPT_INFO, "db", &[INFO_NAME])
            .option(OPT_GO, &[0, 0, 0, 9, 0])
            .go(OPT_GO, "db", &[])
            .request(CMD_DISC, 0, 1, 0, 0);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        let (option, kind, server) = out.option_reply();
        assert_eq!((option, kind), (OPT_LIST, REP_SERVER));
        assert_eq!(server, [0, 0, 0, 2, b'd', b'b']);
        assert_eq!(out.option_reply(), (OPT_LIST, REP_ACK, vec![]));
        assert_eq!(out.option_reply().1, REP_ERR_INVALID);
        assert_eq!(out.option_reply().1, REP_ERR_UNSUP);
        assert_eq!(out.option_reply().1, REP_ERR_UNSUP);
        assert_eq!(out.option_reply().1, REP_ERR_UNSUP);
        // INFO with the name asked for: export, block size, name, ACK.
        assert_eq!(out.option_reply().1, REP_INFO);
        assert_eq!(out.option_reply().1, REP_INFO);
        let (_, kind, name) = out.option_reply();
        assert_eq!(kind, REP_INFO);
        assert_eq!(name, [0, 1, b'd', b'b']);
        assert_eq!(out.option_reply().1, REP_ACK);
        // A GO whose name length runs past its data.
        assert_eq!(
            out.option_reply(),
            (OPT_GO, REP_ERR_INVALID, b"malformed INFO/GO".to_vec())
        );
        out.granted(OPT_GO);
        out.done();
    }

    #[test]
    fn test_unknown_option_without_fixed_newstyle_closes() {
        let mut backend = MemoryBackend::new(SIZE);
        let mut client = Client::default();
        client.flags(0).option(OPT_STRUCTURED_REPLY, &[]);
        let (result, _) = run(&client, &mut backend);
        assert!(matches!(
            result,
            Err(ServeError::UnsupportedOption(OPT_STRUCTURED_REPLY))
        ));
    }

    #[test]
    fn test_past_end() {
        let mut backend = MemoryBackend::new(SIZE);
        let before = backend.data.clone();
        let end = SIZE as u64;
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[])
            .request(CMD_READ, 0, 1, end - 512, 1024)
            .request(CMD_WRITE, 0, 2, end, 512)
            .payload(&[0xa5; 512])
            .request(CMD_WRITE_ZEROES, 0, 3, end - 512, 1024)
            .request(CMD_TRIM, 0, 4, end, 512)
            .request(CMD_READ, 0, 5, u64::MAX - 511, 512)
            // The stream is still in step: the last block reads fine.
            .request(CMD_READ, 0, 6, end - 512, 512)
            .request(CMD_DISC, 0, 7, 0, 0);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        out.granted(OPT_GO);
        assert_eq!(out.reply(), (EINVAL, 1));
        assert_eq!(out.reply(), (ENOSPC, 2));
        assert_eq!(out.reply(), (ENOSPC, 3));
        assert_eq!(out.reply(), (EINVAL, 4));
        assert_eq!(out.reply(), (EINVAL, 5));
        assert_eq!(out.reply(), (0, 6));
        assert_eq!(out.take(512), before[SIZE - 512..]);
        out.done();
        assert!(backend.data == before, "a refused request changed data");
    }

    #[test]
    fn test_read_only() {
        let mut backend = MemoryBackend::new(SIZE);
        backend.read_only = true;
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[])
            .request(CMD_WRITE, 0, 1, 0, 512)
            .payload(&[1; 512])
            .request(CMD_TRIM, 0, 2, 0, 512)
            .request(CMD_WRITE_ZEROES, 0, 3, 0, 512)
            .request(CMD_READ, 0, 4, 0, 512)
            .request(CMD_FLUSH, 0, 5, 0, 0)
            .request(CMD_DISC, 0, 6, 0, 0);
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        let (_, flags, _) = out.granted(OPT_GO);
        assert_eq!(
            flags,
            FLAG_HAS_FLAGS | FLAG_READ_ONLY | FLAG_SEND_FLUSH | FLAG_SEND_FUA
        );
        assert_eq!(out.reply(), (EPERM, 1));
        assert_eq!(out.reply(), (EPERM, 2));
        assert_eq!(out.reply(), (EPERM, 3));
        assert_eq!(out.reply(), (0, 4));
        out.take(512);
        assert_eq!(out.reply(), (0, 5));
        out.done();
        assert!(backend.discards.is_empty());
    }

    #[test]
    fn test_backend_errors_are_eio() {
        let mut backend = MemoryBackend::new(SIZE);
        backend.fail = true;
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[])
            .request(CMD_READ, 0, 1, 0, 512)
            .request(CMD_WRITE, 0, 2, 0, 512)
            .payload(&[1; 512])
            .request(CMD_FLUSH, 0, 3, 0, 0)
            .request(CMD_TRIM, 0, 4, 0, 512)
            .request(CMD_WRITE_ZEROES, 0, 5, 0, 512)
            .request(CMD_DISC, 0, 6, 0, 0);
        let counters = Arc::new(Counters::default());
        let mut server = Server::new("db", Arc::clone(&counters));
        let mut pipe = Pipe {
            input: Cursor::new(client.bytes.clone()),
            output: Vec::new(),
        };
        assert_eq!(
            server.serve(&mut pipe, &mut backend).unwrap(),
            Ending::Disconnected
        );
        let mut out = Reader {
            bytes: pipe.output,
            at: 0,
        };
        out.hello();
        out.granted(OPT_GO);
        for cookie in 1..=5 {
            // A failed read sends no data.
            assert_eq!(out.reply(), (EIO, cookie));
        }
        out.done();
        assert_eq!(counters.errors.load(Ordering::Relaxed), 5);
        assert_eq!(counters.requests.load(Ordering::Relaxed), 5);
        assert_eq!(counters.connections.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn test_unaligned_long_unknown_and_bad_flags() {
        let mut backend = MemoryBackend::new(SIZE);
        let too_long = MAX_REQUEST_LEN + 512;
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[])
            .request(CMD_READ, 0, 1, 100, 512)
            .request(CMD_READ, 0, 2, 0, 100)
            .request(CMD_READ, 0, 3, 0, too_long)
            .request(CMD_WRITE, 0, 4, 0, too_long)
            .payload(&vec![0x5a; too_long as usize])
            .request(CMD_READ, CMD_FLAG_FUA, 5, 0, 512)
            .request(CMD_FLUSH, CMD_FLAG_FUA, 6, 0, 0)
            .request(99, 0, 7, 0, 0)
            .request(CMD_WRITE, 1 << 9, 8, 0, 512)
            .payload(&[0x5a; 512])
            .request(CMD_READ, 0, 9, 0, 0)
            .request(CMD_DISC, 0, 10, 0, 0);
        let before = backend.data.clone();
        let (result, mut out) = run(&client, &mut backend);
        assert_eq!(result.unwrap(), Ending::Disconnected);
        out.hello();
        out.granted(OPT_GO);
        for cookie in 1..=8 {
            assert_eq!(out.reply(), (EINVAL, cookie));
        }
        // A zero-length read succeeds with no data.
        assert_eq!(out.reply(), (0, 9));
        out.done();
        assert!(backend.data == before);
    }

    #[test]
    fn test_malformed_input_closes_the_connection() {
        let mut backend = MemoryBackend::new(SIZE);
        let mut client = Client::default();
        client.flags(1 << 7);
        assert!(matches!(
            run(&client, &mut backend).0,
            Err(ServeError::BadClientFlags(0x80))
        ));

        let mut client = Client::fixed();
        client.payload(&[0xff; 16]);
        assert!(matches!(
            run(&client, &mut backend).0,
            Err(ServeError::BadOptionMagic(u64::MAX))
        ));

        let mut client = Client::fixed();
        client.payload(&IHAVEOPT.to_be_bytes());
        client.payload(&OPT_GO.to_be_bytes());
        client.payload(&u32::MAX.to_be_bytes());
        assert!(matches!(
            run(&client, &mut backend).0,
            Err(ServeError::OptionTooLong(u32::MAX))
        ));

        let mut client = Client::fixed();
        client.go(OPT_GO, "db", &[]).payload(&[0x11; REQUEST_LEN]);
        let (result, mut out) = run(&client, &mut backend);
        assert!(matches!(
            result,
            Err(ServeError::BadRequestMagic(0x1111_1111))
        ));
        out.hello();
        out.granted(OPT_GO);
        out.done();
    }

    #[test]
    fn test_truncated_stream_at_every_byte() {
        let mut client = Client::fixed();
        client
            .go(OPT_GO, "db", &[INFO_BLOCK_SIZE])
            .request(CMD_WRITE, 0, 1, 0, 1024)
            .payload(&[7; 1024])
            .request(CMD_READ, 0, 2, 0, 1024)
            .request(CMD_DISC, 0, 3, 0, 0);
        let full = client.bytes.clone();
        let mut server = Server::new("db", Arc::new(Counters::default()));
        for cut in 0..full.len() {
            let mut backend = MemoryBackend::new(64 << 10);
            let mut pipe = Pipe {
                input: Cursor::new(full[..cut].to_vec()),
                output: Vec::new(),
            };
            // Never a panic; a cut between messages is a clean close.
            match server.serve(&mut pipe, &mut backend) {
                Ok(Ending::ClientClosed) | Err(ServeError::Truncated) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn test_arbitrary_bytes_never_panic() {
        // A small deterministic generator: random option and request
        // streams after a valid greeting.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut server = Server::new("db", Arc::new(Counters::default()));
        for round in 0..500 {
            let mut client = Client::fixed();
            if round % 2 == 0 {
                client.go(OPT_GO, "db", &[]);
                if round % 4 == 0 {
                    // A valid magic, random fields.
                    client.payload(&REQUEST_MAGIC.to_be_bytes());
                }
            } else {
                client.payload(&IHAVEOPT.to_be_bytes());
            }
            let len = (next() % 96) as usize;
            let noise: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            client.payload(&noise);
            let mut backend = MemoryBackend::new(64 << 10);
            let mut pipe = Pipe {
                input: Cursor::new(client.bytes.clone()),
                output: Vec::new(),
            };
            let _ = server.serve(&mut pipe, &mut backend);
        }
    }

    /// A stream that times out: the idle hook runs and may stop the
    /// connection.
    struct Silent;

    impl Read for Silent {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::from(ErrorKind::WouldBlock))
        }
    }

    impl Write for Silent {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn test_idle_hook_stops_a_silent_client() {
        let mut backend = MemoryBackend::new(SIZE);
        let mut server = Server::new("db", Arc::new(Counters::default()));
        assert_eq!(
            server.serve(&mut Silent, &mut backend).unwrap(),
            Ending::Stopped
        );
        assert_eq!(backend.idles, 1);
    }

    #[test]
    fn test_errno_for_every_error() {
        let backend = RequestError::Backend(BackendError { reason: "x".into() });
        for command in [
            CMD_READ,
            CMD_WRITE,
            CMD_FLUSH,
            CMD_TRIM,
            CMD_WRITE_ZEROES,
            99,
        ] {
            let writes = matches!(command, CMD_WRITE | CMD_WRITE_ZEROES);
            let expected = [
                (RequestError::PastEnd, if writes { ENOSPC } else { EINVAL }),
                (RequestError::Unaligned, EINVAL),
                (RequestError::TooLong, EINVAL),
                (RequestError::ReadOnly, EPERM),
                (RequestError::BadFlags, EINVAL),
                (RequestError::UnknownCommand, EINVAL),
                (backend.clone(), EIO),
            ];
            for (error, errno) in expected {
                assert_eq!(errno_for(command, &error), errno, "{command} {error:?}");
            }
        }
    }

    #[test]
    fn test_request_round_trip() {
        let request = Request {
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let bytes = request.emit();
        assert_eq!(bytes[..8], [0x25, 0x60, 0x95, 0x13, 0x00, 0x01, 0x00, 0x01]);
        assert_eq!(Request::parse(&bytes).unwrap(), request);
    }
}
