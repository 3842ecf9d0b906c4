//! IPv4 header as RoCEv2 uses it: smoltcp's view, Brick's representation.
//!
//! roce-v2.md §1.2: rxe sends IHL 5 (no options), DF set, TOS = the connection's
//! traffic class, TTL = its hop limit, a varying identification and a correct
//! header checksum; its ICRC code assumes a fixed 20-byte header, so a packet with
//! options fails the ICRC. [`Repr`] therefore refuses options and fragments
//! ([`ParseError::Unsupported`]) and, unlike smoltcp's `Ipv4Repr`, keeps TOS,
//! identification and DF so that a parsed header re-emits byte for byte.
//!
//! The [`Packet`] view is smoltcp's `Ipv4Packet` (big-endian, `Display`,
//! `verify_checksum`/`fill_checksum`). [`Repr`] computes the header checksum
//! itself over the fixed 20 bytes (RFC 1071, the same sum as smoltcp's):
//! cheaper than smoltcp's general loop on every frame.
//!
//! # Fuzzing
//! The header checksum check passes under `cfg(fuzzing)` (as smoltcp's
//! `verify_checksum` does), so [`Repr::parse`] never reports
//! [`ParseError::BadChecksum`] there.

use core::fmt;

use super::ParseError;

pub use smoltcp::wire::{IpProtocol as Protocol, Ipv4Address as Address, Ipv4Packet as Packet};

/// Length of an IPv4 header without options: the only kind RoCEv2 uses.
pub const HEADER_LEN: usize = 20;

/// The largest payload an IPv4 packet can carry (65535 - 20).
pub const MAX_PAYLOAD_LEN: usize = u16::MAX as usize - HEADER_LEN;

/// The ones'-complement sum (RFC 1071) of a 20-byte header, folded to 16
/// bits. Summed as five 32-bit words (RFC 1071 §2(C): the 16-bit halves
/// fold into the same sum), which takes half the additions.
fn header_sum(header: &[u8; HEADER_LEN]) -> u16 {
    let mut sum = 0u64;
    for word in header.chunks_exact(4) {
        sum += u64::from(u32::from_be_bytes([word[0], word[1], word[2], word[3]]));
    }
    // Below 2^35: three folds leave 16 bits.
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Whether a 20-byte header's checksum is right (the sum over all of it is
/// all ones).
pub(super) fn checksum_ok(header: &[u8; HEADER_LEN]) -> bool {
    cfg!(fuzzing) || header_sum(header) == 0xffff
}

/// A parsed IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src_addr: Address,
    /// Destination address.
    pub dst_addr: Address,
    /// Payload protocol (UDP for RoCEv2).
    pub protocol: Protocol,
    /// Payload length: total length - 20.
    pub payload_len: usize,
    /// Time to live (the GRH hop limit; masked by the ICRC).
    pub ttl: u8,
    /// Type of service byte: DSCP (6 bits) | ECN (2 bits) (the GRH traffic class;
    /// masked by the ICRC).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment (rxe always sets it).
    pub dont_frag: bool,
}

