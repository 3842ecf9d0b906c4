//! The boot disk's two manifest slots: which one is in force.
//!
//! On a disk image (`brick image build`) the manifest lives twice, in two
//! fixed-size slot files on the EFI system partition (`\EFI\BRICK\MANIFEST.A`
//! and `.B`, [`SLOT_BYTES`] each). `brick manifest flash` rewrites the
//! slot that is *not* in force, in place, with a sequence number one above
//! the highest valid one, then reads it back; the image boots the valid
//! slot with the highest sequence. A write torn by a crash or a flipped
//! byte leaves that slot's checksum wrong, so the other slot, untouched,
//! stays in force.
//!
//! # Slot layout (slot format 1)
//!
//! | Offset | Size | Field |
//! |---|---|---|
//! | 0 | 4 | magic `BRKS` |
//! | 4 | 2 | slot format = 1 |
//! | 6 | 2 | reserved, zero |
//! | 8 | 8 | sequence number (u64 LE) |
//! | 16 | 4 | blob length (u32 LE, 1..=[`MAX_BLOB`]) |
//! | 20 | 4 | CRC-32 (IEEE) of bytes 0..20 and of the blob |
//! | 24 | len | the binary manifest (`BRKM`, its own checksum inside) |
//! | .. | | zero up to [`SLOT_BYTES`] |
//!
//! A slot is *valid* when its header and checksum are right and its blob is
//! a manifest this build reads ([`Manifest::parse`]). [`choose`] decides:
//! the valid slot with the higher sequence (A on a tie); neither valid:
//! [`BootMediaError::NoManifest`] when both are absent or blank (never
//! flashed), else [`BootMediaError::BothCorrupt`] with each slot's reason.
//! A slot whose checksum is right but whose manifest (or slot format) is
//! newer than this build is not skipped: if it has the highest sequence,
//! [`BootMediaError::TooNew`] stops the boot rather than silently serving
//! the older configuration.

use core::fmt;

use crate::binary::{Manifest, ReadError, FORMAT_VERSION};

/// The first four bytes of a slot.
pub const SLOT_MAGIC: [u8; 4] = *b"BRKS";
/// The slot format this build writes and reads.
pub const SLOT_FORMAT: u16 = 1;
/// Bytes of a slot header.
pub const SLOT_HEADER: usize = 24;
/// Bytes of a slot file (header, blob, zero padding).
pub const SLOT_BYTES: usize = 1 << 20;
/// The longest blob a slot holds.
pub const MAX_BLOB: usize = SLOT_BYTES - SLOT_HEADER;

/// The two slots.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SlotName {
    /// `MANIFEST.A`.
    A,
    /// `MANIFEST.B`.
    B,
}

impl SlotName {
    /// The file name on the ESP (`\EFI\BRICK\` + this).
    pub fn file_name(self) -> &'static str {
        match self {
            Self::A => "MANIFEST.A",
            Self::B => "MANIFEST.B",
        }
    }

    /// The other slot.
    pub fn other(self) -> Self {
        match self {
            Self::A => Self::B,
            Self::B => Self::A,
        }
    }
}

impl fmt::Display for SlotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::A => "slot A",
            Self::B => "slot B",
        })
    }
}

/// Why one slot is not valid.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum SlotError {
    /// The slot file is missing.
    Missing,
    /// All zeros, or no header: never flashed.
    Blank,
    /// Shorter than its header says.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        found: usize,
    },
    /// Not a slot (the magic is wrong).
    BadMagic([u8; 4]),
    /// A slot format this build does not read.
    NewerFormat(u16),
    /// A blob length of 0 or above [`MAX_BLOB`].
    BadLength(u32),
    /// The checksum does not match (a torn write, a flipped byte).
    ChecksumMismatch {
        /// The header's CRC.
        expected: u32,
        /// The contents' CRC.
        found: u32,
    },
    /// The checksum is right but the manifest is refused.
    Manifest(ReadError),
}

