//! The daemon's TOML config: volumes to keep mapped through the rnbd client.
//!
//! Decoding is derived (`serde`, `#[serde(deny_unknown_fields)]` on every
//! table) and every value keeps its span, so each error names the file, the
//! line and the field path, the way the manifest compiler does
//! (`manifest/src/compile.rs`), e.g.
//! `initiator.toml:7: volumes[1].paths[0]: expected an address like "10.77.0.1" or "10.77.0.2@10.77.0.1", found "10.77.0"`.
//!
//! ```toml
//! [daemon]                      # optional
//! poll_interval_ms = 1000       # how often sysfs is compared with this file
//! retry_interval_s = 5          # at most one attempt per action and interval
//! reconnect_after_s = 5         # a path disconnected this long gets `reconnect`
//! remap_after_s = 2             # a closed device with a path up this long gets `remap_device`
//!
//! [[volumes]]
//! name = "db"                   # /dev/brick/db
//! session = "host1-brick"       # rnbd/rtrs session name (sessname=)
//! device_path = "vol0"          # device_path= on the target
//! access_mode = "rw"            # ro | rw | migration (default rw)
//! port = 1234                   # dest_port= (default 1234)
//! paths = ["10.77.0.1", "10.78.0.2@10.78.0.1"]   # [source@]target
//! ```
//!
//! Volumes that share a session must list the same paths and port: paths
//! belong to the RTRS session, not to a device (`rtrs.md` §7).
//!
//! # Userspace volumes (NBD exports)
//!
//! A volume with `export` is not mapped through the kernel's rnbd client:
//! the daemon itself connects with Brick's userspace initiator over `link`
//! and serves the volume as an NBD export (`nbd-client`, `qemu-img`,
//! `qemu-io`), see the `userspace` module. The NBD export name is the
//! volume's `name` (the empty default name works too).
//!
//! ```toml
//! [[volumes]]
//! name = "db"                   # the NBD export name
//! session = "host1-nbd"         # its own RTRS session (not shared)
//! device_path = "vol0"
//! paths = ["127.0.0.1"]         # target IPv4 addresses (with `port`), no `source@`
//! export = "nbd:unix:/run/brick/db.nbd"   # or "nbd:tcp:127.0.0.1:10809"
//! link = "udp:127.0.0.2:4791"   # the local end of Brick's initiator
//! ```
//!
//! On a client with an RDMA device (a ConnectX, or Linux's rxe) the link
//! is the device, found by the address of its interface, and no kernel
//! RDMA block module is needed:
//!
//! ```toml
//! link = "ibv:rxe0"             # ibv:DEVICE[:PORT]
//! local = "10.77.0.2"           # the device's interface address
//! ```
//!
//! `export` is `nbd:unix:ABSOLUTE_PATH` or `nbd:tcp:IP:PORT` on a loopback
//! address (NBD has no authentication here: the unix socket is created
//! with the daemon's umask, so by default only its user may connect; any
//! local process may connect over TCP). `link` is `udp:IP[:PORT]`
//! (the target's `--link udp:` must use the same port on another
//! address) or `ibv:DEVICE[:PORT]` with `local`; it is required with
//! `export` and refused without it (as `local` is without an `ibv:` link).
//! Two volumes cannot share an export address, a UDP link, or (for a
//! userspace volume) a session name; exports may share an RDMA device. `access_mode = "ro"` makes the export
//! read-only.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};

use hal::hosted::LinkSpec;
use initiator::hosted::SessionLink;
use serde::Deserialize;
use toml::Spanned;

/// Where the daemon looks for its config unless `--config` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/brick/initiator.toml";
/// The rnbd client's default `dest_port`.
pub const DEFAULT_PORT: u16 = 1234;
/// Paths per session: RTRS accepts at most 128 (`rtrs.md` §7); the first
/// six go into `map_device`, the rest are added with `add_path`.
pub const MAX_PATHS: usize = 128;
/// `path=` options one `map_device` write accepts (`rnbd.md` §5.1).
pub const MAX_MAP_PATHS: usize = 6;
/// Longest session name the rnbd client takes safely (`rnbd.md` §5.1).
pub const MAX_SESSION_LEN: usize = 254;
/// Longest `device_path` the rnbd client takes (`rnbd.md` §5.1).
pub const MAX_DEVICE_PATH_LEN: usize = 254;
/// Longest volume name; it becomes a file name under `/dev/brick`.
pub const MAX_NAME_LEN: usize = 64;
/// Paths of a userspace volume: the hosted HCA has 32 queue pairs and
/// every path takes 3 (as `brick --target`).
pub const MAX_USERSPACE_PATHS: usize = 8;
/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH_LEN: usize = 107;

/// A refused config: file, line, column, field path and message, exactly
/// as the boot manifest's compiler reports them (one type for both).
pub use manifest::CompileError as ConfigError;

/// How a volume is opened on the target (`access_mode=`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AccessMode {
    /// Read-only; any number of sessions may open it so.
    ReadOnly,
    /// Read-write (the rnbd default); one writer at a time.
    ReadWrite,
    /// A second read-write opener during live migration.
    Migration,
}

impl AccessMode {
    /// The word the rnbd client uses, in `map_device` and in `access_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "ro",
            Self::ReadWrite => "rw",
            Self::Migration => "migration",
        }
    }

    /// Parses the rnbd word (`ro`, `rw`, `migration`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ro" => Some(Self::ReadOnly),
            "rw" => Some(Self::ReadWrite),
            "migration" => Some(Self::Migration),
            _ => None,
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One RTRS address: `ip:<IPv4|IPv6>` or `gid:<GID>` (`rtrs.md` §8).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub enum Address {
    /// An IP address (RoCE, iWARP, IPoIB).
    Ip(IpAddr),
    /// An InfiniBand GID, written like an IPv6 address.
    Gid(Ipv6Addr),
}

