//! The [`Manifest`] reader itself: the record and section-table plumbing,
//! the header checks of [`Manifest::parse`], string references, and the
//! one pass over every record that makes the accessors infallible.

use super::{
    admin, error_name, field, pools, section, volumes::same_backing, Backing, ReadError,
    FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_SECTIONS, MIN_FORMAT_VERSION, SECTION_ENTRY_LEN,
};
use crate::types::{TextError, MAX_ACCESS_RULES, MAX_INTERFACES, MAX_VOLUMES};

/// A fixed-length record; every accessor is bounds-checked and never panics
/// (a short slice reads as zeros, which parse never hands out).
#[derive(Clone, Copy)]
pub(super) struct Record<'a>(&'a [u8]);

impl<'a> Record<'a> {
    pub(super) fn array<const N: usize>(&self, offset: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(bytes) = offset
            .checked_add(N)
            .and_then(|end| self.0.get(offset..end))
        {
            out.copy_from_slice(bytes);
        }
        out
    }
    pub(super) fn u8(&self, offset: usize) -> u8 {
        self.0.get(offset).copied().unwrap_or(0)
    }
    pub(super) fn u16(&self, offset: usize) -> u16 {
        u16::from_le_bytes(self.array(offset))
    }
    pub(super) fn u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.array(offset))
    }
    pub(super) fn u64(&self, offset: usize) -> u64 {
        u64::from_le_bytes(self.array(offset))
    }
    /// A string reference: `offset: u32, len: u32` into the string section.
    pub(super) fn str_ref(&self, offset: usize) -> (u32, u32) {
        (self.u32(offset), self.u32(offset + 4))
    }
}

/// One section's place in the blob.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Span {
    pub(super) offset: usize,
    pub(super) count: usize,
    pub(super) record_len: usize,
}

/// A checked binary manifest borrowing its blob.
#[derive(Clone, Copy, Debug)]
pub struct Manifest<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) target: Span,
    pub(super) limits: Span,
    pub(super) interfaces: Span,
    pub(super) volumes: Span,
    pub(super) rules: Span,
    pub(super) rule_volumes: Span,
    pub(super) strings: Span,
    /// Empty before format version 4.
    pub(super) pools: Span,
    pub(super) admin: Span,
}

fn read_u16(bytes: &[u8], range: core::ops::Range<usize>) -> u16 {
    Record(bytes).u16(range.start)
}

fn read_u32(bytes: &[u8], range: core::ops::Range<usize>) -> u32 {
    Record(bytes).u32(range.start)
}

/// CRC-32 of every byte except the CRC field.
pub(super) fn checksum(blob: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(blob.get(..field::CRC.start).unwrap_or(&[]));
    hasher.update(blob.get(field::CRC.end..).unwrap_or(&[]));
    hasher.finalize()
}

impl<'a> Manifest<'a> {
    /// Checks `bytes` completely and returns the reader.
    ///
    /// # Errors
    ///
    /// The first broken rule, in this order: length, magic, version, total
    /// length, checksum, reserved fields, section table, limits, strings,
    /// target, interfaces, volumes, access rules.
    ///
    /// # Fuzzing
    ///
    /// Under `cfg(fuzzing)` a checksum mismatch is ignored, so fuzzers reach
    /// the section and record checks instead of stopping at the CRC.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ReadError> {
        if bytes.len() < field::TOTAL_LEN.end {
            return Err(ReadError::Truncated {
                needed: HEADER_LEN,
                found: bytes.len(),
            });
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[field::MAGIC]);
        if magic != MAGIC {
            return Err(ReadError::BadMagic(magic));
        }
        let version = read_u16(bytes, field::VERSION);
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(ReadError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let total_len = read_u32(bytes, field::TOTAL_LEN);
        let total = usize::try_from(total_len).unwrap_or(usize::MAX);
        if bytes.len() < HEADER_LEN || bytes.len() < total {
            return Err(ReadError::Truncated {
                needed: total.max(HEADER_LEN),
                found: bytes.len(),
            });
        }
        if bytes.len() != total {
            return Err(ReadError::LengthMismatch {
                header: total_len,
                actual: bytes.len(),
            });
        }
        let expected = read_u32(bytes, field::CRC);
        let found = checksum(bytes);
        if expected != found && !cfg!(fuzzing) {
            return Err(ReadError::ChecksumMismatch { expected, found });
        }
        if read_u16(bytes, field::FLAGS) != 0 {
            return Err(ReadError::ReservedNotZero("header flags"));
        }
        if bytes[field::RESERVED].iter().any(|&b| b != 0) {
            return Err(ReadError::ReservedNotZero("header bytes"));
        }
        let mut manifest = Self::read_sections(bytes)?;
        manifest.check_records()?;
        Ok(manifest)
    }

