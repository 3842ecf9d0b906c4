//! The binary writer (`std` only): [`encode`] a [`Config`] in the current
//! or an older format version, read back before it is returned, and
//! [`fix_checksum`] for tests that patch a blob.

use super::{
    admin, field, reader::checksum, section, Manifest, ReadError, ADMIN_VERSION, FORMAT_VERSION,
    HEADER_LEN, MAGIC, MIN_FORMAT_VERSION, POOLS_VERSION, RULE_ALL_VOLUMES, RULE_HAS_SOURCE,
    SECTION_ENTRY_LEN, SELECTOR_NONE, SELECTOR_PCI, SELECTOR_SERIAL, SHORT_LIMITS_VERSION,
    TARGET_ALWAYS_INVALIDATE, TARGET_HAS_UUID,
};
use crate::config::{Backing as OwnedBacking, Config, PoolBacking as OwnedPoolBacking, VolumeSet};
use crate::types::VolumeKind;

struct Strings {
    bytes: Vec<u8>,
}

impl Strings {
    fn add(&mut self, text: &str) -> [u8; 8] {
        if text.is_empty() {
            return [0; 8];
        }
        let offset = self.bytes.len() as u32;
        self.bytes.extend_from_slice(text.as_bytes());
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&offset.to_le_bytes());
        out[4..].copy_from_slice(&(text.len() as u32).to_le_bytes());
        out
    }
}

/// Writes `config` in the binary form, then reads it back with
/// [`Manifest::parse`], so a blob this returns always boots.
///
/// # Errors
///
/// What the reader refuses (only possible for a [`Config`] built by
/// hand; the TOML compiler checks the same rules with better messages).
pub fn encode(config: &Config) -> Result<Vec<u8>, ReadError> {
    encode_version(config, FORMAT_VERSION)
}

