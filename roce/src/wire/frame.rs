//! Whole frames: parse into reprs + payload; emit headers, payload chained.
//!
//! roce-v2.md §1: `Ethernet 14 | IPv4 20 | UDP 8 | BTH 12 | ext 0..28 | payload |
//! pad 0..3 | ICRC 4`, the IB part delimited by the UDP length.
//!
//! Receive: [`parse_frame`] checks everything rxe checks on the packet itself
//! (roce-v2.md §1.10: lengths, IPv4 without options, UDP 4791, TVer 0, known
//! opcode, header + pad + ICRC fit, ICRC) and returns a [`RoceFrame`]: `Copy`
//! reprs plus the payload as a slice of the input. QP, P_Key and Q_Key checks
//! belong to the transport.
//!
//! Transmit: [`FrameHeaders`] writes Ethernet..extended headers into a small
//! caller buffer ([`FrameHeaders::emit_headers`]); the payload stays where it is
//! (registered memory) and goes out as further scatter-gather pieces, followed by
//! a [`Trailer`] (pad + ICRC) computed over headers and pieces without copying.
//! [`FrameHeaders::emit_frame`] is the contiguous variant for small messages.
//!
//! [`Frame`] classifies any Ethernet frame (ARP, RoCEv2, other IPv4, other) for
//! the receive loop, the pretty-printer and the capture tests.

use core::fmt;

use super::bytes::read_u32_le;
use super::icrc::{verify_icrc_from, IcrcSeed, ICRC_LEN};
use super::template::Trailer;
use super::view::PacketView;
use super::{
    aeth, arp, atomic_ack_eth, atomic_eth, bth, deth, ethernet, ieth, immdt, ipv4, reth, udp,
};
use super::{
    AethRepr, ArpRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EtherType, EthernetRepr,
    ExtSet, IethRepr, ImmDtRepr, Ipv4Repr, ParseError, RethRepr, UdpRepr,
};

/// Ethernet + IPv4 + UDP + BTH: the length of a RoCEv2 frame's fixed headers.
pub const FIXED_HEADERS_LEN: usize =
    ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

/// The longest header block [`FrameHeaders::emit_headers`] can write: 54 + 28
/// (AtomicETH, the longest extended-header chain of any opcode). Size transmit
/// header buffers with this.
pub const MAX_HEADERS_LEN: usize = FIXED_HEADERS_LEN + atomic_eth::HEADER_LEN;

/// Why a frame could not be emitted. Every variant is a programming error in
/// the caller; nothing is written past the returned length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EmitError {
    /// The buffer is shorter than the headers (or the whole frame).
    BufferTooSmall,
    /// `ext` does not hold exactly the headers `bth.opcode` prescribes, or the
    /// opcode is `Unknown`.
    ExtHeadersMismatch,
    /// The frame would exceed the IPv4 total length limit (65535).
    TooLong,
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EmitError::BufferTooSmall => "buffer too small",
            EmitError::ExtHeadersMismatch => "extended headers do not match the opcode",
            EmitError::TooLong => "frame longer than an IPv4 packet",
        })
    }
}

impl core::error::Error for EmitError {}

/// The next `len` bytes of `rest` (taken off it) if `layout` has `header`.
///
/// # Errors
/// [`ParseError::Truncated`] if `rest` is shorter than `len`.
fn take<'b>(
    rest: &mut &'b [u8],
    layout: ExtSet,
    header: ExtSet,
    len: usize,
) -> Result<Option<&'b [u8]>, ParseError> {
    if !layout.contains(header) {
        return Ok(None);
    }
    let (bytes, tail) = rest.split_at_checked(len).ok_or(ParseError::Truncated)?;
    *rest = tail;
    Ok(Some(bytes))
}

/// The extended transport headers of one packet, each present iff the opcode
/// prescribes it (roce-v2.md §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (RDMA WRITE First/Only, READ Request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ Response First/Last/Only, ATOMIC ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (… with Immediate).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND with Invalidate).
    pub ieth: Option<IethRepr>,
}

impl ExtHeaders {
    /// The set of headers present.
    #[inline]
    pub fn set(&self) -> ExtSet {
        // Without branches: each header's bit or nothing.
        let bit = |present: bool, header: ExtSet| [ExtSet::NONE, header][usize::from(present)];
        bit(self.deth.is_some(), ExtSet::DETH)
            .union(bit(self.reth.is_some(), ExtSet::RETH))
            .union(bit(self.atomic_eth.is_some(), ExtSet::ATOMIC_ETH))
            .union(bit(self.aeth.is_some(), ExtSet::AETH))
            .union(bit(self.atomic_ack_eth.is_some(), ExtSet::ATOMIC_ACK_ETH))
            .union(bit(self.immdt.is_some(), ExtSet::IMMDT))
            .union(bit(self.ieth.is_some(), ExtSet::IETH))
    }

    /// Total length of the headers present.
    pub fn header_len(&self) -> usize {
        self.set().len()
    }

