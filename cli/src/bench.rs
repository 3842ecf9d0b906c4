//! `brick bench`: a fio-like load at a fixed queue depth.
//!
//! The asynchronous API ([`initiator::hosted::Volume::submit_read`] /
//! `submit_write`, [`initiator::hosted::Session::reap`]) keeps `--qd` IOs
//! in flight for `--runtime` seconds; then submission stops and what is in
//! flight is drained (and counted: the elapsed time runs to the last
//! completion). Offsets are `--bs`-aligned inside `offset..offset + size`:
//! uniformly random (a seeded xorshift) for the `rand*` workloads,
//! consecutive and wrapping for `read`/`write`.
//!
//! Nothing is allocated per IO: the write data is one preallocated
//! `--bs` buffer (the initiator copies it into the IO slot's registered
//! buffer at submission), reads are not copied out, and the latency
//! histograms ([`crate::histogram`]) are fixed arrays. A progress line
//! goes to stderr once a second; the result goes to stdout, as text or
//! (`--json`) one JSON object.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use initiator::hosted::{Session, Volume};
use initiator::{IoError, IoKind};
use serde::Serialize;

use crate::connect::{finish, ConnectArgs};
use crate::histogram::Histogram;
use crate::io::{check_range, megabytes_per_second};
use crate::pattern;
use crate::progress::Progress;
use crate::size::{format_bytes, format_bytes_approx, parse_bytes};

/// Largest `--bs` (one IO slot's buffer).
pub const MAX_BLOCK: u64 = 1 << 24;
/// Largest `--qd` (IO slots; more than the target's queue depth wait for
/// RTRS permits inside the initiator).
pub const MAX_QUEUE_DEPTH: u16 = 1024;
/// Most registered IO buffer memory (`qd × bs`) a run may ask for.
pub const MAX_BUFFER_BYTES: u64 = 1 << 30;
/// Longest wait for the IOs in flight after the runtime.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);

/// The access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Uniformly random reads.
    RandRead,
    /// Uniformly random writes.
    RandWrite,
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random mix: each IO is a read with probability `read_percent` %.
    RandRw {
        /// Percentage of reads, 0..=100.
        read_percent: u8,
    },
}

impl Workload {
    /// Percentage of IOs that are reads.
    pub fn read_percent(self) -> u8 {
        match self {
            Self::RandRead | Self::Read => 100,
            Self::RandWrite | Self::Write => 0,
            Self::RandRw { read_percent } => read_percent,
        }
    }

    /// Whether offsets are random.
    pub fn random(self) -> bool {
        !matches!(self, Self::Read | Self::Write)
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected randread, randwrite, read, write or randrw[:READ_PERCENT]";
        Ok(match text {
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "read" => Self::Read,
            "write" => Self::Write,
            "randrw" => Self::RandRw { read_percent: 50 },
            _ => {
                let percent = text
                    .strip_prefix("randrw:")
                    .ok_or_else(|| format!("{expected}, found {text:?}"))?;
                let read_percent = percent
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= 100)
                    .ok_or_else(|| {
                        format!("{expected}: the read percentage is 0..=100, found {percent:?}")
                    })?;
                Self::RandRw { read_percent }
            }
        })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RandRead => f.write_str("randread"),
            Self::RandWrite => f.write_str("randwrite"),
            Self::Read => f.write_str("read"),
            Self::Write => f.write_str("write"),
            Self::RandRw { read_percent } => write!(f, "randrw:{read_percent}"),
        }
    }
}

/// `brick bench` options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Connection and volume.
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// randread, randwrite, read, write, or randrw[:READ_PERCENT] (default 50).
    #[arg(long, value_name = "WORKLOAD", default_value = "randread")]
    pub rw: Workload,
    /// Bytes per IO (a multiple of the block size, at most 16MiB).
    #[arg(long, default_value = "4k", value_parser = parse_bytes)]
    pub bs: u64,
    /// IOs kept in flight.
    #[arg(long, default_value_t = 32)]
    pub qd: u16,
    /// Seconds to submit for (then the IOs in flight are drained).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub runtime: f64,
    /// First byte of the region used.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub offset: u64,
    /// Bytes of the region used (default: to the end of the volume).
    #[arg(long, value_parser = parse_bytes)]
    pub size: Option<u64>,
    /// Write with FUA.
    #[arg(long)]
    pub fua: bool,
    /// Seed of the random offsets and the read/write mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// Counters of one direction.
