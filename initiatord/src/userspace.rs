//! Userspace volumes: Brick's own initiator, exported as an NBD device.
//!
//! Where the kernel has no `rnbd_client` (or it is unwanted), a volume with
//! `export = "nbd:…"` and `link = "udp:…"` (see `config`) is mapped by the
//! daemon itself with `initiator::hosted` and served by the [`crate::nbd`]
//! server, so `nbd-client`, `qemu-img` or `qemu-io` can use it.
//!
//! One thread per export ([`Exports`] starts, stops and restarts them as
//! the config changes). Each thread owns its RTRS session (the hosted
//! session is single-threaded) and loops:
//!
//! 1. no session: connect and open the volume; on failure retry with
//!    exponential backoff ([`Tuning::backoff_min`] doubling to
//!    [`Tuning::backoff_max`]), logging each attempt's reason;
//! 2. once the volume's size is known, bind the listener (a unix socket,
//!    a stale socket file replaced; or loopback TCP);
//! 3. accept a client and serve it to its end. Clients are served one at a
//!    time: a second client waits in the listen backlog until the first
//!    disconnects (the session is single-threaded, and NBD clients such as
//!    qemu open one connection);
//! 4. between clients, and while a client is silent, run the session's
//!    loop (heartbeats, path reconnects).
//!
//! The initiator reconnects paths and re-opens the volume by itself after a
//! target restart. A failure it cannot hide (the link socket failed, a
//! blocking IO timed out, the volume could not be re-opened, it was closed)
//! drops the session; IO fails with `EIO` until the next connect attempt
//! succeeds (tried from the next request or idle moment the backoff
//! allows). Stopping an export closes its listener, removes its unix
//! socket file and closes the session on the target (so its name is free
//! at once for the next run).
//!
//! [`Exports::status`] reports, per export, the address, whether the
//! session is connected, connections, bytes and errors.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use initiator::hosted::{Error as HostedError, Session, SessionSpec, Volume as HostedVolume};
use initiator::{Event, IoError};

use crate::config::{AccessMode, Address, Config, ExportAddress, NbdExport, Volume};
use crate::nbd::{BackendError, Counters, Ending, Idle, NbdBackend, Server};

/// A sink for log lines (the daemon prefixes `brick-initiatord: `).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// How long a silent client's socket read waits before the session's loop
/// runs (and the stop flag is looked at).
pub const CLIENT_POLL: Duration = Duration::from_millis(100);
/// How long a reply may wait for a client that does not read.
pub const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the session's loop runs between two looks at the listener.
pub const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Timing of the export threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// How long a connect attempt waits for the session.
    pub connect_timeout: Duration,
    /// Wait after the first failed attempt.
    pub backoff_min: Duration,
    /// Longest wait between attempts.
    pub backoff_max: Duration,
}

impl Default for Tuning {
    /// 3 s per connect attempt (a session over a working network is up in
    /// milliseconds; the bound is how long stopping or restarting an
    /// export may wait for an attempt in progress), backoff 1 s to 30 s.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// One export as [`Exports::status`] reports it (a part of the daemon's
/// `status` reply).
pub use control::ExportStatus;

/// What the thread of an export shares with [`Exports`].
#[derive(Default)]
struct Shared {
    counters: Arc<Counters>,
    listening: AtomicBool,
    session_connected: AtomicBool,
    client_connected: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    fn set_error(&self, error: String) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error);
        }
    }
}

/// A running export thread.
struct Running {
    volume: Volume,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What [`Exports::apply`] did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ApplySummary {
    /// Exports started (new in the config).
    pub started: Vec<String>,
    /// Exports stopped (gone from the config).
    pub stopped: Vec<String>,
    /// Exports restarted (settings changed).
    pub restarted: Vec<String>,
}

impl ApplySummary {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.started.is_empty() && self.stopped.is_empty() && self.restarted.is_empty()
    }
}

/// The export threads of the userspace volumes in force.
pub struct Exports {
    running: Vec<Running>,
    log: Log,
    tuning: Tuning,
}

