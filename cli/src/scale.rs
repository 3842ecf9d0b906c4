//! `brick scale`: many sessions from one process, each from its own
//! loopback address, doing verified IO at a fixed queue depth.
//!
//! Session `i` binds `--first-source + i` on the target's UDP port (the
//! whole 127.0.0.0/8 is local on Linux) and is named `PREFIX-i`, so the
//! target sees as many distinct clients as sessions. All sessions are
//! started at once ([`Session::begin`]) and driven from one thread: the
//! connect time is the time until every session is up, as a rack of hosts
//! booting together would see it.
//!
//! Each session owns one `--bs` aligned region of the volume
//! (`size / sessions`), and each of its `--qd` IO slots owns every
//! `qd`-th block of that region. A slot writes a block with a pattern
//! keyed by session, block and round, reads it back and checks it, then
//! moves to a random block of its own: every read verifies the write
//! before it, and no two slots ever touch one block, so the check holds
//! at any interleaving. After `--runtime` no new IO starts and what is in
//! flight drains.
//!
//! The report (stdout; `--json` one object): sessions up, connect time,
//! IOPS over all sessions, the median over sessions of each session's
//! p50 and p99 latency, the worst session's p99, IO errors and
//! verification failures. The exit status is non-zero if a session did
//! not come up, an IO failed or a check failed.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use hal::hosted::{LinkSpec, MonotonicClock, PollIdle};
use hal::Clock;
use initiator::hosted::{Session, SessionSpec, Volume};
use initiator::{AccessMode, IoKind};
use serde::Serialize;

use crate::histogram::Histogram;
use crate::pattern;
use crate::progress::Progress;
use crate::size::parse_bytes;

/// Most sessions one process drives.
pub const MAX_SESSIONS: u32 = 4096;

/// `brick scale` options.
#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// The target's RTRS address (its UDP link's IP), ADDR[:PORT].
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = crate::connect::parse_target)]
    pub target: SocketAddr,
    /// The UDP port of the target's `--link udp:IP:PORT`.
    #[arg(long, default_value_t = 4791)]
    pub udp_port: u16,
    /// Source address of session 0; session i uses this + i.
    #[arg(long, default_value = "127.1.0.1")]
    pub first_source: Ipv4Addr,
    /// How many sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: u32,
    /// Session i is named PREFIX-i (the target's access list matches it).
    #[arg(long, default_value = "scale")]
    pub session_prefix: String,
    /// The volume's device_path on the target; a `{}` in it is replaced
    /// by `i % --volume-count` (session i), so sessions can spread over
    /// volumes (RNBD admits as many read-write sessions per volume as the
    /// manifest's `max_writers`, Linux's rule is one).
    #[arg(long)]
    pub volume: String,
    /// How many volumes `{}` in `--volume` ranges over.
    #[arg(long, default_value_t = 1)]
    pub volume_count: u32,
    /// IOs kept in flight per session.
    #[arg(long, default_value_t = 16)]
    pub qd: u16,
    /// Bytes per IO.
    #[arg(long, default_value = "4k", value_parser = parse_bytes)]
    pub bs: u64,
    /// RTRS connections per session (one service connection plus IO
    /// connections; the target's `max_connections_per_path` bounds it).
    #[arg(long, default_value_t = 2)]
    pub connections: u16,
    /// Seconds of IO (then the IOs in flight drain).
    #[arg(long, default_value_t = 10.0)]
    pub runtime: f64,
    /// Seconds all sessions may take to come up.
    #[arg(long, default_value_t = 60.0)]
    pub connect_timeout: f64,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// What one IO slot is doing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Idle,
    Writing { block: u64, round: u32 },
    Reading { block: u64, round: u32 },
}

/// One session and its IO.
struct Client {
    session: Session,
    volume: Volume,
    index: u32,
    slots: Vec<SlotState>,
    /// First block of this session's region.
    first_block: u64,
    /// Blocks in the region.
    blocks: u64,
    rng: u64,
    round: u32,
    ios: u64,
    errors: u64,
    mismatches: u64,
    latency: Histogram,
    /// Slots whose write completed and whose read is to be sent.
    reads: Vec<usize>,
}

/// The pattern seed of `block` in `round` of session `index`.
fn seed(index: u32, block: u64, round: u32) -> u64 {
    (u64::from(index) << 40) ^ (block << 8) ^ u64::from(round)
}

/// The result.
#[derive(Serialize)]
struct Report {
    sessions: u32,
    sessions_up: u32,
    connect_s: f64,
    runtime_s: f64,
    qd: u16,
    bs: u64,
    ios: u64,
    iops: f64,
    session_p50_us_median: f64,
    session_p99_us_median: f64,
    worst_p99_us: f64,
    errors: u64,
    mismatches: u64,
    first_error: Option<String>,
}