    fn read_sections(bytes: &'a [u8]) -> Result<Self, ReadError> {
        let version = read_u16(bytes, field::VERSION);
        let section_count = read_u16(bytes, field::SECTION_COUNT);
        if section_count > MAX_SECTIONS {
            return Err(ReadError::TooManySections(section_count));
        }
        let table_end = HEADER_LEN + usize::from(section_count) * SECTION_ENTRY_LEN;
        let table = bytes
            .get(HEADER_LEN..table_end)
            .ok_or(ReadError::SectionOutOfBounds("section table"))?;
        let mut spans: [Option<Span>; 9] = [None; 9];
        for entry in table.chunks_exact(SECTION_ENTRY_LEN) {
            let entry = Record(entry);
            let id = entry.u16(0);
            let expected =
                section::record_len_in(id, version).ok_or(ReadError::UnknownSection(id))?;
            let name = section::name(id);
            let record_len = entry.u16(2);
            if record_len != expected {
                return Err(ReadError::BadRecordLength {
                    section: name,
                    found: record_len,
                    expected,
                });
            }
            let count = usize::try_from(entry.u32(4)).unwrap_or(usize::MAX);
            let offset = usize::try_from(entry.u32(8)).unwrap_or(usize::MAX);
            let end = count
                .checked_mul(usize::from(record_len))
                .and_then(|len| len.checked_add(offset));
            match end {
                Some(end) if offset >= table_end && end <= bytes.len() => {}
                _ => return Err(ReadError::SectionOutOfBounds(name)),
            }
            let slot = &mut spans[usize::from(id - 1)];
            if slot.is_some() {
                return Err(ReadError::DuplicateSection(name));
            }
            *slot = Some(Span {
                offset,
                count,
                record_len: usize::from(record_len),
            });
        }
        let mut get = |id: u16| {
            spans[usize::from(id - 1)]
                .take()
                .ok_or(ReadError::MissingSection(section::name(id)))
        };
        Ok(Manifest {
            bytes,
            target: get(section::TARGET)?,
            limits: get(section::LIMITS)?,
            interfaces: get(section::INTERFACES)?,
            volumes: get(section::VOLUMES)?,
            rules: get(section::ACCESS_RULES)?,
            rule_volumes: get(section::ACCESS_VOLUMES)?,
            strings: get(section::STRINGS)?,
            pools: if version >= pools::POOLS_VERSION {
                get(section::POOLS)?
            } else {
                Span::default()
            },
            admin: if version >= admin::ADMIN_VERSION {
                get(section::ADMIN)?
            } else {
                Span::default()
            },
        })
    }

    /// The blob's format version ([`MIN_FORMAT_VERSION`]..=[`FORMAT_VERSION`]).
    pub fn version(&self) -> u16 {
        read_u16(self.bytes, field::VERSION)
    }

    pub(super) fn record(&self, span: Span, index: usize) -> Record<'a> {
        let start = span.offset + index * span.record_len;
        Record(
            self.bytes
                .get(start..start + span.record_len)
                .unwrap_or(&[]),
        )
    }

    pub(super) fn count_in(span: Span, id: u16, min: usize, max: usize) -> Result<(), ReadError> {
        if span.count < min || span.count > max {
            return Err(ReadError::BadCount {
                section: section::name(id),
                count: u32::try_from(span.count).unwrap_or(u32::MAX),
                min: min as u32,
                max: max as u32,
            });
        }
        Ok(())
    }

    /// A string from the string section, checked for bounds, UTF-8 and NUL.
    fn string(&self, (offset, len): (u32, u32), field: &'static str) -> Result<&'a str, ReadError> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(len)
            .filter(|&end| end <= self.strings.count)
            .and_then(|end| {
                self.bytes
                    .get(self.strings.offset + start..self.strings.offset + end)
            })
            .ok_or(ReadError::StringOutOfBounds(field))?;
        let text = core::str::from_utf8(bytes).map_err(|_| ReadError::StringNotUtf8(field))?;
        if text.contains('\0') {
            return Err(ReadError::StringHasNul(field));
        }
        Ok(text)
    }

    pub(super) fn checked_text(
        &self,
        reference: (u32, u32),
        field: &'static str,
        rule: fn(&str) -> Result<(), TextError>,
    ) -> Result<&'a str, ReadError> {
        let text = self.string(reference, field)?;
        rule(text).map_err(|error| ReadError::BadText {
            field,
            text: error_name(text),
            error,
        })?;
        Ok(text)
    }

    fn check_records(&mut self) -> Result<(), ReadError> {
        Self::count_in(self.target, section::TARGET, 1, 1)?;
        Self::count_in(self.limits, section::LIMITS, 1, 1)?;
        Self::count_in(self.interfaces, section::INTERFACES, 1, MAX_INTERFACES)?;
        Self::count_in(self.volumes, section::VOLUMES, 1, MAX_VOLUMES)?;
        Self::count_in(self.rules, section::ACCESS_RULES, 1, MAX_ACCESS_RULES)?;
        Self::count_in(
            self.rule_volumes,
            section::ACCESS_VOLUMES,
            0,
            MAX_ACCESS_RULES * MAX_VOLUMES,
        )?;
        self.decode_limits()?
            .check()
            .map_err(ReadError::BadLimits)?;
        self.decode_target()?;
        for i in 0..self.interfaces.count {
            let interface = self.decode_interface(i)?;
            for j in 0..i {
                let other = self.decode_interface(j)?;
                let name = || error_name(interface.name);
                if other.name == interface.name {
                    return Err(ReadError::DuplicateInterface(name()));
                }
                if other.mac == interface.mac {
                    return Err(ReadError::DuplicateMac(name()));
                }
                if other.address.address == interface.address.address {
                    return Err(ReadError::DuplicateAddress(name()));
                }
            }
        }
        self.check_pools()?;
        self.check_admin()?;
        let mut ram: u64 = 0;
        for i in 0..self.volumes.count {
            let volume = self.decode_volume(i)?;
            if let Backing::Ram { size } = volume.backing {
                ram = ram.checked_add(size).ok_or(ReadError::RamOverflow)?;
            }
            for j in 0..i {
                let other = self.decode_volume(j)?;
                if other.name == volume.name {
                    return Err(ReadError::DuplicateVolume(error_name(volume.name)));
                }
                if other.device_path == volume.device_path {
                    return Err(ReadError::DuplicateDevicePath(error_name(
                        volume.device_path,
                    )));
                }
                if same_backing(&other.backing, &volume.backing) {
                    return Err(ReadError::DuplicateBacking(error_name(volume.name)));
                }
            }
        }
        self.check_pool_users()?;
        for i in 0..self.rules.count {
            self.decode_rule(i)?;
        }
        Ok(())
    }

    /// The whole blob.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}