impl fmt::Debug for Exports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .running
            .iter()
            .map(|r| r.volume.name.as_str())
            .collect();
        f.debug_struct("Exports").field("running", &names).finish()
    }
}

impl Exports {
    /// No exports yet; `log` receives one line per action with its reason.
    pub fn new(log: Log, tuning: Tuning) -> Self {
        Self {
            running: Vec::new(),
            log,
            tuning,
        }
    }

    /// Whether no export runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Makes the running exports those of `config`'s userspace volumes:
    /// stops the removed ones, restarts the changed ones (any setting
    /// but the config line), starts the new ones. Cheap when nothing
    /// changed, so it may run on every pass.
    pub fn apply(&mut self, config: &Config) -> ApplySummary {
        let mut summary = ApplySummary::default();
        let wanted: Vec<&Volume> = config.userspace_volumes().collect();
        // Stop first: a changed export may keep its address or link.
        let mut stopping = Vec::new();
        let mut kept = Vec::new();
        for running in self.running.drain(..) {
            match wanted.iter().find(|v| v.name == running.volume.name) {
                Some(volume) if volume.same_settings(&running.volume) => kept.push(running),
                Some(_) => {
                    (self.log)(&format!(
                        "export {}: settings changed in the config; restarting it",
                        running.volume.name
                    ));
                    summary.restarted.push(running.volume.name.clone());
                    stopping.push(running);
                }
                None => {
                    (self.log)(&format!(
                        "export {}: no longer in the config; stopping it",
                        running.volume.name
                    ));
                    summary.stopped.push(running.volume.name.clone());
                    stopping.push(running);
                }
            }
        }
        stop_and_join(stopping);
        self.running = kept;
        for volume in wanted {
            if self.running.iter().any(|r| r.volume.name == volume.name) {
                continue;
            }
            if !summary.restarted.contains(&volume.name) {
                summary.started.push(volume.name.clone());
            }
            if let Some(running) = self.start(volume) {
                self.running.push(running);
            }
        }
        summary
    }

