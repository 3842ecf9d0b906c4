//! The deterministic, position-dependent data pattern of `brick io`.
//!
//! The pattern is a function of a seed and the *absolute byte position on
//! the volume*, so a block that lands in the wrong place, a stale block and
//! a block of another run (another seed) all fail the check, and the check
//! can say which of these it found. Every 512-byte sector at volume offset
//! `S` is:
//!
//! | Bytes | Content |
//! |---|---|
//! | 0..8 | `S`, little-endian |
//! | 8..16 | `seed ^ TAG`, little-endian |
//! | 16..512 | one 64-bit SplitMix64 word per 8 bytes, keyed by the seed and the word's absolute index |
//!
//! The header makes a misplaced sector self-describing: [`diagnose`] reads
//! it back and names the offset and seed the sector was written for.

use std::fmt;

/// Bytes per pattern sector (the smallest logical block size).
pub const SECTOR: u64 = 512;
/// Mixed into word 1 of every sector, so an all-zero or foreign sector is
/// not mistaken for seed 0.
const TAG: u64 = 0x4252_4943_4b50_4154; // "BRICKPAT"
/// Words per sector.
const SECTOR_WORDS: u64 = SECTOR / 8;

/// SplitMix64's finaliser: a cheap, well-mixed 64-bit hash.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The 8-byte word at absolute word index `word` (byte `8 × word`).
fn word(seed: u64, word: u64) -> u64 {
    match word % SECTOR_WORDS {
        0 => word * 8,
        1 => seed ^ TAG,
        _ => mix(mix(seed) ^ word),
    }
}

/// The pattern byte at absolute position `position`.
fn byte(seed: u64, position: u64) -> u8 {
    word(seed, position / 8).to_le_bytes()[(position % 8) as usize]
}

/// Fills `buf` with the pattern of `seed` for volume bytes
/// `offset..offset + buf.len()`. Allocates nothing.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let head = ((8 - offset % 8) % 8).min(buf.len() as u64) as usize;
    let (first, rest) = buf.split_at_mut(head);
    for (i, b) in first.iter_mut().enumerate() {
        *b = byte(seed, offset + i as u64);
    }
    let base = offset + head as u64;
    let mut words = rest.chunks_exact_mut(8);
    let mut index = base / 8;
    for chunk in &mut words {
        chunk.copy_from_slice(&word(seed, index).to_le_bytes());
        index += 1;
    }
    let tail = words.into_remainder();
    let tail_start = index * 8;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = byte(seed, tail_start + i as u64);
    }
}

/// The first byte of `found` (volume bytes from `offset`) that differs from
/// the pattern of `seed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Volume offset of the first differing byte.
    pub offset: u64,
    /// The pattern's byte there.
    pub expected: u8,
    /// The byte read.
    pub found: u8,
    /// Bytes that differ in the sector holding `offset` (within `found`).
    pub bytes_differing_in_sector: usize,
    /// What the sector read holds, judged by its header.
    pub sector: SectorContent,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data mismatch at volume offset {} ({:#x}): expected {:#04x}, found {:#04x}; \
             {} of {} bytes differ in the sector at {}; {}",
            self.offset,
            self.offset,
            self.expected,
            self.found,
            self.bytes_differing_in_sector,
            SECTOR,
            self.offset - self.offset % SECTOR,
            self.sector
        )
    }
}

/// What a sector that failed the check holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectorContent {
    /// Only zeros (never written, or discarded).
    Zeros,
    /// The whole pattern sector of this seed for this offset: the data is
    /// right but belongs elsewhere (a misplaced block) or to another run.
    PatternOf {
        /// Offset the sector was written for.
        offset: u64,
        /// Seed it was written with.
        seed: u64,
    },
    /// A pattern header, but the body does not match it (torn or corrupt).
    DamagedPattern {
        /// Offset named by the header.
        offset: u64,
        /// Seed named by the header.
        seed: u64,
    },
    /// Not the pattern at all.
    Foreign,
    /// The buffer does not hold the whole sector, so it was not judged.
    Partial,
}

impl fmt::Display for SectorContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zeros => f.write_str("the sector read is all zeros (never written?)"),
            Self::PatternOf { offset, seed } => write!(
                f,
                "the sector read is intact pattern data for offset {offset} seed {seed} (misplaced or from another run)"
            ),
            Self::DamagedPattern { offset, seed } => write!(
                f,
                "the sector read has the header for offset {offset} seed {seed} but a damaged body"
            ),
            Self::Foreign => f.write_str("the sector read is not pattern data"),
            Self::Partial => f.write_str("the sector is only partly in the range checked"),
        }
    }
}

