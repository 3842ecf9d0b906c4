//! RoCEv2 Invariant CRC (ICRC): CRC-32 with the variant fields masked.
//!
//! roce-v2.md §1.8 (rxe `rxe_icrc.c`). The ICRC is the standard CRC-32 (IEEE
//! 802.3 / zlib: reflected polynomial 0xEDB88320, init and final XOR all ones)
//! of this byte string:
//!
//! 1. eight 0xFF bytes, standing for the masked LRH of native IB (rxe seeds its
//!    CRC state with 0xDEBB20E3, the state after those bytes);
//! 2. the 20-byte IPv4 header with TOS (byte 1), TTL (byte 8) and the header
//!    checksum (bytes 10-11) set to all ones: routers may change them;
//! 3. the UDP header with the checksum (bytes 6-7) set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, Resv6a) set to 0xFF;
//! 5. the remaining transport headers, payload and pad, unmasked.
//!
//! It is stored after the pad **least-significant byte first**, unlike every
//! other IB field. IPv4 only, without IP options (rxe assumes a 20-byte header).
//!
//! The CRC is computed incrementally with `crc32fast::Hasher` (no table of our
//! own), so the transport can cover headers it emitted and payload pieces that
//! stay in registered memory: see [`Icrc`] and [`icrc_over`].
//!
//! # Fuzzing
//! Under `cfg(fuzzing)` [`verify_icrc`] always returns `true`, so fuzzers reach
//! the parsers behind the check.

use super::bytes::{read_u16_be, read_u32_le, write_u32_le};
use super::{ethernet, ParseError};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Ethernet + IPv4 + UDP + BTH: the headers every RoCEv2 frame starts with,
/// and the part of the frame that contains masked fields.
pub const ROCE_PREFIX_LEN: usize = ethernet::HEADER_LEN + 20 + 8 + 12;

/// Offsets of the masked bytes within the IPv4..BTH region (frame offset − 14).
mod mask {
    pub const IP_TOS: usize = 1;
    pub const IP_TTL: usize = 8;
    pub const IP_CHECKSUM: core::ops::Range<usize> = 10..12;
    pub const UDP_CHECKSUM: core::ops::Range<usize> = 26..28;
    pub const BTH_ECN: usize = 32;
}

/// Bytes of a frame before the BTH's last four (AckReq and PSN), which hold
/// every masked field.
const BEFORE_PSN: usize = ROCE_PREFIX_LEN - 4;
const _: () = assert!(mask::BTH_ECN < BEFORE_PSN - ethernet::HEADER_LEN);

/// Masks the variant fields of the IPv4..BTH bytes `region` starts with
/// (an array, so the offsets are checked when compiling).
#[inline(always)]
fn mask_variant<const N: usize>(region: &mut [u8; N]) {
    region[mask::IP_TOS] = 0xff;
    region[mask::IP_TTL] = 0xff;
    region[mask::IP_CHECKSUM].fill(0xff);
    region[mask::UDP_CHECKSUM].fill(0xff);
    region[mask::BTH_ECN] = 0xff;
}

/// The ICRC state after a frame's headers up to the BTH's AckReq and PSN
/// (its last four bytes): what packets whose earlier header bytes are the
/// same share (see [`IcrcSeed::before_psn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcBeforePsn(u32);

impl IcrcBeforePsn {
    /// The ICRC started over `headers` (at least [`ROCE_PREFIX_LEN`] bytes,
    /// the same before AckReq as those this state was taken from), as
    /// [`Icrc::new`] on them: only their bytes from AckReq on are hashed.
    ///
    /// # Panics
    /// If `headers` is shorter than [`ROCE_PREFIX_LEN`].
    #[inline]
    pub fn resume(self, headers: &[u8]) -> Icrc {
        assert!(
            headers.len() >= ROCE_PREFIX_LEN,
            "ICRC needs the Ethernet, IPv4, UDP and BTH headers"
        );
        let mut hasher = crc32fast::Hasher::new_with_initial(self.0);
        hasher.update(&headers[BEFORE_PSN..]);
        Icrc { hasher }
    }
}

/// The CRC-32 of the eight 0xFF bytes that stand for the masked LRH (in
/// `crc32fast`'s finalised form: rxe's raw seed 0xDEBB20E3, inverted).
const AFTER_MASKED_LRH: u32 = !0xDEBB_20E3;

