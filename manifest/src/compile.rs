//! The TOML compiler (std): manifest text -> validated [`Config`] -> binary.
//!
//! Decoding is derived (`serde`, `#[serde(deny_unknown_fields)]` on every
//! table); every value keeps its span, so each error names the file, the
//! line and the field path, e.g.
//! `m.toml:12: volumes[1].size: expected a size like "256MiB" (units KiB, MiB, GiB, TiB), found "12XB"`.
//! Decoding errors from `toml` carry only a span, which is turned into a
//! field path by walking the document's spanned tree.
//!
//! The schema is documented in the crate docs ("TOML schema") and shown by
//! the files in `examples/`.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

mod admin;
mod pools;

use crate::config::{AccessRule, Backing, Config, Interface, Target, Volume, VolumeSet};
use crate::types::{
    bounds, check_backing_path, check_device_path, check_name, check_serial, check_session_pattern,
    is_host_address, AccessMode, Ipv4Cidr, LimitError, Limits, MacAddress, PciAddress, TextError,
    VolumeKind, DEFAULT_PORT, MAX_ACCESS_RULES, MAX_INTERFACES, MAX_VOLUMES, SIZE_ALIGN,
};

/// A manifest the compiler refuses, located by file, line and field path.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CompileError {
    /// The file name given to the compiler.
    pub file: String,
    /// 1-based line, if the problem has a place in the text.
    pub line: Option<usize>,
    /// 1-based column (in characters), if known.
    pub column: Option<usize>,
    /// The field path (`volumes[1].size`), empty for the whole document.
    pub path: String,
    /// What is wrong, one line.
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.file)?;
        if let Some(line) = self.line {
            write!(f, "{line}:")?;
        }
        if !self.path.is_empty() {
            write!(f, " {}:", self.path)?;
        }
        write!(f, " {}", self.message)
    }
}

impl std::error::Error for CompileError {}

