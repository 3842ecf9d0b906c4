//! The Linux x86-64 errno values Brick's protocols carry, with their names.
//!
//! RTRS CM rejects and response immediates, RNBD replies and the NBD
//! export's replies all carry errno numbers as the Linux peer reads them
//! (`errno_to_blk_status`, the `map_device` write's result, the NBD spec's
//! error values, which are the same numbers); block devices report them
//! from their completions. This crate is the one table: every layer names
//! the values from here, and [`name`] turns a number into its symbol for
//! logs and error messages. What each value *means* in a protocol is said
//! where the protocol decides it (e.g. `rnbd::server`'s status table).
//!
//! The values are positive; a layer that sends a negative errno (RTRS's
//! CON_RSP, a CM REJ's private data) negates at its boundary.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The number of an errno: Linux x86-64 values, positive.
pub type Errno = u16;

macro_rules! errno_table {
    ($($(#[$doc:meta])* $name:ident = $value:literal,)*) => {
        $($(#[$doc])* pub const $name: Errno = $value;)*

        /// The symbol of `value` (`"EINVAL"`), if it is one this table names.
        pub const fn name(value: Errno) -> Option<&'static str> {
            match value {
                $($value => Some(stringify!($name)),)*
                _ => None,
            }
        }

        /// Every value of the table, in order (for exhaustive tests).
        pub const ALL: &[Errno] = &[$($value),*];
    };
}

errno_table! {
    /// Operation not permitted.
    EPERM = 1,
    /// No such file or directory.
    ENOENT = 2,
    /// Input/output error.
    EIO = 5,
    /// No such device or address.
    ENXIO = 6,
    /// Resource temporarily unavailable.
    EAGAIN = 11,
    /// Cannot allocate memory.
    ENOMEM = 12,
    /// Permission denied.
    EACCES = 13,
    /// Bad address.
    EFAULT = 14,
    /// File exists.
    EEXIST = 17,
    /// Invalid argument.
    EINVAL = 22,
    /// Too many open files.
    EMFILE = 24,
    /// No space left on device.
    ENOSPC = 28,
    /// Read-only file system.
    EROFS = 30,
    /// Value too large for defined data type.
    EOVERFLOW = 75,
    /// Operation not supported.
    EOPNOTSUPP = 95,
    /// Software caused connection abort.
    ECONNABORTED = 103,
    /// Connection reset by peer.
    ECONNRESET = 104,
    /// Transport endpoint is not connected.
    ENOTCONN = 107,
    /// Cannot send after transport endpoint shutdown.
    ESHUTDOWN = 108,
    /// Connection timed out.
    ETIMEDOUT = 110,
}

/// Writes `value` as its symbol, or as `errno N` when the table has none.
pub struct Display(pub Errno);

impl core::fmt::Display for Display {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match name(self.0) {
            Some(symbol) => f.write_str(symbol),
            None => write!(f, "errno {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn test_names_and_values_are_linux_x86_64() {
        // Spot checks against the kernel's include/uapi/asm-generic/errno*.h.
        assert_eq!(
            (EPERM, EIO, ENOMEM, EINVAL, ENOTCONN, ETIMEDOUT),
            (1, 5, 12, 22, 107, 110)
        );
        assert_eq!(name(EINVAL), Some("EINVAL"));
        assert_eq!(name(999), None);
        assert_eq!(Display(ENOSPC).to_string(), "ENOSPC");
        assert_eq!(Display(300).to_string(), "errno 300");
    }

    #[test]
    fn test_table_is_sorted_and_unique() {
        assert!(ALL.windows(2).all(|pair| pair[0] < pair[1]));
        for &value in ALL {
            assert!(name(value).is_some());
        }
    }
}