/// An ICRC computation in progress: the masked headers first, then any number
/// of payload pieces (including the pad), in wire order.
#[derive(Debug, Clone)]
pub struct Icrc {
    hasher: crc32fast::Hasher,
}

/// The CRC state every ICRC starts from (after the masked LRH), made once:
/// making a `crc32fast::Hasher` asks which CRC routine the CPU supports,
/// and a sender or receiver that keeps one of these clones it per packet
/// instead. [`IcrcSeed::start`] is [`Icrc::new`] without that question.
#[derive(Debug, Clone)]
pub struct IcrcSeed {
    hasher: crc32fast::Hasher,
}

impl IcrcSeed {
    /// The seed (the CPU's CRC routine chosen here).
    pub fn new() -> IcrcSeed {
        IcrcSeed {
            hasher: crc32fast::Hasher::new_with_initial(AFTER_MASKED_LRH),
        }
    }

    /// Starts an ICRC over `headers`, as [`Icrc::new`].
    ///
    /// # Panics
    /// If `headers` is shorter than [`ROCE_PREFIX_LEN`].
    #[inline]
    pub fn start(&self, headers: &[u8]) -> Icrc {
        Icrc::with_hasher(self.hasher.clone(), headers)
    }

    /// The ICRC state after `headers` up to their AckReq and PSN, for
    /// [`IcrcBeforePsn::resume`].
    ///
    /// # Panics
    /// If `headers` is shorter than [`ROCE_PREFIX_LEN`].
    pub fn before_psn(&self, headers: &[u8]) -> IcrcBeforePsn {
        assert!(
            headers.len() >= ROCE_PREFIX_LEN,
            "ICRC needs the Ethernet, IPv4, UDP and BTH headers"
        );
        let mut masked = [0u8; BEFORE_PSN - ethernet::HEADER_LEN];
        masked.copy_from_slice(&headers[ethernet::HEADER_LEN..BEFORE_PSN]);
        mask_variant(&mut masked);
        let mut hasher = self.hasher.clone();
        hasher.update(&masked);
        IcrcBeforePsn(hasher.finalize())
    }
}

impl Default for IcrcSeed {
    fn default() -> Self {
        IcrcSeed::new()
    }
}

impl Icrc {
    /// Starts an ICRC over `headers`: the frame from the Ethernet header on, at
    /// least [`ROCE_PREFIX_LEN`] bytes (the masked prefix plus any extended
    /// headers). Length fields inside `headers` are not consulted.
    ///
    /// # Panics
    /// If `headers` is shorter than [`ROCE_PREFIX_LEN`] (a programming error: the
    /// emitter always writes at least that much).
    pub fn new(headers: &[u8]) -> Icrc {
        IcrcSeed::new().start(headers)
    }

    /// [`Icrc::new`] from `hasher`, the state after the masked LRH.
    #[inline]
    fn with_hasher(mut hasher: crc32fast::Hasher, headers: &[u8]) -> Icrc {
        assert!(
            headers.len() >= ROCE_PREFIX_LEN,
            "ICRC needs the Ethernet, IPv4, UDP and BTH headers"
        );
        let (prefix, rest) = headers.split_at(ROCE_PREFIX_LEN);
        let mut masked = [0u8; ROCE_PREFIX_LEN - ethernet::HEADER_LEN];
        masked.copy_from_slice(&prefix[ethernet::HEADER_LEN..]);
        mask_variant(&mut masked);

        // `hasher` starts from the state after the eight 0xFF bytes instead
        // of hashing them for every packet.
        hasher.update(&masked);
        if !rest.is_empty() {
            hasher.update(rest);
        }
        Icrc { hasher }
    }

    /// Feeds the next unmasked bytes (payload pieces, pad).
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The ICRC value (transmitted least-significant byte first).
    pub fn finish(self) -> u32 {
        self.hasher.finalize()
    }
}

