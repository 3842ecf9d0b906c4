//! The initiator in a Linux process: HCA, link, run loop, blocking API.
//!
//! [`Session::connect`] opens the link named by a [`LinkSpec`], builds one
//! software HCA ([`roce::hca::Hca`]) for it and an [`Initiator`] on top:
//!
//! * `frame:connect:PATH` / `frame:listen:PATH` (and `tcp:…`): QEMU
//!   stream framing of Ethernet frames; the HCA runs in Ethernet mode with
//!   the MAC and IPv4 address of the [`SessionSpec`] and does ARP itself.
//! * `udp:IP:PORT`: a UDP socket; the HCA runs in
//!   [`LinkMode::Udp`] with its address = the socket's IP and every peer
//!   at the same `PORT` (Brick to Brick only: see `hal::hosted::udp`).
//!   The target's UDP link must use the same port on its own IP.
//!
//! The loop ([`Session::run_for`], and inside every blocking call) takes a
//! bounded burst of frames, polls the initiator, lets the HCA transmit,
//! and, when nothing happened, blocks in [`PollIdle::wait`] on the link's
//! descriptor until the earliest deadline of the HCA and the initiator. It
//! never spins while idle. Nothing runs between calls: a tool that sits
//! idle longer than the target's heartbeat budget (~30 s) should call
//! [`Session::run_for`] now and then, or its paths are dropped (and then
//! transparently re-established).
//!
//! Two ways to do IO:
//!
//! * blocking, on a [`Volume`]: [`Volume::read`], [`Volume::write`],
//!   [`Volume::flush`], [`Volume::discard`]; longer than one IO slot is
//!   split into `max_transfer` pieces that run in parallel up to the queue
//!   depth;
//! * asynchronous, for benchmarks: `Volume::submit_*` with the caller's
//!   tag (below [`BLOCKING_TAG_BASE`]), then [`Session::reap`].
//!
//! A [`Session`] and its [`Volume`]s share one single-threaded host
//! (`Rc<RefCell<…>>`): use them from one thread.
//!
//! The HCA is several MiB (its queue pairs are inline); it is built on a
//! short-lived thread with a large stack and handed over boxed
//! ([`BoxedHca`]), so any thread may call [`Session::connect`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use hal::hosted::{Link, MonotonicClock, OsRng, PollIdle};
use hal::{Clock, DatagramNic, NicError, Rng};
use roce::hca::{HcaConfig, LinkMode};
use roce::types::Mtu;
use rtrs::client::PathError;

use crate::hosted_port::build_hca;
pub use crate::hosted_port::{HostHca, HostPort, OsKeys, SessionLink};

mod host;
use host::Host;

use crate::engine::{Completion, Event, Initiator, VolumeId, VolumeInfo};
use crate::error::{CloseError, ConnectError, InitError, IoError, OpenError, SubmitError};
use crate::stats::{PathReport, SessionStats, VolumeStats};
use crate::{AccessMode, InitiatorConfig};

/// Frames (or datagrams) taken from the link per loop iteration.
pub const RX_BURST: usize = 64;
/// Tags at or above this are the blocking calls' own; asynchronous callers
/// use smaller ones.
pub const BLOCKING_TAG_BASE: u64 = 1 << 62;
/// The hosted link's IP MTU unless [`SessionSpec::mtu`] says otherwise.
pub const DEFAULT_MTU: usize = 1500;
/// The smallest link MTU (IPv4's minimum; the manifest's bound too).
pub const MIN_MTU: usize = 576;
/// The largest link MTU (jumbo frames; the manifest's bound too).
pub const MAX_MTU: usize = 9000;

