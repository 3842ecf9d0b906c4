//! The owned, typed manifest (std): what the TOML compiler produces.
//!
//! A [`Config`] from [`crate::compile()`] has passed every rule; one built by
//! hand is checked when encoded ([`Config::to_binary`]). [`Config::from_manifest`]
//! turns a checked binary [`Manifest`] back into a `Config`, which is how the
//! round-trip tests compare the two forms, and `Display` prints the config
//! as canonical TOML (the `brick manifest check` output).

use std::fmt;

use crate::binary::{self, Manifest, ReadError, RuleVolumes};
use crate::types::{
    AccessMode, Ipv4Cidr, Limits, MacAddress, PciAddress, Size, VirtioSelector, VolumeKind,
};

/// A whole, validated manifest.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Config {
    /// Target identity and switches.
    pub target: Target,
    /// Network interfaces, in order (the hosted target pairs them with `--link`s).
    pub interfaces: Vec<Interface>,
    /// Thin pools, in order (thin volumes name them).
    pub pools: Vec<Pool>,
    /// Volumes, in order.
    pub volumes: Vec<Volume>,
    /// The access list: who may open what.
    pub access: Vec<AccessRule>,
    /// Sessions, connections and chunk geometry.
    pub limits: Limits,
    /// The admin endpoint (hosted target), if any.
    pub admin: Option<binary::Admin>,
}

/// Target identity and switches.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Target {
    /// The target's name.
    pub name: String,
    /// An optional UUID.
    pub uuid: Option<[u8; 16]>,
    /// The RDMA CM listen port (default 1234).
    pub port: u16,
    /// Fresh rkey per chunk after every IO (default true).
    pub always_invalidate: bool,
}

/// A network interface.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its MAC.
    pub mac: MacAddress,
    /// Its address and prefix.
    pub address: Ipv4Cidr,
    /// Its MTU.
    pub mtu: u16,
}

/// Where a volume's blocks live.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Backing {
    /// RAM of this many bytes.
    Ram {
        /// Bytes.
        size: u64,
    },
    /// A file (hosted), optionally of a given size.
    File {
        /// Absolute path.
        path: String,
        /// Bytes, or the file's own size.
        size: Option<u64>,
    },
    /// A whole host block device (hosted).
    Block {
        /// Absolute path.
        path: String,
    },
    /// A virtio-blk device by PCI slot (image).
    VirtioPci(PciAddress),
    /// A virtio-blk device by serial (image).
    VirtioSerial(String),
    /// A namespace of the NVMe controller at a PCI address (image).
    NvmePci {
        /// The controller.
        pci: PciAddress,
        /// The namespace id.
        namespace: u32,
    },
    /// A namespace of the NVMe controller with this serial (image).
    NvmeSerial {
        /// The controller's serial (Identify Controller SN).
        serial: String,
        /// The namespace id.
        namespace: u32,
    },
    /// A thin volume on a pool's extents (hosted).
    Thin {
        /// The pool's name.
        pool: String,
        /// Virtual bytes (may exceed the pool).
        size: u64,
    },
}

/// A thin pool: the file or block device whose extents its thin volumes
/// share.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Pool {
    /// Its name.
    pub name: String,
    /// Its storage.
    pub backing: PoolBacking,
}

/// Where a pool's extents live.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PoolBacking {
    /// A file, optionally of a given size (created or grown to it).
    File {
        /// Absolute path.
        path: String,
        /// Bytes, or the file's own size.
        size: Option<u64>,
    },
    /// A whole host block device.
    Block {
        /// Absolute path.
        path: String,
    },
    /// A virtio-blk disk by PCI slot (image).
    VirtioPci(PciAddress),
    /// A virtio-blk disk by serial (image).
    VirtioSerial(String),
    /// A namespace of the NVMe controller at a PCI address (image).
    NvmePci {
        /// The controller.
        pci: PciAddress,
        /// The namespace id.
        namespace: u32,
    },
    /// A namespace of the NVMe controller with this serial (image).
    NvmeSerial {
        /// The controller's serial.
        serial: String,
        /// The namespace id.
        namespace: u32,
    },
}

impl PoolBacking {
    /// The path of a file or block pool (`None` for a device pool).
    pub fn path(&self) -> Option<&str> {
        match self {
            PoolBacking::File { path, .. } | PoolBacking::Block { path } => Some(path),
            _ => None,
        }
    }
}

impl Backing {
    /// The volume kind.
    pub fn kind(&self) -> VolumeKind {
        match self {
            Backing::Ram { .. } => VolumeKind::Ram,
            Backing::File { .. } => VolumeKind::File,
            Backing::Block { .. } => VolumeKind::Block,
            Backing::VirtioPci(_) | Backing::VirtioSerial(_) => VolumeKind::VirtioBlk,
            Backing::NvmePci { .. } | Backing::NvmeSerial { .. } => VolumeKind::Nvme,
            Backing::Thin { .. } => VolumeKind::Thin,
        }
    }
}

