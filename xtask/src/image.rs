//! `cargo xtask image` and `cargo xtask run-image`: the bare-metal image.
//!
//! `image` builds `brick-image` (target-image's `image` feature) for
//! `x86_64-unknown-none` in release, installing the target with rustup if
//! it is missing. The non-PIE link at 1 MiB comes from the workspace's
//! `.cargo/config.toml` (`[target.x86_64-unknown-none] rustflags`) and
//! `linker/brick-image.ld` (target-image's build.rs); the result is checked
//! to be a fixed-address executable.
//!
//! `run-image` compiles a manifest (TOML) to its binary form, boots the
//! image under QEMU (TCG) with the blob as fw_cfg `opt/brick/manifest`,
//! streams the serial console and exits with the image's verdict: 0 when
//! the boot checks pass (QEMU status 33 from `isa-debug-exit`), else
//! QEMU's status (35 panic, 37 refused manifest, 39 not enough memory) or
//! 124 on timeout. `--blob` passes a binary manifest as is and
//! `--flip-byte N` corrupts one byte, to exercise the refusal path.
//!
//! `--nic SOCKET` (repeatable) gives the guest a virtio-net NIC per
//! manifest interface, in order, connected as a client to the Unix socket
//! with QEMU's stream framing (a relay's side, `cargo xtask relay`), with
//! the interface's MAC; the image then serves. `--serve` drops the timeout:
//! QEMU runs until killed (Ctrl-C).

use crate::paths;
use crate::util;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The image's target triple.
pub const TARGET: &str = "x86_64-unknown-none";

/// `cargo xtask run-image` options.
#[derive(clap::Args)]
pub struct RunImageArgs {
    /// The manifest (TOML) to compile and hand to the image.
    #[arg(long, conflicts_with = "blob")]
    manifest: Option<PathBuf>,
    /// A binary manifest handed to the image as is (no checks).
    #[arg(long)]
    blob: Option<PathBuf>,
    /// Test hook: invert every bit of this byte of the blob before boot.
    #[arg(long)]
    flip_byte: Option<usize>,
    /// Seconds before QEMU is killed.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Guest memory in MiB (default: what the manifest preallocates plus
    /// room for the image, at least 512).
    #[arg(long)]
    memory: Option<u64>,
    /// The image's command line (`idle`: stay in the idle loop, no exit).
    #[arg(long)]
    append: Option<String>,
    /// Boot the last built image instead of building it first.
    #[arg(long)]
    no_build: bool,
    /// A virtio-net NIC connected to this Unix socket (QEMU stream netdev,
    /// client side), one per manifest interface in order; its MAC is the
    /// interface's.
    #[arg(long = "nic", value_name = "SOCKET_PATH")]
    nics: Vec<PathBuf>,
    /// Serve: no timeout, QEMU runs until killed.
    #[arg(long)]
    serve: bool,
    /// A virtio-blk disk backed by this raw file (kept as is), attached at
    /// PCI 00:10.0, 00:11.0, ... in order: a manifest volume names it with
    /// `kind = "virtio-blk"` and `pci = "00:10.0"` ([`disk_pci`]).
    #[arg(long = "disk", value_name = "RAW_FILE")]
    disks: Vec<PathBuf>,
}

/// PCI slot of the first `--disk` (well above the slots QEMU assigns to
/// the NICs on its own).
pub const DISK_SLOT_BASE: u8 = 0x10;

/// The PCI address (manifest syntax) of disk `index`.
pub fn disk_pci(index: usize) -> String {
    format!("00:{:02x}.0", usize::from(DISK_SLOT_BASE) + index)
}

/// `-drive`/`-device` arguments for disk `index` backed by the raw file
/// `path`, a modern virtio-blk function at [`disk_pci`]`(index)`.
fn disk_args(index: usize, path: &Path) -> Result<[String; 4]> {
    let file = path
        .to_str()
        .with_context(|| format!("--disk {}: path is not UTF-8", path.display()))?;
    if index + usize::from(DISK_SLOT_BASE) > 0x1f {
        bail!("at most {} disks", 0x20 - DISK_SLOT_BASE);
    }
    Ok([
        "-drive".into(),
        format!(
            "file={},if=none,id=d{index},format=raw",
            file.replace(',', ",,")
        ),
        "-device".into(),
        format!(
            "virtio-blk-pci,drive=d{index},disable-legacy=on,addr={:02x}.0",
            usize::from(DISK_SLOT_BASE) + index
        ),
    ])
}