    /// Parses the headers of `layout` from the start of `buf` (the bytes after
    /// the BTH).
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if `buf` is shorter than `layout.len()`.
    #[inline]
    pub fn parse(layout: ExtSet, buf: &[u8]) -> Result<ExtHeaders, ParseError> {
        let mut ext = ExtHeaders::default();
        if layout.is_empty() {
            return Ok(ext);
        }
        // In wire order (`ExtSet::iter`), each header taken off the front.
        let mut rest = buf;
        if let Some(bytes) = take(&mut rest, layout, ExtSet::DETH, deth::HEADER_LEN)? {
            ext.deth = Some(DethRepr::parse(&deth::Packet::new_unchecked(bytes))?);
        }
        if let Some(bytes) = take(&mut rest, layout, ExtSet::RETH, reth::HEADER_LEN)? {
            ext.reth = Some(RethRepr::parse(&reth::Packet::new_unchecked(bytes))?);
        }
        if let Some(bytes) = take(
            &mut rest,
            layout,
            ExtSet::ATOMIC_ETH,
            atomic_eth::HEADER_LEN,
        )? {
            ext.atomic_eth = Some(AtomicEthRepr::parse(&atomic_eth::Packet::new_unchecked(
                bytes,
            ))?);
        }
        if let Some(bytes) = take(&mut rest, layout, ExtSet::AETH, aeth::HEADER_LEN)? {
            ext.aeth = Some(AethRepr::parse(&aeth::Packet::new_unchecked(bytes))?);
        }
        if let Some(bytes) = take(
            &mut rest,
            layout,
            ExtSet::ATOMIC_ACK_ETH,
            atomic_ack_eth::HEADER_LEN,
        )? {
            ext.atomic_ack_eth = Some(AtomicAckEthRepr::parse(
                &atomic_ack_eth::Packet::new_unchecked(bytes),
            )?);
        }
        if let Some(bytes) = take(&mut rest, layout, ExtSet::IMMDT, immdt::HEADER_LEN)? {
            ext.immdt = Some(ImmDtRepr::parse(&immdt::Packet::new_unchecked(bytes))?);
        }
        if let Some(bytes) = take(&mut rest, layout, ExtSet::IETH, ieth::HEADER_LEN)? {
            ext.ieth = Some(IethRepr::parse(&ieth::Packet::new_unchecked(bytes))?);
        }
        Ok(ext)
    }

    /// Writes the headers present, in wire order, at the start of `buf`;
    /// returns the bytes written.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::header_len`].
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let mut offset = 0;
        let mut next = |len: usize| {
            let range = offset..offset + len;
            offset += len;
            range
        };
        if let Some(h) = self.deth {
            h.emit(&mut deth::Packet::new_unchecked(
                &mut buf[next(deth::HEADER_LEN)],
            ));
        }
        if let Some(h) = self.reth {
            h.emit(&mut reth::Packet::new_unchecked(
                &mut buf[next(reth::HEADER_LEN)],
            ));
        }
        if let Some(h) = self.atomic_eth {
            h.emit(&mut atomic_eth::Packet::new_unchecked(
                &mut buf[next(atomic_eth::HEADER_LEN)],
            ));
        }
        if let Some(h) = self.aeth {
            h.emit(&mut aeth::Packet::new_unchecked(
                &mut buf[next(aeth::HEADER_LEN)],
            ));
        }
        if let Some(h) = self.atomic_ack_eth {
            let range = next(atomic_ack_eth::HEADER_LEN);
            h.emit(&mut atomic_ack_eth::Packet::new_unchecked(&mut buf[range]));
        }
        if let Some(h) = self.immdt {
            h.emit(&mut immdt::Packet::new_unchecked(
                &mut buf[next(immdt::HEADER_LEN)],
            ));
        }
        if let Some(h) = self.ieth {
            h.emit(&mut ieth::Packet::new_unchecked(
                &mut buf[next(ieth::HEADER_LEN)],
            ));
        }
        offset
    }
}

impl fmt::Display for ExtHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        let mut item = |f: &mut fmt::Formatter<'_>, header: &dyn fmt::Display| {
            let result = write!(f, "{sep}{header}");
            sep = " | ";
            result
        };
        if let Some(h) = &self.deth {
            item(f, h)?;
        }
        if let Some(h) = &self.reth {
            item(f, h)?;
        }
        if let Some(h) = &self.atomic_eth {
            item(f, h)?;
        }
        if let Some(h) = &self.aeth {
            item(f, h)?;
        }
        if let Some(h) = &self.atomic_ack_eth {
            item(f, h)?;
        }
        if let Some(h) = &self.immdt {
            item(f, h)?;
        }
        if let Some(h) = &self.ieth {
            item(f, h)?;
        }
        Ok(())
    }
}

/// Pad bytes for a payload: `(-len) & 3` (roce-v2.md §1.7).
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// A parsed RoCEv2 frame: `Copy` reprs of every header plus the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Ethernet header (EtherType IPv4).
    pub eth: EthernetRepr,
    /// IPv4 header (protocol UDP).
    pub ip: Ipv4Repr,
    /// UDP header (destination port 4791).
    pub udp: UdpRepr,
    /// Base transport header.
    pub bth: BthRepr,
    /// Extended transport headers, as the opcode prescribes.
    pub ext: ExtHeaders,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC field as received (verified by [`parse_frame`] only).
    pub icrc: u32,
}