#[derive(Default)]
struct Direction {
    ios: u64,
    bytes: u64,
    errors: u64,
    latency: Histogram,
}

/// The first failed IO (kept without allocating).
#[derive(Clone, Copy)]
struct FirstError {
    kind: IoKind,
    offset: u64,
    len: u32,
    error: IoError,
}

impl fmt::Display for FirstError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} of {} bytes at offset {}: {}",
            self.kind, self.len, self.offset, self.error
        )
    }
}

/// xorshift64*: offsets and the read/write choice.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..bound` (`bound` > 0), by multiply-shift.
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u64
    }
}

/// Latency numbers of one direction, ns.
#[derive(Serialize)]
struct LatencyReport {
    min: u64,
    mean: f64,
    p50: u64,
    p99: u64,
    p99_9: u64,
    max: u64,
}

/// One direction's result.
#[derive(Serialize)]
struct DirectionReport {
    ios: u64,
    bytes: u64,
    iops: f64,
    mb_per_s: f64,
    errors: u64,
    latency_ns: LatencyReport,
}

impl DirectionReport {
    fn new(direction: &Direction, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64();
        let h = &direction.latency;
        Self {
            ios: direction.ios,
            bytes: direction.bytes,
            iops: if secs > 0.0 {
                direction.ios as f64 / secs
            } else {
                0.0
            },
            mb_per_s: megabytes_per_second(direction.bytes, elapsed),
            errors: direction.errors,
            latency_ns: LatencyReport {
                min: h.min(),
                mean: h.mean(),
                p50: h.quantile(0.50),
                p99: h.quantile(0.99),
                p99_9: h.quantile(0.999),
                max: h.max(),
            },
        }
    }
}

/// The initiator's view of the run.
#[derive(Serialize)]
struct InitiatorReport {
    /// RTRS requests sent (IOs longer than `max_io_size` take several).
    requests: u64,
    /// IOs held while the session was down.
    held: u64,
    /// IOs that waited for an RTRS permit.
    permit_waits: u64,
    /// Session reconnects.
    reconnects: u64,
}

/// The whole result (`--json`).
#[derive(Serialize)]
struct Report {
    workload: String,
    read_percent: u8,
    block_size: u64,
    queue_depth: u16,
    runtime_s: f64,
    elapsed_s: f64,
    volume: String,
    region_offset: u64,
    region_size: u64,
    read: DirectionReport,
    write: DirectionReport,
    errors: u64,
    first_error: Option<String>,
    initiator: InitiatorReport,
}

/// Runs `brick bench`.
///
/// # Errors
///
/// Bad options, connection and open failures, a refused submission.
pub fn run(args: &BenchArgs) -> Result<()> {
    if !(args.runtime.is_finite() && args.runtime > 0.0) {
        bail!(
            "--runtime {}: expected a positive number of seconds",
            args.runtime
        );
    }
    if args.bs == 0 || args.bs > MAX_BLOCK {
        bail!(
            "--bs {}: expected 1..={} bytes",
            args.bs,
            format_bytes(MAX_BLOCK)
        );
    }
    if args.qd == 0 || args.qd > MAX_QUEUE_DEPTH {
        bail!("--qd {}: expected 1..={MAX_QUEUE_DEPTH}", args.qd);
    }
    let buffers = u64::from(args.qd) * args.bs.next_multiple_of(4096);
    if buffers > MAX_BUFFER_BYTES {
        bail!(
            "--qd {} x --bs {} needs {} of registered IO buffers; expected at most {}",
            args.qd,
            format_bytes(args.bs),
            format_bytes_approx(buffers),
            format_bytes(MAX_BUFFER_BYTES)
        );
    }
    let workload = args.rw;
    if args.connect.ro && workload.read_percent() < 100 {
        bail!("--rw {workload} writes, but --ro maps the volume read-only; expected a read-only workload (randread or read)");
    }
    let max_transfer = args.bs.next_multiple_of(4096).max(4096) as u32;
    let spec = args.connect.spec(args.qd, max_transfer)?;
    let (session, volume) = args.connect.open(&spec)?;
    let result = run_open(args, &session, &volume);
    finish(session, volume, result)
}