/// `-netdev`/`-device` arguments for NIC `index` on `socket` with `mac`.
fn nic_args(index: usize, socket: &Path, mac: [u8; 6]) -> Result<[String; 4]> {
    let path = socket
        .to_str()
        .with_context(|| format!("--nic {}: path is not UTF-8", socket.display()))?;
    let [a, b, c, d, e, f] = mac;
    Ok([
        "-netdev".into(),
        format!(
            "stream,id=n{index},server=off,addr.type=unix,addr.path={}",
            path.replace(',', ",,")
        ),
        "-device".into(),
        format!(
            "virtio-net-pci,netdev=n{index},disable-legacy=on,\
             mac={a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}"
        ),
    ])
}

/// How QEMU's exit status reads (`isa-debug-exit`: `(code << 1) | 1`).
fn verdict(status: i32) -> &'static str {
    match status {
        33 => "boot checks passed",
        35 => "panic or CPU exception in the image",
        37 => "the image refused the manifest",
        39 => "the manifest does not fit in the guest's memory",
        41 => "a manifest interface has no usable virtio-net device",
        43 => "the manifest asks for a volume kind the image does not serve",
        _ => "QEMU failed or was stopped",
    }
}

fn target_installed() -> Result<bool> {
    let installed = util::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("`rustup` is needed to install the image target (https://rustup.rs)")?;
    Ok(installed.lines().any(|line| line.trim() == TARGET))
}

fn ensure_target() -> Result<()> {
    if target_installed()? {
        return Ok(());
    }
    util::step(format!("rustup target add {TARGET}"));
    util::run(Command::new("rustup").args(["target", "add", TARGET])).with_context(|| {
        format!(
            "could not install the Rust target {TARGET} (offline?); \
             install it with `rustup target add {TARGET}` and retry"
        )
    })?;
    Ok(())
}

/// Builds the image and returns its path.
pub fn build() -> Result<PathBuf> {
    ensure_target()?;
    util::step(format!("building brick-image ({TARGET}, release)"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(paths::repo())
        .args([
            "build",
            "--release",
            "--package",
            "brick-target-image",
            "--no-default-features",
            "--features",
            "image",
            "--bin",
            "brick-image",
            "--target",
            TARGET,
        ])
        .status()
        .context("could not start cargo")?;
    if !status.success() {
        bail!("building brick-image failed ({status})");
    }
    let image = target_dir()
        .join(TARGET)
        .join("release")
        .join("brick-image");
    check_elf(&image)?;
    Ok(image)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths::repo().join("target"))
}

/// The image must be a fixed-address 64-bit ELF executable (`ET_EXEC`):
/// QEMU's PVH loader places segments at their physical addresses.
fn check_elf(image: &Path) -> Result<()> {
    let bytes = std::fs::read(image).with_context(|| format!("cannot read {}", image.display()))?;
    if bytes.len() < 18 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        bail!("{} is not a 64-bit ELF", image.display());
    }
    let kind = u16::from_le_bytes([bytes[16], bytes[17]]);
    if kind != 2 {
        bail!(
            "{} is not a fixed-address executable (ELF type {kind}); is RUSTFLAGS \
             overriding `-C relocation-model=static` from .cargo/config.toml?",
            image.display()
        );
    }
    Ok(())
}

/// `cargo xtask image`.
pub fn run_build() -> Result<()> {
    let image = build()?;
    let size = std::fs::metadata(&image)?.len();
    println!(
        "{} ({size} bytes, {} KiB)",
        image.display(),
        size.div_ceil(1024)
    );
    Ok(())
}

/// Bytes of the image's engine stack (target-image `serve::ENGINE_STACK_BYTES`).
const ENGINE_STACK_MIB: u64 = 32;

