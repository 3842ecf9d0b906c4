//! UDP mode: the HCA's packets as UDP payloads, ICRC over a pseudo-header.
//!
//! ARCHITECTURE.md §5: a hosted Brick may reach its peers through a host UDP socket
//! bound to `ADDR:4791` (`hal::hosted::udp::UdpNic`, link spec `udp:ADDR`).
//! The kernel then does ARP, IPv4 and UDP; Brick exchanges only the IB part
//! of each RoCEv2 packet — BTH, extended headers, payload, pad, ICRC — with
//! the peer's IPv4 address and port. [`Hca::with_link`] with
//! [`LinkMode::Udp`] makes such an HCA; [`Hca::receive_datagram`] takes what
//! the socket received and [`Hca::poll_datagrams`] hands datagrams to a
//! [`DatagramSink`]. Everything else — QPs, the CM on QP1 (MADs are UD
//! datagrams too), completions, counters — is the Ethernet mode's code.
//!
//! # The ICRC pseudo-header
//!
//! The RoCEv2 ICRC (roce-v2.md §1.8) covers the IPv4 and UDP headers with
//! only TOS, TTL and the checksums masked: identification, flags, lengths,
//! addresses and ports are in it. A UDP socket neither shows Brick the IP
//! header the kernel wrote nor lets it choose one, so in UDP mode both ends
//! compute and check the ICRC over a *canonical* IPv4/UDP header that each
//! can rebuild from what its socket tells it:
//!
//! | field | value |
//! | --- | --- |
//! | IPv4 version, IHL | 4, 5 (no options) |
//! | TOS, TTL, header checksum | masked (written as 0, 64, correct) |
//! | total length | 20 + 8 + datagram length |
//! | identification | 0 |
//! | flags, fragment offset | DF, 0 |
//! | protocol | UDP (17) |
//! | source address | the sender's: `from` on receive, [`HcaConfig::ip`] on send |
//! | destination address | the receiver's: [`HcaConfig::ip`] on receive, the peer's on send |
//! | UDP source port | the sender's: `from.port()` on receive, the mode's `port` on send |
//! | UDP destination port | 4791, whatever port the receiving socket is bound to |
//! | UDP length, checksum | 8 + datagram length; masked (written as 0) |
//!
//! The QPs and the CM emit exactly this header in front of each packet (in
//! UDP mode their path's UDP source port is the socket's port; ident 0 and
//! DF they always write), so their [`Trailer`] already is the datagram's
//! ICRC and the send path is the Ethernet mode's, byte for byte:
//! [`Hca::poll_datagrams`] only drops the first [`PSEUDO_HEADERS_LEN`] bytes
//! of each frame (Ethernet, IPv4, UDP) and sends the rest to the frame's
//! IPv4 destination at the mode's port. An Ethernet frame made of the
//! pseudo-header and a datagram is therefore a valid RoCEv2 frame: tests and
//! captures can use [`parse_frame`] and the pretty-printer on it. On the way
//! in, [`parse_datagram`] checks the ICRC without building that frame, so a
//! payload is not copied.
//!
//! The destination port is 4791 because the transport always writes it
//! (roce-v2.md §1.3). With sockets bound to 4791 — the deployment — the
//! pseudo-header's ports are the real ones; tests that bind another port P
//! on 127.0.0.1 and 127.0.0.2 differ from the wire in that one ICRC field,
//! on which both ends agree.
//!
//! **Brick to Brick only.** A Linux rxe peer computes its ICRC over the IP
//! header the kernel really sent (with a varying identification), which a
//! UDP socket cannot reproduce: Brick reaches rxe over an Ethernet link (the
//! frame link, virtio-net) instead. The ICRC is still checked in UDP mode:
//! a datagram damaged where the kernel's UDP checksum does not reach (user
//! space; loopback skips the checksum), or sent by something that is not a
//! Brick, is dropped and counted as on Ethernet (`drop_bad_checksum`).
//!
//! Every node of a UDP fabric binds the same port ([`LinkMode::Udp`]);
//! packets go to `(peer IPv4 address, port)`. There is no ARP: the kernel
//! resolves, and [`Verbs::connect`] sends its REQ at once. The HCA's own
//! address ([`HcaConfig::ip`]) must be the one the socket is bound to (not
//! `0.0.0.0`), since the peer puts the source address it sees into its ICRC.
//!
//! [`Hca::with_link`]: crate::hca::Hca::with_link
//! [`Hca::receive_datagram`]: crate::hca::Hca::receive_datagram
//! [`Hca::poll_datagrams`]: crate::hca::Hca::poll_datagrams
//! [`LinkMode::Udp`]: crate::hca::LinkMode::Udp
//! [`HcaConfig::ip`]: crate::hca::HcaConfig::ip
//! [`Trailer`]: crate::wire::Trailer
//! [`parse_frame`]: crate::wire::parse_frame
//! [`Verbs::connect`]: verbs::Verbs::connect