impl<'a> RoceFrame<'a> {
    /// Parses the structure of a RoCEv2 frame, without checking the ICRC (see
    /// [`parse_frame`]). Bytes after the IPv4 total length (Ethernet padding)
    /// are ignored.
    ///
    /// # Errors
    /// - [`ParseError::Truncated`]: the frame ends before a header or the length
    ///   IPv4 claims;
    /// - [`ParseError::Unsupported`]: not IPv4/UDP to port 4791, IP options or
    ///   fragments, TVer ≠ 0, an opcode whose layout is unknown;
    /// - [`ParseError::BadLength`]: the UDP length leaves no room for BTH, the
    ///   opcode's headers, the pad and the ICRC;
    /// - [`ParseError::BadChecksum`]: bad IPv4 header checksum or non-zero UDP
    ///   checksum;
    /// - [`ParseError::Malformed`]: not IPv4 version 4.
    #[inline]
    pub fn parse(frame: &'a [u8]) -> Result<RoceFrame<'a>, ParseError> {
        match RoceFrame::parse_common(frame) {
            Some((parsed, _)) => Ok(parsed),
            None => RoceFrame::parse_layered(frame),
        }
    }

    /// [`RoceFrame::parse`] of the frames a RoCEv2 peer sends, read from the
    /// fixed 54 header bytes at once: IPv4 without options or fragments and
    /// with a right checksum, UDP to port 4791 without a checksum, TVer 0,
    /// lengths that fit. `None` for anything else, which the layered parser
    /// then reads (and rejects or accepts with the same result): when this
    /// returns a frame, it is the one [`RoceFrame::parse_layered`] returns,
    /// with where its ICRC field ends (`14 + 20 + UDP length`).
    #[inline(always)]
    fn parse_common(frame: &'a [u8]) -> Option<(RoceFrame<'a>, usize)> {
        let view = PacketView::parse(frame)?;
        Some((view.frame()?, view.icrc_end()))
    }

    /// [`RoceFrame::parse`] layer by layer: every frame, every error.
    fn parse_layered(frame: &'a [u8]) -> Result<RoceFrame<'a>, ParseError> {
        let eth_frame = ethernet::Frame::new_checked(frame)?;
        let eth = EthernetRepr::parse(&eth_frame)?;
        if eth.ethertype != EtherType::Ipv4 {
            return Err(ParseError::Unsupported);
        }
        let ip_packet = ipv4::Packet::new_unchecked(eth_frame.payload());
        let ip = Ipv4Repr::parse(&ip_packet)?;
        RoceFrame::parse_ip_payload(eth, ip, ip_packet.payload())
    }

    /// The layers above IPv4, once Ethernet and IPv4 are parsed.
    #[inline]
    fn parse_ip_payload(
        eth: EthernetRepr,
        ip: Ipv4Repr,
        ip_payload: &'a [u8],
    ) -> Result<RoceFrame<'a>, ParseError> {
        if ip.protocol != ipv4::Protocol::Udp {
            return Err(ParseError::Unsupported);
        }
        let udp_packet = udp::Packet::new_unchecked(ip_payload);
        let udp = UdpRepr::parse(&udp_packet, ip.src_addr, ip.dst_addr)?;
        if udp.dst_port != udp::ROCE_V2_PORT {
            return Err(ParseError::Unsupported);
        }
        let ib = udp_packet.payload();
        if ib.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(ParseError::BadLength);
        }
        let bth = BthRepr::parse(&bth::Packet::new_unchecked(ib))?;
        let layout = bth.opcode.ext_headers().ok_or(ParseError::Unsupported)?;
        let payload_start = bth::HEADER_LEN + layout.len();
        let icrc_start = ib.len() - ICRC_LEN;
        let payload_end = icrc_start
            .checked_sub(usize::from(bth.pad_count))
            .filter(|&end| end >= payload_start)
            .ok_or(ParseError::BadLength)?;
        let ext = ExtHeaders::parse(layout, &ib[bth::HEADER_LEN..payload_start])?;
        Ok(RoceFrame {
            eth,
            ip,
            udp,
            bth,
            ext,
            payload: &ib[payload_start..payload_end],
            icrc: read_u32_le(&ib[icrc_start..]),
        })
    }

    /// The headers of this frame, for re-emission or as a template for a reply.
    pub fn headers(&self) -> FrameHeaders {
        FrameHeaders {
            eth: self.eth,
            ip: self.ip,
            udp: self.udp,
            bth: self.bth,
            ext: self.ext,
        }
    }

    /// Length of the frame [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        self.headers().frame_len(self.payload.len())
    }

    /// Writes the whole frame with a freshly computed ICRC; returns its length.
    ///
    /// # Errors
    /// As [`FrameHeaders::emit_frame`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.headers().emit_frame(buf, self.payload)
    }
}

impl fmt::Display for RoceFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RoCEv2 {}:{} > {}:{} {}",
            self.ip.src_addr, self.udp.src_port, self.ip.dst_addr, self.udp.dst_port, self.bth
        )?;
        if self.ext.set() != ExtSet::NONE {
            write!(f, " | {}", self.ext)?;
        }
        write!(f, " | payload={}", self.payload.len())
    }
}

/// Parses a RoCEv2 frame and verifies its ICRC: what the receive path calls.
///
/// # Errors
/// As [`RoceFrame::parse`], plus [`ParseError::BadChecksum`] for a wrong ICRC
/// (rxe drops such packets silently; so should the caller).
///
/// # Fuzzing
/// The ICRC check passes under `cfg(fuzzing)`.
#[inline]
pub fn parse_frame(frame: &[u8]) -> Result<RoceFrame<'_>, ParseError> {
    parse_frame_from(&IcrcSeed::new(), frame)
}

