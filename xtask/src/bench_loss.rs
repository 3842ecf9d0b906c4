//! `cargo xtask bench-loss`: Brick's initiator (`brick io verify`) and the
//! hosted target through the frame relay, lossless and with the loss mix
//! of issue 17 (2 % drop, 2 % reorder, 1 % duplicate, 0.1 % corrupt of
//! RoCE data frames, both directions): 128 KiB QD1 verify (write then
//! read back) and random pieces of 512 B to 1 MiB. Prints MB/s of each
//! pass, the lossy/lossless ratio, the relay's fault counts and the
//! target's transport counters. Not a test: it prints numbers.
//!
//! `--target`/`--cli` run other binaries (e.g. a build of an older
//! commit) instead of building this tree's.

use crate::demo::TargetProcess;
use crate::interop::HostTool;
use crate::relay::{Faults, Relay, A_TO_B, B_TO_A};
use crate::util::step;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Arguments of `cargo xtask bench-loss`.
#[derive(clap::Args)]
pub struct BenchLossArgs {
    /// brick-target binary (default: build this tree's).
    #[arg(long)]
    target: Option<PathBuf>,
    /// brick CLI binary (default: build this tree's).
    #[arg(long)]
    cli: Option<PathBuf>,
    /// Bytes of the 128 KiB verify.
    #[arg(long, default_value = "32M")]
    size: String,
    /// Random pieces of 512 B..1 MiB.
    #[arg(long, default_value_t = 300)]
    pieces: u32,
    /// Write every relayed frame of each pass to DIR/{lossless,lossy}.pcap.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Only the lossy pass (with the lossless one skipped, no ratio).
    #[arg(long)]
    lossy_only: bool,
    /// Rounds (lossless then lossy each); each pass reports its best round,
    /// which filters out a busy machine's stalls.
    #[arg(long, default_value_t = 1)]
    runs: u32,
}

const MANIFEST: &str = include_str!("../../examples/two-ram-volumes.toml");

/// The loss mix of the issue.
fn mix() -> Faults {
    Faults {
        drop_rate: 0.02,
        reorder_rate: 0.02,
        duplicate_rate: 0.01,
        corrupt_rate: 0.001,
        ..Faults::default()
    }
}

