//! Small typed values of the manifest, shared by the compiler and the reader.
//!
//! Everything here is `no_std` and allocation-free: addresses, enums with
//! their binary codes, the limits and their bounds, and the rules a name,
//! pattern or path must follow. The TOML compiler and the binary reader both
//! call the same `check_*` functions, so a blob that did not come from the
//! compiler is held to exactly the same rules.

use core::fmt;
use core::net::Ipv4Addr;

/// Longest volume, interface or target name, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Longest session name or pattern, in bytes (rnbd.md §5.1: keep it ≤ 254).
pub const MAX_SESSION_PATTERN_LEN: usize = 254;
/// Longest `device_path`, in bytes (rnbd.md §2.4: the client keeps ≤ 254).
pub const MAX_DEVICE_PATH_LEN: usize = 254;
/// Longest backing file or block-device path, in bytes (Linux `PATH_MAX` − 1).
pub const MAX_BACKING_PATH_LEN: usize = 4095;
/// Longest virtio-blk serial, in bytes (`VIRTIO_BLK_ID_BYTES`).
pub const MAX_SERIAL_LEN: usize = 20;
/// Most network interfaces in one manifest.
pub const MAX_INTERFACES: usize = 8;
/// Most volumes in one manifest: as many as sessions (`bounds::MAX_SESSIONS`),
/// so a rack of hosts can each have a volume of its own (RNBD admits one
/// writer per volume, as Linux does).
pub const MAX_VOLUMES: usize = 1024;
/// Most thin pools in one manifest.
pub const MAX_POOLS: usize = 16;
/// Most thin volumes on one pool (the pool superblock's volume table).
pub const MAX_THIN_VOLUMES_PER_POOL: usize = 50;
/// Most access rules in one manifest.
pub const MAX_ACCESS_RULES: usize = 256;
/// Volume sizes and file sizes are multiples of this (one page, the largest
/// logical block size Brick advertises).
pub const SIZE_ALIGN: u64 = 4096;
/// The header reserve per chunk (`MAX_HDR_SIZE` in Linux, rtrs.md §0): the
/// chunk carries `max_io_size = chunk_size - MAX_HDR_SIZE` data bytes.
pub const MAX_HDR_SIZE: u32 = 4096;
/// Bits of RTRS immediate data shared by chunk id and offset (rtrs.md §4.2).
pub const IMM_PAYLOAD_BITS: u32 = 28;
/// The RTRS listen port Linux uses (`RTRS_PORT`).
pub const DEFAULT_PORT: u16 = 1234;

/// An Ethernet MAC address (unicast, not all zeros).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MacAddress(pub [u8; 6]);

impl MacAddress {
    /// Parses `52:54:00:12:34:56` (or with `-`); `None` if malformed.
    pub fn parse(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 6];
        let separator = if text.contains('-') { '-' } else { ':' };
        let mut parts = text.split(separator);
        for byte in &mut bytes {
            let part = parts.next()?;
            if part.len() != 2 {
                return None;
            }
            *byte = u8::from_str_radix(part, 16).ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(MacAddress(bytes))
    }

    /// True for a usable station address: unicast and not all zeros.
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// An IPv4 address with a prefix length (`10.77.0.1/24`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ipv4Cidr {
    /// The address.
    pub address: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub prefix: u8,
}

