//! The hosted system calls std lacks: ppoll(2), vectored sendto, batched
//! recvmmsg(2)/sendmmsg(2) with UDP segmentation and receive offload,
//! fallocate(2) and the block-device ioctls.
//!
//! The only `unsafe` of the crate. Each wrapper borrows everything the
//! kernel reads or writes for the duration of the call and returns
//! `io::Result`.

use std::io::{self, IoSlice};
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
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

    /// Room for the sender's address of a received datagram.
    fn blank() -> Self {
        Self::V6(libc::sockaddr_in6 {
            sin6_family: 0,
            sin6_port: 0,
            sin6_flowinfo: 0,
            sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
            sin6_scope_id: 0,
        })
    }

    /// The address the kernel wrote into a [`RawSocketAddr::blank`], `len`
    /// bytes of it (the `msg_namelen` it reported); `None` for a family
    /// other than IPv4 and IPv6, or fewer bytes than the family's address.
    fn to_socket_addr(&self, len: libc::socklen_t) -> Option<SocketAddr> {
        let Self::V6(raw) = self else {
            return None;
        };
        let len = usize::try_from(len).unwrap_or(0);
        match libc::c_int::from(raw.sin6_family) {
            libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(raw.sin6_addr.s6_addr),
                    u16::from_be(raw.sin6_port),
                    u32::from_be(raw.sin6_flowinfo),
                    raw.sin6_scope_id,
                )))
            }
            libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
                // sockaddr_in is a prefix of the sockaddr_in6 storage:
                // family, port, then the 4-byte address where sin6_flowinfo is.
                let addr = raw.sin6_flowinfo.to_ne_bytes();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(addr),
                    u16::from_be(raw.sin6_port),
                )))
            }
            _ => None,
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

/// Most datagrams one [`receive_batch`] or [`send_batch`] call moves.
pub(crate) const MAX_BATCH: usize = 64;
/// Most segments the kernel cuts one UDP GSO send into (`UDP_MAX_SEGMENTS`).
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;

/// One receive [`receive_batch`] took: its length (in its slot), sender,
/// whether it was longer than the slot (then its tail is lost) and, when
/// the kernel coalesced datagrams into it (UDP GRO), their size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) len: usize,
    pub(crate) from: Option<SocketAddr>,
    pub(crate) truncated: bool,
    /// `Some(size)`: the bytes are datagrams of `size` (the last may be
    /// shorter) that the kernel delivered as one (the `UDP_GRO` control
    /// message); `None`: they are one datagram.
    pub(crate) segment: Option<usize>,
}

/// Room for the control messages of one received datagram: the `UDP_GRO`
/// one (`CMSG_SPACE(sizeof(int))`, 24 bytes) with room to spare; the
/// `cmsghdr` field aligns it as the kernel's headers must be.
#[repr(C)]
#[derive(Clone, Copy)]
struct ReceiveControl {
    header: libc::cmsghdr,
    rest: [u8; 48],
}

/// The segment size of a `UDP_GRO` control message at `message`'s control
/// buffer, if there is one.
///
/// # Safety
///
/// `message.msg_control` points to `message.msg_controllen` readable bytes
/// (as recvmmsg left them), 8-aligned, alive for the call.
unsafe fn gro_segment(message: &libc::msghdr) -> Option<usize> {
    // SAFETY: `message` is a valid msghdr; CMSG_FIRSTHDR reads only its
    // control pointer and length and returns null or a pointer inside the
    // buffer the caller vouches for.
    let mut control = unsafe { libc::CMSG_FIRSTHDR(message) };
    while !control.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return only headers that lie
        // wholly inside the `msg_controllen` bytes the caller vouches for,
        // at CMSG_ALIGN (8-byte) offsets of an 8-aligned buffer.
        let header = unsafe { control.read() };
        if header.cmsg_level == libc::SOL_UDP && header.cmsg_type == libc::UDP_GRO {
            // SAFETY: CMSG_LEN only does arithmetic.
            let data_offset = unsafe { libc::CMSG_LEN(0) } as usize;
            let data_len = header.cmsg_len.saturating_sub(data_offset);
            let end = (control as usize)
                .saturating_add(header.cmsg_len)
                .saturating_sub(message.msg_control as usize);
            if end > message.msg_controllen {
                // The kernel cut the message short (MSG_CTRUNC).
                return None;
            }
            // SAFETY: CMSG_DATA is pointer arithmetic to the data that
            // follows the header, `data_len` bytes of which were just
            // checked to lie inside the control buffer.
            let data = unsafe { libc::CMSG_DATA(control) };
            let size = if data_len >= size_of::<libc::c_int>() {
                // SAFETY: at least 4 readable bytes at `data` (above);
                // read_unaligned needs no alignment. The kernel writes an
                // `int` gso_size.
                usize::try_from(unsafe { data.cast::<libc::c_int>().read_unaligned() }).ok()
            } else if data_len >= size_of::<u16>() {
                // SAFETY: at least 2 readable bytes at `data` (above);
                // read_unaligned needs no alignment.
                Some(usize::from(unsafe { data.cast::<u16>().read_unaligned() }))
            } else {
                None
            };
            return size.filter(|&size| size > 0);
        }
        // SAFETY: `control` is a header inside the buffer (above);
        // CMSG_NXTHDR checks the next one against `msg_controllen` and
        // returns null past the end.
        control = unsafe { libc::CMSG_NXTHDR(message, control) };
    }
    None
}

