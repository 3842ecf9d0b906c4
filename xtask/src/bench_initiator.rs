//! `cargo xtask bench-initiator`: Brick's userspace initiator (`brick
//! bench`) measured against every target it reaches, as one table.
//!
//! Columns, all in one run:
//!
//! * **brick-target, UDP loopback**: the hosted target on 127.0.0.1, the
//!   initiator on 127.0.0.2 (RoCEv2 payloads in UDP datagrams, no relay);
//! * **brick-target, frame link**: the same target on a QEMU-framed Unix
//!   socket (Ethernet frames), the initiator on the other end;
//! * with the VM (default; `--no-vm` skips it): the Linux `rnbd_server`
//!   over rdma_rxe in a VM (TCG) and the hosted Brick target, each behind
//!   the judge's frame relay, the same initiator in front of both: there
//!   the target is the bottleneck, which is the comparison;
//! * with the VM, the bare-metal image under QEMU (TCG, the demo's
//!   manifest) behind the same relay: the goal of issue 17 is at least 3x
//!   Linux rnbd_server on every workload, both targets emulated alike.
//!
//! Beside them, the ceiling of the host's UDP loopback measured in the
//! same run with plain sockets: a 4 KiB ping-pong between two threads,
//! once blocking in recvfrom(2) and once spinning on non-blocking sockets,
//! yielding between polls as the hosted loops do (what QD1 could reach if
//! RoCE cost nothing, for a loop that sleeps and for one that busy-polls,
//! `--poll-us`), and a one-way stream of
//! 1,052-byte datagrams (one path-MTU-1024 RoCE packet each: what a
//! transfer could reach). Not a test: it prints numbers.

use crate::demo::{free_port, TargetProcess};
use crate::interop::HostTool;
use crate::qemu::{NicConfig, Vm, VmConfig};
use crate::relay::Relay;
use crate::util::step;
use crate::vmimage::{Images, Overlays};
use anyhow::{Context, Result};
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

/// Arguments of `cargo xtask bench-initiator`.
#[derive(clap::Args)]
pub struct BenchInitiatorArgs {
    /// Seconds per workload.
    #[arg(long, default_value_t = 10)]
    runtime: u32,
    /// Skip the VM columns (Linux rnbd_server, Brick behind the relay).
    #[arg(long)]
    no_vm: bool,
    /// Run `DIR/brick-target` and `DIR/brick` instead of building them
    /// (to compare two builds under the same machine load).
    #[arg(long, value_name = "DIR")]
    bins: Option<std::path::PathBuf>,
    /// Link MTU of every column: the targets' manifest interfaces, the
    /// Linux VM's NIC and the initiator's `--mtu` (1500: path MTU 1024;
    /// 9000: 4096).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    mtu: u32,
    /// Busy polling (`--poll-us`) of brick-target and the initiator on the
    /// two hosted-link columns (UDP loopback, frame link), for a machine
    /// with a core per process; the relay and VM columns never spin (the
    /// VMs need the cores).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    poll_us: u32,
}

/// One `brick bench` workload.
struct Workload {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    qd: u32,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "4k randread QD1",
        rw: "randread",
        bs: "4k",
        qd: 1,
    },
    Workload {
        name: "4k randread QD32",
        rw: "randread",
        bs: "4k",
        qd: 32,
    },
    Workload {
        name: "4k randwrite QD32",
        rw: "randwrite",
        bs: "4k",
        qd: 32,
    },
    Workload {
        name: "128k seq read QD8",
        rw: "read",
        bs: "128k",
        qd: 8,
    },
    Workload {
        name: "128k seq write QD8",
        rw: "write",
        bs: "128k",
        qd: 8,
    },
];

/// One measured workload.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    iops: f64,
    mb_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    errors: u64,
}

/// How the initiator reaches a target: the CLI's connection options.
struct Endpoint {
    name: &'static str,
    connection: Vec<String>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Runs every workload against `endpoint`, printing one line each.
fn run_workloads(
    cli: &Path,
    endpoint: &Endpoint,
    volume: &str,
    runtime: u32,
    mtu: u32,
    dir: &Path,
) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for (index, workload) in WORKLOADS.iter().enumerate() {
        let mut args = vec!["bench".to_string()];
        args.extend(endpoint.connection.iter().cloned());
        args.extend(strings(&["--mtu", &mtu.to_string()]));
        args.extend(strings(&[
            "--session",
            &format!("bench{index}"),
            "--volume",
            volume,
            "--rw",
            workload.rw,
            "--bs",
            workload.bs,
            "--qd",
            &workload.qd.to_string(),
            "--runtime",
            &runtime.to_string(),
            "--size",
            "64M",
            "--json",
        ]));
        let log = dir.join(format!(
            "{}-{index}.log",
            endpoint.name.replace([' ', ','], "_")
        ));
        let tool = HostTool::spawn("brick bench", cli, log, &args)?;
        let output = tool.finish(Duration::from_secs(u64::from(runtime) + 120))?;
        let sample = parse_bench(&output, workload.rw)?;
        println!(
            "  {:<28} {:<20} {:>9.0} IOPS {:>8.1} MB/s  p50 {:>8.1} us  p99 {:>8.1} us  errors {}",
            endpoint.name,
            workload.name,
            sample.iops,
            sample.mb_s,
            sample.p50_us,
            sample.p99_us,
            sample.errors
        );
        samples.push(sample);
    }
    Ok(samples)
}