    fn start(&self, volume: &Volume) -> Option<Running> {
        let export = volume.export.clone()?;
        (self.log)(&format!(
            "export {}: starting: {} of session {:?} over {} to {}, served at {} ({})",
            volume.name,
            volume.device_path,
            volume.session,
            export.link,
            targets(volume)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            export.address,
            volume.access_mode,
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::default());
        let (worker_volume, tuning) = (volume.clone(), self.tuning);
        let (worker_stop, worker_shared, log) = (
            Arc::clone(&stop),
            Arc::clone(&shared),
            Arc::clone(&self.log),
        );
        // The session is single-threaded (not `Send`): the worker, which
        // will own it, is built on its thread.
        let thread = std::thread::Builder::new()
            .name(format!("nbd-{}", volume.name))
            .spawn(move || {
                Worker {
                    volume: worker_volume,
                    export,
                    mapping: None,
                    geometry: None,
                    next_attempt: Instant::now(),
                    backoff: tuning.backoff_min,
                    tuning,
                    stop: worker_stop,
                    shared: worker_shared,
                    log,
                }
                .run()
            });
        match thread {
            Ok(thread) => Some(Running {
                volume: volume.clone(),
                stop,
                shared,
                thread: Some(thread),
            }),
            Err(e) => {
                (self.log)(&format!(
                    "export {}: cannot start its thread: {e}",
                    volume.name
                ));
                None
            }
        }
    }

    /// Stops every export: listeners closed, unix socket files removed,
    /// sessions closed. Waits for the threads.
    pub fn stop_all(&mut self) {
        let all: Vec<Running> = self.running.drain(..).collect();
        for running in &all {
            (self.log)(&format!("export {}: stopping", running.volume.name));
        }
        stop_and_join(all);
    }

    /// Each export's address, session state and counters, in config order.
    pub fn status(&self) -> Vec<ExportStatus> {
        self.running
            .iter()
            .map(|running| {
                let shared = &running.shared;
                let counters = &shared.counters;
                ExportStatus {
                    name: running.volume.name.clone(),
                    address: running
                        .volume
                        .export
                        .as_ref()
                        .map(|e| e.address.to_string())
                        .unwrap_or_default(),
                    listening: shared.listening.load(Ordering::Relaxed),
                    session_connected: shared.session_connected.load(Ordering::Relaxed),
                    client_connected: shared.client_connected.load(Ordering::Relaxed),
                    connections: counters.connections.load(Ordering::Relaxed),
                    requests: counters.requests.load(Ordering::Relaxed),
                    bytes_read: counters.bytes_read.load(Ordering::Relaxed),
                    bytes_written: counters.bytes_written.load(Ordering::Relaxed),
                    errors: counters.errors.load(Ordering::Relaxed),
                    last_error: shared.last_error.lock().ok().and_then(|e| e.clone()),
                }
            })
            .collect()
    }
}

impl Drop for Exports {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Raises every stop flag, then waits for the threads (they stop in
/// parallel).
fn stop_and_join(running: Vec<Running>) {
    for r in &running {
        r.stop.store(true, Ordering::SeqCst);
    }
    for mut r in running {
        if let Some(thread) = r.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The RTRS addresses of a userspace volume (IPv4 targets, the config's
/// port; the config refuses anything else).
fn targets(volume: &Volume) -> Vec<SocketAddr> {
    volume
        .paths
        .iter()
        .filter_map(|path| match path.target {
            Address::Ip(ip) => Some(SocketAddr::new(ip, volume.port)),
            Address::Gid(_) => None,
        })
        .collect()
}

/// The session and the open volume.
struct Mapping {
    session: Session,
    volume: HostedVolume,
}

/// A bound NBD listener.
enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// An accepted client.
enum Client {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(buf),
            Self::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.write(buf),
            Self::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.flush(),
            Self::Tcp(s) => s.flush(),
        }
    }
}

impl Listener {
    /// Binds `address` (non-blocking). A unix socket file nobody answers
    /// on (a previous run's) is replaced; one in use is refused.
    fn bind(address: &ExportAddress) -> io::Result<Listener> {
        match address {
            ExportAddress::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(io::Error::new(
                            ErrorKind::AlreadyExists,
                            "exists and is not a socket; not replacing it",
                        ));
                    }
                    if UnixStream::connect(path).is_ok() {
                        return Err(io::Error::new(
                            ErrorKind::AddrInUse,
                            "another process serves this socket",
                        ));
                    }
                    std::fs::remove_file(path)?;
                }
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let listener = UnixListener::bind(path)?;
                listener.set_nonblocking(true)?;
                Ok(Listener::Unix(listener, path.clone()))
            }
            ExportAddress::Tcp(address) => {
                let listener = TcpListener::bind(address)?;
                listener.set_nonblocking(true)?;
                Ok(Listener::Tcp(listener))
            }
        }
    }

    /// A waiting client, set up for serving (blocking, with the poll read
    /// timeout); `None` if nobody waits.
    fn accept(&self) -> io::Result<Option<(Client, String)>> {
        let accepted = match self {
            Listener::Unix(listener, _) => listener
                .accept()
                .map(|(stream, _)| (Client::Unix(stream), "a unix socket client".to_owned())),
            Listener::Tcp(listener) => listener.accept().map(|(stream, peer)| {
                let _ = stream.set_nodelay(true);
                (Client::Tcp(stream), peer.to_string())
            }),
        };
        let (client, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        match &client {
            Client::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(CLIENT_POLL))?;
                s.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT))?;
            }
            Client::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(CLIENT_POLL))?;
                s.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT))?;
            }
        }
        Ok(Some((client, peer)))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The thread of one export; also the NBD backend.
struct Worker {
    volume: Volume,
    export: NbdExport,
    mapping: Option<Mapping>,
    /// Size and block size of the last open (the listener waits for it).
    geometry: Option<(u64, u32)>,
    next_attempt: Instant,
    backoff: Duration,
    tuning: Tuning,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    log: Log,
}

/// Whether `error` means the session must be rebuilt (the initiator
/// could not hide the failure).
fn session_lost(error: &HostedError) -> bool {
    matches!(
        error,
        HostedError::LinkFailed(_)
            | HostedError::Timeout { .. }
            | HostedError::Io(IoError::VolumeLost(_) | IoError::Closed)
    )
}

