//! `brick image build`, `brick manifest flash|show`: the bootable disk.
//!
//! A disk image is a GPT disk with one partition, the EFI system partition
//! (FAT, no root and no loop device needed: the `gpt` and `fatfs` crates
//! write it through a file), holding
//!
//! ```text
//! \EFI\BOOT\BOOTX64.EFI    the UEFI loader (brick-loader.efi): what the firmware starts
//! \EFI\BRICK\KERNEL        the image (brick-image, the same ELF QEMU boots with -kernel)
//! \EFI\BRICK\MANIFEST.A    manifest slot A (manifest::slot, 1 MiB)
//! \EFI\BRICK\MANIFEST.B    manifest slot B
//! \EFI\BRICK\CMDLINE       optional extra command-line words for the image
//! ```
//!
//! Written to a USB stick or a disk with `dd`, it boots a node as it boots
//! QEMU. `flash` rewrites the slot that is not in force, in place (the
//! slot files keep their size and clusters, so the FAT and the other slot
//! are not touched), syncs, and reads it back through a fresh mount: the
//! bytes must be what was written and [`manifest::slot::choose`] must now
//! pick it. A crash during the write leaves the old slot in force.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use manifest::config::Config;
use manifest::slot::{self, SlotName, SLOT_BYTES};

/// Where the slots and the image live on the ESP.
const BRICK_DIR: &str = "EFI/BRICK";

/// `brick image build` options.
#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The manifest (TOML) the disk boots with (slot A, sequence 1).
    #[arg(long, value_name = "FILE.toml")]
    pub manifest: PathBuf,
    /// Where to write the disk image (created or truncated).
    #[arg(short, long, value_name = "DISK.img")]
    pub output: PathBuf,
    /// The UEFI loader [default: target/x86_64-unknown-uefi/release/brick-loader.efi].
    #[arg(long, value_name = "FILE.efi")]
    pub loader: Option<PathBuf>,
    /// The image [default: target/x86_64-unknown-none/release/brick-image].
    #[arg(long, value_name = "ELF")]
    pub kernel: Option<PathBuf>,
    /// Disk size in MiB (at least 40).
    #[arg(long, default_value_t = 64)]
    pub size_mib: u64,
    /// Extra words for the image's command line (`\EFI\BRICK\CMDLINE`).
    #[arg(long)]
    pub cmdline: Option<String>,
}

/// A window of a file: the partition, as a stream for `fatfs`.
struct Window<F> {
    inner: F,
    start: u64,
    len: u64,
    position: u64,
}

impl<F: Seek> Window<F> {
    fn new(inner: F, start: u64, len: u64) -> Self {
        Self {
            inner,
            start,
            len,
            position: 0,
        }
    }
}

impl<F: Read + Seek> Read for Window<F> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.position);
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        self.inner
            .seek(SeekFrom::Start(self.start + self.position))?;
        let read = self.inner.read(&mut buffer[..n])?;
        self.position += read as u64;
        Ok(read)
    }
}

impl<F: Write + Seek> Write for Window<F> {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.position);
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        if n == 0 && !buffer.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write beyond the end of the partition",
            ));
        }
        self.inner
            .seek(SeekFrom::Start(self.start + self.position))?;
        let written = self.inner.write(&buffer[..n])?;
        self.position += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<F: Seek> Seek for Window<F> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::End(delta) => self.len.checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        match position {
            Some(at) if at <= self.len => {
                self.position = at;
                Ok(at)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}

/// A default build artefact, or the error that says how to make it.
fn artefact(given: &Option<PathBuf>, default: &str, what: &str) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.clone());
    }
    let path = PathBuf::from(default);
    if path.is_file() {
        return Ok(path);
    }
    bail!(
        "no {what} at {default}: build it with `cargo xtask image --uefi` (in the Brick \
         repository) or name it with --{}",
        if what.contains("loader") {
            "loader"
        } else {
            "kernel"
        }
    )
}

/// Compiles `file` into a blob that fits a slot.
fn compile(file: &Path) -> Result<Vec<u8>> {
    let config = manifest::compile_file(file).map_err(|e| anyhow!("{e}"))?;
    let blob = config
        .to_binary()
        .map_err(|e| anyhow!("{}: the binary form was refused: {e}", file.display()))?;
    if blob.len() > slot::MAX_BLOB {
        bail!(
            "{}: the manifest is {} bytes, a slot holds {}",
            file.display(),
            blob.len(),
            slot::MAX_BLOB
        );
    }
    Ok(blob)
}

