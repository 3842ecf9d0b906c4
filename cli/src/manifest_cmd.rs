//! `brick manifest check|build`: compile a boot manifest, show or write it.
//!
//! Both compile the TOML with [`manifest::compile_file`] (errors are
//! `FILE:LINE: field.path: message`), encode the binary form and read it
//! back with [`manifest::binary::Manifest::parse`], the same no_std reader
//! the target boots from, so what passes here boots there (bar the
//! machine: memory, NICs by MAC, disks). `check` prints a summary built from
//! that binary view, with the memory the limits make the target allocate
//! ([`crate::manifest_memory`]), and refuses limits the target cannot
//! hold; `build` writes the blob.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use initiator::InitiatorConfig;
use manifest::binary::{Manifest, RuleVolumes};
use manifest::config::format_size;

/// `brick manifest` subcommands.
#[derive(Subcommand, Debug)]
pub enum ManifestCommand {
    /// Compile and validate a manifest; print what it configures.
    Check {
        /// The manifest (TOML).
        file: PathBuf,
        /// Also print the canonical TOML (every default written out).
        #[arg(long)]
        canonical: bool,
    },
    /// Compile a manifest into its checksummed binary form.
    Build {
        /// The manifest (TOML).
        file: PathBuf,
        /// Where to write the binary form.
        #[arg(short, long, value_name = "FILE.bin")]
        output: PathBuf,
    },
    /// Compile a manifest and write it into the boot disk's slot that is
    /// not in force (in place, read back and verified); the next boot
    /// serves it.
    Flash {
        /// The disk image or device (`brick image build`'s layout).
        disk: PathBuf,
        /// The manifest (TOML).
        file: PathBuf,
    },
    /// Show both manifest slots of a boot disk and the manifest the image
    /// will boot with.
    Show {
        /// The disk image or device.
        disk: PathBuf,
    },
}

/// Runs a `brick manifest` subcommand.
///
/// # Errors
///
/// The compiler's error (file, line, field, message), the binary reader's
/// refusal, or an IO error writing the output.
pub fn run(command: &ManifestCommand) -> Result<()> {
    match command {
        ManifestCommand::Check { file, canonical } => check(file, *canonical),
        ManifestCommand::Build { file, output } => build(file, output),
        ManifestCommand::Flash { disk, file } => crate::disk_image::flash(disk, file),
        ManifestCommand::Show { disk } => crate::disk_image::show(disk),
    }
}

/// Compiles `file` and returns the canonical TOML and the binary form
/// (checked by reading it back).
fn compile(file: &Path) -> Result<(String, Vec<u8>)> {
    // The compile error already names the file, line and field.
    let config = manifest::compile_file(file).map_err(|e| anyhow!("{e}"))?;
    let blob = config
        .to_binary()
        .map_err(|e| anyhow!("{}: the binary form was refused: {e}", file.display()))?;
    Manifest::parse(&blob).map_err(|e| {
        anyhow!(
            "{}: the binary form does not read back: {e}",
            file.display()
        )
    })?;
    Ok((config.to_string(), blob))
}

/// Refuses a manifest that neither target can serve: device pools or
/// volumes (virtio-blk, NVMe: the image's) beside file or block pools
/// (the hosted target's). Volumes of files and block devices in an image
/// manifest are refused by [`crate::manifest_memory`]'s image check.
///
/// # Errors
/// The pools and volumes that disagree.
fn one_target(m: &Manifest<'_>) -> Result<()> {
    use manifest::binary::Backing;
    let image = m
        .pools()
        .find(|p| p.backing.is_device())
        .map(|p| p.name)
        .or_else(|| {
            m.volumes()
                .find(|v| matches!(v.backing, Backing::VirtioBlk(_) | Backing::Nvme { .. }))
                .map(|v| v.name)
        });
    let hosted = m
        .pools()
        .find(|p| !p.backing.is_device())
        .map(|p| (p.name, "pool", p.backing.kind()))
        .or_else(|| {
            m.volumes()
                .find(|v| matches!(v.backing, Backing::File { .. } | Backing::Block { .. }))
                .map(|v| (v.name, "volume", v.backing.kind()))
        });
    if let (Some(image), Some((name, what, kind))) = (image, hosted) {
        return Err(anyhow!(
            "{what} {name} is a {} {what}, which only the hosted target serves, but {image} is \
             on a virtio-blk or NVMe device, which only the image serves: the image takes thin \
             volumes on virtio-blk and nvme pools, the hosted target on file and block pools",
            kind.as_str()
        ));
    }
    Ok(())
}

