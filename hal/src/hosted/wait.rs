//! Blocking until input or a deadline: `wait_ready`, `PollIdle` (ppoll(2)).
//!
//! Deadlines are on the [`MonotonicClock`] scale, like every other time in
//! the engine. ppoll's nanosecond timeout means the loop neither wakes
//! early and spins nor oversleeps a millisecond.

use std::io;
use std::os::fd::RawFd;

use super::clock::MonotonicClock;
use super::sys;
use crate::Idle;

/// Most descriptors one wait watches.
pub const MAX_WAIT_FDS: usize = 16;

/// Blocks until one of `readable` can be read (or has hung up), one of
/// `writable` can be written, or `deadline` passes (`None`: no deadline).
/// Returns whether a descriptor is ready. A signal ends the wait early
/// (`Ok(false)`).
///
/// # Errors
///
/// `InvalidInput` for more than [`MAX_WAIT_FDS`] descriptors; ppoll's error.
pub fn wait_ready(
    readable: &[RawFd],
    writable: &[RawFd],
    deadline: Option<u64>,
) -> io::Result<bool> {
    if readable.len() + writable.len() > MAX_WAIT_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors to wait on",
        ));
    }
    let empty = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    let mut fds = [empty; MAX_WAIT_FDS];
    let watched = readable
        .iter()
        .map(|&fd| (fd, libc::POLLIN))
        .chain(writable.iter().map(|&fd| (fd, libc::POLLOUT)));
    let mut count = 0;
    for (slot, (fd, events)) in fds.iter_mut().zip(watched) {
        *slot = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        count += 1;
    }
    let timeout = deadline.map(|deadline| MonotonicClock::new().until(deadline));
    Ok(sys::ppoll(&mut fds[..count], timeout)? > 0)
}

/// [`wait_ready`] for readability only.
///
/// # Errors
///
/// As [`wait_ready`].
pub fn wait_readable(fds: &[RawFd], deadline: Option<u64>) -> io::Result<bool> {
    wait_ready(fds, &[], deadline)
}

/// [`Idle`] for a hosted loop: waits on the descriptors set for this
/// iteration (the links' `raw_fd`s, and those with pending output).
#[derive(Clone, Debug, Default)]
pub struct PollIdle {
    readable: Vec<RawFd>,
    writable: Vec<RawFd>,
}

impl PollIdle {
    /// Watches nothing yet.
    pub fn new() -> Self {
        Self {
            readable: Vec::with_capacity(MAX_WAIT_FDS),
            writable: Vec::with_capacity(MAX_WAIT_FDS),
        }
    }

    /// Forgets all descriptors (call at the start of each iteration).
    pub fn clear(&mut self) {
        self.readable.clear();
        self.writable.clear();
    }

    /// Wakes when `fd` is readable.
    pub fn watch_readable(&mut self, fd: RawFd) {
        self.readable.push(fd);
    }

    /// Wakes when `fd` is writable.
    pub fn watch_writable(&mut self, fd: RawFd) {
        self.writable.push(fd);
    }
}

impl Idle for PollIdle {
    /// Waits; an error (a bad descriptor, too many) ends the wait at once,
    /// as a spurious wake-up.
    fn idle_until(&mut self, deadline: Option<u64>) {
        let _ = wait_ready(&self.readable, &self.writable, deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clock;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn deadline_and_readiness() {
        let clock = MonotonicClock::new();
        let (mut a, b) = UnixStream::pair().unwrap();
        let start = clock.now();
        assert!(!wait_readable(&[b.as_raw_fd()], Some(start + 20_000_000)).unwrap());
        assert!(clock.now() >= start + 20_000_000);
        // Writable at once, readable after a write.
        assert!(wait_ready(&[], &[a.as_raw_fd()], None).unwrap());
        a.write_all(b"x").unwrap();
        assert!(wait_readable(&[b.as_raw_fd()], None).unwrap());
        // A passed deadline does not block.
        let mut idle = PollIdle::new();
        idle.watch_readable(a.as_raw_fd());
        idle.idle_until(Some(0));
        assert!(wait_ready(&[0; MAX_WAIT_FDS + 1], &[], Some(0)).is_err());
    }
}
