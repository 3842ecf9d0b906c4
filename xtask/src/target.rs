//! Targets and test beds: what a test needs to know about a target.
//!
//! A test is written against "a target at an address on a link": the
//! [`TargetDescriptor`] says where the target is (one address per path),
//! which volumes it exports under which `device_path` and how big they are,
//! whether it exports NVMe-oF too, and whether and how it can be restarted.
//! The [`Bed`] wires a target and the Linux initiator VM through one relay
//! per path, so pointing the suite at another target kind is a one-line
//! change in [`TargetKind`].

mod bed;
mod judge_manifest;

use crate::qemu::{NicConfig, Vm, VmConfig};
use crate::relay::Relay;
use crate::util::step;
use crate::vmimage::{Images, Overlays};
use anyhow::{bail, Context, Result};
pub use bed::{Bed, BedConfig};
use judge_manifest::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One network path: the target's and the initiator's addresses on it.
#[derive(Clone, Debug)]
pub struct PathAddress {
    /// Target IPv4 address (what the client maps `path=ip:...` to).
    pub target: String,
    /// Initiator IPv4 address.
    pub initiator: String,
    /// Prefix length.
    pub prefix: u8,
}

/// A volume a target exports.
#[derive(Clone, Debug)]
pub struct Volume {
    /// The client's `device_path`.
    pub device_path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Whether acknowledged writes survive a target restart (a file or
    /// block device behind it, not RAM).
    pub durable: bool,
    /// A thin volume (its extents listed by the target's admin endpoint).
    pub thin: bool,
}

/// An NVMe-oF export (the Linux reference target only).
#[derive(Clone, Debug)]
pub struct NvmeExport {
    /// Subsystem NQN.
    pub nqn: String,
    /// Namespace size in bytes.
    pub bytes: u64,
}

/// How a target can be restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Rebooting its VM (its NIC reconnects through the relay).
    Reboot,
    /// Restarting its process (its links reconnect through the relay).
    Process,
}

/// Everything a test needs to know about a target.
#[derive(Clone, Debug)]
pub struct TargetDescriptor {
    /// Name for reports.
    pub name: String,
    /// Paths, in order (path 0 first).
    pub paths: Vec<PathAddress>,
    /// RNBD volumes.
    pub volumes: Vec<Volume>,
    /// NVMe-oF export, if any.
    pub nvme: Option<NvmeExport>,
    /// Restart support.
    pub restart: Restart,
    /// The probe port, if the bed has one and the target serves it.
    pub probe: Option<ProbePort>,
    /// The admin endpoint (`ip:port`, HTTP, docs/ADMIN.md), if it has one.
    pub admin: Option<String>,
}

/// A target's probe port: an extra interface on its own link where
/// `hostile_probe` (target-image/examples) plays hostile clients, with what
/// the probe must be told about the target.
#[derive(Clone, Debug)]
pub struct ProbePort {
    /// The target's address on the probe link.
    pub target: String,
    /// The probe's first address (`A.B.C.D/LEN`).
    pub local: String,
    /// The probe's first MAC.
    pub mac: String,
    /// Sessions named `PREFIX-*` may use the probe volumes.
    pub session_prefix: String,
    /// A session name no access rule admits.
    pub refused_session: String,
    /// A volume probe sessions may open read-only.
    pub ro_volume: String,
    /// A volume probe sessions may open read-write.
    pub rw_volume: String,
    /// The target's `max_connections_per_path`.
    pub max_connections: u16,
    /// The target's `max_sessions`.
    pub max_sessions: u32,
    /// The healthy Brick client's own volume (session `PREFIX-healthy`).
    pub healthy_volume: String,
    /// Sessions `PINNED-*` may use `rw_volume` from the probe's /25 only.
    pub pinned_prefix: String,
    /// A probe-link address outside that /25.
    pub outsider: String,
    /// The target's RTRS half-open limits and setup deadline.
    pub max_half_open: u16,
    pub max_half_open_per_source: u16,
    pub setup_timeout_ms: u64,
}

/// The kinds of target the suites know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// Linux rnbd_server + rtrs_server + nvmet-rdma over rdma_rxe, brd RAM disks.
    LinuxReference,
    /// The hosted Brick target (`brick-target`) serving an examples/ manifest.
    BrickHosted,
    /// The bare-metal Brick image (`brick-image`) under QEMU, virtio-net on
    /// the relays, serving the examples/ manifest's RAM volumes. The smoke
    /// tier runs it (~20 s); `--full` only when named (`--target brick-image`).
    BrickImage,
    /// The same image as a storage node boots it: the UEFI disk image
    /// (`brick image build`) under OVMF on q35, its durable volume on an
    /// NVMe namespace, PCI through ECAM. Smoke tier by default; `--full`
    /// only when named (`--target brick-uefi`).
    BrickUefi,
    /// The hosted Brick target on Linux rxe through libibverbs
    /// (`brick-target --link ibv:rxe0`) inside a Linux VM, its RAM volumes;
    /// the stock client maps it through the relay as it maps the reference
    /// target. Smoke tier by default; `--full` only when named.
    BrickVerbs,
}

