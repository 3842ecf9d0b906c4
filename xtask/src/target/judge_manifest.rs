//! The manifests the judge gives Brick targets: the examples/ manifest
//! for the bed's paths and MTU, plus a durable volume, a thin volume on
//! its own pool, and with a probe port the probe's interface, volumes,
//! sessions and limits (every other access rule narrowed to the
//! initiator's subnets).

use super::{path_address, ProbePort};
use anyhow::{Context, Result};
use std::path::PathBuf;

/// The target's probe interface (the path subnets are 10.77.0.0/24 up).
pub(super) const PROBE_INTERFACE: &str = "probe0";
pub(super) const PROBE_TARGET_MAC: &str = "52:54:00:99:00:01";
pub(super) const PROBE_TARGET: &str = "10.99.0.1";
pub(super) const PROBE_PREFIX: u8 = 24;
pub(super) const PROBE_LOCAL: &str = "10.99.0.2";
pub(super) const PROBE_LOCAL_MAC: &str = "52:54:00:99:00:02";
/// The probe's sessions, volumes and the name the access list refuses.
pub(super) const PROBE_SESSIONS: &str = "probe";
pub(super) const PROBE_REFUSED: &str = "denied-probe";
pub(super) const PROBE_RO_VOLUME: &str = "probe-ro";
pub(super) const PROBE_RW_VOLUME: &str = "probe-rw";
/// The probe's healthy client: its own volume, for session `probe-healthy`.
pub(super) const PROBE_HEALTHY_VOLUME: &str = "probe-healthy";
pub(super) const PROBE_HEALTHY_SESSION: &str = "probe-healthy";
/// The probe volumes (kept out of the descriptor's volumes).
pub(super) const PROBE_VOLUMES: [&str; 3] =
    [PROBE_RO_VOLUME, PROBE_RW_VOLUME, PROBE_HEALTHY_VOLUME];
/// Sessions `pinned-probe-*` may open `probe-rw` from the probe's first
/// /25 only: a second path from `PROBE_OUTSIDER` is refused at INFO_REQ.
pub(super) const PROBE_PINNED: &str = "pinned-probe";
pub(super) const PROBE_PINNED_SOURCE: &str = "10.99.0.0/25";
pub(super) const PROBE_OUTSIDER: &str = "10.99.0.200";
/// The engine's RTRS half-open limits and setup deadline: no manifest key
/// sets them, the target runs with `rtrs::server::ServerConfig`'s defaults.
pub(super) const PROBE_MAX_HALF_OPEN: u16 = 16;
pub(super) const PROBE_MAX_HALF_OPEN_PER_SOURCE: u16 = 4;
pub(super) const PROBE_SETUP_TIMEOUT_MS: u64 = 5000;
/// Limits of a bed with a probe port: few sessions, so the probe reaches
/// `max_sessions` in a few connects while the Linux client holds one (it
/// needs one per mapped session, and never a new one while the probe
/// holds the rest); a queue depth that is not a power of two, so a chunk id
/// beyond it fits the IO_REQ immediate (rtrs.md §4.2).
pub(super) const PROBE_MAX_SESSIONS: u32 = 4;
pub(super) const PROBE_QUEUE_DEPTH: u16 = 384;

/// The examples/ manifest the hosted Brick target serves with `paths`
/// paths.
pub(super) fn brick_manifest(paths: usize) -> PathBuf {
    let name = if paths > 1 {
        "multipath.toml"
    } else {
        "two-ram-volumes.toml"
    };
    crate::paths::repo().join("examples").join(name)
}

/// Size of the judge's durable volume.
pub(super) const DURABLE_MIB: u64 = 64;
/// The durable volume's file in the target's scratch directory.
pub(super) const DURABLE_FILE: &str = "durable.img";

/// What backs the judge's durable volume `durable` (see [`judge_manifest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durable {
    /// No durable volume.
    None,
    /// A file the hosted target opens (`durable.img`, created by it).
    File,
    /// The image's first virtio-blk disk ([`crate::image::disk_pci`]`(0)`),
    /// which the caller backs with `durable.img`.
    VirtioBlk,
    /// Namespace 1 of the NVMe controller [`NVME_SERIAL`], which the
    /// caller backs with `durable.img`.
    Nvme,
    /// A Linux VM's first virtio disk as a block device (`/dev/vda`),
    /// which the caller backs with `durable.img` (brick-verbs).
    Block,
}

/// What backs the judge's thin pool (see [`thin_volume`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ThinPool {
    /// A file the hosted target creates (`thin-pool.img`).
    File,
}

/// The judge's thin pool: 128 MiB, 2 MiB extents.
pub(super) const THIN_POOL_MIB: u64 = 128;
/// The judge's thin volume: 512 MiB virtual on the 128 MiB pool
/// (overcommitted four times, as thin pools are).
pub(super) const THIN_VOLUME_MIB: u64 = 512;
/// Its name (and device path).
pub const THIN_VOLUME: &str = "thin";
/// The thin pool's file in the target's scratch directory.
pub(super) const THIN_POOL_FILE: &str = "thin-pool.img";