impl Ipv4Cidr {
    /// Parses `a.b.c.d/n`; a bare address gets `default_prefix`. `None` if
    /// malformed or the prefix is over 32.
    pub fn parse(text: &str, default_prefix: Option<u8>) -> Option<Self> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => {
                if prefix.is_empty()
                    || prefix.len() > 2
                    || !prefix.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                (address, prefix.parse().ok()?)
            }
            None => (text, default_prefix?),
        };
        if prefix > 32 {
            return None;
        }
        Some(Ipv4Cidr {
            address: address.parse().ok()?,
            prefix,
        })
    }

    /// The network mask as a `u32` (prefix 0 gives 0).
    pub fn mask(&self) -> u32 {
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0)
    }

    /// True if `address` lies in this network.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        (u32::from(address) ^ u32::from(self.address)) & self.mask() == 0
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// A PCI function address: `[domain:]bus:device.function` (`00:05.0`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PciAddress {
    /// PCI segment (domain), usually 0.
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl PciAddress {
    /// Parses `bb:dd.f` or `dddd:bb:dd.f` (hex); `None` if malformed.
    pub fn parse(text: &str) -> Option<Self> {
        let (rest, function) = text.rsplit_once('.')?;
        let mut parts = rest.rsplitn(3, ':');
        let device = parts.next()?;
        let bus = parts.next()?;
        let domain = parts.next();
        let hex = |s: &str, max_len: usize| -> Option<u32> {
            if s.is_empty() || s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(s, 16).ok()
        };
        let address = PciAddress {
            domain: match domain {
                Some(d) => u16::try_from(hex(d, 4)?).ok()?,
                None => 0,
            },
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok()?,
            function: u8::try_from(hex(function, 1)?).ok()?,
        };
        address.is_valid().then_some(address)
    }

    /// True if device ≤ 31 and function ≤ 7.
    pub fn is_valid(&self) -> bool {
        self.device < 32 && self.function < 8
    }

    /// The binary encoding: `domain << 16 | bus << 8 | device << 3 | function`.
    pub fn to_u32(&self) -> u32 {
        u32::from(self.domain) << 16
            | u32::from(self.bus) << 8
            | u32::from(self.device) << 3
            | u32::from(self.function)
    }

    /// The inverse of [`PciAddress::to_u32`] (always a valid address).
    pub fn from_u32(value: u32) -> Self {
        PciAddress {
            domain: (value >> 16) as u16,
            bus: (value >> 8) as u8,
            device: ((value >> 3) & 0x1f) as u8,
            function: (value & 7) as u8,
        }
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// A byte count displayed in its largest exact binary unit (`256MiB`,
/// `132KiB`, `4097`), the spelling the TOML schema accepts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            let scale = 1u64 << shift;
            if self.0 != 0 && self.0 % scale == 0 {
                return write!(f, "{}{unit}", self.0 / scale);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// What stores a volume's blocks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum VolumeKind {
    /// Memory allocated at boot, zeroed; `size` bytes.
    Ram,
    /// A regular file (hosted target).
    File,
    /// A host block device (hosted target).
    Block,
    /// A virtio-blk device (image), found by PCI slot or serial.
    VirtioBlk,
    /// A namespace of an NVMe controller (image), the controller found by
    /// PCI address or serial (binary format version 2).
    Nvme,
    /// A thin-provisioned volume on a pool's extents (hosted target;
    /// binary format version 4).
    Thin,
}

impl VolumeKind {
    /// The binary code.
    pub fn code(self) -> u8 {
        match self {
            VolumeKind::Ram => 1,
            VolumeKind::File => 2,
            VolumeKind::Block => 3,
            VolumeKind::VirtioBlk => 4,
            VolumeKind::Nvme => 5,
            VolumeKind::Thin => 6,
        }
    }

    /// The kind for a binary code, `None` if unknown.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(VolumeKind::Ram),
            2 => Some(VolumeKind::File),
            3 => Some(VolumeKind::Block),
            4 => Some(VolumeKind::VirtioBlk),
            5 => Some(VolumeKind::Nvme),
            6 => Some(VolumeKind::Thin),
            _ => None,
        }
    }

    /// The TOML spelling (`ram`, `file`, `block`, `virtio-blk`, `nvme`,
    /// `thin`).
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::Ram => "ram",
            VolumeKind::File => "file",
            VolumeKind::Block => "block",
            VolumeKind::VirtioBlk => "virtio-blk",
            VolumeKind::Nvme => "nvme",
            VolumeKind::Thin => "thin",
        }
    }

    /// The kind for a TOML spelling.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            VolumeKind::Ram,
            VolumeKind::File,
            VolumeKind::Block,
            VolumeKind::VirtioBlk,
            VolumeKind::Nvme,
            VolumeKind::Thin,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for VolumeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an access rule grants (rnbd.md §4.2 access modes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AccessMode {
    /// Read-only opens only; RW and MIGRATION opens are refused.
    ReadOnly,
    /// RO, RW and MIGRATION opens (writer limits still apply).
    ReadWrite,
}

impl AccessMode {
    /// The binary code.
    pub fn code(self) -> u8 {
        match self {
            AccessMode::ReadOnly => 0,
            AccessMode::ReadWrite => 1,
        }
    }

    /// The mode for a binary code, `None` if unknown.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(AccessMode::ReadOnly),
            1 => Some(AccessMode::ReadWrite),
            _ => None,
        }
    }

    /// The TOML spelling (`ro`, `rw`).
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadOnly => "ro",
            AccessMode::ReadWrite => "rw",
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a virtio-blk or NVMe volume finds its device (for NVMe: its
/// controller; the serial is Identify Controller's SN).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum VirtioSelector<'a> {
    /// The device at this PCI address.
    Pci(PciAddress),
    /// The device whose serial (`VIRTIO_BLK_T_GET_ID`, NVMe SN) equals this.
    Serial(&'a str),
}

/// Sessions, connections and chunk geometry.
///
/// Bounds are checked by [`Limits::check`]; defaults follow Linux's server
/// (rtrs.md §0) except the chunk, which is 132 KiB so that a 128 KiB IO plus
/// the 4 KiB header reserve fits one chunk and is never split.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Limits {
    /// Most concurrent client sessions (each costs `queue_depth × chunk_size`
    /// bytes of registered memory).
    pub max_sessions: u32,
    /// Most paths per session (multipath; Linux `MAX_PATHS_NUM` is 128).
    pub max_paths_per_session: u16,
    /// Most connections per path (a Linux client opens one per CPU + 1).
    pub max_connections_per_path: u16,
    /// Session queue depth presented in CONN_RSP.
    pub queue_depth: u16,
    /// Bytes per chunk: `max_io_size + MAX_HDR_SIZE`.
    pub chunk_size: u32,
    /// Most paths being set up at once (CON_REQ seen, INFO_REQ/INFO_RSP
    /// not complete), all sources together (binary format 3; older blobs
    /// read the default).
    pub max_half_open: u32,
    /// Most half-open paths from one source address (format 3).
    pub max_half_open_per_source: u16,
    /// Milliseconds a path may take from its first CON_REQ to a complete
    /// INFO_REQ/INFO_RSP exchange before it is closed (format 3). Short by
    /// default (5 s, where Linux waits `RTRS_CONNECT_TIMEOUT_MS`, 30 s): a
    /// half-open path holds connections others may need.
    pub setup_timeout_ms: u32,
}

