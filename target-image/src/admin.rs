//! The hosted admin plane, engine side (docs/ADMIN.md): the exchange
//! through which the admin thread (HTTP, `brick-target`'s `admin.rs`)
//! asks the engine thread for a rendered snapshot, and what the hosted
//! engine renders: `/metrics` and a thin volume's extent list as JSON.
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

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::io::{self, Read, Write as _};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use hal::block::Either;
use manifest::binary::Manifest;

use crate::hosted::HostedVolume;
use crate::hosted_thin::HostedThin;
use crate::metrics::family;
use crate::{Engine, FixedText, Port, RamOr, ThinGauges};

/// What the admin thread asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminRequest {
    /// Every metric (`GET /metrics`).
    Metrics,
    /// Volume `index`'s allocated extents (`GET /volumes/NAME/extents`).
    Extents(usize),
}

/// How the engine answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAnswer {
    /// The text is complete.
    Done,
    /// The text did not fit the snapshot buffer.
    Overflow,
    /// The volume is not thin: it has no extents.
    NotThin,
    /// No such volume.
    NoVolume,
}

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

/// Bytes of the snapshot buffer for `manifest`: room for every metric
/// with every session and path open, and for long extent lists.
pub fn snapshot_capacity(manifest: &Manifest<'_>) -> usize {
    let limits = manifest.limits();
    let sessions = usize::try_from(limits.max_sessions).unwrap_or(usize::MAX) * 2;
    let paths = usize::from(limits.max_paths_per_session).min(8);
    (1 << 20) + manifest.volume_count() * (8 << 10) + sessions * ((4 << 10) + paths * (2 << 10))
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
            slot.text.clear();
            let answer = match request {
                AdminRequest::Metrics => write_all_metrics(engine, &self.shared, &mut slot.text),
                AdminRequest::Extents(index) => write_extents(engine, index, &mut slot.text),
            };
            slot.answer = match answer {
                Ok(answer) => answer,
                Err(fmt::Error) => AdminAnswer::Overflow,
            };
            slot.generation += 1;
        }
        self.shared.wanted.store(false, Ordering::Release);
        self.shared.done.notify_all();
        false
    }
}

/// A hosted volume's thin gauges (`None`: not thin).
pub fn thin_gauges(volume: &HostedVolume) -> Option<ThinGauges> {
    let thin = as_thin(volume)?;
    let pool = thin.pool();
    Some(ThinGauges {
        allocated_extents: u64::from(thin.allocated()),
        pool_extents: u64::from(pool.extent_count()),
        pool_free_extents: u64::from(pool.free_extents()),
        pool_enospc: pool.stats().enospc,
    })
}

fn as_thin(volume: &HostedVolume) -> Option<&HostedThin> {
    match volume {
        RamOr::Device(Either::Right(thin)) => Some(thin),
        _ => None,
    }
}

fn write_all_metrics<P: Port>(
    engine: &Engine<'_, P, HostedVolume>,
    shared: &Shared,
    out: &mut FixedText,
) -> Result<AdminAnswer, fmt::Error> {
    engine.write_metrics(out, &thin_gauges)?;
    let name = "brick_admin_connections_refused_total";
    family(
        out,
        name,
        "counter",
        "Admin connections closed at accept: source not allowed.",
    )?;
    writeln!(out, "{name} {}", shared.refused.load(Ordering::Relaxed))?;
    let name = "brick_admin_requests_total";
    family(
        out,
        name,
        "counter",
        "Admin requests the engine was asked to answer.",
    )?;
    writeln!(out, "{name} {}", shared.requests.load(Ordering::Relaxed))?;
    Ok(AdminAnswer::Done)
}

/// Volume `index`'s allocated extents as JSON ranges of consecutive
/// virtual extents (see docs/ADMIN.md), or why there are none.
fn write_extents<P: Port>(
    engine: &Engine<'_, P, HostedVolume>,
    index: usize,
    out: &mut FixedText,
) -> Result<AdminAnswer, fmt::Error> {
    let Some(volume) = engine.volume(index) else {
        return Ok(AdminAnswer::NoVolume);
    };
    let name = engine.manifest().volume(index).map_or("", |v| v.name);
    let Some(thin) = as_thin(volume) else {
        write!(
            out,
            "{{\"error\":\"volume {} is not thin: it has no extents\"}}",
            Json(name)
        )?;
        return Ok(AdminAnswer::NotThin);
    };
    let pool = thin.pool();
    let size = u64::from(pool.extent_size());
    write!(
        out,
        "{{\"volume\":\"{}\",\"extent_size\":{size},\"allocated_extents\":{},\"pool_extents\":{},\"pool_free_extents\":{},\"ranges\":[",
        Json(name),
        thin.allocated(),
        pool.extent_count(),
        pool.free_extents()
    )?;
    let mut result = Ok(());
    let mut first = true;
    let mut run: Option<(u32, u32)> = None;
    let emit = |out: &mut FixedText, (start, count): (u32, u32), first: &mut bool| {
        let comma = if core::mem::take(first) { "" } else { "," };
        write!(
            out,
            "{comma}{{\"first_extent\":{start},\"extents\":{count},\"offset\":{},\"length\":{}}}",
            u64::from(start) * size,
            u64::from(count) * size
        )
    };
    thin.extents(|virtual_extent, _| {
        match run {
            Some((start, count)) if start + count == virtual_extent => {
                run = Some((start, count + 1));
                return;
            }
            Some(done) if result.is_ok() => result = emit(out, done, &mut first),
            _ => {}
        }
        run = Some((virtual_extent, 1));
    });
    result?;
    if let Some(done) = run {
        emit(out, done, &mut first)?;
    }
    out.write_str("]}")?;
    Ok(AdminAnswer::Done)
}

/// A JSON string's contents, escaped.
struct Json<'a>(&'a str);

impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The JSON error body `{"error":"..."}` for `message`.
pub fn json_error(message: &str) -> String {
    format!("{{\"error\":\"{}\"}}", Json(message))
}