/// What the kernel writes beside the data of a [`receive_batch`]: the
/// senders' addresses and the control messages, one per receive. Kept by
/// the caller (allocated once) instead of set up on every call; the kernel
/// reports how much of each it wrote, and only that is read.
pub(crate) struct ReceiveScratch {
    names: [RawSocketAddr; MAX_BATCH],
    controls: [ReceiveControl; MAX_BATCH],
}

impl ReceiveScratch {
    pub(crate) fn new() -> Self {
        // SAFETY: cmsghdr is plain old data; all-zero is a valid value,
        // and the kernel overwrites what it uses.
        let zero_header: libc::cmsghdr = unsafe { std::mem::zeroed() };
        Self {
            names: std::array::from_fn(|_| RawSocketAddr::blank()),
            controls: [ReceiveControl {
                header: zero_header,
                rest: [0; 48],
            }; MAX_BATCH],
        }
    }
}

/// recvmmsg(2) without blocking: up to `out.len()` (at most [`MAX_BATCH`])
/// receives, the `i`-th into `buffer[i * slot_len..][..slot_len]`, its
/// length, sender and GRO segment size into `out[i]`. Returns how many
/// arrived (0 when none was waiting). A receive holds several datagrams
/// only on a socket with [`enable_udp_gro`]. Only the headers the call
/// passes are written (no zeroed arrays: a busy loop calls this on an
/// empty socket every turn).
pub(crate) fn receive_batch(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    slot_len: usize,
    out: &mut [Received],
    scratch: &mut ReceiveScratch,
) -> io::Result<usize> {
    if slot_len == 0 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut iovecs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let mut messages = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    let mut count = 0;
    for (((slot, iovec), (name, message)), control) in buffer
        .chunks_exact_mut(slot_len)
        .zip(iovecs.iter_mut())
        .zip(scratch.names.iter_mut().zip(messages.iter_mut()))
        .zip(scratch.controls.iter_mut())
        .take(out.len().min(MAX_BATCH))
    {
        let iovec = iovec.write(libc::iovec {
            iov_base: slot.as_mut_ptr().cast(),
            iov_len: slot.len(),
        });
        let (msg_name, msg_namelen) = name.as_name();
        message.write(libc::mmsghdr {
            msg_hdr: libc::msghdr {
                msg_name,
                msg_namelen,
                msg_iov: ptr::from_mut(iovec),
                msg_iovlen: 1,
                msg_control: ptr::from_mut(control).cast(),
                msg_controllen: size_of::<ReceiveControl>(),
                msg_flags: 0,
            },
            msg_len: 0,
        });
        count += 1;
    }
    let vlen = libc::c_uint::try_from(count).unwrap_or(0);
    // SAFETY: the first `vlen` entries of `messages` were written above
    // (the kernel reads no others; `MaybeUninit<mmsghdr>` has the layout
    // of `mmsghdr`); each points to one iovec covering a disjoint slot of
    // the exclusively borrowed `buffer`, to a sockaddr buffer of
    // `msg_namelen` bytes and a control buffer of `msg_controllen` bytes
    // in the exclusively borrowed `scratch`; all live on this frame or in
    // borrowed memory until the call returns. A null timeout with
    // MSG_DONTWAIT returns at once; `socket` is open.
    let got = unsafe {
        libc::recvmmsg(
            socket.as_raw_fd(),
            messages.as_mut_ptr().cast::<libc::mmsghdr>(),
            vlen,
            libc::MSG_DONTWAIT,
            ptr::null_mut(),
        )
    };
    let Ok(got) = usize::try_from(got) else {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            _ => Err(error),
        };
    };
    let got = got.min(count);
    // SAFETY: the first `count` (at least `got`) entries were initialised
    // before the call, and the kernel only updated their lengths and flags.
    let received =
        unsafe { std::slice::from_raw_parts(messages.as_ptr().cast::<libc::mmsghdr>(), got) };
    for ((slot, message), name) in out.iter_mut().zip(received).zip(&scratch.names) {
        *slot = Received {
            len: usize::try_from(message.msg_len).unwrap_or(0).min(slot_len),
            from: name.to_socket_addr(message.msg_hdr.msg_namelen),
            truncated: message.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            // SAFETY: `msg_control` points into `scratch.controls`
            // (8-aligned by its cmsghdr field), still alive, and recvmmsg
            // set `msg_controllen` to the bytes it wrote there, at most the
            // `size_of::<ReceiveControl>()` it was given.
            segment: unsafe { gro_segment(&message.msg_hdr) },
        };
    }
    Ok(got)
}

