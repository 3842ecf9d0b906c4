//! Access rights of a registered memory region (`AccessFlags`).
//!
//! The bit values are those of libibverbs (`IBV_ACCESS_*`), so an rdma-sys
//! provider passes [`AccessFlags::bits`] straight through. Local read access
//! is implied by registration, as in verbs.

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

/// A set of access rights, checked on every access to a region.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u8);

impl AccessFlags {
    /// No rights beyond local reads (gathering for sends).
    pub const EMPTY: Self = Self(0);
    /// The local HCA may write the region: receive buffers, RDMA READ
    /// destinations. Required by `REMOTE_WRITE`.
    pub const LOCAL_WRITE: Self = Self(1 << 0);
    /// Peers may RDMA WRITE into the region with its rkey.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// Peers may RDMA READ from the region with its rkey.
    pub const REMOTE_READ: Self = Self(1 << 2);

    const ALL: u8 = 0b111;

    /// The raw bits (libibverbs values).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Flags from raw bits, or `None` if an unknown bit is set.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !Self::ALL == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// Flags from raw bits, dropping unknown ones.
    pub const fn from_bits_truncate(bits: u8) -> Self {
        Self(bits & Self::ALL)
    }

    /// Whether every right in `other` is also in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The rights of both sets.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether no right is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the set is one verbs accepts: remote write needs local write
    /// (`ibv_reg_mr` fails with `EINVAL` otherwise).
    pub const fn is_valid(self) -> bool {
        !self.contains(Self::REMOTE_WRITE) || self.contains(Self::LOCAL_WRITE)
    }
}

impl BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for AccessFlags {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(AccessFlags, &str); 3] = [
            (AccessFlags::LOCAL_WRITE, "LOCAL_WRITE"),
            (AccessFlags::REMOTE_WRITE, "REMOTE_WRITE"),
            (AccessFlags::REMOTE_READ, "REMOTE_READ"),
        ];
        if self.is_empty() {
            return f.write_str("EMPTY");
        }
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(rw.contains(AccessFlags::REMOTE_WRITE));
        assert!(!rw.contains(AccessFlags::REMOTE_READ));
        assert!(rw.is_valid());
        assert!(!AccessFlags::REMOTE_WRITE.is_valid());
        assert_eq!(AccessFlags::from_bits(8), None);
        assert_eq!(AccessFlags::from_bits_truncate(0xff).bits(), 7);
        assert_eq!(std::format!("{rw:?}"), "LOCAL_WRITE | REMOTE_WRITE");
        assert_eq!(std::format!("{:?}", AccessFlags::EMPTY), "EMPTY");
    }
}
