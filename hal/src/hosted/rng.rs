//! `OsRng`: the operating system's random source, through getrandom.

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
}
