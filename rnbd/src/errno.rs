//! The errno values RNBD replies carry, as positive numbers.
//!
//! The RTRS response immediate carries a 9-bit errno (rnbd.md §4.5, §8.4:
//! never above 511). These are the Linux x86-64 values the stock client
//! interprets (`errno_to_blk_status`, or the `map_device` write's result).

/// Success.
pub const OK: u16 = 0;
/// Operation not permitted: writer limit on OPEN (§4.2 step 6), a mode
/// upgrade on re-OPEN (§8.3 #31), a write through a read-only open (#36).
pub const EPERM: u16 = 1;
/// No such file or directory: OPEN of a path that names no volume.
pub const ENOENT: u16 = 2;
/// I/O error: generic volume failure (`BLK_STS_IOERR`).
pub const EIO: u16 = 5;
/// Try again (`BLK_STS_AGAIN`).
pub const EAGAIN: u16 = 11;
/// Out of memory (`BLK_STS_RESOURCE`).
pub const ENOMEM: u16 = 12;
/// Permission denied: the access list refuses the session this volume or
/// this mode.
pub const EACCES: u16 = 13;
/// File exists: the volume is already mapped by this session under another
/// path (§4.2 step 7).
pub const EEXIST: u16 = 17;
/// Invalid argument: malformed message, wrong direction, bad sizes (§4.5).
pub const EINVAL: u16 = crate::wire::EINVAL;
/// Too many open files: the session's device table is full (§8.3 #39).
pub const EMFILE: u16 = 24;
/// No space left on device (`BLK_STS_NOSPC`).
pub const ENOSPC: u16 = 28;
/// Read-only file system (not sent by Brick's server; mapped by the client).
pub const EROFS: u16 = 30;
/// Operation not supported: unknown op, or an op the volume does not
/// advertise (§8.3 #33, #37).
pub const EOPNOTSUPP: u16 = crate::wire::EOPNOTSUPP;
/// Transport endpoint is not connected: IO for an unknown or closed device
/// id (§4.4 step 1, §8.3 #32).
pub const ENOTCONN: u16 = 107;
/// Connection timed out (`BLK_STS_TIMEOUT`).
pub const ETIMEDOUT: u16 = 110;