/// [`parse_frame`], the ICRC checked from `seed`.
///
/// # Errors
/// As [`parse_frame`].
///
/// # Fuzzing
/// The ICRC check passes under `cfg(fuzzing)`.
#[inline]
pub fn parse_frame_from<'a>(seed: &IcrcSeed, frame: &'a [u8]) -> Result<RoceFrame<'a>, ParseError> {
    with_parsed_frame(seed, frame, |parsed| parsed.copied())
}

/// [`parse_frame_from`], handing the result to `f` by reference: the
/// parsed frame stays where it was built, which a receive path that only
/// reads it saves a 200-byte move per packet.
///
/// # Fuzzing
/// The ICRC check passes under `cfg(fuzzing)`.
#[inline(always)]
pub fn with_parsed_frame<'a, R>(
    seed: &IcrcSeed,
    frame: &'a [u8],
    f: impl FnOnce(Result<&RoceFrame<'a>, ParseError>) -> R,
) -> R {
    let view = PacketView::parse(frame);
    if let Some((view, parsed)) = view.and_then(|view| Some((view, view.frame()?))) {
        return if view.icrc_ok(seed) {
            f(Ok(&parsed))
        } else {
            f(Err(ParseError::BadChecksum))
        };
    }
    // The ICRC first, so that a good frame is parsed straight into the
    // result; a structural error still wins over a bad ICRC.
    if verify_icrc_from(seed, frame) {
        match RoceFrame::parse(frame) {
            Ok(parsed) => f(Ok(&parsed)),
            Err(error) => f(Err(error)),
        }
    } else {
        match RoceFrame::parse(frame) {
            Ok(_) => f(Err(ParseError::BadChecksum)),
            Err(error) => f(Err(error)),
        }
    }
}

/// The headers of a RoCEv2 frame to transmit.
///
/// Derived on emit, whatever the reprs hold: EtherType (IPv4), IP protocol
/// (UDP), IP payload length, UDP length (checksum 0) and BTH PadCnt; all follow
/// from the payload length.
///
/// ```
/// use roce::types::{Pkey, Psn, Qpn};
/// use roce::wire::*;
///
/// let headers = FrameHeaders {
///     eth: EthernetRepr {
///         src_addr: EthernetAddress([0x52, 0x54, 0, 0x77, 0, 1]),
///         dst_addr: EthernetAddress([0x52, 0x54, 0, 0x77, 0, 2]),
///         ethertype: EtherType::Ipv4,
///     },
///     ip: Ipv4Repr {
///         src_addr: Ipv4Address::new(10, 77, 0, 1),
///         dst_addr: Ipv4Address::new(10, 77, 0, 2),
///         protocol: ipv4::Protocol::Udp,
///         payload_len: 0,
///         ttl: 64,
///         tos: 0,
///         ident: 0,
///         dont_frag: true,
///     },
///     udp: UdpRepr { src_port: 0xc000, dst_port: udp::ROCE_V2_PORT },
///     bth: BthRepr {
///         opcode: Opcode::RcSendOnly,
///         solicited: false,
///         mig_req: false,
///         pad_count: 0,
///         pkey: Pkey::DEFAULT,
///         fecn: false,
///         becn: false,
///         dest_qp: Qpn::new(0x11),
///         ack_req: true,
///         psn: Psn::new(100),
///     },
///     ext: ExtHeaders::default(),
/// };
/// let payload: [&[u8]; 2] = [b"hello, ", b"world"];
/// let mut buf = [0u8; MAX_HEADERS_LEN];
/// let len = headers.emit_headers(&mut buf, 12).unwrap();
/// let trailer = Trailer::new(&buf[..len], &payload);
///
/// // On the wire: headers, payload pieces, trailer. Glued together here to check.
/// let frame = [&buf[..len], payload[0], payload[1], trailer.as_bytes()].concat();
/// assert_eq!(frame.len(), headers.frame_len(12));
/// let parsed = parse_frame(&frame).unwrap();
/// assert_eq!(parsed.payload, b"hello, world");
/// assert_eq!(parsed.bth.psn, Psn::new(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeaders {
    /// Ethernet addresses (the EtherType is always IPv4).
    pub eth: EthernetRepr,
    /// IPv4 addresses, TOS, TTL, identification, DF (the length is derived).
    pub ip: Ipv4Repr,
    /// UDP ports.
    pub udp: UdpRepr,
    /// BTH (PadCnt is derived).
    pub bth: BthRepr,
    /// Extended headers: exactly those of `bth.opcode`.
    pub ext: ExtHeaders,
}

impl FrameHeaders {
    /// Length of the headers: Ethernet through the extended headers.
    pub fn header_len(&self) -> usize {
        FIXED_HEADERS_LEN + self.ext.header_len()
    }

