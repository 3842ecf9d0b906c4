//! `cargo xtask demo` and `cargo xtask vm run`.
//!
//! The demo builds the bare-metal image (`brick-image`, installing the
//! `x86_64-unknown-none` target if needed) and the `brick` CLI, boots the
//! image under QEMU (TCG) the way the judge does ([`crate::image::qemu_command`]:
//! the manifest as fw_cfg `opt/brick/manifest`, one virtio-net NIC on the
//! target side of a frame relay) with [`IMAGE_MANIFEST`] (a 64 MiB RAM
//! volume `vol0` at 10.77.0.1), waits for the image's "serving after"
//! line, then maps `vol0` with Brick's initiator on the relay's other side
//! (`--link frame:connect:SOCKET --local 10.77.0.2/24`), writes and
//! verifies 16 MiB, runs a 5-second 4 KiB random-read benchmark at queue
//! depth 32, and prints the results, the commands and the image's console
//! since it started serving. No Linux VM and no kernel module.
//!
//! `cargo xtask demo --hosted` runs the hosted Brick target
//! (`brick-target`) instead, with `examples/loopback.toml` (a 64 MiB RAM
//! volume at 127.0.0.1) on a UDP loopback link, the initiator on
//! 127.0.0.2, and a 10-second benchmark: no QEMU at all, it runs anywhere
//! Rust does.
//!
//! `cargo xtask demo --linux` instead serves `examples/two-ram-volumes.toml`
//! from the hosted target to the stock Linux rnbd_client in the initiator
//! VM (QEMU, TCG) over rdma_rxe, writes and verifies `vol0` with fio, and
//! unmaps it.