use core::net::{Ipv4Addr, SocketAddrV4};

#[cfg(doc)]
use crate::hca::Hca;
use crate::qp::FrameSink;
use crate::wire::icrc::{Icrc, ICRC_LEN};
use crate::wire::{
    bth, ethernet, ipv4, udp, BthRepr, EtherType, EthernetAddress, EthernetRepr, ExtHeaders,
    Ipv4Repr, ParseError, RoceFrame, UdpRepr,
};

/// Ethernet + IPv4 + UDP: the headers a UDP-mode packet lacks, and what
/// [`Hca::poll_datagrams`] strips from each frame the transport emits.
pub const PSEUDO_HEADERS_LEN: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN;

/// The MAC in the pseudo Ethernet header and in UDP-mode paths (never sent,
/// not covered by the ICRC).
pub const PSEUDO_MAC: EthernetAddress = EthernetAddress([0; 6]);

/// The TTL written into the pseudo-header (masked by the ICRC).
const PSEUDO_TTL: u8 = 64;

/// Largest datagram whose pseudo-header is a valid IPv4 packet.
pub const MAX_DATAGRAM_LEN: usize = ipv4::MAX_PAYLOAD_LEN - udp::HEADER_LEN;

/// Where [`Hca::poll_datagrams`] sends UDP-mode packets.
pub trait DatagramSink {
    /// Sends one datagram to `to` whose payload is `header`, each `payload`
    /// piece, then `trailer` (pad and ICRC). The slices are borrowed for the
    /// call only (a UDP socket's `sendmsg` copies them).
    fn transmit(&mut self, to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]);
}

impl<F: FnMut(SocketAddrV4, &[u8], &[&[u8]], &[u8])> DatagramSink for F {
    fn transmit(&mut self, to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        self(to, header, payload, trailer)
    }
}

/// The pseudo Ethernet, IPv4 and UDP headers of a datagram of `datagram_len`
/// bytes from `src` to `dst` (see the module docs).
pub fn pseudo_reprs(
    src: SocketAddrV4,
    dst: Ipv4Addr,
    datagram_len: usize,
) -> (EthernetRepr, Ipv4Repr, UdpRepr) {
    let eth = EthernetRepr {
        src_addr: PSEUDO_MAC,
        dst_addr: PSEUDO_MAC,
        ethertype: EtherType::Ipv4,
    };
    let ip = Ipv4Repr {
        src_addr: *src.ip(),
        dst_addr: dst,
        protocol: ipv4::Protocol::Udp,
        payload_len: udp::HEADER_LEN + datagram_len,
        ttl: PSEUDO_TTL,
        tos: 0,
        ident: 0,
        dont_frag: true,
    };
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: udp::ROCE_V2_PORT,
    };
    (eth, ip, udp)
}

/// Writes the pseudo-header of a datagram of `datagram_len` bytes from `src`
/// to `dst` (the bytes a frame carries before its BTH).
///
/// # Panics
/// If `datagram_len` exceeds [`MAX_DATAGRAM_LEN`] (callers check it).
pub fn pseudo_headers(
    src: SocketAddrV4,
    dst: Ipv4Addr,
    datagram_len: usize,
) -> [u8; PSEUDO_HEADERS_LEN] {
    let (eth, ip, udp) = pseudo_reprs(src, dst, datagram_len);
    let mut buf = [0u8; PSEUDO_HEADERS_LEN];
    let (eth_buf, rest) = buf.split_at_mut(ethernet::HEADER_LEN);
    eth.emit(&mut ethernet::Frame::new_unchecked(eth_buf));
    let (ip_buf, udp_buf) = rest.split_at_mut(ipv4::HEADER_LEN);
    ip.emit(&mut ipv4::Packet::new_unchecked(ip_buf));
    udp.emit(&mut udp::Packet::new_unchecked(udp_buf), datagram_len);
    buf
}