/// `brick scale`.
pub fn run(args: &ScaleArgs) -> Result<()> {
    if args.sessions == 0 || args.sessions > MAX_SESSIONS {
        bail!("--sessions {}: expected 1..={MAX_SESSIONS}", args.sessions);
    }
    if args.qd == 0 {
        bail!("--qd 0: expected at least 1");
    }
    if !(args.runtime.is_finite() && args.runtime > 0.0) {
        bail!(
            "--runtime {}: expected a positive number of seconds",
            args.runtime
        );
    }
    let bs = u32::try_from(args.bs)
        .ok()
        .filter(|bs| *bs >= 512 && bs % 512 == 0)
        .with_context(|| format!("--bs {}: expected a multiple of 512 below 4 GiB", args.bs))?;
    let connect_timeout = Duration::from_secs_f64(args.connect_timeout.max(0.1));
    let sessions = start_sessions(args, bs)?;
    let start = Instant::now();
    let (up, first_error) = bring_up(&sessions, connect_timeout)?;
    let connect = start.elapsed();
    eprintln!(
        "scale: {up} of {} sessions up in {:.2} s",
        args.sessions,
        connect.as_secs_f64()
    );
    if up < args.sessions {
        let report = Report {
            sessions: args.sessions,
            sessions_up: up,
            connect_s: connect.as_secs_f64(),
            runtime_s: 0.0,
            qd: args.qd,
            bs: u64::from(bs),
            ios: 0,
            iops: 0.0,
            session_p50_us_median: 0.0,
            session_p99_us_median: 0.0,
            worst_p99_us: 0.0,
            errors: 0,
            mismatches: 0,
            first_error,
        };
        print_report(&report, args.json)?;
        bail!(
            "{up} of {} sessions up after {:.1} s; expected all",
            args.sessions,
            connect_timeout.as_secs_f64()
        );
    }
    let mut clients = open_volumes(sessions, args, bs)?;
    let runtime = Duration::from_secs_f64(args.runtime);
    let mut first_error = None;
    let elapsed = drive(&mut clients, bs, runtime, &mut first_error)?;
    let mut p50: Vec<u64> = clients.iter().map(|c| c.latency.quantile(0.5)).collect();
    let mut p99: Vec<u64> = clients.iter().map(|c| c.latency.quantile(0.99)).collect();
    p50.sort_unstable();
    p99.sort_unstable();
    let ios: u64 = clients.iter().map(|c| c.ios).sum();
    let report = Report {
        sessions: args.sessions,
        sessions_up: up,
        connect_s: connect.as_secs_f64(),
        runtime_s: elapsed.as_secs_f64(),
        qd: args.qd,
        bs: u64::from(bs),
        ios,
        iops: ios as f64 / elapsed.as_secs_f64().max(1e-9),
        session_p50_us_median: p50[p50.len() / 2] as f64 / 1000.0,
        session_p99_us_median: p99[p99.len() / 2] as f64 / 1000.0,
        worst_p99_us: p99.last().copied().unwrap_or(0) as f64 / 1000.0,
        errors: clients.iter().map(|c| c.errors).sum(),
        mismatches: clients.iter().map(|c| c.mismatches).sum(),
        first_error,
    };
    for client in clients {
        let _ = client.volume.close();
        let _ = client.session.close();
    }
    print_report(&report, args.json)?;
    if report.errors > 0 || report.mismatches > 0 {
        bail!(
            "{} IO errors and {} verification failures; expected none",
            report.errors,
            report.mismatches
        );
    }
    Ok(())
}

/// Opens every session's link and starts its connect.
fn start_sessions(args: &ScaleArgs, bs: u32) -> Result<Vec<Session>> {
    let first = u32::from(args.first_source);
    let mut sessions = Vec::with_capacity(args.sessions as usize);
    for i in 0..args.sessions {
        let source = Ipv4Addr::from(first.checked_add(i).context("source addresses overflow")?);
        let link = LinkSpec::Udp(SocketAddr::V4(SocketAddrV4::new(source, args.udp_port)));
        let name = format!("{}-{i}", args.session_prefix);
        let mut spec = SessionSpec::new(&name, link, vec![args.target]);
        spec.config.queue_depth = args.qd;
        spec.config.max_transfer = bs;
        spec.config.rtrs.max_paths = 1;
        spec.config.rtrs.max_connections_per_path = args.connections;
        spec.config.connections_per_path = args.connections;
        let session = Session::begin(&spec)
            .with_context(|| format!("session {name} from {source}:{}", args.udp_port))?;
        sessions.push(session);
    }
    Ok(sessions)
}