impl Worker {
    fn log(&self, line: &str) {
        (self.log)(&format!("export {}: {line}", self.volume.name));
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn run(mut self) {
        let mut listener: Option<Listener> = None;
        let mut bind_retry = Instant::now();
        // Allocated once, on the first client (the request buffer).
        let mut server: Option<Server> = None;
        while !self.stopping() {
            if self.mapping.is_none() {
                self.try_connect();
            }
            if listener.is_none() && self.geometry.is_some() && Instant::now() >= bind_retry {
                match Listener::bind(&self.export.address) {
                    Ok(bound) => {
                        self.log(&format!("listening on {}", self.export.address));
                        self.shared.listening.store(true, Ordering::Relaxed);
                        listener = Some(bound);
                    }
                    Err(e) => {
                        let message = format!("cannot listen on {}: {e}", self.export.address);
                        self.log(&format!("{message}; retrying in 5s"));
                        self.shared.set_error(message);
                        bind_retry = Instant::now() + Duration::from_secs(5);
                    }
                }
            }
            if let Some(bound) = &listener {
                match bound.accept() {
                    Ok(Some((mut client, peer))) => {
                        let server = server.get_or_insert_with(|| {
                            Server::new(&self.volume.name, Arc::clone(&self.shared.counters))
                        });
                        self.serve(server, &mut client, &peer);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.log(&format!("accept failed: {e}"));
                        std::thread::sleep(ACCEPT_POLL);
                    }
                }
            }
            self.run_session(ACCEPT_POLL);
        }
        if listener.take().is_some() {
            self.shared.listening.store(false, Ordering::Relaxed);
            self.log(&format!("stopped listening on {}", self.export.address));
        }
        self.disconnect("the export is stopping");
    }

    fn serve(&mut self, server: &mut Server, client: &mut Client, peer: &str) {
        self.log(&format!("client connected ({peer})"));
        self.shared.client_connected.store(true, Ordering::Relaxed);
        let before_errors = self.shared.counters.errors.load(Ordering::Relaxed);
        let result = server.serve(client, self);
        self.shared.client_connected.store(false, Ordering::Relaxed);
        let errors = self.shared.counters.errors.load(Ordering::Relaxed) - before_errors;
        let how = match result {
            Ok(Ending::Disconnected) => "client disconnected (NBD_CMD_DISC)".to_owned(),
            Ok(Ending::Aborted) => "client aborted the handshake".to_owned(),
            Ok(Ending::ClientClosed) => "client closed the connection".to_owned(),
            Ok(Ending::UnknownExport) => {
                "client asked for another export name; connection closed".to_owned()
            }
            Ok(Ending::Stopped) => "connection closed: the export is stopping".to_owned(),
            Err(e) => format!("connection closed: {e}"),
        };
        self.log(&format!("{how} ({errors} request(s) failed)"));
    }

    /// Runs the session's loop for `duration` (or sleeps without one).
    fn run_session(&mut self, duration: Duration) {
        let result = match &self.mapping {
            Some(mapping) => mapping.session.run_for(duration),
            None => {
                std::thread::sleep(duration.min(ACCEPT_POLL));
                return;
            }
        };
        match result {
            Ok(()) => {
                self.log_events();
                let ready = self.mapping.as_ref().is_some_and(|m| m.session.is_ready());
                self.shared
                    .session_connected
                    .store(ready, Ordering::Relaxed);
            }
            Err(e) => self.lose_session(&e),
        }
    }

    /// Logs what the initiator did on its own (paths lost and re-made,
    /// the volume re-opened), with its reasons.
    fn log_events(&mut self) {
        let Some(mapping) = &self.mapping else {
            return;
        };
        let events = mapping.session.take_events();
        let paths = targets(&self.volume);
        let path = |index: u16| {
            paths.get(usize::from(index)).map_or_else(
                || format!("path {index}"),
                |a| format!("path {index} ({a})"),
            )
        };
        for event in events {
            let line = match event {
                Event::SessionUp { reconnected: true } => "session reconnected".to_owned(),
                Event::SessionDown => {
                    "session down (every path lost); IO is held while the initiator reconnects"
                        .to_owned()
                }
                Event::PathUp { path: index } => format!("{} up", path(index)),
                Event::PathDown {
                    path: index,
                    reason,
                } => format!("{} down: {reason:?}", path(index)),
                Event::PathConnectFailed {
                    path: index,
                    reason,
                } => format!(
                    "{} connect failed: {reason:?}; retried by the initiator",
                    path(index)
                ),
                Event::Reopened { info, .. } => {
                    self.geometry = Some((info.size, info.logical_block_size));
                    format!(
                        "volume re-opened after a reconnect: {} bytes, block size {}",
                        info.size, info.logical_block_size
                    )
                }
                Event::ReopenFailed { error, .. } => {
                    format!("the volume could not be re-opened after a reconnect: {error}")
                }
                _ => continue,
            };
            self.log(&line);
        }
    }

    /// Connects and opens the volume if the backoff allows.
    fn try_connect(&mut self) {
        if Instant::now() < self.next_attempt || self.stopping() {
            return;
        }
        let paths = targets(&self.volume);
        let mut spec = SessionSpec::new(&self.volume.session, self.export.link.clone(), paths);
        if let Some(local) = self.export.local {
            spec.local_ip = local;
        }
        spec.connect_timeout = self.tuning.connect_timeout;
        let wanted_paths = u16::try_from(spec.paths.len()).unwrap_or(u16::MAX);
        spec.config.rtrs.max_paths = spec.config.rtrs.max_paths.max(wanted_paths);
        let mode = match self.volume.access_mode {
            AccessMode::ReadOnly => initiator::AccessMode::ReadOnly,
            AccessMode::ReadWrite => initiator::AccessMode::ReadWrite,
            AccessMode::Migration => initiator::AccessMode::Migration,
        };
        let result = Session::connect(&spec)
            .map_err(|e| format!("session {:?}: {e}", self.volume.session))
            .and_then(
                |session| match session.open(&self.volume.device_path, mode) {
                    Ok(volume) => Ok(Mapping { session, volume }),
                    Err(e) => {
                        // Free the session name on the target at once.
                        let _ = session.close();
                        Err(format!(
                            "open {:?} ({}): {e}",
                            self.volume.device_path, self.volume.access_mode
                        ))
                    }
                },
            );
        match result {
            Ok(mapping) => {
                let geometry = (mapping.volume.size(), mapping.volume.block_size());
                if let Some(old) = self.geometry.filter(|old| *old != geometry) {
                    self.log(&format!(
                        "the volume's geometry changed from {} bytes / {} to {} bytes / {}",
                        old.0, old.1, geometry.0, geometry.1
                    ));
                }
                self.log(&format!(
                    "session {:?} connected, {} opened: {} bytes, block size {}",
                    self.volume.session, self.volume.device_path, geometry.0, geometry.1
                ));
                self.geometry = Some(geometry);
                self.mapping = Some(mapping);
                self.backoff = self.tuning.backoff_min;
                self.shared.session_connected.store(true, Ordering::Relaxed);
            }
            Err(message) => {
                self.log(&format!(
                    "{message}; next attempt in {} ms",
                    self.backoff.as_millis()
                ));
                self.shared.set_error(message);
                self.next_attempt = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(self.tuning.backoff_max);
            }
        }
    }

    /// Drops the session after `error`; the next attempt follows the
    /// backoff.
    fn lose_session(&mut self, error: &HostedError) {
        let message = format!("session lost: {error}");
        self.shared.set_error(message.clone());
        self.log(&format!(
            "{message}; reconnecting in {} ms",
            self.backoff.as_millis()
        ));
        self.disconnect("the session failed");
        self.next_attempt = Instant::now() + self.backoff;
    }

    /// Closes the volume and the session (best effort).
    fn disconnect(&mut self, why: &str) {
        self.shared
            .session_connected
            .store(false, Ordering::Relaxed);
        if let Some(mapping) = self.mapping.take() {
            let volume = mapping.volume.close();
            let session = mapping.session.close();
            match (volume, session) {
                (Ok(()), Ok(())) => self.log(&format!("session closed ({why})")),
                (volume, session) => self.log(&format!(
                    "session dropped ({why}); close: volume {}, session {}",
                    volume.err().map_or("ok".to_owned(), |e| e.to_string()),
                    session.err().map_or("ok".to_owned(), |e| e.to_string()),
                )),
            }
        }
    }

    /// The open volume, reconnecting first if the backoff allows.
    fn mapped(&mut self) -> Result<&HostedVolume, BackendError> {
        if self.mapping.is_none() {
            self.try_connect();
        }
        match &self.mapping {
            Some(mapping) => Ok(&mapping.volume),
            None => Err(BackendError {
                reason: "the session is down".into(),
            }),
        }
    }

    /// Maps an IO failure, dropping the session if it is lost.
    fn failed(&mut self, what: &str, error: HostedError) -> BackendError {
        let reason = format!("{what}: {error}");
        if session_lost(&error) {
            self.lose_session(&error);
        } else {
            self.shared.set_error(reason.clone());
        }
        BackendError { reason }
    }
}

impl NbdBackend for Worker {
    fn size(&self) -> u64 {
        self.geometry.map_or(0, |g| g.0)
    }

