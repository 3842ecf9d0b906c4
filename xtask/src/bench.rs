//! `cargo xtask bench-vm`: the same fio jobs from the same initiator VM
//! against every target it knows, as one table.
//!
//! Columns: the Linux reference target (rnbd_server and nvmet-rdma), the
//! hosted Brick target (`brick-target`) and the bare-metal image
//! (`brick-image` under QEMU, TCG), each on the judge's bed ([`Bed`]: one
//! relay between the target and the initiator VM); `--target` keeps some
//! kinds only. Each figure is the median of `--runs` runs with the spread
//! (min-max) shown; the ratio compares with the first column (the Linux
//! rnbd_server unless left out). Not a test: it prints numbers.

use crate::target::{path_address, Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Arguments of `cargo xtask bench-vm`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Seconds per fio run.
    #[arg(long, default_value_t = 20)]
    runtime: u32,
    /// Runs per job (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Only these target kinds (linux-ref, brick-hosted, brick-image, brick-verbs);
    /// repeatable. Default: all.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Link MTU of every bed (1500: rxe's path MTU 1024; 9000: 4096, the
    /// image's jumbo frames).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    mtu: u32,
    /// Only the jobs whose name contains this (e.g. "128k seq write");
    /// repeatable. Default: all.
    #[arg(long = "job")]
    jobs: Vec<String>,
    /// Capture every relayed frame, its first N bytes, to path0.pcap in the
    /// bed's scratch directory (kept with BRICK_KEEP_SCRATCH=1).
    #[arg(long, value_name = "SNAPLEN")]
    pcap: Option<usize>,
}

struct Job {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    depth: u32,
}

const JOBS: &[Job] = &[
    Job {
        name: "4k randread QD1",
        rw: "randread",
        bs: "4k",
        depth: 1,
    },
    Job {
        name: "4k randread QD32",
        rw: "randread",
        bs: "4k",
        depth: 32,
    },
    Job {
        name: "4k randwrite QD32",
        rw: "randwrite",
        bs: "4k",
        depth: 32,
    },
    Job {
        name: "128k seq read QD1",
        rw: "read",
        bs: "128k",
        depth: 1,
    },
    Job {
        name: "128k seq write QD1",
        rw: "write",
        bs: "128k",
        depth: 1,
    },
];