impl Limits {
    /// `max_half_open` when the manifest does not name it: one path in
    /// setup per eight sessions, 16 to 256, so a rack that boots at once
    /// is not turned away (ENOMEM, retry) sixteen at a time.
    pub const fn default_half_open(max_sessions: u32) -> u32 {
        let share = max_sessions / 8;
        if share < 16 {
            16
        } else if share > 256 {
            256
        } else {
            share
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 16,
            max_paths_per_session: 4,
            max_connections_per_path: 65,
            queue_depth: 512,
            chunk_size: 132 * 1024,
            max_half_open: 16,
            max_half_open_per_source: 4,
            setup_timeout_ms: 5_000,
        }
    }
}

/// Bounds of each limit (inclusive).
pub mod bounds {
    use core::ops::RangeInclusive;
    /// `max_sessions`.
    pub const MAX_SESSIONS: RangeInclusive<u32> = 1..=1024;
    /// `max_paths_per_session` (Linux `MAX_PATHS_NUM`).
    pub const MAX_PATHS_PER_SESSION: RangeInclusive<u16> = 1..=128;
    /// `max_connections_per_path` (one per client CPU, plus the service connection).
    pub const MAX_CONNECTIONS_PER_PATH: RangeInclusive<u16> = 2..=1025;
    /// `queue_depth` (the service connection is sized for 512).
    pub const QUEUE_DEPTH: RangeInclusive<u16> = 1..=512;
    /// `chunk_size`: at least Linux's 8 KiB minimum, at most 512 KiB data
    /// (`RTRS_MAX_SEGMENTS` × 4 KiB) + the header reserve.
    pub const CHUNK_SIZE: RangeInclusive<u32> = 8 * 1024..=516 * 1024;
    /// `max_half_open`.
    pub const MAX_HALF_OPEN: RangeInclusive<u32> = 1..=65_535;
    /// `max_half_open_per_source` (at most `max_half_open` too).
    pub const MAX_HALF_OPEN_PER_SOURCE: RangeInclusive<u16> = 1..=u16::MAX;
    /// `setup_timeout_ms`: 100 ms to 10 minutes.
    pub const SETUP_TIMEOUT_MS: RangeInclusive<u32> = 100..=600_000;
    /// `mtu` of an interface.
    pub const MTU: RangeInclusive<u16> = 576..=9000;
}