impl Address {
    /// Parses `10.0.0.1`, `ip:10.0.0.1`, `fe80::1`, `ip:fe80::1%2` or
    /// `gid:fe80::2`. A `%scope` suffix (as the kernel prints link-local
    /// addresses) is ignored.
    pub fn parse(text: &str) -> Option<Self> {
        let strip_scope = |t: &str| t.split('%').next().unwrap_or(t).to_owned();
        if let Some(gid) = text.strip_prefix("gid:") {
            return strip_scope(gid).parse().ok().map(Self::Gid);
        }
        let ip = text.strip_prefix("ip:").unwrap_or(text);
        strip_scope(ip).parse().ok().map(Self::Ip)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => write!(f, "ip:{ip}"),
            Self::Gid(gid) => write!(f, "gid:{gid}"),
        }
    }
}

/// One path of a session: the target address and, optionally, the local
/// address to bind.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub struct PathSpec {
    /// Local address; the kernel chooses one when absent.
    pub source: Option<Address>,
    /// The target's address.
    pub target: Address,
}

impl PathSpec {
    /// Parses `[source@]target`, each side as [`Address::parse`].
    pub fn parse(text: &str) -> Option<Self> {
        match text.split_once('@') {
            Some((source, target)) => Some(Self {
                source: Some(Address::parse(source)?),
                target: Address::parse(target)?,
            }),
            None => Some(Self {
                source: None,
                target: Address::parse(text)?,
            }),
        }
    }

    /// Whether a path the kernel lists (`paths/<src@dst>`) is this one: the
    /// target matches, and the source too if this spec names one.
    pub fn matches(&self, source: Option<Address>, target: Address) -> bool {
        self.target == target && (self.source.is_none() || self.source == source)
    }
}

impl fmt::Display for PathSpec {
    /// The rnbd/rtrs form, `[src@]dst` (as `path=` and `add_path` take it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}@")?;
        }
        write!(f, "{}", self.target)
    }
}

/// Where an NBD export listens (`export = "nbd:…"`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub enum ExportAddress {
    /// `nbd:unix:PATH`: a unix socket at this absolute path.
    Unix(PathBuf),
    /// `nbd:tcp:IP:PORT`: TCP on a loopback address.
    Tcp(SocketAddr),
}

impl ExportAddress {
    /// Parses `nbd:unix:/ABSOLUTE/PATH` or `nbd:tcp:IP:PORT` (loopback
    /// only, port not 0).
    ///
    /// # Errors
    ///
    /// A message saying what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = "expected \"nbd:unix:/ABSOLUTE/PATH\" or \"nbd:tcp:127.0.0.1:PORT\"";
        if let Some(path) = text.strip_prefix("nbd:unix:") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{expected}, found {text:?} (the path must be absolute)"
                ));
            }
            if path.len() > MAX_SOCKET_PATH_LEN {
                return Err(format!(
                    "expected a socket path of at most {MAX_SOCKET_PATH_LEN} bytes, found {}",
                    path.len()
                ));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(address) = text.strip_prefix("nbd:tcp:") {
            let address: SocketAddr = address
                .parse()
                .map_err(|_| format!("{expected}, found {text:?} (bad IP:PORT)"))?;
            if !address.ip().is_loopback() {
                return Err(format!(
                    "expected a loopback address (127.0.0.0/8 or ::1; NBD has no \
                     authentication), found {}",
                    address.ip()
                ));
            }
            if address.port() == 0 {
                return Err(format!("expected a port other than 0, found {text:?}"));
            }
            return Ok(Self::Tcp(address));
        }
        Err(format!("{expected}, found {text:?}"))
    }
}

impl fmt::Display for ExportAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "nbd:unix:{}", path.display()),
            Self::Tcp(address) => write!(f, "nbd:tcp:{address}"),
        }
    }
}

/// A volume served by the daemon itself: Brick's userspace initiator over
/// `link`, exported as NBD at `address`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NbdExport {
    /// Where the NBD server listens.
    pub address: ExportAddress,
    /// The initiator's local end: a `udp:` link, or an RDMA device.
    pub link: SessionLink,
    /// The RDMA device's interface address (`ibv:` links only).
    pub local: Option<Ipv4Addr>,
}

/// One volume to keep mapped.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Volume {
    /// The stable name: `/dev/brick/<name>`.
    pub name: String,
    /// The rnbd/rtrs session name.
    pub session: String,
    /// The device path on the target (`device_path=`).
    pub device_path: String,
    /// How the target opens it.
    pub access_mode: AccessMode,
    /// The target's RTRS port (`dest_port=`).
    pub port: u16,
    /// The session's paths, in config order; at least one.
    pub paths: Vec<PathSpec>,
    /// `Some` for a userspace volume (NBD export), which the kernel
    /// reconciliation leaves alone.
    pub export: Option<NbdExport>,
    /// The 1-based config line of this `[[volumes]]` entry, for log lines.
    pub line: usize,
}

impl Volume {
    /// Whether `other` asks for the same mapping (every setting but the
    /// config line): a reload that changes none of these leaves the volume
    /// alone.
    pub fn same_settings(&self, other: &Volume) -> bool {
        Volume {
            line: other.line,
            ..self.clone()
        } == *other
    }

    /// Whether the daemon serves this volume itself (NBD) instead of the
    /// kernel's rnbd client.
    pub fn is_userspace(&self) -> bool {
        self.export.is_some()
    }
}

