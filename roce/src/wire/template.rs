//! Transmit headers without building them per packet: a connection's
//! [`HeaderTemplate`] (its fixed headers emitted once, each packet's fields
//! patched into a copy), the [`Trailer`] (pad + ICRC) computed over headers
//! and payload pieces where they lie, and a [`PacketShape`]: the headers and
//! ICRC state of a run of packets that differ only in AckReq and PSN (the
//! middle packets of a long message).

use super::bytes::write_u32_le;
use super::frame::{pad_len, EmitError, ExtHeaders, FrameHeaders};
use super::icrc::{Icrc, IcrcBeforePsn, IcrcSeed, ICRC_LEN};
use super::{bth, ethernet, ipv4, udp, BthRepr, FIXED_HEADERS_LEN, MAX_HEADERS_LEN};

/// The fixed headers of one connection, emitted once, and the packets'
/// headers patched into a copy of them: what [`FrameHeaders::emit_headers`]
/// writes for the same headers with the packet's opcode, PSN, AckReq and
/// extended headers, byte for byte, without building the headers again.
///
/// Per packet only these change: the IPv4 total length and checksum, the
/// UDP length, the BTH opcode, PadCnt, AckReq and PSN. The IPv4 checksum is
/// the template's word sum plus the total length, folded the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderTemplate {
    /// The headers with zero lengths, PadCnt 0 and AckReq clear.
    bytes: [u8; FIXED_HEADERS_LEN],
    /// The IPv4 header's 16-bit words summed, total length and checksum
    /// left out (both are zero in `bytes`).
    ip_sum: u32,
}

/// Offsets of the patched fields within the fixed headers.
mod patch {
    use super::{bth, ethernet, ipv4, udp};
    pub const IP: usize = ethernet::HEADER_LEN;
    pub const IP_TOTAL_LEN: usize = IP + 2;
    pub const IP_CHECKSUM: usize = IP + 10;
    pub const UDP_LEN: usize = IP + ipv4::HEADER_LEN + 4;
    pub const BTH: usize = IP + ipv4::HEADER_LEN + udp::HEADER_LEN;
    pub const BTH_OPCODE: usize = BTH;
    pub const BTH_FLAGS: usize = BTH + 1;
    pub const BTH_ACK_REQ: usize = BTH + 8;
    pub const BTH_PSN: usize = BTH + 9;
    const _: () = assert!(BTH + bth::HEADER_LEN == super::FIXED_HEADERS_LEN);
}

impl HeaderTemplate {
    /// The template of `headers` (their opcode, PSN, AckReq, PadCnt, IPv4
    /// length and extended headers are not used).
    pub fn new(headers: &FrameHeaders) -> HeaderTemplate {
        let fixed = FrameHeaders {
            bth: BthRepr {
                ack_req: false,
                psn: crate::types::Psn::new(0),
                ..headers.bth
            },
            ..*headers
        };
        let mut bytes = [0u8; FIXED_HEADERS_LEN];
        fixed.emit_fixed(&mut bytes, 0, 0);
        // Lengths zero: what is left of the IPv4 header to sum.
        bytes[patch::IP_TOTAL_LEN..patch::IP_TOTAL_LEN + 2].fill(0);
        bytes[patch::IP_CHECKSUM..patch::IP_CHECKSUM + 2].fill(0);
        bytes[patch::UDP_LEN..patch::UDP_LEN + 2].fill(0);
        let ip_sum = bytes[patch::IP..patch::IP + ipv4::HEADER_LEN]
            .chunks_exact(2)
            .map(|word| u32::from(u16::from_be_bytes([word[0], word[1]])))
            .sum();
        HeaderTemplate { bytes, ip_sum }
    }

    /// Writes the headers of a packet with `opcode`, `psn`, `ack_req`, the
    /// extended headers `ext` and `payload_len` bytes of payload at the start
    /// of `buf`; returns their length. The same bytes and the same errors as
    /// [`FrameHeaders::emit_headers`] on the template's headers with those
    /// fields set.
    ///
    /// # Errors
    /// [`EmitError::ExtHeadersMismatch`] or [`EmitError::TooLong`], as
    /// [`FrameHeaders::check`].
    pub fn emit(
        &self,
        buf: &mut [u8; MAX_HEADERS_LEN],
        opcode: bth::Opcode,
        psn: crate::types::Psn,
        ack_req: bool,
        ext: &ExtHeaders,
        payload_len: usize,
    ) -> Result<usize, EmitError> {
        let set = ext.set();
        if opcode.ext_headers() != Some(set) {
            return Err(EmitError::ExtHeadersMismatch);
        }
        let ext_len = set.len();
        let pad = pad_len(payload_len);
        let ib_len = (bth::HEADER_LEN + ext_len + pad + ICRC_LEN).saturating_add(payload_len);
        let udp_len = udp::HEADER_LEN.saturating_add(ib_len);
        if udp_len > ipv4::MAX_PAYLOAD_LEN {
            return Err(EmitError::TooLong);
        }
        // Both fit 16 bits: MAX_PAYLOAD_LEN is 65,515.
        let total_len = (ipv4::HEADER_LEN + udp_len) as u16;
        let (fixed, rest) = buf.split_at_mut(FIXED_HEADERS_LEN);
        fixed.copy_from_slice(&self.bytes);
        let mut sum = self.ip_sum + u32::from(total_len);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        fixed[patch::IP_TOTAL_LEN..patch::IP_TOTAL_LEN + 2]
            .copy_from_slice(&total_len.to_be_bytes());
        fixed[patch::IP_CHECKSUM..patch::IP_CHECKSUM + 2]
            .copy_from_slice(&(!(sum as u16)).to_be_bytes());
        fixed[patch::UDP_LEN..patch::UDP_LEN + 2].copy_from_slice(&(udp_len as u16).to_be_bytes());
        fixed[patch::BTH_OPCODE] = opcode.into();
        // pad_len() < 4: two bits at 5..4.
        fixed[patch::BTH_FLAGS] |= (pad as u8) << 4;
        fixed[patch::BTH_ACK_REQ] |= u8::from(ack_req) << 7;
        fixed[patch::BTH_PSN..patch::BTH_PSN + 3].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        ext.emit(&mut rest[..ext_len]);
        Ok(FIXED_HEADERS_LEN + ext_len)
    }
}

