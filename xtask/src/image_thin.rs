//! The image suite's thin-volume cases (docs/THIN.md): the bare-metal
//! image under QEMU (TCG) with a thin pool on a virtio-blk disk (or an
//! NVMe namespace), Brick's
//! initiator on the host through the frame relay.
//!
//! * `image thin_io`: three thin volumes on one pool; a pattern written
//!   into extents of `thin2`, one extent discarded, read back (written:
//!   the pattern; discarded and never written: zeroes); QEMU SIGKILLed,
//!   booted again on the same pool disk, read back again.
//! * `image thin_nvme`: `thin_io` on a pool on an NVMe namespace.
//! * `image thin_file_pool_refused`: a thin volume on a file pool (the
//!   hosted target's kind) refused by the image, QEMU status 43.
//! * `image thin_crash`: writes and discards in flight on `thin0` and
//!   `thin1` (which overcommit the pool), QEMU SIGKILLed at a random
//!   moment, booted again on the same disk, every block read back against
//!   the last acknowledged write ([`CRASH_RUNS`] kills); the console's
//!   pool report says what the check at start reclaimed.
//!
//! Both run `initiator/examples/thin_crash.rs` (the checks are
//! `initiator::crash_check`, shared with the hosted target's crash test)
//! with the QEMU command line this file builds; the driver starts and
//! kills QEMU itself.

use crate::image::Disk;
use crate::relay::Relay;
use crate::suite::Counts;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Kills of the crash case (each costs a TCG boot, ~10-20 s).
const CRASH_RUNS: usize = 4;
/// The pool disk: 32 MiB is 15 extents after the metadata; the thin
/// volumes promise 16 + 16 + 8 MiB (20 extents).
const POOL_DISK_BYTES: u64 = 32 << 20;

/// Where a case's pool lives.
#[derive(Clone, Copy)]
enum PoolKind {
    /// A virtio-blk disk at the first disk slot ([`crate::image::disk_pci`]).
    VirtioBlk,
    /// Namespace 1 of an NVMe controller with serial [`NVME_SERIAL`].
    Nvme,
}

/// The NVMe pool controller's serial.
const NVME_SERIAL: &str = "brick-pool";

/// The manifest: one interface, the pool, three thin volumes on it.
fn manifest(kind: PoolKind) -> String {
    let pool = match kind {
        PoolKind::VirtioBlk => format!(
            "kind = \"virtio-blk\"\npci = \"{}\"\n",
            crate::image::disk_pci(0)
        ),
        PoolKind::Nvme => format!("kind = \"nvme\"\nserial = \"{NVME_SERIAL}\"\nnamespace = 1\n"),
    };
    format!(
        concat!(
            "\n[target]\nname = \"brick-image-thin\"\n",
            crate::image::image_limits!(),
            "\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n",
            "\n[[pools]]\nname = \"pool0\"\n{pool}",
            "\n[[volumes]]\nname = \"thin0\"\nkind = \"thin\"\npool = \"pool0\"\nsize = \"16MiB\"\n",
            "\n[[volumes]]\nname = \"thin1\"\nkind = \"thin\"\npool = \"pool0\"\nsize = \"16MiB\"\n",
            "\n[[volumes]]\nname = \"thin2\"\nkind = \"thin\"\npool = \"pool0\"\nsize = \"8MiB\"\n",
            "\n[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
        ),
        pool = pool
    )
}

