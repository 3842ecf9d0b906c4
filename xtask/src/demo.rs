//! `cargo xtask demo` and `cargo xtask vm run`.
//!
//! The demo builds the hosted Brick target (`brick-target`) and the `brick`
//! CLI, starts the target with the built-in demo manifest
//! (`examples/loopback.toml`: a 64 MiB RAM volume `vol0` at 127.0.0.1) on a
//! UDP loopback link, maps `vol0` with Brick's initiator from 127.0.0.2,
//! writes and verifies 16 MiB, runs a 10-second 4 KiB random-read
//! benchmark at queue depth 32, and prints the results. No VM, no kernel
//! module: it runs anywhere Rust does.
//!
//! `cargo xtask demo --linux` instead serves `examples/two-ram-volumes.toml`
//! to the stock Linux rnbd_client in the initiator VM (QEMU, TCG) over
//! rdma_rxe, writes and verifies `vol0` with fio, and unmaps it.

use crate::target::{Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The built-in demo manifest.
const DEMO_MANIFEST: &str = include_str!("../../examples/loopback.toml");

/// Arguments of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Map the volume from the stock Linux rnbd_client in a VM instead.
    #[arg(long)]
    linux: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if args.linux {
        run_linux()
    } else {
        run_loopback()
    }
}

/// A UDP port free on both 127.0.0.1 and 127.0.0.2 (4791 if it is).
pub(crate) fn free_port() -> Result<u16> {
    let free = |port: u16| {
        std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.2", port)).is_ok()
    };
    if free(4791) {
        return Ok(4791);
    }
    for _ in 0..50 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if free(port) {
            return Ok(port);
        }
    }
    bail!("no UDP port free on both 127.0.0.1 and 127.0.0.2")
}

/// The target process; killed (SIGTERM, so it prints its statistics) on drop.
pub(crate) struct TargetProcess {
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl TargetProcess {
    /// The process's output so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child pid we own; no memory is involved.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `brick` with `args`, streaming its output; fails on a non-zero exit.
fn brick(cli: &Path, args: &[String]) -> Result<()> {
    let status = Command::new(cli)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("run {}", cli.display()))?;
    if !status.success() {
        bail!("brick {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn run_loopback() -> Result<()> {
    let (target_binary, cli) = crate::util::build_target_and_cli()?;
    let dir = crate::paths::scratch("demo");
    let manifest = dir.join("demo.toml");
    std::fs::write(&manifest, DEMO_MANIFEST)?;
    let port = free_port()?;
    let log = dir.join("brick-target.log");
    step(format!(
        "starting brick-target with the demo manifest (vol0: 64 MiB of RAM) on udp:127.0.0.1:{port}"
    ));
    let file = std::fs::File::create(&log)?;
    let child = Command::new(&target_binary)
        .args(["--manifest", &manifest.display().to_string()])
        .args(["--link", &format!("udp:127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("start brick-target")?;
    let target = TargetProcess { child, log };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !target.log().contains("listening") {
        if Instant::now() > deadline {
            bail!("brick-target did not start in 10 s:\n{}", target.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let common: Vec<String> = [
        "--link",
        &format!("udp:127.0.0.2:{port}"),
        "--target",
        "127.0.0.1",
        "--session",
        "demo",
        "--volume",
        "vol0",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    step("mapping vol0 with Brick's initiator from 127.0.0.2, writing and verifying 16 MiB");
    let mut args = vec!["io".to_string()];
    args.extend(common.iter().cloned());
    args.extend(["verify", "--size", "16M", "--bs", "128k"].map(String::from));
    brick(&cli, &args)?;
    step("benchmark: 4 KiB random reads, queue depth 32, 10 s");
    let mut args = vec!["bench".to_string()];
    args.extend(common.iter().cloned());
    args.extend(
        [
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            "10",
        ]
        .map(String::from),
    );
    brick(&cli, &args)?;
    let log_path = target.log.clone();
    drop(target);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    step("the target's statistics (printed as it stopped)");
    for line in log
        .lines()
        .skip_while(|l| !l.starts_with("brick statistics"))
    {
        println!("  {line}");
    }
    println!(
        "\nBrick's initiator mapped vol0 from Brick's hosted target over RoCEv2 on UDP loopback."
    );
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn run_linux() -> Result<()> {
    let images = Images::build()?;
    step("starting the hosted Brick target (examples/two-ram-volumes.toml) and booting the Linux initiator VM (QEMU, TCG)");
    let mut bed = Bed::start(&images, &BedConfig::new(TargetKind::BrickHosted))?;
    let volume = bed.target.descriptor.volumes[0].clone();
    step(format!(
        "mapping {} from Brick at {} with the stock rnbd_client over rdma_rxe",
        volume.device_path, bed.target.descriptor.paths[0].target
    ));
    let script = format!(
        "d=$(map demo {} \"{}\") || exit 1\n\
         echo \"mapped /dev/$d: $(dev_bytes $d) bytes; paths: $(path_states demo | tr '\\n' ' ')\"\n\
         t0=$(uptime_s)\n\
         verify $d 4k 4M\n\
         echo \"wrote and verified 4 MiB of 4 KiB random writes (fio crc32c) in $(echo \"$(uptime_s) $t0\" | awk '{{print $1-$2}}') s guest time\"\n\
         unmap $d\n\
         echo \"unmapped /dev/$d\"\n",
        volume.device_path,
        bed.all_paths()
    );
    let output = bed.initiator.run(&script, Duration::from_secs(600))?;
    print!("{output}");
    println!(
        "\nThe stock Linux rnbd_client mapped {} from Brick's hosted target over software RoCE.",
        volume.device_path
    );
    Ok(())
}

/// Boots the Linux pair and runs one command in the initiator.
pub fn run_command(command: &str, mtu: u32) -> Result<()> {
    let images = Images::build()?;
    let config = BedConfig {
        mtu,
        ..BedConfig::new(TargetKind::LinuxReference)
    };
    let mut bed = Bed::start(&images, &config)?;
    let output = bed.initiator.sh(command, Duration::from_secs(3600))?;
    print!("{}", output.text);
    println!("(exit status {})", output.status);
    Ok(())
}
