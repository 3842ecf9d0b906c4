//! `cargo xtask test`: the two test tiers.
//!
//! Default (CI): lint, host tests, Brick's initiator against the hosted
//! target as processes on this host (`initiator_suite`: a lossy link, a
//! crash under IO), the bare-metal image's boot checks (`image::suite`,
//! no Linux VMs), then one VM bed per target kind running the smoke
//! cases and the interop suite. `--full`: every case, including multipath with a path
//! cut, target restarts and the long verifies. Cases are written against a
//! [`Bed`] ("a target at an address on a link"), so a new target kind only
//! adds a line to [`target_kinds`]. Sizes suit TCG (~300 IOPS at 4 KiB):
//! verifies of 4-16 MiB, not gigabytes.
//!
//! No case runs the Linux initiator through a lossy relay: Linux 6.1 rxe
//! hangs IO under loss, as a target's requester after a retransmission
//! (tests/vectors/README.md, rnbd-lossy-stall) and as the client (its
//! fio never completes after "rxe_reg_fast_mr: mr->lkey ... not free";
//! measured with random and with every-25th drops against both the Linux
//! and the Brick target). Brick under loss is tested by the roce soak and
//! by Brick's own initiator.

mod cases;
mod daemon;
mod hostile;

use crate::first_map;
use crate::target::{Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::{bail, Context, Result};
use cases::*;
use daemon::{
    daemon_maps_and_reloads, daemon_readds_path, daemon_remaps_lost_volume,
    daemon_restart_idempotent, daemon_revives_given_up, daemon_runtime_map, CLI_IN_GUEST,
    DAEMON_IN_GUEST,
};
use hostile::{hostile_neighbour, NO_PROBE_PORT};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Run everything (resilience, nvme-rdma, long verifies).
    #[arg(long)]
    full: bool,
    /// Only VM cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Skip lint and host tests (VM cases only).
    #[arg(long)]
    vm_only: bool,
    /// Skip the VM cases (lint and host tests only).
    #[arg(long)]
    host_only: bool,
    /// Only these target kinds (linux-ref, brick-hosted, brick-image);
    /// default: all three for the smoke tier, linux-ref and brick-hosted
    /// with `--full`.
    #[arg(long = "target")]
    targets: Vec<String>,
}

/// Which tier a case belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tier {
    Smoke,
    Full,
}

type CaseFn = fn(&mut Bed) -> Result<()>;

/// A VM test case and the bed it needs.
struct Case {
    name: &'static str,
    tier: Tier,
    paths: usize,
    mtu: u32,
    /// The bed needs a probe port (`BedConfig::probe`); target kinds
    /// without one skip the case.
    probe: bool,
    /// The initiator gets a static `brick-initiatord` and `brick`
    /// ([`DAEMON_IN_GUEST`], [`CLI_IN_GUEST`]).
    daemon: bool,
    /// The initiator gets the release `brick` with its libraries (Brick's
    /// initiator on the VM's rxe, [`crate::initiator_rxe`]).
    rxe_cli: bool,
    run: CaseFn,
}

const fn case(name: &'static str, tier: Tier, paths: usize, mtu: u32, run: CaseFn) -> Case {
    Case {
        name,
        tier,
        paths,
        mtu,
        probe: false,
        daemon: false,
        rxe_cli: false,
        run,
    }
}

/// `case` on a bed whose initiator carries `brick-initiatord`.
/// `case` with the dynamic `brick` in the initiator VM.
const fn with_rxe_cli(mut case: Case) -> Case {
    case.rxe_cli = true;
    case
}

const fn with_daemon(mut case: Case) -> Case {
    case.daemon = true;
    case
}

/// `case` on a bed with a probe port.
const fn with_probe(mut case: Case) -> Case {
    case.probe = true;
    case
}