/// A volume.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Volume {
    /// Its name.
    pub name: String,
    /// The client `device_path` that opens it (default: the name).
    pub device_path: String,
    /// Its storage.
    pub backing: Backing,
}

/// The volumes an access rule covers.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum VolumeSet {
    /// Every volume (`volumes = "*"`).
    All,
    /// These volumes, by name.
    Only(Vec<String>),
}

/// One entry of the access list.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AccessRule {
    /// Session name, exact or glob.
    pub sessions: String,
    /// Client source network, if restricted.
    pub source: Option<Ipv4Cidr>,
    /// Volumes covered.
    pub volumes: VolumeSet,
    /// What is granted.
    pub mode: AccessMode,
}

impl Config {
    /// The binary form (see the crate docs), checked by reading it back.
    ///
    /// # Errors
    ///
    /// What the reader refuses in a hand-built config.
    pub fn to_binary(&self) -> Result<Vec<u8>, ReadError> {
        binary::encode(self)
    }

    /// The binary form in an older format `version`
    /// ([`binary::encode_version`]).
    ///
    /// # Errors
    ///
    /// As [`binary::encode_version`].
    pub fn to_binary_version(&self, version: u16) -> Result<Vec<u8>, ReadError> {
        binary::encode_version(self, version)
    }

    /// The owned config of a checked binary manifest.
    pub fn from_manifest(manifest: &Manifest<'_>) -> Self {
        let target = manifest.target();
        let volumes: Vec<Volume> = manifest
            .volumes()
            .map(|v| Volume {
                name: v.name.to_owned(),
                device_path: v.device_path.to_owned(),
                backing: match v.backing {
                    binary::Backing::Ram { size } => Backing::Ram { size },
                    binary::Backing::File { path, size } => Backing::File {
                        path: path.to_owned(),
                        size,
                    },
                    binary::Backing::Block { path } => Backing::Block {
                        path: path.to_owned(),
                    },
                    binary::Backing::VirtioBlk(VirtioSelector::Pci(address)) => {
                        Backing::VirtioPci(address)
                    }
                    binary::Backing::VirtioBlk(VirtioSelector::Serial(serial)) => {
                        Backing::VirtioSerial(serial.to_owned())
                    }
                    binary::Backing::Nvme {
                        controller: VirtioSelector::Pci(pci),
                        namespace,
                    } => Backing::NvmePci { pci, namespace },
                    binary::Backing::Nvme {
                        controller: VirtioSelector::Serial(serial),
                        namespace,
                    } => Backing::NvmeSerial {
                        serial: serial.to_owned(),
                        namespace,
                    },
                    binary::Backing::Thin { pool, size } => Backing::Thin {
                        pool: pool.name.to_owned(),
                        size,
                    },
                },
            })
            .collect();
        Config {
            target: Target {
                name: target.name.to_owned(),
                uuid: target.uuid,
                port: target.port,
                always_invalidate: target.always_invalidate,
            },
            interfaces: manifest
                .interfaces()
                .map(|i| Interface {
                    name: i.name.to_owned(),
                    mac: i.mac,
                    address: i.address,
                    mtu: i.mtu,
                })
                .collect(),
            access: manifest
                .access_rules()
                .map(|r| AccessRule {
                    sessions: r.sessions.to_owned(),
                    source: r.source,
                    mode: r.mode,
                    volumes: match r.volumes {
                        RuleVolumes::All => VolumeSet::All,
                        RuleVolumes::Only(indexes) => VolumeSet::Only(
                            indexes
                                .filter_map(|i| volumes.get(i))
                                .map(|v| v.name.clone())
                                .collect(),
                        ),
                    },
                })
                .collect(),
            pools: manifest
                .pools()
                .map(|p| Pool {
                    name: p.name.to_owned(),
                    backing: match p.backing {
                        binary::PoolBacking::File { path, size } => PoolBacking::File {
                            path: path.to_owned(),
                            size,
                        },
                        binary::PoolBacking::Block { path } => PoolBacking::Block {
                            path: path.to_owned(),
                        },
                        binary::PoolBacking::VirtioBlk(VirtioSelector::Pci(pci)) => {
                            PoolBacking::VirtioPci(pci)
                        }
                        binary::PoolBacking::VirtioBlk(VirtioSelector::Serial(serial)) => {
                            PoolBacking::VirtioSerial(serial.to_owned())
                        }
                        binary::PoolBacking::Nvme {
                            controller: VirtioSelector::Pci(pci),
                            namespace,
                        } => PoolBacking::NvmePci { pci, namespace },
                        binary::PoolBacking::Nvme {
                            controller: VirtioSelector::Serial(serial),
                            namespace,
                        } => PoolBacking::NvmeSerial {
                            serial: serial.to_owned(),
                            namespace,
                        },
                    },
                })
                .collect(),
            volumes,
            limits: manifest.limits(),
            admin: manifest.admin(),
        }
    }
}

/// A size in the largest exact unit (`256MiB`, `132KiB`, `4097`).
pub fn format_size(bytes: u64) -> String {
    Size(bytes).to_string()
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
struct TomlStr<'a>(&'a str);

