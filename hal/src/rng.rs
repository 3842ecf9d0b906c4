//! Randomness for keys, PSNs, QPNs and ids: `Rng`.
//!
//! Sources are expected to be cryptographically strong (RDRAND or
//! virtio-rng in the image, getrandom hosted): R_Keys and start PSNs are
//! only as unguessable as this.

/// A source of random bytes.
pub trait Rng {
    /// Fills `dest` with random bytes.
    fn fill_bytes(&mut self, dest: &mut [u8]);

    /// 32 random bits.
    fn next_u32(&mut self) -> u32 {
        let mut bytes = [0; 4];
        self.fill_bytes(&mut bytes);
        u32::from_le_bytes(bytes)
    }

    /// 64 random bits.
    fn next_u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        self.fill_bytes(&mut bytes);
        u64::from_le_bytes(bytes)
    }
}

impl<R: Rng + ?Sized> Rng for &mut R {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        (**self).fill_bytes(dest);
    }
}