impl TargetKind {
    /// Whether its beds can have a probe port ([`BedConfig::probe`]).
    pub fn has_probe_port(self) -> bool {
        matches!(
            self,
            TargetKind::BrickHosted
                | TargetKind::BrickImage
                | TargetKind::BrickUefi
                | TargetKind::BrickVerbs
        )
    }

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::LinuxReference => "linux-ref",
            TargetKind::BrickHosted => "brick-hosted",
            TargetKind::BrickImage => "brick-image",
            TargetKind::BrickUefi => "brick-uefi",
            TargetKind::BrickVerbs => "brick-verbs",
        }
    }

    /// Whether the client's first ARP request gets the second reply that
    /// wakes a Linux client's queued resolution, so a first map must not
    /// hang on its missed neighbour update: Brick's own stack answers twice,
    /// and so does brick-target on an RDMA device (`hal::hosted::ArpAnswerer`,
    /// in the kernel's place). Only linux-ref's ARP is the kernel's.
    pub fn answers_arp(self) -> bool {
        self != TargetKind::LinuxReference
    }

    /// Whether the full tier runs it only when it is named with
    /// `--target` (the smoke tier runs every kind).
    pub fn explicit_only(self) -> bool {
        matches!(
            self,
            TargetKind::BrickImage | TargetKind::BrickUefi | TargetKind::BrickVerbs
        )
    }
}

/// `[limits]` the image target gets when the examples/ manifest has none:
/// the engine's registered arenas come from guest RAM, and the defaults
/// (512-deep queues of 132 KiB chunks) would take ~530 MiB per interface
/// (a 1.2 GiB guest); these keep the judge's guest at ~830 MiB. A bed
/// with a probe port has the probe limits instead (queue depth 384, see
/// [`PROBE_QUEUE_DEPTH`]) and a second interface: ~1.4 GiB of guest
/// ([`crate::image::guest_mib`] sizes it from the manifest).
const IMAGE_LIMITS: &str = crate::image::image_limits!();
/// What the image prints once its poll loop runs.
const IMAGE_SERVING: &str = "[brick] serving after";

/// RAM disk size of the Linux reference target.
const REF_DISK_MIB: u64 = 64;

/// Addresses of path `i` (10.77.0.0/24, 10.78.0.0/24, ...).
pub fn path_address(i: usize) -> PathAddress {
    PathAddress {
        target: format!("10.{}.0.1", 77 + i),
        initiator: format!("10.{}.0.2", 77 + i),
        prefix: 24,
    }
}

fn mac(path: usize, host: u8) -> String {
    format!("52:54:00:{:02x}:00:{host:02x}", 0x77 + path)
}

/// What a Linux target VM serves once booted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serve {
    /// rnbd_server on brd RAM disks and nvmet-rdma (the reference).
    Reference,
    /// `brick-target` on its rxe devices, one link per path.
    Brick { links: usize },
}

/// The manifest at `path` has one interface per relay and one for the
/// probe port, if any.
fn check_links(
    path: &std::path::Path,
    interfaces: usize,
    relays: &[Relay],
    probe: Option<&Relay>,
) -> Result<()> {
    if interfaces != relays.len() + usize::from(probe.is_some()) {
        bail!(
            "{} has {interfaces} interfaces, the bed has {} paths and {} probe port",
            path.display(),
            relays.len(),
            usize::from(probe.is_some())
        );
    }
    Ok(())
}

/// A Linux target VM: the rping overlay (libibverbs, librdmacm and the rxe
/// provider), one NIC per relay at the path's target address.
fn target_vm(name: &str, relays: &[Relay], paths: &[PathAddress], mtu: u32) -> VmConfig {
    let mut config = VmConfig::new(name);
    config.mtu = mtu;
    config.overlays = Overlays {
        fio: false,
        rping: true,
        ext4: false,
    };
    config.nics = relays
        .iter()
        .zip(paths)
        .enumerate()
        .map(|(i, (relay, path))| NicConfig {
            socket: relay.b.clone(),
            mac: mac(i, 1),
            address: format!("{}/{}", path.target, path.prefix),
        })
        .collect();
    config
}