/// The ICRC of `headers` (see [`Icrc::new`]) followed by `payload` pieces, which
/// must include the pad bytes: everything that precedes the ICRC on the wire.
///
/// ```
/// # use roce::wire::icrc_over;
/// # let frame = [0u8; 80];
/// // Headers and payload may be split anywhere after the first 54 bytes.
/// assert_eq!(icrc_over(&frame[..60], &[&frame[60..70], &frame[70..]]), icrc_over(&frame, &[]));
/// ```
///
/// # Panics
/// If `headers` is shorter than [`ROCE_PREFIX_LEN`].
pub fn icrc_over(headers: &[u8], payload: &[&[u8]]) -> u32 {
    let mut icrc = Icrc::new(headers);
    for piece in payload {
        icrc.update(piece);
    }
    icrc.finish()
}

/// Where the ICRC of a RoCEv2-over-IPv4 frame ends: `14 + 20 + UDP length`.
///
/// Checks only what locating the ICRC needs; it does not check the UDP port or
/// the IP checksum.
pub(super) fn icrc_end(frame: &[u8]) -> Result<usize, ParseError> {
    const IP: usize = ethernet::HEADER_LEN;
    const UDP: usize = IP + 20;
    if frame.len() < ROCE_PREFIX_LEN + ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    if read_u16_be(&frame[12..14]) != 0x0800 || frame[IP + 9] != 17 {
        return Err(ParseError::Unsupported);
    }
    // Version 4, IHL 5: rxe's ICRC code assumes a 20-byte header.
    if frame[IP] != 0x45 {
        return Err(ParseError::Unsupported);
    }
    let total_len = usize::from(read_u16_be(&frame[IP + 2..IP + 4]));
    let udp_len = usize::from(read_u16_be(&frame[UDP + 4..UDP + 6]));
    if udp_len < 8 + 12 + ICRC_LEN || 20 + udp_len > total_len {
        return Err(ParseError::BadLength);
    }
    if IP + total_len > frame.len() {
        return Err(ParseError::Truncated);
    }
    Ok(UDP + udp_len)
}

/// Computes the ICRC a RoCEv2 frame should carry (over everything before its
/// ICRC field; the field itself is not read).
///
/// # Errors
/// [`ParseError::Truncated`], [`ParseError::Unsupported`] (not IPv4/UDP, IP
/// options) or [`ParseError::BadLength`] if the frame's lengths do not locate an
/// IB part of at least BTH + ICRC.
pub fn compute_icrc(frame: &[u8]) -> Result<u32, ParseError> {
    let end = icrc_end(frame)?;
    Ok(icrc_over(&frame[..end - ICRC_LEN], &[]))
}

/// `true` if the frame is RoCEv2 over IPv4 and its ICRC is correct. Frames
/// whose lengths are inconsistent are reported as not verifying.
///
/// # Fuzzing
/// Always `true` under `cfg(fuzzing)`.
pub fn verify_icrc(frame: &[u8]) -> bool {
    verify_icrc_from(&IcrcSeed::new(), frame)
}

/// [`verify_icrc`] starting from `seed`.
///
/// # Fuzzing
/// Always `true` under `cfg(fuzzing)`.
#[inline]
pub fn verify_icrc_from(seed: &IcrcSeed, frame: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    match icrc_end(frame) {
        Ok(end) => {
            seed.start(&frame[..end - ICRC_LEN]).finish()
                == read_u32_le(&frame[end - ICRC_LEN..end])
        }
        Err(_) => false,
    }
}

