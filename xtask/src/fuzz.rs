//! `cargo xtask fuzz`: builds the fuzz targets of `fuzz/` (cargo-fuzz,
//! libFuzzer, nightly), writes their seeds, runs each for a while (niced)
//! and prints what they did.
//!
//! Layout (docs/TESTING.md, "Fuzzing"): `fuzz/fuzz_targets/*.rs` are the
//! targets; `fuzz/seeds/<target>/` is the small seed set kept in git;
//! `fuzz/corpus/<target>/` is the growing corpus and
//! `fuzz/artifacts/<target>/` the crashes, both ignored by git. The
//! recorded-session seeds of `engine_frames` are written afresh on every
//! run into `fuzz/corpus/generated/` by the `fuzz-seeds` example, so they
//! follow the engine as it changes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::paths;
use crate::util::{run, step};

/// Every target, in the order they run.
pub const TARGETS: &[&str] = &[
    "engine_frames",
    "cm_machine",
    "qp",
    "rtrs_server",
    "rnbd_server",
    "nbd_server",
    "virtio_used_ring",
];

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// Run only this target (default: all of them, one after the other).
    #[arg(long)]
    target: Option<String>,
    /// libFuzzer processes per target, sharing its corpus.
    #[arg(long, default_value_t = 1)]
    jobs: u32,
    /// Sanitizer to build with (cargo fuzz `-s`): `none` (fastest; the
    /// targets are safe Rust over the crates) or `address`.
    #[arg(long, default_value = "none")]
    sanitizer: String,
    /// Niceness of the fuzzing processes.
    #[arg(long, default_value_t = 15)]
    nice: u32,
}

/// What one target did.
struct Report {
    target: String,
    executions: u64,
    seconds: f64,
    corpus: usize,
    crashes: Vec<PathBuf>,
}

pub fn run_fuzz(args: FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = match &args.target {
        Some(name) => {
            let Some(target) = TARGETS.iter().find(|t| **t == name.as_str()) else {
                bail!(
                    "no fuzz target {name:?}; expected one of {}",
                    TARGETS.join(", ")
                );
            };
            vec![*target]
        }
        None => TARGETS.to_vec(),
    };
    if args.jobs == 0 {
        bail!("--jobs must be at least 1, found 0");
    }
    let fuzz = paths::repo().join("fuzz");
    ensure_cargo_fuzz()?;
    step(format!(
        "building the fuzz targets: cargo +nightly fuzz build -s {}",
        args.sanitizer
    ));
    run(Command::new("cargo").current_dir(&fuzz).args([
        "+nightly",
        "fuzz",
        "build",
        "-s",
        &args.sanitizer,
    ]))?;
    let generated = fuzz.join("corpus/generated");
    step(format!(
        "writing the seeds (recorded engine sessions, capture frames) into {}",
        generated.display()
    ));
    run(Command::new("cargo")
        .current_dir(&fuzz)
        .args([
            "+nightly",
            "run",
            "--quiet",
            "--release",
            "--example",
            "fuzz-seeds",
            "--",
        ])
        .arg(&generated))?;
    let bin_dir = fuzz.join("target/x86_64-unknown-linux-gnu/release");
    let mut reports = Vec::new();
    for target in targets {
        reports.push(run_target(&fuzz, &bin_dir, target, &args)?);
    }
    print_table(&reports);
    let crashes: Vec<&PathBuf> = reports.iter().flat_map(|r| &r.crashes).collect();
    if !crashes.is_empty() {
        for crash in &crashes {
            eprintln!("crash: {}", crash.display());
        }
        bail!(
            "{} crash(es) found; reproduce one with `fuzz/target/x86_64-unknown-linux-gnu/release/<target> <file>`",
            crashes.len()
        );
    }
    Ok(())
}

/// Installs cargo-fuzz with `cargo install` when `cargo fuzz` is missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let present = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if present {
        return Ok(());
    }
    step("cargo-fuzz is missing: cargo install cargo-fuzz --locked");
    run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz (needs crates.io)")
}

