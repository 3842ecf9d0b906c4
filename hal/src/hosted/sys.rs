//! The hosted system calls std lacks: ppoll(2), vectored sendto, fallocate(2)
//! and the block-device ioctls.
//!
//! The only `unsafe` of the crate. Each wrapper borrows everything the
//! kernel reads or writes for the duration of the call and returns
//! `io::Result`.

use std::io::{self, IoSlice};
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::time::Duration;

/// ppoll(2) on `fds`; `None` waits without timeout. Returns the number of
/// entries with events (0 on timeout); `EINTR` counts as 0.
pub(crate) fn ppoll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let timespec = timeout.map(|timeout| libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    });
    let timespec_ptr = timespec.as_ref().map_or(ptr::null(), ptr::from_ref);
    let count = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fds` is an exclusively borrowed array of `count` initialised
    // pollfd entries; `timespec_ptr` is null or points to `timespec`, alive
    // until the call returns; a null signal mask leaves the mask unchanged.
    let ready = unsafe { libc::ppoll(fds.as_mut_ptr(), count, timespec_ptr, ptr::null()) };
    if ready >= 0 {
        return Ok(usize::try_from(ready).unwrap_or(0));
    }
    let error = io::Error::last_os_error();
    if error.kind() == io::ErrorKind::Interrupted {
        Ok(0)
    } else {
        Err(error)
    }
}

/// A socket address in the C layout sendmsg(2) takes.
enum RawSocketAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawSocketAddr {
    fn new(addr: &SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(v4) => Self::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(v6) => Self::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            }),
        }
    }

    /// Pointer and length for `msg_name` / `msg_namelen`.
    fn as_name(&mut self) -> (*mut libc::c_void, libc::socklen_t) {
        match self {
            Self::V4(v4) => (
                ptr::from_mut(v4).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            Self::V6(v6) => (
                ptr::from_mut(v6).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

/// sendmsg(2) of the concatenation of `buffers` as one datagram to `to`,
/// without copying them together first. Returns the bytes sent.
pub(crate) fn send_to_vectored(
    socket: BorrowedFd<'_>,
    to: &SocketAddr,
    buffers: &[IoSlice<'_>],
) -> io::Result<usize> {
    let mut name = RawSocketAddr::new(to);
    let (msg_name, msg_namelen) = name.as_name();
    let message = libc::msghdr {
        msg_name,
        msg_namelen,
        // std documents IoSlice as ABI-compatible with iovec on Unix;
        // sendmsg only reads through this pointer.
        msg_iov: buffers.as_ptr().cast::<libc::iovec>().cast_mut(),
        msg_iovlen: buffers.len(),
        msg_control: ptr::null_mut(),
        msg_controllen: 0,
        msg_flags: 0,
    };
    // SAFETY: `message` points to `name` (a sockaddr of `msg_namelen`
    // bytes) and to `buffers` (`msg_iovlen` iovec-compatible IoSlices whose
    // memory is borrowed), all alive until the call returns; `socket` is an
    // open descriptor borrowed for the call.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), ptr::from_ref(&message), 0) };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

/// `BLKDISCARD`: `_IO(0x12, 119)`, argument `u64[2]` = {start, length}.
const BLKDISCARD: libc::Ioctl = 0x1277;
/// `BLKZEROOUT`: `_IO(0x12, 127)`, argument `u64[2]` = {start, length}.
const BLKZEROOUT: libc::Ioctl = 0x127f;

/// fallocate(2) with `mode` on `len` bytes at `offset` of `file`.
pub(crate) fn fallocate(
    file: BorrowedFd<'_>,
    mode: libc::c_int,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: fallocate takes only integers; `file` is an open descriptor
    // borrowed for the call.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A block-device range ioctl (`BLKDISCARD`, `BLKZEROOUT`).
fn block_range_ioctl(
    device: BorrowedFd<'_>,
    request: libc::Ioctl,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: both requests read a `u64[2]` through the pointer, which
    // points to `range`, alive until the call returns; `device` is an open
    // descriptor borrowed for the call.
    let result = unsafe { libc::ioctl(device.as_raw_fd(), request, range.as_ptr()) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `BLKDISCARD` of `len` bytes at `offset` of a block device.
pub(crate) fn block_discard(device: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    block_range_ioctl(device, BLKDISCARD, offset, len)
}

/// `BLKZEROOUT` of `len` bytes at `offset` of a block device.
pub(crate) fn block_zero_out(device: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    block_range_ioctl(device, BLKZEROOUT, offset, len)
}

/// A block device's logical (`BLKSSZGET`) or physical (`BLKPBSZGET`)
/// block size.
fn block_size_ioctl(device: BorrowedFd<'_>, request: libc::Ioctl) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: both requests write one `int` through the pointer, which
    // points to `size`, exclusively borrowed until the call returns;
    // `device` is an open descriptor borrowed for the call.
    let result = unsafe { libc::ioctl(device.as_raw_fd(), request, ptr::from_mut(&mut size)) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A block device's logical and physical block sizes.
pub(crate) fn block_sizes(device: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    Ok((
        block_size_ioctl(device, libc::BLKSSZGET)?,
        block_size_ioctl(device, libc::BLKPBSZGET)?,
    ))
}

/// Sets an `int` socket option.
fn set_int_option(
    socket: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is one `int` read through the pointer, which
    // points to `value` for the duration of the call with its exact size;
    // `socket` is an open descriptor borrowed for the call.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            ptr::from_ref(&value).cast::<libc::c_void>(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads an `int` socket option.
fn int_option(socket: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one `int`) through the
    // value pointer, which points to `value`, and updates `len`; both are
    // exclusively borrowed until the call returns; `socket` is open.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            name,
            ptr::from_mut(&mut value).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// Asks for `bytes` of socket receive and send buffer: `SO_RCVBUF` /
/// `SO_SNDBUF`, then the `…FORCE` variants (root) if the system limit
/// capped them. Returns the effective sizes (the kernel reports double the
/// request, its bookkeeping included).
pub(crate) fn set_socket_buffers(
    socket: BorrowedFd<'_>,
    bytes: usize,
) -> io::Result<(usize, usize)> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let mut sizes = [0usize; 2];
    for (slot, (normal, force)) in sizes.iter_mut().zip([
        (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
        (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
    ]) {
        set_int_option(socket, libc::SOL_SOCKET, normal, want)?;
        if int_option(socket, libc::SOL_SOCKET, normal)? < want {
            // Without CAP_NET_ADMIN this fails and the capped size stays.
            let _ = set_int_option(socket, libc::SOL_SOCKET, force, want);
        }
        *slot = usize::try_from(int_option(socket, libc::SOL_SOCKET, normal)?).unwrap_or(0);
    }
    Ok((sizes[0], sizes[1]))
}

/// The effective socket receive and send buffer sizes.
pub(crate) fn socket_buffers(socket: BorrowedFd<'_>) -> io::Result<(usize, usize)> {
    let get =
        |name| int_option(socket, libc::SOL_SOCKET, name).map(|v| usize::try_from(v).unwrap_or(0));
    Ok((get(libc::SO_RCVBUF)?, get(libc::SO_SNDBUF)?))
}