impl Repr {
    /// Parses and validates an IPv4 header.
    ///
    /// The buffer may extend past the total length (Ethernet padding); the payload
    /// is `packet.payload()`.
    ///
    /// # Errors
    /// - [`ParseError::Truncated`]: buffer shorter than 20 bytes or than the total length;
    /// - [`ParseError::Malformed`]: version ≠ 4 or IHL < 5;
    /// - [`ParseError::Unsupported`]: options (IHL > 5) or a fragment;
    /// - [`ParseError::BadLength`]: total length < 20;
    /// - [`ParseError::BadChecksum`]: header checksum mismatch.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr, ParseError> {
        let len = packet.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        if packet.version() != 4 || usize::from(packet.header_len()) < HEADER_LEN {
            return Err(ParseError::Malformed);
        }
        if usize::from(packet.header_len()) != HEADER_LEN {
            return Err(ParseError::Unsupported);
        }
        let total_len = usize::from(packet.total_len());
        if total_len < HEADER_LEN {
            return Err(ParseError::BadLength);
        }
        if len < total_len {
            return Err(ParseError::Truncated);
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(ParseError::Unsupported);
        }
        let header = packet.as_ref().first_chunk().ok_or(ParseError::Truncated)?;
        if !checksum_ok(header) {
            return Err(ParseError::BadChecksum);
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.next_header(),
            payload_len: total_len - HEADER_LEN,
            ttl: packet.hop_limit(),
            tos: packet.dscp() << 2 | packet.ecn(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// Length of the emitted header: always 20.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header, including the header checksum.
    ///
    /// # Panics
    /// If the buffer is shorter than 20 bytes or `payload_len` exceeds
    /// [`MAX_PAYLOAD_LEN`] (programming errors: frame emitters check both).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let total_len = u16::try_from(HEADER_LEN + self.payload_len)
            .expect("IPv4 payload_len exceeds MAX_PAYLOAD_LEN");
        packet.set_version(4);
        packet.set_header_len(HEADER_LEN as u8);
        packet.set_dscp(self.tos >> 2);
        packet.set_ecn(self.tos & 0b11);
        packet.set_total_len(total_len);
        packet.set_ident(self.ident);
        packet.clear_flags();
        packet.set_dont_frag(self.dont_frag);
        packet.set_more_frags(false);
        packet.set_frag_offset(0);
        packet.set_hop_limit(self.ttl);
        packet.set_next_header(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.set_checksum(0);
        let header = packet
            .as_ref()
            .first_chunk()
            .expect("an IPv4 header buffer of at least 20 bytes");
        let checksum = !header_sum(header);
        packet.set_checksum(checksum);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv4 {} > {} {} tos={:#04x} ttl={} id={:#06x}{} len={}",
            self.src_addr,
            self.dst_addr,
            self.protocol,
            self.tos,
            self.ttl,
            self.ident,
            if self.dont_frag { " DF" } else { "" },
            self.payload_len
        )
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // Worked example 1 of roce-v2.md §1.8: 192.168.1.1 > 192.168.1.2, id 0x1c46, DF.
    static HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x34, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x11, 0x9b, 0x1f, 0xc0, 0xa8, 0x01,
        0x01, 0xc0, 0xa8, 0x01, 0x02,
    ];

    fn repr() -> Repr {
        Repr {
            src_addr: Address::new(192, 168, 1, 1),
            dst_addr: Address::new(192, 168, 1, 2),
            protocol: Protocol::Udp,
            payload_len: 32,
            ttl: 64,
            tos: 0,
            ident: 0x1c46,
            dont_frag: true,
        }
    }

    fn padded() -> [u8; 52] {
        let mut buf = [0u8; 52];
        buf[..20].copy_from_slice(&HEADER);
        buf
    }

    #[test]
    fn test_deconstruct() {
        let buf = padded();
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.total_len(), 52);
        assert_eq!(packet.ident(), 0x1c46);
        assert!(packet.dont_frag());
        assert!(packet.verify_checksum());
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 20];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        repr().emit(&mut packet);
        assert_eq!(buf, HEADER);
    }

    #[test]
    fn test_parse() {
        let buf = padded();
        assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let repr = Repr {
            tos: 0xbb,
            ..repr()
        };
        let mut buf = [0u8; 52];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
    }

    #[test]
    fn test_rejects() {
        let mut buf = padded();
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..40])),
            Err(ParseError::Truncated)
        );
        buf[10] ^= 1;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..])),
            Err(ParseError::BadChecksum)
        );
        buf[0] = 0x46;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..])),
            Err(ParseError::Unsupported)
        );
        buf[0] = 0x65;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..])),
            Err(ParseError::Malformed)
        );
    }

    #[test]
    fn test_checksum_matches_smoltcp() {
        let mut header = HEADER;
        for seed in 0u32..2000 {
            let word = |at: u32| seed.wrapping_mul(2_654_435_761).rotate_left(at);
            for (at, byte) in header.iter_mut().enumerate() {
                *byte = (word(at as u32) >> 7) as u8;
            }
            // IHL 5: smoltcp sums what the IHL says, `Repr::parse` refuses others.
            header[0] = 0x45;
            if seed % 7 == 0 {
                header[12..20].fill(0xff);
            }
            assert_eq!(
                checksum_ok(&header),
                Packet::new_unchecked(&header[..]).verify_checksum()
            );
            // The 32-bit-word sum against RFC 1071's 16-bit words.
            let mut words = 0u32;
            for word in header.chunks_exact(2) {
                words += u32::from(u16::from_be_bytes([word[0], word[1]]));
            }
            words = (words & 0xffff) + (words >> 16);
            words = (words & 0xffff) + (words >> 16);
            assert_eq!(header_sum(&header), words as u16);
            let mut filled = header;
            Packet::new_unchecked(&mut filled[..]).fill_checksum();
            assert!(checksum_ok(&filled));

            let [a, b, c, d] = word(3).to_be_bytes();
            let [e, f, g, h] = word(11).to_be_bytes();
            let repr = Repr {
                src_addr: Address::new(a, b, c, d),
                dst_addr: if seed % 5 == 0 {
                    Address::new(255, 255, 255, 255)
                } else {
                    Address::new(e, f, g, h)
                },
                payload_len: (word(17) % 1500) as usize,
                ttl: g,
                tos: h,
                ident: word(23) as u16,
                dont_frag: seed % 2 == 0,
                ..repr()
            };
            let mut ours = [0u8; 20 + 1500];
            repr.emit(&mut Packet::new_unchecked(&mut ours[..]));
            let mut theirs = ours;
            Packet::new_unchecked(&mut theirs[..]).fill_checksum();
            assert_eq!(ours, theirs);
            let packet = &ours[..20 + repr.payload_len];
            assert_eq!(Repr::parse(&Packet::new_unchecked(packet)), Ok(repr));
        }
    }
}