/// Daemon timing knobs (`[daemon]`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DaemonSettings {
    /// Time between two comparisons of sysfs with the config.
    pub poll_interval_ms: u64,
    /// Least time between two attempts of the same action.
    pub retry_interval_s: u64,
    /// How long a path stays disconnected before the daemon writes its
    /// `reconnect` (skipping RTRS's 30 s delay, or reviving a path RTRS
    /// gave up after `max_reconnect_attempts`).
    pub reconnect_after_s: u64,
    /// How long a device stays `closed` while its session has a connected
    /// path before the daemon writes `remap_device`: rnbd reopens devices
    /// itself, asynchronously, when a path comes back (`rnbd.md` §5.2), and
    /// the daemon must not race it.
    pub remap_after_s: u64,
}

impl Default for DaemonSettings {
    fn default() -> Self {
        Self {
            poll_interval_ms: 1000,
            retry_interval_s: 5,
            reconnect_after_s: 5,
            remap_after_s: 2,
        }
    }
}

/// A validated config.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Config {
    /// Timing knobs.
    pub daemon: DaemonSettings,
    /// The volumes, in config order; names are unique.
    pub volumes: Vec<Volume>,
}

impl Config {
    /// The volume called `name`.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.iter().find(|v| v.name == name)
    }

    /// The same config with only the volumes the kernel's rnbd client maps
    /// (userspace volumes removed): what the reconciliation works on.
    pub fn kernel_only(&self) -> Config {
        Config {
            daemon: self.daemon,
            volumes: self
                .volumes
                .iter()
                .filter(|v| !v.is_userspace())
                .cloned()
                .collect(),
        }
    }

    /// The volumes the daemon serves itself as NBD exports.
    pub fn userspace_volumes(&self) -> impl Iterator<Item = &Volume> {
        self.volumes.iter().filter(|v| v.is_userspace())
    }
}

/// Reads and parses a config file.
///
/// # Errors
///
/// The file cannot be read, or as [`parse`].
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::at(&file, "", None, "", format!("cannot read: {e}")))?;
    parse(&source, &file)
}

/// Parses and validates config text. `file` names the source in errors.
///
/// # Errors
///
/// The first problem found, with its line and field path.
pub fn parse(source: &str, file: &str) -> Result<Config, ConfigError> {
    Parser { source, file }.parse()
}

// The document as written. Integers are i64 so range errors are ours.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    daemon: Option<Spanned<RawDaemon>>,
    volumes: Option<Spanned<Vec<Spanned<RawVolume>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    poll_interval_ms: Option<Spanned<i64>>,
    retry_interval_s: Option<Spanned<i64>>,
    reconnect_after_s: Option<Spanned<i64>>,
    remap_after_s: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVolume {
    name: Spanned<String>,
    session: Spanned<String>,
    device_path: Spanned<String>,
    access_mode: Option<Spanned<String>>,
    port: Option<Spanned<i64>>,
    paths: Spanned<Vec<Spanned<String>>>,
    export: Option<Spanned<String>>,
    link: Option<Spanned<String>>,
    local: Option<Spanned<String>>,
}

/// Why `volume` cannot join `earlier` (the volumes before it in a config,
/// or the config in force for a volume mapped at run time), naming the
/// field at fault.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Conflict {
    /// `name`, `session`, `device_path`, `export`, `link` or `paths`.
    pub field: &'static str,
    /// What was expected and what was found.
    pub message: String,
}

/// The first rule `volume` breaks against `earlier`: names are unique; a
/// volume with `export` has a session of its own; the rnbd client maps a
/// device once per session; exports and their links are unique; volumes
/// sharing a session list the same paths and port.
pub fn conflict(earlier: &[Volume], volume: &Volume) -> Option<Conflict> {
    let found = |field, message| Some(Conflict { field, message });
    if let Some(first) = earlier.iter().find(|v| v.name == volume.name) {
        return found(
            "name",
            format!(
                "expected a unique name, found {:?} again (first on line {})",
                volume.name, first.line
            ),
        );
    }
    if let Some(first) = earlier
        .iter()
        .find(|v| v.session == volume.session && (v.is_userspace() || volume.is_userspace()))
    {
        return found(
            "session",
            format!(
                "session {:?} is already used by volume {:?} (line {}); \
                 a volume with `export` has an RTRS session of its own",
                volume.session, first.name, first.line
            ),
        );
    }
    if let Some(first) = earlier
        .iter()
        .find(|v| v.session == volume.session && v.device_path == volume.device_path)
    {
        return found(
            "device_path",
            format!(
                "{:?} is already mapped in session {:?} by volume {:?} (line {}); \
                 the rnbd client maps a device once per session",
                volume.device_path, volume.session, first.name, first.line
            ),
        );
    }
    if let Some(export) = &volume.export {
        if let Some(first) = earlier.iter().find(|v| {
            v.export
                .as_ref()
                .is_some_and(|e| e.address == export.address)
        }) {
            return found(
                "export",
                format!(
                    "{} is already the export of volume {:?} (line {})",
                    export.address, first.name, first.line
                ),
            );
        }
        // A UDP socket is one export's; an RDMA device is shared.
        let exclusive = matches!(export.link, SessionLink::Hosted(_));
        if let Some(first) = earlier
            .iter()
            .find(|v| exclusive && v.export.as_ref().is_some_and(|e| e.link == export.link))
        {
            return found(
                "link",
                format!(
                    "link {} is already used by volume {:?} (line {}); \
                     each export needs a local address of its own",
                    export.link, first.name, first.line
                ),
            );
        }
    }
    let first = earlier.iter().find(|v| v.session == volume.session)?;
    (first.paths != volume.paths || first.port != volume.port).then(|| Conflict {
        field: "paths",
        message: format!(
            "session {:?} already has paths {} port {} from volume {:?} (line {}); \
             volumes sharing a session must list the same paths and port, found {} port {}",
            volume.session,
            list(&first.paths),
            first.port,
            first.name,
            first.line,
            list(&volume.paths),
            volume.port
        ),
    })
}

