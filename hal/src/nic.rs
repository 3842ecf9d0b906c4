//! Network interfaces as the engine sees them: `Nic` and `DatagramNic`.
//!
//! Both receive through a closure that sees the frame where the driver keeps
//! it (a virtio RX buffer, a socket read buffer), so nothing is copied on
//! the way in, and transmit a header slice plus a list of payload slices
//! that the driver gathers (writev, sendmsg, descriptor chains), so a
//! payload in registered memory is never copied into a frame buffer.
//!
//! [`Nic`] carries Ethernet frames: the engine does ARP, IPv4 and UDP
//! itself (virtio-net, the QEMU frame link). [`DatagramNic`] carries UDP
//! payloads (the RoCEv2 part, BTH onward) with the peer's address, for a
//! host kernel that does IP and UDP. Faking Ethernet over such a socket
//! would mean inventing MACs, answering ARP to ourselves and writing IP/UDP
//! headers the kernel then throws away, so it gets its own trait; the
//! `roce` glue accepts either.
//!
//! The slices passed to `transmit` are borrowed for the call only. A driver
//! either hands them to the device before returning (the hosted drivers:
//! the kernel copies) or copies what it must keep.

use core::net::SocketAddr;

/// Length of an Ethernet header without VLAN tag.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Why a NIC operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NicError {
    /// No link or no peer: the frame was dropped.
    LinkDown,
    /// The transmit queue is full; nothing was sent, try again later.
    Busy,
    /// The frame exceeds the MTU or the driver's buffers.
    FrameTooLong,
    /// The link peer broke the framing; the driver reset the link.
    Framing,
    /// An OS or device error code (`errno` when hosted).
    Os(i32),
}

impl core::fmt::Display for NicError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::LinkDown => f.write_str("link down"),
            Self::Busy => f.write_str("transmit queue full"),
            Self::FrameTooLong => f.write_str("frame too long"),
            Self::Framing => f.write_str("link framing error"),
            Self::Os(code) => write!(f, "device error {code}"),
        }
    }
}

impl core::error::Error for NicError {}

/// An Ethernet NIC.
pub trait Nic {
    /// The interface's MAC address.
    fn mac(&self) -> [u8; 6];

    /// The IP MTU: the largest IP packet a frame carries (a frame is at
    /// most `mtu() + ETHERNET_HEADER_LEN` bytes).
    fn mtu(&self) -> usize;

    /// Takes the next received frame, if any, and runs `f` on it. Does a
    /// bounded amount of work (at most one read from the device).
    ///
    /// # Errors
    ///
    /// [`NicError`] if the device failed; `Ok(None)` means nothing arrived.
    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, NicError>;

    /// Sends one frame made of `header` followed by each `payload` slice.
    ///
    /// # Errors
    ///
    /// [`NicError::Busy`] (nothing sent, retry), [`NicError::LinkDown`]
    /// (dropped), [`NicError::FrameTooLong`], or a device error.
    fn transmit(&mut self, header: &[u8], payload: &[&[u8]]) -> Result<(), NicError>;

    /// Copies the next received frame into `buffer` and returns its length.
    ///
    /// # Errors
    ///
    /// [`NicError::FrameTooLong`] if it does not fit (the frame is
    /// consumed), else as [`receive`](Self::receive).
    fn receive_into(&mut self, buffer: &mut [u8]) -> Result<Option<usize>, NicError> {
        let copied = self.receive(|frame| {
            let target = buffer.get_mut(..frame.len())?;
            target.copy_from_slice(frame);
            Some(frame.len())
        })?;
        match copied {
            None => Ok(None),
            Some(None) => Err(NicError::FrameTooLong),
            Some(Some(len)) => Ok(Some(len)),
        }
    }
}

/// A UDP endpoint whose host does IP and UDP: it exchanges UDP payloads
/// with peer addresses.
pub trait DatagramNic {
    /// The bound local address.
    fn local_addr(&self) -> SocketAddr;

    /// The IP MTU of the path (a payload is at most `mtu() - 28` bytes over
    /// IPv4).
    fn mtu(&self) -> usize;

    /// Takes the next received datagram, if any, and runs `f` on its payload
    /// and sender. At most one read from the device.
    ///
    /// # Errors
    ///
    /// [`NicError`] if the device failed; `Ok(None)` means nothing arrived.
    fn receive<R>(&mut self, f: impl FnOnce(&[u8], SocketAddr) -> R)
        -> Result<Option<R>, NicError>;

    /// Sends one datagram to `to` whose payload is `header` followed by each
    /// `payload` slice.
    ///
    /// # Errors
    ///
    /// As [`Nic::transmit`].
    fn transmit(
        &mut self,
        to: SocketAddr,
        header: &[u8],
        payload: &[&[u8]],
    ) -> Result<(), NicError>;
}