/// How a target runs.
enum Runner {
    /// A Linux VM (the reference target, or brick-target on rxe).
    Vm {
        vm: Option<Box<Vm>>,
        config: VmConfig,
        serve: Serve,
    },
    /// The hosted Brick target process, one `--link` per path, or the
    /// image's QEMU, one NIC per path.
    Process {
        child: Option<Child>,
        command: Vec<String>,
        log: PathBuf,
        /// Serving once the log (since the last start) has this line.
        ready: Option<&'static str>,
        /// Log bytes before the last start.
        log_start: u64,
    },
}

/// A running target.
pub struct Target {
    /// What tests may rely on.
    pub descriptor: TargetDescriptor,
    runner: Runner,
}

/// Builds the `hostile_probe` example (release) and returns its path.
pub fn build_hostile_probe() -> Result<PathBuf> {
    step("building hostile_probe (release)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::util::run(Command::new(cargo).current_dir(crate::paths::repo()).args([
        "build",
        "--release",
        "-p",
        "brick-target-image",
        "--example",
        "hostile_probe",
    ]))?;
    Ok(crate::paths::target_dir().join("release/examples/hostile_probe"))
}

/// Builds the client tools for the initiator VM, statically linked:
/// `brick-initiatord` and the `brick` command (its `status`, `list`,
/// `map`, `unmap` talk to the daemon), in `target/static` so the host
/// build cache is not invalidated; the RUSTFLAGS apply to the target
/// triple only (build scripts and proc macros stay dynamic). Returns the
/// two paths, daemon first.
pub fn build_static_client_tools() -> Result<(PathBuf, PathBuf)> {
    step("building brick-initiatord and brick (release, static)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let triple = "x86_64-unknown-linux-gnu";
    crate::util::run(
        Command::new(cargo)
            .current_dir(crate::paths::repo())
            // These would take precedence over the per-target flags.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                "-C target-feature=+crt-static",
            )
            // No RDMA-device sessions: libibverbs does not link statically.
            .args(["build", "--release", "--no-default-features"])
            .args(["-p", "brick-initiatord", "--bin", "brick-initiatord"])
            .args(["-p", "brick-cli", "--bin", "brick"])
            .args(["--target", triple, "--target-dir", "target/static"]),
    )?;
    let release = crate::paths::repo().join(format!("target/static/{triple}/release"));
    let (daemon, cli) = (release.join("brick-initiatord"), release.join("brick"));
    for binary in [&daemon, &cli] {
        if elf_interpreter(binary)? {
            bail!(
                "{} is not statically linked: it names a program interpreter (PT_INTERP)",
                binary.display()
            );
        }
    }
    Ok((daemon, cli))
}