struct Parser<'s> {
    source: &'s str,
    file: &'s str,
}

/// Characters allowed in a volume name (a file name under `/dev/brick`).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("expected a name, found an empty string".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "expected at most {MAX_NAME_LEN} bytes, found {}",
            name.len()
        ));
    }
    if name == "." || name == ".." || name.starts_with('-') {
        return Err(format!("{name:?} cannot be a file name under /dev/brick"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "expected letters, digits, '-', '_' or '.', found {c:?} in {name:?}"
        ));
    }
    Ok(())
}

/// Session names: RTRS rejects `/` and `.`; spaces would split the
/// `map_device` line.
fn check_session(session: &str) -> Result<(), String> {
    if session.is_empty() {
        return Err("expected a session name, found an empty string".into());
    }
    if session.len() > MAX_SESSION_LEN {
        return Err(format!(
            "expected at most {MAX_SESSION_LEN} bytes, found {}",
            session.len()
        ));
    }
    if let Some(c) = session
        .chars()
        .find(|c| !(c.is_ascii_graphic()) || matches!(c, '/' | '.'))
    {
        return Err(format!(
            "expected printable ASCII without '/', '.' or spaces, found {c:?} in {session:?}"
        ));
    }
    Ok(())
}

/// Device paths: relative to the target's `dev_search_path`, no `..`, no
/// spaces (the `map_device` line is split at spaces).
fn check_device_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("expected a device path, found an empty string".into());
    }
    if path.len() > MAX_DEVICE_PATH_LEN {
        return Err(format!(
            "expected at most {MAX_DEVICE_PATH_LEN} bytes, found {}",
            path.len()
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("expected no \"..\" component, found {path:?}"));
    }
    if let Some(c) = path.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "expected printable ASCII without spaces, found {c:?} in {path:?}"
        ));
    }
    Ok(())
}