    /// Length of the whole frame for a payload of `payload_len` bytes:
    /// headers + payload + pad + ICRC.
    ///
    /// Saturates instead of overflowing; [`Self::check`] rejects such lengths.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        (self.header_len() + pad_len(payload_len) + ICRC_LEN).saturating_add(payload_len)
    }

    /// Checks that the headers can be emitted for `payload_len`.
    ///
    /// # Errors
    /// [`EmitError::ExtHeadersMismatch`] or [`EmitError::TooLong`].
    pub fn check(&self, payload_len: usize) -> Result<(), EmitError> {
        if self.bth.opcode.ext_headers() != Some(self.ext.set()) {
            return Err(EmitError::ExtHeadersMismatch);
        }
        let ip_payload = self
            .frame_len(payload_len)
            .checked_sub(ethernet::HEADER_LEN + ipv4::HEADER_LEN);
        match ip_payload {
            Some(len) if len <= ipv4::MAX_PAYLOAD_LEN => Ok(()),
            _ => Err(EmitError::TooLong),
        }
    }

    /// Writes the headers for a payload of `payload_len` bytes at the start of
    /// `buf`; returns their length ([`Self::header_len`]). The payload, pad and
    /// ICRC follow as separate pieces: see [`Trailer`].
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`] if `buf` is shorter than the headers, or
    /// any error of [`Self::check`].
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) -> Result<usize, EmitError> {
        self.check(payload_len)?;
        let header_len = self.header_len();
        let buf = buf.get_mut(..header_len).ok_or(EmitError::BufferTooSmall)?;
        let ib_len = header_len - FIXED_HEADERS_LEN
            + bth::HEADER_LEN
            + payload_len
            + pad_len(payload_len)
            + ICRC_LEN;

        let (fixed, ext) = buf
            .split_first_chunk_mut::<FIXED_HEADERS_LEN>()
            .ok_or(EmitError::BufferTooSmall)?;
        // pad_len() < 4, so the cast cannot truncate.
        self.emit_fixed(fixed, ib_len, pad_len(payload_len) as u8);
        self.ext.emit(ext);
        Ok(header_len)
    }

    /// Writes the Ethernet, IPv4, UDP and BTH headers for an IB part of
    /// `ib_len` bytes with PadCnt `pad_count`; the lengths are not checked.
    pub(super) fn emit_fixed(
        &self,
        buf: &mut [u8; FIXED_HEADERS_LEN],
        ib_len: usize,
        pad_count: u8,
    ) {
        let eth = EthernetRepr {
            ethertype: EtherType::Ipv4,
            ..self.eth
        };
        eth.emit(&mut ethernet::Frame::new_unchecked(&mut buf[..]));
        let ip = Ipv4Repr {
            protocol: ipv4::Protocol::Udp,
            payload_len: udp::HEADER_LEN + ib_len,
            ..self.ip
        };
        let rest = &mut buf[ethernet::HEADER_LEN..];
        ip.emit(&mut ipv4::Packet::new_unchecked(&mut *rest));
        let rest = &mut rest[ipv4::HEADER_LEN..];
        self.udp
            .emit(&mut udp::Packet::new_unchecked(&mut *rest), ib_len);
        let rest = &mut rest[udp::HEADER_LEN..];
        let bth = BthRepr {
            pad_count,
            ..self.bth
        };
        bth.emit(&mut bth::Packet::new_unchecked(&mut *rest));
    }

    /// Writes a whole frame (headers, payload copy, pad, ICRC) into `buf`;
    /// returns its length.
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`] if `buf` is shorter than
    /// [`Self::frame_len`], or any error of [`Self::check`].
    pub fn emit_frame(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize, EmitError> {
        self.check(payload.len())?;
        let frame_len = self.frame_len(payload.len());
        let buf = buf.get_mut(..frame_len).ok_or(EmitError::BufferTooSmall)?;
        let header_len = self.emit_headers(buf, payload.len())?;
        let (headers, rest) = buf.split_at_mut(header_len);
        let trailer = Trailer::new(headers, &[payload]);
        rest[..payload.len()].copy_from_slice(payload);
        rest[payload.len()..].copy_from_slice(trailer.as_bytes());
        Ok(frame_len)
    }
}

/// Any Ethernet frame, classified for the receive loop and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// ARP for Ethernet/IPv4.
    Arp {
        /// Ethernet header.
        eth: EthernetRepr,
        /// ARP packet.
        arp: ArpRepr,
    },
    /// RoCEv2 (IPv4/UDP to port 4791). The ICRC is not checked here.
    Roce(RoceFrame<'a>),
    /// Any other IPv4 packet (ICMP, other UDP ports, ...): the IP payload is opaque.
    Ipv4 {
        /// Ethernet header.
        eth: EthernetRepr,
        /// IPv4 header.
        ip: Ipv4Repr,
        /// IP payload.
        payload: &'a [u8],
    },
    /// Any other EtherType.
    Other {
        /// Ethernet header.
        eth: EthernetRepr,
        /// Everything after the Ethernet header.
        payload: &'a [u8],
    },
}

