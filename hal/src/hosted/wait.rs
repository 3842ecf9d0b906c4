//! Blocking until input or a deadline: `wait_ready`, `PollIdle` (ppoll(2)).
//!
//! Deadlines are on the [`MonotonicClock`] scale, like every other time in
//! the engine. ppoll's nanosecond timeout means the loop neither wakes
//! early and spins nor oversleeps a millisecond.

use std::io;
use std::os::fd::RawFd;

use super::clock::MonotonicClock;
use super::sys;
use super::Link;
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

/// Longest wait while a link has no descriptor (a listening frame link
/// whose peer is not connected): the loop looks for the peer this often.
pub const NAP_NS: u64 = 10_000_000;

/// [`Idle`] for a hosted loop: waits on the descriptors set for this
/// iteration (the links' descriptors, for output too where some is
/// pending, and the volumes' completion descriptors). Any number of
/// descriptors; the list keeps its capacity, so a loop that watches the
/// same set each time allocates nothing after its first wait.
#[derive(Clone, Debug, Default)]
pub struct PollIdle {
    fds: Vec<libc::pollfd>,
    /// A watched link had no descriptor: wait [`NAP_NS`] at most.
    nap: bool,
}

impl PollIdle {
    /// Watches nothing yet.
    pub fn new() -> Self {
        Self {
            fds: Vec::with_capacity(MAX_WAIT_FDS),
            nap: false,
        }
    }

    /// Forgets all descriptors (call at the start of each iteration).
    pub fn clear(&mut self) {
        self.fds.clear();
        self.nap = false;
    }

    fn watch(&mut self, fd: RawFd, events: libc::c_short) {
        self.fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
    }

    /// Wakes when `fd` is readable.
    pub fn watch_readable(&mut self, fd: RawFd) {
        self.watch(fd, libc::POLLIN);
    }

    /// Wakes when `fd` is writable.
    pub fn watch_writable(&mut self, fd: RawFd) {
        self.watch(fd, libc::POLLOUT);
    }

    /// Wakes when `link` has input, or can take its pending output; a link
    /// without a descriptor shortens the wait to [`NAP_NS`].
    pub fn watch_link(&mut self, link: &Link) {
        match link.raw_fd() {
            Some(fd) if link.has_pending_output() => self.watch(fd, libc::POLLIN | libc::POLLOUT),
            Some(fd) => self.watch(fd, libc::POLLIN),
            None => self.nap = true,
        }
    }

    /// Blocks until a watched descriptor is ready or `deadline` passes;
    /// returns whether one is ready. A signal ends the wait early.
    ///
    /// # Errors
    ///
    /// ppoll's error.
    pub fn wait(&mut self, deadline: Option<u64>) -> io::Result<bool> {
        let clock = MonotonicClock::new();
        let mut timeout = deadline.map(|deadline| clock.until(deadline));
        if self.nap {
            let nap = std::time::Duration::from_nanos(NAP_NS);
            timeout = Some(timeout.map_or(nap, |t| t.min(nap)));
        }
        if self.fds.is_empty() {
            if let Some(timeout) = timeout {
                std::thread::sleep(timeout);
            }
            return Ok(false);
        }
        Ok(sys::ppoll(&mut self.fds, timeout)? > 0)
    }
}

impl Idle for PollIdle {
    /// Waits; an error (a bad descriptor) ends the wait at once, as a
    /// spurious wake-up.
    fn idle_until(&mut self, deadline: Option<u64>) {
        let _ = self.wait(deadline);
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

    #[test]
    fn poll_idle_watches_more_than_wait_ready_and_wakes_on_input() {
        let clock = MonotonicClock::new();
        let pairs: Vec<(UnixStream, UnixStream)> = (0..MAX_WAIT_FDS + 4)
            .map(|_| UnixStream::pair().unwrap())
            .collect();
        let mut idle = PollIdle::new();
        for (_, b) in &pairs {
            idle.watch_readable(b.as_raw_fd());
        }
        let start = clock.now();
        assert!(!idle.wait(Some(start + 5_000_000)).unwrap());
        assert!(clock.now() >= start + 5_000_000);
        (&pairs[MAX_WAIT_FDS + 2].0).write_all(b"x").unwrap();
        assert!(idle.wait(None).unwrap());
        // Nothing watched: a nap until the deadline, not a hang.
        idle.clear();
        let start = clock.now();
        assert!(!idle.wait(Some(start + 2_000_000)).unwrap());
        assert!(clock.now() >= start + 2_000_000);
    }
}
