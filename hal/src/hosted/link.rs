//! An opened hosted link as a run loop drives it: receive a burst, send
//! the engine's pieces, flush, and wait on it.
//!
//! Both hosted loops (`brick-target` and Brick's userspace initiator) use
//! these, so a frame link and a UDP link behave the same in both: what
//! arrives is a [`Packet`], output waits in the link until [`Link::flush`]
//! when [`Link::has_pending_output`] says so (a frame link's bytes the
//! socket would not take; a UDP link's queued datagrams, sent with one
//! sendmmsg per flush), and a transmit error is a drop (RoCE's transport
//! and the CM retransmit).

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;

use super::{FrameLink, UdpNic};
use crate::{DatagramNic, Nic, NicError};

/// An opened link.
pub enum Link {
    /// Ethernet frames.
    Frame(FrameLink),
    /// UDP datagrams.
    Udp(UdpNic),
}

/// A received packet.
#[derive(Clone, Copy, Debug)]
pub enum Packet<'a> {
    /// An Ethernet frame (a frame link).
    Frame(&'a [u8]),
    /// A UDP payload and its sender (a UDP link).
    Datagram(SocketAddr, &'a [u8]),
}

/// Most pieces one transmitted packet has (payload pieces and a trailer).
pub const MAX_PIECES: usize = 8;

impl Link {
    /// The descriptor to wait on; `None` for a listening frame link whose
    /// peer is not connected.
    pub fn raw_fd(&self) -> Option<RawFd> {
        match self {
            Self::Frame(link) => link.raw_fd(),
            Self::Udp(nic) => Some(nic.raw_fd()),
        }
    }

    /// Whether output waits for [`Link::flush`] (and, if still there
    /// after it, for the descriptor to become writable).
    pub fn has_pending_output(&self) -> bool {
        match self {
            Self::Frame(link) => link.has_pending_output(),
            Self::Udp(nic) => nic.has_queued(),
        }
    }

    /// Writes pending output, as far as the socket takes it.
    pub fn flush(&mut self) {
        match self {
            Self::Frame(link) => {
                let _ = link.flush();
            }
            Self::Udp(nic) => {
                let _ = nic.flush();
            }
        }
    }

    /// Hands at most one received packet to `deliver`; `Ok(false)` when
    /// nothing was waiting (or the peer is gone: a frame link waits for the
    /// next one).
    ///
    /// # Errors
    ///
    /// The socket's error other than "link down".
    pub fn receive(&mut self, deliver: impl FnOnce(Packet<'_>)) -> Result<bool, NicError> {
        let result = match self {
            Self::Frame(link) => link.receive(|frame| deliver(Packet::Frame(frame))),
            Self::Udp(nic) => DatagramNic::receive(nic, |datagram, from| {
                deliver(Packet::Datagram(from, datagram))
            }),
        };
        match result {
            Ok(Some(())) => Ok(true),
            Ok(None) | Err(NicError::LinkDown) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Sends one frame: `headers`, then the non-empty `payload` pieces and
    /// `trailer` (scatter-gather, no copy). Dropped on a UDP link, or when
    /// it has more than [`MAX_PIECES`] pieces or the socket refuses it.
    pub fn transmit(&mut self, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        let mut pieces: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
        if let (Self::Frame(link), Some(count)) = (self, gather(payload, trailer, &mut pieces)) {
            let _ = link.transmit(headers, &pieces[..count]);
        }
    }

    /// Queues one datagram to `to` (header, payload pieces and trailer
    /// copied into the UDP link's TX queue) until [`Link::flush`], which
    /// sends the queue with one system call. Dropped on a frame link, or
    /// as [`Link::transmit`] drops.
    pub fn transmit_datagram(
        &mut self,
        to: SocketAddrV4,
        header: &[u8],
        payload: &[&[u8]],
        trailer: &[u8],
    ) {
        let mut pieces: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
        if let (Self::Udp(nic), Some(count)) = (self, gather(payload, trailer, &mut pieces)) {
            let _ = nic.queue(SocketAddr::V4(to), header, &pieces[..count]);
        }
    }
}

/// Gathers the pieces (payload, then the trailer) without empty ones;
/// `None` if there are more than [`MAX_PIECES`].
fn gather<'a>(
    payload: &[&'a [u8]],
    trailer: &'a [u8],
    out: &mut [&'a [u8]; MAX_PIECES],
) -> Option<usize> {
    let mut count = 0;
    for piece in payload.iter().copied().chain([trailer]) {
        if piece.is_empty() {
            continue;
        }
        *out.get_mut(count)? = piece;
        count += 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_skips_empty_pieces_and_refuses_too_many() {
        let mut out: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
        let a: &[u8] = b"a";
        let count = gather(&[a, &[], b"bc"], b"t", &mut out).unwrap();
        assert_eq!(&out[..count], &[a, b"bc", b"t"]);
        let many = [a; MAX_PIECES];
        assert_eq!(gather(&many, b"t", &mut out), None);
        assert_eq!(gather(&many, b"", &mut out), Some(MAX_PIECES));
    }
}