impl<'a> Frame<'a> {
    /// Classifies and parses a frame. UDP to port 4791 must parse as RoCEv2;
    /// anything else that is IPv4 is kept opaque above the IP header.
    ///
    /// # Errors
    /// Errors of the layers parsed: Ethernet, ARP, IPv4, or [`RoceFrame::parse`].
    pub fn parse(frame: &'a [u8]) -> Result<Frame<'a>, ParseError> {
        let eth_frame = ethernet::Frame::new_checked(frame)?;
        let eth = EthernetRepr::parse(&eth_frame)?;
        match eth.ethertype {
            EtherType::Arp => {
                let packet = arp::Packet::new_checked(eth_frame.payload())?;
                let arp = ArpRepr::parse(&packet).map_err(|_| ParseError::Unsupported)?;
                Ok(Frame::Arp { eth, arp })
            }
            EtherType::Ipv4 => {
                let ip_packet = ipv4::Packet::new_unchecked(eth_frame.payload());
                let ip = Ipv4Repr::parse(&ip_packet)?;
                let payload = ip_packet.payload();
                let is_roce = ip.protocol == ipv4::Protocol::Udp
                    && udp::Packet::new_checked(payload)
                        .is_ok_and(|udp| udp.dst_port() == udp::ROCE_V2_PORT);
                if is_roce {
                    Ok(Frame::Roce(RoceFrame::parse_ip_payload(eth, ip, payload)?))
                } else {
                    Ok(Frame::Ipv4 { eth, ip, payload })
                }
            }
            _ => Ok(Frame::Other {
                eth,
                payload: eth_frame.payload(),
            }),
        }
    }

    /// Length of the frame [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Frame::Arp { arp, .. } => ethernet::HEADER_LEN + arp.buffer_len(),
            Frame::Roce(roce) => roce.buffer_len(),
            Frame::Ipv4 { payload, .. } => ethernet::HEADER_LEN + ipv4::HEADER_LEN + payload.len(),
            Frame::Other { payload, .. } => ethernet::HEADER_LEN + payload.len(),
        }
    }

    /// Writes the frame; returns its length. RoCEv2 frames get a fresh ICRC;
    /// IPv4 a fresh header checksum.
    ///
    /// # Errors
    /// [`EmitError::BufferTooSmall`], or for RoCEv2 any error of
    /// [`FrameHeaders::emit_frame`]; [`EmitError::TooLong`] for an oversized
    /// IPv4 payload.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        if let Frame::Roce(roce) = self {
            return roce.emit(buf);
        }
        let len = self.buffer_len();
        let buf = buf.get_mut(..len).ok_or(EmitError::BufferTooSmall)?;
        match self {
            Frame::Arp { eth, arp } => {
                eth.emit(&mut ethernet::Frame::new_unchecked(&mut *buf));
                arp.emit(&mut arp::Packet::new_unchecked(
                    &mut buf[ethernet::HEADER_LEN..],
                ));
            }
            Frame::Ipv4 { eth, ip, payload } => {
                if payload.len() > ipv4::MAX_PAYLOAD_LEN {
                    return Err(EmitError::TooLong);
                }
                eth.emit(&mut ethernet::Frame::new_unchecked(&mut *buf));
                let ip = Ipv4Repr {
                    payload_len: payload.len(),
                    ..*ip
                };
                let rest = &mut buf[ethernet::HEADER_LEN..];
                ip.emit(&mut ipv4::Packet::new_unchecked(&mut *rest));
                rest[ipv4::HEADER_LEN..].copy_from_slice(payload);
            }
            Frame::Other { eth, payload } => {
                eth.emit(&mut ethernet::Frame::new_unchecked(&mut *buf));
                buf[ethernet::HEADER_LEN..].copy_from_slice(payload);
            }
            Frame::Roce(_) => {}
        }
        Ok(len)
    }
}