fn run_target(fuzz: &Path, bin_dir: &Path, target: &str, args: &FuzzArgs) -> Result<Report> {
    let binary = bin_dir.join(target);
    let corpus = fuzz.join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    let logs = fuzz.join("artifacts/logs");
    for dir in [&corpus, &artifacts, &logs] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let seeds: Vec<PathBuf> = [
        fuzz.join("seeds").join(target),
        fuzz.join("corpus/generated").join(target),
    ]
    .into_iter()
    .filter(|dir| dir.is_dir())
    .collect();
    let before = artifact_files(&artifacts);
    step(format!(
        "fuzzing {target} for {} s ({} process(es), nice {}): corpus {}",
        args.time,
        args.jobs,
        args.nice,
        corpus.display()
    ));
    let started = Instant::now();
    let mut children: Vec<(Child, PathBuf)> = Vec::new();
    for job in 0..args.jobs {
        let log = logs.join(format!("{target}.{job}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new("nice");
        command
            .arg("-n")
            .arg(args.nice.to_string())
            .arg(&binary)
            .arg(&corpus)
            .args(&seeds)
            .arg(format!("-max_total_time={}", args.time))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(format!("-max_len={}", max_len(target)))
            .args(["-print_final_stats=1", "-timeout=20", "-rss_limit_mb=4096"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        children.push((child, log));
    }
    let mut executions = 0;
    for (mut child, log) in children {
        let status = child.wait().context("waiting for libFuzzer")?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        executions += final_stat(&text, "stat::number_of_executed_units").unwrap_or(0);
        if !status.success() {
            eprintln!(
                "{target}: libFuzzer exited with {status}; its log is {}",
                log.display()
            );
        }
    }
    let crashes = artifact_files(&artifacts)
        .into_iter()
        .filter(|file| !before.contains(file))
        .collect();
    Ok(Report {
        target: target.to_string(),
        executions,
        seconds: started.elapsed().as_secs_f64(),
        corpus: std::fs::read_dir(&corpus).map_or(0, |dir| dir.count()),
        crashes,
    })
}

/// Longest input libFuzzer makes for `target` (the recorded engine
/// sessions are tens of kilobytes).
fn max_len(target: &str) -> u32 {
    match target {
        "engine_frames" => 128 << 10,
        "nbd_server" => 64 << 10,
        _ => 8 << 10,
    }
}

/// Crash, timeout, leak and out-of-memory reports in `dir` (not the
/// slow-unit notes: a slow input is no failure).
fn artifact_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| {
                    ["crash-", "timeout-", "leak-", "oom-"]
                        .iter()
                        .any(|prefix| name.starts_with(prefix))
                })
        })
        .collect()
}

/// The value of a `-print_final_stats` line (`stat::name: value`).
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines().rev().find_map(|line| {
        line.strip_prefix(name)?
            .trim_start_matches(':')
            .trim()
            .parse()
            .ok()
    })
}

fn print_table(reports: &[Report]) {
    println!(
        "{:<18} {:>14} {:>10} {:>8} {:>8}",
        "target", "executions", "exec/s", "corpus", "crashes"
    );
    for report in reports {
        let rate = report.executions as f64 / report.seconds.max(1.0);
        println!(
            "{:<18} {:>14} {:>10.0} {:>8} {:>8}",
            report.target,
            report.executions,
            rate,
            report.corpus,
            report.crashes.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_are_read_from_the_log() {
        let log = "#1024 pulse cov: 10\nstat::number_of_executed_units: 123456\n\
                   stat::average_exec_per_sec:     2057\nstat::new_units_added: 3\n";
        assert_eq!(
            final_stat(log, "stat::number_of_executed_units"),
            Some(123_456)
        );
        assert_eq!(final_stat(log, "stat::average_exec_per_sec"), Some(2057));
        assert_eq!(final_stat(log, "stat::peak_rss_mb"), None);
    }

    #[test]
    fn every_target_has_a_source_file() {
        let dir = paths::repo().join("fuzz/fuzz_targets");
        for target in TARGETS {
            let file = dir.join(format!("{target}.rs"));
            assert!(file.is_file(), "{} is missing", file.display());
        }
    }
}