/// Whether the ELF64 executable at `path` names a program interpreter
/// (a PT_INTERP program header): a dynamically linked binary does, a
/// static one (static-pie included) does not. Read from the file itself,
/// so no `file` tool is needed.
fn elf_interpreter(path: &std::path::Path) -> Result<bool> {
    const PT_INTERP: u32 = 3;
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let field = |at: usize, len: usize| bytes.get(at..at + len);
    if field(0, 4) != Some(b"\x7fELF".as_slice()) || bytes.get(4) != Some(&2) {
        bail!("{} is not an ELF64 file", path.display());
    }
    let number = |at: usize, len: usize| -> Result<u64> {
        let raw =
            field(at, len).with_context(|| format!("{}: truncated ELF header", path.display()))?;
        Ok(raw.iter().rev().fold(0u64, |n, &b| n << 8 | u64::from(b)))
    };
    let (phoff, phentsize, phnum) = (number(0x20, 8)?, number(0x36, 2)?, number(0x38, 2)?);
    for index in 0..phnum {
        let at = usize::try_from(phoff + index * phentsize)?;
        if number(at, 4)? == u64::from(PT_INTERP) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Builds `brick-target` (release) and returns its path.
pub fn build_brick_target() -> Result<PathBuf> {
    Ok(crate::util::build_release_bins(&[("brick-target-image", "brick-target")])?.remove(0))
}

impl Target {
    /// Starts the target (not yet waiting for it to serve); `probe` is the
    /// relay of the probe port, if the bed has one (a Linux reference
    /// target has none: it leaves it unconnected).
    fn spawn(
        kind: TargetKind,
        images: &Images,
        relays: &[Relay],
        probe: Option<&Relay>,
        mtu: u32,
    ) -> Result<Target> {
        match kind {
            TargetKind::LinuxReference => {
                let paths: Vec<PathAddress> = (0..relays.len()).map(path_address).collect();
                let config = target_vm("linux-target", relays, &paths, mtu);
                let bytes = REF_DISK_MIB << 20;
                let descriptor = TargetDescriptor {
                    name: kind.name().to_string(),
                    paths,
                    volumes: ["ram0", "ram1"]
                        .iter()
                        .map(|d| Volume {
                            device_path: d.to_string(),
                            bytes,
                            durable: false,
                            thin: false,
                        })
                        .collect(),
                    nvme: Some(NvmeExport {
                        nqn: "brick-ref".into(),
                        bytes,
                    }),
                    restart: Restart::Reboot,
                    probe: None,
                    admin: None,
                };
                let vm = Box::new(Vm::spawn(images, config.clone())?);
                Ok(Target {
                    descriptor,
                    runner: Runner::Vm {
                        vm: Some(vm),
                        config,
                        serve: Serve::Reference,
                    },
                })
            }
            TargetKind::BrickVerbs => Self::spawn_verbs(images, relays, probe, mtu),
            TargetKind::BrickHosted => {
                let binary = build_brick_target()?;
                let dir = crate::paths::scratch("brick-target");
                let manifest_path = judge_manifest(
                    relays.len(),
                    mtu,
                    probe.is_some(),
                    Durable::File,
                    Some(ThinPool::File),
                    &dir,
                )?;
                let (admin, admin_address) = admin_section()?;
                let mut text = std::fs::read_to_string(&manifest_path)?;
                text += &admin;
                std::fs::write(&manifest_path, text)?;
                let manifest =
                    manifest::compile_file(&manifest_path).map_err(|e| anyhow::anyhow!("{e}"))?;
                check_links(&manifest_path, manifest.interfaces.len(), relays, probe)?;
                let mut paths = Vec::new();
                for (i, interface) in manifest.interfaces.iter().take(relays.len()).enumerate() {
                    let expected = path_address(i);
                    let address = interface.address.address.to_string();
                    if address != expected.target || interface.mac.to_string() != mac(i, 1) {
                        bail!(
                            "{}: interface {i} is {address} / {}, the bed expects {} / {}",
                            manifest_path.display(),
                            interface.mac,
                            expected.target,
                            mac(i, 1)
                        );
                    }
                    paths.push(PathAddress {
                        prefix: interface.address.prefix,
                        ..expected
                    });
                }
                let volumes = manifest
                    .volumes
                    .iter()
                    .filter(|v| probe.is_none() || !PROBE_VOLUMES.contains(&v.name.as_str()))
                    .map(|v| {
                        let (bytes, durable, thin) = match &v.backing {
                            manifest::config::Backing::Ram { size } => (*size, false, false),
                            manifest::config::Backing::File {
                                size: Some(size), ..
                            } => (*size, true, false),
                            manifest::config::Backing::Thin { size, .. } => (*size, true, true),
                            other => bail!(
                                "volume {}: {other:?}: the judge serves RAM, sized files and thin volumes",
                                v.name
                            ),
                        };
                        Ok(Volume {
                            device_path: v.device_path.clone(),
                            bytes,
                            durable,
                            thin,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let descriptor = TargetDescriptor {
                    name: kind.name().to_string(),
                    paths,
                    volumes,
                    nvme: None,
                    restart: Restart::Process,
                    probe: probe.map(|_| probe_port(&manifest.limits)),
                    admin: Some(admin_address),
                };
                let mut command = vec![
                    binary.display().to_string(),
                    "--manifest".into(),
                    manifest_path.display().to_string(),
                ];
                for relay in relays.iter().chain(probe) {
                    command.push("--link".into());
                    command.push(format!("frame:connect:{}", relay.b.display()));
                }
                let log = dir.join("brick-target.log");
                let mut target = Target {
                    descriptor,
                    runner: Runner::Process {
                        child: None,
                        command,
                        log,
                        ready: None,
                        log_start: 0,
                    },
                };
                target.start_process()?;
                Ok(target)
            }
            TargetKind::BrickImage | TargetKind::BrickUefi => {
                Self::spawn_image(kind, relays, probe, mtu)
            }
        }
    }

    /// brick-target on rxe in a Linux VM: the examples/ manifest with the
    /// image's limits (the VM's memory holds its registered arenas), the
    /// release binary with every library it loads, one NIC per relay and,
    /// with `probe`, one more for the probe port (its own rxe device).
    fn spawn_verbs(
        images: &Images,
        relays: &[Relay],
        probe: Option<&Relay>,
        mtu: u32,
    ) -> Result<Target> {
        let binary = build_brick_target()?;
        let dir = crate::paths::scratch("brick-verbs");
        let manifest_path = judge_manifest(
            relays.len(),
            mtu,
            probe.is_some(),
            Durable::Block,
            None,
            &dir,
        )?;
        // The durable volume's disk: created empty here, kept across
        // restarts (a restart reboots the VM with the same disk).
        let disk = dir.join(DURABLE_FILE);
        std::fs::File::create(&disk)
            .and_then(|file| file.set_len(DURABLE_MIB << 20))
            .with_context(|| format!("create {}", disk.display()))?;
        let mut text = std::fs::read_to_string(&manifest_path)?;
        if !text.lines().any(|line| line.trim() == "[limits]") {
            text += IMAGE_LIMITS;
            std::fs::write(&manifest_path, &text)?;
        }
        let manifest =
            manifest::compile_file(&manifest_path).map_err(|e| anyhow::anyhow!("{e}"))?;
        check_links(&manifest_path, manifest.interfaces.len(), relays, probe)?;
        let links = relays.len() + usize::from(probe.is_some());
        let paths: Vec<PathAddress> = (0..relays.len()).map(path_address).collect();
        for (interface, path) in manifest.interfaces.iter().zip(&paths) {
            if interface.address.address.to_string() != path.target {
                bail!(
                    "{}: interface {} is {}, the bed expects {}",
                    manifest_path.display(),
                    interface.name,
                    interface.address.address,
                    path.target
                );
            }
        }
        let volumes = manifest
            .volumes
            .iter()
            .filter(|v| probe.is_none() || !PROBE_VOLUMES.contains(&v.name.as_str()))
            .map(|v| match &v.backing {
                manifest::config::Backing::Ram { size } => Ok(Volume {
                    device_path: v.device_path.clone(),
                    bytes: *size,
                    durable: false,
                    thin: false,
                }),
                manifest::config::Backing::Block { .. } => Ok(Volume {
                    device_path: v.device_path.clone(),
                    bytes: DURABLE_MIB << 20,
                    durable: true,
                    thin: false,
                }),
                other => bail!(
                    "volume {}: {other:?}: brick-verbs serves RAM and its disk",
                    v.name
                ),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut config = target_vm("brick-verbs-target", relays, &paths, mtu);
        // The engine's arenas and RAM volumes, as the image counts them,
        // plus the guest kernel, its initramfs and rxe.
        let blob = manifest.to_binary().map_err(|e| anyhow::anyhow!("{e}"))?;
        config.memory_mib = u32::try_from(crate::image::guest_mib(&blob) + 640).unwrap_or(4096);
        config.disks = vec![disk];
        if let Some(relay) = probe {
            config.nics.push(NicConfig {
                socket: relay.b.clone(),
                mac: PROBE_TARGET_MAC.into(),
                address: format!("{PROBE_TARGET}/{PROBE_PREFIX}"),
            });
        }
        config.extra_files = crate::vmimage::libraries(&binary)?
            .into_iter()
            .map(|lib| (PathBuf::from(&lib), lib))
            .collect();
        config
            .extra_files
            .push((binary.clone(), "/bin/brick-target".into()));
        config
            .extra_files
            .push((manifest_path.clone(), "/etc/brick/target.toml".into()));
        let descriptor = TargetDescriptor {
            name: TargetKind::BrickVerbs.name().to_string(),
            paths,
            volumes,
            nvme: None,
            restart: Restart::Reboot,
            probe: probe.map(|_| probe_port(&manifest.limits)),
            admin: None,
        };
        let vm = Box::new(Vm::spawn(images, config.clone())?);
        Ok(Target {
            descriptor,
            runner: Runner::Vm {
                vm: Some(vm),
                config,
                serve: Serve::Brick { links },
            },
        })
    }

    /// The image under QEMU: the examples/ manifest plus the durable
    /// volume on a virtio-blk disk ([`Durable::VirtioBlk`], backed by a
    /// file that survives restarts), one virtio-net NIC per relay and, with
    /// `probe`, one more for the probe port (after the path NICs, as its
    /// interface is after the path interfaces).
    fn spawn_image(
        kind: TargetKind,
        relays: &[Relay],
        probe: Option<&Relay>,
        mtu: u32,
    ) -> Result<Target> {
        let uefi = kind == TargetKind::BrickUefi;
        let dir = crate::paths::scratch(kind.name());
        let durable = if uefi {
            Durable::Nvme
        } else {
            Durable::VirtioBlk
        };
        let manifest_path =
            judge_manifest(relays.len(), mtu, probe.is_some(), durable, None, &dir)?;
        // The durable volume's disk: created empty here, kept across
        // restarts (a restart reboots QEMU with the same command).
        let disk = dir.join(DURABLE_FILE);
        std::fs::File::create(&disk)
            .and_then(|file| file.set_len(DURABLE_MIB << 20))
            .with_context(|| format!("create {}", disk.display()))?;
        let mut text = std::fs::read_to_string(&manifest_path)?;
        if !text.lines().any(|line| line.trim() == "[limits]") {
            text += IMAGE_LIMITS;
            std::fs::write(&manifest_path, &text)?;
        }
        let (config, blob, blob_path) = crate::image::compile_to_blob(&manifest_path, &dir)?;
        let manifest = manifest::binary::Manifest::parse(&blob)
            .map_err(|e| anyhow::anyhow!("{}: {e}", manifest_path.display()))?;
        check_links(&manifest_path, manifest.interface_count(), relays, probe)?;
        let mut paths = Vec::new();
        let mut nics = Vec::new();
        for ((i, interface), relay) in manifest.interfaces().enumerate().zip(relays) {
            let expected = path_address(i);
            if interface.address.address.to_string() != expected.target
                || interface.mac.to_string() != mac(i, 1)
            {
                bail!(
                    "{}: interface {i} is {interface}, the bed expects {} / {}",
                    manifest_path.display(),
                    expected.target,
                    mac(i, 1)
                );
            }
            paths.push(PathAddress {
                prefix: interface.address.prefix,
                ..expected
            });
            nics.push((relay.b.clone(), interface.mac.0));
        }
        if let Some(relay) = probe {
            let interface = manifest
                .interfaces()
                .nth(relays.len())
                .context("the probe interface is missing")?;
            if interface.address.address.to_string() != PROBE_TARGET
                || interface.mac.to_string() != PROBE_TARGET_MAC
            {
                bail!(
                    "{}: the probe interface is {interface}, the bed expects {PROBE_TARGET} / {PROBE_TARGET_MAC}",
                    manifest_path.display(),
                );
            }
            nics.push((relay.b.clone(), interface.mac.0));
        }
        let volumes = config
            .volumes
            .iter()
            .filter(|v| probe.is_none() || !PROBE_VOLUMES.contains(&v.name.as_str()))
            .map(|v| match &v.backing {
                manifest::config::Backing::Ram { size } => Ok(Volume {
                    device_path: v.device_path.clone(),
                    bytes: *size,
                    durable: false,
                    thin: false,
                }),
                manifest::config::Backing::VirtioPci(_)
                | manifest::config::Backing::NvmeSerial { .. } => Ok(Volume {
                    device_path: v.device_path.clone(),
                    bytes: DURABLE_MIB << 20,
                    durable: true,
                    thin: false,
                }),
                other => bail!(
                    "volume {}: {other:?}: the judge's image serves RAM, virtio-blk and NVMe",
                    v.name
                ),
            })
            .collect::<Result<Vec<_>>>()?;
        let descriptor = TargetDescriptor {
            name: kind.name().to_string(),
            paths,
            volumes,
            nvme: None,
            restart: Restart::Reboot,
            probe: probe.map(|_| probe_port(&config.limits)),
            admin: None,
        };
        let command = if uefi {
            // The node's boot disk (rewritten for this bed; the durable
            // namespace's file and the variable store survive restarts).
            let parts = crate::uefi::build()?;
            let boot = dir.join("node.img");
            crate::uefi::disk(&parts, &manifest_path, &boot, None)?;
            crate::uefi::qemu_command(
                &boot,
                &dir.join("vars.fd"),
                crate::image::guest_mib(&blob),
                &[crate::uefi::Nvme {
                    serial: NVME_SERIAL.into(),
                    namespaces: vec![disk],
                }],
                &nics,
            )?
        } else {
            let image = crate::image::build()?;
            crate::image::qemu_command(
                &image,
                &blob_path,
                crate::image::guest_mib(&blob),
                &[disk],
                &nics,
            )?
        };
        let mut target = Target {
            descriptor,
            runner: Runner::Process {
                child: None,
                command,
                log: dir.join(format!("{}.log", kind.name())),
                ready: Some(IMAGE_SERVING),
                log_start: 0,
            },
        };
        target.start_process()?;
        Ok(target)
    }

    fn start_process(&mut self) -> Result<()> {
        let Runner::Process {
            child,
            command,
            log,
            log_start,
            ..
        } = &mut self.runner
        else {
            bail!("not a process target")
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&*log)?;
        *log_start = file.metadata()?.len();
        let spawned = Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", command[0]))?;
        *child = Some(spawned);
        Ok(())
    }

    /// Waits until the target serves its volumes (a process target: until
    /// every link of `relays`, paths and probe port, is connected).
    fn wait_serving(&mut self, relays: &[&Relay]) -> Result<()> {
        match &mut self.runner {
            Runner::Vm { vm, serve, .. } => {
                let Some(vm) = vm.as_mut() else {
                    bail!("target is not running")
                };
                vm.wait_ready()?;
                if let Serve::Brick { links } = *serve {
                    vm.run(&format!("serve_brick {links}\n"), Duration::from_secs(90))?;
                    return Ok(());
                }
                let mut script = format!("serve_rnbd 3 {REF_DISK_MIB}\n");
                if let Some(nvme) = &self.descriptor.nvme {
                    script += &format!(
                        "serve_nvmet /dev/ram2 {} {}\n",
                        nvme.nqn, self.descriptor.paths[0].target
                    );
                }
                vm.run(&script, Duration::from_secs(60))?;
                Ok(())
            }
            Runner::Process {
                child,
                log,
                ready,
                log_start,
                ..
            } => {
                // Serving once every link is up on the relay (and, for the
                // image, once it says so: QEMU connects before it boots).
                let seconds = if ready.is_some() { 120 } else { 30 };
                let deadline = Instant::now() + Duration::from_secs(seconds);
                let since_start = |log: &PathBuf| {
                    let bytes = std::fs::read(log).unwrap_or_default();
                    let start = usize::try_from(*log_start).unwrap_or(0).min(bytes.len());
                    String::from_utf8_lossy(&bytes[start..]).into_owned()
                };
                loop {
                    if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                        let text = since_start(log);
                        bail!("{} exited ({status}):\n{text}", self.descriptor.name);
                    }
                    if relays.iter().all(|r| r.side(1).0)
                        && ready.is_none_or(|marker| since_start(log).contains(marker))
                    {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        let text = since_start(log);
                        bail!(
                            "{} did not serve on its links in {seconds} s:\n{text}",
                            self.descriptor.name
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Restarts the target; its volumes come back empty (RAM) or intact
    /// (durable backends), and its NICs reconnect through the relays.
    pub fn restart(&mut self, images: &Images, relays: &[&Relay]) -> Result<()> {
        match &mut self.runner {
            Runner::Vm { vm, config, .. } => {
                *vm = None; // kills QEMU
                *vm = Some(Box::new(Vm::spawn(images, config.clone())?));
            }
            Runner::Process { child, .. } => {
                if let Some(mut old) = child.take() {
                    let _ = old.kill();
                    let _ = old.wait();
                }
                // The relay notices the old links closing before the new ones arrive.
                std::thread::sleep(Duration::from_millis(200));
                self.start_process()?;
            }
        }
        self.wait_serving(relays)
    }

    /// Whether [`Target::run`] works (a Linux target VM).
    pub fn runs_scripts(&self) -> bool {
        matches!(self.runner, Runner::Vm { vm: Some(_), .. })
    }

    /// Runs a script on the target (Linux reference target only).
    pub fn run(&mut self, script: &str) -> Result<String> {
        match &mut self.runner {
            Runner::Vm { vm: Some(vm), .. } => vm.run(script, Duration::from_secs(120)),
            _ => bail!("{} runs no scripts", self.descriptor.name),
        }
    }

    /// Console and dmesg (VM) or the log (process), for failure reports.
    pub fn diagnostics(&mut self) -> String {
        match &mut self.runner {
            Runner::Vm {
                vm: Some(vm),
                serve,
                ..
            } => {
                let mut text = format!("{:#}", vm.failure("target state at failure"));
                if matches!(serve, Serve::Brick { .. }) {
                    let log = vm
                        .run("cat /tmp/brick-target.log", Duration::from_secs(20))
                        .unwrap_or_else(|e| format!("(no log: {e:#})"));
                    text += &format!("\n--- brick-target log in the VM ---\n{log}");
                }
                text
            }
            Runner::Vm { vm: None, .. } => "target not running".into(),
            Runner::Process { log, .. } => {
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(80).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "--- {} log (last 80 lines) ---\n{}",
                    self.descriptor.name,
                    tail.join("\n")
                )
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Runner::Process {
            child: Some(child), ..
        } = &mut self.runner
        {
            // SIGTERM first: the target prints its statistics on the way out.
            // SAFETY: kill(2) on a child pid we own; no memory is involved.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {

    /// A dynamically linked executable (this test binary) names an
    /// interpreter; an ELF64 header with no program headers names none;
    /// a text file is refused.
    #[test]
    fn elf_interpreter_tells_static_from_dynamic() {
        let own = std::env::current_exe().unwrap();
        assert!(
            elf_interpreter(&own).unwrap(),
            "{} is dynamic",
            own.display()
        );
        let dir = crate::paths::scratch("elf-test");
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2; // ELF64
        header[0x20] = 64; // e_phoff
        header[0x36] = 56; // e_phentsize, e_phnum = 0
        let bare = dir.join("bare");
        std::fs::write(&bare, &header).unwrap();
        assert!(!elf_interpreter(&bare).unwrap());
        let text = dir.join("text");
        std::fs::write(&text, "not an executable").unwrap();
        assert!(elf_interpreter(&text).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    use super::*;
    use manifest::binary::Manifest;
    use manifest::AccessMode;
    use std::net::Ipv4Addr;

    /// The probe port's manifest compiles (hosted and image backings of
    /// the durable volume); the initiator keeps its access on every path,
    /// probe sessions reach only the probe volumes, and the refused name
    /// reaches nothing.
    #[test]
    fn probe_manifest_keeps_the_initiator_access() {
        for (paths, durable) in [
            (1, Durable::File),
            (2, Durable::File),
            (1, Durable::VirtioBlk),
            (2, Durable::VirtioBlk),
        ] {
            let dir = crate::paths::scratch("probe-manifest");
            let path = judge_manifest(paths, 1500, true, durable, None, &dir).unwrap();
            let config = manifest::compile_file(&path).unwrap();
            assert_eq!(config.interfaces.len(), paths + 1);
            assert_eq!(config.interfaces[paths].name, PROBE_INTERFACE);
            assert_eq!(config.limits.max_sessions, PROBE_MAX_SESSIONS);
            assert_eq!(config.limits.queue_depth, PROBE_QUEUE_DEPTH);
            let plain = judge_manifest(paths, 1500, false, durable, None, &dir).unwrap();
            let plain = manifest::compile_file(&plain).unwrap();
            let blob = config.to_binary().unwrap();
            let probed = Manifest::parse(&blob).unwrap();
            let plain_blob = plain.to_binary().unwrap();
            let plain = Manifest::parse(&plain_blob).unwrap();
            let index = |m: &Manifest<'_>, name: &str| m.volume_by_name(name).unwrap().0;
            let probe: Ipv4Addr = PROBE_LOCAL.parse().unwrap();
            for volume in plain.volumes() {
                for i in 0..paths {
                    let initiator: Ipv4Addr = path_address(i).initiator.parse().unwrap();
                    assert_eq!(
                        probed.access("s1", initiator, index(&probed, volume.name)),
                        plain.access("s1", initiator, index(&plain, volume.name)),
                        "{} from {initiator}",
                        volume.name
                    );
                }
                assert_eq!(
                    probed.access("probe-x", probe, index(&probed, volume.name)),
                    None
                );
            }
            for volume in PROBE_VOLUMES {
                let i = index(&probed, volume);
                assert_eq!(probed.access(PROBE_REFUSED, probe, i), None);
                let initiator: Ipv4Addr = path_address(0).initiator.parse().unwrap();
                assert_eq!(probed.access("s1", initiator, i), None);
            }
            let ro = index(&probed, PROBE_RO_VOLUME);
            let rw = index(&probed, PROBE_RW_VOLUME);
            assert_eq!(
                probed.access("probe-x", probe, ro),
                Some(AccessMode::ReadOnly)
            );
            assert_eq!(
                probed.access("probe-x", probe, rw),
                Some(AccessMode::ReadWrite)
            );
            assert!(!probed.admits(PROBE_REFUSED, probe));
            // The healthy client's volume is its session's alone.
            let healthy = index(&probed, PROBE_HEALTHY_VOLUME);
            assert_eq!(
                probed.access(PROBE_HEALTHY_SESSION, probe, healthy),
                Some(AccessMode::ReadWrite)
            );
            assert_eq!(probed.access("probe-x", probe, healthy), None);
            // Pinned sessions: from the probe's /25, not from the outsider.
            let pinned = format!("{PROBE_PINNED}-x");
            let outsider: Ipv4Addr = PROBE_OUTSIDER.parse().unwrap();
            assert!(probed.admits(&pinned, probe));
            assert!(!probed.admits(&pinned, outsider));
            assert_eq!(
                probed.access(&pinned, probe, rw),
                Some(AccessMode::ReadWrite)
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
