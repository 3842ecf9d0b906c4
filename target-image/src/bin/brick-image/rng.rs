//! Randomness: RDRAND (`-cpu max` in QEMU), else a loudly weak fallback.
//!
//! [`Source::detect`] checks CPUID.1:ECX.RDRAND. Without it the image falls
//! back to a SplitMix64 stream seeded from the TSC and says so on the
//! console: R_Keys and PSNs from it are guessable, acceptable only for
//! tests. virtio-rng is the planned strong fallback.

#![allow(unsafe_code)]

use core::arch::asm;

/// Where the random bytes come from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Source {
    /// The CPU's RDRAND instruction.
    Rdrand,
    /// SplitMix64 seeded from the TSC: NOT cryptographically strong.
    WeakTsc {
        /// Generator state.
        state: u64,
    },
}

fn has_rdrand() -> bool {
    let ecx: u32;
    // SAFETY: `cpuid` leaf 1 only reads CPU identification; rbx (which
    // LLVM reserves) is saved and restored around it.
    unsafe {
        asm!(
            "mov {saved}, rbx",
            "cpuid",
            "mov rbx, {saved}",
            saved = out(reg) _,
            inout("eax") 1u32 => _,
            inout("ecx") 0u32 => ecx,
            out("edx") _,
            options(nomem, nostack, preserves_flags)
        )
    };
    ecx & (1 << 30) != 0
}

fn rdrand() -> Option<u64> {
    // Intel recommends 10 retries before declaring the DRNG failed.
    for _ in 0..10 {
        let value: u64;
        let ok: u8;
        // SAFETY: RDRAND is present (checked by `Source::detect`); it only
        // writes its output register and CF.
        unsafe {
            asm!("rdrand {value}", "setc {ok}", value = out(reg) value, ok = out(reg_byte) ok, options(nomem, nostack))
        };
        if ok == 1 {
            return Some(value);
        }
    }
    None
}

impl Source {
    /// RDRAND if the CPU has it and it answers, else the weak fallback.
    pub fn detect() -> Source {
        if has_rdrand() && rdrand().is_some() {
            Source::Rdrand
        } else {
            Source::WeakTsc {
                state: crate::clock::rdtsc() ^ 0x9e37_79b9_7f4a_7c15,
            }
        }
    }

    /// Whether the source is cryptographically strong.
    pub fn is_strong(&self) -> bool {
        matches!(self, Source::Rdrand)
    }
}

impl hal::Rng for Source {
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let word = match self {
                // A DRNG that stops answering is a hardware fault: the
                // image must not hand out predictable keys.
                Source::Rdrand => rdrand().expect("RDRAND failed 10 times in a row"),
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
