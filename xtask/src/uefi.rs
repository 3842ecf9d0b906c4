//! The image on a storage node's terms: UEFI (OVMF), q35, NVMe, a disk.
//!
//! [`build`] builds what a boot disk holds: the image (`brick-image`,
//! x86_64-unknown-none), the UEFI loader (`brick-loader.efi`,
//! x86_64-unknown-uefi) and the `brick` CLI that writes the disk
//! ([`disk`]: `brick image build`). [`qemu_command`] boots such a disk the
//! way the judge does: `-machine q35`, Debian's OVMF as pflash (a private
//! copy of the variable store), the disk on the ICH9 AHCI port, NVMe
//! controllers with namespaces, virtio-net NICs without option ROMs, and
//! `isa-debug-exit` for the verdict.
//!
//! [`suite`] is the UEFI part of the `image` suite: a clean boot serving
//! NVMe, a reflash that changes what the next boot serves, a flipped byte
//! in the newer slot that boots the older one, and the bad media (no
//! manifest, both slots corrupt, a manifest newer than the image, an NVMe
//! serial that names no controller), each with its own console line and
//! QEMU status. The slot patches work on the raw disk image: the slot
//! files of a fresh FAT are contiguous, so a slot is found by its header
//! ([`find_slots`]).

use crate::paths;
use crate::util;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The loader's target triple.
pub const TARGET: &str = "x86_64-unknown-uefi";
/// Debian's OVMF (package `ovmf`): code and the variable store template.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE.fd";
/// The variable store each boot gets a private copy of.
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS.fd";

/// Installs the UEFI target with rustup if it is missing.
pub fn ensure_target() -> Result<()> {
    let installed = util::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("`rustup` is needed to install the loader target (https://rustup.rs)")?;
    if installed.lines().any(|line| line.trim() == TARGET) {
        return Ok(());
    }
    util::step(format!("rustup target add {TARGET}"));
    util::run(Command::new("rustup").args(["target", "add", TARGET])).with_context(|| {
        format!("could not install the Rust target {TARGET}; install it with `rustup target add {TARGET}`")
    })
}

/// What a boot disk is made of.
#[derive(Clone, Debug)]
pub struct Parts {
    /// `brick-image`.
    pub kernel: PathBuf,
    /// `brick-loader.efi`.
    pub loader: PathBuf,
    /// The `brick` CLI.
    pub cli: PathBuf,
}