/// Drives every session until all are up or `timeout` passes; returns how
/// many are up and the first failure seen.
fn bring_up(sessions: &[Session], timeout: Duration) -> Result<(u32, Option<String>)> {
    let clock = MonotonicClock::new();
    let deadline = Instant::now() + timeout;
    let mut up = vec![false; sessions.len()];
    let mut idle = PollIdle::new();
    let mut progress = Progress::new();
    loop {
        for (session, up) in sessions.iter().zip(up.iter_mut()) {
            if !*up {
                *up = session.poll_up()?;
            }
        }
        let count = up.iter().filter(|u| **u).count() as u32;
        if count as usize == sessions.len() {
            progress.finish();
            return Ok((count, None));
        }
        if Instant::now() >= deadline {
            progress.finish();
            let first = sessions
                .iter()
                .zip(&up)
                .find(|(_, up)| !**up)
                .map(|(s, _)| s.connect_timeout(timeout).to_string());
            return Ok((count, first));
        }
        progress.tick(|t| {
            format!(
                "{count}/{} sessions up, {:.1} s",
                sessions.len(),
                t.as_secs_f64()
            )
        });
        wait_all(sessions, &mut idle, &clock, Duration::from_millis(5));
    }
}

/// Blocks until any session's link has input or its next deadline
/// (at most `limit`).
fn wait_all<'a>(
    sessions: impl IntoIterator<Item = &'a Session>,
    idle: &mut PollIdle,
    clock: &MonotonicClock,
    limit: Duration,
) {
    idle.clear();
    let now = clock.now();
    let mut wake = now.saturating_add(limit.as_nanos() as u64);
    for session in sessions {
        if let Some(at) = session.watch(idle) {
            wake = wake.min(at);
        }
    }
    if wake > now {
        let _ = idle.wait(Some(wake));
    }
}

/// Opens the volume in every session and gives each its region.
fn open_volumes(sessions: Vec<Session>, args: &ScaleArgs, bs: u32) -> Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(sessions.len());
    let volumes = args.volume_count.max(1);
    // Sessions per volume: session i is the (i / volumes)-th of volume i % volumes.
    let sharers = args.sessions.div_ceil(volumes);
    for (index, session) in sessions.into_iter().enumerate() {
        let name = args
            .volume
            .replace("{}", &(index as u32 % volumes).to_string());
        let volume = session
            .open(&name, AccessMode::ReadWrite)
            .with_context(|| format!("open {name:?} in session {index}"))?;
        let total_blocks = volume.size() / u64::from(bs);
        let blocks = total_blocks / u64::from(sharers);
        if blocks < u64::from(args.qd) {
            bail!(
                "volume {name:?} has {total_blocks} blocks of {bs} bytes: {sharers} sessions on it at queue depth {} need at least {}",
                args.qd,
                u64::from(sharers) * u64::from(args.qd)
            );
        }
        let share = index as u64 / u64::from(volumes);
        clients.push(Client {
            session,
            volume,
            index: index as u32,
            slots: vec![SlotState::Idle; usize::from(args.qd)],
            first_block: blocks * share,
            blocks,
            rng: 0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1),
            round: 0,
            ios: 0,
            errors: 0,
            mismatches: 0,
            latency: Histogram::default(),
            reads: Vec::with_capacity(usize::from(args.qd)),
        });
    }
    Ok(clients)
}

