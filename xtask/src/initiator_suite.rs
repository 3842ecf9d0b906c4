//! The `brick-initiator` suite: Brick's initiator (the `brick` CLI) against
//! the hosted target as real processes on this host, through the judge's
//! frame relay, no VM: a verify workload through a lossy link (drop,
//! reorder, duplicate in both directions) with 0 data errors, and a target
//! killed and restarted under a write workload, after which the initiator
//! reconnects, re-opens its volume and finishes without an error.

use crate::demo::TargetProcess;
use crate::interop::HostTool;
use crate::relay::{Faults, Relay, A_TO_B, B_TO_A};
use crate::suite::Counts;
use crate::util::step;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A relay, a target behind it and the CLI's connection options.
struct Rig {
    relay: Relay,
    target: Option<TargetProcess>,
    target_binary: PathBuf,
    manifest: PathBuf,
    cli: PathBuf,
    dir: PathBuf,
    starts: u32,
}

impl Rig {
    fn new(
        target_binary: &Path,
        cli: &Path,
        dir: &Path,
        name: &str,
        manifest: &str,
    ) -> Result<Rig> {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let manifest_path = dir.join("manifest.toml");
        std::fs::write(&manifest_path, manifest)?;
        let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 0x1b1c, None)?;
        let mut rig = Rig {
            relay,
            target: None,
            target_binary: target_binary.to_path_buf(),
            manifest: manifest_path,
            cli: cli.to_path_buf(),
            dir,
            starts: 0,
        };
        rig.start_target()?;
        Ok(rig)
    }

    fn start_target(&mut self) -> Result<()> {
        self.starts += 1;
        let log = self.dir.join(format!("target-{}.log", self.starts));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(&self.target_binary)
            .args(["--manifest", &self.manifest.display().to_string()])
            .args([
                "--link",
                &format!("frame:connect:{}", self.relay.b.display()),
            ])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("start brick-target")?;
        let target = TargetProcess { child, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !target.log().contains("listening") || !self.relay.side(1).0 {
            if Instant::now() > deadline {
                bail!("brick-target did not come up in 10 s:\n{}", target.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.target = Some(target);
        Ok(())
    }

    /// Kills the target (SIGKILL: a crash) and starts it again.
    fn crash_and_restart(&mut self) -> Result<()> {
        if let Some(mut target) = self.target.take() {
            let _ = target.child.kill();
            let _ = target.child.wait();
        }
        std::thread::sleep(Duration::from_millis(200));
        self.start_target()
    }

    /// `brick COMMAND` with the connection to this rig's target.
    fn brick(&self, command: &str, session: &str, args: &[&str], log: &str) -> Result<HostTool> {
        let mut all = vec![command.to_string()];
        all.extend(
            [
                "--link",
                &format!("frame:connect:{}", self.relay.a.display()),
                "--local",
                "10.77.0.2/24",
                "--target",
                "10.77.0.1",
                "--session",
                session,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        all.extend(args.iter().map(|s| s.to_string()));
        step(format!("brick {}", all.join(" ")));
        HostTool::spawn("brick", &self.cli, self.dir.join(log), &all)
    }

    fn target_log(&self) -> String {
        self.target
            .as_ref()
            .map(TargetProcess::log)
            .unwrap_or_default()
    }
}

const RAM_MANIFEST: &str = include_str!("../../examples/two-ram-volumes.toml");

/// 0.5 % drop, 1 % reorder, 1 % duplicate of RoCE frames, both directions:
/// `brick io verify` at 4 KiB, then 150 pieces of 512 B to 1 MiB at random
/// offsets, then a second session reading the first region back. The relay
/// must have applied every kind of fault.
fn lossy_verify(target: &Path, cli: &Path, dir: &Path) -> Result<()> {
    let rig = Rig::new(target, cli, dir, "lossy", RAM_MANIFEST)?;
    for direction in [A_TO_B, B_TO_A] {
        rig.relay.set_faults(
            direction,
            Faults {
                drop_rate: 0.005,
                reorder_rate: 0.01,
                duplicate_rate: 0.01,
                ..Faults::default()
            },
        );
    }
    let runs: [(&str, &[&str]); 3] = [
        (
            "lossy1",
            &[
                "--volume",
                "vol0",
                "verify",
                "--size",
                "4M",
                "--bs",
                "4k",
                "--pattern",
                "21",
            ],
        ),
        (
            "lossy2",
            &[
                "--volume",
                "vol0",
                "verify",
                "--offset",
                "16M",
                "--size",
                "32M",
                "--bs",
                "1M",
                "--min-bs",
                "512",
                "--random",
                "150",
                "--pattern",
                "22",
            ],
        ),
        (
            "lossy3",
            &[
                "--volume",
                "vol0",
                "read",
                "--size",
                "4M",
                "--bs",
                "64k",
                "--pattern",
                "21",
            ],
        ),
    ];
    for (session, args) in runs {
        let output = rig
            .brick("io", session, args, &format!("{session}.log"))?
            .finish(Duration::from_secs(300))?;
        for line in output.lines().filter(|l| !l.contains('%')) {
            println!("    {line}");
        }
    }
    let (ab, ba) = (rig.relay.stats(A_TO_B), rig.relay.stats(B_TO_A));
    println!("    relay: {}", rig.relay.summary());
    if ab.dropped + ba.dropped == 0
        || ab.reordered + ba.reordered == 0
        || ab.duplicated + ba.duplicated == 0
    {
        bail!(
            "the relay did not apply every fault: {}",
            rig.relay.summary()
        );
    }
    Ok(())
}

/// A 4 KiB random-write benchmark at queue depth 16 runs for 8 s; 2.5 s in,
/// the target is SIGKILLed and restarted. The benchmark must finish with 0
/// errors and at least one reconnect (IO is held while the session is
/// down, then re-issued on the re-opened volume); a verify afterwards works.
fn restart_under_io(target: &Path, cli: &Path, dir: &Path) -> Result<()> {
    let mut rig = Rig::new(target, cli, dir, "restart", RAM_MANIFEST)?;
    let bench = rig.brick(
        "bench",
        "restart1",
        &[
            "--volume",
            "vol0",
            "--rw",
            "randwrite",
            "--bs",
            "4k",
            "--qd",
            "16",
            "--runtime",
            "8",
            "--size",
            "32M",
            "--json",
        ],
        "bench.log",
    )?;
    std::thread::sleep(Duration::from_millis(2500));
    step("killing brick-target (SIGKILL) under IO and starting it again");
    rig.crash_and_restart()?;
    let output = bench.finish(Duration::from_secs(120))?;
    let json = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("brick bench printed no JSON:\n{output}"))?;
    let value: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("parse {json}"))?;
    let errors = value["errors"].as_u64().unwrap_or(u64::MAX);
    let reconnects = value["initiator"]["reconnects"].as_u64().unwrap_or(0);
    let writes = value["write"]["ios"].as_u64().unwrap_or(0);
    println!(
        "    bench across the restart: {writes} writes, {errors} errors, {reconnects} reconnects"
    );
    if errors != 0 || reconnects == 0 || writes == 0 {
        bail!(
            "expected 0 errors and a reconnect across the restart:\n{json}\n--- target ---\n{}",
            rig.target_log()
        );
    }
    if !rig.target_log().contains("session \"restart1\" opened") {
        bail!(
            "the restarted target never saw the session come back:\n{}",
            rig.target_log()
        );
    }
    rig.brick(
        "io",
        "restart2",
        &["--volume", "vol0", "verify", "--size", "4M", "--bs", "128k"],
        "verify.log",
    )?
    .finish(Duration::from_secs(120))?;
    Ok(())
}

type HostCase = fn(&Path, &Path, &Path) -> Result<()>;

/// Runs the suite; prints one line per case.
pub fn suite(failures: &mut Vec<String>) -> Counts {
    let mut counts = Counts::default();
    let (target, cli) = match crate::util::build_target_and_cli() {
        Ok(tools) => tools,
        Err(error) => {
            failures.push(format!("brick-initiator build: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let dir = crate::paths::scratch("initiator");
    let cases: [(&str, HostCase); 2] = [
        ("lossy_verify", lossy_verify),
        ("restart_under_io", restart_under_io),
    ];
    for (name, case) in cases {
        let start = Instant::now();
        match case(&target, &cli, &dir) {
            Ok(()) => {
                println!(
                    "host brick-initiator {name} ... ok ({:.1} s)",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!("host brick-initiator {name} ... FAILED\n{error:#}");
                failures.push(format!("brick-initiator {name}"));
                counts.failed += 1;
            }
        }
    }
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    counts
}
