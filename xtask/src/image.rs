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
//! QEMU runs until killed (Ctrl-C). `--disk FILE` (repeatable) attaches a
//! virtio-blk disk at [`disk_pci`]; `--disk-serial S` (repeatable, by
//! rank) gives it a serial, for volumes with `serial = "..."`.
//!
//! [`suite`] is the `image` suite of `cargo xtask test` (default tier, no
//! Linux VMs): one boot per [`BOOT_CASES`] entry, a clean boot and each
//! refusal with its own QEMU status, and virtio-blk volumes by serial
//! that boot until the image serves. `image-idle` ([`run_idle`]) prints
//! QEMU's CPU use while the image serves with no client.

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
    /// The serial (`VIRTIO_BLK_T_GET_ID`) of the `--disk` of the same
    /// rank, for a volume with `serial = "..."` (at most 20 bytes).
    #[arg(long = "disk-serial", value_name = "SERIAL")]
    disk_serials: Vec<String>,
}

/// PCI slot of the first `--disk` (well above the slots QEMU assigns to
/// the NICs on its own).
pub const DISK_SLOT_BASE: u8 = 0x10;

/// The PCI address (manifest syntax) of disk `index`.
pub fn disk_pci(index: usize) -> String {
    format!("00:{:02x}.0", usize::from(DISK_SLOT_BASE) + index)
}

/// A virtio-blk disk for the guest: a raw file and, optionally, the
/// serial the device answers `VIRTIO_BLK_T_GET_ID` with.
#[derive(Clone, Debug)]
pub struct Disk {
    /// The raw file backing it.
    pub path: PathBuf,
    /// QEMU's `serial=` (a manifest volume with `serial = "..."` finds it).
    pub serial: Option<String>,
}

