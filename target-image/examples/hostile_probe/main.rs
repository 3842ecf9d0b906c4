//! `hostile_probe`: hostile RTRS/RNBD clients against a running target.
//!
//! ```text
//! hostile_probe --link frame:connect:PATH --target 10.99.0.1 \
//!     --local 10.99.0.2/24 --mac 52:54:00:99:00:02 [--session-prefix probe] \
//!     [--refused-session denied-probe] [--ro-volume probe-ro] [--rw-volume probe-rw] \
//!     [--healthy-volume probe-healthy] [--pinned-prefix pinned-probe] \
//!     [--outsider 10.99.0.200] [--max-connections 65] [--max-sessions 16] \
//!     [--max-half-open 16] [--max-half-open-per-source 4] [--setup-timeout-ms 5000] \
//!     [--pause-ms 4500] [--wait 20] [--only NAME]
//! ```
//!
//! The attacks of `tests/hostile.rs` and more, against a hosted
//! `brick-target` (or any RTRS/RNBD server) on an Ethernet link, while
//! someone else, typically the stock Linux client, uses the target: CM
//! level (`cases/connect.rs`: malformed CON_REQs, storms from one and many
//! addresses, the half-open limits and deadline, takeovers), session level
//! (`cases/session.rs`: the session limit, refused and squatted names,
//! access rules on a second path, sessions dropped without a close), RTRS
//! IO (`cases/io.rs`: bad immediates, chunk ids and offsets, READ
//! descriptors, floods, heartbeats, a client that stops reading) and RNBD
//! (`cases/rnbd.rs`: OPEN and CLOSE misuse, IO after close, malformed and
//! out-of-range IO, flush storms). Each gets exactly the answer it expects
//! (the protocol's errno or a closed path).
//!
//! Beside the attacks runs a healthy Brick client (`healthy.rs`): its own
//! address (`--local` itself), session `PREFIX-healthy`, volume
//! `--healthy-volume` read-write, verified IO (write, read back, compare)
//! all the time. Its IO rate is measured before the first case (the
//! baseline) and per case; any error, a mismatch, its session going down,
//! or its rate over the whole run below 80 % of the baseline fails the
//! probe.
//!
//! The probe is a few simulated hosts on one link (`wire.rs`): each client
//! (Brick's RTRS client, or a raw verbs client) owns a software HCA
//! (Ethernet mode) at its own address, `--local` + n and `--mac` + n; the
//! cases' nodes take n = 1 ..= 100 in turn (`--outsider` is the one address
//! outside them). The clients, their attacks and the waits are
//! `tests/common/clients.rs`, shared with the engine tests, here over a
//! `hal::hosted::FrameLink` and the monotonic clock. Every wait is bounded
//! by `--wait` seconds and names what it waited for.
//!
//! The target must grant sessions named `PREFIX-*` read-only access to
//! `--ro-volume` and read-write access to `--rw-volume` (both at least
//! 64 KiB, 1 MiB expected), `PREFIX-healthy` read-write access to
//! `--healthy-volume` (at least 256 KiB), sessions `PINNED-*` read-write
//! access to `--rw-volume` from `--local`'s /25 only (not from
//! `--outsider`), refuse `--refused-session` everything, and have a queue
//! depth that is not a power of two (so a chunk id beyond it fits the
//! immediate). Prints one line per case, `case NAME ... ok (expected X, got
//! X)` or `case NAME ... FAIL: expected X, found Y`, the healthy client's
//! rate per case, then a summary. Exit status 0 if every case passed and
//! the healthy client stayed healthy, 1 if not, 2 on a usage or link
//! error.

#[path = "../../tests/common/clients.rs"]
mod clients;

mod cases;
mod healthy;
mod outcome;
mod wire;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

use clap::Parser;
use hal::hosted::{Link, LinkSpec, MonotonicClock, OsRng};
use hal::Rng;

use outcome::panic_text;
use wire::Wire;

/// Stack of the probe thread (the HCAs are built on it before moving).
const PROBE_STACK: usize = 256 << 20;

/// Hostile RTRS/RNBD clients against a running target.
#[derive(Parser, Debug)]
#[command(name = "hostile_probe")]
pub struct Args {
    /// The link: frame:connect:PATH, frame:listen:PATH, tcp:connect:ADDR, ...
    #[arg(long)]
    link: LinkSpec,
    /// The target's address on the link.
    #[arg(long)]
    target: Ipv4Addr,
    /// The target's RDMA CM port.
    #[arg(long, default_value_t = 1234)]
    port: u16,
    /// The first client's address (A.B.C.D/LEN; the prefix is accepted and
    /// ignored: the target is on-link). Further clients take the next ones.
    #[arg(long)]
    local: String,
    /// The first client's MAC; further clients take the next ones.
    #[arg(long)]
    mac: String,
    /// Session names are PREFIX-CASE.
    #[arg(long, default_value = "probe")]
    pub session_prefix: String,
    /// A session name no access rule admits.
    #[arg(long, default_value = "denied-probe")]
    pub refused_session: String,
    /// A volume PREFIX-* sessions may open read-only.
    #[arg(long, default_value = "probe-ro")]
    pub ro_volume: String,
    /// A volume PREFIX-* sessions may open read-write.
    #[arg(long, default_value = "probe-rw")]
    pub rw_volume: String,
    /// The healthy client's volume (session PREFIX-healthy, read-write).
    #[arg(long, default_value = "probe-healthy")]
    pub healthy_volume: String,
    /// Sessions PINNED-* may open --rw-volume from --local's /25 only.
    #[arg(long, default_value = "pinned-probe")]
    pub pinned_prefix: String,
    /// An address on --local's /24 outside its /25 (refused for PINNED-*).
    #[arg(long, default_value = "10.99.0.200")]
    pub outsider: Ipv4Addr,
    /// The target's `max_connections_per_path`.
    #[arg(long, default_value_t = 65)]
    pub max_connections: u16,
    /// The target's `max_sessions` (bounds the session case).
    #[arg(long, default_value_t = 16)]
    pub max_sessions: u16,
    /// The target's RTRS `max_half_open` (half-open paths in all).
    #[arg(long, default_value_t = 16)]
    pub max_half_open: u16,
    /// The target's RTRS `max_half_open_per_source`.
    #[arg(long, default_value_t = 4)]
    pub max_half_open_per_source: u16,
    /// The target's RTRS setup deadline, milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub setup_timeout_ms: u64,
    /// Milliseconds between cases: the target's CM keeps a closed
    /// connection's slot through its timewait (roce: 4.096 s), and a case
    /// must not find them taken by the one before.
    #[arg(long, default_value_t = 4500)]
    pub pause_ms: u64,
    /// Seconds any one wait may take.
    #[arg(long, default_value_t = 20)]
    wait: u64,
    /// Run only the case NAME (repeatable).
    #[arg(long)]
    only: Vec<String>,
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = text.split(':').collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!("bad MAC address {text:?}"));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|_| format!("bad MAC address {text:?}"))?;
    }
    Ok(mac)
}