impl Parser<'_> {
    fn line(&self, offset: usize) -> usize {
        let offset = offset.min(self.source.len());
        self.source
            .get(..offset)
            .unwrap_or("")
            .matches('\n')
            .count()
            + 1
    }

    fn error(
        &self,
        span: Option<Range<usize>>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::at(self.file, self.source, span, path, message)
    }

    fn at<T>(
        &self,
        value: &Spanned<T>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        self.error(Some(value.span()), path, message)
    }

    fn integer(
        &self,
        value: Option<&Spanned<i64>>,
        path: &str,
        range: std::ops::RangeInclusive<u64>,
        default: u64,
    ) -> Result<u64, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let n = *value.get_ref();
        match u64::try_from(n) {
            Ok(v) if range.contains(&v) => Ok(v),
            _ => Err(self.at(
                value,
                path,
                format!("expected {}..={}, found {n}", range.start(), range.end()),
            )),
        }
    }

    /// Turns a decoder error into one with a line and field path.
    fn decode_error(&self, error: toml::de::Error) -> ConfigError {
        let message = error.message().trim().to_owned();
        match manifest::toml_error_location(self.source, &error) {
            Some((span, path)) => self.error(Some(span), path, message),
            None => self.error(None, "", message),
        }
    }

    fn parse(&self) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(self.source).map_err(|e| self.decode_error(e))?;
        let daemon = self.daemon(raw.daemon.as_ref())?;
        let volumes = self.volumes(raw.volumes.as_ref())?;
        Ok(Config { daemon, volumes })
    }

    fn daemon(&self, raw: Option<&Spanned<RawDaemon>>) -> Result<DaemonSettings, ConfigError> {
        let defaults = DaemonSettings::default();
        let Some(raw) = raw.map(Spanned::get_ref) else {
            return Ok(defaults);
        };
        Ok(DaemonSettings {
            poll_interval_ms: self.integer(
                raw.poll_interval_ms.as_ref(),
                "daemon.poll_interval_ms",
                10..=60_000,
                defaults.poll_interval_ms,
            )?,
            retry_interval_s: self.integer(
                raw.retry_interval_s.as_ref(),
                "daemon.retry_interval_s",
                0..=3600,
                defaults.retry_interval_s,
            )?,
            reconnect_after_s: self.integer(
                raw.reconnect_after_s.as_ref(),
                "daemon.reconnect_after_s",
                0..=3600,
                defaults.reconnect_after_s,
            )?,
            remap_after_s: self.integer(
                raw.remap_after_s.as_ref(),
                "daemon.remap_after_s",
                0..=3600,
                defaults.remap_after_s,
            )?,
        })
    }

    fn volumes(
        &self,
        raw: Option<&Spanned<Vec<Spanned<RawVolume>>>>,
    ) -> Result<Vec<Volume>, ConfigError> {
        let Some(raw) = raw else {
            // An empty daemon is legal: it maps nothing (and, on reload,
            // unmaps what it mapped before).
            return Ok(Vec::new());
        };
        let mut volumes: Vec<Volume> = Vec::new();
        for (i, item) in raw.get_ref().iter().enumerate() {
            let volume = self.volume(item, i)?;
            if let Some(conflict) = conflict(&volumes, &volume) {
                let raw = item.get_ref();
                let message = conflict.message;
                let path = format!("volumes[{i}].{}", conflict.field);
                return Err(match conflict.field {
                    "name" => self.at(&raw.name, path, message),
                    "session" => self.at(&raw.session, path, message),
                    "device_path" => self.at(&raw.device_path, path, message),
                    "export" => match &raw.export {
                        Some(export) => self.at(export, path, message),
                        None => self.at(item, path, message),
                    },
                    "link" => match &raw.link {
                        Some(link) => self.at(link, path, message),
                        None => self.at(item, path, message),
                    },
                    _ => self.at(&raw.paths, path, message),
                });
            }
            volumes.push(volume);
        }
        Ok(volumes)
    }

    fn volume(&self, item: &Spanned<RawVolume>, i: usize) -> Result<Volume, ConfigError> {
        let raw = item.get_ref();
        let at = |field: &str| format!("volumes[{i}].{field}");
        check_name(raw.name.get_ref()).map_err(|m| self.at(&raw.name, at("name"), m))?;
        check_session(raw.session.get_ref())
            .map_err(|m| self.at(&raw.session, at("session"), m))?;
        check_device_path(raw.device_path.get_ref())
            .map_err(|m| self.at(&raw.device_path, at("device_path"), m))?;
        let access_mode = match &raw.access_mode {
            None => AccessMode::ReadWrite,
            Some(text) => AccessMode::parse(text.get_ref()).ok_or_else(|| {
                self.at(
                    text,
                    at("access_mode"),
                    format!(
                        "expected \"ro\", \"rw\" or \"migration\", found {:?}",
                        text.get_ref()
                    ),
                )
            })?,
        };
        let port = self.integer(
            raw.port.as_ref(),
            &at("port"),
            0..=u64::from(u16::MAX),
            u64::from(DEFAULT_PORT),
        )?;
        let port = u16::try_from(port).unwrap_or(DEFAULT_PORT);
        let texts = raw.paths.get_ref();
        if texts.is_empty() || texts.len() > MAX_PATHS {
            return Err(self.at(
                &raw.paths,
                at("paths"),
                format!(
                    "expected 1..={MAX_PATHS} paths like \"10.77.0.1\", found {}",
                    texts.len()
                ),
            ));
        }
        let mut paths: Vec<PathSpec> = Vec::new();
        for (j, text) in texts.iter().enumerate() {
            let path = PathSpec::parse(text.get_ref().trim()).ok_or_else(|| {
                self.at(
                    text,
                    at(&format!("paths[{j}]")),
                    format!(
                        "expected an address like \"10.77.0.1\" or \"10.77.0.2@10.77.0.1\" \
                         (ip:, gid: prefixes allowed), found {:?}",
                        text.get_ref()
                    ),
                )
            })?;
            if paths
                .iter()
                .any(|p| p.target == path.target && p.source == path.source)
            {
                return Err(self.at(
                    text,
                    at(&format!("paths[{j}]")),
                    format!("expected distinct paths, found {path} twice"),
                ));
            }
            paths.push(path);
        }
        let export = self.export(item, i, &paths)?;
        Ok(Volume {
            name: raw.name.get_ref().clone(),
            session: raw.session.get_ref().clone(),
            device_path: raw.device_path.get_ref().clone(),
            access_mode,
            port,
            paths,
            export,
            line: self.line(item.span().start),
        })
    }

    /// `export` and `link`: both or neither; userspace paths are plain
    /// IPv4 target addresses.
    fn export(
        &self,
        item: &Spanned<RawVolume>,
        i: usize,
        paths: &[PathSpec],
    ) -> Result<Option<NbdExport>, ConfigError> {
        let raw = item.get_ref();
        let at = |field: &str| format!("volumes[{i}].{field}");
        let (text, link) = match (&raw.export, &raw.link) {
            (None, None) => return Ok(None),
            (None, Some(link)) => {
                return Err(self.at(
                    link,
                    at("link"),
                    "`link` is the local end of Brick's userspace initiator; \
                     it goes with `export = \"nbd:…\"`, found no `export`",
                ))
            }
            (Some(export), None) => {
                return Err(self.at(
                    export,
                    at("link"),
                    "a volume with `export` needs `link = \"udp:IP[:PORT]\"` or \
                     `link = \"ibv:DEVICE\"` (the local end of Brick's userspace \
                     initiator), found none",
                ))
            }
            (Some(export), Some(link)) => (export, link),
        };
        let address =
            ExportAddress::parse(text.get_ref()).map_err(|m| self.at(text, at("export"), m))?;
        let spec: SessionLink = link
            .get_ref()
            .parse()
            .map_err(|e: String| self.at(link, at("link"), e))?;
        let ibv = !matches!(spec, SessionLink::Hosted(_));
        if !ibv && !matches!(spec, SessionLink::Hosted(LinkSpec::Udp(SocketAddr::V4(_)))) {
            return Err(self.at(
                link,
                at("link"),
                format!(
                    "expected an IPv4 \"udp:IP[:PORT]\" or an \"ibv:DEVICE[:PORT]\" link \
                     (frame links are not configurable here yet), found {:?}",
                    link.get_ref()
                ),
            ));
        }
        let local = match (&raw.local, ibv) {
            (None, false) => None,
            (Some(local), false) => {
                return Err(self.at(
                    local,
                    at("local"),
                    format!(
                        "`local` names an RDMA device's interface address and goes with an \
                         `ibv:` link, found link {:?}",
                        link.get_ref()
                    ),
                ))
            }
            (None, true) => {
                return Err(self.at(
                    link,
                    at("local"),
                    format!(
                        "link {:?} needs `local = \"IP\"`, the IPv4 address of the device's \
                         interface (the RDMA device is found by it), found none",
                        link.get_ref()
                    ),
                ))
            }
            (Some(local), true) => Some(local.get_ref().parse::<Ipv4Addr>().map_err(|_| {
                self.at(
                    local,
                    at("local"),
                    format!("expected an IPv4 address, found {:?}", local.get_ref()),
                )
            })?),
        };
        if paths.len() > MAX_USERSPACE_PATHS {
            return Err(self.at(
                &raw.paths,
                at("paths"),
                format!(
                    "a volume with `export` takes at most {MAX_USERSPACE_PATHS} paths \
                     (the userspace HCA's queue pairs), found {}",
                    paths.len()
                ),
            ));
        }
        for (j, path) in paths.iter().enumerate() {
            if path.source.is_some() || !matches!(path.target, Address::Ip(IpAddr::V4(_))) {
                let span = raw
                    .paths
                    .get_ref()
                    .get(j)
                    .map_or_else(|| raw.paths.span(), Spanned::span);
                return Err(self.error(
                    Some(span),
                    at(&format!("paths[{j}]")),
                    format!(
                        "a volume with `export` takes IPv4 target addresses without \
                         `source@` (the link is the source), found {path}"
                    ),
                ));
            }
        }
        Ok(Some(NbdExport {
            address,
            link: spec,
            local,
        }))
    }
}