/// Guest memory (MiB) for a manifest, counted as target-image's
/// `boot::pool::PoolPlan::guest_mib` counts it: the pool (16 MiB of NIC
/// rings plus each virtio-blk volume's rings and bounce slots,
/// 2 MiB-aligned), the 8 MiB boot heap, the engine stack, the heap the
/// engine needs (its registered arenas, one per interface, as
/// `target_image::arena_bytes` sizes them: up to 8 path pools of
/// `queue_depth` chunks, plus the RAM volumes) and 64 MiB for the image,
/// firmware holes and the engine's tables.
///
/// A copy of the formula, not a call: depending on target-image would
/// rebuild xtask with every engine change. `test_guest_mib_example` here
/// and `test_plan_for_example_manifest` in target-image pin the same
/// number; change both together.
pub fn guest_mib(blob: &[u8]) -> u64 {
    const MIB: u64 = 1 << 20;
    let Ok(manifest) = manifest::binary::Manifest::parse(blob) else {
        return 512;
    };
    let limits = manifest.limits();
    // Each virtio-blk volume adds its rings and 32 bounce slots of one
    // chunk to the pool (target-image `virtio_blk_config(..).dma_bytes()`,
    // rounded up here).
    let disks = manifest
        .volumes()
        .filter(|v| v.backing.kind() == manifest::VolumeKind::VirtioBlk)
        .count() as u64;
    let disk_dma = 32 * u64::from(limits.chunk_size).next_multiple_of(4096) + 16 * 1024;
    let pool = (16 * MIB + disks * disk_dma).div_ceil(2 * MIB) * 2 * MIB;
    let per_path =
        u64::from(limits.queue_depth.max(2)) * (u64::from(limits.chunk_size) + 64) + (1 << 16);
    let path_pools =
        (u64::from(limits.max_sessions) * u64::from(limits.max_paths_per_session) * 2).clamp(2, 8);
    let arenas = per_path * path_pools * manifest.interface_count() as u64;
    let total = pool + 8 * MIB + ENGINE_STACK_MIB * MIB + arenas + manifest.ram_volume_bytes();
    (total.div_ceil(MIB) + 64).max(512)
}

/// The QEMU command line (program first) that boots `image` with the
/// binary manifest file `blob`, one virtio-blk disk per raw file of
/// `disks` (at [`disk_pci`]) and one virtio-net NIC per `(socket, MAC)`
/// (client side of a stream netdev), console on stdout.
pub fn qemu_command(
    image: &Path,
    blob: &Path,
    memory_mib: u64,
    disks: &[PathBuf],
    nics: &[(PathBuf, [u8; 6])],
) -> Result<Vec<String>> {
    let blob = blob.to_str().context("manifest path is not UTF-8")?;
    let mut command: Vec<String> = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m"]
        .map(String::from)
        .into();
    command.push(memory_mib.to_string());
    command.push("-kernel".into());
    command.push(image.to_str().context("image path is not UTF-8")?.into());
    command.extend(
        [
            "-nographic",
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-fw_cfg",
        ]
        .map(String::from),
    );
    command.push(format!(
        "name=opt/brick/manifest,file={}",
        blob.replace(',', ",,")
    ));
    // Disks first: their fixed slots are then taken before QEMU picks the
    // NICs' slots.
    for (index, disk) in disks.iter().enumerate() {
        command.extend(disk_args(index, disk)?);
    }
    for (index, (socket, mac)) in nics.iter().enumerate() {
        command.extend(nic_args(index, socket, *mac)?);
    }
    Ok(command)
}

/// The last built image (`cargo xtask image`), checked.
pub fn built_image() -> Result<PathBuf> {
    let image = target_dir()
        .join(TARGET)
        .join("release")
        .join("brick-image");
    check_elf(&image)?;
    Ok(image)
}

