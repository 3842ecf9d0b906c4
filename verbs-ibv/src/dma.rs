//! The registered memory's storage: one anonymous mapping made at start,
//! page-aligned and zeroed, that the HCA reads and writes by DMA for as long
//! as the device lives.

use std::io;

/// Storage the [`Arena`](verbs::memory::Arena) carves buffers from, and
/// whose buffers are registered with `ibv_reg_mr`.
pub struct DmaMemory {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned exclusively by this value; moving it to
// another thread moves that ownership (the HCA's access is governed by
// registrations, which the owning device also owns).
unsafe impl Send for DmaMemory {}

impl DmaMemory {
    /// Maps `len` bytes (rounded up to pages), zeroed and populated.
    ///
    /// # Errors
    /// The OS error of `mmap`.
    pub fn new(len: usize) -> io::Result<Self> {
        let len = len.max(1).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing touches no existing memory.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            len,
        })
    }
}

impl AsRef<[u8]> for DmaMemory {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `base..base+len` is a live mapping owned by `self`. The
        // HCA writes only into ranges that posted receives and registered
        // remote-writable buffers name, which the verbs ownership contract
        // keeps the CPU away from while the HCA owns them (verbs crate docs,
        // "Ownership returns with the completion").
        unsafe { core::slice::from_raw_parts(self.base, self.len) }
    }
}

impl AsMut<[u8]> for DmaMemory {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`; `&mut self` makes this the only CPU view.
        unsafe { core::slice::from_raw_parts_mut(self.base, self.len) }
    }
}

impl Drop for DmaMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; the device drops
        // every registration and queue pair before its memory.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_zeroed_page_aligned_and_writable() {
        let mut memory = DmaMemory::new(5000).unwrap();
        assert_eq!(memory.as_ref().len(), 8192);
        assert_eq!(memory.as_ref().as_ptr() as usize % 4096, 0);
        assert!(memory.as_ref().iter().all(|&b| b == 0));
        memory.as_mut()[8191] = 7;
        assert_eq!(memory.as_ref()[8191], 7);
    }
}