/// A limit outside its bounds, or limits that do not fit together.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// `max_sessions` outside [`bounds::MAX_SESSIONS`].
    MaxSessions(u32),
    /// `max_paths_per_session` outside [`bounds::MAX_PATHS_PER_SESSION`].
    MaxPathsPerSession(u16),
    /// `max_connections_per_path` outside [`bounds::MAX_CONNECTIONS_PER_PATH`].
    MaxConnectionsPerPath(u16),
    /// `queue_depth` outside [`bounds::QUEUE_DEPTH`].
    QueueDepth(u16),
    /// `chunk_size` outside [`bounds::CHUNK_SIZE`] or not a multiple of 4096.
    ChunkSize(u32),
    /// Chunk id bits + offset bits exceed the 28-bit RTRS immediate.
    ImmediateOverflow {
        /// The queue depth.
        queue_depth: u16,
        /// The chunk size.
        chunk_size: u32,
    },
    /// `max_half_open` outside [`bounds::MAX_HALF_OPEN`].
    MaxHalfOpen(u32),
    /// `max_half_open_per_source` outside
    /// [`bounds::MAX_HALF_OPEN_PER_SOURCE`] or above `max_half_open`.
    MaxHalfOpenPerSource {
        /// The per-source limit.
        per_source: u16,
        /// `max_half_open`.
        total: u32,
    },
    /// `setup_timeout_ms` outside [`bounds::SETUP_TIMEOUT_MS`].
    SetupTimeout(u32),
}

impl LimitError {
    /// The `[limits]` field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            LimitError::MaxSessions(_) => "max_sessions",
            LimitError::MaxPathsPerSession(_) => "max_paths_per_session",
            LimitError::MaxConnectionsPerPath(_) => "max_connections_per_path",
            LimitError::QueueDepth(_) => "queue_depth",
            LimitError::ChunkSize(_) | LimitError::ImmediateOverflow { .. } => "chunk_size",
            LimitError::MaxHalfOpen(_) => "max_half_open",
            LimitError::MaxHalfOpenPerSource { .. } => "max_half_open_per_source",
            LimitError::SetupTimeout(_) => "setup_timeout_ms",
        }
    }
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use bounds::*;
        match *self {
            LimitError::MaxSessions(v) => write!(
                f,
                "max_sessions {v} is outside {}..={}",
                MAX_SESSIONS.start(),
                MAX_SESSIONS.end()
            ),
            LimitError::MaxPathsPerSession(v) => write!(
                f,
                "max_paths_per_session {v} is outside {}..={}",
                MAX_PATHS_PER_SESSION.start(),
                MAX_PATHS_PER_SESSION.end()
            ),
            LimitError::MaxConnectionsPerPath(v) => write!(
                f,
                "max_connections_per_path {v} is outside {}..={}",
                MAX_CONNECTIONS_PER_PATH.start(),
                MAX_CONNECTIONS_PER_PATH.end()
            ),
            LimitError::QueueDepth(v) => write!(
                f,
                "queue_depth {v} is outside {}..={}",
                QUEUE_DEPTH.start(),
                QUEUE_DEPTH.end()
            ),
            LimitError::ChunkSize(v) => write!(
                f,
                "chunk_size {v} must be a multiple of 4096 in {}..={} bytes",
                CHUNK_SIZE.start(),
                CHUNK_SIZE.end()
            ),
            LimitError::ImmediateOverflow { queue_depth, chunk_size } => write!(
                f,
                "chunk_size {chunk_size} with queue_depth {queue_depth} needs {} + {} immediate bits, RTRS has {IMM_PAYLOAD_BITS}",
                chunk_bits(queue_depth),
                ceil_log2(chunk_size)
            ),
            LimitError::MaxHalfOpen(v) => write!(
                f,
                "max_half_open {v} is outside {}..={}",
                MAX_HALF_OPEN.start(),
                MAX_HALF_OPEN.end()
            ),
            LimitError::MaxHalfOpenPerSource { per_source, total } => write!(
                f,
                "max_half_open_per_source {per_source} must be in 1..=max_half_open ({total})"
            ),
            LimitError::SetupTimeout(v) => write!(
                f,
                "setup_timeout_ms {v} is outside {}..={}",
                SETUP_TIMEOUT_MS.start(),
                SETUP_TIMEOUT_MS.end()
            ),
        }
    }
}

