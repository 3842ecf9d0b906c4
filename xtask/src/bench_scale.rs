//! `cargo xtask bench-scale`: one hosted `brick-target` against many
//! concurrent sessions, each from its own loopback address.
//!
//! For every row (`--sessions 10,100,1000`) a manifest sized for that
//! many sessions is written (one path of two connections each, queue
//! depth `--qd`, 8 KiB chunks, a RAM volume of 256 KiB per session: RNBD
//! admits one writer per volume), a fresh target starts on `udp:127.0.0.1:PORT`, and one
//! `brick scale` process brings all sessions up at once and runs verified
//! 4 KiB IO (write, read back, check) at `--qd` per session for
//! `--runtime` seconds. A first row of one session is the reference the
//! others are read against. Printed per row: the time until every
//! session was up, IOPS over all sessions, the median over sessions of
//! their p50 and p99 latency, the worst session's p99, IOs checked,
//! errors, the target's registered chunk memory per session (from the
//! manifest), its resident memory and the growth per session, and its CPU
//! use over the IO phase.
//!
//! `--processes N` (default 100; 0 skips) then starts one target whose
//! manifest admits N sessions and N concurrent `brick bench` processes
//! (4 KiB random read/write on a 4 MiB volume each, each its own source
//! address and session),
//! and counts the ones that succeeded with 0 errors.
//!
//! It prints numbers; it is not a test. The exit status is non-zero if a
//! row had errors or not every session or process succeeded.

use crate::demo::{free_port, TargetProcess};
use crate::util::step;
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `cargo xtask bench-scale`.
#[derive(clap::Args)]
pub struct BenchScaleArgs {
    /// Session counts, one row each (a reference row of 1 comes first).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    sessions: Vec<u32>,
    /// IOs in flight per session.
    #[arg(long, default_value_t = 16)]
    qd: u16,
    /// Seconds of IO per row.
    #[arg(long, default_value_t = 10)]
    runtime: u32,
    /// Concurrent `brick bench` processes in the last part (0: skip it).
    #[arg(long, default_value_t = 100)]
    processes: u32,
}

/// KiB of each session's volume (64 blocks of 4 KiB: 4 per IO slot at
/// queue depth 16).
const VOLUME_KIB: u64 = 256;
/// Chunk size of the manifests: a 4 KiB IO plus the header reserve.
const CHUNK_BYTES: u64 = 8 * 1024;
/// RTRS connections per session (the service connection and one for IO).
const CONNECTIONS: u16 = 2;

/// One measured row.
struct Row {
    sessions: u32,
    up: u64,
    connect_s: f64,
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    worst_p99_us: f64,
    ios: u64,
    errors: u64,
    rss_idle_kib: u64,
    rss_kib: u64,
    cpu_percent: f64,
    first_error: Option<String>,
}