#[rustfmt::skip]
const CASES: &[Case] = &[
    case("first_map", Tier::Smoke, 1, 1500, first_map::first_map),
    case("map_size", Tier::Smoke, 1, 1500, map_size),
    case("verify_4k_small", Tier::Smoke, 1, 1500, verify_4k_small),
    case("unmap_remap", Tier::Smoke, 1, 1500, unmap_remap),
    case("read_only", Tier::Smoke, 1, 1500, read_only),
    case("nvme_connect_verify", Tier::Smoke, 1, 1500, nvme_connect_verify),
    case("rping_linux", Tier::Smoke, 1, 1500, rping_linux),
    with_rxe_cli(case("brick_initiator_rxe", Tier::Full, 1, 1500, crate::initiator_rxe::brick_initiator_rxe)),
    with_rxe_cli(case("daemon_nbd_rxe", Tier::Full, 1, 1500, crate::initiator_rxe::daemon_nbd_rxe)),
    case("verify_4k", Tier::Full, 1, 1500, verify_4k),
    case("verify_128k", Tier::Full, 1, 1500, verify_128k),
    case("verify_mixed", Tier::Full, 1, 1500, verify_mixed),
    case("two_devices", Tier::Full, 1, 1500, two_devices),
    case("nvme_verify_mixed", Tier::Full, 1, 1500, nvme_verify_mixed),
    case("target_restart", Tier::Full, 1, 1500, target_restart),
    case("target_restart_timing", Tier::Full, 1, 1500, target_restart_timing),
    case("restart_durable", Tier::Full, 1, 1500, restart_durable),
    case("thin_fstrim", Tier::Full, 1, 1500, crate::thin_case::thin_fstrim),
    case("jumbo_verify", Tier::Full, 1, 9000, jumbo_verify),
    case("first_map_repeated", Tier::Full, 1, 1500, first_map::first_map_repeated),
    case("first_map_multipath", Tier::Full, 2, 1500, first_map::first_map),
    case("multipath_cut", Tier::Full, 2, 1500, multipath_cut),
    with_probe(case("hostile_neighbour", Tier::Full, 1, 1500, hostile_neighbour)),
    with_daemon(case("daemon_maps_and_reloads", Tier::Full, 1, 1500, daemon_maps_and_reloads)),
    with_daemon(case("daemon_readds_path", Tier::Full, 2, 1500, daemon_readds_path)),
    with_daemon(case("daemon_restart_idempotent", Tier::Full, 1, 1500, daemon_restart_idempotent)),
    with_daemon(case("daemon_runtime_map", Tier::Full, 1, 1500, daemon_runtime_map)),
    with_daemon(case("daemon_remaps_lost_volume", Tier::Full, 1, 1500, daemon_remaps_lost_volume)),
    with_daemon(case("daemon_revives_given_up", Tier::Full, 1, 1500, daemon_revives_given_up)),
];

/// The target kinds every suite runs against.
fn target_kinds() -> Vec<TargetKind> {
    vec![
        TargetKind::LinuxReference,
        TargetKind::BrickHosted,
        TargetKind::BrickImage,
        TargetKind::BrickUefi,
        TargetKind::BrickVerbs,
    ]
}

/// Case counts of one suite.
#[derive(Clone, Copy, Default)]
pub struct Counts {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Cases that do not apply, each printed with its reason.
    pub skipped: usize,
}

struct Tally {
    suites: Vec<(String, Duration, Counts)>,
    failures: Vec<String>,
}

impl Tally {
    fn total(&self) -> Counts {
        let mut total = Counts::default();
        for (_, _, counts) in &self.suites {
            total.passed += counts.passed;
            total.failed += counts.failed;
            total.skipped += counts.skipped;
        }
        total
    }
}