/// The ICRC a datagram from `src` to `dst` carries: over the pseudo-header
/// and `datagram` without its last four bytes (the ICRC field).
///
/// # Errors
/// [`ParseError::BadLength`] if the datagram is shorter than BTH + ICRC or
/// longer than [`MAX_DATAGRAM_LEN`].
pub fn datagram_icrc(src: SocketAddrV4, dst: Ipv4Addr, datagram: &[u8]) -> Result<u32, ParseError> {
    let len = datagram.len();
    if !(bth::HEADER_LEN + ICRC_LEN..=MAX_DATAGRAM_LEN).contains(&len) {
        return Err(ParseError::BadLength);
    }
    // `Icrc` wants the masked prefix (through the BTH) in one piece.
    let mut prefix = [0u8; PSEUDO_HEADERS_LEN + bth::HEADER_LEN];
    prefix[..PSEUDO_HEADERS_LEN].copy_from_slice(&pseudo_headers(src, dst, len));
    prefix[PSEUDO_HEADERS_LEN..].copy_from_slice(&datagram[..bth::HEADER_LEN]);
    let mut icrc = Icrc::new(&prefix);
    icrc.update(&datagram[bth::HEADER_LEN..len - ICRC_LEN]);
    Ok(icrc.finish())
}

/// Parses a datagram received from `from` on a socket bound to `local_ip`
/// and verifies its ICRC over the pseudo-header: the UDP-mode counterpart
/// of [`crate::wire::parse_frame`]. The frame's Ethernet, IPv4 and UDP reprs
/// are the pseudo-header's; the payload is a slice of `datagram`.
///
/// The checks on the IB part are those of `parse_frame` (roce-v2.md §1.10):
/// TVer 0, an opcode of known layout, room for headers + pad + ICRC.
///
/// # Errors
/// [`ParseError::BadLength`] (too short or long, pad past the headers),
/// [`ParseError::Unsupported`] (TVer ≠ 0, unknown opcode),
/// [`ParseError::Truncated`], [`ParseError::BadChecksum`] (wrong ICRC).
///
/// # Fuzzing
/// The ICRC check passes under `cfg(fuzzing)`.
pub fn parse_datagram(
    from: SocketAddrV4,
    local_ip: Ipv4Addr,
    datagram: &[u8],
) -> Result<RoceFrame<'_>, ParseError> {
    let expected = datagram_icrc(from, local_ip, datagram)?;
    let (eth, ip, udp) = pseudo_reprs(from, local_ip, datagram.len());
    let bth = BthRepr::parse(&bth::Packet::new_unchecked(datagram))?;
    let layout = bth.opcode.ext_headers().ok_or(ParseError::Unsupported)?;
    let payload_start = bth::HEADER_LEN + layout.len();
    let icrc_start = datagram.len() - ICRC_LEN;
    let payload_end = icrc_start
        .checked_sub(usize::from(bth.pad_count))
        .filter(|&end| end >= payload_start)
        .ok_or(ParseError::BadLength)?;
    let ext = ExtHeaders::parse(layout, &datagram[bth::HEADER_LEN..payload_start])?;
    let mut icrc = [0u8; ICRC_LEN];
    icrc.copy_from_slice(&datagram[icrc_start..]);
    let icrc = u32::from_le_bytes(icrc);
    if icrc != expected && !cfg!(fuzzing) {
        return Err(ParseError::BadChecksum);
    }
    Ok(RoceFrame {
        eth,
        ip,
        udp,
        bth,
        ext,
        payload: &datagram[payload_start..payload_end],
        icrc,
    })
}

/// The [`FrameSink`] behind [`Hca::poll_datagrams`]: strips the pseudo
/// Ethernet/IPv4/UDP headers of each frame and sends the rest to the
/// frame's IPv4 destination at `port`. Frames that are not IPv4/UDP (ARP,
/// which a UDP-mode HCA never makes) are counted in `skipped` and dropped.
pub(crate) struct DatagramFrames<'a, D: ?Sized> {
    pub(crate) sink: &'a mut D,
    pub(crate) port: u16,
    pub(crate) skipped: u64,
}