/// [`encode`] in format `version` ([`MIN_FORMAT_VERSION`]..=
/// [`FORMAT_VERSION`]), for targets that read only older formats:
/// up to version 2 the limits record has no half-open limits or setup
/// timeout (the reader takes their defaults), version 1 no NVMe
/// volumes (refused by the read-back).
///
/// # Errors
///
/// [`ReadError::UnsupportedVersion`] for another version; what the
/// reader refuses.
pub fn encode_version(config: &Config, version: u16) -> Result<Vec<u8>, ReadError> {
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(ReadError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let mut strings = Strings { bytes: Vec::new() };
    let mut sections: Vec<(u16, Vec<u8>)> = Vec::new();

    let mut target = Vec::with_capacity(32);
    target.extend_from_slice(&strings.add(&config.target.name));
    target.extend_from_slice(&config.target.uuid.unwrap_or([0; 16]));
    target.extend_from_slice(&config.target.port.to_le_bytes());
    let mut flags = 0u16;
    if config.target.uuid.is_some() {
        flags |= TARGET_HAS_UUID;
    }
    if config.target.always_invalidate {
        flags |= TARGET_ALWAYS_INVALIDATE;
    }
    target.extend_from_slice(&flags.to_le_bytes());
    target.extend_from_slice(&[0; 4]);
    sections.push((section::TARGET, target));

    let l = &config.limits;
    let mut limits = Vec::with_capacity(28);
    limits.extend_from_slice(&l.max_sessions.to_le_bytes());
    limits.extend_from_slice(&l.max_paths_per_session.to_le_bytes());
    limits.extend_from_slice(&l.max_connections_per_path.to_le_bytes());
    limits.extend_from_slice(&l.queue_depth.to_le_bytes());
    limits.extend_from_slice(&[0; 2]);
    limits.extend_from_slice(&l.chunk_size.to_le_bytes());
    if version > SHORT_LIMITS_VERSION {
        limits.extend_from_slice(&l.max_half_open.to_le_bytes());
        limits.extend_from_slice(&l.setup_timeout_ms.to_le_bytes());
        limits.extend_from_slice(&l.max_half_open_per_source.to_le_bytes());
        limits.extend_from_slice(&[0; 2]);
    }
    sections.push((section::LIMITS, limits));

    let mut interfaces = Vec::new();
    for i in &config.interfaces {
        interfaces.extend_from_slice(&strings.add(&i.name));
        interfaces.extend_from_slice(&i.address.address.octets());
        interfaces.extend_from_slice(&i.mac.0);
        interfaces.push(i.address.prefix);
        interfaces.push(0);
        interfaces.extend_from_slice(&i.mtu.to_le_bytes());
        interfaces.extend_from_slice(&[0; 2]);
    }
    sections.push((section::INTERFACES, interfaces));

    if version >= POOLS_VERSION {
        let mut pools = Vec::new();
        for p in &config.pools {
            pools.extend_from_slice(&strings.add(&p.name));
            // Selector, namespace and PCI address as a volume's
            // (device pools; zero for files and block devices).
            let (path, size, kind, selector, namespace, pci) = match &p.backing {
                OwnedPoolBacking::File { path, size } => {
                    (path.as_str(), size.unwrap_or(0), VolumeKind::File, 0, 0, 0)
                }
                OwnedPoolBacking::Block { path } => (path.as_str(), 0, VolumeKind::Block, 0, 0, 0),
                OwnedPoolBacking::VirtioPci(pci) => (
                    "",
                    0,
                    VolumeKind::VirtioBlk,
                    SELECTOR_PCI,
                    0u16,
                    pci.to_u32(),
                ),
                OwnedPoolBacking::VirtioSerial(serial) => (
                    serial.as_str(),
                    0,
                    VolumeKind::VirtioBlk,
                    SELECTOR_SERIAL,
                    0,
                    0,
                ),
                // Out of range encodes as 0, which the read-back refuses.
                OwnedPoolBacking::NvmePci { pci, namespace } => (
                    "",
                    0,
                    VolumeKind::Nvme,
                    SELECTOR_PCI,
                    u16::try_from(*namespace).unwrap_or(0),
                    pci.to_u32(),
                ),
                OwnedPoolBacking::NvmeSerial { serial, namespace } => (
                    serial.as_str(),
                    0,
                    VolumeKind::Nvme,
                    SELECTOR_SERIAL,
                    u16::try_from(*namespace).unwrap_or(0),
                    0,
                ),
            };
            pools.extend_from_slice(&strings.add(path));
            pools.extend_from_slice(&size.to_le_bytes());
            pools.push(kind.code());
            pools.push(selector);
            pools.extend_from_slice(&namespace.to_le_bytes());
            pools.extend_from_slice(&pci.to_le_bytes());
        }
        sections.push((section::POOLS, pools));
    } else if !config.pools.is_empty() {
        return Err(ReadError::BadCount {
            section: section::name(section::POOLS),
            count: config.pools.len() as u32,
            min: 0,
            max: 0,
        });
    }

    let mut volumes = Vec::new();
    for v in &config.volumes {
        volumes.extend_from_slice(&strings.add(&v.name));
        volumes.extend_from_slice(&strings.add(&v.device_path));
        let mut namespace = 0u16;
        let (backing, size, selector, pci) = match &v.backing {
            OwnedBacking::Ram { size } => ("", *size, SELECTOR_NONE, 0),
            OwnedBacking::NvmePci { pci, namespace: n } => {
                // Out of range encodes as 0, which the read-back refuses.
                namespace = u16::try_from(*n).unwrap_or(0);
                ("", 0, SELECTOR_PCI, pci.to_u32())
            }
            OwnedBacking::NvmeSerial {
                serial,
                namespace: n,
            } => {
                namespace = u16::try_from(*n).unwrap_or(0);
                (serial.as_str(), 0, SELECTOR_SERIAL, 0)
            }
            OwnedBacking::File { path, size } => {
                (path.as_str(), size.unwrap_or(0), SELECTOR_NONE, 0)
            }
            OwnedBacking::Block { path } => (path.as_str(), 0, SELECTOR_NONE, 0),
            OwnedBacking::VirtioPci(address) => ("", 0, SELECTOR_PCI, address.to_u32()),
            OwnedBacking::VirtioSerial(serial) => (serial.as_str(), 0, SELECTOR_SERIAL, 0),
            OwnedBacking::Thin { pool, size } => (pool.as_str(), *size, SELECTOR_NONE, 0),
        };
        volumes.extend_from_slice(&strings.add(backing));
        volumes.extend_from_slice(&size.to_le_bytes());
        volumes.push(v.backing.kind().code());
        volumes.push(selector);
        volumes.extend_from_slice(&namespace.to_le_bytes());
        volumes.extend_from_slice(&pci.to_le_bytes());
    }
    sections.push((section::VOLUMES, volumes));

    let mut rules = Vec::new();
    let mut rule_volumes: Vec<u8> = Vec::new();
    for rule in &config.access {
        rules.extend_from_slice(&strings.add(&rule.sessions));
        let mut flags = 0u8;
        match rule.source {
            Some(source) => {
                flags |= RULE_HAS_SOURCE;
                rules.extend_from_slice(&source.address.octets());
                rules.push(source.prefix);
            }
            None => rules.extend_from_slice(&[0; 5]),
        }
        let (first, count) = match &rule.volumes {
            VolumeSet::All => {
                flags |= RULE_ALL_VOLUMES;
                (0, 0)
            }
            VolumeSet::Only(names) => {
                let first = rule_volumes.len() / 2;
                for name in names {
                    // An unknown name encodes as an out-of-range index,
                    // which the read-back refuses.
                    let index = config
                        .volumes
                        .iter()
                        .position(|v| &v.name == name)
                        .unwrap_or(usize::from(u16::MAX));
                    rule_volumes.extend_from_slice(&(index as u16).to_le_bytes());
                }
                (first as u32, names.len() as u32)
            }
        };
        rules.push(flags);
        rules.push(rule.mode.code());
        rules.push(0);
        rules.extend_from_slice(&first.to_le_bytes());
        rules.extend_from_slice(&count.to_le_bytes());
    }
    sections.push((section::ACCESS_RULES, rules));
    sections.push((section::ACCESS_VOLUMES, rule_volumes));
    sections.push((section::STRINGS, strings.bytes));
    if version >= ADMIN_VERSION {
        let admin = config.admin.as_ref().map(admin::encode);
        sections.push((section::ADMIN, admin.map_or(Vec::new(), |r| r.to_vec())));
    } else if config.admin.is_some() {
        return Err(ReadError::BadCount {
            section: section::name(section::ADMIN),
            count: 1,
            min: 0,
            max: 0,
        });
    }

    let mut blob = vec![0u8; HEADER_LEN + sections.len() * SECTION_ENTRY_LEN];
    blob[field::MAGIC].copy_from_slice(&MAGIC);
    blob[field::VERSION].copy_from_slice(&version.to_le_bytes());
    blob[field::SECTION_COUNT].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    for (n, (id, body)) in sections.iter().enumerate() {
        let record_len = section::record_len_in(*id, version).unwrap_or(1);
        let entry = HEADER_LEN + n * SECTION_ENTRY_LEN;
        let offset = blob.len() as u32;
        blob[entry..entry + 2].copy_from_slice(&id.to_le_bytes());
        blob[entry + 2..entry + 4].copy_from_slice(&record_len.to_le_bytes());
        let count = (body.len() / usize::from(record_len)) as u32;
        blob[entry + 4..entry + 8].copy_from_slice(&count.to_le_bytes());
        blob[entry + 8..entry + 12].copy_from_slice(&offset.to_le_bytes());
        blob.extend_from_slice(body);
    }
    let total = blob.len() as u32;
    blob[field::TOTAL_LEN].copy_from_slice(&total.to_le_bytes());
    let crc = checksum(&blob);
    blob[field::CRC].copy_from_slice(&crc.to_le_bytes());
    Manifest::parse(&blob)?;
    Ok(blob)
}

/// Recomputes the CRC of a blob in place (for tests that patch fields).
pub fn fix_checksum(blob: &mut [u8]) {
    if blob.len() >= field::CRC.end {
        let crc = checksum(blob);
        blob[field::CRC].copy_from_slice(&crc.to_le_bytes());
    }
}