impl fmt::Display for TomlStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if c.is_control() => write!(f, "\\u{:04X}", u32::from(c))?,
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Canonical TOML: every default written out, so it reads as the whole truth.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.target;
        writeln!(f, "[target]\nname = {}", TomlStr(&t.name))?;
        if let Some(uuid) = &t.uuid {
            writeln!(f, "uuid = {:?}", format_uuid(uuid))?;
        }
        writeln!(
            f,
            "port = {}\nalways_invalidate = {}",
            t.port, t.always_invalidate
        )?;
        let l = &self.limits;
        writeln!(
            f,
            "\n[limits]\nmax_sessions = {}\nmax_paths_per_session = {}\nmax_connections_per_path = {}\nqueue_depth = {}\nchunk_size = {:?}\nmax_half_open = {}\nmax_half_open_per_source = {}\nsetup_timeout_ms = {}",
            l.max_sessions,
            l.max_paths_per_session,
            l.max_connections_per_path,
            l.queue_depth,
            format_size(u64::from(l.chunk_size)),
            l.max_half_open,
            l.max_half_open_per_source,
            l.setup_timeout_ms
        )?;
        for i in &self.interfaces {
            writeln!(
                f,
                "\n[[interfaces]]\nname = {}\nmac = \"{}\"\naddress = \"{}\"\nmtu = {}",
                TomlStr(&i.name),
                i.mac,
                i.address,
                i.mtu
            )?;
        }
        for p in &self.pools {
            writeln!(f, "\n[[pools]]\nname = {}", TomlStr(&p.name))?;
            match &p.backing {
                PoolBacking::File { path, size } => {
                    writeln!(f, "kind = \"file\"\npath = {}", TomlStr(path))?;
                    if let Some(size) = size {
                        writeln!(f, "size = {:?}", format_size(*size))?;
                    }
                }
                PoolBacking::Block { path } => {
                    writeln!(f, "kind = \"block\"\npath = {}", TomlStr(path))?
                }
                PoolBacking::VirtioPci(pci) => {
                    writeln!(f, "kind = \"virtio-blk\"\npci = \"{pci}\"")?
                }
                PoolBacking::VirtioSerial(serial) => {
                    writeln!(f, "kind = \"virtio-blk\"\nserial = {}", TomlStr(serial))?
                }
                PoolBacking::NvmePci { pci, namespace } => writeln!(
                    f,
                    "kind = \"nvme\"\npci = \"{pci}\"\nnamespace = {namespace}"
                )?,
                PoolBacking::NvmeSerial { serial, namespace } => writeln!(
                    f,
                    "kind = \"nvme\"\nserial = {}\nnamespace = {namespace}",
                    TomlStr(serial)
                )?,
            }
        }
        for v in &self.volumes {
            writeln!(
                f,
                "\n[[volumes]]\nname = {}\nkind = \"{}\"\ndevice_path = {}",
                TomlStr(&v.name),
                v.backing.kind(),
                TomlStr(&v.device_path)
            )?;
            match &v.backing {
                Backing::Ram { size } => writeln!(f, "size = {:?}", format_size(*size))?,
                Backing::File { path, size } => {
                    writeln!(f, "path = {}", TomlStr(path))?;
                    if let Some(size) = size {
                        writeln!(f, "size = {:?}", format_size(*size))?;
                    }
                }
                Backing::Block { path } => writeln!(f, "path = {}", TomlStr(path))?,
                Backing::VirtioPci(address) => writeln!(f, "pci = \"{address}\"")?,
                Backing::VirtioSerial(serial) => writeln!(f, "serial = {}", TomlStr(serial))?,
                Backing::NvmePci { pci, namespace } => {
                    writeln!(f, "pci = \"{pci}\"\nnamespace = {namespace}")?
                }
                Backing::NvmeSerial { serial, namespace } => {
                    writeln!(f, "serial = {}\nnamespace = {namespace}", TomlStr(serial))?
                }
                Backing::Thin { pool, size } => writeln!(
                    f,
                    "pool = {}\nsize = {:?}",
                    TomlStr(pool),
                    format_size(*size)
                )?,
            }
        }
        for r in &self.access {
            writeln!(f, "\n[[access]]\nsessions = {}", TomlStr(&r.sessions))?;
            if let Some(source) = r.source {
                writeln!(f, "source = \"{source}\"")?;
            }
            match &r.volumes {
                VolumeSet::All => writeln!(f, "volumes = \"*\"")?,
                VolumeSet::Only(names) => {
                    let quoted: Vec<String> =
                        names.iter().map(|n| TomlStr(n).to_string()).collect();
                    writeln!(f, "volumes = [{}]", quoted.join(", "))?
                }
            }
            writeln!(f, "mode = \"{}\"", r.mode)?;
        }
        if let Some(admin) = &self.admin {
            let sources: Vec<String> = admin.sources().iter().map(|s| format!("\"{s}\"")).collect();
            writeln!(
                f,
                "\n[admin]\naddress = \"{}\"\nsources = [{}]",
                admin.address,
                sources.join(", ")
            )?;
        }
        Ok(())
    }
}
