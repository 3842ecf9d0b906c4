//! `OsRng`: the operating system's random source, through getrandom;
//! `PooledOsRng`: the same source read a block at a time, for the data
//! path.

use crate::Rng;

/// Random bytes from the OS (`getrandom(2)` on Linux).
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRng;

impl Rng for OsRng {
    /// # Panics
    ///
    /// If the OS has no random source at all, which `getrandom(2)` never
    /// reports on Linux (it blocks until the pool is ready instead).
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        if let Err(error) = getrandom::fill(dest) {
            panic!("OS random source failed: {error}");
        }
    }
}

/// Bytes [`PooledOsRng`] reads from the OS at a time.
pub const POOL_BYTES: usize = 256;

/// The OS random source read [`POOL_BYTES`] at a time: the memory keys a
/// software HCA draws on every IO (a fresh rkey per chunk with
/// `always_invalidate`, per registration on the initiator) then cost one
/// `getrandom(2)` per 64 keys instead of a system call each. The bytes are
/// the OS's; only their delivery is batched. Allocates nothing.
#[derive(Clone, Debug)]
pub struct PooledOsRng {
    pool: [u8; POOL_BYTES],
    /// Bytes of `pool` already handed out.
    used: usize,
}

impl PooledOsRng {
    /// An empty pool (filled on first use).
    pub const fn new() -> Self {
        Self {
            pool: [0; POOL_BYTES],
            used: POOL_BYTES,
        }
    }
}

impl Default for PooledOsRng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng for PooledOsRng {
    /// # Panics
    ///
    /// As [`OsRng`]'s.
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        let mut done = 0;
        while done < dest.len() {
            if self.used == POOL_BYTES {
                OsRng.fill_bytes(&mut self.pool);
                self.used = 0;
            }
            let n = (dest.len() - done).min(POOL_BYTES - self.used);
            dest[done..done + n].copy_from_slice(&self.pool[self.used..self.used + n]);
            // Handed out once: wipe what was given.
            self.pool[self.used..self.used + n].fill(0);
            self.used += n;
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_enough() {
        let mut rng = OsRng;
        let values: Vec<u64> = (0..8).map(|_| rng.next_u64()).collect();
        assert!(values.windows(2).any(|w| w[0] != w[1]));
        let mut bytes = [0u8; 64];
        rng.fill_bytes(&mut bytes);
        assert!(bytes.iter().any(|&b| b != 0));
    }

    #[test]
    fn the_pool_hands_out_each_byte_once_and_refills() {
        let mut rng = PooledOsRng::new();
        // Requests across the pool's edge, and one larger than the pool.
        let mut seen = Vec::new();
        for len in [4, 100, 200, 3 * POOL_BYTES, 7] {
            let mut bytes = vec![0u8; len];
            rng.fill_bytes(&mut bytes);
            seen.extend_from_slice(&bytes);
        }
        assert_eq!(seen.len(), 4 + 100 + 200 + 3 * POOL_BYTES + 7);
        // 1,079 random bytes: no run of 32 zeroes (what a missed refill
        // would hand out), and the u32s differ.
        assert!(seen.windows(32).all(|w| w.iter().any(|&b| b != 0)));
        let words: Vec<u32> = (0..64).map(|_| rng.next_u32()).collect();
        assert!(words.windows(2).any(|w| w[0] != w[1]));
    }
}