/// The CRC-32 stored in a blob's header (bytes 12..16, little-endian).
fn stored_checksum(blob: &[u8]) -> u32 {
    let mut bytes = [0u8; 4];
    if let Some(stored) = blob.get(manifest::binary::field::CRC) {
        bytes.copy_from_slice(stored);
    }
    u32::from_le_bytes(bytes)
}

fn check(file: &Path, canonical: bool) -> Result<()> {
    let (toml, blob) = compile(file)?;
    let m = Manifest::parse(&blob).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let target = m.target();
    println!("{}: ok", file.display());
    let uuid = target
        .uuid
        .map(|u| {
            let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
            format!(
                ", uuid {}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            )
        })
        .unwrap_or_default();
    println!(
        "target      {} (RDMA CM port {}, always_invalidate {}{uuid})",
        target.name, target.port, target.always_invalidate
    );
    println!("interfaces  {}", m.interface_count());
    for interface in m.interfaces() {
        println!("  {interface}");
    }
    if m.pool_count() > 0 {
        println!("pools       {}", m.pool_count());
        for pool in m.pools() {
            let promised: u64 = m
                .volumes()
                .filter_map(|v| match v.backing {
                    manifest::binary::Backing::Thin { pool: p, size } if p.name == pool.name => {
                        Some(size)
                    }
                    _ => None,
                })
                .sum();
            let sized = if pool.backing.is_device() {
                format!(
                    "; its tables take {} B per 2 MiB extent of the disk, counted at boot",
                    manifest::capacity::sizes::THIN_PHYSICAL_EXTENT
                )
            } else {
                String::new()
            };
            println!(
                "  {pool}: thin volumes promise {}{sized}",
                manifest::config::format_size(promised)
            );
        }
    }
    one_target(&m).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    println!("volumes     {}", m.volume_count());
    for volume in m.volumes() {
        println!("  {volume}");
    }
    println!("access      {} rules", m.access_rule_count());
    for rule in m.access_rules() {
        let volumes = match rule.volumes {
            RuleVolumes::All => "all volumes".to_owned(),
            RuleVolumes::Only(indexes) => indexes
                .map(|i| m.volume(i).map_or("?", |v| v.name).to_owned())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let source = rule
            .source
            .map_or_else(|| "any address".to_owned(), |s| s.to_string());
        println!(
            "  sessions {:?} from {source}: {volumes} {}",
            rule.sessions, rule.mode
        );
    }
    match m.admin() {
        Some(admin) => println!("admin       http://{admin} (hosted target)"),
        None => println!("admin       none"),
    }
    let limits = m.limits();
    println!(
        "limits      {} sessions, {} paths/session, {} connections/path, queue depth {}, chunk {} (IOs up to {} unsplit)",
        limits.max_sessions,
        limits.max_paths_per_session,
        limits.max_connections_per_path,
        limits.queue_depth,
        format_size(u64::from(limits.chunk_size)),
        format_size(u64::from(limits.max_io_size()))
    );
    println!(
        "memory      RAM volumes {}, chunk pools up to {} (all sessions)",
        format_size(m.ram_volume_bytes()),
        format_size(limits.max_chunk_pool_bytes())
    );
    crate::manifest_memory::print_and_check(&m).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    println!(
        "binary      {} bytes, format version {}, crc32 {:#010x}",
        blob.len(),
        manifest::binary::FORMAT_VERSION,
        stored_checksum(&blob)
    );
    if limits.queue_depth > InitiatorConfig::MAX_SERVER_QUEUE_DEPTH {
        println!(
            "note        queue depth {} is above {}, the most Brick's own initiator (brick io/bench) accepts; Linux clients are unaffected",
            limits.queue_depth,
            InitiatorConfig::MAX_SERVER_QUEUE_DEPTH
        );
    }
    if canonical {
        println!();
        print!("{toml}");
    }
    Ok(())
}

fn build(file: &Path, output: &Path) -> Result<()> {
    let (_, blob) = compile(file)?;
    std::fs::write(output, &blob).with_context(|| format!("write {}", output.display()))?;
    let m = Manifest::parse(&blob).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    println!(
        "{}: {} bytes, format version {}, crc32 {:#010x} ({} interfaces, {} volumes, {} access rules) from {}",
        output.display(),
        blob.len(),
        manifest::binary::FORMAT_VERSION,
        stored_checksum(&blob),
        m.interface_count(),
        m.volume_count(),
        m.access_rule_count(),
        file.display()
    );
    Ok(())
}