/// Everything [`Session::connect`] needs.
#[derive(Clone, Debug)]
pub struct SessionSpec {
    /// RTRS session name (the target's access rules match it).
    pub name: String,
    /// The link to open: a hosted link for the software HCA, or an RDMA
    /// device (`ibv:DEVICE[:PORT]`, found by [`local_ip`](Self::local_ip)).
    pub link: SessionLink,
    /// The target's RTRS addresses, one per path (e.g. `10.0.0.1:1234`).
    pub paths: Vec<SocketAddr>,
    /// Our MAC (frame links; in UDP mode it only names the HCA).
    pub local_mac: [u8; 6],
    /// Our IPv4 address on a frame link (UDP links use the socket's).
    pub local_ip: Ipv4Addr,
    /// IP MTU of a hosted link (576..=9000; default 1500). The software
    /// HCA asks for the path MTU that fits it, as RDMA CM does: 1024 at
    /// 1500, 4096 at 9000 ([`Mtu::for_ethernet_mtu`]). An RDMA device
    /// keeps its own.
    pub mtu: usize,
    /// Busy polling on a hosted link: how long the loop keeps polling
    /// after the last work before it sleeps in ppoll(2) (default 0: never
    /// spins). Each idle turn of the spin yields the core (sched_yield),
    /// so a process waiting for it runs at once. For a client that gives
    /// the session a core of its own.
    pub poll: Duration,
    /// The initiator's configuration.
    pub config: InitiatorConfig,
    /// How long [`Session::connect`] waits for the session.
    pub connect_timeout: Duration,
    /// How long a blocking call waits for its IO or answer.
    pub io_timeout: Duration,
}

impl SessionSpec {
    /// A spec with defaults: MAC `52:54:00:b1:c0:01`, IP 10.0.0.2 (frame
    /// links only), [`InitiatorConfig::new`] with OS-random uuids, 10 s to
    /// connect, 60 s per blocking IO (longer than the 30 s hold timeout).
    pub fn new(name: &str, link: impl Into<SessionLink>, paths: Vec<SocketAddr>) -> Self {
        let mut seed = [0u8; 16];
        OsRng.fill_bytes(&mut seed);
        Self {
            name: name.to_owned(),
            link: link.into(),
            paths,
            local_mac: [0x52, 0x54, 0x00, 0xb1, 0xc0, 0x01],
            local_ip: Ipv4Addr::new(10, 0, 0, 2),
            mtu: DEFAULT_MTU,
            poll: Duration::ZERO,
            config: InitiatorConfig::new(seed),
            connect_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(60),
        }
    }
}