impl CompileError {
    /// The error for `span` of `source` (file `file`): line and column
    /// from the span, `path` and `message` kept on one line (a key or a
    /// value may hold a newline). Every TOML file Brick reads reports its
    /// errors through this, the manifest and the daemon's config alike.
    pub fn at(
        file: &str,
        source: &str,
        span: Option<Range<usize>>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> CompileError {
        let (line, column) = match span {
            Some(span) => {
                let offset = span.start.min(source.len());
                let before = source.get(..offset).unwrap_or("");
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        let one_line = |text: String| text.replace('\r', "\\r").replace('\n', "\\n");
        CompileError {
            file: file.to_owned(),
            line,
            column,
            path: one_line(path.into()),
            message: one_line(message.into()),
        }
    }
}

/// Compiles manifest text into a validated [`Config`]. `file` names the
/// source in error messages.
///
/// # Errors
///
/// The first problem found, with its line and field path.
pub fn compile(source: &str, file: &str) -> Result<Config, CompileError> {
    Compiler { source, file }.compile()
}

/// Compiles manifest text straight to the binary form.
///
/// # Errors
///
/// As [`compile`].
pub fn build(source: &str, file: &str) -> Result<Vec<u8>, CompileError> {
    let config = compile(source, file)?;
    config.to_binary().map_err(|e| CompileError {
        file: file.to_owned(),
        line: None,
        column: None,
        path: String::new(),
        message: e.to_string(),
    })
}

/// Reads and compiles a manifest file.
///
/// # Errors
///
/// The file cannot be read, or as [`compile`].
pub fn compile_file(path: &Path) -> Result<Config, CompileError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| CompileError {
        file: file.clone(),
        line: None,
        column: None,
        path: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    compile(&source, &file)
}

// The document as written. Integers are read as i64 so that range errors
// are ours (with the bounds), not the decoder's.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    target: Spanned<RawTarget>,
    limits: Option<Spanned<RawLimits>>,
    interfaces: Option<Spanned<Vec<Spanned<RawInterface>>>>,
    pools: Option<Spanned<Vec<Spanned<pools::RawPool>>>>,
    volumes: Option<Spanned<Vec<Spanned<RawVolume>>>>,
    access: Option<Spanned<Vec<Spanned<RawAccess>>>>,
    admin: Option<Spanned<admin::RawAdmin>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Spanned<String>,
    uuid: Option<Spanned<String>>,
    port: Option<Spanned<i64>>,
    always_invalidate: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_sessions: Option<Spanned<i64>>,
    max_paths_per_session: Option<Spanned<i64>>,
    max_connections_per_path: Option<Spanned<i64>>,
    queue_depth: Option<Spanned<i64>>,
    chunk_size: Option<Spanned<RawSize>>,
    max_half_open: Option<Spanned<i64>>,
    max_half_open_per_source: Option<Spanned<i64>>,
    setup_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterface {
    name: Spanned<String>,
    mac: Spanned<String>,
    address: Spanned<String>,
    mtu: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVolume {
    name: Spanned<String>,
    kind: Spanned<String>,
    size: Option<Spanned<RawSize>>,
    path: Option<Spanned<String>>,
    pci: Option<Spanned<String>>,
    serial: Option<Spanned<String>>,
    namespace: Option<Spanned<i64>>,
    pool: Option<Spanned<String>>,
    device_path: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccess {
    sessions: Spanned<String>,
    source: Option<Spanned<String>>,
    volumes: Spanned<RawVolumeSet>,
    mode: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(i64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawVolumeSet {
    Text(String),
    List(Vec<String>),
}

struct Compiler<'s> {
    source: &'s str,
    file: &'s str,
}

type Result<T, E = CompileError> = std::result::Result<T, E>;

/// A size text: digits, optional spaces, optional unit.
fn parse_size_text(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let scale: u64 = match unit.trim_start() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.chars().filter(|&c| c != '-').collect();
    let dashes_ok = text.len() == 32
        || (text.len() == 36 && [8, 13, 18, 23].iter().all(|&i| text.as_bytes()[i] == b'-'));
    if hex.len() != 32 || !dashes_ok || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(uuid)
}

impl Compiler<'_> {
    /// An NVMe namespace id (`namespace`, default 1): 1 to 65535.
    fn namespace(&self, raw: Option<&Spanned<i64>>, path: &str) -> Result<u32> {
        let Some(n) = raw else {
            return Ok(1);
        };
        match u16::try_from(*n.get_ref()) {
            Ok(value) if value > 0 => Ok(u32::from(value)),
            _ => Err(self.at(
                n,
                path.to_string(),
                format!(
                    "expected a namespace id from 1 to 65535, found {}",
                    n.get_ref()
                ),
            )),
        }
    }

    fn error(
        &self,
        span: Option<Range<usize>>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> CompileError {
        CompileError::at(self.file, self.source, span, path, message)
    }

    fn at<T>(
        &self,
        value: &Spanned<T>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> CompileError {
        self.error(Some(value.span()), path, message)
    }

    fn text(
        &self,
        value: &Spanned<String>,
        path: &str,
        rule: fn(&str) -> Result<(), TextError>,
    ) -> Result<String> {
        rule(value.get_ref())
            .map_err(|e| self.at(value, path, format!("{:?} {e}", value.get_ref())))?;
        Ok(value.get_ref().clone())
    }

    fn integer<T: TryFrom<i64> + Copy + PartialOrd + fmt::Display>(
        &self,
        value: &Spanned<i64>,
        path: &str,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<T> {
        let n = *value.get_ref();
        match T::try_from(n) {
            Ok(v) if range.contains(&v) => Ok(v),
            _ => Err(self.at(
                value,
                path,
                format!("{n} is outside {}..={}", range.start(), range.end()),
            )),
        }
    }

    fn size(&self, value: &Spanned<RawSize>, path: &str) -> Result<u64> {
        let bad = |found: String| {
            self.at(
                value,
                path,
                format!(
                    "expected a size like \"256MiB\" (units KiB, MiB, GiB, TiB), found {found}"
                ),
            )
        };
        match value.get_ref() {
            RawSize::Bytes(n) => u64::try_from(*n).map_err(|_| bad(n.to_string())),
            RawSize::Text(text) => parse_size_text(text).ok_or_else(|| bad(format!("{text:?}"))),
        }
    }

    /// A size that must be nonzero and a multiple of 4096.
    fn block_size(&self, value: &Spanned<RawSize>, path: &str) -> Result<u64> {
        let size = self.size(value, path)?;
        if size == 0 {
            return Err(self.at(value, path, "must not be zero"));
        }
        if size % SIZE_ALIGN != 0 {
            return Err(self.at(
                value,
                path,
                format!("{size} bytes is not a multiple of {SIZE_ALIGN}"),
            ));
        }
        Ok(size)
    }

    /// Turns a decoder error into one with a line and field path.
    fn decode_error(&self, error: toml::de::Error) -> CompileError {
        let message = error.message().trim().to_owned();
        match toml_error_location(self.source, &error) {
            Some((span, path)) => self.error(Some(span), path, message),
            None => self.error(None, "", message),
        }
    }

    fn compile(&self) -> Result<Config> {
        let raw: RawManifest = toml::from_str(self.source).map_err(|e| self.decode_error(e))?;
        let target = self.target(raw.target.get_ref())?;
        let limits = self.limits(raw.limits.as_ref())?;
        let interfaces = self.interfaces(raw.interfaces.as_ref())?;
        let pools = self.pools(raw.pools.as_ref())?;
        let volumes = self.volumes(raw.volumes.as_ref(), &pools)?;
        self.check_pool_users(raw.pools.as_ref(), &pools, &volumes)?;
        let access = self.access(raw.access.as_ref(), &volumes)?;
        let admin = self.admin(raw.admin.as_ref())?;
        Ok(Config {
            admin,
            target,
            interfaces,
            pools,
            volumes,
            access,
            limits,
        })
    }

    fn target(&self, raw: &RawTarget) -> Result<Target> {
        let name = self.text(&raw.name, "target.name", check_name)?;
        let uuid = match &raw.uuid {
            Some(text) => Some(parse_uuid(text.get_ref()).ok_or_else(|| {
                self.at(
                    text,
                    "target.uuid",
                    format!(
                        "expected a UUID like \"6f1c3e2a-0b7d-4c1e-9a55-1d2e3f405162\", found {:?}",
                        text.get_ref()
                    ),
                )
            })?),
            None => None,
        };
        let port = match &raw.port {
            Some(port) => self.integer(port, "target.port", 1u16..=u16::MAX)?,
            None => DEFAULT_PORT,
        };
        Ok(Target {
            name,
            uuid,
            port,
            always_invalidate: raw.always_invalidate.unwrap_or(true),
        })
    }

    fn limits(&self, raw: Option<&Spanned<RawLimits>>) -> Result<Limits> {
        let mut limits = Limits::default();
        let Some(spanned) = raw else {
            return Ok(limits);
        };
        let raw = spanned.get_ref();
        if let Some(v) = &raw.max_sessions {
            limits.max_sessions = self.integer(v, "limits.max_sessions", bounds::MAX_SESSIONS)?;
        }
        if let Some(v) = &raw.max_paths_per_session {
            limits.max_paths_per_session = self.integer(
                v,
                "limits.max_paths_per_session",
                bounds::MAX_PATHS_PER_SESSION,
            )?;
        }
        if let Some(v) = &raw.max_connections_per_path {
            limits.max_connections_per_path = self.integer(
                v,
                "limits.max_connections_per_path",
                bounds::MAX_CONNECTIONS_PER_PATH,
            )?;
        }
        if let Some(v) = &raw.queue_depth {
            limits.queue_depth = self.integer(v, "limits.queue_depth", bounds::QUEUE_DEPTH)?;
        }
        limits.max_half_open = match &raw.max_half_open {
            Some(v) => self.integer(v, "limits.max_half_open", bounds::MAX_HALF_OPEN)?,
            None => Limits::default_half_open(limits.max_sessions),
        };
        if let Some(v) = &raw.max_half_open_per_source {
            limits.max_half_open_per_source = self.integer(
                v,
                "limits.max_half_open_per_source",
                bounds::MAX_HALF_OPEN_PER_SOURCE,
            )?;
        }
        if let Some(v) = &raw.setup_timeout_ms {
            limits.setup_timeout_ms =
                self.integer(v, "limits.setup_timeout_ms", bounds::SETUP_TIMEOUT_MS)?;
        }
        if let Some(v) = &raw.chunk_size {
            let size = self.size(v, "limits.chunk_size")?;
            limits.chunk_size = u32::try_from(size).map_err(|_| {
                self.at(
                    v,
                    "limits.chunk_size",
                    format!("{size} bytes is far over the 516 KiB maximum"),
                )
            })?;
        }
        limits.check().map_err(|e: LimitError| {
            let field = e.field();
            let span = match field {
                "chunk_size" => raw.chunk_size.as_ref().map(Spanned::span),
                "queue_depth" => raw.queue_depth.as_ref().map(Spanned::span),
                "max_half_open_per_source" => {
                    raw.max_half_open_per_source.as_ref().map(Spanned::span)
                }
                _ => None,
            }
            .unwrap_or_else(|| spanned.span());
            self.error(Some(span), format!("limits.{field}"), e.to_string())
        })?;
        Ok(limits)
    }

    fn list<'r, T>(
        &self,
        raw: Option<&'r Spanned<Vec<Spanned<T>>>>,
        name: &str,
        max: usize,
    ) -> Result<&'r [Spanned<T>]> {
        let Some(list) = raw else {
            return Err(self.error(
                None,
                name,
                format!("at least one [[{name}]] entry is required"),
            ));
        };
        let items = list.get_ref();
        if items.is_empty() || items.len() > max {
            return Err(self.at(
                list,
                name,
                format!("{} entries, between 1 and {max} allowed", items.len()),
            ));
        }
        Ok(items)
    }

    fn interfaces(
        &self,
        raw: Option<&Spanned<Vec<Spanned<RawInterface>>>>,
    ) -> Result<Vec<Interface>> {
        let mut out: Vec<Interface> = Vec::new();
        for (i, item) in self
            .list(raw, "interfaces", MAX_INTERFACES)?
            .iter()
            .enumerate()
        {
            let raw = item.get_ref();
            let path = |field: &str| format!("interfaces[{i}].{field}");
            let name = self.text(&raw.name, &path("name"), check_name)?;
            let mac = MacAddress::parse(raw.mac.get_ref()).ok_or_else(|| {
                self.at(
                    &raw.mac,
                    path("mac"),
                    format!(
                        "expected a MAC like \"52:54:00:12:34:56\", found {:?}",
                        raw.mac.get_ref()
                    ),
                )
            })?;
            if !mac.is_unicast() {
                return Err(self.at(
                    &raw.mac,
                    path("mac"),
                    format!("{mac} is multicast or zero; a station MAC must be unicast"),
                ));
            }
            let address = Ipv4Cidr::parse(raw.address.get_ref(), None).ok_or_else(|| {
                self.at(
                    &raw.address,
                    path("address"),
                    format!("expected an IPv4 address with prefix like \"10.77.0.1/24\" (prefix 1..=32), found {:?}", raw.address.get_ref()),
                )
            })?;
            if !is_host_address(&address) {
                return Err(self.at(&raw.address, path("address"), format!("{address} is not a usable host address (network, broadcast, multicast or zero)")));
            }
            let mtu = match &raw.mtu {
                Some(mtu) => self.integer(mtu, &path("mtu"), bounds::MTU)?,
                None => 1500,
            };
            for (j, other) in out.iter().enumerate() {
                if other.name == name {
                    return Err(self.at(
                        &raw.name,
                        path("name"),
                        format!("duplicate interface name {name:?} (also interfaces[{j}])"),
                    ));
                }
                if other.mac == mac {
                    return Err(self.at(
                        &raw.mac,
                        path("mac"),
                        format!("MAC {mac} is also used by interfaces[{j}]"),
                    ));
                }
                if other.address.address == address.address {
                    return Err(self.at(
                        &raw.address,
                        path("address"),
                        format!(
                            "address {} is also used by interfaces[{j}]",
                            address.address
                        ),
                    ));
                }
            }
            out.push(Interface {
                name,
                mac,
                address,
                mtu,
            });
        }
        Ok(out)
    }

    fn volumes(
        &self,
        raw: Option<&Spanned<Vec<Spanned<RawVolume>>>>,
        pools: &[crate::config::Pool],
    ) -> Result<Vec<Volume>> {
        let mut out: Vec<Volume> = Vec::new();
        for (i, item) in self.list(raw, "volumes", MAX_VOLUMES)?.iter().enumerate() {
            let raw = item.get_ref();
            let path = |field: &str| format!("volumes[{i}].{field}");
            let name = self.text(&raw.name, &path("name"), check_name)?;
            let kind = VolumeKind::from_name(raw.kind.get_ref()).ok_or_else(|| {
                self.at(&raw.kind, path("kind"), format!("unknown volume kind {:?}; expected \"ram\", \"file\", \"block\", \"virtio-blk\", \"nvme\" or \"thin\"", raw.kind.get_ref()))
            })?;
            // Fields that do not belong to this kind are errors, not ignored.
            let allowed: &[&str] = match kind {
                VolumeKind::Ram => &["size"],
                VolumeKind::File => &["path", "size"],
                VolumeKind::Block => &["path"],
                VolumeKind::VirtioBlk => &["pci", "serial"],
                VolumeKind::Nvme => &["pci", "serial", "namespace"],
                VolumeKind::Thin => &["pool", "size"],
            };
            let present = [
                ("size", raw.size.as_ref().map(Spanned::span)),
                ("path", raw.path.as_ref().map(Spanned::span)),
                ("pci", raw.pci.as_ref().map(Spanned::span)),
                ("serial", raw.serial.as_ref().map(Spanned::span)),
                ("namespace", raw.namespace.as_ref().map(Spanned::span)),
                ("pool", raw.pool.as_ref().map(Spanned::span)),
            ];
            for (field, span) in present {
                if let Some(span) = span {
                    if !allowed.contains(&field) {
                        return Err(self.error(
                            Some(span),
                            path(field),
                            format!(
                                "not allowed for a {kind} volume (allowed: {})",
                                allowed.join(", ")
                            ),
                        ));
                    }
                }
            }
            let required_path = |raw_path: &Option<Spanned<String>>| -> Result<String> {
                match raw_path {
                    Some(p) => self.text(p, &path("path"), check_backing_path),
                    None => Err(self.at(
                        item,
                        format!("volumes[{i}]"),
                        format!("a {kind} volume needs `path`"),
                    )),
                }
            };
            let backing = match kind {
                VolumeKind::Ram => match &raw.size {
                    Some(size) => Backing::Ram {
                        size: self.block_size(size, &path("size"))?,
                    },
                    None => {
                        return Err(self.at(
                            item,
                            format!("volumes[{i}]"),
                            "a ram volume needs `size`",
                        ))
                    }
                },
                VolumeKind::File => Backing::File {
                    path: required_path(&raw.path)?,
                    size: raw
                        .size
                        .as_ref()
                        .map(|s| self.block_size(s, &path("size")))
                        .transpose()?,
                },
                VolumeKind::Block => Backing::Block {
                    path: required_path(&raw.path)?,
                },
                VolumeKind::Thin => self.thin_backing(item, i, pools)?,
                VolumeKind::Nvme => {
                    let namespace = self.namespace(raw.namespace.as_ref(), &path("namespace"))?;
                    match (&raw.pci, &raw.serial) {
                        (Some(pci), None) => Backing::NvmePci {
                            pci: PciAddress::parse(pci.get_ref()).ok_or_else(|| {
                                self.at(
                                    pci,
                                    path("pci"),
                                    format!(
                                        "expected a PCI address like \"00:05.0\", found {:?}",
                                        pci.get_ref()
                                    ),
                                )
                            })?,
                            namespace,
                        },
                        (None, Some(serial)) => Backing::NvmeSerial {
                            serial: self.text(serial, &path("serial"), check_serial)?,
                            namespace,
                        },
                        (Some(_), Some(serial)) => {
                            return Err(self.at(
                                serial,
                                path("serial"),
                                "give either `pci` or `serial`, not both",
                            ));
                        }
                        (None, None) => {
                            return Err(self.at(
                                item,
                                format!("volumes[{i}]"),
                                "an nvme volume needs `pci` or `serial` (its controller)",
                            ));
                        }
                    }
                }
                VolumeKind::VirtioBlk => match (&raw.pci, &raw.serial) {
                    (Some(pci), None) => {
                        Backing::VirtioPci(PciAddress::parse(pci.get_ref()).ok_or_else(|| {
                            self.at(
                                pci,
                                path("pci"),
                                format!(
                                    "expected a PCI address like \"00:05.0\", found {:?}",
                                    pci.get_ref()
                                ),
                            )
                        })?)
                    }
                    (None, Some(serial)) => {
                        Backing::VirtioSerial(self.text(serial, &path("serial"), check_serial)?)
                    }
                    (Some(_), Some(serial)) => {
                        return Err(self.at(
                            serial,
                            path("serial"),
                            "give either `pci` or `serial`, not both",
                        ));
                    }
                    (None, None) => {
                        return Err(self.at(
                            item,
                            format!("volumes[{i}]"),
                            "a virtio-blk volume needs `pci` or `serial`",
                        ));
                    }
                },
            };
            let (device_path, device_path_span) = match &raw.device_path {
                Some(p) => (
                    self.text(p, &path("device_path"), check_device_path)?,
                    p.span(),
                ),
                None => (name.clone(), raw.name.span()),
            };
            for (j, other) in out.iter().enumerate() {
                if other.name == name {
                    return Err(self.at(
                        &raw.name,
                        path("name"),
                        format!("duplicate volume name {name:?} (also volumes[{j}])"),
                    ));
                }
                if other.device_path == device_path {
                    return Err(self.error(
                        Some(device_path_span.clone()),
                        path("device_path"),
                        format!("device_path {device_path:?} is also volumes[{j}]'s"),
                    ));
                }
                let same = match (&other.backing, &backing) {
                    (Backing::File { path: a, .. }, Backing::File { path: b, .. })
                    | (Backing::Block { path: a }, Backing::Block { path: b })
                    | (Backing::VirtioSerial(a), Backing::VirtioSerial(b)) => a == b,
                    (Backing::VirtioPci(a), Backing::VirtioPci(b)) => a == b,
                    (
                        Backing::NvmePci {
                            pci: a,
                            namespace: m,
                        },
                        Backing::NvmePci {
                            pci: b,
                            namespace: n,
                        },
                    ) => a == b && m == n,
                    (
                        Backing::NvmeSerial {
                            serial: a,
                            namespace: m,
                        },
                        Backing::NvmeSerial {
                            serial: b,
                            namespace: n,
                        },
                    ) => a == b && m == n,
                    _ => false,
                };
                if same {
                    return Err(self.at(
                        item,
                        format!("volumes[{i}]"),
                        format!("same backing device as volumes[{j}] ({:?})", other.name),
                    ));
                }
            }
            out.push(Volume {
                name,
                device_path,
                backing,
            });
        }
        Ok(out)
    }

    fn access(
        &self,
        raw: Option<&Spanned<Vec<Spanned<RawAccess>>>>,
        volumes: &[Volume],
    ) -> Result<Vec<AccessRule>> {
        let items = self
            .list(raw, "access", MAX_ACCESS_RULES)
            .map_err(|mut e| {
                if raw.is_none() {
                    e.message = "no [[access]] rules: no session could open any volume".into();
                }
                e
            })?;
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let raw = item.get_ref();
            let path = |field: &str| format!("access[{i}].{field}");
            let sessions = self.text(&raw.sessions, &path("sessions"), check_session_pattern)?;
            let source = match &raw.source {
                Some(text) => Some(Ipv4Cidr::parse(text.get_ref(), Some(32)).ok_or_else(|| {
                    self.at(text, path("source"), format!("expected an IPv4 address or network like \"10.77.0.0/24\" (prefix 0..=32), found {:?}", text.get_ref()))
                })?),
                None => None,
            };
            let volume_set = match raw.volumes.get_ref() {
                RawVolumeSet::Text(text) if text == "*" => VolumeSet::All,
                RawVolumeSet::Text(text) => {
                    return Err(self.at(
                        &raw.volumes,
                        path("volumes"),
                        format!("expected \"*\" or a list of volume names, found {text:?}"),
                    ));
                }
                RawVolumeSet::List(names) => {
                    if names.is_empty() {
                        return Err(self.at(
                            &raw.volumes,
                            path("volumes"),
                            "empty volume list; use \"*\" for all volumes",
                        ));
                    }
                    for (k, name) in names.iter().enumerate() {
                        if !volumes.iter().any(|v| &v.name == name) {
                            return Err(self.at(
                                &raw.volumes,
                                path("volumes"),
                                format!("unknown volume {name:?}"),
                            ));
                        }
                        if names[..k].contains(name) {
                            return Err(self.at(
                                &raw.volumes,
                                path("volumes"),
                                format!("volume {name:?} listed twice"),
                            ));
                        }
                    }
                    VolumeSet::Only(names.clone())
                }
            };
            let mode = match raw.mode.get_ref().as_str() {
                "ro" => AccessMode::ReadOnly,
                "rw" => AccessMode::ReadWrite,
                other => {
                    return Err(self.at(
                        &raw.mode,
                        path("mode"),
                        format!("expected \"ro\" or \"rw\", found {other:?}"),
                    ));
                }
            };
            out.push(AccessRule {
                sessions,
                source,
                volumes: volume_set,
                mode,
            });
        }
        Ok(out)
    }
}

/// Where a TOML decoding error of `source` is: its byte span and the
/// dotted path of the deepest key or array element there (`volumes[1].size`),
/// or `None` when the error spans the whole document (a missing top-level
/// table has no line). Shared by every TOML file Brick reads, so their
/// errors name line and field alike.
pub fn toml_error_location(
    source: &str,
    error: &toml::de::Error,
) -> Option<(Range<usize>, String)> {
    let span = error
        .span()
        .filter(|s| !(s.start == 0 && (s.end == 0 || s.end >= source.trim_end().len())))?;
    let path = toml::de::DeTable::parse(source)
        .map(|document| find_path(document.get_ref(), span.start))
        .unwrap_or_default();
    Some((span, path))
}

/// The path of the deepest key, value or array element whose span holds
/// `offset`. Spans of tables opened by a `[header]` cover only the header,
/// so the whole tree is searched, not just the containing spans.
fn find_path(table: &toml::de::DeTable<'_>, offset: usize) -> String {
    fn holds(span: Range<usize>, offset: usize) -> bool {
        span.start <= offset && offset < span.end.max(span.start + 1)
    }
    fn walk_value(
        value: &toml::de::DeValue<'_>,
        offset: usize,
        path: &str,
        best: &mut Option<String>,
    ) {
        match value {
            toml::de::DeValue::Table(table) => walk_table(table, offset, path, best),
            toml::de::DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let item_path = format!("{path}[{i}]");
                    if holds(item.span(), offset) {
                        consider(&item_path, best);
                    }
                    walk_value(item.get_ref(), offset, &item_path, best);
                }
            }
            _ => {}
        }
    }
    fn walk_table(
        table: &toml::de::DeTable<'_>,
        offset: usize,
        path: &str,
        best: &mut Option<String>,
    ) {
        for (key, value) in table.iter() {
            let key_path = if path.is_empty() {
                key.get_ref().to_string()
            } else {
                format!("{path}.{}", key.get_ref())
            };
            if holds(key.span(), offset) || holds(value.span(), offset) {
                consider(&key_path, best);
            }
            walk_value(value.get_ref(), offset, &key_path, best);
        }
    }
    /// Deeper paths win: more separators, then longer text.
    fn consider(path: &str, best: &mut Option<String>) {
        let depth = |p: &str| (p.matches(['.', '[']).count(), p.len());
        if best.as_deref().is_none_or(|b| depth(path) > depth(b)) {
            *best = Some(path.to_owned());
        }
    }
    let mut best = None;
    walk_table(table, offset, "", &mut best);
    best.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_sizes() {
        assert_eq!(parse_size_text("256MiB"), Some(256 << 20));
        assert_eq!(parse_size_text("256 MiB"), Some(256 << 20));
        assert_eq!(parse_size_text("4096"), Some(4096));
        assert_eq!(parse_size_text("1TiB"), Some(1 << 40));
        assert_eq!(parse_size_text("12XB"), None);
        assert_eq!(parse_size_text("MiB"), None);
        assert_eq!(parse_size_text("99999999999999999999GiB"), None);
    }

    #[test]
    fn test_uuid() {
        let uuid = parse_uuid("6f1c3e2a-0b7d-4c1e-9a55-1d2e3f405162").unwrap();
        assert_eq!(uuid[0], 0x6f);
        assert_eq!(uuid[15], 0x62);
        assert!(parse_uuid("6f1c3e2a0b7d4c1e9a551d2e3f405162").is_some());
        assert!(parse_uuid("6f1c3e2a-0b7d-4c1e-9a55-1d2e3f40516").is_none());
        assert!(parse_uuid("6f1c3e2a-0b7d-4c1e-9a55-1d2e3f40516z").is_none());
    }
}