/// Writes the correct ICRC into the frame's ICRC field.
///
/// # Errors
/// As [`compute_icrc`]; the frame is unchanged on error.
pub fn fill_icrc(frame: &mut [u8]) -> Result<(), ParseError> {
    let end = icrc_end(frame)?;
    let icrc = icrc_over(&frame[..end - ICRC_LEN], &[]);
    write_u32_le(&mut frame[end - ICRC_LEN..end], icrc);
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;

    // roce-v2.md §1.8, worked example 1: RC SEND_ONLY "hello", PadCnt 3.
    static EXAMPLE_1: [u8; 66] = [
        0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x02, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x34, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x11, 0x9b, 0x1f, 0xc0, 0xa8, 0x01, 0x01,
        0xc0, 0xa8, 0x01, 0x02, 0xd3, 0xa5, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00, 0x04, 0x30, 0xff,
        0xff, 0x00, 0x00, 0x01, 0x23, 0x80, 0x12, 0x34, 0x56, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
        0x00, 0x00, 0x4d, 0xbc, 0xfc, 0xef,
    ];

    // roce-v2.md §1.8, worked example 2: RC ACKNOWLEDGE, AETH 0x1F / MSN 1.
    static EXAMPLE_2: [u8; 62] = [
        0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x01, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x02, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb7, 0x69, 0xc0, 0xa8, 0x01, 0x02,
        0xc0, 0xa8, 0x01, 0x01, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x12, 0x34, 0x56, 0x1f, 0x00, 0x00, 0x01, 0x99, 0xb3,
        0xdb, 0xd0,
    ];

    // rping-linux.pcap frame 9: the server's ACK of PSN 5535020, as rxe sent it.
    static RPING_ACK: [u8; 62] = [
        0x52, 0x54, 0x00, 0x77, 0x00, 0x02, 0x52, 0x54, 0x00, 0x77, 0x00, 0x01, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x07, 0xfc, 0x40, 0x00, 0x40, 0x11, 0x1e, 0x25, 0x0a, 0x4d, 0x00, 0x01,
        0x0a, 0x4d, 0x00, 0x02, 0xfb, 0x6f, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x54, 0x75, 0x2c, 0x1f, 0x00, 0x00, 0x01, 0x5b, 0xc2,
        0x5e, 0x3e,
    ];

    #[test]
    fn test_captured_ack() {
        assert_eq!(compute_icrc(&RPING_ACK), Ok(0x3e5e_c25b));
        assert!(verify_icrc(&RPING_ACK));
    }

    #[test]
    fn test_worked_example_1() {
        assert_eq!(compute_icrc(&EXAMPLE_1), Ok(0xeffc_bc4d));
        assert!(verify_icrc(&EXAMPLE_1));
    }

    #[test]
    fn test_worked_example_2() {
        assert_eq!(compute_icrc(&EXAMPLE_2), Ok(0xd0db_b399));
        assert!(verify_icrc(&EXAMPLE_2));
    }

    #[test]
    fn test_masked_fields_do_not_change_icrc() {
        // Example 1 with TOS 0xBB, TTL 3, UDP checksum 0x1234, FECN + BECN.
        let mut frame = EXAMPLE_1;
        frame[15] = 0xbb;
        frame[22] = 3;
        frame[24] ^= 0x5a; // the IP checksum is masked too
        frame[40..42].copy_from_slice(&[0x12, 0x34]);
        frame[46] = 0xc0;
        assert_eq!(compute_icrc(&frame), Ok(0xeffc_bc4d));
        assert!(verify_icrc(&frame));
    }

    #[test]
    fn test_bad_icrc() {
        for index in [14 + 2, 14 + 20, 14 + 28 + 1, 14 + 28 + 5, 60, 63] {
            let mut frame = EXAMPLE_1;
            frame[index] ^= 0x01;
            assert!(!verify_icrc(&frame), "flip at {index} went unnoticed");
        }
    }

    #[test]
    fn test_fill_icrc() {
        let mut frame = EXAMPLE_2;
        frame[58..].fill(0);
        assert!(!verify_icrc(&frame));
        fill_icrc(&mut frame).unwrap();
        assert_eq!(frame, EXAMPLE_2);
    }

    #[test]
    fn test_icrc_over_pieces() {
        let whole = icrc_over(&EXAMPLE_1[..62], &[]);
        let split = icrc_over(&EXAMPLE_1[..54], &[&EXAMPLE_1[54..59], &EXAMPLE_1[59..62]]);
        assert_eq!(whole, 0xeffc_bc4d);
        assert_eq!(split, whole);
    }

    #[test]
    fn test_malformed_frames_do_not_verify() {
        assert!(!verify_icrc(&EXAMPLE_1[..57]));
        let mut frame = EXAMPLE_1;
        frame[14] = 0x46;
        assert_eq!(compute_icrc(&frame), Err(ParseError::Unsupported));
        let mut frame = EXAMPLE_1;
        frame[39] = 0x40; // UDP length beyond the IP total length
        assert_eq!(compute_icrc(&frame), Err(ParseError::BadLength));
        assert_eq!(fill_icrc(&mut frame), Err(ParseError::BadLength));
    }

    #[test]
    fn test_masked_lrh_seed() {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&[0xff; 8]);
        assert_eq!(hasher.finalize(), AFTER_MASKED_LRH);
    }
}