/// `-drive`/`-device` arguments for disk `index` backed by the raw file
/// `path`, a modern virtio-blk function at [`disk_pci`]`(index)`, with
/// `serial` as its device ID if given.
fn disk_args(index: usize, path: &Path, serial: Option<&str>) -> Result<[String; 4]> {
    let file = path
        .to_str()
        .with_context(|| format!("--disk {}: path is not UTF-8", path.display()))?;
    if index + usize::from(DISK_SLOT_BASE) > 0x1f {
        bail!("at most {} disks", 0x20 - DISK_SLOT_BASE);
    }
    let serial = match serial {
        // QEMU's own limit is the virtio ID's 20 bytes; a comma would end
        // the option.
        Some(serial) if serial.is_empty() || serial.len() > 20 || serial.contains(',') => {
            bail!("disk serial {serial:?}: 1 to 20 bytes, no comma")
        }
        Some(serial) => format!(",serial={serial}"),
        None => String::new(),
    };
    Ok([
        "-drive".into(),
        format!(
            "file={},if=none,id=d{index},format=raw",
            file.replace(',', ",,")
        ),
        "-device".into(),
        format!(
            "virtio-blk-pci,drive=d{index},disable-legacy=on,addr={:02x}.0{serial}",
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

/// `-netdev`/`-device` arguments for NIC `index` on QEMU user networking
/// (`restrict=on`: the guest reaches nothing outside) over `net`, with
/// `mac`, forwarding each `(host port, guest address:port)` of `forwards`
/// from 127.0.0.1 (connections arrive from the network's gateway, `.2`).
pub fn user_nic_args(
    index: usize,
    mac: [u8; 6],
    net: &str,
    forwards: &[(u16, &str)],
) -> [String; 4] {
    let [a, b, c, d, e, f] = mac;
    let forwards: String = forwards
        .iter()
        .map(|(port, guest)| format!(",hostfwd=tcp:127.0.0.1:{port}-{guest}"))
        .collect();
    [
        "-netdev".into(),
        format!("user,id=n{index},net={net},restrict=on{forwards}"),
        "-device".into(),
        format!(
            "virtio-net-pci,netdev=n{index},disable-legacy=on,\
             mac={a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}"
        ),
    ]
}

/// How QEMU's exit status reads (`isa-debug-exit`: `(code << 1) | 1`).
fn verdict(status: i32) -> &'static str {
    match status {
        33 => "boot checks passed",
        35 => "panic or CPU exception in the image (or the UEFI loader failed)",
        37 => "the image refused the manifest",
        39 => "the manifest does not fit in the guest's memory",
        41 => "a manifest interface has no usable virtio-net device",
        43 => "the manifest asks for a volume kind the image does not serve",
        45 => "the boot disk has no manifest in either slot",
        47 => "both manifest slots of the boot disk are corrupt",
        49 => "the manifest is newer than the image understands",
        _ => "QEMU failed or was stopped",
    }
}

fn target_installed() -> Result<bool> {
    let installed = util::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("`rustup` is needed to install the image target (https://rustup.rs)")?;
    Ok(installed.lines().any(|line| line.trim() == TARGET))
}

pub fn ensure_target() -> Result<()> {
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
    paths::target_dir()
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

/// `cargo xtask image` options.
#[derive(clap::Args)]
pub struct ImageArgs {
    /// Also build the UEFI loader (x86_64-unknown-uefi) and the `brick`
    /// CLI, for `brick image build`.
    #[arg(long)]
    uefi: bool,
}

/// `cargo xtask image`.
pub fn run_build(args: ImageArgs) -> Result<()> {
    if args.uefi {
        let parts = crate::uefi::build()?;
        for path in [&parts.kernel, &parts.loader, &parts.cli] {
            let size = std::fs::metadata(path)?.len();
            println!("{} ({size} bytes)", path.display());
        }
        println!(
            "write a boot disk with: {} image build --manifest node.toml -o node.img",
            parts.cli.display()
        );
        return Ok(());
    }
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

/// Compiles the TOML manifest at `path` and writes its binary form to
/// `dir/manifest.bin`: the config, the blob and the blob's path (what
/// QEMU's `-fw_cfg` takes).
pub fn compile_to_blob(
    path: &Path,
    dir: &Path,
) -> Result<(manifest::config::Config, Vec<u8>, PathBuf)> {
    let config = manifest::compile_file(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let blob = config
        .to_binary()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let blob_path = dir.join("manifest.bin");
    std::fs::write(&blob_path, &blob).with_context(|| format!("write {}", blob_path.display()))?;
    Ok((config, blob, blob_path))
}

/// Guest memory (MiB) for a manifest, counted as target-image's
/// `boot::pool::PoolPlan::guest_mib` counts it: the pool (16 MiB of NIC
/// rings plus each virtio-blk volume's rings and bounce slots,
/// 2 MiB-aligned), the 8 MiB boot heap, the engine stack, the heap the
/// engine needs (its registered arenas and tables, one set per interface,
/// as `manifest::Capacity::memory` counts them for every path the limits
/// admit, plus the RAM volumes) and 64 MiB for the image and firmware
/// holes.
///
/// The pool part is a copy of target-image's formula, not a call:
/// depending on target-image would rebuild xtask with every engine change. `test_guest_mib_example` here
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
    // Thin pools on a disk take a disk's DMA like a disk volume.
    let count = |kind| {
        (manifest
            .volumes()
            .filter(|v| v.backing.kind() == kind)
            .count()
            + manifest
                .pools()
                .filter(|p| p.backing.kind() == kind)
                .count()) as u64
    };
    let disks = count(manifest::VolumeKind::VirtioBlk);
    let disk_dma = 32 * u64::from(limits.chunk_size).next_multiple_of(4096) + 16 * 1024;
    // Each NVMe volume: the same 32 bounce slots, a PRP list page per
    // slot, its queues and its controller's admin queues (target-image
    // `nvme_queue_config(..).dma_bytes()` + `NVME_CONTROLLER_BYTES`).
    let namespaces = count(manifest::VolumeKind::Nvme);
    let namespace_dma =
        32 * u64::from(limits.chunk_size).next_multiple_of(4096) + 32 * 4096 + 6 * 4096 + 32 * 1024;
    let pool =
        (16 * MIB + disks * disk_dma + namespaces * namespace_dma).div_ceil(2 * MIB) * 2 * MIB;
    let engine = manifest::Capacity::of(&manifest).memory().total();
    let total = pool + 8 * MIB + ENGINE_STACK_MIB * MIB + engine + manifest.ram_volume_bytes();
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
    let disks: Vec<Disk> = disks
        .iter()
        .map(|path| Disk {
            path: path.clone(),
            serial: None,
        })
        .collect();
    qemu_command_with_disks(image, blob, memory_mib, &disks, nics)
}

/// [`qemu_command`] with disks that may have serials.
pub fn qemu_command_with_disks(
    image: &Path,
    blob: &Path,
    memory_mib: u64,
    disks: &[Disk],
    nics: &[(PathBuf, [u8; 6])],
) -> Result<Vec<String>> {
    let blob = blob.to_str().context("manifest path is not UTF-8")?;
    crate::setup::qemu()?;
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
        command.extend(disk_args(index, &disk.path, disk.serial.as_deref())?);
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

    crate::setup::qemu()?;
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
    if args.disk_serials.len() > args.disks.len() {
        bail!(
            "{} --disk-serial for {} --disk",
            args.disk_serials.len(),
            args.disks.len()
        );
    }
    for (index, disk) in args.disks.iter().enumerate() {
        if !disk.is_file() {
            bail!(
                "--disk {}: not a file (create it first, e.g. truncate -s 64M)",
                disk.display()
            );
        }
        let serial = args.disk_serials.get(index).map(String::as_str);
        qemu.args(disk_args(index, disk, serial)?);
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
        .context("could not start qemu-system-x86_64")?;
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

/// One boot of the `image` suite: a manifest, how it is spoiled, and the
/// QEMU status and console line the image must answer with.
struct BootCase {
    name: &'static str,
    /// Manifest source (TOML).
    manifest: &'static str,
    /// Invert this byte of the blob.
    flip_byte: Option<usize>,
    /// Guest memory in MiB (default: [`guest_mib`]).
    memory: Option<u64>,
    /// NICs to attach (each to its own listening socket): with one, the
    /// image goes on to serve.
    nics: usize,
    /// virtio-blk disks to attach (1 MiB sparse files at [`disk_pci`]`(i)`),
    /// each with this serial if given.
    disks: &'static [Option<&'static str>],
    /// The QEMU exit status expected; `None`: the image serves (QEMU is
    /// killed once it says "serving after").
    status: Option<i32>,
    /// A line of the console that must appear.
    expect: &'static str,
}

/// The `[limits]` of every manifest the judge boots the image with (the
/// boot checks, the UEFI cases, the image beds without limits of their
/// own): 4 sessions at queue depth 128 and 9 connections per path (the
/// judge's 2-CPU Linux clients open 3; 9 serve a client of up to 8 CPUs),
/// which the boot checks' 512 MiB guest holds beside the half-open
/// budget. The default limits (16 sessions of 4 paths at queue depth 512,
/// 65 connections each) need more than 4 GiB: `brick manifest check` says
/// how much. A macro, so that `concat!` takes it.
macro_rules! image_limits {
    () => {
        "\n[limits]\nmax_sessions = 4\nqueue_depth = 128\nmax_connections_per_path = 9\n"
    };
}
pub(crate) use image_limits;

/// A boot-check manifest: target `brick-image-check`, limits the check's
/// guest can hold (4 sessions at queue depth 128, 9 connections per path),
/// interface `eth0` (10.77.0.1/24), then `$body` (more interfaces, the
/// volumes), then an access rule letting every session open every volume
/// read-write. With `vol0,` first, a 16 MiB RAM volume `vol0` comes before
/// `$body`.
macro_rules! check_manifest {
    (vol0, $body:literal) => {
        check_manifest!(concat!(
            "\n[[volumes]]\nname = \"vol0\"\nkind = \"ram\"\nsize = \"16MiB\"\n",
            $body
        ))
    };
    ($body:expr) => {
        concat!(
            "\n[target]\nname = \"brick-image-check\"\n",
            image_limits!(),
            "\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n",
            $body,
            "\n[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
        )
    };
}

/// One interface, one 16 MiB RAM volume: the smallest manifest that serves.
const SMALL: &str = check_manifest!(vol0, r#""#);

/// [`SMALL`] plus a file-backed volume, which only the hosted target serves.
const FILE_VOLUME: &str = check_manifest!(
    vol0,
    r#"
[[volumes]]
name = "file0"
kind = "file"
path = "/var/lib/brick/file0.img"
size = "64MiB"
"#
);

/// [`SMALL`] plus a virtio-blk volume at a PCI slot with no disk.
const MISSING_DISK: &str = check_manifest!(
    vol0,
    r#"
[[volumes]]
name = "disk0"
kind = "virtio-blk"
pci = "00:10.0"
"#
);

/// [`SMALL`] plus a virtio-blk volume by serial ("brick-b"): the suite
/// attaches two disks, the second with that serial.
const SERIAL_DISK: &str = check_manifest!(
    vol0,
    r#"
[[volumes]]
name = "disk1"
kind = "virtio-blk"
serial = "brick-b"
"#
);

/// [`SERIAL_DISK`] plus a volume by PCI address on the first disk
/// (00:10.0), whose serial may be the other volume's.
const PCI_AND_SERIAL_DISKS: &str = check_manifest!(
    r#"
[[volumes]]
name = "disk0"
kind = "virtio-blk"
pci = "00:10.0"

[[volumes]]
name = "disk1"
kind = "virtio-blk"
serial = "brick-b"
"#
);

/// Two interfaces; the suite attaches one NIC.
const TWO_INTERFACES: &str = check_manifest!(
    vol0,
    r#"
[[interfaces]]
name = "eth1"
mac = "52:54:00:78:00:01"
address = "10.78.0.1/24"
"#
);

/// A manifest whose RAM volumes (512 MiB) cannot fit in 256 MiB of guest,
/// with the judge's image limits ([`image_limits`]).
const TWO_RAM_VOLUMES: &str = concat!(
    include_str!("../../examples/two-ram-volumes.toml"),
    image_limits!()
);

/// The cases of the `image` suite (default tier): a clean boot, each
/// refusal with its own QEMU status, and boots that serve (the log shows
/// which disk each virtio-blk volume got). All boot the image under TCG
/// in about a second.
const BOOT_CASES: &[BootCase] = &[
    BootCase {
        name: "boot_checks",
        manifest: TWO_RAM_VOLUMES,
        flip_byte: None,
        memory: None,
        nics: 0,
        disks: &[],
        status: Some(33),
        expect: "boot checks passed",
    },
    BootCase {
        name: "bad_checksum",
        manifest: SMALL,
        // A byte of the contents, past the 32-byte header.
        flip_byte: Some(40),
        memory: None,
        nics: 0,
        disks: &[],
        status: Some(37),
        expect: "checksum mismatch",
    },
    BootCase {
        name: "bad_magic",
        manifest: SMALL,
        flip_byte: Some(0),
        memory: None,
        nics: 0,
        disks: &[],
        status: Some(37),
        expect: "magic",
    },
    BootCase {
        name: "ram_too_large",
        manifest: TWO_RAM_VOLUMES,
        flip_byte: None,
        memory: Some(256),
        nics: 0,
        disks: &[],
        status: Some(39),
        expect: "give the guest more memory",
    },
    BootCase {
        name: "file_volume_refused",
        manifest: FILE_VOLUME,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[],
        status: Some(43),
        expect: "the image cannot serve",
    },
    BootCase {
        name: "virtio_blk_missing_disk",
        manifest: MISSING_DISK,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[],
        // The engine refuses it when it opens the volume (not the kind
        // check before it): a refused manifest.
        status: Some(37),
        expect: "no virtio-blk device",
    },
    BootCase {
        name: "virtio_blk_by_serial",
        manifest: SERIAL_DISK,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[Some("brick-a"), Some("brick-b")],
        status: None,
        expect: "disk: volume disk1 on pci 00:11.0 (by serial; serial \"brick-b\")",
    },
    BootCase {
        name: "virtio_blk_by_pci_and_serial",
        manifest: PCI_AND_SERIAL_DISKS,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[None, Some("brick-b")],
        status: None,
        expect: "disk: volume disk0 on pci 00:10.0 (by PCI address; no serial)",
    },
    BootCase {
        name: "virtio_blk_unknown_serial",
        manifest: SERIAL_DISK,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[Some("brick-a"), None],
        status: Some(37),
        expect: "no virtio-blk device has serial \"brick-b\"",
    },
    BootCase {
        name: "virtio_blk_serial_on_two_disks",
        manifest: SERIAL_DISK,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[Some("brick-b"), Some("brick-b")],
        status: Some(37),
        expect: "serial \"brick-b\" is on more than one virtio-blk device",
    },
    BootCase {
        name: "virtio_blk_disk_selected_twice",
        manifest: PCI_AND_SERIAL_DISKS,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[Some("brick-b")],
        status: Some(37),
        expect: "pci 00:10.0 is also volume disk0's",
    },
    BootCase {
        name: "interface_without_nic",
        manifest: TWO_INTERFACES,
        flip_byte: None,
        memory: None,
        nics: 1,
        disks: &[],
        status: Some(41),
        expect: "no usable virtio-net device",
    },
];

/// How long one boot case may take before QEMU is killed.
const BOOT_CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// The `image` suite of `cargo xtask test` (no Linux VMs): builds the
/// image, then boots it once per [`BOOT_CASES`] entry, printing one line
/// per case (`image boot_checks ... ok (0.6 s)`).
pub fn suite(filter: Option<&str>, failures: &mut Vec<String>) -> crate::suite::Counts {
    // The disk boots under UEFI (OVMF, q35, NVMe) first: the loader, the
    // slots and the bad media (`uefi::suite`).
    let mut counts = crate::uefi::suite(filter, failures);
    crate::image_thin::suite(filter, failures, &mut counts);
    crate::image_admin::suite(filter, failures, &mut counts);
    let selected =
        |case: &BootCase| filter.is_none_or(|f| format!("image {}", case.name).contains(f));
    if !BOOT_CASES.iter().any(selected) {
        return counts;
    }
    let image = match build() {
        Ok(image) => image,
        Err(error) => {
            println!("image build ... FAILED");
            failures.push(format!("image build: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    for case in BOOT_CASES {
        if !selected(case) {
            continue;
        }
        let full_name = format!("image {}", case.name);
        let start = Instant::now();
        let result = run_boot_case(&image, case);
        let took = start.elapsed().as_secs_f64();
        match result {
            Ok(note) => {
                println!("{full_name} ... ok ({took:.1} s){note}");
                counts.passed += 1;
            }
            Err(error) => {
                println!("{full_name} ... FAILED ({took:.1} s)\n{error:#}");
                failures.push(full_name);
                counts.failed += 1;
            }
        }
    }
    counts
}

/// Boots one case; `Ok` carries a note for the result line (the boot time).
fn run_boot_case(image: &Path, case: &BootCase) -> Result<String> {
    let scratch = paths::scratch("image-check");
    let result = (|| {
        let config = manifest::compile(case.manifest, case.name)
            .map_err(|e| anyhow::anyhow!("{}: {e}", case.name))?;
        let mut blob = config.to_binary().map_err(|e| anyhow::anyhow!("{e}"))?;
        let memory = case.memory.unwrap_or_else(|| guest_mib(&blob));
        if let Some(offset) = case.flip_byte {
            let len = blob.len();
            let byte = blob
                .get_mut(offset)
                .with_context(|| format!("the blob is {len} bytes"))?;
            *byte = !*byte;
        }
        let blob_path = scratch.join("manifest.bin");
        std::fs::write(&blob_path, &blob)?;
        let parsed = manifest::binary::Manifest::parse(&blob).ok();
        // Each NIC's socket: listened on here, never read (the image
        // refuses or checks before it sends anything that matters).
        let mut listeners = Vec::new();
        let mut nics = Vec::new();
        for index in 0..case.nics {
            let socket = scratch.join(format!("nic{index}.sock"));
            listeners.push(std::os::unix::net::UnixListener::bind(&socket)?);
            let mac = parsed
                .as_ref()
                .and_then(|m| m.interfaces().nth(index))
                .map(|i| i.mac.0)
                .context("a NIC needs a valid manifest interface")?;
            nics.push((socket, mac));
        }
        let mut disks = Vec::new();
        for (index, serial) in case.disks.iter().enumerate() {
            let path = scratch.join(format!("disk{index}.img"));
            std::fs::File::create(&path)?.set_len(1 << 20)?;
            disks.push(Disk {
                path,
                serial: serial.map(String::from),
            });
        }
        let command = qemu_command_with_disks(image, &blob_path, memory, &disks, &nics)?;
        let stop_at = case.status.is_none().then_some(SERVING);
        let (status, console) = boot_captured(&command, BOOT_CASE_TIMEOUT, stop_at)?;
        drop(listeners);
        let status = match (status, case.status) {
            (Some(status), _) => status,
            (None, None) if console.contains(SERVING) => SERVED,
            (None, _) => bail!(
                "timeout after {} s: QEMU killed\n{console}",
                BOOT_CASE_TIMEOUT.as_secs()
            ),
        };
        let expected = case.status.unwrap_or(SERVED);
        if status != expected || !console.contains(case.expect) {
            bail!(
                "expected {} and {:?} on the console; got {}\n{console}",
                Outcome(expected),
                case.expect,
                Outcome(status)
            );
        }
        let boot = console
            .lines()
            .find_map(|line| line.strip_prefix("[brick] boot: "))
            .and_then(|rest| rest.split(" us in the image").next())
            .map(|us| format!(", boot {us} us"));
        let Some(boot) = boot.or_else(|| (status != 33).then(String::new)) else {
            bail!("no boot time (\"[brick] boot: ...\") on the console\n{console}");
        };
        Ok(format!("{boot}, {}, {:?}", Outcome(status), case.expect))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// What the image says once it serves (the boot cases that serve stop
/// there).
const SERVING: &str = "[brick] serving after";

/// The outcome of a boot case that served (not a QEMU status).
const SERVED: i32 = i32::MIN;

/// A boot case's outcome for messages: a QEMU status, or [`SERVED`].
struct Outcome(i32);

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            SERVED => f.write_str("serving (QEMU killed once it served)"),
            status => write!(f, "status {status} ({})", verdict(status)),
        }
    }
}

/// Runs the QEMU `command` (program first) to its end or `timeout`,
/// capturing the console; `None` as the status on timeout, or as soon as
/// the console shows `stop_at` (QEMU is killed then).
pub fn boot_captured(
    command: &[String],
    timeout: Duration,
    stop_at: Option<&str>,
) -> Result<(Option<i32>, String)> {
    let (program, args) = command.split_first().context("empty QEMU command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not start qemu-system-x86_64")?;
    let mut stdout = child.stdout.take().context("QEMU stdout")?;
    let mut stderr = child.stderr.take().context("QEMU stderr")?;
    let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = std::thread::spawn({
        let captured = captured.clone();
        move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buffer) {
                if let Ok(mut text) = captured.lock() {
                    text.extend_from_slice(&buffer[..n]);
                }
            }
        }
    });
    let reached = |marker: &str| {
        captured.lock().is_ok_and(|text| {
            text.windows(marker.len())
                .any(|window| window == marker.as_bytes())
        })
    };
    let err = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        text
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status.code().unwrap_or(-1));
        }
        if Instant::now() >= deadline || stop_at.is_some_and(reached) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = out.join();
    let text = captured.lock().map(|text| text.clone()).unwrap_or_default();
    let mut console = String::from_utf8_lossy(&text).into_owned();
    let errors = err.join().unwrap_or_default();
    if !errors.is_empty() {
        console += "--- QEMU stderr ---\n";
        console += &String::from_utf8_lossy(&errors);
    }
    Ok((status, console))
}

/// `cargo xtask image-idle` options.
#[derive(clap::Args)]
pub struct ImageIdleArgs {
    /// Seconds to measure over, once the image serves.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Measure the last built image instead of building it first.
    #[arg(long)]
    no_build: bool,
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on
/// x86_64 Linux).
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) of process `pid` so far, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from field 3
    // (state) on: utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .context("unexpected /proc/<pid>/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| -> Result<f64> {
        let field = fields.get(index).context("short /proc/<pid>/stat")?;
        Ok(field.parse::<u64>()? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / USER_HZ)
}

/// `cargo xtask image-idle`: boots the image serving [`SMALL`] with one
/// NIC on a socket no client ever uses, waits until it serves, then
/// measures QEMU's CPU time (utime + stime) over `--seconds` and prints
/// it as a percentage of one core. TCG runs the guest on the QEMU
/// process, so this is the idle loop's cost (halt vs. spin) plus QEMU's
/// own timers.
pub fn run_idle(args: ImageIdleArgs) -> Result<()> {
    let image = if args.no_build {
        built_image()?
    } else {
        build()?
    };
    let scratch = paths::scratch("image-idle");
    let config = manifest::compile(SMALL, "image-idle").map_err(|e| anyhow::anyhow!("{e}"))?;
    let blob = config.to_binary().map_err(|e| anyhow::anyhow!("{e}"))?;
    let blob_path = scratch.join("manifest.bin");
    std::fs::write(&blob_path, &blob)?;
    let socket = scratch.join("nic0.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    let mac = manifest::binary::Manifest::parse(&blob)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .interfaces()
        .next()
        .context("the idle manifest has an interface")?
        .mac
        .0;
    let command = qemu_command(&image, &blob_path, guest_mib(&blob), &[], &[(socket, mac)])?;
    let console_path = scratch.join("console");
    let (program, rest) = command.split_first().context("empty QEMU command")?;
    let mut child = Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&console_path)?)
        .stderr(Stdio::inherit())
        .spawn()
        .context("could not start qemu-system-x86_64")?;
    let result = (|| {
        // Hold QEMU's connection open, sending nothing.
        listener.set_nonblocking(true)?;
        let mut connection = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if connection.is_none() {
                connection = listener.accept().ok();
            }
            let console = std::fs::read_to_string(&console_path).unwrap_or_default();
            if let Some(line) = console.lines().find(|l| l.contains("serving after")) {
                util::step(format!("image serves: {line}"));
                break;
            }
            if let Some(status) = child.try_wait()? {
                bail!("QEMU exited ({status}) before serving:\n{console}");
            }
            if Instant::now() >= deadline {
                bail!("the image did not serve within 60 s:\n{console}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Let the boot's last work settle before measuring.
        std::thread::sleep(Duration::from_secs(1));
        util::step(format!(
            "measuring QEMU's CPU time over {} idle seconds",
            args.seconds
        ));
        let before = cpu_seconds(child.id())?;
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs(args.seconds));
        let used = cpu_seconds(child.id())? - before;
        let wall = start.elapsed().as_secs_f64();
        if let Some(status) = child.try_wait()? {
            bail!("QEMU exited ({status}) while idle");
        }
        drop(connection);
        println!(
            "idle image (serving, 1 NIC, no client): QEMU used {used:.2} s of CPU in {wall:.1} s \
             = {:.1}% of one core",
            100.0 * used / wall
        );
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same number as target-image's `test_plan_for_example_manifest`
    /// (`PoolPlan::guest_mib` with the 32 MiB engine stack and 64 MiB of
    /// slack): registered memory counted once, ~1.1 GiB (it was 2281 MiB
    /// when the boot pool also reserved every session's chunk pool).
    /// Every boot-check manifest compiles (the refusals are the image's,
    /// not the compiler's) and keeps the shared header and access rule.
    #[test]
    fn test_check_manifests_compile() {
        for (name, text) in [
            ("SMALL", SMALL),
            ("FILE_VOLUME", FILE_VOLUME),
            ("MISSING_DISK", MISSING_DISK),
            ("SERIAL_DISK", SERIAL_DISK),
            ("PCI_AND_SERIAL_DISKS", PCI_AND_SERIAL_DISKS),
            ("TWO_INTERFACES", TWO_INTERFACES),
        ] {
            if name == "TWO_INTERFACES" {
                assert_eq!(manifest::compile(text, name).unwrap().interfaces.len(), 2);
            }
            let config = manifest::compile(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(config.interfaces[0].name, "eth0", "{name}");
            if name != "PCI_AND_SERIAL_DISKS" {
                assert_eq!(config.volumes[0].name, "vol0", "{name}");
            }
            assert!(text.ends_with("mode = \"rw\"\n"), "{name}");
        }
    }

    #[test]
    fn test_guest_mib_example() {
        let path = crate::paths::repo().join("examples/two-ram-volumes.toml");
        let config = manifest::compile_file(&path).unwrap();
        let blob = config.to_binary().unwrap();
        assert_eq!(guest_mib(&blob), 6607);
    }
}