/// One datagram (or one run of equal-sized datagrams) for [`send_batch`].
pub(crate) struct Outgoing<'a> {
    /// Where it goes.
    pub(crate) to: SocketAddr,
    /// The bytes, concatenated by the kernel.
    pub(crate) buffers: &'a [IoSlice<'a>],
    /// `Some(size)`: the kernel cuts the bytes into datagrams of `size`
    /// (the last may be shorter) — UDP segmentation offload
    /// (`UDP_SEGMENT`), one pass down the stack for all of them.
    pub(crate) segment: Option<u16>,
}

/// The control message of one UDP GSO send: `cmsghdr` then the `u16`
/// segment size, padded to `CMSG_SPACE(2)`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentControl {
    header: libc::cmsghdr,
    size: u16,
    pad: [u8; 6],
}

/// sendmmsg(2) of `messages` (at most [`MAX_BATCH`]) without blocking.
/// Returns how many were sent, in order; a send that would block is
/// `WouldBlock` only when none was sent. Only the entries sent are set up
/// (a flush of one ACK does not fill 64 headers).
pub(crate) fn send_batch(socket: BorrowedFd<'_>, messages: &[Outgoing<'_>]) -> io::Result<usize> {
    let count = messages.len().min(MAX_BATCH);
    let mut names = [const { MaybeUninit::<RawSocketAddr>::uninit() }; MAX_BATCH];
    let mut controls = [const { MaybeUninit::<SegmentControl>::uninit() }; MAX_BATCH];
    let mut headers = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    // SAFETY: cmsghdr is plain old data; all-zero is a valid value (its
    // fields are set next).
    let mut segment_header: libc::cmsghdr = unsafe { std::mem::zeroed() };
    segment_header.cmsg_len = size_of::<libc::cmsghdr>() + size_of::<u16>();
    segment_header.cmsg_level = libc::SOL_UDP;
    segment_header.cmsg_type = libc::UDP_SEGMENT;
    for (((message, name), control), header) in messages
        .iter()
        .zip(names.iter_mut())
        .zip(controls.iter_mut())
        .zip(headers.iter_mut())
        .take(count)
    {
        let (msg_name, msg_namelen) = name.write(RawSocketAddr::new(&message.to)).as_name();
        let (msg_control, msg_controllen) = match message.segment {
            Some(size) => {
                let control = control.write(SegmentControl {
                    header: segment_header,
                    size,
                    pad: [0; 6],
                });
                (
                    ptr::from_mut(control).cast::<libc::c_void>(),
                    size_of::<SegmentControl>(),
                )
            }
            None => (ptr::null_mut(), 0),
        };
        header.write(libc::mmsghdr {
            msg_hdr: libc::msghdr {
                msg_name,
                msg_namelen,
                // std documents IoSlice as ABI-compatible with iovec on
                // Unix; sendmmsg only reads through this pointer.
                msg_iov: message.buffers.as_ptr().cast::<libc::iovec>().cast_mut(),
                msg_iovlen: message.buffers.len(),
                msg_control,
                msg_controllen,
                msg_flags: 0,
            },
            msg_len: 0,
        });
    }
    let vlen = libc::c_uint::try_from(count).unwrap_or(0);
    // SAFETY: the first `vlen` entries of `headers` were written above
    // (the kernel reads no others); each points to a sockaddr of
    // `msg_namelen` bytes in `names`, to the borrowed IoSlices of its
    // message (iovec-compatible, their memory borrowed) and, for a GSO
    // send, to one `SegmentControl` of `msg_controllen` bytes (a cmsghdr
    // with its u16 at CMSG_DATA: the header is 16 bytes, 8-aligned) in
    // `controls`; all alive until the call returns; the kernel writes only
    // `msg_len`. `MaybeUninit<mmsghdr>` has the layout of `mmsghdr`.
    // `socket` is an open descriptor borrowed for the call.
    let sent = unsafe {
        libc::sendmmsg(
            socket.as_raw_fd(),
            headers.as_mut_ptr().cast::<libc::mmsghdr>(),
            vlen,
            libc::MSG_DONTWAIT,
        )
    };
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

/// Turns UDP receive offload on (`UDP_GRO`): the kernel may deliver a
/// run of datagrams from one sender as one receive, their size in a
/// control message that [`receive_batch`] reads into
/// [`Received::segment`].
///
/// # Errors
///
/// The setsockopt error (`ENOPROTOOPT` before Linux 5.0).
pub(crate) fn enable_udp_gro(socket: BorrowedFd<'_>) -> io::Result<()> {
    set_int_option(socket, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Turns UDP receive offload off again: every receive is one datagram.
///
/// # Errors
///
/// The setsockopt error.
pub(crate) fn disable_udp_gro(socket: BorrowedFd<'_>) -> io::Result<()> {
    set_int_option(socket, libc::SOL_UDP, libc::UDP_GRO, 0)
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