/// `brick image build`.
///
/// # Errors
///
/// A manifest the compiler refuses, a missing or malformed loader or
/// image, an IO error writing the disk.
pub fn build(args: &BuildArgs) -> Result<()> {
    let loader_path = artefact(
        &args.loader,
        "target/x86_64-unknown-uefi/release/brick-loader.efi",
        "UEFI loader",
    )?;
    let kernel_path = artefact(
        &args.kernel,
        "target/x86_64-unknown-none/release/brick-image",
        "image",
    )?;
    let loader =
        std::fs::read(&loader_path).with_context(|| format!("read {}", loader_path.display()))?;
    if !loader.starts_with(b"MZ") {
        bail!(
            "{}: not a UEFI application (expected a PE file starting with \"MZ\")",
            loader_path.display()
        );
    }
    let kernel =
        std::fs::read(&kernel_path).with_context(|| format!("read {}", kernel_path.display()))?;
    loader::LoadPlan::parse(&kernel)
        .map_err(|e| anyhow!("{}: not a Brick image: {e}", kernel_path.display()))?;
    let blob = compile(&args.manifest)?;
    if args.size_mib < 40 {
        bail!("--size-mib {}: at least 40", args.size_mib);
    }
    let size = args.size_mib << 20;
    let file =
        File::create(&args.output).with_context(|| format!("create {}", args.output.display()))?;
    file.set_len(size)?;
    drop(file);
    // The protective MBR, then the GPT with one 1 MiB-aligned ESP.
    let mut device = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&args.output)?;
    let mbr =
        gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from((size / 512) - 1).unwrap_or(u32::MAX));
    mbr.overwrite_lba0(&mut device)
        .map_err(|e| anyhow!("write the protective MBR: {e}"))?;
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .create_from_device(device, None)
        .map_err(|e| anyhow!("create the GPT: {e}"))?;
    let esp_bytes = size - (2 << 20);
    disk.add_partition(
        "EFI system partition",
        esp_bytes,
        gpt::partition_types::EFI,
        0,
        Some(2048),
    )
    .map_err(|e| anyhow!("add the ESP: {e}"))?;
    let device = disk.write().map_err(|e| anyhow!("write the GPT: {e}"))?;
    drop(device);
    let (start, len) = esp(&args.output)?;
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&args.output)?;
    let mut window = Window::new(device, start, len);
    fatfs::format_volume(
        &mut window,
        fatfs::FormatVolumeOptions::new().volume_label(*b"BRICK      "),
    )
    .context("format the ESP")?;
    window.seek(SeekFrom::Start(0))?;
    {
        let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new())
            .context("mount the ESP")?;
        let root = fs.root_dir();
        root.create_dir("EFI")?;
        root.create_dir("EFI/BOOT")?;
        root.create_dir(BRICK_DIR)?;
        let put = |path: &str, bytes: &[u8]| -> Result<()> {
            let mut file = root
                .create_file(path)
                .with_context(|| format!("create {path} on the ESP"))?;
            file.truncate()?;
            file.write_all(bytes)
                .with_context(|| format!("write {path} on the ESP"))?;
            file.flush()?;
            Ok(())
        };
        put("EFI/BOOT/BOOTX64.EFI", &loader)?;
        put(&format!("{BRICK_DIR}/KERNEL"), &kernel)?;
        put(
            &format!("{BRICK_DIR}/{}", SlotName::A.file_name()),
            &slot::encode_slot(1, &blob),
        )?;
        put(
            &format!("{BRICK_DIR}/{}", SlotName::B.file_name()),
            &vec![0u8; SLOT_BYTES],
        )?;
        if let Some(words) = &args.cmdline {
            put(&format!("{BRICK_DIR}/CMDLINE"), words.as_bytes())?;
        }
        drop(root);
        fs.unmount().context("unmount the ESP")?;
    }
    window.inner.sync_all()?;
    println!(
        "{}: {} MiB GPT disk, ESP at {} MiB ({} MiB FAT): loader {} bytes, image {} bytes, \
         manifest {} bytes in slot A (sequence 1), slot B blank",
        args.output.display(),
        args.size_mib,
        start >> 20,
        len >> 20,
        loader.len(),
        kernel.len(),
        blob.len()
    );
    Ok(())
}

/// The ESP's byte range on `disk` (the GPT's EFI system partition).
fn esp(disk: &Path) -> Result<(u64, u64)> {
    let table = gpt::GptConfig::new()
        .writable(false)
        .open(disk)
        .map_err(|e| anyhow!("{}: no readable GPT: {e}", disk.display()))?;
    let block = u64::from(*table.logical_block_size());
    let partition = table
        .partitions()
        .values()
        .find(|p| p.part_type_guid == gpt::partition_types::EFI)
        .ok_or_else(|| anyhow!("{}: the GPT has no EFI system partition", disk.display()))?;
    let start = partition.first_lba * block;
    let len = (partition.last_lba + 1 - partition.first_lba) * block;
    Ok((start, len))
}

