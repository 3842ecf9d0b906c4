//! The errno values RNBD replies carry, as positive numbers.
//!
//! The RTRS response immediate carries a 9-bit errno (rnbd.md §4.5, §8.4:
//! never above 511). The values are the Linux x86-64 ones the stock client
//! interprets (`errno_to_blk_status`, or the `map_device` write's result),
//! from the one table of the `errno` crate. When RNBD sends each:
//!
//! | value | when |
//! |---|---|
//! | `EPERM` | writer limit on OPEN (§4.2 step 6), a mode upgrade on re-OPEN (§8.3 #31), a write through a read-only open (#36) |
//! | `ENOENT` | OPEN of a path that names no volume |
//! | `EIO` | generic volume failure (`BLK_STS_IOERR`) |
//! | `EAGAIN` | `BLK_STS_AGAIN` |
//! | `ENOMEM` | `BLK_STS_RESOURCE` |
//! | `EACCES` | the access list refuses the session this volume or this mode |
//! | `EEXIST` | the volume is already mapped by this session under another path (§4.2 step 7) |
//! | `EINVAL` | malformed message, wrong direction, bad sizes (§4.5) |
//! | `EMFILE` | the session's device table is full (§8.3 #39) |
//! | `ENOSPC` | `BLK_STS_NOSPC` |
//! | `EROFS` | not sent by Brick's server; mapped by the client |
//! | `EOPNOTSUPP` | unknown op, or an op the volume does not advertise (§8.3 #33, #37) |
//! | `ENOTCONN` | IO for an unknown or closed device id (§4.4 step 1, §8.3 #32) |
//! | `ETIMEDOUT` | `BLK_STS_TIMEOUT` |

pub use ::errno::{
    EACCES, EAGAIN, EEXIST, EINVAL, EIO, EMFILE, ENOENT, ENOMEM, ENOSPC, ENOTCONN, EOPNOTSUPP,
    EPERM, EROFS, ETIMEDOUT,
};

/// Success.
pub const OK: u16 = 0;