/// Reads the direction `rw` needs out of `brick bench --json`.
fn parse_bench(output: &str, rw: &str) -> Result<Sample> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("brick bench printed no JSON:\n{output}"))?;
    let value: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("parse {line}"))?;
    let direction = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    let side = &value[direction];
    let number = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let latency = &side["latency_ns"];
    Ok(Sample {
        iops: number(&side["iops"]),
        mb_s: number(&side["mb_per_s"]),
        p50_us: number(&latency["p50"]) / 1e3,
        p99_us: number(&latency["p99"]) / 1e3,
        p999_us: number(&latency["p99_9"]) / 1e3,
        errors: value["errors"].as_u64().unwrap_or(0),
    })
}

/// One raw 4 KiB UDP ping-pong between two threads.
#[derive(Clone, Copy, Debug, Default)]
struct PingPong {
    round_trips: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Receives one datagram on `socket`: blocking (its read timeout set), or
/// busy-polling a non-blocking socket until `give_up`, yielding the core
/// after each empty poll as the hosted loops' `--poll-us` spin does (two
/// spinners that never yield share a loaded machine's last core by
/// scheduler slices: the round trip becomes milliseconds).
fn receive(
    socket: &UdpSocket,
    buffer: &mut [u8],
    busy: bool,
    give_up: Duration,
) -> std::io::Result<Option<(usize, std::net::SocketAddr)>> {
    let started = Instant::now();
    loop {
        match socket.recv_from(buffer) {
            Ok(got) => return Ok(Some(got)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !busy || started.elapsed() >= give_up {
                    return Ok(None);
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

/// A 4 KiB ping-pong for `duration`: b echoes, a measures. `busy`: both
/// threads spin on non-blocking sockets, yielding between polls (what
/// busy polling compares with); otherwise both block in recvfrom(2). A lost datagram (a loaded
/// machine drops them on loopback too) costs 500 ms, not a hang; the echo
/// stops when told, not when it waits long.
fn ping_pong(duration: Duration, busy: bool) -> Result<PingPong> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.2:0")?;
    let b_addr = b.local_addr()?;
    a.set_nonblocking(busy)?;
    b.set_nonblocking(busy)?;
    a.set_read_timeout(Some(Duration::from_millis(500)))?;
    b.set_read_timeout(Some(Duration::from_millis(200)))?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo_stop = stop.clone();
    let echo_thread = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 65536];
        while !echo_stop.load(std::sync::atomic::Ordering::Relaxed) {
            match receive(&b, &mut buffer, busy, Duration::from_millis(200)) {
                Ok(Some((len, from))) => {
                    let _ = b.send_to(&buffer[..len], from);
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    });
    let payload = vec![0x5a; 4096];
    let mut reply = vec![0u8; 65536];
    let mut latencies = Vec::with_capacity(1 << 20);
    let mut lost = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        let sent = Instant::now();
        a.send_to(&payload, b_addr)?;
        match receive(&a, &mut reply, busy, Duration::from_millis(500))? {
            Some(_) => latencies.push(sent.elapsed().as_nanos() as f64 / 1e3),
            None => lost += 1,
        }
    }
    let round_trips = latencies.len() as f64 / start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo_thread.join();
    if lost > 0 {
        println!("  (raw ping-pong: {lost} datagrams lost, each waited 500 ms)");
    }
    anyhow::ensure!(!latencies.is_empty(), "raw UDP ping-pong: no reply at all");
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    Ok(PingPong {
        round_trips,
        p50_us: percentile(0.5),
        p99_us: percentile(0.99),
    })
}

/// One-way MB/s of a stream of 1,052-byte datagrams for `duration`.
fn udp_stream(duration: Duration) -> Result<f64> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.2:0")?;
    let b_addr = b.local_addr()?;
    // Stream: a sends as fast as b drains; count what b received.
    let receiver = b.try_clone()?;
    receiver.set_read_timeout(Some(Duration::from_millis(200)))?;
    let counter = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 2048];
        let mut bytes = 0u64;
        let started = Instant::now();
        while let Ok((len, _)) = receiver.recv_from(&mut buffer) {
            if len == 1 {
                break;
            }
            bytes += len as u64;
        }
        (bytes, started.elapsed())
    });
    let datagram = vec![0xa5; 1052];
    let start = Instant::now();
    while start.elapsed() < duration {
        for _ in 0..64 {
            let _ = a.send_to(&datagram, b_addr);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    a.send_to(&[0], b_addr)?;
    let (bytes, _) = counter
        .join()
        .map_err(|_| anyhow::anyhow!("UDP stream thread panicked"))?;
    Ok(bytes as f64 / 1e6 / start.elapsed().as_secs_f64())
}

pub fn run(args: BenchInitiatorArgs) -> Result<()> {
    let (target_binary, cli) = match &args.bins {
        Some(dir) => (dir.join("brick-target"), dir.join("brick")),
        None => crate::util::build_target_and_cli()?,
    };
    let dir = crate::paths::scratch("bench-initiator");
    let repo = crate::paths::repo();
    // The hosted target's manifests, their interfaces at the MTU.
    let manifest = |name: &str| -> Result<std::path::PathBuf> {
        let source = repo.join("examples").join(name);
        let text = std::fs::read_to_string(&source)
            .with_context(|| format!("read {}", source.display()))?;
        let path = dir.join(name);
        std::fs::write(&path, crate::util::manifest_at_mtu(&text, args.mtu))
            .with_context(|| format!("write {}", path.display()))?;
        Ok(path)
    };
    let loopback = manifest("loopback.toml")?;
    let two_ram = manifest("two-ram-volumes.toml")?;
    let poll = strings(&["--poll-us", &args.poll_us.to_string()]);
    let mut columns: Vec<(&'static str, Vec<Sample>)> = Vec::new();

    // UDP loopback.
    let port = free_port()?;
    step(format!(
        "brick-target on udp:127.0.0.1:{port} (examples/loopback.toml)"
    ));
    {
        let _target = TargetProcess::start_with(
            &target_binary,
            &loopback,
            &format!("udp:127.0.0.1:{port}"),
            &poll,
            dir.join("target-udp.log"),
        )?;
        let endpoint = Endpoint {
            name: "brick-target, UDP loopback",
            connection: strings(&[
                "--link",
                &format!("udp:127.0.0.2:{port}"),
                "--target",
                "127.0.0.1",
                &poll[0],
                &poll[1],
            ]),
        };
        columns.push((
            endpoint.name,
            run_workloads(&cli, &endpoint, "vol0", args.runtime, args.mtu, &dir)?,
        ));
    }

    // Frame link (a Unix socket, Ethernet frames in QEMU's framing).
    let socket = dir.join("frame.sock");
    step(format!(
        "brick-target on frame:listen:{} (examples/two-ram-volumes.toml)",
        socket.display()
    ));
    {
        let _target = TargetProcess::start_with(
            &target_binary,
            &two_ram,
            &format!("frame:listen:{}", socket.display()),
            &poll,
            dir.join("target-frame.log"),
        )?;
        let endpoint = Endpoint {
            name: "brick-target, frame link",
            connection: strings(&[
                "--link",
                &format!("frame:connect:{}", socket.display()),
                "--local",
                "10.77.0.2/24",
                "--target",
                "10.77.0.1",
                &poll[0],
                &poll[1],
            ]),
        };
        columns.push((
            endpoint.name,
            run_workloads(&cli, &endpoint, "vol0", args.runtime, args.mtu, &dir)?,
        ));
    }

    if !args.no_vm {
        let images = Images::build()?;
        let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 11, None)?;
        let through_relay = Endpoint {
            name: "",
            connection: strings(&[
                "--link",
                &format!("frame:connect:{}", relay.a.display()),
                "--local",
                "10.77.0.2/24",
                "--target",
                "10.77.0.1",
            ]),
        };
        step("booting the Linux rnbd_server VM (QEMU, TCG) behind the relay");
        let mut config = VmConfig::new("bench-linux-target");
        config.overlays = Overlays {
            fio: false,
            rping: false,
            ext4: false,
        };
        config.mtu = args.mtu;
        config.nics = vec![NicConfig {
            socket: relay.b.clone(),
            mac: "52:54:00:77:00:01".into(),
            address: "10.77.0.1/24".into(),
        }];
        let mut vm = Vm::spawn(&images, config)?;
        vm.wait_ready()?;
        vm.run("serve_rnbd 1 128\n", Duration::from_secs(60))?;
        let endpoint = Endpoint {
            name: "linux rnbd_server (VM), relay",
            ..through_relay
        };
        columns.push((
            endpoint.name,
            run_workloads(&cli, &endpoint, "ram0", args.runtime, args.mtu, &dir)?,
        ));
        drop(vm);
        std::thread::sleep(Duration::from_millis(300));
        let image = crate::image::build()?;
        let booted = crate::demo::boot_image(&image, &dir, &relay.b, args.mtu)?;
        println!("{}", booted.serving);
        let endpoint = Endpoint {
            name: "brick image (VM), relay",
            connection: endpoint.connection,
        };
        columns.push((
            endpoint.name,
            run_workloads(&cli, &endpoint, "vol0", args.runtime, args.mtu, &dir)?,
        ));
        drop(booted);
        std::thread::sleep(Duration::from_millis(300));
        step("brick-target behind the same relay");
        let _target = TargetProcess::start(
            &target_binary,
            &two_ram,
            &format!("frame:connect:{}", relay.b.display()),
            dir.join("target-relay.log"),
        )?;
        let endpoint = Endpoint {
            name: "brick-target, relay",
            connection: endpoint.connection,
        };
        columns.push((
            endpoint.name,
            run_workloads(&cli, &endpoint, "vol0", args.runtime, args.mtu, &dir)?,
        ));
    }

    step(format!(
        "raw UDP loopback ceiling ({} s each)",
        args.runtime.min(5)
    ));
    let seconds = Duration::from_secs(u64::from(args.runtime.min(5)).max(1));
    let blocking = ping_pong(seconds, false)?;
    let busy = ping_pong(seconds, true)?;
    let stream_mb_s = udp_stream(seconds)?;

    println!();
    println!(
        "brick bench, {} s per workload, link MTU {}, busy polling {} us on the hosted links; \
         IOPS / MB/s / p50 / p99 / p99.9 latency (us)",
        args.runtime, args.mtu, args.poll_us
    );
    for (index, workload) in WORKLOADS.iter().enumerate() {
        println!("{}", workload.name);
        for (name, samples) in &columns {
            let s = samples[index];
            println!(
                "  {name:<32} {:>9.0} IOPS {:>8.1} MB/s  p50 {:>8.1}  p99 {:>8.1}  p99.9 {:>8.1}{}",
                s.iops,
                s.mb_s,
                s.p50_us,
                s.p99_us,
                s.p999_us,
                if s.errors > 0 {
                    format!("  ({} errors)", s.errors)
                } else {
                    String::new()
                }
            );
        }
        let column = |name: &str| {
            columns
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, s)| s[index])
        };
        if let (Some(image), Some(linux)) = (
            column("brick image (VM), relay"),
            column("linux rnbd_server (VM), relay"),
        ) {
            if linux.iops > 0.0 {
                println!(
                    "  {:<32} x{:.2} IOPS (goal: at least x3.00)",
                    "image / linux rnbd_server",
                    image.iops / linux.iops
                );
            }
        }
        // Columns 0 and 1: the UDP link and the frame link, same target.
        if let (Some((_, udp)), Some((_, frame))) = (columns.first(), columns.get(1)) {
            let (udp, frame) = (udp[index], frame[index]);
            if frame.iops > 0.0 {
                println!(
                    "  {:<32} x{:.2} IOPS (goal: at least x1.00)",
                    "UDP link / frame link",
                    udp.iops / frame.iops
                );
            }
        }
    }
    println!("raw UDP loopback, same run:");
    for (name, pp) in [("blocking", blocking), ("busy-polling", busy)] {
        println!(
            "  4 KiB ping-pong, {name:<13} {:>9.0} round trips/s  p50 {:.1} us  p99 {:.1} us",
            pp.round_trips, pp.p50_us, pp.p99_us
        );
    }
    println!("  1,052-byte datagram stream       {stream_mb_s:>9.1} MB/s one way");
    // Like with like: a loop that sleeps against the blocking ping-pong,
    // a busy-polling one against the spinning ping-pong.
    let (kind, reference) = if args.poll_us > 0 {
        ("busy-polling", busy)
    } else {
        ("blocking", blocking)
    };
    if let Some(qd1) = WORKLOADS.iter().position(|w| w.qd == 1 && w.bs == "4k") {
        for (name, samples) in columns.iter().take(2) {
            if reference.p50_us > 0.0 {
                println!(
                    "  4k QD1 over {name}: p50 {:.1} us = x{:.1} the {kind} ping-pong's p50 (goal: at most x2)",
                    samples[qd1].p50_us,
                    samples[qd1].p50_us / reference.p50_us
                );
            }
        }
    }
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