/// Runs the thin cases `filter` selects (`image thin_io`, `image
/// thin_crash`), adding to `counts` and `failures`.
pub fn suite(filter: Option<&str>, failures: &mut Vec<String>, counts: &mut Counts) {
    let cases = [
        ("image thin_io", "io", PoolKind::VirtioBlk),
        ("image thin_crash", "crash", PoolKind::VirtioBlk),
        ("image thin_nvme", "io", PoolKind::Nvme),
    ];
    let selected: Vec<_> = cases
        .iter()
        .filter(|(name, ..)| filter.is_none_or(|f| name.contains(f)))
        .collect();
    let refusal = "image thin_file_pool_refused";
    let refuse = filter.is_none_or(|f| refusal.contains(f));
    if selected.is_empty() && !refuse {
        return;
    }
    let built = crate::image::build().and_then(|image| Ok((image, driver()?)));
    let (image, driver) = match built {
        Ok(built) => built,
        Err(error) => {
            println!("image thin ... FAILED (build)");
            failures.push(format!("image thin build: {error:#}"));
            counts.failed += 1;
            return;
        }
    };
    if refuse {
        let start = Instant::now();
        match file_pool_refused(&image) {
            Ok(note) => {
                println!(
                    "{refusal} ... ok ({:.1} s): {note}",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!("{refusal} ... FAILED\n{error:#}");
                failures.push(refusal.into());
                counts.failed += 1;
            }
        }
    }
    for (name, mode, kind) in selected {
        let start = Instant::now();
        match run_case(&image, &driver, mode, *kind) {
            Ok(note) => {
                println!(
                    "{name} ... ok ({:.1} s): {note}",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!(
                    "{name} ... FAILED ({:.1} s)\n{error:#}",
                    start.elapsed().as_secs_f64()
                );
                failures.push((*name).into());
                counts.failed += 1;
            }
        }
    }
}

/// Builds the driver (`initiator/examples/thin_crash.rs`, release).
fn driver() -> Result<PathBuf> {
    crate::util::step("building the thin crash driver (release)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::util::run(
        Command::new(cargo)
            .current_dir(crate::paths::repo())
            .args(["build", "--release", "-p", "brick-initiator", "--example"])
            .arg("thin_crash"),
    )?;
    Ok(crate::paths::target_dir().join("release/examples/thin_crash"))
}

/// One case: a fresh pool disk, the relay, the driver in `mode`; the
/// driver's result line, and for the crash case the consoles' pool
/// reports.
fn run_case(image: &Path, driver: &Path, mode: &str, kind: PoolKind) -> Result<String> {
    let dir = crate::paths::scratch(&format!("image-thin-{mode}"));
    let result = (|| {
        let manifest_path = dir.join("thin.toml");
        std::fs::write(&manifest_path, manifest(kind))?;
        let (config, blob, blob_path) = crate::image::compile_to_blob(&manifest_path, &dir)?;
        let mac = config.interfaces.first().context("no interface")?.mac.0;
        let pool = dir.join("pool.img");
        std::fs::File::create(&pool)?.set_len(POOL_DISK_BYTES)?;
        let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 0x7417, None)?;
        let disks = match kind {
            PoolKind::VirtioBlk => vec![Disk {
                path: pool.clone(),
                serial: None,
            }],
            PoolKind::Nvme => Vec::new(),
        };
        let mut command = crate::image::qemu_command_with_disks(
            image,
            &blob_path,
            crate::image::guest_mib(&blob),
            &disks,
            &[(relay.b.clone(), mac)],
        )?;
        if let PoolKind::Nvme = kind {
            let file = pool.to_str().context("pool path is not UTF-8")?;
            command.extend([
                "-drive".into(),
                format!(
                    "file={},if=none,id=pool,format=raw",
                    file.replace(',', ",,")
                ),
                "-device".into(),
                format!("nvme,serial={NVME_SERIAL},drive=pool"),
            ]);
        }
        let args_file = dir.join("qemu.args");
        std::fs::write(&args_file, command.join("\n"))?;
        let consoles = dir.join("console");
        std::fs::create_dir_all(&consoles)?;
        let volumes = if mode == "io" { "thin2" } else { "thin0,thin1" };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs());
        let output = Command::new(driver)
            .arg(mode)
            .arg("--qemu")
            .arg(&args_file)
            .arg("--console")
            .arg(&consoles)
            .arg("--link")
            .arg(format!("frame:connect:{}", relay.a.display()))
            .args([
                "--local",
                "10.77.0.2",
                "--target",
                "10.77.0.1",
                "--pool",
                "pool0",
            ])
            .args(["--volumes", volumes])
            .args([
                "--runs",
                &CRASH_RUNS.to_string(),
                "--seed",
                &seed.to_string(),
            ])
            .output()
            .context("run the thin crash driver")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        for line in stdout
            .lines()
            .filter(|l| !l.starts_with("thin_crash: ok: "))
        {
            println!("  {line}");
        }
        let reports = pool_reports(&consoles);
        if !output.status.success() {
            bail!(
                "the driver failed ({}):\n{stdout}\n{}\nlast console:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr),
                last_console(&consoles)
            );
        }
        for report in &reports {
            println!("  console: {report}");
        }
        let Some(ok) = stdout
            .lines()
            .find_map(|l| l.strip_prefix("thin_crash: ok: "))
        else {
            bail!("no result line from the driver:\n{stdout}");
        };
        if reports.is_empty() {
            bail!("no boot printed a pool report on the console");
        }
        println!("  relay: {}", relay.summary());
        Ok(ok.to_string())
    })();
    if result.is_ok() && std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The image refuses a thin volume on a file pool (the hosted target's):
/// QEMU status 43 with the reason on the console.
fn file_pool_refused(image: &Path) -> Result<String> {
    let dir = crate::paths::scratch("image-thin-file-pool");
    let result = (|| {
        let text = manifest(PoolKind::VirtioBlk).replace(
            &format!(
                "kind = \"virtio-blk\"\npci = \"{}\"\n",
                crate::image::disk_pci(0)
            ),
            "kind = \"file\"\npath = \"/var/lib/brick/pool0.img\"\n",
        );
        let manifest_path = dir.join("thin.toml");
        std::fs::write(&manifest_path, text)?;
        let (config, blob, blob_path) = crate::image::compile_to_blob(&manifest_path, &dir)?;
        let mac = config.interfaces.first().context("no interface")?.mac.0;
        // The NIC's socket: listened on, never read (the image refuses the
        // manifest before it sends anything).
        let socket = dir.join("nic.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket)?;
        let command = crate::image::qemu_command_with_disks(
            image,
            &blob_path,
            crate::image::guest_mib(&blob),
            &[],
            &[(socket, mac)],
        )?;
        let (status, console) =
            crate::image::boot_captured(&command, std::time::Duration::from_secs(60), None)?;
        let reason = "its pool is a file or block device: the image takes thin volumes on \
                      virtio-blk and nvme pools";
        if status != Some(43) || !console.contains(reason) {
            bail!("expected status 43 and {reason:?}; got {status:?}\n{console}");
        }
        Ok(format!("status 43, {reason:?}"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Every boot's `[brick] pool ...` report, in boot order.
fn pool_reports(consoles: &Path) -> Vec<String> {
    let mut boots: Vec<PathBuf> = std::fs::read_dir(consoles)
        .map(|dir| dir.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    boots.sort_by_key(|p| boot_number(p));
    boots
        .iter()
        .filter_map(|boot| {
            let text = std::fs::read_to_string(boot).ok()?;
            let line = text
                .lines()
                .find(|l| l.starts_with("[brick] pool pool0: "))?;
            Some(format!("boot {}: {}", boot_number(boot), line.trim()))
        })
        .collect()
}

fn boot_number(path: &Path) -> usize {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("boot-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The last boot's console (for a failure).
fn last_console(consoles: &Path) -> String {
    let count = std::fs::read_dir(consoles).map_or(0, |d| d.count());
    std::fs::read_to_string(consoles.join(format!("boot-{count}.log"))).unwrap_or_default()
}