/// The manifest text of the judge's thin pool and volume [`THIN_VOLUME`],
/// which every session may map read-write; a fresh pool file in `dir`.
pub(super) fn thin_volume(pool: ThinPool, dir: &std::path::Path) -> String {
    let backing = match pool {
        ThinPool::File => {
            let file = dir.join(THIN_POOL_FILE);
            let _ = std::fs::remove_file(&file);
            format!(
                "kind = \"file\"\npath = \"{}\"\nsize = \"{THIN_POOL_MIB}MiB\"\n",
                file.display()
            )
        }
    };
    format!(
        "\n# Added by the judge: a thin volume on its own pool (thin_fstrim).\n\
         [[pools]]\nname = \"judge-pool\"\n{backing}\n\
         [[volumes]]\nname = \"{THIN_VOLUME}\"\nkind = \"thin\"\npool = \"judge-pool\"\nsize = \"{THIN_VOLUME_MIB}MiB\"\n\n\
         [[access]]\nsessions = \"*\"\nvolumes = [\"{THIN_VOLUME}\"]\nmode = \"rw\"\n"
    )
}

/// An `[admin]` section on a free loopback port that only loopback may
/// reach; returns it and the address.
pub(super) fn admin_section() -> Result<(String, String)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("find a free admin port")?;
    let address = listener.local_addr()?.to_string();
    drop(listener);
    Ok((
        format!(
            "\n# Added by the judge: the admin endpoint.\n\
             [admin]\naddress = \"{address}\"\nsources = [\"127.0.0.1\"]\n"
        ),
        address,
    ))
}

/// The serial of the brick-uefi target's NVMe controller.
pub(super) const NVME_SERIAL: &str = "brick-nvme0";

