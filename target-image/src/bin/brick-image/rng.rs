//! Randomness: RDRAND (`-cpu max` in QEMU), else a loudly weak fallback.
//!
//! [`Source::detect`] checks CPUID.1:ECX.RDRAND. Without it the image falls
//! back to a SplitMix64 stream seeded from the TSC and says so on the
//! console: R_Keys and PSNs from it are guessable, acceptable only for
//! tests. virtio-rng is the planned strong fallback.

use x86_64::instructions::random::RdRand;

/// Where the random bytes come from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// The CPU's RDRAND instruction.
    Rdrand(RdRand),
    /// SplitMix64 seeded from the TSC: NOT cryptographically strong.
    WeakTsc {
        /// Generator state.
        state: u64,
    },
}

/// One RDRAND value (the `x86_64` crate's `RdRand`, which checked CPUID),
/// retried as Intel recommends: 10 times before declaring the DRNG failed.
fn rdrand(rdrand: RdRand) -> Option<u64> {
    (0..10).find_map(|_| rdrand.get_u64())
}

impl Source {
    /// RDRAND if the CPU has it and it answers, else the weak fallback.
    pub fn detect() -> Source {
        if let Some(source) = RdRand::new().filter(|r| rdrand(*r).is_some()) {
            Source::Rdrand(source)
        } else {
            Source::WeakTsc {
                state: crate::clock::rdtsc() ^ 0x9e37_79b9_7f4a_7c15,
            }
        }
    }

    /// Whether the source is cryptographically strong.
    pub fn is_strong(&self) -> bool {
        matches!(self, Source::Rdrand(_))
    }
}

impl hal::Rng for Source {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let word = match self {
                // A DRNG that stops answering is a hardware fault: the
                // image must not hand out predictable keys.
                Source::Rdrand(source) => rdrand(*source).expect("RDRAND failed 10 times in a row"),
                Source::WeakTsc { state } => {
                    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = *state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                }
            };
            chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
        }
    }
}