pub fn run(args: BenchScaleArgs) -> Result<()> {
    let (target_binary, cli) = crate::util::build_target_and_cli()?;
    let dir = crate::paths::scratch("bench-scale");
    let mut counts = vec![1];
    counts.extend(args.sessions.iter().copied().filter(|n| *n > 0));
    let mut rows = Vec::new();
    for &sessions in &counts {
        step(format!(
            "{sessions} session(s), queue depth {}, {} s of verified 4 KiB IO",
            args.qd, args.runtime
        ));
        let row = measure(&target_binary, &cli, &dir, sessions, &args)
            .with_context(|| format!("the row of {sessions} sessions"))?;
        rows.push(row);
    }
    let processes = if args.processes > 0 {
        step(format!(
            "{} concurrent `brick bench` processes against one target",
            args.processes
        ));
        Some(processes(&target_binary, &cli, &dir, &args)?)
    } else {
        None
    };

    println!();
    println!(
        "bench-scale: hosted brick-target on UDP loopback, queue depth {} per session, 4 KiB write+read-back-verify, {} s per row, a {VOLUME_KIB} KiB volume per session",
        args.qd, args.runtime
    );
    println!(
        "| sessions | up | connect all | IOPS | x ref | session p50 (median) | session p99 (median) | worst p99 | IOs verified | errors | chunk KiB/session | target RSS | +KiB/session | target CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let reference = rows.first().map(|r| r.iops).unwrap_or(0.0);
    let mut failed = false;
    for row in &rows {
        let per_session = row.rss_kib.saturating_sub(row.rss_idle_kib) / u64::from(row.sessions);
        println!(
            "| {} | {} | {:.2} s | {:.0} | x{:.2} | {:.0} us | {:.0} us | {:.0} us | {} | {} | {} | {} MiB | {} | {:.0} % |",
            row.sessions,
            row.up,
            row.connect_s,
            row.iops,
            if reference > 0.0 { row.iops / reference } else { 0.0 },
            row.p50_us,
            row.p99_us,
            row.worst_p99_us,
            row.ios / 2,
            row.errors,
            u64::from(args.qd) * CHUNK_BYTES / 1024,
            row.rss_kib / 1024,
            per_session,
            row.cpu_percent,
        );
        if row.errors > 0 || row.up < u64::from(row.sessions) {
            failed = true;
        }
    }
    for row in rows.iter().filter(|r| r.first_error.is_some()) {
        println!(
            "{} sessions: first error: {}",
            row.sessions,
            row.first_error.as_deref().unwrap_or("")
        );
    }
    if let Some((ok, total, errors, iops)) = processes {
        println!(
            "{total} concurrent `brick bench` processes (4 KiB randrw, queue depth {}): {ok} succeeded with 0 errors, {errors} IO errors, {iops:.0} IOPS in all",
            args.qd
        );
        failed |= ok < total;
    }
    println!("scratch: {}", dir.display());
    if failed {
        bail!("a row had errors or sessions that did not come up (see above)");
    }
    Ok(())
}

/// The manifest for `sessions` sessions with `connections` connections
/// each and a volume `v<i>` per session (`max_half_open` at its default,
/// which follows `max_sessions`).
fn manifest(sessions: u32, qd: u16, connections: u16, volume_kib: u64) -> String {
    let mut text = format!(
        "# bench-scale: {sessions} sessions\n\
         [target]\nname = \"bench-scale\"\n\n\
         [[interfaces]]\nname = \"lo\"\nmac = \"52:54:00:7f:00:01\"\naddress = \"127.0.0.1/8\"\n\n\
         [limits]\nmax_sessions = {sessions}\nmax_paths_per_session = 1\n\
         max_connections_per_path = {connections}\nqueue_depth = {qd}\nchunk_size = \"{}KiB\"\n\n",
        CHUNK_BYTES / 1024
    );
    for v in 0..sessions {
        let _ = write!(
            text,
            "[[volumes]]\nname = \"v{v}\"\nkind = \"ram\"\nsize = \"{volume_kib}KiB\"\n\n"
        );
    }
    text.push_str("[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n");
    text
}

/// Resident KiB and CPU ticks (user + system) of process `pid`.
fn usage(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th fields of the line.
    let ticks = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let field = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            field(11) + field(12)
        })
        .unwrap_or(0);
    (rss, ticks)
}

/// Clock ticks per second of /proc's CPU times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf(3) reads a constant; no memory is involved.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn start_target(
    binary: &Path,
    dir: &Path,
    name: &str,
    manifest_text: &str,
) -> Result<(TargetProcess, u16)> {
    let manifest_path = dir.join(format!("{name}.toml"));
    std::fs::write(&manifest_path, manifest_text)?;
    let port = free_port()?;
    let target = TargetProcess::start(
        binary,
        &manifest_path,
        &format!("udp:127.0.0.1:{port}"),
        dir.join(format!("{name}-target.log")),
    )?;
    Ok((target, port))
}