/// Opens the link, starts the healthy client and runs the cases;
/// `Ok(failures)` or a setup error.
fn probe(args: Args) -> Result<usize, String> {
    let address = args.local.split('/').next().unwrap_or(&args.local);
    let ip: Ipv4Addr = address
        .parse()
        .map_err(|_| format!("bad --local {:?}", args.local))?;
    let mac = parse_mac(&args.mac)?;
    let cases = cases::all(&args);
    if let Some(unknown) = args
        .only
        .iter()
        .find(|name| !cases.iter().any(|c| c.name == name.as_str()))
    {
        return Err(format!("--only {unknown}: no such case"));
    }
    let link = match args.link.open() {
        Ok(Link::Frame(link)) => link.with_mac(mac),
        Ok(Link::Udp(_)) => return Err("the probe needs an Ethernet link, not udp:".into()),
        Err(error) => return Err(format!("link {}: {error}", args.link)),
    };
    let mut wire = Wire {
        link,
        clock: MonotonicClock::new(),
        server: SocketAddr::V4(SocketAddrV4::new(args.target, args.port)),
        clients: Vec::new(),
        raws: Vec::new(),
        held: Vec::new(),
        keep: 0,
        wait_ns: args.wait.saturating_mul(1_000_000_000),
        base_ip: ip.octets(),
        base_mac: mac,
        made: 0,
        seed: u64::from(OsRng.next_u32()) << 32 | u64::from(OsRng.next_u32()),
        frames_in: 0,
        frames_out: 0,
    };
    // Failures are reported per case, from the panic's message.
    std::panic::set_hook(Box::new(|_| {}));
    let mut healthy = catch_unwind(AssertUnwindSafe(|| {
        healthy::Healthy::start(&mut wire, &args)
    }))
    .map_err(|p| format!("the healthy client: {}", panic_text(p.as_ref())))??;
    let selected: Vec<&cases::Case> = cases
        .iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|o| o == c.name))
        .collect();
    let mut failed = 0;
    for case in &selected {
        let mark = healthy.mark(&wire);
        let result = catch_unwind(AssertUnwindSafe(|| (case.run)(&mut wire, &args)));
        let cleanup = catch_unwind(AssertUnwindSafe(|| wire.reset()));
        if cleanup.is_err() {
            wire.clients.truncate(wire.keep);
            wire.raws.clear();
        }
        match result {
            Ok(got) if got == case.expected => {
                println!("case {} ... ok (expected {got}, got {got})", case.name);
            }
            Ok(got) => {
                failed += 1;
                println!(
                    "case {} ... FAIL: expected {}, found {got}",
                    case.name, case.expected
                );
            }
            Err(payload) => {
                failed += 1;
                println!(
                    "case {} ... FAIL: expected {}, found {}",
                    case.name,
                    case.expected,
                    panic_text(payload.as_ref())
                );
            }
        }
        if let Err(trouble) = healthy.after_case(&wire, case.name, mark) {
            failed += 1;
            println!("healthy client during {} ... FAIL: {trouble}", case.name);
        }
        wire.run_for(args.pause_ms * 1_000_000);
    }
    let verdict = healthy.finish(&mut wire);
    println!("{}", verdict.report);
    if !verdict.ok {
        failed += 1;
    }
    println!(
        "hostile_probe: {} cases, {} failures ({} frames in, {} out)",
        selected.len(),
        failed,
        wire.frames_in,
        wire.frames_out
    );
    Ok(failed)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let worker = std::thread::Builder::new()
        .name("hostile-probe".into())
        .stack_size(PROBE_STACK)
        .spawn(move || probe(args));
    match worker.map(|w| w.join()) {
        Ok(Ok(Ok(0))) => ExitCode::SUCCESS,
        Ok(Ok(Ok(_))) => ExitCode::from(1),
        Ok(Ok(Err(message))) => {
            eprintln!("hostile_probe: {message}");
            ExitCode::from(2)
        }
        _ => {
            eprintln!("hostile_probe: the probe thread failed");
            ExitCode::from(2)
        }
    }
}