/// Runs the tiers and prints the summary; fails if anything failed.
pub fn run(args: TestArgs) -> Result<()> {
    let mut tally = Tally {
        suites: Vec::new(),
        failures: Vec::new(),
    };
    // Everything past lint and host tests needs the judge's packages and
    // QEMU; install them now (or say which line would), before any build.
    if !args.host_only {
        crate::setup::ensure(crate::setup::Purpose::Judge)?;
    }
    if !args.vm_only {
        suite(&mut tally, "lint", || {
            lint().map(|()| Counts {
                passed: 1,
                ..Counts::default()
            })
        });
        suite(&mut tally, "host", || host_tests(args.full));
    }
    if !args.host_only
        && args
            .filter
            .as_deref()
            .is_none_or(|f| "brick-initiator".contains(f))
        && args.targets.is_empty()
    {
        let start = Instant::now();
        let counts = crate::initiator_suite::suite(&mut tally.failures);
        tally
            .suites
            .push(("host brick-initiator".into(), start.elapsed(), counts));
    }
    if !args.host_only {
        image_suite(&mut tally, &args);
    }
    if !args.host_only {
        match Images::build() {
            Err(error) => {
                tally
                    .failures
                    .push(format!("building the VM images: {error:#}"));
                let counts = Counts {
                    failed: 1,
                    ..Counts::default()
                };
                tally
                    .suites
                    .push(("vm images".into(), Duration::ZERO, counts));
            }
            Ok(images) => {
                let kinds: Vec<TargetKind> = target_kinds()
                    .into_iter()
                    .filter(|k| {
                        if args.targets.is_empty() {
                            !(args.full && k.explicit_only())
                        } else {
                            args.targets.iter().any(|t| t == k.name())
                        }
                    })
                    .collect();
                for kind in kinds {
                    let tier = if args.full { "full" } else { "smoke" };
                    let name = format!("vm {} ({tier})", kind.name());
                    let start = Instant::now();
                    let filter = args.filter.as_deref();
                    let counts = vm_suite(&images, kind, args.full, filter, &mut tally.failures);
                    tally.suites.push((name, start.elapsed(), counts));
                }
                if args
                    .filter
                    .as_deref()
                    .is_none_or(|f| "brick-interop".contains(f))
                {
                    let start = Instant::now();
                    let counts = crate::interop::suite(&images, &mut tally.failures);
                    tally
                        .suites
                        .push(("vm brick-interop".into(), start.elapsed(), counts));
                }
            }
        }
    }
    println!();
    println!(
        "{:<36} {:>8} {:>7} {:>7} {:>7}",
        "suite", "time", "passed", "failed", "skipped"
    );
    for (name, time, c) in &tally.suites {
        let seconds = time.as_secs_f64();
        println!(
            "{name:<36} {seconds:>7.1}s {:>7} {:>7} {:>7}",
            c.passed, c.failed, c.skipped
        );
    }
    for failure in &tally.failures {
        println!("FAILED: {failure}");
    }
    if !args.host_only {
        if let Ok(version) = crate::setup::qemu() {
            println!("QEMU {version}");
        }
    }
    let total = tally.total();
    println!(
        "{} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    if total.failed > 0 {
        bail!("{} test(s) failed", total.failed);
    }
    Ok(())
}

/// The bare-metal image's boot checks (`image::suite`): no Linux VMs, a
/// few seconds of QEMU each; runs unless `--target` leaves out brick-image.
fn image_suite(tally: &mut Tally, args: &TestArgs) {
    if !(args.targets.is_empty()
        || args
            .targets
            .iter()
            .any(|t| t == "brick-image" || t == "brick-uefi"))
    {
        return;
    }
    let start = Instant::now();
    let counts = crate::image::suite(args.filter.as_deref(), &mut tally.failures);
    if counts.passed + counts.failed + counts.skipped > 0 {
        tally.suites.push(("image".into(), start.elapsed(), counts));
    }
}

