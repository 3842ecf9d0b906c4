//! The pool device's buffer handles: a piece of a caller's buffer, or one
//! of the pool's own metadata buffers.

use alloc::vec::Vec;
use core::marker::PhantomData;

use hal::block::{BufferAccess, BufferError};

/// A buffer as the pool device sees it. The pool device of a thin volume
/// is a `BlockDevice<PoolBuf<H>>` where `H` is the thin volume's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolBuf<H> {
    /// The caller's buffer `handle`, from byte `skip` on (a request that
    /// spans two extents goes to the pool as two pieces).
    Caller {
        /// The caller's handle.
        handle: H,
        /// Bytes of the caller's buffer before this piece.
        skip: u32,
    },
    /// The pool's metadata buffer with this index (map and superblock
    /// writes, reads at open).
    Meta(u16),
}

/// Resolves [`PoolBuf`]s: caller pieces through the caller's access,
/// metadata buffers from the pool's own.
pub(crate) struct Resolve<'a, H, A: ?Sized> {
    pub(crate) caller: &'a mut A,
    pub(crate) meta: &'a mut [Vec<u8>],
    pub(crate) handle: PhantomData<H>,
}

impl<'a, H, A: ?Sized> Resolve<'a, H, A> {
    pub(crate) fn new(caller: &'a mut A, meta: &'a mut [Vec<u8>]) -> Self {
        Self {
            caller,
            meta,
            handle: PhantomData,
        }
    }
}

impl<H: Copy, A: BufferAccess<H> + ?Sized> BufferAccess<PoolBuf<H>> for Resolve<'_, H, A> {
    fn with_slice<R>(
        &self,
        buffer: PoolBuf<H>,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        match buffer {
            PoolBuf::Caller { handle, skip } => {
                let total = skip.checked_add(len).ok_or(BufferError::TooShort)?;
                self.caller
                    .with_slice(handle, total, |bytes| f(&bytes[skip as usize..]))
            }
            PoolBuf::Meta(index) => {
                let bytes = self
                    .meta
                    .get(usize::from(index))
                    .ok_or(BufferError::Stale)?;
                Ok(f(bytes.get(..len as usize).ok_or(BufferError::TooShort)?))
            }
        }
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: PoolBuf<H>,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        match buffer {
            PoolBuf::Caller { handle, skip } => {
                let total = skip.checked_add(len).ok_or(BufferError::TooShort)?;
                self.caller
                    .with_slice_mut(handle, total, |bytes| f(&mut bytes[skip as usize..]))
            }
            PoolBuf::Meta(index) => {
                let bytes = self
                    .meta
                    .get_mut(usize::from(index))
                    .ok_or(BufferError::Stale)?;
                Ok(f(bytes
                    .get_mut(..len as usize)
                    .ok_or(BufferError::TooShort)?))
            }
        }
    }

    /// A caller piece is at the caller buffer's address plus `skip`
    /// (buffers are contiguous); metadata buffers are bounced.
    fn dma_address(&self, buffer: PoolBuf<H>, len: u32) -> Option<u64> {
        match buffer {
            PoolBuf::Caller { handle, skip } => self
                .caller
                .dma_address(handle, skip.checked_add(len)?)
                .map(|address| address + u64::from(skip)),
            PoolBuf::Meta(_) => None,
        }
    }
}

/// No caller buffers: for the pool's own IO at open.
pub(crate) struct NoCaller;

impl<H> BufferAccess<H> for NoCaller {
    fn with_slice<R>(&self, _: H, _: u32, _: impl FnOnce(&[u8]) -> R) -> Result<R, BufferError> {
        Err(BufferError::Stale)
    }

    fn with_slice_mut<R>(
        &mut self,
        _: H,
        _: u32,
        _: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        Err(BufferError::Stale)
    }
}
