//! RoCEv2 wire formats: zero-copy `Packet<T>` views and validated `Repr`s.
//!
//! Every header follows the smoltcp discipline (STYLE.md §4):
//!
//! - `Packet<T: AsRef<[u8]>>` is a view over a buffer. `new_unchecked` wraps,
//!   `check_len` makes every accessor panic-free, `new_checked` does both, and
//!   `into_inner` unwraps. Getters read fields in place; setters exist when
//!   `T: AsMut<[u8]>`.
//! - `Repr` is a small `Copy` value with every field decoded and validated.
//!   `Repr::parse(&Packet)` never panics on any input; `Repr::emit(&mut Packet)`
//!   never panics if the buffer is `buffer_len()` long and the `Repr` is within
//!   its documented limits.
//! - `Display` on views and reprs; [`PrettyPrinter`] walks a whole frame.
//!
//! The InfiniBand headers are big-endian (the helpers say so: `read_u24_be`);
//! the ICRC alone is stored least-significant byte first (roce-v2.md §1.8).
//!
//! Ethernet, ARP, IPv4 and UDP views come from smoltcp (wire module only, no
//! sockets); [`ipv4::Repr`] and [`udp::Repr`] are Brick's own because RoCEv2 needs
//! the fields smoltcp's reprs leave out (TOS, identification, DF) and a UDP
//! checksum of zero.
//!
//! Layers above: [`RoceFrame`] / [`parse_frame`] parse a whole RoCEv2 frame into
//! reprs plus a payload slice; [`FrameHeaders`] emits headers into a caller
//! buffer with the payload chained separately; [`Frame`] also classifies ARP and
//! other IPv4 frames.

use core::fmt;

/// A fixed-size header view: the struct plus `new_unchecked`, `new_checked`,
/// `check_len`, `into_inner` and `AsRef<[u8]>`. With `payload`, also
/// `payload()`/`payload_mut()` returning the bytes after the header.
macro_rules! header_view {
    ($(#[$attr:meta])* $name:ident, $len:expr) => {
        $(#[$attr])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length: accessors may panic
            /// until [`Self::check_len`] has succeeded.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// [`Self::new_unchecked`] followed by [`Self::check_len`].
            ///
            /// # Errors
            /// [`ParseError::Truncated`](crate::wire::ParseError::Truncated) if the
            /// buffer is shorter than the header.
            pub fn new_checked(buffer: T) -> Result<Self, crate::wire::ParseError> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Ensures that no accessor panics: the buffer must hold the whole
            /// fixed-size header. Longer buffers are fine.
            ///
            /// # Errors
            /// [`ParseError::Truncated`](crate::wire::ParseError::Truncated) if the
            /// buffer is too short.
            pub fn check_len(&self) -> Result<(), crate::wire::ParseError> {
                if self.buffer.as_ref().len() < $len {
                    Err(crate::wire::ParseError::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Consumes the view, returning the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }

        impl<T: AsRef<[u8]>> AsRef<[u8]> for $name<T> {
            fn as_ref(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
    ($(#[$attr:meta])* $name:ident, $len:expr, payload) => {
        header_view!($(#[$attr])* $name, $len);

        impl<'a, T: AsRef<[u8]> + ?Sized> $name<&'a T> {
            /// The bytes after this header.
            pub fn payload(&self) -> &'a [u8] {
                &self.buffer.as_ref()[$len..]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The bytes after this header, mutably.
            pub fn payload_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$len..]
            }
        }
    };
}

pub(crate) mod bytes;

pub mod aeth;
pub mod arp;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod deth;
pub mod ethernet;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod mad;
pub mod pretty;
pub mod rdma_cm;
pub mod reth;
pub mod template;
pub mod udp;
pub mod view;

pub use self::aeth::{NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use self::arp::{Packet as ArpPacket, Repr as ArpRepr};
pub use self::atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use self::atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use self::bth::{ExtSet, Opcode, Packet as BthPacket, Repr as BthRepr, Transport};
pub use self::deth::{Packet as DethPacket, Repr as DethRepr};
pub use self::ethernet::{
    Address as EthernetAddress, EtherType, Frame as EthernetFrame, Repr as EthernetRepr,
};
pub use self::frame::{
    pad_len, parse_frame, parse_frame_from, with_parsed_frame, EmitError, ExtHeaders, Frame,
    FrameHeaders, RoceFrame, FIXED_HEADERS_LEN, MAX_HEADERS_LEN,
};
pub use self::icrc::{
    compute_icrc, fill_icrc, icrc_over, verify_icrc, verify_icrc_from, Icrc, IcrcBeforePsn,
    IcrcSeed,
};
pub use self::ieth::{Packet as IethPacket, Repr as IethRepr};
pub use self::immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use self::ipv4::{Address as Ipv4Address, Packet as Ipv4Packet, Repr as Ipv4Repr};
pub use self::mad::{Packet as MadPacket, Repr as MadRepr};
pub use self::pretty::PrettyPrinter;
pub use self::rdma_cm::{Packet as CmaPacket, PortSpace, Repr as CmaRepr};
pub use self::reth::{Packet as RethPacket, Repr as RethRepr};
pub use self::template::{HeaderTemplate, PacketShape, Trailer};
pub use self::udp::{Packet as UdpPacket, Repr as UdpRepr};
pub use self::view::PacketView;

/// Why a buffer could not be read as a header, a message or a frame.
///
/// Zero-sized reasons, no allocation; receive paths count them and drop the frame
/// silently (roce-v2.md §1.10, checklist B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseError {
    /// The buffer ends before the header, or before the length a field claims.
    Truncated,
    /// Length fields disagree: UDP length beyond the IP payload, an IB part
    /// shorter than its headers + pad + ICRC, a REJ ARI length beyond its field.
    BadLength,
    /// IPv4 header checksum, non-zero UDP checksum or ICRC mismatch.
    BadChecksum,
    /// Well-formed but outside what Brick speaks: IP options or fragments, a
    /// non-4791 UDP port, TVer ≠ 0, an unknown opcode, a MAD class or version
    /// other than CM v2, an unknown CM attribute, an RDMA CM header version ≠ 0.
    Unsupported,
    /// A field holds a value its spec forbids (e.g. an IP version that is not 4).
    Malformed,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::Truncated => "truncated",
            ParseError::BadLength => "inconsistent length",
            ParseError::BadChecksum => "bad checksum",
            ParseError::Unsupported => "unsupported",
            ParseError::Malformed => "malformed",
        })
    }
}

impl core::error::Error for ParseError {}

/// smoltcp reports every problem as one unit error; its `check_len` failures are
/// truncation in our terms.
impl From<smoltcp::wire::Error> for ParseError {
    fn from(_: smoltcp::wire::Error) -> ParseError {
        ParseError::Truncated
    }
}