/// Errors of the hosted layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Opening the link failed.
    Link {
        /// The link.
        spec: String,
        /// The OS error.
        error: io::Error,
    },
    /// A UDP link bound a non-IPv4 address.
    NotIpv4 {
        /// The address found.
        found: SocketAddr,
    },
    /// [`SessionSpec::mtu`] outside [`MIN_MTU`]..=[`MAX_MTU`].
    Mtu {
        /// The MTU given.
        found: usize,
    },
    /// The link failed while running.
    LinkFailed(NicError),
    /// Building the initiator failed.
    Init(InitError),
    /// The session could not be started.
    Connect(ConnectError),
    /// The session did not come up in time.
    ConnectTimeout {
        /// How long it waited.
        waited: Duration,
        /// Why the last connect attempt failed, if one did.
        last: Option<PathError>,
    },
    /// Opening a volume failed.
    Open(OpenError),
    /// Closing a volume failed.
    Close(CloseError),
    /// An IO was refused at submission.
    Submit(SubmitError),
    /// An IO failed.
    Io(IoError),
    /// A blocking call's answer did not come in time.
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// An asynchronous tag at or above [`BLOCKING_TAG_BASE`].
    BadTag {
        /// The largest tag allowed.
        max: u64,
        /// The tag given.
        found: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Link { spec, error } => write!(f, "link {spec}: {error}"),
            Self::NotIpv4 { found } => {
                write!(f, "UDP link bound {found}; expected an IPv4 address")
            }
            Self::Mtu { found } => write!(
                f,
                "link MTU {found}: expected {MIN_MTU}..={MAX_MTU} (an IPv4 link's MTU, as the manifest's)"
            ),
            Self::LinkFailed(error) => write!(f, "link failed: {error}"),
            Self::Init(error) => write!(f, "initiator: {error}"),
            Self::Connect(error) => write!(f, "connect: {error}"),
            Self::ConnectTimeout { waited, last } => match last {
                Some(reason) => write!(
                    f,
                    "session not up after {} ms; last attempt: {reason:?}",
                    waited.as_millis()
                ),
                None => write!(f, "session not up after {} ms", waited.as_millis()),
            },
            Self::Open(error) => write!(f, "open: {error}"),
            Self::Close(error) => write!(f, "close: {error}"),
            Self::Submit(error) => write!(f, "submit: {error}"),
            Self::Io(error) => write!(f, "IO: {error}"),
            Self::Timeout { what, waited } => {
                write!(f, "no {what} after {} ms", waited.as_millis())
            }
            Self::BadTag { max, found } => {
                write!(f, "tag {found:#x}; expected at most {max:#x}")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<SubmitError> for Error {
    fn from(error: SubmitError) -> Self {
        Error::Submit(error)
    }
}

impl From<IoError> for Error {
    fn from(error: IoError) -> Self {
        Error::Io(error)
    }
}

/// A connected session (see the module docs).
pub struct Session {
    host: Rc<RefCell<Host>>,
}

impl Session {
    /// Opens the link, builds the HCA and the initiator, starts the session
    /// and waits until it is usable (SESS_INFO answered).
    ///
    /// # Errors
    ///
    /// [`Error::Link`], [`Error::NotIpv4`], [`Error::Init`],
    /// [`Error::Connect`], [`Error::ConnectTimeout`] (naming the last
    /// connect failure), [`Error::LinkFailed`].
    pub fn connect(spec: &SessionSpec) -> Result<Session, Error> {
        let session = Session::begin(spec)?;
        let up = {
            let mut host = session.host.borrow_mut();
            host.run_until(spec.connect_timeout, |h| {
                h.take_event(|e| matches!(e, Event::SessionUp { .. }))
            })?
        };
        if up.is_none() {
            return Err(session.connect_timeout(spec.connect_timeout));
        }
        session.host.borrow_mut().up = true;
        Ok(session)
    }

    /// Opens the link, builds the HCA and the initiator and starts the
    /// session without waiting for it: drive it with [`Session::poll_up`]
    /// (a tool that brings many sessions up at once, `brick scale`).
    ///
    /// # Errors
    ///
    /// [`Error::Link`], [`Error::NotIpv4`], [`Error::Init`],
    /// [`Error::Connect`].
    pub fn begin(spec: &SessionSpec) -> Result<Session, Error> {
        let config = spec.config;
        let arena = usize::try_from(config.pool_bytes())
            .unwrap_or(usize::MAX)
            .saturating_add(rtrs_bytes(&config));
        let (link, hca) = match &spec.link {
            #[cfg(feature = "ibv")]
            SessionLink::Ibv(device) => {
                let depth = config.rtrs.max_queue_depth;
                let port =
                    HostPort::open_ibv(device, spec.local_ip, arena, depth).map_err(|error| {
                        Error::Link {
                            spec: spec.link.to_string(),
                            error: io::Error::other(error.to_string()),
                        }
                    })?;
                (None, port)
            }
            SessionLink::Hosted(hosted) => {
                let link = hosted.open().map_err(|error| Error::Link {
                    spec: spec.link.to_string(),
                    error,
                })?;
                let path_mtu = Mtu::for_ethernet_mtu(spec.mtu)
                    .filter(|_| (MIN_MTU..=MAX_MTU).contains(&spec.mtu))
                    .ok_or(Error::Mtu { found: spec.mtu })?;
                let (link, ip, mode) = match link {
                    Link::Frame(frame) => (
                        Link::Frame(frame.with_mac(spec.local_mac).with_mtu(spec.mtu)),
                        spec.local_ip,
                        LinkMode::Ethernet,
                    ),
                    Link::Udp(nic) => {
                        let local = nic.local_addr();
                        let IpAddr::V4(ip) = local.ip() else {
                            return Err(Error::NotIpv4 { found: local });
                        };
                        (
                            Link::Udp(nic.with_mtu(spec.mtu)),
                            ip,
                            LinkMode::Udp { port: local.port() },
                        )
                    }
                };
                let hca_config = HcaConfig {
                    mac: spec.local_mac,
                    ip: ip.octets(),
                };
                let mut port = build_hca(arena, hca_config, mode);
                if let Some(hca) = port.hca_mut() {
                    hca.set_path_mtu(path_mtu);
                }
                (Some(link), port)
            }
        };
        let mut init = Initiator::new(hca, config).map_err(Error::Init)?;
        let clock = MonotonicClock::new();
        init.connect(&spec.name, &spec.paths, clock.now())
            .map_err(Error::Connect)?;
        let host = Host {
            last_busy: clock.now(),
            poll_ns: u64::try_from(spec.poll.as_nanos()).unwrap_or(u64::MAX),
            init,
            link,
            clock,
            waiter: PollIdle::new(),
            events: Vec::new(),
            stash: VecDeque::new(),
            next_tag: BLOCKING_TAG_BASE,
            io_timeout: spec.io_timeout,
            up: false,
        };
        Ok(Session {
            host: Rc::new(RefCell::new(host)),
        })
    }

    /// One turn of the loop without blocking (see [`Session::begin`]);
    /// returns whether the session is up (SESS_INFO answered).
    ///
    /// # Errors
    ///
    /// [`Error::LinkFailed`].
    pub fn poll_up(&self) -> Result<bool, Error> {
        let mut host = self.host.borrow_mut();
        if !host.up {
            let up = host.run_until(Duration::ZERO, |h| {
                h.take_event(|e| matches!(e, Event::SessionUp { .. }))
            })?;
            host.up = up.is_some();
        }
        Ok(host.up)
    }

    /// The error of a session not up after `waited`, naming the last
    /// connect failure.
    pub fn connect_timeout(&self, waited: Duration) -> Error {
        let host = self.host.borrow();
        let last = host.events.iter().rev().find_map(|e| match e {
            Event::PathConnectFailed { reason, .. } | Event::PathDown { reason, .. } => {
                Some(*reason)
            }
            _ => None,
        });
        Error::ConnectTimeout { waited, last }
    }

    /// Adds this session's link to `idle` and returns the earliest
    /// deadline of its HCA and initiator: a tool that drives many
    /// sessions from one thread waits on all of them at once.
    pub fn watch(&self, idle: &mut PollIdle) -> Option<u64> {
        let host = self.host.borrow();
        if let Some(link) = &host.link {
            idle.watch_link(link);
        }
        for fd in host.init.verbs().wake_fds().into_iter().flatten() {
            idle.watch_readable(fd);
        }
        let now = host.clock.now();
        [host.init.poll_at(), host.init.verbs().poll_at(now)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Opens `device_path` as `mode` and waits for the answer.
    ///
    /// # Errors
    ///
    /// [`Error::Open`] (the target's refusal is
    /// [`OpenError::Remote`]), [`Error::Timeout`].
    pub fn open(&self, device_path: &str, mode: AccessMode) -> Result<Volume, Error> {
        let mut host = self.host.borrow_mut();
        let id = host.init.open(device_path, mode).map_err(Error::Open)?;
        let timeout = host.io_timeout;
        let answer = host.run_until(timeout, |h| {
            h.take_event(|e| matches!(e, Event::Opened { volume, .. } if *volume == id))
        })?;
        match answer {
            Some(Event::Opened {
                result: Ok(info), ..
            }) => Ok(Volume {
                host: Rc::clone(&self.host),
                id,
                info,
            }),
            Some(Event::Opened {
                result: Err(error), ..
            }) => Err(Error::Open(error)),
            _ => Err(Error::Timeout {
                what: "OPEN answer",
                waited: timeout,
            }),
        }
    }

    /// Runs the loop for `duration` (heartbeats, reconnects, async IO).
    ///
    /// # Errors
    ///
    /// [`Error::LinkFailed`].
    pub fn run_for(&self, duration: Duration) -> Result<(), Error> {
        self.host.borrow_mut().run_until(duration, |_| None::<()>)?;
        Ok(())
    }

    /// Control events not consumed by the blocking calls, oldest first
    /// (taken).
    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut self.host.borrow_mut().events)
    }

    /// Waits (at most `timeout`) until at least one IO submitted with a
    /// `Volume::submit_*` call has completed, then reaps up to `max`
    /// completions, calling `f` with each (and a read's data). Returns how
    /// many were reaped (0 after the timeout).
    ///
    /// # Errors
    ///
    /// [`Error::LinkFailed`].
    pub fn reap(
        &self,
        max: usize,
        timeout: Duration,
        mut f: impl FnMut(&Completion, &[u8]),
    ) -> Result<usize, Error> {
        let mut host = self.host.borrow_mut();
        host.run_until(timeout, |h| {
            (!h.stash.is_empty() || h.init.completions_ready() > 0).then_some(())
        })?;
        let mut count = 0;
        while count < max {
            if let Some((completion, data)) = host.stash.pop_front() {
                f(&completion, &data);
                count += 1;
                continue;
            }
            if host.init.next_completion(&mut f).is_none() {
                break;
            }
            count += 1;
        }
        Ok(count)
    }

    /// IOs submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        let host = self.host.borrow();
        host.init.in_flight() + host.stash.len()
    }

    /// Session counters.
    pub fn stats(&self) -> SessionStats {
        self.host.borrow().init.session_stats()
    }

    /// State and counters of path `path`.
    pub fn path_report(&self, path: u16) -> Option<PathReport> {
        self.host.borrow().init.path_report(path)
    }

    /// The HCA's frame, drop and retransmission counters.
    pub fn hca_counters(&self) -> roce::qp::Counters {
        self.host.borrow().init.verbs().counters()
    }

    /// Whether the session is usable now.
    pub fn is_ready(&self) -> bool {
        self.host.borrow().init.is_ready()
    }

    /// Closes the session (every path, for good) and lets the
    /// disconnects go out (at most one second).
    ///
    /// # Errors
    ///
    /// [`Error::LinkFailed`].
    pub fn close(self) -> Result<(), Error> {
        let mut host = self.host.borrow_mut();
        let now = host.clock.now();
        host.init.close_session(now);
        let paths = host.init.config().rtrs.max_paths;
        host.run_until(Duration::from_secs(1), |h| {
            (0..paths)
                .all(|p| {
                    h.init
                        .path_report(p)
                        .is_none_or(|r| r.status == rtrs::client::PathStatus::Closed)
                })
                .then_some(())
        })?;
        Ok(())
    }
}

/// Registered memory the RTRS client allocates (header buffers and path
/// control buffers), with room to spare.
fn rtrs_bytes(config: &InitiatorConfig) -> usize {
    let rtrs = &config.rtrs;
    let qd = usize::from(rtrs.max_queue_depth);
    let headers = qd * ((rtrs.max_header_len as usize + 64 + 63) & !63);
    let recv = 2 * qd + 8;
    let control = 512 + 8 + 16 * qd + usize::from(rtrs.max_connections_per_path) * recv * 8;
    headers + usize::from(rtrs.max_paths) * (control + 4096) + (1 << 20)
}

/// An open volume of a [`Session`].
pub struct Volume {
    host: Rc<RefCell<Host>>,
    id: VolumeId,
    info: VolumeInfo,
}

/// One blocking operation, split into slot-sized parts.
#[derive(Clone, Copy)]
enum Blocking<'a> {
    Read,
    Write(&'a [u8], bool),
    Discard,
    Flush,
}

impl Volume {
    /// The volume's id in the initiator.
    pub fn id(&self) -> VolumeId {
        self.id
    }

    /// The geometry now (device id and size may change on a re-open).
    pub fn info(&self) -> VolumeInfo {
        self.host
            .borrow()
            .init
            .volume_info(self.id)
            .unwrap_or(self.info)
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.info().size
    }

    /// The logical block size: offsets and lengths are multiples of it.
    pub fn block_size(&self) -> u32 {
        self.info().logical_block_size
    }

    /// The volume's counters.
    pub fn stats(&self) -> Option<VolumeStats> {
        self.host.borrow().init.volume_stats(self.id)
    }

    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    ///
    /// [`Error::Submit`] (range, alignment, state), [`Error::Io`],
    /// [`Error::Timeout`].
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let len = buf.len() as u64;
        self.blocking(offset, len, Blocking::Read, Some(buf))
    }

    /// Writes `data` at `offset`, durable before returning if `fua`.
    ///
    /// # Errors
    ///
    /// As [`Volume::read`].
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        self.blocking(offset, data.len() as u64, Blocking::Write(data, fua), None)
    }

    /// Flushes the volume's write cache (a no-op without one).
    ///
    /// # Errors
    ///
    /// As [`Volume::read`].
    pub fn flush(&self) -> Result<(), Error> {
        self.blocking(0, 0, Blocking::Flush, None)
    }

    /// Discards `len` bytes at `offset`.
    ///
    /// # Errors
    ///
    /// As [`Volume::read`].
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.blocking(offset, len, Blocking::Discard, None)
    }

    fn blocking(
        &self,
        offset: u64,
        len: u64,
        op: Blocking<'_>,
        mut read_into: Option<&mut [u8]>,
    ) -> Result<(), Error> {
        let mut host = self.host.borrow_mut();
        let part = match op {
            Blocking::Discard => (u64::from(u32::MAX) / 2) & !4095,
            _ => u64::from(host.init.config().max_transfer),
        };
        let parts = if matches!(op, Blocking::Flush) {
            1
        } else {
            len.div_ceil(part).max(1)
        };
        let timeout = host.io_timeout;
        let first_tag = host.next_tag + 1;
        let mut next_part = 0u64;
        let mut done = 0u64;
        let mut failure: Option<Error> = None;
        let deadline = host
            .clock
            .now()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        while done < next_part || (next_part < parts && failure.is_none()) {
            // Submit what fits.
            while next_part < parts && failure.is_none() && host.init.free_slots() > 0 {
                let at = next_part * part;
                let this = (len - at).min(part);
                let tag = host.tag();
                debug_assert_eq!(tag, first_tag + next_part);
                let now = host.clock.now();
                let result = match op {
                    Blocking::Read => {
                        host.init
                            .submit_read(now, tag, self.id, offset + at, this as u32)
                    }
                    Blocking::Write(data, fua) => host.init.submit_write(
                        now,
                        tag,
                        self.id,
                        offset + at,
                        &data[at as usize..(at + this) as usize],
                        fua,
                    ),
                    Blocking::Discard => {
                        host.init
                            .submit_discard(now, tag, self.id, offset + at, this as u32)
                    }
                    Blocking::Flush => host.init.submit_flush(now, tag, self.id),
                };
                match result {
                    Ok(()) => next_part += 1,
                    Err(error) => {
                        // Keep the tag sequence dense for the parts sent.
                        host.next_tag -= 1;
                        failure = Some(Error::Submit(error));
                    }
                }
            }
            if done >= next_part {
                break;
            }
            // Reap ours.
            let range = first_tag..first_tag + next_part;
            let mut own = |completion: &Completion, data: &[u8]| {
                if !range.contains(&completion.tag) {
                    return false;
                }
                done += 1;
                match completion.result {
                    Err(error) => {
                        failure.get_or_insert(Error::Io(error));
                    }
                    Ok(()) => {
                        if let Some(buf) = read_into.as_deref_mut() {
                            let at = ((completion.tag - first_tag) * part) as usize;
                            if let Some(dst) = buf.get_mut(at..at + data.len()) {
                                dst.copy_from_slice(data);
                            }
                        }
                    }
                }
                true
            };
            // Stashed ones first (a previous call may have reaped ours? no:
            // tags are unique), then new completions.
            host.reap_into(&mut own);
            if done >= next_part && (next_part >= parts || failure.is_some()) {
                break;
            }
            if host.clock.now() >= deadline {
                failure.get_or_insert(Error::Timeout {
                    what: "IO completion",
                    waited: timeout,
                });
                // The parts in flight complete later into the stash.
                break;
            }
            let busy = host.pump()?;
            if !busy && host.init.completions_ready() == 0 {
                host.idle(deadline);
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Submits a read (asynchronous; reap with [`Session::reap`]). `tag`
    /// must be below [`BLOCKING_TAG_BASE`].
    ///
    /// # Errors
    ///
    /// [`Error::Submit`]; [`Error::BadTag`] for a tag out of range.
    pub fn submit_read(&self, tag: u64, offset: u64, len: u32) -> Result<(), Error> {
        check_tag(tag)?;
        let mut host = self.host.borrow_mut();
        let now = host.clock.now();
        host.init.submit_read(now, tag, self.id, offset, len)?;
        Ok(())
    }

    /// Submits a write (asynchronous). `tag` must be below
    /// [`BLOCKING_TAG_BASE`].
    ///
    /// # Errors
    ///
    /// As [`Volume::submit_read`].
    pub fn submit_write(&self, tag: u64, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        check_tag(tag)?;
        let mut host = self.host.borrow_mut();
        let now = host.clock.now();
        host.init
            .submit_write(now, tag, self.id, offset, data, fua)?;
        Ok(())
    }

    /// Submits a flush (asynchronous).
    ///
    /// # Errors
    ///
    /// As [`Volume::submit_read`].
    pub fn submit_flush(&self, tag: u64) -> Result<(), Error> {
        check_tag(tag)?;
        let mut host = self.host.borrow_mut();
        let now = host.clock.now();
        host.init.submit_flush(now, tag, self.id)?;
        Ok(())
    }

    /// Submits a discard (asynchronous).
    ///
    /// # Errors
    ///
    /// As [`Volume::submit_read`].
    pub fn submit_discard(&self, tag: u64, offset: u64, len: u32) -> Result<(), Error> {
        check_tag(tag)?;
        let mut host = self.host.borrow_mut();
        let now = host.clock.now();
        host.init.submit_discard(now, tag, self.id, offset, len)?;
        Ok(())
    }

    /// Closes the volume (CLOSE, waiting for the answer).
    ///
    /// # Errors
    ///
    /// [`Error::Close`] (IO still in flight: reap it first),
    /// [`Error::Io`] for the target's answer, [`Error::Timeout`].
    pub fn close(self) -> Result<(), Error> {
        let mut host = self.host.borrow_mut();
        host.init.close(self.id).map_err(Error::Close)?;
        let id = self.id;
        let timeout = host.io_timeout;
        let answer = host.run_until(timeout, |h| {
            h.take_event(|e| matches!(e, Event::Closed { volume, .. } if *volume == id))
        })?;
        match answer {
            Some(Event::Closed { result, .. }) => result.map_err(Error::Io),
            _ => Err(Error::Timeout {
                what: "CLOSE answer",
                waited: timeout,
            }),
        }
    }
}

fn check_tag(tag: u64) -> Result<(), Error> {
    if tag >= BLOCKING_TAG_BASE {
        return Err(Error::BadTag {
            max: BLOCKING_TAG_BASE - 1,
            found: tag,
        });
    }
    Ok(())
}
