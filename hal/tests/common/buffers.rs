//! The caller's buffers for the block-device tests: handle = index into a
//! list of byte vectors, with the checked access `BufferAccess` asks for.

use hal::block::{BufferAccess, BufferError};

/// The caller's buffers: handle = index.
pub struct Buffers(pub Vec<Vec<u8>>);

impl Buffers {
    /// `count` zeroed buffers of `len` bytes.
    #[allow(dead_code)] // not every test binary builds its buffers this way
    pub fn new(count: usize, len: usize) -> Self {
        Self(vec![vec![0; len]; count])
    }
}

impl BufferAccess<usize> for Buffers {
    fn with_slice<R>(
        &self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        let buffer = self.0.get(buffer).ok_or(BufferError::Stale)?;
        Ok(f(buffer
            .get(..len as usize)
            .ok_or(BufferError::TooShort)?))
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        let buffer = self.0.get_mut(buffer).ok_or(BufferError::Stale)?;
        Ok(f(buffer
            .get_mut(..len as usize)
            .ok_or(BufferError::TooShort)?))
    }
}
