//! The hosted admin plane, engine side (docs/ADMIN.md): the exchange
//! through which the admin thread (HTTP, `brick-target`'s `admin.rs`)
//! asks the engine thread for a rendered snapshot (what is rendered is
//! `admin_render`'s, shared with the image; the HTTP is `admin_http`'s).
//!
//! The engine thread never blocks on the admin thread and allocates
//! nothing for it after start: the admin thread posts one request in a
//! mutex-guarded slot, raises a flag and writes a byte to a socket the
//! engine's idle wait watches; once per loop turn the engine looks at the
//! flag, *tries* the lock (if the admin thread holds it, the next turn
//! tries again), renders into the slot's [`FixedText`] (allocated once,
//! never grown: a snapshot that does not fit is answered as such) and
//! wakes the admin thread through a condition variable. Sockets, parsing,
//! copying the text out and writing it to the peer are the admin
//! thread's; at most one snapshot is rendered per loop turn.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::io::{self, Read, Write as _};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use hal::block::Either;

use crate::admin_render::{render, AdminCounters};
pub use crate::admin_render::{snapshot_capacity, AdminAnswer, AdminRequest};
use crate::hosted::HostedVolume;
use crate::hosted_thin::HostedThin;
use crate::{Engine, FixedText, Port, RamOr, ThinGauges};

struct Slot {
    request: Option<AdminRequest>,
    generation: u64,
    answer: AdminAnswer,
    text: FixedText,
}

struct Shared {
    wanted: AtomicBool,
    slot: Mutex<Slot>,
    done: Condvar,
    refused: AtomicU64,
    requests: AtomicU64,
    wake: UnixStream,
}

/// The engine thread's end: [`serve`](Self::serve) once per loop turn,
/// [`fd`](Self::fd) among the descriptors its idle wait watches.
pub struct AdminEngine {
    shared: Arc<Shared>,
    wake: UnixStream,
}

/// The admin thread's end.
#[derive(Clone)]
pub struct AdminClient {
    shared: Arc<Shared>,
}

/// The two ends of the exchange, with a snapshot buffer of `capacity`
/// bytes (allocated here, once).
///
/// # Errors
/// The wake-up socket pair's.
pub fn admin_exchange(capacity: usize) -> io::Result<(AdminEngine, AdminClient)> {
    let (tx, rx) = UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        wanted: AtomicBool::new(false),
        slot: Mutex::new(Slot {
            request: None,
            generation: 0,
            answer: AdminAnswer::Done,
            text: FixedText::with_capacity(capacity),
        }),
        done: Condvar::new(),
        refused: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        wake: tx,
    });
    Ok((
        AdminEngine {
            shared: Arc::clone(&shared),
            wake: rx,
        },
        AdminClient { shared },
    ))
}

impl AdminClient {
    /// Asks the engine for `request` and waits up to `timeout` for the
    /// answer: its kind and text. `None` if the engine did not answer in
    /// time.
    pub fn ask(&self, request: AdminRequest, timeout: Duration) -> Option<(AdminAnswer, Vec<u8>)> {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        let mut slot = self.shared.slot.lock().ok()?;
        slot.request = Some(request);
        let asked = slot.generation;
        drop(slot);
        self.shared.wanted.store(true, Ordering::Release);
        // A full socket already holds a wake-up.
        let _ = (&self.shared.wake).write(&[1]);
        let slot = self.shared.slot.lock().ok()?;
        let (slot, _) = self
            .shared
            .done
            .wait_timeout_while(slot, timeout, |slot| slot.generation == asked)
            .ok()?;
        (slot.generation != asked).then(|| (slot.answer, slot.text.as_bytes().to_vec()))
    }

    /// Counts a connection refused at accept (its source is not allowed).
    pub fn count_refused(&self) {
        self.shared.refused.fetch_add(1, Ordering::Relaxed);
    }
}

impl AdminEngine {
    /// The descriptor that becomes readable when the admin thread asks.
    pub fn fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Answers the admin thread's request, if any: at most one render.
    /// Returns whether a request is still waiting (the admin thread held
    /// the lock): poll again without sleeping.
    pub fn serve<P: Port>(&self, engine: &Engine<'_, P, HostedVolume>) -> bool {
        if !self.shared.wanted.load(Ordering::Acquire) {
            return false;
        }
        let mut drain = [0u8; 64];
        while matches!((&self.wake).read(&mut drain), Ok(n) if n > 0) {}
        let Ok(mut slot) = self.shared.slot.try_lock() else {
            return true;
        };
        let slot = &mut *slot;
        if let Some(request) = slot.request.take() {
            let counters = AdminCounters {
                refused: self.shared.refused.load(Ordering::Relaxed),
                requests: self.shared.requests.load(Ordering::Relaxed),
            };
            slot.answer = render(engine, request, &as_thin, counters, &mut slot.text);
            slot.generation += 1;
        }
        self.shared.wanted.store(false, Ordering::Release);
        self.shared.done.notify_all();
        false
    }
}

/// A hosted volume's thin gauges (`None`: not thin).
pub fn thin_gauges(volume: &HostedVolume) -> Option<ThinGauges> {
    as_thin(volume).map(crate::admin_render::thin_gauges)
}

fn as_thin(volume: &HostedVolume) -> Option<&HostedThin> {
    match volume {
        RamOr::Device(Either::Right(thin)) => Some(thin),
        _ => None,
    }
}