    fn block_size(&self) -> u32 {
        self.geometry.map_or(512, |g| g.1)
    }

    fn read_only(&self) -> bool {
        self.volume.access_mode == AccessMode::ReadOnly
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        let result = self.mapped()?.read(offset, buf);
        self.log_events();
        result.map_err(|e| self.failed("read", e))
    }

    fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        let result = self.mapped()?.write(offset, data, fua);
        self.log_events();
        result.map_err(|e| self.failed("write", e))
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        let result = self.mapped()?.flush();
        self.log_events();
        result.map_err(|e| self.failed("flush", e))
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), BackendError> {
        let result = self.mapped()?.discard(offset, len);
        self.log_events();
        result.map_err(|e| self.failed("discard", e))
    }

    fn idle(&mut self) -> Idle {
        if self.stopping() {
            return Idle::Disconnect;
        }
        if self.mapping.is_none() {
            self.try_connect();
        } else {
            self.run_session(Duration::ZERO);
        }
        Idle::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use std::path::Path;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "brick-initiatord-userspace-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A free UDP port on 127.0.0.1 (nobody serves it: the target is
    /// unreachable).
    fn unused_port() -> u16 {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn config(socket: &Path, port: u16, session: &str) -> Config {
        parse(
            &format!(
                "[[volumes]]\nname = \"db\"\nsession = \"{session}\"\ndevice_path = \"vol0\"\n\
                 paths = [\"127.0.0.1\"]\nexport = \"nbd:unix:{}\"\nlink = \"udp:127.0.0.2:{port}\"\n",
                socket.display()
            ),
            "t.toml",
        )
        .unwrap()
    }

    fn quick() -> Tuning {
        Tuning {
            connect_timeout: Duration::from_millis(200),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
        }
    }

    fn collecting() -> (Log, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let log: Log = Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_owned()));
        (log, lines)
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn test_unreachable_target_backs_off_and_stops_cleanly() {
        let dir = scratch("unreachable");
        let socket = dir.join("db.nbd");
        let (log, lines) = collecting();
        let mut exports = Exports::new(log, quick());
        let config = config(&socket, unused_port(), "s1");
        let summary = exports.apply(&config);
        assert_eq!(summary.started, ["db"]);
        // Attempts repeat with a reason, no listener without a volume.
        wait_for("two failed attempts", || {
            lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("next attempt in"))
                .count()
                >= 2
        });
        let status = exports.status();
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].name, "db");
        assert_eq!(status[0].address, format!("nbd:unix:{}", socket.display()));
        assert!(!status[0].session_connected && !status[0].listening);
        assert!(status[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("\"s1\"")));
        assert!(!socket.exists());
        // Same config again: nothing to do.
        assert!(exports.apply(&config).is_empty());
        // Removed from the config: stopped, thread joined.
        let started = Instant::now();
        let summary = exports.apply(&Config::default());
        assert_eq!(summary.stopped, ["db"]);
        assert!(exports.is_empty() && exports.status().is_empty());
        assert!(started.elapsed() < Duration::from_secs(5));
        let lines = lines.lock().unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("export db: no longer in the config")),
            "{lines:?}"
        );
        // The waits grow: 50, 100, 200, 200 ms.
        let waits: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.split("next attempt in ").nth(1))
            .collect();
        assert!(waits.starts_with(&["50 ms", "100 ms"]), "{waits:?}");
        assert!(
            waits
                .iter()
                .all(|w| ["50 ms", "100 ms", "200 ms"].contains(w)),
            "{waits:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_changed_settings_restart_the_export() {
        let dir = scratch("restart");
        let (log, lines) = collecting();
        let mut exports = Exports::new(log, quick());
        let port = unused_port();
        exports.apply(&config(&dir.join("a.nbd"), port, "s1"));
        // Another line only: kept.
        let mut moved = config(&dir.join("a.nbd"), port, "s1");
        moved.volumes[0].line = 40;
        assert!(exports.apply(&moved).is_empty());
        let summary = exports.apply(&config(&dir.join("b.nbd"), port, "s1"));
        assert_eq!(summary.restarted, ["db"]);
        assert!(summary.started.is_empty() && summary.stopped.is_empty());
        assert_eq!(
            exports.status()[0].address,
            format!("nbd:unix:{}", dir.join("b.nbd").display())
        );
        exports.stop_all();
        assert!(exports.is_empty());
        assert!(lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("export db: settings changed in the config; restarting it")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_kernel_volumes_start_no_export() {
        let (log, _) = collecting();
        let mut exports = Exports::new(log, quick());
        let config = parse(
            "[[volumes]]\nname = \"k\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.1\"]\n",
            "t.toml",
        )
        .unwrap();
        assert!(exports.apply(&config).is_empty());
        assert!(exports.is_empty());
    }

    #[test]
    fn test_unix_listener_replaces_only_stale_sockets() {
        let dir = scratch("listener");
        let path = dir.join("x.nbd");
        let address = ExportAddress::Unix(path.clone());
        // A stale socket (its listener gone) is replaced.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = Listener::bind(&address).unwrap();
        assert!(matches!(listener.accept(), Ok(None)));
        // One in use is refused, and left alone.
        let error = Listener::bind(&address).err().unwrap();
        assert_eq!(error.kind(), ErrorKind::AddrInUse);
        // A client is accepted and set up for serving.
        let _client = UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap().unwrap();
        let Client::Unix(stream) = &accepted else {
            panic!("a unix listener accepted a TCP client")
        };
        assert_eq!(stream.read_timeout().unwrap(), Some(CLIENT_POLL));
        // Closing the listener removes the file.
        drop(listener);
        assert!(!path.exists());
        // A regular file is never replaced.
        std::fs::write(&path, b"data").unwrap();
        let error = Listener::bind(&address).err().unwrap();
        assert_eq!(error.kind(), ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
        // A missing directory is created.
        let nested = ExportAddress::Unix(dir.join("sub/y.nbd"));
        drop(Listener::bind(&nested).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_tcp_listener_on_loopback() {
        let listener = Listener::bind(&ExportAddress::Tcp("127.0.0.1:0".parse().unwrap())).unwrap();
        let Listener::Tcp(inner) = &listener else {
            panic!("not TCP")
        };
        let address = inner.local_addr().unwrap();
        assert!(matches!(listener.accept(), Ok(None)));
        let _client = TcpStream::connect(address).unwrap();
        wait_for("the TCP client", || {
            matches!(listener.accept(), Ok(Some(_)))
        });
    }

    #[test]
    fn test_session_lost_classification() {
        assert!(session_lost(&HostedError::LinkFailed(
            hal::NicError::LinkDown
        )));
        assert!(session_lost(&HostedError::Timeout {
            what: "IO",
            waited: Duration::from_secs(1),
        }));
        assert!(session_lost(&HostedError::Io(IoError::Closed)));
        assert!(!session_lost(&HostedError::Io(IoError::Disconnected {
            held_ns: 1
        })));
    }
}
