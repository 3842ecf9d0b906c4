//! Volumes as the engine sees them: a small synchronous block interface
//! ([`Volume`]) and the RAM volume.
//!
//! This is a stand-in seam: `hal::block` (the asynchronous submit/poll
//! `BlockDevice`, `RamDisk`, hosted `FileDevice`) is being written alongside
//! and will replace this trait; the engine only calls it from one place
//! (`Engine::execute`), so the swap is local. RAM completes at once, so the
//! engine answers every request in the same poll.

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use rnbd::server::IoError;

/// A block volume: byte-addressed, ranges already checked by RNBD against
/// [`Volume::len`] and the logical block size.
pub trait Volume {
    /// Capacity in bytes.
    fn len(&self) -> u64;
    /// True for a zero-sized volume (never served).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `dst.len()` bytes at `offset` into `dst`.
    ///
    /// # Errors
    /// [`IoError`] if the range is outside the volume or the media fails.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), IoError>;
    /// Writes `src` at `offset`.
    ///
    /// # Errors
    /// [`IoError`] if the range is outside the volume or the media fails.
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), IoError>;
    /// Zeroes `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`IoError`] if the range is outside the volume.
    fn write_zeroes(&mut self, offset: u64, len: u32) -> Result<(), IoError>;
    /// Makes completed writes durable.
    ///
    /// # Errors
    /// [`IoError`] if the backend fails.
    fn flush(&mut self) -> Result<(), IoError>;
}

/// A RAM volume, zeroed at construction (allocated once).
pub struct RamVolume {
    bytes: Vec<u8>,
}

impl RamVolume {
    /// A zeroed volume of `size` bytes.
    pub fn new(size: usize) -> Self {
        Self {
            bytes: vec![0; size],
        }
    }

    fn range(&self, offset: u64, len: usize) -> Result<core::ops::Range<usize>, IoError> {
        let start = usize::try_from(offset).map_err(|_| IoError::Media)?;
        let end = start.checked_add(len).ok_or(IoError::Media)?;
        if end > self.bytes.len() {
            return Err(IoError::Media);
        }
        Ok(start..end)
    }
}

impl Volume for RamVolume {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), IoError> {
        let range = self.range(offset, dst.len())?;
        dst.copy_from_slice(&self.bytes[range]);
        Ok(())
    }

    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), IoError> {
        let range = self.range(offset, src.len())?;
        self.bytes[range].copy_from_slice(src);
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u32) -> Result<(), IoError> {
        let range = self.range(offset, len as usize)?;
        self.bytes[range].fill(0);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), IoError> {
        Ok(())
    }
}