/// `ceil(log2(value))`, 0 for 0 and 1.
fn ceil_log2(value: u32) -> u32 {
    if value <= 1 {
        0
    } else {
        32 - (value - 1).leading_zeros()
    }
}

/// Bits of the immediate that name the chunk: `ilog2(qd - 1) + 1` (rtrs.md §4.2).
fn chunk_bits(queue_depth: u16) -> u32 {
    ceil_log2(u32::from(queue_depth)).max(1)
}

impl Limits {
    /// Checks every bound and the 28-bit immediate split (rtrs.md §3: chunk
    /// bits + `ceil(log2(chunk_size))` ≤ 28).
    ///
    /// # Errors
    ///
    /// The first limit out of bounds.
    pub fn check(&self) -> Result<(), LimitError> {
        use bounds::*;
        if !MAX_SESSIONS.contains(&self.max_sessions) {
            return Err(LimitError::MaxSessions(self.max_sessions));
        }
        if !MAX_PATHS_PER_SESSION.contains(&self.max_paths_per_session) {
            return Err(LimitError::MaxPathsPerSession(self.max_paths_per_session));
        }
        if !MAX_CONNECTIONS_PER_PATH.contains(&self.max_connections_per_path) {
            return Err(LimitError::MaxConnectionsPerPath(
                self.max_connections_per_path,
            ));
        }
        if !QUEUE_DEPTH.contains(&self.queue_depth) {
            return Err(LimitError::QueueDepth(self.queue_depth));
        }
        if !CHUNK_SIZE.contains(&self.chunk_size) || u64::from(self.chunk_size) % SIZE_ALIGN != 0 {
            return Err(LimitError::ChunkSize(self.chunk_size));
        }
        if !MAX_HALF_OPEN.contains(&self.max_half_open) {
            return Err(LimitError::MaxHalfOpen(self.max_half_open));
        }
        if !MAX_HALF_OPEN_PER_SOURCE.contains(&self.max_half_open_per_source)
            || u32::from(self.max_half_open_per_source) > self.max_half_open
        {
            return Err(LimitError::MaxHalfOpenPerSource {
                per_source: self.max_half_open_per_source,
                total: self.max_half_open,
            });
        }
        if !SETUP_TIMEOUT_MS.contains(&self.setup_timeout_ms) {
            return Err(LimitError::SetupTimeout(self.setup_timeout_ms));
        }
        if chunk_bits(self.queue_depth) + ceil_log2(self.chunk_size) > IMM_PAYLOAD_BITS {
            return Err(LimitError::ImmediateOverflow {
                queue_depth: self.queue_depth,
                chunk_size: self.chunk_size,
            });
        }
        Ok(())
    }

    /// `max_io_size` for CONN_RSP: `chunk_size - MAX_HDR_SIZE`.
    pub fn max_io_size(&self) -> u32 {
        self.chunk_size.saturating_sub(MAX_HDR_SIZE)
    }

    /// Registered chunk memory of one session: `queue_depth × chunk_size`.
    pub fn chunk_pool_bytes(&self) -> u64 {
        u64::from(self.queue_depth) * u64::from(self.chunk_size)
    }

    /// Registered chunk memory with every session open.
    pub fn max_chunk_pool_bytes(&self) -> u64 {
        self.chunk_pool_bytes() * u64::from(self.max_sessions)
    }
}

/// Why a name, pattern, path or serial is refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum TextError {
    /// The text is empty.
    Empty,
    /// The text is longer than allowed.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// The text contains a character not allowed here.
    BadCharacter(char),
    /// A device path contains `..` or an empty component ([`check_device_path`]).
    BadPath,
    /// A backing path is not absolute ([`check_backing_path`]).
    NotAbsolute,
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::Empty => f.write_str("must not be empty"),
            TextError::TooLong { len, max } => {
                write!(f, "is {len} bytes long, at most {max} allowed")
            }
            TextError::BadCharacter(c) => {
                write!(f, "contains the character {c:?}, not allowed here")
            }
            TextError::BadPath => f.write_str("must not contain \"..\" or empty components"),
            TextError::NotAbsolute => f.write_str("must be an absolute path"),
        }
    }
}