/// What follows the payload on the wire: the pad (0..=3 zero bytes) and the
/// ICRC, least-significant byte first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    bytes: [u8; 3 + ICRC_LEN],
    len: usize,
    icrc: u32,
}

impl Trailer {
    /// Computes the trailer for `headers` (as written by
    /// [`FrameHeaders::emit_headers`]) followed by the payload `pieces`.
    ///
    /// # Panics
    /// If `headers` is shorter than Ethernet + IPv4 + UDP + BTH (54 bytes).
    pub fn new(headers: &[u8], pieces: &[&[u8]]) -> Trailer {
        Trailer::from_seed(&IcrcSeed::new(), headers, pieces)
    }

    /// [`Trailer::new`], the ICRC started from `seed`.
    ///
    /// # Panics
    /// As [`Trailer::new`].
    #[inline]
    pub fn from_seed(seed: &IcrcSeed, headers: &[u8], pieces: &[&[u8]]) -> Trailer {
        Trailer::after(seed.start(headers), pieces)
    }

    /// The trailer of `icrc`, started over the headers, after the payload
    /// `pieces`.
    #[inline]
    fn after(mut icrc: Icrc, pieces: &[&[u8]]) -> Trailer {
        let payload_len: usize = pieces.iter().map(|piece| piece.len()).sum();
        let pad = pad_len(payload_len);
        let mut bytes = [0u8; 3 + ICRC_LEN];
        for piece in pieces {
            icrc.update(piece);
        }
        if pad > 0 {
            icrc.update(&bytes[..pad]);
        }
        let icrc = icrc.finish();
        write_u32_le(&mut bytes[pad..pad + ICRC_LEN], icrc);
        Trailer {
            bytes,
            len: pad + ICRC_LEN,
            icrc,
        }
    }

    /// The pad and ICRC bytes to send after the payload.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The ICRC value.
    pub fn icrc(&self) -> u32 {
        self.icrc
    }
}

/// The headers of packets of one opcode without extended headers and one
/// payload length, from a [`HeaderTemplate`], and their ICRC state before
/// AckReq and PSN: a run of such packets (the middle packets of a long
/// message) differs in nothing else, so each costs a copy and two patched
/// fields instead of a header emit and a full ICRC set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketShape {
    opcode: bth::Opcode,
    payload_len: usize,
    /// The headers with AckReq clear and PSN 0.
    bytes: [u8; FIXED_HEADERS_LEN],
    icrc: IcrcBeforePsn,
}

impl HeaderTemplate {
    /// The shape of packets with `opcode` and `payload_len` bytes of
    /// payload; the ICRC from `seed`.
    ///
    /// # Errors
    /// As [`HeaderTemplate::emit`]: [`EmitError::ExtHeadersMismatch`] for an
    /// opcode that has extended headers.
    pub fn shape(
        &self,
        seed: &IcrcSeed,
        opcode: bth::Opcode,
        payload_len: usize,
    ) -> Result<PacketShape, EmitError> {
        let mut buf = [0u8; MAX_HEADERS_LEN];
        let psn = crate::types::Psn::new(0);
        let len = self.emit(
            &mut buf,
            opcode,
            psn,
            false,
            &ExtHeaders::default(),
            payload_len,
        )?;
        let mut bytes = [0u8; FIXED_HEADERS_LEN];
        // No extended headers: exactly the fixed headers.
        bytes.copy_from_slice(&buf[..len]);
        Ok(PacketShape {
            opcode,
            payload_len,
            bytes,
            icrc: seed.before_psn(&bytes),
        })
    }
}

impl PacketShape {
    /// Whether packets with `opcode` and `payload_len` have this shape.
    pub fn is(&self, opcode: bth::Opcode, payload_len: usize) -> bool {
        self.opcode == opcode && self.payload_len == payload_len
    }

    /// The headers of the packet at `psn` with `ack_req`, and its trailer
    /// after the payload `pieces` (the shape's payload length in all): the
    /// same bytes as [`HeaderTemplate::emit`] and [`Trailer::from_seed`].
    #[inline]
    pub fn packet(
        &self,
        psn: crate::types::Psn,
        ack_req: bool,
        pieces: &[&[u8]],
    ) -> ([u8; FIXED_HEADERS_LEN], Trailer) {
        let mut bytes = self.bytes;
        bytes[patch::BTH_ACK_REQ] |= u8::from(ack_req) << 7;
        bytes[patch::BTH_PSN..patch::BTH_PSN + 3].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        let trailer = Trailer::after(self.icrc.resume(&bytes), pieces);
        (bytes, trailer)
    }
}