impl SlotError {
    /// Whether the slot holds something newer than this build reads (not
    /// damage).
    pub fn is_newer(&self) -> bool {
        match self {
            Self::NewerFormat(_) => true,
            Self::Manifest(ReadError::UnsupportedVersion { found, .. }) => *found > FORMAT_VERSION,
            _ => false,
        }
    }
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => f.write_str("missing"),
            Self::Blank => f.write_str("blank (never flashed)"),
            Self::Truncated { needed, found } => {
                write!(f, "truncated: {found} bytes, {needed} needed")
            }
            Self::BadMagic(m) => write!(
                f,
                "bad magic {:02x}{:02x}{:02x}{:02x} (expected \"BRKS\")",
                m[0], m[1], m[2], m[3]
            ),
            Self::NewerFormat(found) => write!(
                f,
                "slot format {found} is newer than this build reads ({SLOT_FORMAT})"
            ),
            Self::BadLength(len) => {
                write!(f, "blob length {len}, expected 1 to {MAX_BLOB}")
            }
            Self::ChecksumMismatch { expected, found } => write!(
                f,
                "checksum mismatch: header has crc32 {expected:#010x}, contents give {found:#010x} \
                 (torn or corrupted)"
            ),
            Self::Manifest(error) => write!(f, "{error}"),
        }
    }
}

/// A slot whose header and checksum are right.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slot<'a> {
    /// Its sequence number.
    pub sequence: u64,
    /// The manifest blob.
    pub blob: &'a [u8],
}

fn crc(header: &[u8], blob: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..20]);
    hasher.update(blob);
    hasher.finalize()
}

/// Reads one slot's header and checks its checksum (not the manifest).
///
/// # Errors
///
/// [`SlotError`] but `Missing` and `Manifest`.
pub fn read_slot(bytes: &[u8]) -> Result<Slot<'_>, SlotError> {
    if bytes.len() < SLOT_HEADER || bytes[..SLOT_HEADER].iter().all(|b| *b == 0) {
        return Err(SlotError::Blank);
    }
    let magic: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if magic != SLOT_MAGIC {
        return Err(SlotError::BadMagic(magic));
    }
    let format = u16::from_le_bytes([bytes[4], bytes[5]]);
    if format != SLOT_FORMAT {
        return Err(SlotError::NewerFormat(format));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let sequence = u64::from(word(8)) | (u64::from(word(12)) << 32);
    let len = word(16);
    let expected = word(20);
    if len == 0 || len as usize > MAX_BLOB {
        return Err(SlotError::BadLength(len));
    }
    let end = SLOT_HEADER + len as usize;
    let Some(blob) = bytes.get(SLOT_HEADER..end) else {
        return Err(SlotError::Truncated {
            needed: end,
            found: bytes.len(),
        });
    };
    let found = crc(bytes, blob);
    if found != expected && !cfg!(fuzzing) {
        return Err(SlotError::ChecksumMismatch { expected, found });
    }
    if u16::from_le_bytes([bytes[6], bytes[7]]) != 0 {
        return Err(SlotError::BadMagic(magic));
    }
    Ok(Slot { sequence, blob })
}

/// Reads one slot fully: header, checksum and manifest.
///
/// # Errors
///
/// [`SlotError`] (`Missing` for `None`).
#[allow(clippy::result_large_err)] // boot time, once per slot
pub fn check_slot(bytes: Option<&[u8]>) -> Result<(Slot<'_>, Manifest<'_>), SlotError> {
    let slot = read_slot(bytes.ok_or(SlotError::Missing)?)?;
    let manifest = Manifest::parse(slot.blob).map_err(SlotError::Manifest)?;
    Ok((slot, manifest))
}

/// Why the boot disk has no manifest to boot.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum BootMediaError {
    /// Neither slot was ever flashed (both missing or blank).
    NoManifest,
    /// Neither slot is valid, and at least one is damaged.
    BothCorrupt {
        /// Slot A's reason.
        a: SlotError,
        /// Slot B's reason.
        b: SlotError,
    },
    /// The slot with the highest sequence holds a manifest (or slot
    /// format) newer than this build reads.
    TooNew {
        /// Which slot.
        slot: SlotName,
        /// Why.
        error: SlotError,
    },
}

impl fmt::Display for BootMediaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoManifest => f.write_str(
                "no manifest on the boot disk: both slots are missing or blank; flash one with \
                 `brick manifest flash DISK node.toml`",
            ),
            Self::BothCorrupt { a, b } => write!(
                f,
                "both manifest slots are bad: slot A: {a}; slot B: {b}; reflash with \
                 `brick manifest flash DISK node.toml`"
            ),
            Self::TooNew { slot, error } => write!(
                f,
                "the manifest in {slot} is newer than this image understands ({error}): boot a \
                 newer image or flash a manifest built for this one"
            ),
        }
    }
}

/// The slot in force.
#[derive(Clone, Debug)]
pub struct Chosen<'a> {
    /// Which slot.
    pub name: SlotName,
    /// Its sequence number.
    pub sequence: u64,
    /// Its checked manifest.
    pub manifest: Manifest<'a>,
    /// Its blob.
    pub blob: &'a [u8],
    /// Why the other slot is not in force (`Ok(sequence)`: valid but
    /// older).
    pub other: Result<u64, SlotError>,
}