fn check_len(text: &str, max: usize) -> Result<(), TextError> {
    if text.is_empty() {
        return Err(TextError::Empty);
    }
    if text.len() > max {
        return Err(TextError::TooLong {
            len: text.len(),
            max,
        });
    }
    Ok(())
}

fn check_chars(text: &str, allowed: impl Fn(char) -> bool) -> Result<(), TextError> {
    match text.chars().find(|&c| !allowed(c)) {
        Some(c) => Err(TextError::BadCharacter(c)),
        None => Ok(()),
    }
}

/// A volume, interface or target name: 1..=64 of `[A-Za-z0-9_.-]`.
///
/// # Errors
///
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), TextError> {
    check_len(name, MAX_NAME_LEN)?;
    check_chars(name, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
    })
}

/// A session name or glob pattern: 1..=254 of `[A-Za-z0-9_-]` plus the
/// wildcards `*` and `?`. Linux refuses `/` and `.` in session names
/// (rtrs.md §3); rnbd.md §8 advises this restricted set.
///
/// # Errors
///
/// What is wrong with it.
pub fn check_session_pattern(pattern: &str) -> Result<(), TextError> {
    check_len(pattern, MAX_SESSION_PATTERN_LEN)?;
    check_chars(pattern, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '?')
    })
}

/// A client `device_path`: 1..=254 printable ASCII bytes without spaces,
/// no `..` anywhere (Linux refuses it, rnbd.md §4.2), no empty component.
///
/// # Errors
///
/// What is wrong with it.
pub fn check_device_path(path: &str) -> Result<(), TextError> {
    check_len(path, MAX_DEVICE_PATH_LEN)?;
    check_chars(path, |c| c.is_ascii_graphic())?;
    if path.contains("..") || path.trim_start_matches('/').split('/').any(str::is_empty) {
        return Err(TextError::BadPath);
    }
    Ok(())
}

/// A backing file or block-device path: absolute, 1..=4095 bytes, no NUL
/// or control characters.
///
/// # Errors
///
/// What is wrong with it.
pub fn check_backing_path(path: &str) -> Result<(), TextError> {
    check_len(path, MAX_BACKING_PATH_LEN)?;
    check_chars(path, |c| !c.is_control())?;
    if !path.starts_with('/') {
        return Err(TextError::NotAbsolute);
    }
    Ok(())
}

/// A virtio-blk serial: 1..=20 printable ASCII bytes.
///
/// # Errors
///
/// What is wrong with it.
pub fn check_serial(serial: &str) -> Result<(), TextError> {
    check_len(serial, MAX_SERIAL_LEN)?;
    check_chars(serial, |c| c.is_ascii_graphic())
}

/// Glob match of a session name: `*` matches any run (also empty), `?` one
/// character, everything else itself. Linear time, no allocation.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let (pattern, name) = (pattern.as_bytes(), name.as_bytes());
    let (mut p, mut n) = (0, 0);
    // The last `*` seen, and where in `name` it started matching.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Checks an interface address: a host address (not unspecified, multicast