fn measure(
    binary: &Path,
    cli: &Path,
    dir: &Path,
    sessions: u32,
    args: &BenchScaleArgs,
) -> Result<Row> {
    let name = format!("scale-{sessions}");
    let (target, port) = start_target(
        binary,
        dir,
        &name,
        &manifest(sessions, args.qd, CONNECTIONS, VOLUME_KIB),
    )?;
    let pid = target.child.id();
    std::thread::sleep(Duration::from_millis(200));
    let (rss_idle_kib, _) = usage(pid);
    let report_path = dir.join(format!("{name}.json"));
    let mut child = Command::new(cli)
        .args([
            "scale",
            "--target",
            "127.0.0.1",
            "--udp-port",
            &port.to_string(),
        ])
        .args([
            "--sessions",
            &sessions.to_string(),
            "--session-prefix",
            &name,
        ])
        .args(["--volume", "v{}", "--volume-count", &sessions.to_string()])
        .args([
            "--qd",
            &args.qd.to_string(),
            "--runtime",
            &args.runtime.to_string(),
        ])
        .args(["--connections", &CONNECTIONS.to_string(), "--json"])
        .stdout(Stdio::from(std::fs::File::create(&report_path)?))
        .stderr(Stdio::inherit())
        .spawn()
        .context("start brick scale")?;
    // The IO phase: from the moment all sessions are up (the report says
    // when) to the end; sample the target every 100 ms and keep the CPU
    // ticks of the last `runtime` seconds before brick scale drains.
    let start = Instant::now();
    let mut samples: Vec<(Instant, u64, u64)> = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let (rss, ticks) = usage(pid);
        samples.push((Instant::now(), rss, ticks));
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&report_path).unwrap_or_default();
    let json_line = text.lines().rev().find(|l| l.trim_start().starts_with('{'));
    let Some(json_line) = json_line else {
        bail!(
            "brick scale ({status}) printed no report; target log:\n{}",
            tail(&target.log(), 30)
        );
    };
    let value: serde_json::Value =
        serde_json::from_str(json_line).with_context(|| format!("parse {json_line}"))?;
    let num = |key: &str| value.get(key).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let connect_s = num("connect_s");
    let runtime_s = num("runtime_s");
    // CPU over the IO phase: the samples between connect end and IO end.
    let io_start = start + Duration::from_secs_f64(connect_s);
    let io_end = io_start + Duration::from_secs_f64(runtime_s);
    let in_io: Vec<&(Instant, u64, u64)> = samples
        .iter()
        .filter(|(at, _, _)| *at >= io_start && *at <= io_end)
        .collect();
    let (cpu_percent, rss_kib) = match (in_io.first(), in_io.last()) {
        (Some(first), Some(last)) if last.0 > first.0 => {
            let seconds = last.0.duration_since(first.0).as_secs_f64();
            let cpu = (last.2 - first.2) as f64 / ticks_per_second() / seconds * 100.0;
            (cpu, in_io.iter().map(|s| s.1).max().unwrap_or(0))
        }
        _ => (0.0, samples.iter().map(|s| s.1).max().unwrap_or(0)),
    };
    let row = Row {
        sessions,
        up: num("sessions_up") as u64,
        connect_s,
        iops: num("iops"),
        p50_us: num("session_p50_us_median"),
        p99_us: num("session_p99_us_median"),
        worst_p99_us: num("worst_p99_us"),
        ios: num("ios") as u64,
        errors: num("errors") as u64 + num("mismatches") as u64,
        rss_idle_kib,
        rss_kib,
        cpu_percent,
        first_error: value
            .get("first_error")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
    };
    drop(target);
    Ok(row)
}

/// `args.processes` `brick bench` processes at once: how many succeeded
/// with 0 errors, the IO errors and the IOPS they reported in all.
fn processes(
    binary: &Path,
    cli: &Path,
    dir: &Path,
    args: &BenchScaleArgs,
) -> Result<(u32, u32, u64, f64)> {
    let total = args.processes;
    // `brick bench` opens three connections per path.
    let (target, port) =
        start_target(binary, dir, "processes", &manifest(total, args.qd, 3, 4096))?;
    let mut children = Vec::new();
    for i in 0..total {
        let source = format!("127.2.{}.{}", (i + 1) / 250, (i + 1) % 250 + 1);
        let log: PathBuf = dir.join(format!("bench-{i}.log"));
        let volume = format!("v{i}");
        let child = Command::new(cli)
            .args([
                "bench",
                "--target",
                "127.0.0.1",
                "--link",
                &format!("udp:{source}:{port}"),
            ])
            .args(["--session", &format!("proc-{i}"), "--volume", &volume])
            .args(["--rw", "randrw", "--bs", "4k", "--qd", &args.qd.to_string()])
            .args([
                "--runtime",
                &args.runtime.to_string(),
                "--connect-timeout",
                "60",
                "--json",
            ])
            .stdout(Stdio::from(std::fs::File::create(&log)?))
            .stderr(Stdio::null())
            .spawn()
            .context("start brick bench")?;
        children.push((child, log));
    }
    let mut ok = 0;
    let mut errors = 0u64;
    let mut iops = 0.0;
    for (i, (mut child, log)) in children.into_iter().enumerate() {
        let status = child.wait()?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let value = text
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        let Some(value) = value else {
            println!(
                "  bench process {i}: {status}, no report (log {})",
                log.display()
            );
            continue;
        };
        let count = |dir: &str, key: &str| {
            value
                .get(dir)
                .and_then(|d| d.get(key))
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0)
        };
        let e = (count("read", "errors") + count("write", "errors")) as u64;
        errors += e;
        iops += count("read", "iops") + count("write", "iops");
        if status.success() && e == 0 {
            ok += 1;
        } else {
            println!(
                "  bench process {i}: {status}, {e} errors (log {})",
                log.display()
            );
        }
    }
    drop(target);
    Ok((ok, total, errors, iops))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