/// The ESP of `disk`, opened for `fatfs`.
fn open_esp(disk: &Path, writable: bool) -> Result<Window<File>> {
    let (start, len) = esp(disk)?;
    let device = OpenOptions::new()
        .read(true)
        .write(writable)
        .open(disk)
        .with_context(|| format!("open {}", disk.display()))?;
    Ok(Window::new(device, start, len))
}

/// Both slot files' bytes (`None`: missing).
fn read_slots(disk: &Path) -> Result<[Option<Vec<u8>>; 2]> {
    let mut window = open_esp(disk, false)?;
    let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new())
        .with_context(|| format!("{}: the ESP is not a FAT file system", disk.display()))?;
    let root = fs.root_dir();
    let read = |name: SlotName| -> Result<Option<Vec<u8>>> {
        match root.open_file(&format!("{BRICK_DIR}/{}", name.file_name())) {
            Ok(mut file) => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)?;
                Ok(Some(bytes))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    };
    Ok([read(SlotName::A)?, read(SlotName::B)?])
}

/// `brick manifest flash DISK FILE.toml`.
///
/// # Errors
///
/// A manifest the compiler refuses, a disk without an ESP, an IO error,
/// or a read-back that differs from what was written.
pub fn flash(disk: &Path, file: &Path) -> Result<()> {
    let blob = compile(file)?;
    let slots = read_slots(disk)?;
    let chosen = slot::choose(slots[0].as_deref(), slots[1].as_deref());
    let highest = slots
        .iter()
        .flatten()
        .filter_map(|bytes| slot::read_slot(bytes).ok())
        .map(|s| s.sequence)
        .max()
        .unwrap_or(0);
    let target = match &chosen {
        Ok(chosen) => chosen.name.other(),
        Err(_) => SlotName::A,
    };
    let sequence = highest + 1;
    let bytes = slot::encode_slot(sequence, &blob);
    {
        let mut window = open_esp(disk, true)?;
        let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new())
            .with_context(|| format!("{}: the ESP is not a FAT file system", disk.display()))?;
        let path = format!("{BRICK_DIR}/{}", target.file_name());
        let root = fs.root_dir();
        let mut slot_file = match root.open_file(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => root
                .create_file(&path)
                .with_context(|| format!("create {path}"))?,
            Err(error) => return Err(error.into()),
        };
        // In place: same length, same clusters (a missing file is created
        // once at full size).
        slot_file.seek(SeekFrom::Start(0))?;
        slot_file
            .write_all(&bytes)
            .with_context(|| format!("write {path}"))?;
        slot_file.flush()?;
        drop(slot_file);
        drop(root);
        fs.unmount()?;
        window.inner.sync_all()?;
    }
    // Read back through a fresh mount.
    let again = read_slots(disk)?;
    let index = usize::from(target == SlotName::B);
    if again[index].as_deref() != Some(bytes.as_slice()) {
        bail!(
            "{}: {target} reads back different from what was written: the disk is failing \
             (the other slot is still in force)",
            disk.display()
        );
    }
    let now = slot::choose(again[0].as_deref(), again[1].as_deref())
        .map_err(|e| anyhow!("{}: after flashing: {e}", disk.display()))?;
    if now.name != target || now.sequence != sequence {
        bail!(
            "{}: after flashing {target} (sequence {sequence}), {} (sequence {}) is in force",
            disk.display(),
            now.name,
            now.sequence
        );
    }
    println!(
        "{}: flashed {} bytes of {} into {target} (sequence {sequence}), read back and verified; \
         {target} is in force, {} kept as the fallback",
        disk.display(),
        blob.len(),
        file.display(),
        target.other()
    );
    Ok(())
}

/// `brick manifest show DISK`: both slots, and the manifest in force as
/// canonical TOML.
///
/// # Errors
///
/// A disk without an ESP, or no slot the image would boot (the message is
/// the image's own).
pub fn show(disk: &Path) -> Result<()> {
    let slots = read_slots(disk)?;
    for (name, bytes) in [(SlotName::A, &slots[0]), (SlotName::B, &slots[1])] {
        let state = match slot::check_slot(bytes.as_deref()) {
            Ok((slot, manifest)) => format!(
                "valid, sequence {}, {} bytes, target {:?}",
                slot.sequence,
                slot.blob.len(),
                manifest.target().name
            ),
            Err(error) => format!("{error}"),
        };
        println!("{name}: {state}");
    }
    match slot::choose(slots[0].as_deref(), slots[1].as_deref()) {
        Ok(chosen) => {
            println!(
                "in force: {} (sequence {}); the image boots with:\n",
                chosen.name, chosen.sequence
            );
            print!("{}", Config::from_manifest(&chosen.manifest));
            Ok(())
        }
        Err(error) => bail!("{}: {error}", disk.display()),
    }
}
