//! `FrameLink`: Ethernet frames over QEMU's stream netdev framing.
//!
//! QEMU's `-netdev stream` (and the older `-netdev socket`) carries each
//! Ethernet frame as a 4-byte big-endian length followed by the frame,
//! over a Unix or TCP stream socket. A `FrameLink` speaks that framing from
//! either end: it listens (QEMU connects as the client,
//! `-netdev stream,server=off,addr.type=unix,addr.path=PATH`) or connects (QEMU
//! listens, `server=on`), so a VM's NIC plugs straight into the engine.
//!
//! * Non-blocking: `receive` does at most one read, `transmit` at most one
//!   write plus one flush attempt; neither waits.
//! * Receive is zero-copy into the caller: complete frames are handed out
//!   from the read buffer; partial frames wait there for the rest.
//! * Transmit writes length prefix + header + payload slices with one
//!   writev, copying nothing when the socket takes it all. What the socket
//!   does not take is copied to a pending buffer and flushed first by later
//!   calls ([`FrameLink::flush`]); further frames queue behind it until the
//!   buffer is full (`Busy`).
//! * Reconnect-friendly: when the peer goes away (EOF, reset, framing
//!   error), buffered bytes are dropped, like frames on a link that flaps.
//!   A listener then accepts the next peer; a connector reconnects on the
//!   next call. A listener takes one peer at a time; later ones wait in the
//!   backlog until the current one leaves.
//!
//! Writes to a vanished peer raise `SIGPIPE`, which the Rust runtime
//! ignores in Rust programs; a host that restores it must ignore it too.

use std::fs;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use super::os_error;
use crate::{Nic, NicError, ETHERNET_HEADER_LEN};

/// Largest frame accepted from the peer; far above jumbo frames (9000-byte MTU).
pub const MAX_FRAME_LEN: usize = 65536;
/// Bytes of the big-endian length before each frame.
const PREFIX_LEN: usize = 4;
/// Read and pending-write buffer size: two maximal frames with prefixes.
const BUFFER_LEN: usize = 2 * (PREFIX_LEN + MAX_FRAME_LEN);
/// Payload slices written without a copy; more are copied and queued.
const MAX_IOVECS: usize = 16;
/// Default MAC: locally administered, unicast.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
/// Default IP MTU.
pub const DEFAULT_MTU: usize = 1500;
/// Longest a TCP connect may block the loop.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Which end of which socket a frame link is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameEndpoint {
    /// Listen on a Unix socket at this path (a stale socket file is
    /// replaced; the file is removed on drop).
    UnixListen(PathBuf),
    /// Connect to a Unix socket at this path.
    UnixConnect(PathBuf),
    /// Listen on a TCP address.
    TcpListen(SocketAddr),
    /// Connect to a TCP address.
    TcpConnect(SocketAddr),
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn raw_fd(&self) -> RawFd {
        match self {
            Self::Unix(stream) => stream.as_raw_fd(),
            Self::Tcp(stream) => stream.as_raw_fd(),
        }
    }

    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(stream) => stream.read(buffer),
            Self::Tcp(stream) => stream.read(buffer),
        }
    }

    fn write_vectored(&mut self, buffers: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Unix(stream) => stream.write_vectored(buffers),
            Self::Tcp(stream) => stream.write_vectored(buffers),
        }
    }
}