/// Writes the judge's manifest into `dir`: the examples/ manifest for
/// `paths` paths, its interfaces at `mtu`, plus a file-backed volume
/// `durable` (a fresh file in `dir`) that every session may map
/// read-write (unless `durable` is false). Returns its path.
///
/// With `probe`, the target also gets the probe port ([`ProbePort`]): an
/// interface `probe0` after the path interfaces, two 1 MiB RAM volumes
/// `probe-ro` and `probe-rw` that sessions named `probe-*` may open
/// read-only and read-write, a third, `probe-healthy`, for the probe's
/// healthy client (session `probe-healthy`) alone, `probe-rw` for sessions
/// `pinned-probe-*` from 10.99.0.0/25 only, and the probe limits (see
/// [`PROBE_MAX_SESSIONS`]). Every other access rule is narrowed to the
/// initiator's path subnets (one copy per path), so the initiator keeps
/// exactly its access, probe sessions reach only the probe volumes, and any
/// other name from the probe link (`denied-probe`) is refused.
pub(super) fn judge_manifest(
    paths: usize,
    mtu: u32,
    probe: bool,
    durable: Durable,
    thin: Option<ThinPool>,
    dir: &std::path::Path,
) -> Result<PathBuf> {
    let example = brick_manifest(paths);
    let original =
        std::fs::read_to_string(&example).with_context(|| format!("read {}", example.display()))?;
    let original = crate::util::manifest_at_mtu(&original, mtu);
    let image = dir.join(DURABLE_FILE);
    let _ = std::fs::remove_file(&image);
    let backing = match durable {
        Durable::None => String::new(),
        Durable::File => format!(
            "kind = \"file\"\npath = \"{}\"\nsize = \"{DURABLE_MIB}MiB\"\n",
            image.display()
        ),
        Durable::VirtioBlk => format!(
            "kind = \"virtio-blk\"\npci = \"{}\"\n",
            crate::image::disk_pci(0)
        ),
        Durable::Nvme => format!("kind = \"nvme\"\nserial = \"{NVME_SERIAL}\"\nnamespace = 1\n"),
        Durable::Block => "kind = \"block\"\npath = \"/dev/vda\"\n".to_string(),
    };
    let durable_volume = format!(
        "\n# Added by the judge: a durable volume for the restart cases.\n\
         [[volumes]]\nname = \"durable\"\n{backing}\n\
         [[access]]\nsessions = \"*\"\nvolumes = [\"durable\"]\nmode = \"rw\"\n"
    );
    let mut text = String::new();
    let mut limits_seen = false;
    for line in original.lines() {
        if probe && (line.starts_with("max_sessions") || line.starts_with("queue_depth")) {
            continue;
        }
        text += line;
        text += "\n";
        if probe && line.trim() == "[limits]" {
            limits_seen = true;
            text += &probe_limits();
        }
    }
    if durable != Durable::None {
        text += &durable_volume;
    }
    if let Some(pool) = thin {
        text += &thin_volume(pool, dir);
    }
    if probe {
        text = narrow_access(&text, paths);
        if !limits_seen {
            text += &format!("\n[limits]\n{}", probe_limits());
        }
        text += &format!(
            "\n# Added by the judge: the probe port (hostile_probe).\n\
             [[interfaces]]\nname = \"{PROBE_INTERFACE}\"\nmac = \"{PROBE_TARGET_MAC}\"\n\
             address = \"{PROBE_TARGET}/{PROBE_PREFIX}\"\nmtu = {mtu}\n\n\
             [[volumes]]\nname = \"{PROBE_RO_VOLUME}\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
             [[volumes]]\nname = \"{PROBE_RW_VOLUME}\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
             [[access]]\nsessions = \"{PROBE_SESSIONS}-*\"\nvolumes = [\"{PROBE_RO_VOLUME}\"]\nmode = \"ro\"\n\n\
             [[access]]\nsessions = \"{PROBE_SESSIONS}-*\"\nvolumes = [\"{PROBE_RW_VOLUME}\"]\nmode = \"rw\"\n\n\
             [[volumes]]\nname = \"{PROBE_HEALTHY_VOLUME}\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
             [[access]]\nsessions = \"{PROBE_HEALTHY_SESSION}\"\nvolumes = [\"{PROBE_HEALTHY_VOLUME}\"]\nmode = \"rw\"\n\n\
             [[access]]\nsessions = \"{PROBE_PINNED}-*\"\nsource = \"{PROBE_PINNED_SOURCE}\"\nvolumes = [\"{PROBE_RW_VOLUME}\"]\nmode = \"rw\"\n"
        );
    }
    let path = dir.join("judge.toml");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// What `hostile_probe` is told about a target serving the probe port
/// with `limits`.
pub(super) fn probe_port(limits: &manifest::Limits) -> ProbePort {
    ProbePort {
        target: PROBE_TARGET.into(),
        local: format!("{PROBE_LOCAL}/{PROBE_PREFIX}"),
        mac: PROBE_LOCAL_MAC.into(),
        session_prefix: PROBE_SESSIONS.into(),
        refused_session: PROBE_REFUSED.into(),
        ro_volume: PROBE_RO_VOLUME.into(),
        rw_volume: PROBE_RW_VOLUME.into(),
        max_connections: limits.max_connections_per_path,
        max_sessions: limits.max_sessions,
        healthy_volume: PROBE_HEALTHY_VOLUME.into(),
        pinned_prefix: PROBE_PINNED.into(),
        outsider: PROBE_OUTSIDER.into(),
        max_half_open: PROBE_MAX_HALF_OPEN,
        max_half_open_per_source: PROBE_MAX_HALF_OPEN_PER_SOURCE,
        setup_timeout_ms: PROBE_SETUP_TIMEOUT_MS,
    }
}

/// The `[limits]` keys of a bed with a probe port.
pub(super) fn probe_limits() -> String {
    format!("max_sessions = {PROBE_MAX_SESSIONS}\nqueue_depth = {PROBE_QUEUE_DEPTH}\n")
}

/// `text` with each `[[access]]` table repeated once per path, restricted
/// to that path's initiator subnet (`source`), and `volumes = "*"` spelled
/// out as the volumes of `text` (so volumes added later are not covered).
/// Tables are delimited by the next `[` header or the end.
pub(super) fn narrow_access(text: &str, paths: usize) -> String {
    let mut volumes = Vec::new();
    let mut table = "";
    for line in text.lines() {
        if line.starts_with('[') {
            table = line.trim();
        } else if let ("[[volumes]]", Some(("name", value))) = (
            table,
            line.split_once('=').map(|(k, v)| (k.trim(), v.trim())),
        ) {
            volumes.push(value.to_string());
        }
    }
    let every_volume = format!("volumes = [{}]", volumes.join(", "));
    let mut out = String::new();
    let mut rule: Option<Vec<&str>> = None;
    let flush = |rule: &mut Option<Vec<&str>>, out: &mut String| {
        if let Some(lines) = rule.take() {
            for i in 0..paths {
                let subnet = path_address(i);
                let network = subnet.initiator.rsplit_once('.').map_or("", |(net, _)| net);
                *out += "[[access]]\n";
                *out += &format!("source = \"{network}.0/{}\"\n", subnet.prefix);
                for line in lines.iter().skip(1).filter(|l| !l.trim().is_empty()) {
                    let spaced: String = line.split_whitespace().collect();
                    if spaced == "volumes=\"*\"" {
                        *out += &every_volume;
                    } else {
                        *out += line;
                    }
                    *out += "\n";
                }
                *out += "\n";
            }
        }
    };
    for line in text.lines() {
        if line.starts_with('[') {
            flush(&mut rule, &mut out);
            if line.trim() == "[[access]]" {
                rule = Some(vec![line]);
                continue;
            }
        }
        match rule.as_mut() {
            Some(lines) => lines.push(line),
            None => {
                out += line;
                out += "\n";
            }
        }
    }
    flush(&mut rule, &mut out);
    out
}