fn suite(tally: &mut Tally, name: &str, f: impl FnOnce() -> Result<Counts>) {
    step(format!("suite {name}"));
    let start = Instant::now();
    let counts = match f() {
        Ok(counts) => counts,
        Err(error) => {
            tally.failures.push(format!("{name}: {error:#}"));
            Counts {
                failed: 1,
                ..Counts::default()
            }
        }
    };
    if counts.failed > 0 && !tally.failures.iter().any(|f| f.starts_with(name)) {
        tally
            .failures
            .push(format!("{name}: {} failed (see above)", counts.failed));
    }
    tally
        .suites
        .push((name.to_string(), start.elapsed(), counts));
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command.current_dir(crate::paths::repo());
    command
}

fn lint() -> Result<()> {
    crate::util::run(cargo().args(["fmt", "--all", "--check"]))
        .context("cargo fmt --check (run `cargo fmt --all`)")?;
    crate::util::run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]))
    .context("cargo clippy")?;
    // The bare-metal image and the no_std crates as the image builds them
    // (`cfg(target_os = "none")` code, the image's unsafe blocks): the host
    // build above never compiles them.
    crate::image::ensure_target()?;
    let mut image = cargo();
    image.args(["clippy", "--release", "--target", crate::image::TARGET]);
    for package in NO_STD_PACKAGES {
        image.args(["-p", package]);
    }
    image.args([
        "--no-default-features",
        "--features",
        "brick-target-image/image",
    ]);
    image.args(["--", "-D", "warnings"]);
    crate::util::run(&mut image).context("cargo clippy for the image target")?;
    // The UEFI loader as the firmware runs it (its `cfg(target_os =
    // "uefi")` code: boot services, the jump into the image).
    crate::uefi::ensure_target()?;
    crate::util::run(cargo().args([
        "clippy",
        "--release",
        "--target",
        crate::uefi::TARGET,
        "-p",
        "brick-loader",
        "--",
        "-D",
        "warnings",
    ]))
    .context("cargo clippy for the UEFI loader")?;
    Ok(())
}

/// The crates the image links, linted for its target by [`lint`].
const NO_STD_PACKAGES: &[&str] = &[
    "brick-hal",
    "brick-verbs",
    "brick-wire-enum",
    "brick-roce",
    "brick-rtrs",
    "brick-rnbd",
    "brick-manifest",
    "brick-target-image",
];