/// A bounded byte queue: `bytes[start..end]` is pending.
struct Buffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buffer {
    fn new() -> Self {
        Self {
            bytes: vec![0; BUFFER_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    fn consume(&mut self, count: usize) {
        self.start = (self.start + count).min(self.end);
        if self.start == self.end {
            self.clear();
        }
    }

    /// Moves pending bytes to the front so the free space is contiguous.
    fn compact(&mut self) {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    fn free_space(&self) -> usize {
        self.bytes.len() - (self.end - self.start)
    }

    /// Appends the bytes of `pieces` after skipping the first `skip`.
    /// The caller checked `free_space`.
    fn append<'a>(&mut self, pieces: impl IntoIterator<Item = &'a [u8]>, mut skip: usize) {
        self.compact();
        for piece in pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let rest = &piece[skip..];
            self.bytes[self.end..self.end + rest.len()].copy_from_slice(rest);
            self.end += rest.len();
            skip = 0;
        }
    }
}

/// An Ethernet link to a QEMU NIC (or another `FrameLink`) over a stream
/// socket; see the module docs.
pub struct FrameLink {
    endpoint: FrameEndpoint,
    listener: Option<Listener>,
    stream: Option<Stream>,
    rx: Buffer,
    tx: Buffer,
    mac: [u8; 6],
    mtu: usize,
}

impl FrameLink {
    /// Opens `endpoint`: binds a listener (the peer comes later), or
    /// connects at once.
    ///
    /// # Errors
    ///
    /// The bind or connect error.
    pub fn open(endpoint: &FrameEndpoint) -> io::Result<Self> {
        let listener = match endpoint {
            FrameEndpoint::UnixListen(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)?;
                listener.set_nonblocking(true)?;
                Some(Listener::Unix(listener, path.clone()))
            }
            FrameEndpoint::TcpListen(addr) => {
                let listener = TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                Some(Listener::Tcp(listener))
            }
            FrameEndpoint::UnixConnect(_) | FrameEndpoint::TcpConnect(_) => None,
        };
        let mut link = Self {
            endpoint: endpoint.clone(),
            listener,
            stream: None,
            rx: Buffer::new(),
            tx: Buffer::new(),
            mac: DEFAULT_MAC,
            mtu: DEFAULT_MTU,
        };
        if link.listener.is_none() {
            link.stream = Some(link.connect()?);
        }
        Ok(link)
    }

    /// Sets the MAC address reported by [`Nic::mac`].
    pub fn with_mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = mac;
        self
    }

    /// Sets the IP MTU (clamped so frames fit [`MAX_FRAME_LEN`]).
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu.min(MAX_FRAME_LEN - ETHERNET_HEADER_LEN);
        self
    }

    /// The endpoint this link was opened on.
    pub fn endpoint(&self) -> &FrameEndpoint {
        &self.endpoint
    }

    /// The bound address of a TCP listener (useful after binding port 0).
    pub fn tcp_listen_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Some(Listener::Tcp(listener)) => listener.local_addr().ok(),
            _ => None,
        }
    }

    /// Whether a peer is connected.
    pub fn is_connected(&self) -> bool {
        self.stream.is_some()
    }

    /// The descriptor to poll for readability: the peer's socket, or the
    /// listener while no peer is connected.
    pub fn raw_fd(&self) -> Option<RawFd> {
        match (&self.stream, &self.listener) {
            (Some(stream), _) => Some(stream.raw_fd()),
            (None, Some(Listener::Unix(listener, _))) => Some(listener.as_raw_fd()),
            (None, Some(Listener::Tcp(listener))) => Some(listener.as_raw_fd()),
            (None, None) => None,
        }
    }

    /// Whether queued output waits for the socket (poll [`raw_fd`](Self::raw_fd)
    /// for writability then).
    pub fn has_pending_output(&self) -> bool {
        !self.tx.pending().is_empty()
    }

    /// Writes queued output as far as the socket takes it.
    ///
    /// # Errors
    ///
    /// [`NicError::LinkDown`] if the peer went away, or an OS error; the
    /// link is reset either way.
    pub fn flush(&mut self) -> Result<(), NicError> {
        while !self.tx.pending().is_empty() {
            let Some(stream) = self.stream.as_mut() else {
                self.tx.clear();
                return Err(NicError::LinkDown);
            };
            match stream.write_vectored(&[IoSlice::new(self.tx.pending())]) {
                Ok(0) => return Ok(()),
                Ok(written) => self.tx.consume(written),
                Err(error) if is_transient(&error) => return Ok(()),
                Err(error) => return Err(self.write_failed(&error)),
            }
        }
        Ok(())
    }

    fn connect(&self) -> io::Result<Stream> {
        let stream = match &self.endpoint {
            FrameEndpoint::UnixConnect(path) => Stream::Unix(UnixStream::connect(path)?),
            FrameEndpoint::TcpConnect(addr) => {
                let stream = TcpStream::connect_timeout(addr, CONNECT_TIMEOUT)?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            FrameEndpoint::UnixListen(_) | FrameEndpoint::TcpListen(_) => {
                return Err(io::ErrorKind::Unsupported.into());
            }
        };
        set_nonblocking(&stream)?;
        Ok(stream)
    }

    /// Accepts or (re)connects a peer if there is none; returns whether one
    /// is connected now.
    fn ensure_peer(&mut self) -> bool {
        if self.stream.is_some() {
            return true;
        }
        let stream = match &self.listener {
            Some(Listener::Unix(listener, _)) => {
                listener.accept().map(|(stream, _)| Stream::Unix(stream))
            }
            Some(Listener::Tcp(listener)) => listener.accept().and_then(|(stream, _)| {
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }),
            None => self.connect(),
        };
        self.stream = stream
            .and_then(|stream| set_nonblocking(&stream).map(|()| stream))
            .ok();
        self.stream.is_some()
    }

    /// Drops the peer and everything buffered for it.
    fn reset(&mut self) {
        self.stream = None;
        self.rx.clear();
        self.tx.clear();
    }

    /// The length of the complete frame at the front of the read buffer.
    fn buffered_frame(&mut self) -> Result<Option<usize>, NicError> {
        let pending = self.rx.pending();
        let Some(prefix) = pending.first_chunk::<PREFIX_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if len > MAX_FRAME_LEN {
            self.reset();
            return Err(NicError::Framing);
        }
        Ok((pending.len() >= PREFIX_LEN + len).then_some(len))
    }

    /// One read into the read buffer.
    fn fill(&mut self) -> Result<(), NicError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        self.rx.compact();
        let free = &mut self.rx.bytes[self.rx.end..];
        match stream.read(free) {
            Ok(0) => {
                self.reset();
                Ok(())
            }
            Ok(read) => {
                self.rx.end += read;
                Ok(())
            }
            Err(error) if is_transient(&error) => Ok(()),
            Err(error) => {
                self.reset();
                if is_peer_gone(&error) {
                    Ok(())
                } else {
                    Err(os_error(&error))
                }
            }
        }
    }

    /// Resets the link after a failed write and names the error.
    fn write_failed(&mut self, error: &io::Error) -> NicError {
        self.reset();
        if is_peer_gone(error) {
            NicError::LinkDown
        } else {
            os_error(error)
        }
    }
}