/// Which slot is in force (see the module docs).
///
/// # Errors
///
/// [`BootMediaError`].
// Called once per boot; the error carries both slots' reasons (no alloc).
#[allow(clippy::result_large_err)]
pub fn choose<'a>(a: Option<&'a [u8]>, b: Option<&'a [u8]>) -> Result<Chosen<'a>, BootMediaError> {
    let checked = [(SlotName::A, check_slot(a)), (SlotName::B, check_slot(b))];
    // The highest sequence among slots whose checksum is right, valid or
    // too new: a too-new slot there stops the boot.
    let sequence_of =
        |bytes: Option<&[u8]>| bytes.and_then(|b| read_slot(b).ok()).map(|s| s.sequence);
    let newest = [(SlotName::A, sequence_of(a)), (SlotName::B, sequence_of(b))]
        .into_iter()
        .filter_map(|(name, sequence)| Some((name, sequence?)))
        .fold(
            None,
            |best: Option<(SlotName, u64)>, (name, sequence)| match best {
                Some((_, top)) if top >= sequence => best,
                _ => Some((name, sequence)),
            },
        );
    if let Some((name, _)) = newest {
        let index = usize::from(name == SlotName::B);
        if let Err(error) = &checked[index].1 {
            if error.is_newer() {
                return Err(BootMediaError::TooNew {
                    slot: name,
                    error: error.clone(),
                });
            }
        }
    }
    let mut best: Option<(SlotName, Slot<'a>, Manifest<'a>)> = None;
    for (name, result) in &checked {
        if let Ok((slot, manifest)) = result {
            if best
                .as_ref()
                .is_none_or(|(_, top, _)| slot.sequence > top.sequence)
            {
                best = Some((*name, *slot, *manifest));
            }
        }
    }
    let reason = |name: SlotName| match &checked[usize::from(name == SlotName::B)].1 {
        Ok((slot, _)) => Ok(slot.sequence),
        Err(error) => Err(error.clone()),
    };
    match best {
        Some((name, slot, manifest)) => Ok(Chosen {
            name,
            sequence: slot.sequence,
            manifest,
            blob: slot.blob,
            other: reason(name.other()),
        }),
        None => {
            let (a, b) = (
                reason(SlotName::A).err().unwrap_or(SlotError::Blank),
                reason(SlotName::B).err().unwrap_or(SlotError::Blank),
            );
            let empty = |e: &SlotError| matches!(e, SlotError::Missing | SlotError::Blank);
            // A slot format this build cannot read at all (no sequence to
            // compare): it is what the operator flashed last.
            for (slot, error) in [(SlotName::A, &a), (SlotName::B, &b)] {
                if error.is_newer() {
                    return Err(BootMediaError::TooNew {
                        slot,
                        error: error.clone(),
                    });
                }
            }
            if empty(&a) && empty(&b) {
                Err(BootMediaError::NoManifest)
            } else {
                Err(BootMediaError::BothCorrupt { a, b })
            }
        }
    }
}