use crate::relay::Relay;
use crate::target::{Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The built-in demo manifest.
const DEMO_MANIFEST: &str = include_str!("../../examples/loopback.toml");

/// The image demo's manifest: one interface on the relay, one RAM volume,
/// and limits that keep the guest small (the default 512-deep queues
/// would take ~530 MiB of guest RAM per interface).
const IMAGE_MANIFEST: &str = r#"# cargo xtask demo: the image's demo manifest.
[target]
name = "brick-demo-image"

[limits]
max_sessions = 4
queue_depth = 128

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"
mtu = 1500

[[volumes]]
name = "vol0"
kind = "ram"
size = "64MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;
/// The image's address in [`IMAGE_MANIFEST`], and the initiator's.
const IMAGE_TARGET: &str = "10.77.0.1";
const IMAGE_INITIATOR: &str = "10.77.0.2/24";
/// What the image prints once its poll loop runs.
const IMAGE_SERVING: &str = "[brick] serving after";
/// How long the image may take from QEMU's start to serving (TCG).
const IMAGE_BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Arguments of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Run the hosted target (`brick-target`) on UDP loopback instead of
    /// booting the image under QEMU.
    #[arg(long, conflicts_with = "linux")]
    hosted: bool,
    /// Map the volume from the stock Linux rnbd_client in a VM instead
    /// (the hosted target behind the judge's relay).
    #[arg(long)]
    linux: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if args.linux {
        crate::setup::ensure(crate::setup::Purpose::Judge)?;
        run_linux()
    } else if args.hosted {
        run_loopback()
    } else {
        crate::setup::ensure(crate::setup::Purpose::Demo)?;
        run_image()
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
    /// Starts `brick-target` with `manifest` and one `link`, its output in
    /// `log`; waits (10 s at most) until it says it listens.
    pub(crate) fn start(
        binary: &Path,
        manifest: &Path,
        link: &str,
        log: PathBuf,
    ) -> Result<TargetProcess> {
        Self::start_with(binary, manifest, link, &[], log)
    }

    /// [`TargetProcess::start`] with `extra` arguments.
    pub(crate) fn start_with(
        binary: &Path,
        manifest: &Path,
        link: &str,
        extra: &[String],
        log: PathBuf,
    ) -> Result<TargetProcess> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .args(["--manifest", &manifest.display().to_string()])
            .args(["--link", link])
            .args(extra)
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
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(target)
    }

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
    println!("$ {} {}", cli.display(), args.join(" "));
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

/// `brick io ... verify` (16 MiB) then a short `brick bench` (4 KiB random
/// reads at queue depth 32 for `seconds`) on `vol0`, with the connection
/// options `connection`.
fn map_and_measure(cli: &Path, connection: &[String], from: &str, seconds: u32) -> Result<()> {
    let mut common = connection.to_vec();
    common.extend(["--session", "demo", "--volume", "vol0"].map(String::from));
    step(format!(
        "mapping vol0 with Brick's initiator from {from}, writing and verifying 16 MiB"
    ));
    let mut args = vec!["io".to_string()];
    args.extend(common.iter().cloned());
    args.extend(["verify", "--size", "16M", "--bs", "128k"].map(String::from));
    brick(cli, &args)?;
    step(format!(
        "benchmark: 4 KiB random reads, queue depth 32, {seconds} s"
    ));
    let mut args = vec!["bench".to_string()];
    args.extend(common);
    args.extend(
        [
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            &seconds.to_string(),
        ]
        .map(String::from),
    );
    brick(cli, &args)
}

/// The image under QEMU (TCG) serving the demo manifest (vol0, 64 MiB of
/// RAM, at [`IMAGE_TARGET`]), its NIC on `socket`, once it serves.
pub(crate) struct BootedImage {
    /// QEMU, its console in the log.
    pub target: TargetProcess,
    /// The image's "serving after" line.
    pub serving: String,
    /// Guest microseconds from the image's entry to its poll loop.
    pub guest_us: Option<u64>,
    /// Wall seconds from QEMU's start to serving.
    pub wall: f64,
}

/// Boots the image with the demo manifest in `dir`, its interface at
/// `mtu`, its virtio-net NIC on the stream socket `socket` (a relay's
/// target side).
pub(crate) fn boot_image(image: &Path, dir: &Path, socket: &Path, mtu: u32) -> Result<BootedImage> {
    let manifest_path = dir.join("demo-image.toml");
    std::fs::write(
        &manifest_path,
        crate::util::manifest_at_mtu(IMAGE_MANIFEST, mtu),
    )?;
    let (config, blob, blob_path) = crate::image::compile_to_blob(&manifest_path, dir)?;
    let interface = config
        .interfaces
        .first()
        .context("the demo manifest has no interface")?;
    let memory = crate::image::guest_mib(&blob);
    let command = crate::image::qemu_command(
        image,
        &blob_path,
        memory,
        &[],
        &[(socket.to_path_buf(), interface.mac.0)],
    )?;
    step(format!(
        "booting the image under QEMU (TCG, {memory} MiB): vol0 (64 MiB of RAM) at {IMAGE_TARGET}, \
         its virtio-net NIC on the relay's target side"
    ));
    println!("$ {}", command.join(" "));
    let log = dir.join("brick-image.log");
    let file = std::fs::File::create(&log)?;
    let started = Instant::now();
    let child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("could not start qemu-system-x86_64")?;
    let mut target = TargetProcess { child, log };
    let serving = loop {
        let text = target.log();
        if let Some(line) = text.lines().find(|l| l.contains(IMAGE_SERVING)) {
            break line.trim().to_string();
        }
        if let Some(status) = target.child.try_wait()? {
            bail!("QEMU exited ({status}) before the image served:\n{text}");
        }
        if started.elapsed() > IMAGE_BOOT_TIMEOUT {
            bail!(
                "the image did not serve in {} s:\n{text}",
                IMAGE_BOOT_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let guest_us = serving
        .split("serving after ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|us| us.parse::<u64>().ok());
    Ok(BootedImage {
        target,
        serving,
        guest_us,
        wall: started.elapsed().as_secs_f64(),
    })
}

/// The default demo: the image under QEMU behind a relay, Brick's
/// initiator on the relay's other side.
fn run_image() -> Result<()> {
    let image = crate::image::build()?;
    let cli = crate::util::build_release_bins(&[("brick-cli", "brick")])?.remove(0);
    let dir = crate::paths::scratch("demo-image");
    let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 0xde30, None)?;
    let BootedImage {
        mut target,
        serving,
        guest_us,
        wall,
    } = boot_image(&image, &dir, &relay.b, 1500)?;
    println!("{serving}");
    if let Some(us) = guest_us {
        println!(
            "boot to serving: {:.3} s of guest time (image entry to poll loop), \
             {wall:.1} s of wall time from QEMU's start (TCG)",
            us as f64 / 1e6
        );
    }
    let connection: Vec<String> = [
        "--link",
        &format!("frame:connect:{}", relay.a.display()),
        "--local",
        IMAGE_INITIATOR,
        "--target",
        IMAGE_TARGET,
    ]
    .map(String::from)
    .into();
    let from = format!("{IMAGE_INITIATOR} through the relay");
    let outcome = map_and_measure(&cli, &connection, &from, 5);
    let text = target.log();
    step("the image's console since it started serving");
    for line in text
        .lines()
        .skip_while(|l| !l.contains(IMAGE_SERVING))
        .skip(1)
        .filter(|l| l.starts_with("[brick]"))
    {
        println!("  {line}");
    }
    if let Some(status) = target.child.try_wait()? {
        bail!("QEMU exited ({status}) while serving; console:\n{text}");
    }
    outcome?;
    println!("relay: {}", relay.summary());
    drop(target);
    drop(relay);
    println!(
        "\nBrick's initiator mapped vol0 from the bare-metal Brick image (QEMU, virtio-net) over RoCEv2."
    );
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `cargo xtask demo --hosted`: the hosted target on UDP loopback.
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
    let target = TargetProcess::start(
        &target_binary,
        &manifest,
        &format!("udp:127.0.0.1:{port}"),
        log,
    )?;
    let connection: Vec<String> = [
        "--link",
        &format!("udp:127.0.0.2:{port}"),
        "--target",
        "127.0.0.1",
    ]
    .map(String::from)
    .into();
    map_and_measure(&cli, &connection, "127.0.0.2", 10)?;
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
    crate::setup::ensure(crate::setup::Purpose::Judge)?;
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