impl fmt::Display for Frame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frame::Arp { arp, .. } => write!(f, "{arp}"),
            Frame::Roce(roce) => write!(f, "{roce}"),
            Frame::Ipv4 { ip, .. } => write!(f, "{ip}"),
            Frame::Other { eth, payload } => write!(
                f,
                "Ethernet {} > {} type={} len={}",
                ethernet::Colons(eth.src_addr),
                ethernet::Colons(eth.dst_addr),
                eth.ethertype,
                payload.len()
            ),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::types::{Msn, Psn, Qpn};
    use crate::wire::{HeaderTemplate, Opcode, Syndrome};

    // roce-v2.md §1.8, worked example 1: RC SEND_ONLY "hello", PadCnt 3.
    static SEND_ONLY: [u8; 66] = [
        0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x02, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x34, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x11, 0x9b, 0x1f, 0xc0, 0xa8, 0x01, 0x01,
        0xc0, 0xa8, 0x01, 0x02, 0xd3, 0xa5, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00, 0x04, 0x30, 0xff,
        0xff, 0x00, 0x00, 0x01, 0x23, 0x80, 0x12, 0x34, 0x56, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
        0x00, 0x00, 0x4d, 0xbc, 0xfc, 0xef,
    ];

    // roce-v2.md §1.8, worked example 2: RC ACKNOWLEDGE, AETH 0x1F / MSN 1.
    static ACK: [u8; 62] = [
        0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x01, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x02, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb7, 0x69, 0xc0, 0xa8, 0x01, 0x02,
        0xc0, 0xa8, 0x01, 0x01, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x12, 0x34, 0x56, 0x1f, 0x00, 0x00, 0x01, 0x99, 0xb3,
        0xdb, 0xd0,
    ];

    #[test]
    fn test_parse() {
        let frame = parse_frame(&SEND_ONLY).unwrap();
        assert_eq!(frame.bth.opcode, Opcode::RcSendOnly);
        assert_eq!(frame.bth.dest_qp, Qpn::new(0x123));
        assert_eq!(frame.bth.pad_count, 3);
        assert_eq!(frame.payload, b"hello");
        assert_eq!(frame.icrc, 0xeffc_bc4d);
        assert_eq!(frame.ext, ExtHeaders::default());

        let ack = parse_frame(&ACK).unwrap();
        let aeth = ack.ext.aeth.unwrap();
        assert_eq!(
            (aeth.syndrome, aeth.msn),
            (Syndrome::ACK_UNLIMITED, Msn::new(1))
        );
        assert!(ack.payload.is_empty());
        assert_eq!(Frame::parse(&ACK), Ok(Frame::Roce(ack)));
    }

    #[test]
    fn test_emit() {
        for bytes in [&SEND_ONLY[..], &ACK[..]] {
            let frame = RoceFrame::parse(bytes).unwrap();
            let mut buf = [0xa5u8; 80];
            assert_eq!(frame.emit(&mut buf), Ok(bytes.len()));
            assert_eq!(&buf[..bytes.len()], bytes);

            // Chained: headers, payload, trailer.
            let headers = frame.headers();
            let len = headers.emit_headers(&mut buf, frame.payload.len()).unwrap();
            let trailer = Trailer::new(&buf[..len], &[frame.payload]);
            let chained = [&buf[..len], frame.payload, trailer.as_bytes()].concat();
            assert_eq!(chained, bytes);
        }
    }

    #[test]
    fn test_parse_common() {
        // A WRITE FIRST with a RETH and an odd payload, beside the examples.
        let mut headers = RoceFrame::parse(&SEND_ONLY).unwrap().headers();
        headers.bth.opcode = Opcode::RcRdmaWriteFirst;
        headers.ext.reth = Some(RethRepr {
            virtual_address: 0x1122_3344_5566_7788,
            rkey: crate::types::Rkey(0x99aa_bbcc),
            dma_length: 0x1000,
        });
        let mut write = [0u8; 128];
        let len = headers.emit_frame(&mut write, &[7u8; 37]).unwrap();
        let write = &write[..len];
        for bytes in [&SEND_ONLY[..], &ACK[..], write] {
            assert!(RoceFrame::parse_common(bytes).is_some());
            let mut padded = bytes.to_vec();
            padded.extend_from_slice(&[0; 9]); // Ethernet padding
            let mut inputs = vec![padded];
            for cut in 0..bytes.len() {
                inputs.push(bytes[..cut].to_vec());
            }
            for at in 0..bytes.len() {
                for flip in [0x01, 0x02, 0x08, 0x10, 0x40, 0x80, 0xff] {
                    let mut mutated = bytes.to_vec();
                    mutated[at] ^= flip;
                    inputs.push(mutated);
                }
            }
            let seed = IcrcSeed::new();
            for input in &inputs {
                if let Some((parsed, end)) = RoceFrame::parse_common(input) {
                    assert_eq!(Ok(parsed), RoceFrame::parse_layered(input), "{input:02x?}");
                    assert_eq!(super::super::icrc::icrc_end(input), Ok(end));
                }
                // The whole receive path against its layered reading.
                let layered = match RoceFrame::parse_layered(input) {
                    Ok(_) if !verify_icrc_from(&seed, input) => Err(ParseError::BadChecksum),
                    other => other,
                };
                assert_eq!(parse_frame_from(&seed, input), layered, "{input:02x?}");
            }
        }
    }

    #[test]
    fn test_packet_shape() {
        // A shape's packets are the template's headers and a full ICRC,
        // byte for byte, whatever AckReq, PSN and payload pieces.
        let headers = RoceFrame::parse(&SEND_ONLY).unwrap().headers();
        let template = HeaderTemplate::new(&headers);
        let seed = IcrcSeed::new();
        let payload: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
        for opcode in [
            Opcode::RcSendMiddle,
            Opcode::RcRdmaWriteMiddle,
            Opcode::RcRdmaReadResponseMiddle,
            Opcode::RcSendLast,
        ] {
            for len in [1024, 256, 5] {
                let shape = template.shape(&seed, opcode, len).unwrap();
                assert!(shape.is(opcode, len) && !shape.is(opcode, len + 1));
                let whole = &payload[..len];
                let (head, tail) = whole.split_at(len / 3);
                for (psn, ack_req) in [(Psn::new(0xab_cdef), true), (Psn::new(7), false)] {
                    let (got, trailer) = shape.packet(psn, ack_req, &[head, tail]);
                    let mut want = [0u8; MAX_HEADERS_LEN];
                    let n = template
                        .emit(&mut want, opcode, psn, ack_req, &ExtHeaders::default(), len)
                        .unwrap();
                    assert_eq!(&got[..], &want[..n], "{opcode:?} {len} {psn:?}");
                    assert_eq!(trailer, Trailer::from_seed(&seed, &want[..n], &[whole]));
                    let frame = [&got[..], whole, trailer.as_bytes()].concat();
                    let parsed = parse_frame(&frame).unwrap();
                    assert_eq!((parsed.bth.psn, parsed.bth.ack_req), (psn, ack_req));
                    assert_eq!(parsed.payload, whole);
                }
            }
        }
        // Opcodes with extended headers have no shape.
        assert_eq!(
            template.shape(&seed, Opcode::RcRdmaWriteFirst, 1024),
            Err(EmitError::ExtHeadersMismatch)
        );
    }

    #[test]
    fn test_header_template() {
        for bytes in [&SEND_ONLY[..], &ACK[..]] {
            let frame = RoceFrame::parse(bytes).unwrap();
            let headers = frame.headers();
            let template = HeaderTemplate::new(&headers);
            let mut buf = [0xa5u8; MAX_HEADERS_LEN];
            let len = template
                .emit(
                    &mut buf,
                    headers.bth.opcode,
                    headers.bth.psn,
                    headers.bth.ack_req,
                    &headers.ext,
                    frame.payload.len(),
                )
                .unwrap();
            assert_eq!(&buf[..len], &bytes[..len]);

            // Every opcode, extended headers or none, any length: the bytes and
            // errors of emit_headers.
            let with_reth = ExtHeaders {
                reth: Some(RethRepr {
                    virtual_address: 0x1122_3344_5566_7788,
                    rkey: crate::types::Rkey(0x99aa_bbcc),
                    dma_length: 0x1000,
                }),
                ..ExtHeaders::default()
            };
            for opcode in [
                Opcode::RcSendOnly,
                Opcode::RcRdmaWriteFirst,
                Opcode::RcRdmaWriteMiddle,
                Opcode::RcAcknowledge,
            ] {
                for ext in [ExtHeaders::default(), with_reth, frame.ext] {
                    for payload_len in [0, 1, 2, 3, 4, 5, 1024, 65_400, 65_500, 70_000] {
                        for (psn, ack_req) in [(Psn::new(0xab_cdef), true), (Psn::new(7), false)] {
                            let mut full = headers;
                            full.bth.opcode = opcode;
                            full.bth.psn = psn;
                            full.bth.ack_req = ack_req;
                            full.ext = ext;
                            let mut want = [0x5au8; MAX_HEADERS_LEN];
                            let expected = full.emit_headers(&mut want, payload_len);
                            let mut got = [0xa5u8; MAX_HEADERS_LEN];
                            let result =
                                template.emit(&mut got, opcode, psn, ack_req, &ext, payload_len);
                            assert_eq!(result, expected, "{opcode:?} {payload_len}");
                            if let Ok(len) = result {
                                assert_eq!(got[..len], want[..len], "{opcode:?} {payload_len}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn test_bad_icrc() {
        let mut bytes = SEND_ONLY;
        bytes[56] ^= 0x20; // "hEllo"
        assert!(RoceFrame::parse(&bytes).is_ok());
        assert_eq!(parse_frame(&bytes), Err(ParseError::BadChecksum));
    }

    #[test]
    fn test_pad_count() {
        assert_eq!((pad_len(5), pad_len(8), pad_len(0)), (3, 0, 0));
        // PadCnt 0 on the "hello" frame: the pad bytes count as payload.
        let mut bytes = SEND_ONLY;
        bytes[43] = 0x00;
        assert_eq!(RoceFrame::parse(&bytes).unwrap().payload, b"hello\0\0\0");
        // An ACK has no payload room: PadCnt 3 cannot fit before the ICRC.
        let mut bytes = ACK;
        bytes[43] = 0x30;
        assert_eq!(RoceFrame::parse(&bytes), Err(ParseError::BadLength));
    }

    #[test]
    fn test_rejects() {
        let mut bytes = SEND_ONLY;
        bytes[42] = 0x15; // reserved opcode
        assert_eq!(RoceFrame::parse(&bytes), Err(ParseError::Unsupported));
        let mut bytes = SEND_ONLY;
        bytes[43] |= 1; // TVer 1
        assert_eq!(RoceFrame::parse(&bytes), Err(ParseError::Unsupported));
        let mut bytes = SEND_ONLY;
        bytes[37] = 0xb8; // UDP port 4792: some other IPv4 traffic
        assert_eq!(RoceFrame::parse(&bytes), Err(ParseError::Unsupported));
        assert!(matches!(Frame::parse(&bytes), Ok(Frame::Ipv4 { .. })));
        assert_eq!(
            RoceFrame::parse(&SEND_ONLY[..60]),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit_errors() {
        let mut headers = RoceFrame::parse(&ACK).unwrap().headers();
        let mut buf = [0u8; 128];
        assert_eq!(
            headers.emit_headers(&mut buf[..57], 0),
            Err(EmitError::BufferTooSmall)
        );
        assert_eq!(
            headers.emit_frame(&mut buf[..61], &[]),
            Err(EmitError::BufferTooSmall)
        );
        assert_eq!(headers.check(65_535), Err(EmitError::TooLong));
        assert_eq!(headers.check(usize::MAX), Err(EmitError::TooLong));
        headers.bth.opcode = Opcode::RcSendOnly;
        assert_eq!(headers.check(0), Err(EmitError::ExtHeadersMismatch));
        headers.bth.opcode = Opcode::Unknown(0x15);
        headers.ext = ExtHeaders::default();
        assert_eq!(headers.check(0), Err(EmitError::ExtHeadersMismatch));
        headers.bth.opcode = Opcode::RcSendOnly;
        headers.bth.psn = Psn::MAX;
        let len = headers.emit_frame(&mut buf, &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(len, 54 + 6 + 2 + 4);
        let frame = parse_frame(&buf[..len]).unwrap();
        assert_eq!(
            (frame.payload, frame.bth.pad_count),
            (&[1, 2, 3, 4, 5, 6][..], 2)
        );
    }
}