/// One measured run.
#[derive(Clone, Copy, Debug)]
struct Sample {
    iops: f64,
    mib_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A column of the table: a target and how the initiator reaches it.
struct Column {
    name: &'static str,
    /// Script that maps the volume and leaves its device name in $d.
    attach: fn(&Bed) -> String,
    detach: &'static str,
}

fn attach_rnbd(bed: &Bed) -> String {
    format!(
        "d=$(map bench {} \"{}\") || exit 1\n",
        bed.target.descriptor.volumes[0].device_path,
        bed.all_paths()
    )
}

fn attach_nvme(bed: &Bed) -> String {
    let nqn = bed
        .target
        .descriptor
        .nvme
        .as_ref()
        .map(|n| n.nqn.clone())
        .unwrap_or_default();
    format!(
        "d=$(nvme_connect {} {nqn}) || exit 1\n",
        bed.target.descriptor.paths[0].target
    )
}

pub fn run(args: BenchArgs) -> Result<()> {
    let images = Images::build()?;
    let columns: Vec<(TargetKind, Column)> = vec![
        (
            TargetKind::LinuxReference,
            Column {
                name: "linux rnbd_server",
                attach: attach_rnbd,
                detach: "unmap $d",
            },
        ),
        (
            TargetKind::LinuxReference,
            Column {
                name: "linux nvmet-rdma",
                attach: attach_nvme,
                detach: "nvme_disconnect $d",
            },
        ),
        (
            TargetKind::BrickHosted,
            Column {
                name: "brick hosted",
                attach: attach_rnbd,
                detach: "unmap $d",
            },
        ),
        (
            TargetKind::BrickImage,
            Column {
                name: "brick image",
                attach: attach_rnbd,
                detach: "unmap $d",
            },
        ),
        // The same kernel rxe in the same kind of VM as linux rnbd_server:
        // this column compares the target engines like for like.
        (
            TargetKind::BrickVerbs,
            Column {
                name: "brick on rxe",
                attach: attach_rnbd,
                detach: "unmap $d",
            },
        ),
    ];
    let known = [
        TargetKind::LinuxReference,
        TargetKind::BrickHosted,
        TargetKind::BrickImage,
        TargetKind::BrickVerbs,
    ];
    for name in &args.targets {
        if !known.iter().any(|k| k.name() == name) {
            bail!(
                "--target {name}: known kinds are {}",
                known.map(|k| k.name()).join(", ")
            );
        }
    }
    let columns: Vec<(TargetKind, Column)> = columns
        .into_iter()
        .filter(|(kind, _)| {
            args.targets.is_empty() || args.targets.iter().any(|t| t == kind.name())
        })
        .collect();
    for pattern in &args.jobs {
        if !JOBS.iter().any(|job| job.name.contains(pattern.as_str())) {
            bail!(
                "--job {pattern:?}: no job's name contains it; the jobs are {}",
                JOBS.iter()
                    .map(|job| job.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let jobs: Vec<&Job> = JOBS
        .iter()
        .filter(|job| {
            args.jobs.is_empty() || args.jobs.iter().any(|p| job.name.contains(p.as_str()))
        })
        .collect();
    let mut results: Vec<Vec<Vec<Sample>>> = Vec::new();
    let mut bed: Option<(TargetKind, Bed)> = None;
    for (kind, column) in &columns {
        if bed.as_ref().is_none_or(|(k, _)| k != kind) {
            drop(bed.take());
            step(format!("starting bed for {}", kind.name()));
            let config = BedConfig {
                mtu: args.mtu,
                pcap: args.pcap,
                ..BedConfig::new(*kind)
            };
            bed = Some((*kind, Bed::start(&images, &config)?));
        }
        let (_, current) = bed.as_mut().expect("bed started above");
        let attach = (column.attach)(current);
        let mut per_job = Vec::new();
        for job in &jobs {
            let mut samples = Vec::new();
            for run in 0..args.runs {
                step(format!(
                    "{}: {} run {}/{}",
                    column.name,
                    job.name,
                    run + 1,
                    args.runs
                ));
                let script = format!(
                    "{attach}fio --name=bench --filename=/dev/$d --direct=1 --ioengine=libaio \
                     --rw={} --bs={} --iodepth={} --time_based --runtime={} --size=48M \
                     --output-format=json > /tmp/bench.json 2>/tmp/bench.err || \
                     {{ cat /tmp/bench.err; exit 1; }}\n{}\ncat /tmp/bench.json\n",
                    job.rw, job.bs, job.depth, args.runtime, column.detach
                );
                let output = match current
                    .initiator
                    .run(&script, Duration::from_secs(u64::from(args.runtime) + 180))
                {
                    Ok(output) => output,
                    Err(error) => {
                        let relays: Vec<String> =
                            current.relays.iter().map(|relay| relay.summary()).collect();
                        // Whether the link still carries frames at all: a
                        // dead link and a stalled transport look alike to fio.
                        let ping = current
                            .initiator
                            .run(
                                &format!("ping -c 3 -W 1 {} 2>&1 || true", path_address(0).target),
                                Duration::from_secs(20),
                            )
                            .unwrap_or_else(|e| format!("(ping did not run: {e:#})"));
                        eprintln!("ping from the initiator after the failure:\n{ping}");
                        eprintln!(
                            "{} / {} run {} failed; relays: {}\ninitiator dmesg:\n{}\n{}",
                            column.name,
                            job.name,
                            run + 1,
                            relays.join("; "),
                            current.initiator.dmesg(),
                            current.target.diagnostics()
                        );
                        return Err(error);
                    }
                };
                let sample = parse_fio(&output, job.rw)
                    .with_context(|| format!("fio output of {} / {}", column.name, job.name))?;
                eprintln!(
                    "    {:.0} IOPS, {:.2} MiB/s, p50 {:.0} us, p99 {:.0} us",
                    sample.iops, sample.mib_s, sample.p50_us, sample.p99_us
                );
                samples.push(sample);
            }
            per_job.push(samples);
        }
        results.push(per_job);
    }
    drop(bed);
    print_table(
        &columns.iter().map(|(_, c)| c.name).collect::<Vec<_>>(),
        &jobs,
        &results,
        &args,
    );
    Ok(())
}

fn parse_fio(output: &str, rw: &str) -> Result<Sample> {
    let start = output.find('{').context("no JSON in fio output")?;
    let json: serde_json::Value = serde_json::from_str(&output[start..])?;
    let job = &json["jobs"][0];
    let side = if rw.contains("write") {
        &job["write"]
    } else {
        &job["read"]
    };
    let percentile = |p: &str| {
        side["clat_ns"]["percentile"][p]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1000.0
    };
    Ok(Sample {
        iops: side["iops"].as_f64().context("iops")?,
        mib_s: side["bw"].as_f64().context("bw")? / 1024.0,
        p50_us: percentile("50.000000"),
        p99_us: percentile("99.000000"),
    })
}

fn median_spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    let median = values[values.len() / 2];
    (median, values[0], values[values.len() - 1])
}

fn print_table(columns: &[&str], jobs: &[&Job], results: &[Vec<Vec<Sample>>], args: &BenchArgs) {
    println!(
        "\nfio from the Linux initiator VM (TCG, 1 vCPU, Unix stream link via relay, MTU {}), \
         {} s per run, median of {} (min-max); ratio vs {}",
        args.mtu, args.runtime, args.runs, columns[0]
    );
    let mut header = format!("| {:<20} |", "job");
    for column in columns {
        header += &format!(" {column} |");
    }
    println!("{header}");
    println!("|{}", "---|".repeat(columns.len() + 1));
    for (j, job) in jobs.iter().enumerate() {
        let mut line = format!("| {:<20} |", job.name);
        let baseline = {
            let mut v: Vec<f64> = results[0][j].iter().map(|s| s.iops).collect();
            median_spread(&mut v).0
        };
        for column in results {
            let samples = &column[j];
            let (iops, low, high) =
                median_spread(&mut samples.iter().map(|s| s.iops).collect::<Vec<_>>());
            let (mib, _, _) =
                median_spread(&mut samples.iter().map(|s| s.mib_s).collect::<Vec<_>>());
            let (p50, _, _) =
                median_spread(&mut samples.iter().map(|s| s.p50_us).collect::<Vec<_>>());
            let (p99, _, _) =
                median_spread(&mut samples.iter().map(|s| s.p99_us).collect::<Vec<_>>());
            line += &format!(
                " {iops:.0} IOPS ({low:.0}-{high:.0}), {mib:.2} MiB/s, p50 {:.2} ms, p99 {:.2} ms, x{:.2} |",
                p50 / 1000.0,
                p99 / 1000.0,
                iops / baseline
            );
        }
        println!("{line}");
    }
    print_image_goal(columns, jobs, results);
}

/// The image against the better Linux target and against the hosted
/// target (same initiator VM, same run), per job: the data path's goal is
/// 1.5x the better Linux, or within 10 % of the hosted target where that
/// is lower (the initiator VM is then the bound).
fn print_image_goal(columns: &[&str], jobs: &[&Job], results: &[Vec<Vec<Sample>>]) {
    let index = |name: &str| columns.iter().position(|c| *c == name);
    let Some(image) = index("brick image") else {
        return;
    };
    let linux: Vec<usize> = ["linux rnbd_server", "linux nvmet-rdma"]
        .iter()
        .filter_map(|name| index(name))
        .collect();
    if linux.is_empty() {
        return;
    }
    let hosted = index("brick hosted");
    let iops = |column: usize, job: usize| {
        median_spread(
            &mut results[column][job]
                .iter()
                .map(|s| s.iops)
                .collect::<Vec<_>>(),
        )
        .0
    };
    println!("\nbrick image against the better Linux target (goal x1.50) and the hosted target:");
    for (j, job) in jobs.iter().enumerate() {
        let (best, best_name) = linux
            .iter()
            .map(|&c| (iops(c, j), columns[c]))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .expect("at least one Linux column");
        let mine = iops(image, j);
        let mut line = format!(
            "  {:<20} image {mine:.0} IOPS, {best_name} {best:.0}: x{:.2}",
            job.name,
            mine / best
        );
        if let Some(hosted) = hosted {
            let native = iops(hosted, j);
            line += &format!("; hosted {native:.0}: x{:.2}", mine / native);
        }
        println!("{line}");
    }
}