fn list(paths: &[PathSpec]) -> String {
    let items: Vec<String> = paths.iter().map(|p| format!("\"{p}\"")).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const GOOD: &str = r#"
[daemon]
poll_interval_ms = 500

[[volumes]]
name = "db"
session = "host1"
device_path = "vol0"
paths = ["10.77.0.1", "10.78.0.2@10.78.0.1"]

[[volumes]]
name = "logs"
session = "host1"
device_path = "vol1"
access_mode = "ro"
paths = ["10.77.0.1", "10.78.0.2@10.78.0.1"]
"#;

    fn error(source: &str) -> ConfigError {
        parse(source, "t.toml").expect_err("config should be refused")
    }

    #[test]
    fn test_parse_good() {
        let config = parse(GOOD, "t.toml").unwrap();
        assert_eq!(config.daemon.poll_interval_ms, 500);
        assert_eq!(config.daemon.retry_interval_s, 5);
        assert_eq!(config.volumes.len(), 2);
        let db = &config.volumes[0];
        assert_eq!(db.line, 5);
        assert_eq!(db.access_mode, AccessMode::ReadWrite);
        assert_eq!(db.port, DEFAULT_PORT);
        assert_eq!(db.paths[0].to_string(), "ip:10.77.0.1");
        assert_eq!(db.paths[1].to_string(), "ip:10.78.0.2@ip:10.78.0.1");
        assert_eq!(config.volumes[1].access_mode, AccessMode::ReadOnly);
    }

    #[test]
    fn test_example_config_is_valid() {
        let config = parse(include_str!("../examples/initiator.toml"), "initiator.toml").unwrap();
        assert_eq!(config.daemon, DaemonSettings::default());
        assert_eq!(config.volumes.len(), 2);
        assert_eq!(
            config.volumes[0].paths[1].to_string(),
            "ip:10.78.0.2@ip:10.78.0.1"
        );
    }

    #[test]
    fn test_empty_config_maps_nothing() {
        assert!(parse("", "t.toml").unwrap().volumes.is_empty());
    }

    #[test]
    fn test_unknown_key_names_line() {
        let e = error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.1\"]\nsize = 3\n");
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("unknown field `size`"), "{e}");
        assert!(e.to_string().starts_with("t.toml:6:"), "{e}");
    }

    #[test]
    fn test_missing_paths() {
        let e = error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\n");
        assert!(e.message.contains("missing field `paths`"), "{e}");
        let e =
            error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = []\n");
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(e.path, "volumes[0].paths");
        assert!(e.message.contains("found 0"), "{e}");
    }

    #[test]
    fn test_duplicate_name() {
        let source = GOOD.replace("name = \"logs\"", "name = \"db\"");
        let e = error(&source);
        assert_eq!(e.line, Some(12), "{e}");
        assert_eq!(e.path, "volumes[1].name");
        assert!(e.message.contains("first on line 5"), "{e}");
    }

    #[test]
    fn test_duplicate_device_in_session() {
        let source = GOOD.replace("\"vol1\"", "\"vol0\"");
        let e = error(&source);
        assert_eq!(e.path, "volumes[1].device_path", "{e}");
        assert_eq!(e.line, Some(14), "{e}");
    }

    #[test]
    fn test_session_paths_must_agree() {
        let source = GOOD.replacen(
            "paths = [\"10.77.0.1\", \"10.78.0.2@10.78.0.1\"]\n\n",
            "paths = [\"10.77.0.1\"]\n\n",
            1,
        );
        let e = error(&source);
        assert_eq!(e.path, "volumes[1].paths", "{e}");
        assert!(e.message.contains("same paths"), "{e}");
    }

    #[test]
    fn test_bad_addresses() {
        for bad in [
            "10.77.0",
            "host",
            "10.0.0.1@",
            "@10.0.0.1",
            "ip:",
            "gid:10.0.0.1",
        ] {
            let source = format!(
                "[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.9\", \"{bad}\"]\n"
            );
            let e = error(&source);
            assert_eq!(e.line, Some(5), "{bad}: {e}");
            assert_eq!(e.path, "volumes[0].paths[1]", "{bad}: {e}");
            assert!(e.message.contains(&format!("found {bad:?}")), "{e}");
        }
        let e = error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.1\", \"ip:10.0.0.1\"]\n");
        assert!(e.message.contains("twice"), "{e}");
    }

    #[test]
    fn test_good_addresses() {
        for (text, shown) in [
            ("fe80::1", "ip:fe80::1"),
            ("ip:fe80::1%2", "ip:fe80::1"),
            ("gid:fe80::2", "gid:fe80::2"),
            ("ip:10.0.0.2@ip:10.0.0.1", "ip:10.0.0.2@ip:10.0.0.1"),
        ] {
            assert_eq!(PathSpec::parse(text).unwrap().to_string(), shown);
        }
    }

    #[test]
    fn test_bad_names() {
        for (field, bad) in [
            ("name", ""),
            ("name", ".."),
            ("name", "a/b"),
            ("name", "-x"),
            ("name", "with space"),
            ("session", "a.b"),
            ("session", "a/b"),
            ("session", "a b"),
            ("device_path", "../etc"),
            ("device_path", "a b"),
        ] {
            let mut fields = BTreeMap::from([
                ("name", "a".to_owned()),
                ("session", "s".to_owned()),
                ("device_path", "v".to_owned()),
            ]);
            fields.insert(field, bad.to_owned());
            let source = format!(
                "[[volumes]]\nname = {:?}\nsession = {:?}\ndevice_path = {:?}\npaths = [\"10.0.0.1\"]\n",
                fields["name"], fields["session"], fields["device_path"]
            );
            let e = error(&source);
            assert_eq!(e.path, format!("volumes[0].{field}"), "{bad:?}: {e}");
            assert!(e.line.is_some(), "{e}");
        }
    }

    #[test]
    fn test_bad_values() {
        let e = error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\naccess_mode = \"rx\"\npaths = [\"10.0.0.1\"]\n");
        assert_eq!(
            (e.line, e.path.as_str()),
            (Some(5), "volumes[0].access_mode")
        );
        let e = error("[[volumes]]\nname = \"a\"\nsession = \"s\"\ndevice_path = \"v\"\nport = 70000\npaths = [\"10.0.0.1\"]\n");
        assert!(e.message.contains("found 70000"), "{e}");
        let e = error("[daemon]\npoll_interval_ms = 0\n");
        assert_eq!(
            e.to_string(),
            "t.toml:2: daemon.poll_interval_ms: expected 10..=60000, found 0"
        );
        let e = error("[[volumes]]\nname = 3\n");
        assert_eq!(e.line, Some(2), "{e}");
    }

    const NBD: &str = r#"