impl Nic for FrameLink {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    /// Hands out a buffered frame, or reads once and hands out the first
    /// complete frame. A vanished peer yields `Ok(None)` (and the link
    /// waits for the next one).
    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, NicError> {
        if !self.ensure_peer() {
            return Ok(None);
        }
        let len = match self.buffered_frame()? {
            Some(len) => len,
            None => {
                self.fill()?;
                match self.buffered_frame()? {
                    Some(len) => len,
                    None => return Ok(None),
                }
            }
        };
        let frame = &self.rx.pending()[PREFIX_LEN..PREFIX_LEN + len];
        let result = f(frame);
        self.rx.consume(PREFIX_LEN + len);
        Ok(Some(result))
    }

    fn transmit(&mut self, header: &[u8], payload: &[&[u8]]) -> Result<(), NicError> {
        let len = header.len() + payload.iter().map(|piece| piece.len()).sum::<usize>();
        if len > self.mtu + ETHERNET_HEADER_LEN {
            return Err(NicError::FrameTooLong);
        }
        if !self.ensure_peer() {
            return Err(NicError::LinkDown);
        }
        self.flush()?;
        let prefix = (len as u32).to_be_bytes();
        let pieces = [&prefix[..], header]
            .into_iter()
            .chain(payload.iter().copied());
        if self.has_pending_output() || payload.len() > MAX_IOVECS {
            // Keep frame order: queue behind what is pending.
            if self.tx.free_space() < PREFIX_LEN + len {
                return Err(NicError::Busy);
            }
            self.tx.append(pieces, 0);
            return self.flush();
        }
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS + 2];
        slices[0] = IoSlice::new(&prefix);
        slices[1] = IoSlice::new(header);
        for (slot, piece) in slices[2..].iter_mut().zip(payload) {
            *slot = IoSlice::new(piece);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(NicError::LinkDown);
        };
        let written = match stream.write_vectored(&slices[..2 + payload.len()]) {
            Ok(written) => written,
            Err(error) if is_transient(&error) => 0,
            Err(error) => return Err(self.write_failed(&error)),
        };
        if written < PREFIX_LEN + len {
            // The queue was empty, and it holds a maximal frame.
            self.tx.append(pieces, written);
        }
        Ok(())
    }
}

impl Drop for FrameLink {
    fn drop(&mut self) {
        if let Some(Listener::Unix(_, path)) = &self.listener {
            let _ = fs::remove_file(path);
        }
    }
}

fn set_nonblocking(stream: &Stream) -> io::Result<()> {
    match stream {
        Stream::Unix(stream) => stream.set_nonblocking(true),
        Stream::Tcp(stream) => stream.set_nonblocking(true),
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn is_peer_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// Removes a leftover socket file at `path` (not any other kind of file).
fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => fs::remove_file(path),
        _ => Ok(()),
    }
}