impl<D: DatagramSink + ?Sized> FrameSink for DatagramFrames<'_, D> {
    fn transmit(&mut self, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        let ip_udp = headers.get(ethernet::HEADER_LEN..PSEUDO_HEADERS_LEN);
        let is_udp = headers.get(12..14) == Some(&[0x08, 0x00][..])
            && ip_udp.is_some_and(|ip| ip[9] == u8::from(ipv4::Protocol::Udp));
        let Some(ip) = ip_udp.filter(|_| is_udp) else {
            self.skipped += 1;
            return;
        };
        let dst = ipv4::Packet::new_unchecked(ip).dst_addr();
        self.sink.transmit(
            SocketAddrV4::new(dst, self.port),
            &headers[PSEUDO_HEADERS_LEN..],
            payload,
            trailer,
        );
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::types::{Pkey, Psn, Qpn};
    use crate::wire::{parse_frame, FrameHeaders, Opcode, Trailer, MAX_HEADERS_LEN};

    const A: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 4791);
    const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

    /// A SEND_ONLY frame as a UDP-mode QP emits it (path = A → B).
    fn frame(payload: &[u8]) -> Vec<u8> {
        let (eth, ip, udp) = pseudo_reprs(A, B, 0);
        let headers = FrameHeaders {
            eth,
            ip: Ipv4Repr {
                ttl: 7,
                tos: 4,
                ..ip
            },
            udp,
            bth: BthRepr {
                opcode: Opcode::RcSendOnly,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: Pkey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::new(0x11),
                ack_req: true,
                psn: Psn::new(5),
            },
            ext: ExtHeaders::default(),
        };
        let mut buf = [0u8; MAX_HEADERS_LEN];
        let len = headers.emit_headers(&mut buf, payload.len()).unwrap();
        let trailer = Trailer::new(&buf[..len], &[payload]);
        [&buf[..len], payload, trailer.as_bytes()].concat()
    }

    #[test]
    fn test_emitted_frame_is_pseudo_header_plus_datagram() {
        let frame = frame(b"hello");
        let datagram = &frame[PSEUDO_HEADERS_LEN..];
        let pseudo = pseudo_headers(A, B, datagram.len());
        // Equal but for the masked TTL/TOS and the IPv4 checksum.
        for (index, (got, want)) in frame[..PSEUDO_HEADERS_LEN].iter().zip(pseudo).enumerate() {
            if ![15, 22, 24, 25].contains(&index) {
                assert_eq!(*got, want, "byte {index}");
            }
        }
        let parsed = parse_datagram(A, B, datagram).unwrap();
        assert_eq!(parsed.payload, b"hello");
        assert_eq!(parsed.bth.pad_count, 3);
        let whole = [&pseudo[..], datagram].concat();
        assert_eq!(parse_frame(&whole).unwrap().payload, b"hello");
    }

    #[test]
    fn test_icrc_covers_addresses_and_ports() {
        let frame = frame(b"data");
        let datagram = &frame[PSEUDO_HEADERS_LEN..];
        assert!(parse_datagram(A, B, datagram).is_ok());
        let other_port = SocketAddrV4::new(*A.ip(), 4792);
        let other_ip = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 4791);
        for (from, to) in [
            (other_port, B),
            (other_ip, B),
            (A, Ipv4Addr::new(127, 0, 0, 4)),
        ] {
            assert_eq!(
                parse_datagram(from, to, datagram),
                Err(ParseError::BadChecksum)
            );
        }
    }

    #[test]
    fn test_malformed_datagrams() {
        let frame = frame(b"abcd");
        let datagram = &frame[PSEUDO_HEADERS_LEN..];
        assert_eq!(
            parse_datagram(A, B, &datagram[..15]),
            Err(ParseError::BadLength)
        );
        let mut bad = datagram.to_vec();
        bad[1] |= 0x0f; // TVer 15
        assert_eq!(parse_datagram(A, B, &bad), Err(ParseError::Unsupported));
        let mut bad = datagram.to_vec();
        bad[1] |= 0x30; // PadCnt 3: the BTH is covered by the ICRC
        assert!(parse_datagram(A, B, &bad).is_err());
        let mut bad = datagram.to_vec();
        bad[13] ^= 1;
        assert_eq!(parse_datagram(A, B, &bad), Err(ParseError::BadChecksum));
        let huge = vec![0u8; MAX_DATAGRAM_LEN + 1];
        assert_eq!(parse_datagram(A, B, &huge), Err(ParseError::BadLength));
    }
}
