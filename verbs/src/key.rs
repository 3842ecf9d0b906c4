//! Memory keys: the local `Lkey` and remote `Rkey` of a registered region.
//!
//! Both keys use the layout real HCAs use (and Linux rxe, `rxe_mr.c`): a
//! 24-bit index that names the region in the provider's table, shifted left
//! by 8, ORed with an 8-bit variant. A key is valid only while it equals the
//! region's current key exactly, so a stale key (after invalidation,
//! re-keying or deregistration) fails the lookup even though its index still
//! names a live region.
//!
//! Keys come from a caller-supplied [`KeySource`], so the provider decides
//! how unpredictable they are (a CSPRNG hosted, RDRAND in the image).

use core::fmt;

macro_rules! key_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            /// Builds a key from its 24-bit index and 8-bit variant.
            ///
            /// Index bits above 24 are dropped.
            pub const fn from_parts(index: u32, variant: u8) -> Self {
                Self(((index & 0x00ff_ffff) << 8) | variant as u32)
            }

            /// The 24-bit index part (bits 31..8).
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }

            /// The 8-bit variant part (bits 7..0).
            pub const fn variant(self) -> u8 {
                // Truncation is the point: the variant is the low byte.
                (self.0 & 0xff) as u8
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}

key_type!(
    /// Local key: names registered memory in this host's own scatter-gather
    /// entries. Stable from registration until deregistration.
    Lkey
);

key_type!(
    /// Remote key: lets a peer RDMA READ/WRITE a registered region, subject
    /// to its access flags. Changes on every re-key; invalidation (LOCAL_INV,
    /// SEND_WITH_INV) makes it stop working.
    Rkey
);

/// Source of randomness for new keys (`next_u32`), supplied by the caller on
/// each registration or re-key.
///
/// A provider passes its HAL random source here; tests pass a seeded
/// generator. Key unpredictability is only as good as this source.
pub trait KeySource {
    /// Returns the next 32 random bits.
    fn next_u32(&mut self) -> u32;
}

impl<K: KeySource + ?Sized> KeySource for &mut K {
    fn next_u32(&mut self) -> u32 {
        (**self).next_u32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let key = Rkey::from_parts(0x12_3456, 0x78);
        assert_eq!(key, Rkey(0x1234_5678));
        assert_eq!(key.index(), 0x12_3456);
        assert_eq!(key.variant(), 0x78);
        assert_eq!(Lkey::from_parts(0xff12_3456, 1).index(), 0x12_3456);
    }

    #[test]
    fn display_is_hex() {
        assert_eq!(std::format!("{}", Lkey(0x100)), "0x00000100");
    }
}