/// `brick bench` on the open volume.
fn run_open(args: &BenchArgs, session: &Session, volume: &Volume) -> Result<()> {
    let workload = args.rw;
    let info = volume.info();
    let name = &args.connect.volume;
    let Some(available) = info.size.checked_sub(args.offset) else {
        bail!(
            "--offset {} is past the end of volume {name:?}: it has {} bytes ({}); expected an offset below {}",
            args.offset,
            info.size,
            format_bytes(info.size),
            info.size
        );
    };
    let region = args.size.unwrap_or(available);
    check_range(
        name,
        info.size,
        info.logical_block_size,
        args.offset,
        region,
        "--size",
    )?;
    if args.bs % u64::from(info.logical_block_size) != 0 {
        bail!(
            "--bs {} is not a multiple of the {}-byte block size of volume {name:?}",
            args.bs,
            info.logical_block_size
        );
    }
    let blocks = region / args.bs;
    if blocks == 0 {
        bail!(
            "the region ({region} bytes) is smaller than one --bs {} IO; expected --size >= --bs",
            args.bs
        );
    }
    let runtime = Duration::from_secs_f64(args.runtime);
    let mut state = Bench {
        session,
        volume,
        workload,
        bs: args.bs,
        qd: usize::from(args.qd),
        region_offset: args.offset,
        blocks,
        fua: args.fua,
        rng: Rng(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
        cursor: 0,
        next_tag: 0,
        data: vec![0u8; args.bs as usize],
        read: Direction::default(),
        write: Direction::default(),
        first_error: None,
    };
    pattern::fill(args.seed, 0, &mut state.data);
    if !args.json {
        eprintln!(
            "brick bench: {workload}, bs {}, qd {}, {} s on volume {name:?} bytes {}..{} ({} blocks of {})",
            format_bytes(args.bs),
            args.qd,
            args.runtime,
            args.offset,
            args.offset + region,
            blocks,
            format_bytes(args.bs)
        );
    }
    let elapsed = state.run(runtime)?;
    let stats = volume.stats().unwrap_or_default();
    let session_stats = session.stats();
    let report = Report {
        workload: workload.to_string(),
        read_percent: workload.read_percent(),
        block_size: args.bs,
        queue_depth: args.qd,
        runtime_s: args.runtime,
        elapsed_s: elapsed.as_secs_f64(),
        volume: name.clone(),
        region_offset: args.offset,
        region_size: region,
        read: DirectionReport::new(&state.read, elapsed),
        write: DirectionReport::new(&state.write, elapsed),
        errors: state.read.errors + state.write.errors,
        first_error: state.first_error.map(|e| e.to_string()),
        initiator: InitiatorReport {
            requests: stats.requests,
            held: stats.held,
            permit_waits: session_stats.permit_waits,
            reconnects: session_stats.reconnects,
        },
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("encode the JSON report")?
        );
    } else {
        print_text(&report);
    }
    Ok(())
}

/// The text report.
fn print_text(report: &Report) {
    println!(
        "{} bs={} qd={}: {:.3} s, volume {:?} bytes {}..{}",
        report.workload,
        format_bytes(report.block_size),
        report.queue_depth,
        report.elapsed_s,
        report.volume,
        report.region_offset,
        report.region_offset + report.region_size
    );
    for (label, direction) in [("read", &report.read), ("write", &report.write)] {
        if direction.ios == 0 && direction.errors == 0 {
            continue;
        }
        let l = &direction.latency_ns;
        let us = |ns: u64| ns as f64 / 1e3;
        println!(
            "  {label:<5}: {:>10.0} IOPS {:>9.1} MB/s  ({} IOs, {})",
            direction.iops,
            direction.mb_per_s,
            direction.ios,
            format_bytes_approx(direction.bytes)
        );
        println!(
            "         latency us: min {:.1} mean {:.1} p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
            us(l.min),
            l.mean / 1e3,
            us(l.p50),
            us(l.p99),
            us(l.p99_9),
            us(l.max)
        );
    }
    println!(
        "  errors: {}{}",
        report.errors,
        report
            .first_error
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
    println!(
        "  initiator: {} RTRS requests, {} permit waits, {} held, {} reconnects",
        report.initiator.requests,
        report.initiator.permit_waits,
        report.initiator.held,
        report.initiator.reconnects
    );
}

/// The running benchmark.
struct Bench<'a> {
    session: &'a Session,
    volume: &'a Volume,
    workload: Workload,
    bs: u64,
    qd: usize,
    region_offset: u64,
    blocks: u64,
    fua: bool,
    rng: Rng,
    /// Next block of a sequential workload.
    cursor: u64,
    next_tag: u64,
    /// The write data (preallocated).
    data: Vec<u8>,
    read: Direction,
    write: Direction,
    first_error: Option<FirstError>,
}

