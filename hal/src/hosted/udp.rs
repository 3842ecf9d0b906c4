//! `UdpNic`: RoCEv2 over a host UDP socket (the kernel does IP and UDP).
//!
//! The socket is bound to `ADDR:4791` (the RoCEv2 port, configurable for
//! tests) and exchanges datagrams whose payload is the IB part of a RoCEv2
//! packet: BTH, extension headers, payload, pad, ICRC. It implements
//! [`DatagramNic`] rather than [`Nic`](crate::Nic): see the `nic` module for
//! why Ethernet is not faked.
//!
//! Limits of this mode, for the `roce` glue: the ICRC covers the IPv4
//! header including the Identification field, which the kernel chooses and
//! a UDP socket does not reveal, so the ICRC of received packets cannot be
//! recomputed exactly and a Linux rxe peer's cannot be matched. The mode is
//! for Brick-to-Brick links (initiator and target on one host, say
//! 127.0.0.1 and 127.0.0.2), whose ends agree on a canonical IP header in
//! the ICRC. Transmit uses sendmsg(2) with one iovec per slice, so payloads
//! are not copied in user space.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};

use super::{os_error, sys};
use crate::{DatagramNic, NicError};

/// The RoCEv2 UDP destination port.
pub const ROCE_V2_PORT: u16 = 4791;
/// Largest UDP payload (IPv4).
const MAX_DATAGRAM_LEN: usize = 65507;
/// Payload slices sent per datagram, besides the header.
const MAX_IOVECS: usize = 16;
/// Socket buffer asked for in each direction: a burst of a queue depth of
/// 128 KiB IOs (4 MiB) must not overflow the receive buffer, or the
/// transport's retransmission timer, not the link, sets the pace.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// A UDP socket carrying RoCEv2 payloads; see the module docs.
pub struct UdpNic {
    socket: UdpSocket,
    local: SocketAddr,
    mtu: usize,
    rx: Box<[u8]>,
}

impl UdpNic {
    /// Binds a non-blocking socket to `addr` (normally port
    /// [`ROCE_V2_PORT`]; port 0 picks a free one) with
    /// [`SOCKET_BUFFER_BYTES`] of buffer each way (as much as the system
    /// allows: `net.core.rmem_max` caps it unless we are root). The IP MTU
    /// defaults to 1500.
    ///
    /// # Errors
    ///
    /// The bind or setsockopt error.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        sys::set_socket_buffers(socket.as_fd(), SOCKET_BUFFER_BYTES)?;
        let local = socket.local_addr()?;
        Ok(Self {
            socket,
            local,
            mtu: 1500,
            rx: vec![0; MAX_DATAGRAM_LEN + 1].into_boxed_slice(),
        })
    }

    /// Sets the IP MTU reported by [`DatagramNic::mtu`].
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu;
        self
    }

    /// The effective receive and send buffer sizes in bytes, as the kernel
    /// reports them.
    ///
    /// # Errors
    ///
    /// The getsockopt error.
    pub fn buffer_sizes(&self) -> io::Result<(usize, usize)> {
        sys::socket_buffers(self.socket.as_fd())
    }

    /// The descriptor to poll for readability.
    pub fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl DatagramNic for UdpNic {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn receive<R>(
        &mut self,
        f: impl FnOnce(&[u8], SocketAddr) -> R,
    ) -> Result<Option<R>, NicError> {
        match self.socket.recv_from(&mut self.rx) {
            Ok((len, from)) => Ok(Some(f(&self.rx[..len], from))),
            Err(error) if is_transient(&error) => Ok(None),
            Err(error) => Err(os_error(&error)),
        }
    }

    fn transmit(
        &mut self,
        to: SocketAddr,
        header: &[u8],
        payload: &[&[u8]],
    ) -> Result<(), NicError> {
        if payload.len() > MAX_IOVECS {
            return Err(NicError::FrameTooLong);
        }
        let len = header.len() + payload.iter().map(|piece| piece.len()).sum::<usize>();
        if len > MAX_DATAGRAM_LEN {
            return Err(NicError::FrameTooLong);
        }
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS + 1];
        slices[0] = IoSlice::new(header);
        for (slot, piece) in slices[1..].iter_mut().zip(payload) {
            *slot = IoSlice::new(piece);
        }
        match sys::send_to_vectored(self.socket.as_fd(), &to, &slices[..1 + payload.len()]) {
            Ok(_) => Ok(()),
            Err(error) if is_transient(&error) => Err(NicError::Busy),
            Err(error) if error.raw_os_error() == Some(libc::EMSGSIZE) => {
                Err(NicError::FrameTooLong)
            }
            Err(error) => Err(os_error(&error)),
        }
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}