/// or broadcast; for prefixes ≤ 30 not the network or broadcast address of
/// its subnet) with a prefix of 1..=32.
pub fn is_host_address(cidr: &Ipv4Cidr) -> bool {
    let address = cidr.address;
    if cidr.prefix == 0
        || address.is_unspecified()
        || address.is_multicast()
        || address.is_broadcast()
    {
        return false;
    }
    if cidr.prefix <= 30 {
        let host = u32::from(address) & !cidr.mask();
        if host == 0 || host == !cidr.mask() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pattern_matches() {
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("tenant-*", "tenant-a"));
        assert!(pattern_matches("tenant-*", "tenant-"));
        assert!(!pattern_matches("tenant-*", "tenan"));
        assert!(pattern_matches("a?c", "abc"));
        assert!(!pattern_matches("a?c", "ac"));
        assert!(pattern_matches("*-db-*", "x-db-y"));
        assert!(!pattern_matches("*-db-*", "x-dby"));
        assert!(pattern_matches("exact", "exact"));
        assert!(!pattern_matches("exact", "exact2"));
        assert!(pattern_matches("a*b*c", "aXbYbZc"));
    }

    #[test]
    fn test_parse_values() {
        assert_eq!(
            MacAddress::parse("52:54:00:12:34:5f"),
            Some(MacAddress([0x52, 0x54, 0, 0x12, 0x34, 0x5f]))
        );
        assert_eq!(MacAddress::parse("52:54:00:12:34"), None);
        assert_eq!(MacAddress::parse("52:54:00:12:34:56:78"), None);
        assert_eq!(MacAddress::parse("5:54:00:12:34:567"), None);
        assert!(!MacAddress([1, 0, 0, 0, 0, 0]).is_unicast());
        let cidr = Ipv4Cidr::parse("10.77.0.1/24", None).unwrap();
        assert_eq!(cidr.prefix, 24);
        assert!(cidr.contains("10.77.0.200".parse().unwrap()));
        assert!(!cidr.contains("10.78.0.1".parse().unwrap()));
        assert_eq!(Ipv4Cidr::parse("10.77.0.1/33", None), None);
        assert_eq!(Ipv4Cidr::parse("10.77.0.1", None), None);
        assert_eq!(Ipv4Cidr::parse("10.77.0.1", Some(32)).unwrap().prefix, 32);
        assert_eq!(Ipv4Cidr::parse("0.0.0.0/0", None).unwrap().mask(), 0);
        let pci = PciAddress::parse("00:05.0").unwrap();
        assert_eq!((pci.bus, pci.device, pci.function), (0, 5, 0));
        assert_eq!(PciAddress::from_u32(pci.to_u32()), pci);
        assert_eq!(PciAddress::parse("0001:3a:1f.7").unwrap().domain, 1);
        assert_eq!(PciAddress::parse("00:20.0"), None);
        assert_eq!(PciAddress::parse("00:05.8"), None);
        assert_eq!(PciAddress::parse("00:05"), None);
    }

    #[test]
    fn test_limits() {
        assert_eq!(Limits::default().check(), Ok(()));
        assert_eq!(Limits::default().max_io_size(), 128 * 1024);
        let too_big = Limits {
            chunk_size: 516 * 1024,
            ..Limits::default()
        };
        assert!(matches!(
            too_big.check(),
            Err(LimitError::ImmediateOverflow { .. })
        ));
        let ok = Limits {
            chunk_size: 516 * 1024,
            queue_depth: 256,
            ..Limits::default()
        };
        assert_eq!(ok.check(), Ok(()));
        let zero = Limits {
            queue_depth: 0,
            ..Limits::default()
        };
        assert_eq!(zero.check(), Err(LimitError::QueueDepth(0)));
        let odd = Limits {
            chunk_size: 135_000,
            ..Limits::default()
        };
        assert_eq!(odd.check(), Err(LimitError::ChunkSize(135_000)));
    }

    #[test]
    fn test_text_rules() {
        assert!(check_name("vol0").is_ok());
        assert_eq!(check_name(""), Err(TextError::Empty));
        assert_eq!(check_name("a b"), Err(TextError::BadCharacter(' ')));
        assert!(check_session_pattern("tenant-*").is_ok());
        assert_eq!(
            check_session_pattern("a.b"),
            Err(TextError::BadCharacter('.'))
        );
        assert!(check_device_path("vol0").is_ok());
        assert!(check_device_path("/dev/vol0").is_ok());
        assert_eq!(check_device_path("../etc"), Err(TextError::BadPath));
        assert_eq!(check_device_path("a//b"), Err(TextError::BadPath));
        assert!(check_backing_path("/var/lib/brick/a.img").is_ok());
        assert_eq!(check_backing_path("rel.img"), Err(TextError::NotAbsolute));
        assert!(is_host_address(
            &Ipv4Cidr::parse("10.77.0.1/24", None).unwrap()
        ));
        assert!(!is_host_address(
            &Ipv4Cidr::parse("10.77.0.0/24", None).unwrap()
        ));
        assert!(!is_host_address(
            &Ipv4Cidr::parse("10.77.0.255/24", None).unwrap()
        ));
        assert!(is_host_address(
            &Ipv4Cidr::parse("10.77.0.1/32", None).unwrap()
        ));
    }
}