impl Bench<'_> {
    /// Submits one IO.
    fn submit(&mut self) -> Result<()> {
        let block = if self.workload.random() {
            self.rng.below(self.blocks)
        } else {
            let block = self.cursor;
            self.cursor = (self.cursor + 1) % self.blocks;
            block
        };
        let offset = self.region_offset + block * self.bs;
        let read = match self.workload.read_percent() {
            100 => true,
            0 => false,
            percent => self.rng.below(100) < u64::from(percent),
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let result = if read {
            self.volume.submit_read(tag, offset, self.bs as u32)
        } else {
            self.volume.submit_write(tag, offset, &self.data, self.fua)
        };
        result.with_context(|| {
            format!(
                "submit {} of {} bytes at offset {offset}",
                if read { "read" } else { "write" },
                self.bs
            )
        })
    }

    /// Submits for `runtime`, drains, returns the elapsed time.
    fn run(&mut self, runtime: Duration) -> Result<Duration> {
        let mut progress = Progress::new();
        let start = Instant::now();
        let deadline = start + runtime;
        let mut submitting = true;
        let mut drain_deadline = None;
        loop {
            let now = Instant::now();
            if submitting && now >= deadline {
                submitting = false;
                drain_deadline = Some(now + DRAIN_TIMEOUT);
            }
            if submitting {
                while self.session.in_flight() < self.qd {
                    self.submit()?;
                }
            }
            let in_flight = self.session.in_flight();
            if !submitting && in_flight == 0 {
                break;
            }
            if let Some(limit) = drain_deadline {
                if now >= limit {
                    bail!(
                        "{in_flight} IOs still in flight {} s after the runtime; expected none",
                        DRAIN_TIMEOUT.as_secs()
                    );
                }
            }
            let wake = if submitting {
                deadline.min(progress.due_at())
            } else {
                progress.due_at()
            };
            let timeout = wake.saturating_duration_since(now);
            let (read, write, first_error) =
                (&mut self.read, &mut self.write, &mut self.first_error);
            self.session
                .reap(self.qd, timeout, |completion, _data| {
                    let direction = match completion.kind {
                        IoKind::Read => &mut *read,
                        _ => &mut *write,
                    };
                    match completion.result {
                        Ok(()) => {
                            direction.ios += 1;
                            direction.bytes += u64::from(completion.len);
                            direction.latency.record(completion.latency_ns);
                        }
                        Err(error) => {
                            direction.errors += 1;
                            first_error.get_or_insert(FirstError {
                                kind: completion.kind,
                                offset: completion.offset,
                                len: completion.len,
                                error,
                            });
                        }
                    }
                })
                .context("reap completions")?;
            let (read, write) = (&self.read, &self.write);
            progress.tick(|elapsed| {
                let mut line = format!("{:>4.0}s", elapsed.as_secs_f64());
                for (label, d) in [("read", read), ("write", write)] {
                    if d.ios > 0 {
                        let secs = elapsed.as_secs_f64().max(1e-9);
                        line.push_str(&format!(
                            "  {label} {:.0} IOPS {:.1} MB/s",
                            d.ios as f64 / secs,
                            megabytes_per_second(d.bytes, elapsed)
                        ));
                    }
                }
                let errors = read.errors + write.errors;
                line.push_str(&format!("  errors {errors}"));
                if !submitting {
                    line.push_str(&format!("  (draining {in_flight})"));
                }
                line
            });
        }
        let elapsed = start.elapsed();
        progress.finish();
        Ok(elapsed)
    }
}