/// Builds the image, the loader and the CLI.
pub fn build() -> Result<Parts> {
    let kernel = crate::image::build()?;
    ensure_target()?;
    util::step(format!("building brick-loader ({TARGET}, release)"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    util::run(Command::new(cargo).current_dir(paths::repo()).args([
        "build",
        "--release",
        "-p",
        "brick-loader",
        "--bin",
        "brick-loader",
        "--target",
        TARGET,
    ]))?;
    let loader = paths::target_dir().join(format!("{TARGET}/release/brick-loader.efi"));
    let cli = util::build_release_bins(&[("brick-cli", "brick")])?.remove(0);
    Ok(Parts {
        kernel,
        loader,
        cli,
    })
}

/// Writes a boot disk `out` for the TOML manifest `manifest` with
/// `brick image build` (slot A, sequence 1).
pub fn disk(parts: &Parts, manifest: &Path, out: &Path, cmdline: Option<&str>) -> Result<()> {
    let mut command = Command::new(&parts.cli);
    command
        .args(["image", "build", "--manifest"])
        .arg(manifest)
        .arg("-o")
        .arg(out)
        .arg("--loader")
        .arg(&parts.loader)
        .arg("--kernel")
        .arg(&parts.kernel);
    if let Some(words) = cmdline {
        command.args(["--cmdline", words]);
    }
    let output = command.output().context("run brick image build")?;
    if !output.status.success() {
        bail!(
            "brick image build failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// `brick manifest flash disk manifest`.
pub fn flash(parts: &Parts, disk: &Path, manifest: &Path) -> Result<String> {
    let output = Command::new(&parts.cli)
        .args(["manifest", "flash"])
        .arg(disk)
        .arg(manifest)
        .output()
        .context("run brick manifest flash")?;
    if !output.status.success() {
        bail!(
            "brick manifest flash failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// An NVMe controller for the guest: its serial and one raw file per
/// namespace (namespace ids 1, 2, ...).
#[derive(Clone, Debug)]
pub struct Nvme {
    /// `serial=` (Identify Controller SN).
    pub serial: String,
    /// Backing files of namespaces 1, 2, ...
    pub namespaces: Vec<PathBuf>,
}

/// The QEMU command line (program first) that boots `disk` under OVMF on
/// q35, with the variable store `vars` (a private copy), `nvme`
/// controllers and one virtio-net NIC per `(socket, MAC)`.
pub fn qemu_command(
    disk: &Path,
    vars: &Path,
    memory_mib: u64,
    nvme: &[Nvme],
    nics: &[(PathBuf, [u8; 6])],
) -> Result<Vec<String>> {
    crate::setup::qemu()?;
    for firmware in [OVMF_CODE, OVMF_VARS] {
        util::require_path(Path::new(firmware), "ovmf")?;
    }
    if !vars.exists() {
        std::fs::copy(OVMF_VARS, vars).with_context(|| format!("copy {OVMF_VARS}"))?;
    }
    let text = |path: &Path| -> Result<String> {
        Ok(path
            .to_str()
            .with_context(|| format!("{} is not UTF-8", path.display()))?
            .replace(',', ",,"))
    };
    let mut command: Vec<String> = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-machine",
        "q35",
        "-nodefaults",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-m",
    ]
    .map(String::from)
    .into();
    command.push(memory_mib.to_string());
    command.push("-drive".into());
    command.push(format!(
        "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"
    ));
    command.push("-drive".into());
    command.push(format!("if=pflash,format=raw,unit=1,file={}", text(vars)?));
    command.push("-drive".into());
    command.push(format!("file={},format=raw,if=none,id=boot", text(disk)?));
    command.push("-device".into());
    command.push("ide-hd,drive=boot,bus=ide.0,bootindex=0".into());
    for (c, controller) in nvme.iter().enumerate() {
        if controller.serial.contains(',') || controller.serial.len() > 20 {
            bail!(
                "NVMe serial {:?}: at most 20 bytes, no comma",
                controller.serial
            );
        }
        command.push("-device".into());
        command.push(format!("nvme,id=nvme{c},serial={}", controller.serial));
        for (n, file) in controller.namespaces.iter().enumerate() {
            command.push("-drive".into());
            command.push(format!(
                "file={},if=none,id=nvme{c}n{},format=raw",
                text(file)?,
                n + 1
            ));
            command.push("-device".into());
            command.push(format!(
                "nvme-ns,drive=nvme{c}n{},bus=nvme{c},nsid={}",
                n + 1,
                n + 1
            ));
        }
    }
    for (index, (socket, mac)) in nics.iter().enumerate() {
        let [a, b, c, d, e, f] = mac;
        command.push("-netdev".into());
        command.push(format!(
            "stream,id=n{index},server=off,addr.type=unix,addr.path={}",
            text(socket)?
        ));
        command.push("-device".into());
        command.push(format!(
            "virtio-net-pci,netdev=n{index},disable-legacy=on,romfile=,\
             mac={a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}"
        ));
    }
    Ok(command)
}

/// The slot headers in a raw disk image: (byte offset, sequence), for
/// slots whose header and checksum are right or whose magic is there.
pub fn find_slots(image: &[u8]) -> Vec<(usize, Option<u64>)> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + manifest::slot::SLOT_HEADER <= image.len() {
        if image[at..at + 4] == manifest::slot::SLOT_MAGIC {
            let end = (at + manifest::slot::SLOT_BYTES).min(image.len());
            let sequence = manifest::slot::read_slot(&image[at..end])
                .ok()
                .map(|slot| slot.sequence);
            found.push((at, sequence));
        }
        at += 512;
    }
    found
}

/// Applies `patch` to the slot with `sequence` of the disk image `disk`.
fn patch_slot(disk: &Path, sequence: u64, patch: impl FnOnce(&mut [u8])) -> Result<()> {
    let mut image = std::fs::read(disk)?;
    let Some((at, _)) = find_slots(&image)
        .into_iter()
        .find(|(_, s)| *s == Some(sequence))
    else {
        bail!("{}: no slot with sequence {sequence}", disk.display());
    };
    patch(&mut image[at..at + manifest::slot::SLOT_BYTES]);
    std::fs::write(disk, image)?;
    Ok(())
}

/// One UEFI boot case.
struct Case {
    name: &'static str,
    /// Prepares the disk (built from [`CASE_MANIFEST`]) before the boot.
    prepare: fn(&Parts, &Path, &Path) -> Result<()>,
    /// Attach the NVMe controller (serial "brick-nvme0", two namespaces).
    nvme: bool,
    /// The QEMU status expected.
    status: i32,
    /// Console lines that must appear.
    expect: &'static [&'static str],
}

/// The boot cases' manifest: a RAM volume and namespace 2 of the NVMe
/// controller "brick-nvme0"; no NIC is attached, so a clean boot runs the
/// checks and exits 33.
const CASE_MANIFEST: &str = concat!(
    r#"
[target]
name = "uefi-check"

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"
"#,
    crate::image::image_limits!(),
    r#"
[[volumes]]
name = "vol0"
kind = "ram"
size = "16MiB"

[[volumes]]
name = "fast"
kind = "nvme"
serial = "brick-nvme0"
namespace = 2

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#
);

fn nothing(_: &Parts, _: &Path, _: &Path) -> Result<()> {
    Ok(())
}

/// Flashes [`CASE_MANIFEST`] renamed to `name` (slot B, sequence 2).
fn flash_renamed(parts: &Parts, disk: &Path, dir: &Path, name: &str) -> Result<()> {
    let path = dir.join("reflash.toml");
    std::fs::write(&path, CASE_MANIFEST.replace("uefi-check", name))?;
    flash(parts, disk, &path).map(|_| ())
}

fn reflash(parts: &Parts, disk: &Path, dir: &Path) -> Result<()> {
    flash_renamed(parts, disk, dir, "uefi-reflashed")
}

fn reflash_then_flip(parts: &Parts, disk: &Path, dir: &Path) -> Result<()> {
    flash_renamed(parts, disk, dir, "uefi-reflashed")?;
    patch_slot(disk, 2, |slot| {
        slot[manifest::slot::SLOT_HEADER + 40] ^= 0xff
    })
}

fn blank_slot_a(_: &Parts, disk: &Path, _: &Path) -> Result<()> {
    patch_slot(disk, 1, |slot| slot.fill(0))
}

fn corrupt_both(parts: &Parts, disk: &Path, dir: &Path) -> Result<()> {
    reflash(parts, disk, dir)?;
    patch_slot(disk, 1, |slot| slot[manifest::slot::SLOT_HEADER + 8] ^= 1)?;
    patch_slot(disk, 2, |slot| slot[30] ^= 1)
}

/// Slot B (sequence 2) holds a manifest of the format version after this
/// image's, checksums right: what a newer `brick` would write.
fn newer_manifest(parts: &Parts, disk: &Path, dir: &Path) -> Result<()> {
    reflash(parts, disk, dir)?;
    patch_slot(disk, 2, |slot| {
        let Ok(read) = manifest::slot::read_slot(slot) else {
            return;
        };
        let mut blob = read.blob.to_vec();
        blob[4..6].copy_from_slice(&(manifest::binary::FORMAT_VERSION + 1).to_le_bytes());
        manifest::binary::fix_checksum(&mut blob);
        let encoded = manifest::slot::encode_slot(2, &blob);
        slot.copy_from_slice(&encoded);
    })
}

const CASES: &[Case] = &[
    Case {
        name: "uefi_boot_checks",
        prepare: nothing,
        nvme: true,
        status: 33,
        expect: &[
            "[brick] manifest: slot A (sequence 1) in force",
            "pci: ECAM segment 0",
            "nvme: volume fast gets namespace 2",
            "[brick] boot checks passed",
        ],
    },
    Case {
        name: "uefi_reflash_changes_next_boot",
        prepare: reflash,
        nvme: true,
        status: 33,
        expect: &[
            "[brick] manifest: slot B (sequence 2) in force",
            "target \"uefi-reflashed\"",
        ],
    },
    Case {
        name: "uefi_flipped_slot_boots_the_other",
        prepare: reflash_then_flip,
        nvme: true,
        status: 33,
        expect: &[
            "[brick] manifest: slot A (sequence 1) in force",
            "slot B: checksum mismatch",
            "target \"uefi-check\"",
        ],
    },
    Case {
        name: "uefi_no_manifest",
        prepare: blank_slot_a,
        nvme: true,
        status: 45,
        expect: &["FATAL: no manifest on the boot disk"],
    },
    Case {
        name: "uefi_both_slots_corrupt",
        prepare: corrupt_both,
        nvme: true,
        status: 47,
        expect: &["FATAL: both manifest slots are bad: slot A: checksum mismatch"],
    },
    Case {
        name: "uefi_manifest_too_new",
        prepare: newer_manifest,
        nvme: true,
        status: 49,
        expect: &["newer than this image understands"],
    },
    Case {
        name: "uefi_nvme_without_controller",
        prepare: nothing,
        nvme: false,
        status: 37,
        expect: &["no NVMe controller has serial \"brick-nvme0\""],
    },
];

/// How long one UEFI boot case may take (OVMF takes a few seconds of TCG).
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// The UEFI boot cases, for the `image` suite.
pub fn suite(filter: Option<&str>, failures: &mut Vec<String>) -> crate::suite::Counts {
    let mut counts = crate::suite::Counts::default();
    let selected = |case: &Case| filter.is_none_or(|f| format!("image {}", case.name).contains(f));
    if !CASES.iter().any(selected) {
        return counts;
    }
    let parts = match build() {
        Ok(parts) => parts,
        Err(error) => {
            println!("image uefi build ... FAILED");
            failures.push(format!("image uefi build: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    for case in CASES.iter().filter(|c| selected(c)) {
        let full_name = format!("image {}", case.name);
        let start = Instant::now();
        let result = run_case(&parts, case);
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

fn run_case(parts: &Parts, case: &Case) -> Result<String> {
    let dir = paths::scratch("uefi-check");
    let result = (|| {
        let manifest = dir.join("node.toml");
        std::fs::write(&manifest, CASE_MANIFEST)?;
        let disk = dir.join("node.img");
        self::disk(parts, &manifest, &disk, None)?;
        (case.prepare)(parts, &disk, &dir)?;
        let mut nvme = Vec::new();
        if case.nvme {
            let mut namespaces = Vec::new();
            for n in 1..=2 {
                let file = dir.join(format!("nvme-n{n}.img"));
                std::fs::File::create(&file)?.set_len(16 << 20)?;
                namespaces.push(file);
            }
            nvme.push(Nvme {
                serial: "brick-nvme0".into(),
                namespaces,
            });
        }
        let command = qemu_command(&disk, &dir.join("vars.fd"), 512, &nvme, &[])?;
        let (status, console) = crate::image::boot_captured(&command, CASE_TIMEOUT, None)?;
        let Some(status) = status else {
            bail!(
                "timeout after {} s: QEMU killed\n{console}",
                CASE_TIMEOUT.as_secs()
            );
        };
        let missing: Vec<&&str> = case
            .expect
            .iter()
            .filter(|e| !console.contains(**e))
            .collect();
        if status != case.status || !missing.is_empty() {
            bail!(
                "expected status {} and {:?} on the console; got status {status}, missing {missing:?}\n{console}",
                case.status,
                case.expect
            );
        }
        Ok(format!(", status {status}, {}", boot_times(&console)))
    })();
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The console's boot-time line for a result line, or "".
pub fn boot_times(console: &str) -> String {
    console
        .lines()
        .find_map(|line| line.strip_prefix("[brick] boot: "))
        .map(|rest| format!("boot: {}", rest.trim()))
        .unwrap_or_default()
}