/// A slot file holding `blob` with `sequence`: [`SLOT_BYTES`] long.
///
/// # Panics
///
/// If `blob` is empty or longer than [`MAX_BLOB`] (the caller checks).
#[cfg(feature = "std")]
pub fn encode_slot(sequence: u64, blob: &[u8]) -> Vec<u8> {
    assert!(!blob.is_empty() && blob.len() <= MAX_BLOB, "blob length");
    let mut bytes = vec![0u8; SLOT_BYTES];
    bytes[..4].copy_from_slice(&SLOT_MAGIC);
    bytes[4..6].copy_from_slice(&SLOT_FORMAT.to_le_bytes());
    bytes[8..16].copy_from_slice(&sequence.to_le_bytes());
    bytes[16..20].copy_from_slice(&(blob.len() as u32).to_le_bytes());
    bytes[SLOT_HEADER..SLOT_HEADER + blob.len()].copy_from_slice(blob);
    let crc = crc(&bytes, blob);
    bytes[20..24].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(name: &str) -> Vec<u8> {
        crate::build(
            &format!(
                "[target]\nname = \"{name}\"\n[[interfaces]]\nname = \"eth0\"\n\
                 mac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\
                 [[volumes]]\nname = \"v\"\nkind = \"ram\"\nsize = \"1MiB\"\n\
                 [[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
            ),
            "t.toml",
        )
        .unwrap()
    }

    #[test]
    fn the_newest_valid_slot_is_in_force() {
        let (one, two) = (encode_slot(1, &blob("one")), encode_slot(2, &blob("two")));
        let chosen = choose(Some(&one), Some(&two)).unwrap();
        assert_eq!((chosen.name, chosen.sequence), (SlotName::B, 2));
        assert_eq!(chosen.manifest.target().name, "two");
        assert_eq!(chosen.other, Ok(1));
        let chosen = choose(Some(&two), Some(&one)).unwrap();
        assert_eq!(chosen.name, SlotName::A);
        // A blank slot B (never flashed) leaves A in force.
        let blank = vec![0u8; SLOT_BYTES];
        let chosen = choose(Some(&one), Some(&blank)).unwrap();
        assert_eq!(chosen.name, SlotName::A);
        assert_eq!(chosen.other, Err(SlotError::Blank));
    }

    #[test]
    fn a_flipped_or_torn_slot_leaves_the_other_in_force() {
        let old = encode_slot(7, &blob("old"));
        let mut new = encode_slot(8, &blob("new"));
        new[SLOT_HEADER + 40] ^= 0xff;
        let chosen = choose(Some(&old), Some(&new)).unwrap();
        assert_eq!(chosen.manifest.target().name, "old");
        assert!(matches!(
            chosen.other,
            Err(SlotError::ChecksumMismatch { .. })
        ));
        // Torn: the second half of the new slot never reached the disk.
        let mut torn = encode_slot(8, &blob("new"));
        torn[SLOT_HEADER + 100..].fill(0);
        assert_eq!(choose(Some(&torn), Some(&old)).unwrap().name, SlotName::B);
        // A flipped header byte too.
        let mut header = encode_slot(9, &blob("new"));
        header[9] ^= 1;
        assert_eq!(choose(Some(&old), Some(&header)).unwrap().name, SlotName::A);
    }

    #[test]
    fn no_manifest_and_both_corrupt_are_told_apart() {
        let blank = vec![0u8; SLOT_BYTES];
        assert_eq!(choose(None, None).unwrap_err(), BootMediaError::NoManifest);
        assert_eq!(
            choose(Some(&blank), None).unwrap_err(),
            BootMediaError::NoManifest
        );
        let mut bad = encode_slot(1, &blob("x"));
        bad[SLOT_HEADER] ^= 1;
        let error = choose(Some(&bad), Some(&blank)).unwrap_err();
        assert!(matches!(
            error,
            BootMediaError::BothCorrupt {
                a: SlotError::ChecksumMismatch { .. },
                b: SlotError::Blank
            }
        ));
        assert!(error
            .to_string()
            .starts_with("both manifest slots are bad: slot A: checksum mismatch"));
        let junk = vec![0x55u8; 64];
        assert!(matches!(
            choose(Some(&junk), Some(&bad)).unwrap_err(),
            BootMediaError::BothCorrupt {
                a: SlotError::BadMagic(_),
                ..
            }
        ));
    }

    #[test]
    fn a_newer_manifest_in_the_newest_slot_stops_the_boot() {
        let old = encode_slot(1, &blob("old"));
        let mut newer = blob("newer");
        newer[4..6].copy_from_slice(&(crate::binary::FORMAT_VERSION + 1).to_le_bytes());
        crate::binary::fix_checksum(&mut newer);
        let slot = encode_slot(2, &newer);
        let error = choose(Some(&old), Some(&slot)).unwrap_err();
        assert!(
            matches!(
                error,
                BootMediaError::TooNew {
                    slot: SlotName::B,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error
            .to_string()
            .contains("newer than this image understands"));
        // Older than the valid one: the valid one is in force.
        let slot = encode_slot(0, &newer);
        assert_eq!(choose(Some(&old), Some(&slot)).unwrap().name, SlotName::A);
        // A newer slot format.
        let mut format = encode_slot(5, &blob("x"));
        format[4] = 2;
        assert!(matches!(
            choose(None, Some(&format)).unwrap_err(),
            BootMediaError::TooNew {
                slot: SlotName::B,
                error: SlotError::NewerFormat(2)
            }
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        for len in [0, 1, 23, 24, 25, 100, 4096] {
            for fill in [0u8, 0xff, 0x42] {
                let mut bytes = vec![fill; len];
                if len >= 8 {
                    bytes[..4].copy_from_slice(&SLOT_MAGIC);
                    bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
                }
                let _ = choose(Some(&bytes), Some(&bytes));
            }
        }
    }
}