/// MB/s of each pass `brick io` printed (write, read).
fn rates(output: &str) -> Vec<f64> {
    output
        .lines()
        .filter(|line| !line.contains('%') && line.contains(" MB/s"))
        .filter_map(|line| {
            let before = line.split(" MB/s").next()?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .collect()
}

struct Outcome {
    verify: Vec<f64>,
    pieces: Vec<f64>,
    relay: String,
    target_tail: String,
}

fn one(
    target: &Path,
    cli: &Path,
    dir: &Path,
    lossy: bool,
    args: &BenchLossArgs,
) -> Result<Outcome> {
    let name = if lossy { "lossy" } else { "lossless" };
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir)?;
    let manifest = dir.join("manifest.toml");
    std::fs::write(&manifest, MANIFEST)?;
    let pcap = args
        .pcap
        .as_ref()
        .map(|pcap| pcap.join(format!("{name}.pcap")));
    let relay = Relay::start(
        &dir.join("a.sock"),
        &dir.join("b.sock"),
        0x1b1c,
        pcap.as_deref(),
    )?;
    let target_process = TargetProcess::start(
        target,
        &manifest,
        &format!("frame:connect:{}", relay.b.display()),
        dir.join("target.log"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !relay.side(1).0 {
        if Instant::now() > deadline {
            bail!(
                "brick-target did not reach the relay:\n{}",
                target_process.log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if lossy {
        for direction in [A_TO_B, B_TO_A] {
            relay.set_faults(direction, mix());
        }
    }
    let link = format!("frame:connect:{}", relay.a.display());
    let pieces = args.pieces.to_string();
    let runs: [(&str, Vec<&str>); 2] = [
        (
            "verify",
            vec![
                "--volume",
                "vol0",
                "verify",
                "--size",
                &args.size,
                "--bs",
                "128k",
                "--pattern",
                "31",
            ],
        ),
        (
            "pieces",
            vec![
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
                &pieces,
                "--pattern",
                "32",
            ],
        ),
    ];
    let mut results = Vec::new();
    for (session, io_args) in runs {
        let mut all: Vec<String> = [
            "io",
            "--link",
            &link,
            "--local",
            "10.77.0.2/24",
            "--target",
            "10.77.0.1",
            "--session",
            &format!("{name}-{session}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend(io_args.iter().map(|s| s.to_string()));
        step(format!("{name}: brick {}", all.join(" ")));
        let output = HostTool::spawn("brick", cli, dir.join(format!("{session}.log")), &all)?
            .finish(Duration::from_secs(900))?;
        for line in output.lines().filter(|l| !l.contains('%')) {
            println!("    {line}");
        }
        results.push(rates(&output));
    }
    let relay_summary = relay.summary();
    // Stop the target first: it prints its transport counters on exit.
    drop(target_process);
    let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
    let tail: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("retransmissions"))
        .rev()
        .take(1)
        .collect();
    Ok(Outcome {
        verify: results[0].clone(),
        pieces: results[1].clone(),
        relay: relay_summary,
        target_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

/// Per pass, the better of two rounds; the newer round's relay and target
/// lines.
fn best(old: Outcome, new: Outcome) -> Outcome {
    let max = |a: &[f64], b: &[f64]| -> Vec<f64> {
        (0..a.len().max(b.len()))
            .map(|i| {
                a.get(i)
                    .copied()
                    .unwrap_or(0.0)
                    .max(b.get(i).copied().unwrap_or(0.0))
            })
            .collect()
    };
    Outcome {
        verify: max(&old.verify, &new.verify),
        pieces: max(&old.pieces, &new.pieces),
        relay: new.relay,
        target_tail: new.target_tail,
    }
}

fn ratio(lossy: &[f64], clean: &[f64], index: usize) -> String {
    match (lossy.get(index), clean.get(index)) {
        (Some(l), Some(c)) if *c > 0.0 => {
            format!("{l:>8.1} MB/s of {c:>8.1} MB/s ({:>5.1} %)", l / c * 100.0)
        }
        _ => "n/a".into(),
    }
}

/// Runs the benchmark and prints the table.
pub fn run(args: BenchLossArgs) -> Result<()> {
    let (target, cli) = match (&args.target, &args.cli) {
        (Some(target), Some(cli)) => (target.clone(), cli.clone()),
        _ => crate::util::build_target_and_cli()?,
    };
    let dir = crate::paths::scratch("bench-loss");
    if let Some(pcap) = &args.pcap {
        std::fs::create_dir_all(pcap)?;
    }
    let mut clean = Outcome {
        verify: Vec::new(),
        pieces: Vec::new(),
        relay: "skipped".into(),
        target_tail: String::new(),
    };
    let mut lossy = Outcome {
        verify: Vec::new(),
        pieces: Vec::new(),
        relay: String::new(),
        target_tail: String::new(),
    };
    for round in 0..args.runs.max(1) {
        step(format!("round {} of {}", round + 1, args.runs.max(1)));
        if !args.lossy_only {
            let outcome = one(&target, &cli, &dir, false, &args)?;
            clean = best(clean, outcome);
        }
        lossy = best(lossy, one(&target, &cli, &dir, true, &args)?);
    }
    println!();
    println!(
        "bench-loss: {} and {}, best of {} round(s)",
        target.display(),
        cli.display(),
        args.runs.max(1)
    );
    println!(
        "  loss mix: 2 % drop, 2 % reorder, 1 % duplicate, 0.1 % corrupt \
         (RoCE data frames, both directions)"
    );
    println!(
        "  128 KiB QD1 verify write: {}",
        ratio(&lossy.verify, &clean.verify, 0)
    );
    println!(
        "  128 KiB QD1 verify read:  {}",
        ratio(&lossy.verify, &clean.verify, 1)
    );
    println!(
        "  {} pieces 512 B..1 MiB write: {}",
        args.pieces,
        ratio(&lossy.pieces, &clean.pieces, 0)
    );
    println!(
        "  {} pieces 512 B..1 MiB read:  {}",
        args.pieces,
        ratio(&lossy.pieces, &clean.pieces, 1)
    );
    println!("  relay (lossy): {}", lossy.relay);
    println!("  relay (lossless): {}", clean.relay);
    println!("  target (lossy, last round): {}", lossy.target_tail);
    Ok(())
}