/// `cargo xtask run-image`.
pub fn run(args: RunImageArgs) -> Result<()> {
    let image = if args.no_build {
        built_image()?
    } else {
        build()?
    };
    let scratch = paths::scratch("image");
    let mut blob = match (&args.manifest, &args.blob) {
        (Some(path), _) => {
            let config = manifest::compile_file(path).map_err(|e| anyhow::anyhow!("{e}"))?;
            config
                .to_binary()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        (None, Some(path)) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        (None, None) => Vec::new(),
    };
    if let Some(offset) = args.flip_byte {
        let Some(byte) = blob.get_mut(offset) else {
            bail!("--flip-byte {offset}: the blob is {} bytes", blob.len());
        };
        *byte = !*byte;
        util::step(format!("flipped byte {offset} of the blob"));
    }
    let memory = args.memory.unwrap_or_else(|| guest_mib(&blob));

    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-cpu", "max", "-m"])
        .arg(memory.to_string())
        .arg("-kernel")
        .arg(&image)
        .args([
            "-nographic",
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=0x04",
        ]);
    if !blob.is_empty() || args.manifest.is_some() || args.blob.is_some() {
        let path = scratch.join("manifest.bin");
        std::fs::write(&path, &blob)?;
        let path = path.to_str().context("scratch path is not UTF-8")?;
        qemu.arg("-fw_cfg").arg(format!(
            "name=opt/brick/manifest,file={}",
            path.replace(',', ",,")
        ));
    }
    if let Some(append) = &args.append {
        qemu.arg("-append").arg(append);
    }
    for (index, disk) in args.disks.iter().enumerate() {
        if !disk.is_file() {
            bail!(
                "--disk {}: not a file (create it first, e.g. truncate -s 64M)",
                disk.display()
            );
        }
        qemu.args(disk_args(index, disk)?);
    }
    if !args.nics.is_empty() {
        let manifest = manifest::binary::Manifest::parse(&blob)
            .map_err(|e| anyhow::anyhow!("--nic needs a valid manifest: {e}"))?;
        if args.nics.len() > manifest.interface_count() {
            bail!(
                "{} --nic given, the manifest has {} interfaces",
                args.nics.len(),
                manifest.interface_count()
            );
        }
        for (index, (socket, interface)) in args.nics.iter().zip(manifest.interfaces()).enumerate()
        {
            qemu.args(nic_args(index, socket, interface.mac.0)?);
        }
    }
    let timeout = (!args.serve).then(|| Duration::from_secs(args.timeout));
    util::step(format!(
        "booting {} ({memory} MiB, manifest {} bytes, {} disk(s), {} NIC(s), {})",
        image.display(),
        blob.len(),
        args.disks.len(),
        args.nics.len(),
        match timeout {
            Some(timeout) => format!("timeout {} s", timeout.as_secs()),
            None => "serving until killed".into(),
        }
    ));
    let status = boot(&mut qemu, timeout)?;
    let _ = std::fs::remove_dir_all(&scratch);
    match status {
        Some(code) => {
            eprintln!("==> QEMU exited with status {code}: {}", verdict(code));
            std::process::exit(if code == 33 { 0 } else { code });
        }
        None => {
            eprintln!("==> timeout after {} s: QEMU killed", args.timeout);
            std::process::exit(124);
        }
    }
}

/// Runs QEMU, copying its console to stdout; `None` on timeout (`None`:
/// no timeout).
fn boot(qemu: &mut Command, timeout: Option<Duration>) -> Result<Option<i32>> {
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("could not start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    let mut console = child.stdout.take().context("QEMU stdout")?;
    let copier = std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        let mut stdout = std::io::stdout();
        while let Ok(n @ 1..) = console.read(&mut buffer) {
            let _ = stdout.write_all(&buffer[..n]);
            let _ = stdout.flush();
        }
    });
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status.code().unwrap_or(-1));
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = copier.join();
    println!();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same number as target-image's `test_plan_for_example_manifest`
    /// (`PoolPlan::guest_mib` with the 32 MiB engine stack and 64 MiB of
    /// slack): registered memory counted once, ~1.1 GiB (it was 2281 MiB
    /// when the boot pool also reserved every session's chunk pool).
    #[test]
    fn test_guest_mib_example() {
        let path = crate::paths::repo().join("examples/two-ram-volumes.toml");
        let config = manifest::compile_file(&path).unwrap();
        let blob = config.to_binary().unwrap();
        assert_eq!(guest_mib(&blob), 1161);
    }
}
