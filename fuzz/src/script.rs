//! A fuzz input read as a script of small operations.
//!
//! Every read succeeds: past the end of the input a reader yields zeroes
//! and [`Script::done`] turns true, so a target's loop ends there.

/// A cursor over the fuzz input.
pub struct Script<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Script<'a> {
    /// A script over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// True once every byte was read.
    pub fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A number in `0..n` (`n > 0`) from one byte.
    pub fn below(&mut self, n: u8) -> u8 {
        self.u8() % n
    }

    /// Up to `max` bytes, the count given by the next byte (fewer at the
    /// end of the input).
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let want = usize::from(self.u8()).min(max);
        self.take(want)
    }

    /// The next `len` bytes (fewer at the end of the input).
    pub fn take(&mut self, len: usize) -> &'a [u8] {
        let start = self.at.min(self.bytes.len());
        let end = (start + len).min(self.bytes.len());
        self.at = start + len;
        &self.bytes[start..end]
    }
}