/// `cargo test --workspace`, streamed, with its pass/fail counts; the full
/// tier includes the ignored soaks (e.g. 10,000 WRs per side through the
/// lossy link simulation).
fn host_tests(full: bool) -> Result<Counts> {
    let mut command = cargo();
    command.args(["test", "--workspace", "--all-features"]);
    if full {
        command.args(["--", "--include-ignored"]);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let mut counts = Counts::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        // "test result: ok. 12 passed; 0 failed; 0 ignored; ..."
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let words: Vec<&str> = part.split_whitespace().collect();
                match words.as_slice() {
                    [.., n, "passed"] => counts.passed += n.parse::<usize>().unwrap_or(0),
                    [n, "failed"] => counts.failed += n.parse::<usize>().unwrap_or(0),
                    [n, "ignored"] => counts.skipped += n.parse::<usize>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() && counts.failed == 0 {
        counts.failed = 1;
    }
    Ok(counts)
}

/// Runs the cases of one tier against one target kind; cases that need the
/// same bed share one, and a failed case gets a fresh bed for the next.
fn vm_suite(
    images: &Images,
    kind: TargetKind,
    full: bool,
    filter: Option<&str>,
    failures: &mut Vec<String>,
) -> Counts {
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| full || c.tier == Tier::Smoke)
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .collect();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut bed: Option<Bed> = None;
    let mut client_tools: Option<Result<(std::path::PathBuf, std::path::PathBuf)>> = None;
    let mut rxe_cli: Option<Result<Vec<(std::path::PathBuf, String)>>> = None;
    for case in cases {
        if case.probe && !kind.has_probe_port() {
            // Not worth booting a bed to find out.
            println!(
                "vm {} {} ... skipped: {NO_PROBE_PORT}",
                kind.name(),
                case.name
            );
            skipped += 1;
            continue;
        }
        let mut extra_files = Vec::new();
        if case.rxe_cli {
            match rxe_cli.get_or_insert_with(|| crate::initiator_rxe::cli_files(images)) {
                Ok(files) => extra_files.extend(files.iter().cloned()),
                Err(error) => {
                    println!("vm {} {} ... FAILED (build)", kind.name(), case.name);
                    failures.push(format!("{} {}: {error:#}", kind.name(), case.name));
                    failed += 1;
                    continue;
                }
            }
        }
        if case.daemon {
            match client_tools.get_or_insert_with(crate::target::build_static_client_tools) {
                Ok((daemon, cli)) => {
                    extra_files.push((daemon.clone(), DAEMON_IN_GUEST.to_string()));
                    extra_files.push((cli.clone(), CLI_IN_GUEST.to_string()));
                }
                Err(error) => {
                    println!("vm {} {} ... FAILED (build)", kind.name(), case.name);
                    failures.push(format!("{} {}: {error:#}", kind.name(), case.name));
                    failed += 1;
                    continue;
                }
            }
        }
        let config = BedConfig {
            paths: case.paths,
            mtu: case.mtu,
            probe: case.probe,
            extra_files,
            ..BedConfig::new(kind)
        };
        if bed.as_ref().is_some_and(|b| {
            b.relays.len() != case.paths
                || b.mtu != case.mtu
                || b.probe.is_some() != case.probe
                || b.initiator.config.extra_files != config.extra_files
        }) {
            bed = None;
        }
        if bed.is_none() {
            step(format!(
                "starting bed: {} with {} path(s){}",
                kind.name(),
                case.paths,
                if case.probe { " and a probe port" } else { "" }
            ));
            match Bed::start(images, &config) {
                Ok(b) => bed = Some(b),
                Err(error) => {
                    println!(
                        "vm {} {} ... FAILED (bed did not start)",
                        kind.name(),
                        case.name
                    );
                    failures.push(format!("{} {}: bed: {error:#}", kind.name(), case.name));
                    failed += 1;
                    continue;
                }
            }
        }
        let current = bed.as_mut().expect("bed started above");
        let start = Instant::now();
        let result = (case.run)(current);
        let took = start.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                println!("vm {} {} ... ok ({took:.1} s)", kind.name(), case.name);
                passed += 1;
            }
            Err(error) if error.downcast_ref::<Skip>().is_some() => {
                println!("vm {} {} ... skipped: {error}", kind.name(), case.name);
                skipped += 1;
            }
            Err(error) => {
                println!("vm {} {} ... FAILED ({took:.1} s)", kind.name(), case.name);
                let target = current.target.diagnostics();
                let relays: Vec<String> = current.relays.iter().map(|r| r.summary()).collect();
                let report = format!(
                    "{} {}: {error:#}\n--- relays ---\n{}\n--- target ---\n{target}",
                    kind.name(),
                    case.name,
                    relays.join("\n")
                );
                println!("{report}");
                failures.push(format!("{} {}", kind.name(), case.name));
                failed += 1;
                bed = None;
            }
        }
    }
    Counts {
        passed,
        failed,
        skipped,
    }
}

/// A case that does not apply to a target kind; reported as skipped, with
/// the reason, never silently.
#[derive(Debug)]
pub(crate) struct Skip(pub(crate) &'static str);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Skip {}

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// `map SESSION VOLUME "PATHS"` for volume `index` over all paths.
pub(crate) fn map_line(bed: &Bed, variable: &str, index: usize) -> String {
    let volume = &bed.target.descriptor.volumes[index];
    format!(
        "{variable}=$(map s1 {} \"{}\") || exit 1\n",
        volume.device_path,
        bed.all_paths()
    )
}