/// Judges a whole 512-byte sector by its header.
pub fn diagnose(sector: &[u8]) -> SectorContent {
    if sector.len() != SECTOR as usize {
        return SectorContent::Partial;
    }
    if sector.iter().all(|&b| b == 0) {
        return SectorContent::Zeros;
    }
    let header = |i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&sector[i * 8..i * 8 + 8]);
        u64::from_le_bytes(bytes)
    };
    let offset = header(0);
    let seed = header(1) ^ TAG;
    if offset % SECTOR != 0 {
        return SectorContent::Foreign;
    }
    let mut model = [0u8; SECTOR as usize];
    fill(seed, offset, &mut model);
    if model[..] == sector[..] {
        return SectorContent::PatternOf { offset, seed };
    }
    let body_matches = model[16..]
        .iter()
        .zip(&sector[16..])
        .filter(|(a, b)| a == b)
        .count();
    // Chance agreement is 1 byte in 256; a tenth of the body is a header
    // of ours over a damaged body.
    if body_matches * 10 >= model.len() - 16 {
        SectorContent::DamagedPattern { offset, seed }
    } else {
        SectorContent::Foreign
    }
}

/// Checks `found` (volume bytes from `offset`) against the pattern of
/// `seed`; `None` if it matches. Allocates nothing unless it finds a
/// mismatch.
pub fn check(seed: u64, offset: u64, found: &[u8]) -> Option<Mismatch> {
    // Word-wise when aligned (the common case), byte-wise otherwise.
    let first = if offset % 8 == 0 {
        let mut at = None;
        for (i, chunk) in found.chunks(8).enumerate() {
            let expected = word(seed, offset / 8 + i as u64).to_le_bytes();
            if chunk != &expected[..chunk.len()] {
                let within = chunk
                    .iter()
                    .zip(expected)
                    .position(|(a, b)| *a != b)
                    .unwrap_or(0);
                at = Some(i * 8 + within);
                break;
            }
        }
        at?
    } else {
        found
            .iter()
            .enumerate()
            .position(|(i, b)| *b != byte(seed, offset + i as u64))?
    };
    let position = offset + first as u64;
    let sector_start = position - position % SECTOR;
    // The sector's bytes inside `found`.
    let from = sector_start.saturating_sub(offset) as usize;
    let to = (sector_start + SECTOR - offset).min(found.len() as u64) as usize;
    let sector = &found[from..to];
    let bytes_differing_in_sector = sector
        .iter()
        .enumerate()
        .filter(|(i, b)| **b != byte(seed, offset + (from + i) as u64))
        .count();
    Some(Mismatch {
        offset: position,
        expected: byte(seed, position),
        found: found[first],
        bytes_differing_in_sector,
        sector: if sector_start >= offset {
            diagnose(sector)
        } else {
            SectorContent::Partial
        },
    })
}

/// FNV-1a over `data`: a short fingerprint for `--dump`.
pub fn fingerprint(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_position_dependent_and_split_invariant() {
        let mut whole = vec![0u8; 4096];
        fill(7, 8192, &mut whole);
        // Any split, at any alignment, gives the same bytes.
        for cut in [1usize, 3, 8, 511, 512, 513, 4095] {
            let mut a = vec![0u8; cut];
            let mut b = vec![0u8; 4096 - cut];
            fill(7, 8192, &mut a);
            fill(7, 8192 + cut as u64, &mut b);
            assert_eq!(&whole[..cut], &a[..]);
            assert_eq!(&whole[cut..], &b[..]);
        }
        let mut elsewhere = vec![0u8; 4096];
        fill(7, 0, &mut elsewhere);
        assert_ne!(whole, elsewhere);
        let mut other_seed = vec![0u8; 4096];
        fill(8, 8192, &mut other_seed);
        assert_ne!(whole, other_seed);
        assert_eq!(check(7, 8192, &whole), None);
        assert_eq!(check(7, 8193, &whole[1..]), None);
    }

    #[test]
    fn check_names_misplaced_zero_and_corrupt_sectors() {
        let mut data = vec![0u8; 2048];
        fill(3, 4096, &mut data);
        // Sector 2 (volume 5120) holds the data for 8192.
        let mut moved = [0u8; 512];
        fill(3, 8192, &mut moved);
        data[1024..1536].copy_from_slice(&moved);
        let m = check(3, 4096, &data).unwrap();
        assert_eq!(
            m.offset, 5121,
            "the header word (5120 vs 8192) differs first, in its byte 1"
        );
        assert_eq!(
            m.sector,
            SectorContent::PatternOf {
                offset: 8192,
                seed: 3
            }
        );
        assert!(m.to_string().contains("offset 8192 seed 3"), "{m}");

        data[1024..1536].fill(0);
        assert_eq!(check(3, 4096, &data).unwrap().sector, SectorContent::Zeros);

        fill(3, 4096, &mut data);
        data[1500] ^= 0xff;
        let m = check(3, 4096, &data).unwrap();
        assert_eq!(m.offset, 4096 + 1500);
        assert_eq!(m.bytes_differing_in_sector, 1);
        assert_eq!(m.found, m.expected ^ 0xff);
        assert_eq!(
            m.sector,
            SectorContent::DamagedPattern {
                offset: 5120,
                seed: 3
            }
        );

        fill(4, 4096, &mut data);
        assert_eq!(
            check(3, 4096, &data).unwrap().sector,
            SectorContent::PatternOf {
                offset: 4096,
                seed: 4
            }
        );
    }
}
