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

use crate::first_map;
use crate::target::{path_address, Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::{bail, Context, Result};
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
        if kind.max_mtu().is_some_and(|max| case.mtu > max) {
            println!(
                "vm {} {} ... skipped: the target carries an MTU of {} at most",
                kind.name(),
                case.name,
                kind.max_mtu().unwrap_or_default()
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

fn map_size(bed: &mut Bed) -> Result<()> {
    let bytes = bed.target.descriptor.volumes[0].bytes;
    let script = map_line(bed, "d", 0)
        + &format!(
            "[ \"$(dev_bytes $d)\" = {bytes} ] || die \"size of $d is $(dev_bytes $d), expected {bytes}\"\n\
             path_states s1 | grep -q connected || die \"no connected path: $(path_states s1)\"\n\
             unmap $d\n"
        );
    bed.initiator.run(&script, MINUTE)?;
    Ok(())
}

fn verify_case(bed: &mut Bed, bs: &str, size: &str, extra: &str) -> Result<()> {
    let script = map_line(bed, "d", 0) + &format!("verify $d {bs} {size} {extra}\nunmap $d\n");
    bed.initiator.run(&script, 10 * MINUTE)?;
    Ok(())
}

fn verify_4k_small(bed: &mut Bed) -> Result<()> {
    verify_case(bed, "4k", "4M", "")
}

fn verify_4k(bed: &mut Bed) -> Result<()> {
    verify_case(bed, "4k", "16M", "")
}

fn verify_128k(bed: &mut Bed) -> Result<()> {
    verify_case(bed, "128k", "16M", "")
}

fn verify_mixed(bed: &mut Bed) -> Result<()> {
    verify_case(bed, "4k", "16M", "--bssplit=4k/40:16k/20:64k/20:128k/20")
}

/// rping (rdma-core) between the VMs: the harness's rping overlay works
/// and the link carries RDMA READ/WRITE/SEND both ways.
fn rping_linux(bed: &mut Bed) -> Result<()> {
    if !bed.target.runs_scripts() {
        return Err(Skip(
            "rping runs inside a Linux target VM; Brick's own rping is the brick-interop suite",
        )
        .into());
    }
    let address = bed.target.descriptor.paths[0].target.clone();
    bed.target.run(&format!(
        "modprobe rdma_ucm\nbg rping rping -s -a {address} -v -S 3000\n"
    ))?;
    let output = bed.initiator.run(
        &format!("modprobe rdma_ucm\nsleep 1\nrping -c -a {address} -v -C 3 -S 3000\n"),
        MINUTE,
    )?;
    if !output.contains("rdma-ping-2: ") {
        bail!("rping client did not complete 3 pings:\n{output}");
    }
    // The server must have seen the three pings. Its exit status is not the
    // judge: rping's server races its own teardown when the client's
    // disconnect arrives (`rdma_get_cm_event: Bad file descriptor` after
    // "server DISCONNECT EVENT", exit 255), a Linux tool's quirk.
    let server = bed
        .target
        .run("bgwait rping 30; echo \"rping server status $?\"")?;
    let clean = server.contains("rping server status 0");
    let teardown_race = server.contains("server DISCONNECT EVENT")
        && server.contains("rdma_get_cm_event: Bad file descriptor");
    if !server.contains("server ping data: rdma-ping-2: ") || !(clean || teardown_race) {
        bail!("the rping server did not see 3 pings and a clean end:\n{server}");
    }
    Ok(())
}

/// MTU 9000 gives rxe a 4096-byte path MTU: frames above 4 KiB cross the link.
fn jumbo_verify(bed: &mut Bed) -> Result<()> {
    verify_case(bed, "128k", "8M", "")?;
    let largest = bed.relays[0].stats(crate::relay::A_TO_B).largest;
    if largest < 4096 + 14 + 20 + 8 + 12 {
        bail!("with MTU 9000 the largest frame was {largest} bytes: no 4096-byte path MTU");
    }
    Ok(())
}

fn unmap_remap(bed: &mut Bed) -> Result<()> {
    let map = map_line(bed, "d", 0);
    let script = format!(
        "{map}\
         dd if=/dev/urandom of=/tmp/pattern bs=64k count=16 2>/dev/null\n\
         dd if=/tmp/pattern of=/dev/$d bs=64k oflag=direct 2>/dev/null || die \"write to $d\"\n\
         unmap $d\n\
         {map}\
         dd if=/dev/$d of=/tmp/readback bs=64k count=16 iflag=direct 2>/dev/null || die \"read from $d\"\n\
         cmp /tmp/pattern /tmp/readback || die \"data changed across unmap/remap\"\n\
         unmap $d\n"
    );
    bed.initiator.run(&script, 2 * MINUTE)?;
    Ok(())
}

fn two_devices(bed: &mut Bed) -> Result<()> {
    let script = map_line(bed, "d0", 0)
        + &map_line(bed, "d1", 1)
        + "bg v0 verify $d0 4k 8M\n\
           bg v1 verify $d1 128k 16M\n\
           bgwait v0 || die \"verify on $d0\"\n\
           bgwait v1 || die \"verify on $d1\"\n\
           unmap $d0\nunmap $d1\n";
    bed.initiator.run(&script, 10 * MINUTE)?;
    Ok(())
}

/// A read-only mapping: the device is read-only, reads work, a write fails.
fn read_only(bed: &mut Bed) -> Result<()> {
    let volume = &bed.target.descriptor.volumes[1];
    let script = format!(
        "d=$(map s1 {} \"{}\" ro) || exit 1\n\
         [ \"$(cat /sys/block/$d/ro)\" = 1 ] || die \"$d is not read-only\"\n\
         dd if=/dev/$d of=/dev/null bs=4096 count=64 iflag=direct 2>/dev/null || die \"read from read-only $d\"\n\
         if dd if=/dev/zero of=/dev/$d bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null; then die \"a write to read-only $d succeeded\"; fi\n\
         unmap $d\n",
        volume.device_path,
        bed.all_paths()
    );
    bed.initiator.run(&script, MINUTE)?;
    Ok(())
}

/// The target crashes (SIGKILL or power-off) under a stream of
/// acknowledged writes to a durable volume; the client reconnects and
/// remaps, writing resumes, and every write acknowledged before or after
/// the crash reads back.
fn restart_durable(bed: &mut Bed) -> Result<()> {
    let Some(index) = bed.target.descriptor.volumes.iter().position(|v| v.durable) else {
        return Err(Skip("the target serves no durable volume").into());
    };
    let script = map_line(bed, "d", index)
        + "echo $d > /tmp/durable.dev\nrm -f /tmp/writer.stop\n\
           bg writer durable_writer $d 100000\n\
           n=0; while [ $(wc -l < /tmp/acked) -lt 40 ]; do n=$((n + 1)); [ $n -ge 600 ] && die \"writer stuck: $(cat /tmp/bg.writer.out)\"; sleep 0.1; done\n\
           log \"$(wc -l < /tmp/acked) writes acknowledged before the crash\"\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    step(format!(
        "crashing {} under IO ({:?})",
        bed.target.descriptor.name, bed.target.descriptor.restart
    ));
    bed.restart_target()?;
    let script = "d=$(cat /tmp/durable.dev)\nbefore=$(wc -l < /tmp/acked)\n\
                  reconnect_all s1 force\n\
                  n=0; while [ $(wc -l < /tmp/acked) -lt $((before + 40)) ]; do n=$((n + 1)); [ $n -ge 1200 ] && die \"no writes acknowledged after the restart: $(tail -3 /tmp/failed)\"; sleep 0.1; done\n\
                  touch /tmp/writer.stop\nbgwait writer 120 || die \"writer failed\"\n\
                  log \"$(wc -l < /tmp/failed) failed attempts while the target was down\"\n\
                  check_acked $d\nunmap $d\n";
    let output = bed.initiator.run(script, 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

fn nvme_case(bed: &mut Bed, verify: &str) -> Result<()> {
    let Some(nvme) = bed.target.descriptor.nvme.clone() else {
        return Err(Skip("the target exports no NVMe-oF namespace").into());
    };
    let address = &bed.target.descriptor.paths[0].target;
    let script = format!(
        "d=$(nvme_connect {address} {nqn}) || exit 1\n\
         [ \"$(dev_bytes $d)\" = {bytes} ] || die \"size of $d is $(dev_bytes $d)\"\n\
         {verify}\n\
         nvme_disconnect $d\n",
        nqn = nvme.nqn,
        bytes = nvme.bytes,
    );
    bed.initiator.run(&script, 10 * MINUTE)?;
    Ok(())
}

fn nvme_connect_verify(bed: &mut Bed) -> Result<()> {
    nvme_case(bed, "verify $d 4k 4M")
}

fn nvme_verify_mixed(bed: &mut Bed) -> Result<()> {
    nvme_case(
        bed,
        "verify $d 4k 16M --bssplit=4k/40:16k/20:64k/20:128k/20",
    )
}

fn target_restart(bed: &mut Bed) -> Result<()> {
    let script = map_line(bed, "d", 0) + "echo $d > /tmp/restart.dev\nverify $d 4k 1M\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    step(format!(
        "restarting {} ({:?})",
        bed.target.descriptor.name, bed.target.descriptor.restart
    ));
    bed.restart_target()?;
    // The kick stands in for the initiator daemon: it skips RTRS's
    // heartbeat timeout and reconnect delay (target_restart_timing waits them out).
    let script = "d=$(cat /tmp/restart.dev)\nreconnect_all s1 force\nverify $d 4k 2M\nunmap $d\n";
    bed.initiator.run(script, 5 * MINUTE)?;
    Ok(())
}

/// The one case that waits for Linux's own timers after a target restart:
/// heartbeat death (~30-35 s) and the reconnect delay.
fn target_restart_timing(bed: &mut Bed) -> Result<()> {
    let script = map_line(bed, "d", 0) + "echo $d > /tmp/restart.dev\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    bed.restart_target()?;
    let script = "d=$(cat /tmp/restart.dev)\n\
                  while path_states s1 | grep -q ' connected$'; do sleep 1; done\n\
                  log \"client noticed: $(path_states s1 | tr '\\n' ' ')\"\n\
                  took=$(wait_connected s1 240) || exit 1\n\
                  log \"reconnected on its own $took s after noticing\"\n\
                  verify $d 4k 1M\nunmap $d\n";
    let output = bed.initiator.run(script, 8 * MINUTE)?;
    print!("{output}");
    Ok(())
}

fn multipath_cut(bed: &mut Bed) -> Result<()> {
    let second = path_address(1).target;
    let script = map_line(bed, "d", 0)
        + "echo $d > /tmp/mp.dev\n\
           [ $(path_states s1 | grep -c ' connected$') = 2 ] || die \"expected 2 connected paths: $(path_states s1)\"\n\
           bg mp verify $d 4k 8M\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    std::thread::sleep(Duration::from_secs(5));
    step(format!("cutting path 2 ({second})"));
    bed.relays[1].set_cut(true);
    bed.initiator.run(
        "bgwait mp 600 || die \"verify failed with one path cut\"",
        11 * MINUTE,
    )?;
    // The client must notice the dead path (rxe retries, then heartbeats).
    bed.initiator.run(
        &format!(
            "n=0\nwhile path_states s1 | grep '{second}' | grep -q ' connected$'; do\n\
             n=$((n + 1)); [ $n -ge 90 ] && die \"cut path still connected: $(path_states s1)\"\n\
             sleep 1\ndone\nlog \"after cut: $(path_states s1 | tr '\\n' ' ')\"\n"
        ),
        2 * MINUTE,
    )?;
    let lost = bed.relays[1].stats(crate::relay::A_TO_B).lost;
    if lost == 0 {
        bail!("the cut of path 2 dropped nothing: the client never used it");
    }
    bed.relays[1].set_cut(false);
    let script = "d=$(cat /tmp/mp.dev)\nreconnect_all s1\nverify $d 4k 2M\nunmap $d\n";
    bed.initiator.run(script, 5 * MINUTE)?;
    Ok(())
}

/// Why a target kind skips the probe cases.
const NO_PROBE_PORT: &str =
    "the target has no probe port (hostile_probe drives the Brick targets, hosted and image)";

/// How long the probe may run in all (each of its waits is bounded too):
/// 54 cases with a 4.5 s pause after each, a 20 s silent client, a
/// vanished session released by heartbeats (~40 s): about 6 minutes.
const PROBE_TIMEOUT: Duration = Duration::from_secs(720);

/// Runs `hostile_probe` on the bed's probe port; returns its exit status
/// and its output (stdout, then stderr), killing it at [`PROBE_TIMEOUT`].
fn run_probe(bed: &Bed, binary: &std::path::Path) -> Result<(std::process::ExitStatus, String)> {
    let (Some(relay), Some(port)) = (bed.probe.as_ref(), bed.target.descriptor.probe.as_ref())
    else {
        return Err(Skip(NO_PROBE_PORT).into());
    };
    let dir = crate::paths::scratch("hostile-probe");
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let mut child = Command::new(binary)
        .args(["--link", &format!("frame:connect:{}", relay.a.display())])
        .args(["--target", &port.target])
        .args(["--local", &port.local])
        .args(["--mac", &port.mac])
        .args(["--session-prefix", &port.session_prefix])
        .args(["--refused-session", &port.refused_session])
        .args(["--ro-volume", &port.ro_volume])
        .args(["--rw-volume", &port.rw_volume])
        .args(["--max-connections", &port.max_connections.to_string()])
        .args(["--max-sessions", &port.max_sessions.to_string()])
        .args(["--healthy-volume", &port.healthy_volume])
        .args(["--pinned-prefix", &port.pinned_prefix])
        .args(["--outsider", &port.outsider])
        .args(["--max-half-open", &port.max_half_open.to_string()])
        .args([
            "--max-half-open-per-source",
            &port.max_half_open_per_source.to_string(),
        ])
        .args(["--setup-timeout-ms", &port.setup_timeout_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let output = std::fs::read_to_string(&out_path).unwrap_or_default();
            bail!(
                "hostile_probe still running after {} s; its output so far:\n{output}",
                PROBE_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let errors = std::fs::read_to_string(&err_path).unwrap_or_default();
    if !errors.trim().is_empty() {
        output += "--- hostile_probe stderr ---\n";
        output += &errors;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((status, output))
}

/// Kernel log lines of an RTRS/RNBD path or IO in trouble (Linux 6.1
/// rtrs-clt and rnbd-clt, and the block layer's "I/O error, dev rnbd0");
/// mapping, "connected" and other info lines are benign, and so is the
/// taint notice of loading the (unsigned) modules.
fn is_client_error_line(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    if lower.contains("module verification failed") {
        return false;
    }
    let ours = lower.contains("rtrs") || lower.contains("rnbd");
    let trouble = [
        "error",
        "fail",
        "reconnect",
        "disconnect",
        "timed out",
        "timeout",
        "hb ",
        "heartbeat",
    ]
    .iter()
    .any(|w| lower.contains(w));
    ours && trouble
}

/// A healthy Linux client keeps a verifying fio running on vol0 while
/// `hostile_probe` plays hostile clients on the probe port (54 cases:
/// malformed CON_REQs and CON_REQ storms, the half-open limits and
/// deadline, takeovers, too many connections and sessions, refused and
/// squatted names, access rules on a second path, dropped and vanished
/// sessions, bad immediates, chunk ids, offsets and READ descriptors,
/// request and heartbeat floods, clients that stop reading, RNBD OPEN,
/// CLOSE and IO misuse) beside its own healthy Brick client: every attack
/// gets its answer, the probe exits 0 (which needs its healthy client to
/// see 0 errors and keep 80 % of its baseline rate), fio verifies with 0
/// errors and the client's kernel log shows no RTRS/RNBD trouble.
fn hostile_neighbour(bed: &mut Bed) -> Result<()> {
    if bed.probe.is_none() || bed.target.descriptor.probe.is_none() {
        return Err(Skip(NO_PROBE_PORT).into());
    }
    let binary = crate::target::build_hostile_probe()?;
    // The kernel log is checked from the mapped device on.
    let script = map_line(bed, "d", 0)
        + "echo $d > /tmp/hostile.dev\ndmesg | wc -l > /tmp/hostile.dmesg\n\
           bg v verify $d 4k 16M\nsleep 1\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    let relay = bed.probe.as_ref().expect("checked above");
    let (before_in, before_out) = (
        relay.stats(crate::relay::A_TO_B).frames,
        relay.stats(crate::relay::B_TO_A).frames,
    );
    step("running hostile_probe against the target's probe port");
    let (status, output) = run_probe(bed, &binary)?;
    print!("{output}");
    let relay = bed.probe.as_ref().expect("checked above");
    let sent = relay.stats(crate::relay::A_TO_B).frames - before_in;
    let answered = relay.stats(crate::relay::B_TO_A).frames - before_out;
    println!("probe port: {sent} frames from the probe, {answered} from the target");
    // Whether fio was still at work when the probe finished.
    let overlap = bed.initiator.run(
        "[ -e /tmp/bg.v.rc ] && echo finished || echo running\n",
        MINUTE,
    )?;
    println!("fio verify when the probe finished: {}", overlap.trim());
    let verify = bed.initiator.run(
        "bgwait v 600 || die \"fio verify beside the hostile probe\"\n\
         d=$(cat /tmp/hostile.dev)\nunmap $d\n",
        11 * MINUTE,
    )?;
    print!("{verify}");
    let dmesg = bed.initiator.run(
        "dmesg | tail -n +$(( $(cat /tmp/hostile.dmesg) + 1 ))\n",
        MINUTE,
    )?;
    let client_lines = dmesg
        .lines()
        .filter(|l| l.contains("rtrs") || l.contains("rnbd"))
        .count();
    let trouble: Vec<&str> = dmesg.lines().filter(|l| is_client_error_line(l)).collect();
    println!(
        "client kernel log since the map: {client_lines} rtrs/rnbd lines, {} in trouble",
        trouble.len()
    );
    if !status.success() {
        bail!("hostile_probe failed ({status})");
    }
    if sent == 0 || answered == 0 {
        bail!("the probe port carried {sent} frames out and {answered} back: the probe never reached the target");
    }
    if !trouble.is_empty() {
        bail!(
            "the Linux client logged RTRS/RNBD trouble during the probe:\n{}",
            trouble.join("\n")
        );
    }
    Ok(())
}

/// Where the static `brick-initiatord` lands in the initiator VM.
const DAEMON_IN_GUEST: &str = "/bin/brick-initiatord";
/// Where the static `brick` command lands in the initiator VM.
const CLI_IN_GUEST: &str = "/bin/brick";

/// A `brick-initiatord` config: `[daemon]` timings, then one volume per
/// `(name, device_path)` in session `session` over every path of the bed.
fn daemon_config(bed: &Bed, session: &str, volumes: &[(&str, &str)]) -> String {
    daemon_config_with(bed, "", session, volumes)
}

/// [`daemon_config`] with more `[daemon]` keys (`extra`, one per line).
fn daemon_config_with(bed: &Bed, extra: &str, session: &str, volumes: &[(&str, &str)]) -> String {
    let paths: Vec<String> = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!("\"{p}\""))
        .collect();
    let mut config = format!("[daemon]\npoll_interval_ms = 500\nretry_interval_s = 2\n{extra}");
    for (name, device_path) in volumes {
        config += &format!(
            "\n[[volumes]]\nname = \"{name}\"\nsession = \"{session}\"\ndevice_path = \"{device_path}\"\npaths = [{}]\n",
            paths.join(", ")
        );
    }
    config
}

/// `brick-initiatord` against the real rnbd client: it maps two volumes
/// and links them under /dev/brick (fio verifies through the links), a
/// SIGHUP with volume b removed (and c added, if the target has a third)
/// unmaps b and maps c, `status --json` agrees, SIGTERM exits 0 and leaves
/// the mappings. Then `--once` maps a fresh config and exits 0, and a
/// second `--once` exits 0 without acting.
fn daemon_maps_and_reloads(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let a = volumes[0].device_path.clone();
    let b = volumes[1].device_path.clone();
    let c = volumes.get(2).map(|v| v.device_path.clone());
    let first = daemon_config(bed, "bd", &[("a", &a), ("b", &b)]);
    let mut second_volumes = vec![("a", a.as_str())];
    if let Some(c) = &c {
        second_volumes.push(("c", c));
    }
    let second = daemon_config(bed, "bd", &second_volumes);
    let once = daemon_config(bed, "bo", &[("a", &a)]);
    let has_c = if c.is_some() { 1 } else { 0 };
    let script = format!(
        "D={DAEMON_IN_GUEST}; S=/tmp/brick-initiatord.sock; L=/tmp/initiatord.log\n\
         trap 'echo \"--- daemon log ---\"; cat $L 2>/dev/null; echo \"--- --once logs ---\"; cat /tmp/once1.log /tmp/once2.log 2>/dev/null' EXIT\n\
         file_of() {{ basename \"$(readlink /dev/brick/$1)\"; }}\n\
         mapped() {{ for m in /sys/block/rnbd*; do [ \"$(cat $m/rnbd/session 2>/dev/null)\" = $1 ] && [ \"$(cat $m/rnbd/mapping_path 2>/dev/null)\" = $2 ] && basename $m; done; }}\n\
         mkdir -p /etc/brick\n\
         cat > /etc/brick/initiator.toml <<'EOF'\n{first}EOF\n\
         $D --config /etc/brick/initiator.toml --check || die \"config refused\"\n\
         $D --config /etc/brick/initiator.toml --socket $S > $L 2>&1 &\n\
         pid=$!\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         wait_for /dev/brick/b 60 || die \"/dev/brick/b did not appear\"\n\
         da=$(file_of a); db=$(file_of b)\n\
         log \"a -> $da, b -> $db\"\n\
         wait_for /dev/$da 10 && wait_for /dev/$db 10 || die \"device nodes missing\"\n\
         verify $da 4k 8M\n\
         verify $db 128k 8M\n\
         cat > /etc/brick/initiator.toml <<'EOF'\n{second}EOF\n\
         kill -HUP $pid\n\
         n=0; while [ -e /dev/brick/b ] || [ -n \"$(mapped bd {b})\" ]; do n=$((n + 1)); [ $n -ge 600 ] && die \"b still mapped or linked 60 s after SIGHUP\"; sleep 0.1; done\n\
         log \"b unlinked and {b} unmapped\"\n\
         if [ {has_c} = 1 ]; then wait_for /dev/brick/c 60 || die \"/dev/brick/c did not appear\"; dc=$(file_of c); log \"c -> $dc\"; fi\n\
         [ -e /sys/block/$da ] || die \"$da went away on reload\"\n\
         n=0; until $D status --json --socket $S > /tmp/status.json 2>&1 && grep -q '\"name\":\"a\"' /tmp/status.json && ! grep -q '\"name\":\"b\"' /tmp/status.json && {{ [ {has_c} = 0 ] || grep -q '\"name\":\"c\"' /tmp/status.json; }}; do n=$((n + 1)); [ $n -ge 50 ] && die \"status: $(cat /tmp/status.json)\"; sleep 0.2; done\n\
         echo \"status: $(cat /tmp/status.json)\"\n\
         $D status --socket $S\n\
         kill -TERM $pid\n\
         wait $pid; rc=$?\n\
         [ $rc = 0 ] || die \"daemon exited $rc on SIGTERM\"\n\
         [ -e /sys/block/$da ] || die \"$da unmapped by the stopping daemon\"\n\
         [ \"$(file_of a)\" = $da ] || die \"/dev/brick/a changed on stop\"\n\
         unmap $da\n\
         if [ {has_c} = 1 ]; then unmap $dc; fi\n\
         rm -rf /dev/brick\n\
         cat > /tmp/once.toml <<'EOF'\n{once}EOF\n\
         $D --config /tmp/once.toml --once --socket $S > /tmp/once1.log 2>&1; rc=$?\n\
         [ $rc = 0 ] || die \"first --once exited $rc\"\n\
         [ -e /dev/brick/a ] || die \"--once did not link /dev/brick/a\"\n\
         dn=$(file_of a)\n\
         grep -q 'brick-initiatord: map ' /tmp/once1.log || die \"first --once logged no map\"\n\
         $D --config /tmp/once.toml --once --socket $S > /tmp/once2.log 2>&1; rc=$?\n\
         [ $rc = 0 ] || die \"second --once exited $rc\"\n\
         grep -q 'all volumes mapped' /tmp/once2.log || die \"second --once did not say all volumes mapped\"\n\
         if grep -v -e 'started:' -e 'all volumes mapped' /tmp/once2.log | grep -q .; then die \"second --once acted\"; fi\n\
         [ \"$(file_of a)\" = $dn ] || die \"second --once changed the mapping\"\n\
         unmap $dn\n\
         rm -rf /dev/brick\n"
    );
    let output = bed.initiator.run(&script, 10 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// An operator removes one of a session's two paths (`remove_path`);
/// `brick-initiatord` adds it back (`add_path`) and it connects again,
/// with IO verified on the volume afterwards.
fn daemon_readds_path(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    let config = daemon_config(bed, "bp", &[("a", &a)]);
    let script = format!(
        "D={DAEMON_IN_GUEST}; S=/tmp/brick-initiatord-p.sock; L=/tmp/initiatord-p.log\n\
         trap 'echo \"--- daemon log ---\"; cat $L 2>/dev/null' EXIT\n\
         P=/sys/class/rtrs-client/bp/paths\n\
         connected() {{ n=0; for p in $P/*; do [ \"$(cat $p/state 2>/dev/null)\" = connected ] && n=$((n + 1)); done; echo $n; }}\n\
         cat > /tmp/paths.toml <<'EOF'\n{config}EOF\n\
         $D --config /tmp/paths.toml --socket $S > $L 2>&1 &\n\
         pid=$!\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         d=$(basename \"$(readlink /dev/brick/a)\")\n\
         n=0; until [ \"$(connected)\" = 2 ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"not 2 connected paths: $(path_states bp)\"; sleep 0.1; done\n\
         victim=$(ls $P | tail -1)\n\
         log \"removing path $victim\"\n\
         echo 1 > $P/$victim/remove_path || die \"remove_path $victim refused\"\n\
         n=0; while [ -e $P/$victim ]; do n=$((n + 1)); [ $n -ge 100 ] && die \"$victim still listed after remove_path\"; sleep 0.1; done\n\
         log \"path $victim gone; waiting for the daemon\"\n\
         n=0; until [ \"$(cat $P/$victim/state 2>/dev/null)\" = connected ]; do n=$((n + 1)); [ $n -ge 600 ] && die \"$victim not re-added within 60 s: $(path_states bp)\"; sleep 0.1; done\n\
         log \"path $victim back: $(path_states bp | tr '\\n' ' ')\"\n\
         grep -q 'add_path' $L || die \"the daemon logged no add_path\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid\n\
         wait $pid; rc=$?\n\
         [ $rc = 0 ] || die \"daemon exited $rc on SIGTERM\"\n\
         unmap $d\n\
         rm -rf /dev/brick\n"
    );
    let output = bed.initiator.run(&script, 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// The shell around a daemon case's `body`: `D` (the daemon), `B` (the
/// `brick` command), the case's files `/tmp/TAG.{toml,sock,state,log}` as
/// `C`, `S`, `T`, `L` (the config already written), `start_daemon LOG`
/// (in the background, its pid in `pid`), `file_of NAME` (the device
/// `/dev/brick/NAME` links to) and `acted LOG` (the log's lines other
/// than start, stop and convergence: actions and notices). Every
/// `/tmp/TAG*.log` is printed if the body fails.
fn daemon_script(tag: &str, config: &str, body: &str) -> String {
    format!(
        "D={DAEMON_IN_GUEST}; B={CLI_IN_GUEST}\n\
         C=/tmp/{tag}.toml; S=/tmp/{tag}.sock; T=/tmp/{tag}.state; L=/tmp/{tag}.log\n\
         file_of() {{ basename \"$(readlink /dev/brick/$1)\"; }}\n\
         acted() {{ grep -v -e 'started:' -e 'all volumes mapped' -e 'stopping on signal' \"$1\"; }}\n\
         start_daemon() {{ $D --config $C --socket $S --state $T > $1 2>&1 & pid=$!; }}\n\
         trap 'for f in /tmp/{tag}*.log; do echo \"--- $f ---\"; cat $f; done' EXIT\n\
         cat > $C <<'EOF'\n{config}EOF\n\
         {body}\
         trap - EXIT\n"
    )
}

/// Restarting the daemon changes nothing that is already right: after a
/// SIGTERM and after a SIGKILL, the new daemon logs no action for two
/// mapped volumes, and their devices and links stay. A bad config is
/// refused with its line, at start (exit 2, nothing mapped) and on SIGHUP
/// (the old config stays in force, nothing unmapped).
fn daemon_restart_idempotent(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let (a, b) = (
        volumes[0].device_path.clone(),
        volumes[1].device_path.clone(),
    );
    let config = daemon_config(bed, "bi", &[("a", &a), ("b", &b)]);
    // The same volume name twice: refused, naming the second one's line.
    let bad = daemon_config(bed, "bi", &[("a", &a), ("a", &b)]);
    let bad_line = bad
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("name = \"a\""))
        .nth(1)
        .map_or(0, |(i, _)| i + 1);
    let body = format!(
        "cat > /tmp/bad.toml <<'EOF'\n{bad}EOF\n\
         mapped() {{ ls /sys/block | grep rnbd | tr '\\n' ' '; }}\n\
         start_daemon /tmp/bi.1.log\n\
         wait_for /dev/brick/a 60 && wait_for /dev/brick/b 60 || die \"links did not appear\"\n\
         n=0; until $D status --json --socket $S 2>/dev/null | grep -q '\"converged\":true'; do n=$((n + 1)); [ $n -ge 100 ] && die \"not converged\"; sleep 0.2; done\n\
         links=\"$(file_of a) $(file_of b)\"; devices=$(mapped)\n\
         log \"mapped: links $links, devices $devices\"\n\
         kill -TERM $pid; wait $pid || die \"daemon exited $? on SIGTERM\"\n\
         start_daemon /tmp/bi.2.log; sleep 3\n\
         if acted /tmp/bi.2.log; then die \"the restarted daemon acted (above)\"; fi\n\
         kill -KILL $pid; wait $pid\n\
         start_daemon /tmp/bi.3.log; sleep 3\n\
         if acted /tmp/bi.3.log; then die \"the daemon restarted after SIGKILL acted (above)\"; fi\n\
         [ \"$(file_of a) $(file_of b)\" = \"$links\" ] && [ \"$(mapped)\" = \"$devices\" ] || die \"restarts changed the mappings: $(file_of a) $(file_of b), $(mapped)\"\n\
         log \"two restarts, no action\"\n\
         $D --config /tmp/bad.toml --socket /tmp/bad.sock --state /tmp/bad.state > /tmp/bi.bad.log 2>&1; rc=$?\n\
         [ $rc = 2 ] || die \"a bad config exited $rc, expected 2\"\n\
         grep -q 'bad.toml:{bad_line}:.*volumes\\[1\\].name: expected a unique name' /tmp/bi.bad.log || die \"bad config message: $(cat /tmp/bi.bad.log)\"\n\
         [ \"$(mapped)\" = \"$devices\" ] || die \"a refused config mapped something: $(mapped)\"\n\
         cp /tmp/bad.toml $C; kill -HUP $pid; sleep 3\n\
         grep -q 'new config refused, keeping the old one: .*bi.toml:{bad_line}:' /tmp/bi.3.log || die \"SIGHUP with a bad config was not refused with its line\"\n\
         [ \"$(file_of a) $(file_of b)\" = \"$links\" ] && [ \"$(mapped)\" = \"$devices\" ] || die \"a refused reload changed the mappings\"\n\
         log \"bad config refused at start and on SIGHUP; nothing changed\"\n\
         kill -TERM $pid; wait $pid\n\
         unmap $(file_of a); unmap $(file_of b); rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("bi", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// `brick map`, `list` and `unmap` against the running daemon: a volume
/// mapped at run time appears under /dev/brick and verifies, `list` shows
/// it as `runtime`, a restarted daemon keeps it without acting, bad maps
/// are refused and leave nothing, `unmap` of a config volume is refused,
/// and `unmap` of the run-time one removes device and link for good.
fn daemon_runtime_map(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let (a, b) = (
        volumes[0].device_path.clone(),
        volumes[1].device_path.clone(),
    );
    let config = daemon_config(bed, "bm", &[("a", &a)]);
    let paths: String = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!(" --path {p}"))
        .collect();
    let body = format!(
        "start_daemon /tmp/bm.1.log\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         $B map x --session bm --device-path {b}{paths} --socket $S || die \"brick map x failed\"\n\
         [ -e /dev/brick/x ] || die \"brick map returned before /dev/brick/x existed\"\n\
         dx=$(file_of x); log \"x -> $dx\"\n\
         verify $dx 4k 4M\n\
         $B list --socket $S\n\
         $B list --json --socket $S | grep -q '\"name\":\"x\",\"origin\":\"runtime\"' || die \"list: $($B list --json --socket $S)\"\n\
         $B status --socket $S\n\
         if $B map y --session bm --device-path {b}{paths} --socket $S 2> /tmp/bm.err; then die \"a second map of {b} in session bm succeeded\"; fi\n\
         grep -q 'already mapped in session' /tmp/bm.err || die \"second map message: $(cat /tmp/bm.err)\"\n\
         if $B map z --session bm2 --device-path no-such-volume{paths} --socket $S 2> /tmp/bm.err; then die \"a map of a missing volume succeeded\"; fi\n\
         grep -q 'kernel refused' /tmp/bm.err || die \"missing-volume map message: $(cat /tmp/bm.err)\"\n\
         [ ! -e /dev/brick/y ] && [ ! -e /dev/brick/z ] || die \"a refused map left a link\"\n\
         if $B list --json --socket $S | grep -q '\"name\":\"z\"'; then die \"a refused map was kept\"; fi\n\
         kill -TERM $pid; wait $pid || die \"daemon exited $? on SIGTERM\"\n\
         start_daemon /tmp/bm.2.log; sleep 3\n\
         if acted /tmp/bm.2.log; then die \"the restarted daemon acted on a run-time volume (above)\"; fi\n\
         [ \"$(file_of x)\" = $dx ] || die \"the restart changed x\"\n\
         if $B unmap a --socket $S 2> /tmp/bm.err; then die \"unmap of a config volume succeeded\"; fi\n\
         grep -q 'remove it there and reload' /tmp/bm.err || die \"unmap a: $(cat /tmp/bm.err)\"\n\
         $B unmap x --socket $S || die \"brick unmap x failed\"\n\
         [ ! -e /sys/block/$dx ] && [ ! -e /dev/brick/x ] || die \"x still mapped or linked after unmap\"\n\
         sleep 2\n\
         [ ! -e /sys/block/$dx ] || die \"the daemon mapped x again after unmap\"\n\
         kill -TERM $pid; wait $pid\n\
         unmap $(file_of a); rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("bm", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// The target loses a volume and serves it again: the session's only path
/// is disconnected, another session (`thief`) opens the volume read-write,
/// the path comes back and rnbd's own reopen is refused (one writer), so
/// the device stays `closed` with a connected path, which the kernel never
/// retries. Once the thief lets go, the daemon's `remap_device` reopens it
/// and IO verifies.
fn daemon_remaps_lost_volume(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    // The daemon waits 6 s before reviving the path: time for the thief.
    let config = daemon_config_with(
        bed,
        "reconnect_after_s = 6\nremap_after_s = 2\n",
        "br",
        &[("a", &a)],
    );
    let thief_paths: String = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!(" path=ip:{p}"))
        .collect();
    let body = format!(
        "start_daemon $L\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         d=$(file_of a); P=/sys/class/rtrs-client/br/paths\n\
         for p in $P/*; do echo 1 > $p/disconnect || die \"disconnect $p\"; done\n\
         log \"paths of br disconnected: $(path_states br | tr '\\n' ' ')\"\n\
         n=0; until echo \"sessname=thief{thief_paths} device_path={a}\" > /sys/devices/virtual/rnbd-client/ctl/map_device 2>/dev/null; do n=$((n + 1)); [ $n -ge 20 ] && die \"the thief could not open {a}\"; sleep 0.2; done\n\
         t=$(for m in /sys/block/rnbd*; do [ \"$(cat $m/rnbd/session)\" = thief ] && basename $m; done)\n\
         log \"thief holds {a} read-write as $t\"\n\
         n=0; until path_states br | grep -q ' connected$' && [ \"$(cat /sys/block/$d/rnbd/state)\" = closed ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"expected br connected and $d closed: $(path_states br), $(cat /sys/block/$d/rnbd/state)\"; sleep 0.1; done\n\
         log \"path back, $d closed: the target refused rnbd's reopen\"\n\
         sleep 4\n\
         [ \"$(cat /sys/block/$d/rnbd/state)\" = closed ] || die \"$d reopened while the thief held the volume\"\n\
         unmap $t\n\
         log \"thief let go\"\n\
         n=0; until [ \"$(cat /sys/block/$d/rnbd/state)\" = open ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"$d not reopened within 30 s\"; sleep 0.1; done\n\
         grep -q \"remap a ($d)\" $L || die \"the daemon logged no remap\"\n\
         log \"$d open again after the daemon's remap_device\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid; wait $pid\n\
         unmap $d; rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("br", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// A session RTRS gives up on (`max_reconnect_attempts` 1, its only path
/// cut until the one attempt has failed and the next would be due) stays
/// down after the link is back, for longer than RTRS's reconnect delay;
/// the daemon, started then, revives it (`reconnect`), rnbd reopens the
/// device, and IO verifies. The kernel's first connect after the long
/// outage may itself time out (measured: 30-60 s, against either target),
/// so the daemon gets 180 s and keeps writing `reconnect`.
fn daemon_revives_given_up(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    let config = daemon_config_with(bed, "reconnect_after_s = 1\n", "bg", &[("a", &a)]);
    let body = "$D --config $C --once --socket $S --state $T > /tmp/bg.once.log 2>&1 || die \"--once failed\"\n\
         file_of a > /tmp/bg.dev\n\
         echo 1 > /sys/class/rtrs-client/bg/max_reconnect_attempts || die \"max_reconnect_attempts refused\"\n\
         log \"$(file_of a) mapped; session bg gives up after one reconnect attempt\"\n";
    bed.initiator
        .run(&daemon_script("bg", &config, body), MINUTE)?;
    step("cutting the only path until RTRS gives up");
    bed.relays[0].set_cut(true);
    // Heartbeats notice the cut (~30 s); after RTRS's delay (30 s) one
    // attempt fails (~30 s), after the next delay the path is closed.
    let wait_failed = "P=/sys/class/rtrs-client/bg/paths\n\
         n=0; while path_states bg | grep -q ' connected$'; do n=$((n + 1)); [ $n -ge 120 ] && die \"the cut went unnoticed\"; sleep 1; done\n\
         log \"noticed: $(path_states bg | tr '\\n' ' ')\"\n\
         n=0; until [ \"$(cut -d' ' -f2 $P/*/stats/reconnects)\" -ge 1 ] 2>/dev/null; do n=$((n + 1)); [ $n -ge 150 ] && die \"no failed reconnect: $(cat $P/*/stats/reconnects)\"; sleep 1; done\n\
         log \"one reconnect failed ($(cat $P/*/stats/reconnects)); waiting out the next delay\"\n\
         sleep 45\n";
    let failed = bed.initiator.run(wait_failed, 5 * MINUTE);
    bed.relays[0].set_cut(false);
    print!("{}", failed?);
    let body = "P=/sys/class/rtrs-client/bg/paths; d=$(cat /tmp/bg.dev)\n\
         log \"link back; the kernel alone for 45 s\"\n\
         sleep 45\n\
         if path_states bg | grep -q ' connected$'; then die \"the path came back without the daemon: RTRS did not give up ($(cat $P/*/stats/reconnects))\"; fi\n\
         log \"still down: $(path_states bg | tr '\\n' ' '), $d $(cat /sys/block/$d/rnbd/state)\"\n\
         start_daemon $L; t0=$(uptime_s)\n\
         n=0; until path_states bg | grep -q ' connected$' && [ \"$(cat /sys/block/$d/rnbd/state)\" = open ]; do n=$((n + 1)); [ $n -ge 1800 ] && die \"not revived within 180 s: $(path_states bg), $(cat /sys/block/$d/rnbd/state)\"; sleep 0.1; done\n\
         grep -q 'reconnect path .* of session bg' $L || die \"the daemon logged no reconnect\"\n\
         log \"revived by the daemon $(echo \"$t0 $(uptime_s)\" | awk '{print $2-$1}') s after it started ($(grep -c 'reconnect path' $L) reconnect lines): $(path_states bg | tr '\\n' ' ')\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid; wait $pid\n\
         unmap $d; rm -rf /dev/brick\n";
    let output = bed
        .initiator
        .run(&daemon_script("bg", &config, body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}
