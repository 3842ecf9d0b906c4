//! Process signals for the hosted daemons (`brick-target`,
//! `brick-initiatord`): SIGINT and SIGTERM set [`STOP`], SIGUSR1 sets
//! [`STATS`], SIGHUP sets [`RELOAD`]. The handlers only store to atomics
//! (async-signal-safe) and are installed without SA_RESTART, so a blocking
//! `ppoll` returns at once; the loop reads (and clears) the flags.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Stop requested (SIGINT, SIGTERM).
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Statistics requested (SIGUSR1).
pub static STATS: AtomicBool = AtomicBool::new(false);
/// Configuration reload requested (SIGHUP).
pub static RELOAD: AtomicBool = AtomicBool::new(false);

/// The signals [`install`] handles.
const HANDLED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP];

extern "C" fn on_signal(signal: libc::c_int) {
    let flag = match signal {
        libc::SIGUSR1 => &STATS,
        libc::SIGHUP => &RELOAD,
        _ => &STOP,
    };
    flag.store(true, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT, SIGTERM, SIGUSR1 and SIGHUP.
///
/// # Errors
///
/// The `sigaction` error.
pub fn install() -> io::Result<()> {
    for signal in HANDLED {
        // SAFETY: an all-zero sigaction is a valid value (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `action` is initialised; the handler only stores to atomics
        // (async-signal-safe); a null old-action pointer is allowed.
        let rc = unsafe { libc::sigaction(signal, &raw const action, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Blocks the handled signals on the calling thread, so they are delivered
/// to another thread (one whose `ppoll` they should interrupt).
pub fn block_here() {
    // SAFETY: an all-zero sigset_t is a valid (empty) set, filled by sigemptyset next.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe { libc::sigemptyset(&raw mut set) };
    for signal in HANDLED {
        // SAFETY: as above; `signal` is a valid signal number.
        unsafe { libc::sigaddset(&raw mut set, signal) };
    }
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut()) };
}