[[volumes]]
name = "db"
session = "host1-nbd"
device_path = "vol0"
paths = ["127.0.0.1"]
export = "nbd:unix:/run/brick/db.nbd"
link = "udp:127.0.0.2:4791"

[[volumes]]
name = "logs"
session = "host2-nbd"
device_path = "vol1"
access_mode = "ro"
port = 1235
paths = ["127.0.0.1"]
export = "nbd:tcp:127.0.0.1:10809"
link = "udp:127.0.0.3:4791"
"#;

    #[test]
    fn test_parse_userspace_volumes() {
        let config = parse(NBD, "t.toml").unwrap();
        let db = &config.volumes[0];
        let export = db.export.as_ref().unwrap();
        assert_eq!(
            export.address,
            ExportAddress::Unix(PathBuf::from("/run/brick/db.nbd"))
        );
        assert_eq!(export.address.to_string(), "nbd:unix:/run/brick/db.nbd");
        assert_eq!(export.link, "udp:127.0.0.2:4791".parse().unwrap());
        let logs = &config.volumes[1];
        assert_eq!(
            logs.export.as_ref().unwrap().address,
            ExportAddress::Tcp("127.0.0.1:10809".parse().unwrap())
        );
        assert_eq!(logs.port, 1235);
        assert!(db.is_userspace() && logs.is_userspace());
        assert_eq!(config.userspace_volumes().count(), 2);
        assert!(config.kernel_only().volumes.is_empty());
        assert_eq!(config.kernel_only().daemon, config.daemon);
        // A kernel volume next to them stays the kernel's.
        let renamed = NBD
            .replace("name = \"db\"", "name = \"ndb\"")
            .replace("name = \"logs\"", "name = \"nlogs\"");
        let mixed = parse(&format!("{GOOD}{renamed}"), "t.toml").unwrap();
        let kernel_only = mixed.kernel_only();
        let kernel: Vec<&str> = kernel_only
            .volumes
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(kernel, ["db", "logs"]);
        // IPv6 loopback is loopback too.
        let v6 = NBD.replace("127.0.0.1:10809", "[::1]:10809");
        assert!(parse(&v6, "t.toml").is_ok());
    }

    #[test]
    fn test_same_settings_compares_the_export() {
        let config = parse(NBD, "t.toml").unwrap();
        let db = &config.volumes[0];
        let moved = Volume {
            line: 99,
            ..db.clone()
        };
        assert!(db.same_settings(&moved));
        let mut other = db.clone();
        other.export.as_mut().unwrap().address = ExportAddress::Unix("/tmp/x".into());
        assert!(!db.same_settings(&other));
        let mut other = db.clone();
        other.export.as_mut().unwrap().link = "udp:127.0.0.9:4791".parse().unwrap();
        assert!(!db.same_settings(&other));
        let mut kernel = db.clone();
        kernel.export = None;
        assert!(!db.same_settings(&kernel));
    }

    /// Both exports on one RDMA device (found by its interface address):
    /// allowed, unlike two exports on one UDP link.
    #[cfg(feature = "ibv")]
    #[test]
    fn test_parse_exports_on_an_rdma_device() {
        let text = NBD
            .replace(
                "link = \"udp:127.0.0.2:4791\"",
                "link = \"ibv:rxe0\"\nlocal = \"10.77.0.2\"",
            )
            .replace(
                "link = \"udp:127.0.0.3:4791\"",
                "link = \"ibv:rxe0:1\"\nlocal = \"10.77.0.2\"",
            );
        let config = parse(&text, "t.toml").unwrap();
        let export = config.volumes[0].export.as_ref().unwrap();
        assert_eq!(export.link.to_string(), "ibv:rxe0:1");
        assert_eq!(export.local, Some(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!(config.volumes[1].export.as_ref().unwrap().link, export.link);
    }

    #[cfg(feature = "ibv")]
    #[test]
    fn test_rdma_device_links_need_local() {
        let cases = [
            (
                NBD.replace("udp:127.0.0.3:4791", "ibv:rxe0"),
                18,
                "volumes[1].local",
                "needs `local = \"IP\"`",
            ),
            (
                NBD.replace(
                    "link = \"udp:127.0.0.3:4791\"",
                    "link = \"ibv:rxe0\"\nlocal = \"10.77.0\"",
                ),
                19,
                "volumes[1].local",
                "expected an IPv4 address, found \"10.77.0\"",
            ),
            (
                NBD.replace(
                    "link = \"udp:127.0.0.3:4791\"",
                    "link = \"udp:127.0.0.3:4791\"\nlocal = \"10.77.0.2\"",
                ),
                19,
                "volumes[1].local",
                "goes with an `ibv:` link",
            ),
        ];
        for (text, line, path, needle) in cases {
            let e = parse(&text, "t.toml").unwrap_err();
            assert_eq!(e.line, Some(line), "{e}");
            assert_eq!(e.path, path, "{e}");
            assert!(e.message.contains(needle), "{needle:?} not in {e}");
        }
    }

    /// A build without RDMA device support says so.
    #[cfg(not(feature = "ibv"))]
    #[test]
    fn test_rdma_device_links_need_the_ibv_build() {
        let e = parse(&NBD.replace("udp:127.0.0.3:4791", "ibv:rxe0"), "t.toml").unwrap_err();
        assert_eq!(e.path, "volumes[1].link", "{e}");
        assert!(e.message.contains("without the `ibv` feature"), "{e}");
    }

    #[test]
    fn test_userspace_volume_errors_name_the_line() {
        let cases: [(String, usize, &str, &str); 12] = [
            (
                NBD.replace("nbd:tcp:127.0.0.1:10809", "nbd:tcp:10.0.0.1:10809"),
                17,
                "volumes[1].export",
                "expected a loopback address",
            ),
            (
                NBD.replace("link = \"udp:127.0.0.3:4791\"\n", ""),
                17,
                "volumes[1].link",
                "needs `link",
            ),
            (
                NBD.replace("export = \"nbd:tcp:127.0.0.1:10809\"\n", ""),
                17,
                "volumes[1].link",
                "found no `export`",
            ),
            (
                NBD.replace("nbd:tcp:127.0.0.1:10809", "nbd:unix:/run/brick/db.nbd"),
                17,
                "volumes[1].export",
                "already the export of volume \"db\" (line 2)",
            ),
            (
                NBD.replace("nbd:tcp:127.0.0.1:10809", "nbd:tcp:127.0.0.1:0"),
                17,
                "volumes[1].export",
                "other than 0",
            ),
            (
                NBD.replace("nbd:tcp:127.0.0.1:10809", "nbd:unix:run/db.nbd"),
                17,
                "volumes[1].export",
                "must be absolute",
            ),
            (
                NBD.replace("nbd:tcp:127.0.0.1:10809", "tcp:127.0.0.1:10809"),
                17,
                "volumes[1].export",
                "expected \"nbd:unix:",
            ),
            (
                NBD.replace("udp:127.0.0.3:4791", "frame:connect:/tmp/a.sock"),
                18,
                "volumes[1].link",
                "IPv4 \"udp:IP[:PORT]\" or an \"ibv:DEVICE[:PORT]\" link",
            ),
            (
                NBD.replace("udp:127.0.0.3:4791", "udp:127.0.0.2:4791"),
                18,
                "volumes[1].link",
                "already used by volume \"db\" (line 2)",
            ),
            (
                NBD.replace("udp:127.0.0.3:4791", "bogus"),
                18,
                "volumes[1].link",
                "unknown kind",
            ),
            (
                NBD.replace("\"host2-nbd\"", "\"host1-nbd\""),
                12,
                "volumes[1].session",
                "already used by volume \"db\" (line 2)",
            ),
            (
                NBD.replace(
                    "port = 1235\npaths = [\"127.0.0.1\"]",
                    "port = 1235\npaths = [\"127.0.0.1\", \"127.0.0.5@127.0.0.4\"]",
                ),
                16,
                "volumes[1].paths[1]",
                "without `source@`",
            ),
        ];
        for (source, line, path, message) in cases {
            let e = error(&source);
            assert_eq!(e.line, Some(line), "{e}");
            assert_eq!(e.path, path, "{e}");
            assert!(e.message.contains(message), "{e}");
            assert!(e.to_string().starts_with(&format!("t.toml:{line}:")), "{e}");
        }
        // A kernel volume may not share a userspace volume's session.
        let kernel = GOOD
            .replace("[daemon]\npoll_interval_ms = 500\n", "")
            .replace("\"host1\"", "\"host1-nbd\"")
            .replace("name = \"db\"", "name = \"kdb\"")
            .replace("name = \"logs\"", "name = \"klogs\"");
        let shared = format!("{NBD}{kernel}");
        let e = error(&shared);
        assert_eq!(e.path, "volumes[2].session", "{e}");
        assert!(e.message.contains("session of its own"), "{e}");
    }
}