impl Client {
    /// A random block of slot `slot`'s share of the region.
    fn pick(&mut self, slot: usize) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let qd = self.slots.len() as u64;
        let per_slot = self.blocks / qd;
        let k = ((u128::from(r) * u128::from(per_slot)) >> 64) as u64;
        self.first_block + k * qd + slot as u64
    }

    /// Starts the next IO of every idle slot (writes); `data` is scratch.
    fn submit_idle(&mut self, bs: u32, data: &mut [u8], error: &mut Option<String>) {
        for slot in 0..self.slots.len() {
            if self.slots[slot] != SlotState::Idle {
                continue;
            }
            let block = self.pick(slot);
            self.round = self.round.wrapping_add(1);
            let round = self.round;
            let offset = block * u64::from(bs);
            pattern::fill(seed(self.index, block, round), offset, data);
            match self.volume.submit_write(slot as u64, offset, data, false) {
                Ok(()) => self.slots[slot] = SlotState::Writing { block, round },
                Err(e) => {
                    self.errors += 1;
                    error.get_or_insert_with(|| {
                        format!("session {}: submit write: {e}", self.index)
                    });
                }
            }
        }
    }

    /// Handles the completions ready now; follows a write with its read.
    fn reap(&mut self, bs: u32, error: &mut Option<String>) -> Result<usize> {
        let done = &mut self.reads;
        done.clear();
        let index = self.index;
        let slots = &mut self.slots;
        let (mut ios, mut errors, mut mismatches) = (0, 0, 0);
        let latency = &mut self.latency;
        let count = self
            .session
            .reap(usize::MAX, Duration::ZERO, |completion, data| {
                let slot = completion.tag as usize;
                let Some(state) = slots.get(slot).copied() else {
                    return;
                };
                latency.record(completion.latency_ns);
                ios += 1;
                if let Err(e) = completion.result {
                    errors += 1;
                    error.get_or_insert_with(|| {
                        format!(
                            "session {index}: {:?} at {}: {e}",
                            completion.kind, completion.offset
                        )
                    });
                    slots[slot] = SlotState::Idle;
                    return;
                }
                match (state, completion.kind) {
                    (SlotState::Writing { block, round }, IoKind::Write) => {
                        done.push(slot);
                        slots[slot] = SlotState::Reading { block, round };
                    }
                    (SlotState::Reading { block, round }, IoKind::Read) => {
                        let offset = block * u64::from(bs);
                        if let Some(m) = pattern::check(seed(index, block, round), offset, data) {
                            mismatches += 1;
                            error.get_or_insert_with(|| format!("session {index}: verify: {m}"));
                        }
                        slots[slot] = SlotState::Idle;
                    }
                    _ => {
                        errors += 1;
                        error.get_or_insert_with(|| {
                            format!("session {index}: unexpected completion")
                        });
                        slots[slot] = SlotState::Idle;
                    }
                }
            })?;
        self.ios += ios;
        self.errors += errors;
        self.mismatches += mismatches;
        // Every write is read back, even while draining.
        for i in 0..self.reads.len() {
            let slot = self.reads[i];
            if let SlotState::Reading { block, .. } = self.slots[slot] {
                let offset = block * u64::from(bs);
                if let Err(e) = self.volume.submit_read(slot as u64, offset, bs) {
                    self.errors += 1;
                    error
                        .get_or_insert_with(|| format!("session {}: submit read: {e}", self.index));
                    self.slots[slot] = SlotState::Idle;
                }
            }
        }
        Ok(count)
    }

    fn in_flight(&self) -> bool {
        self.slots.iter().any(|s| *s != SlotState::Idle)
    }
}

/// Runs IO on every client for `runtime`, then drains; returns the time
/// to the last completion.
fn drive(
    clients: &mut [Client],
    bs: u32,
    runtime: Duration,
    first_error: &mut Option<String>,
) -> Result<Duration> {
    let clock = MonotonicClock::new();
    let mut data = vec![0u8; bs as usize];
    let mut idle = PollIdle::new();
    let mut progress = Progress::new();
    let start = Instant::now();
    let drain_limit = runtime + Duration::from_secs(90);
    loop {
        let elapsed = start.elapsed();
        let submitting = elapsed < runtime;
        let mut busy = 0;
        for client in clients.iter_mut() {
            busy += client.reap(bs, first_error)?;
            if submitting {
                client.submit_idle(bs, &mut data, first_error);
            }
        }
        if !submitting && !clients.iter().any(Client::in_flight) {
            progress.finish();
            return Ok(start.elapsed());
        }
        if elapsed > drain_limit {
            bail!("IOs still in flight 90 s after the runtime; expected none");
        }
        progress.tick(|t| {
            let ios: u64 = clients.iter().map(|c| c.ios).sum();
            format!("{:.0} s, {ios} IOs", t.as_secs_f64())
        });
        if busy == 0 {
            wait_all(
                clients.iter().map(|c| &c.session),
                &mut idle,
                &clock,
                Duration::from_millis(1),
            );
        }
    }
}

fn print_report(report: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    println!(
        "sessions: {} of {} up in {:.2} s",
        report.sessions_up, report.sessions, report.connect_s
    );
    println!(
        "IO: {} IOs in {:.2} s, {:.0} IOPS ({} B, queue depth {} per session)",
        report.ios, report.runtime_s, report.iops, report.bs, report.qd
    );
    println!(
        "latency: median session p50 {:.0} us, median session p99 {:.0} us, worst session p99 {:.0} us",
        report.session_p50_us_median, report.session_p99_us_median, report.worst_p99_us
    );
    println!(
        "errors: {} IO errors, {} verification failures",
        report.errors, report.mismatches
    );
    if let Some(error) = &report.first_error {
        println!("first error: {error}");
    }
    Ok(())
}
