//! The boot manifest: typed config, TOML compiler and no_std binary reader.
//!
//! Brick is configured by one manifest (ARCHITECTURE.md §1, STYLE.md §10): target
//! identity, network interfaces, volumes and how a client's `device_path`
//! maps to them, the access list, limits and the `always_invalidate` switch.
//! It is written as TOML on a workstation, compiled and checked once, and
//! handed to the target as a compact, versioned, checksummed binary blob:
//!
//! ```text
//!  m.toml --compile()--> Config --to_binary()--> m.bin --Manifest::parse()--> views
//!          (std; errors name        (std)         (no_std, no alloc: the image
//!           file:line: field)                      and the hosted target)
//! ```
//!
//! * [`binary::Manifest`] (always available, `no_std`, no allocation,
//!   `#![forbid(unsafe_code)]`) checks a blob completely once and then hands
//!   out borrowed views ([`binary::Interface`], [`binary::Volume`],
//!   [`binary::AccessRule`], [`types::Limits`]) that cannot fail. Its
//!   [`binary::ReadError`] names the broken rule in one line for the serial
//!   console (`manifest: checksum mismatch: ...`).
//! * [`slot`] (`no_std`): the boot disk's two checksummed manifest slots
//!   and which one is in force ([`slot::choose`]), for the image and for
//!   `brick manifest flash|show`.
//! * With the `std` feature: `compile` (TOML -> `Config`, every error
//!   `file:line: field.path: message`), `build` (TOML -> blob),
//!   `Config::to_binary`, `Config::from_manifest` and a canonical-TOML
//!   `Display` for `Config` (module `config`).
//!
//! ```
//! # #[cfg(feature = "std")] {
//! let text = r#"
//! [target]
//! name = "brick0"
//! [[interfaces]]
//! name = "eth0"
//! mac = "52:54:00:77:00:01"
//! address = "10.77.0.1/24"
//! [[volumes]]
//! name = "vol0"
//! kind = "ram"
//! size = "256MiB"
//! [[access]]
//! sessions = "*"
//! volumes = "*"
//! mode = "rw"
//! "#;
//! let blob = manifest::build(text, "m.toml").unwrap();       // workstation / xtask
//! let m = manifest::Manifest::parse(&blob).unwrap();         // the image, no_std
//! let (index, volume) = m.volume_by_device_path("vol0").unwrap();
//! assert_eq!(volume.backing, manifest::binary::Backing::Ram { size: 256 << 20 });
//! let client = core::net::Ipv4Addr::new(10, 77, 0, 2);
//! assert_eq!(m.access("s1", client, index), Some(manifest::AccessMode::ReadWrite));
//!
//! let bad = text.replace("256MiB", "12XB");
//! assert_eq!(
//!     manifest::compile(&bad, "m.toml").unwrap_err().to_string(),
//!     r#"m.toml:11: volumes[0].size: expected a size like "256MiB" (units KiB, MiB, GiB, TiB), found "12XB""#
//! );
//! # }
//! ```
//!
//! Both sides apply the same rules (the `check_*` functions in [`types`]):
//! a blob from anywhere is held to what the compiler enforces.
//!
//! # TOML schema
//!
//! ```toml
//! [target]
//! name = "brick0"                 # [A-Za-z0-9_.-], 1..=64
//! uuid = "6f1c3e2a-0b7d-4c1e-9a55-1d2e3f405162"   # optional
//! port = 1234                     # optional, RDMA CM listen port (default 1234)
//! always_invalidate = true        # optional (default true): fresh rkey per chunk per IO
//!
//! [limits]                        # optional table, every key optional
//! max_sessions = 16               # 1..=1024
//! max_paths_per_session = 4       # 1..=128
//! max_connections_per_path = 65   # 2..=1025 (a Linux client opens CPUs + 1)
//! queue_depth = 512               # 1..=512
//! chunk_size = "132KiB"           # multiple of 4 KiB, 8 KiB..=516 KiB; see below
//! max_half_open = 16              # 1..=65535 paths in setup at once (format 3; default
//!                                 # max_sessions / 8, 16..=256)
//! max_half_open_per_source = 4    # 1..=max_half_open from one address (format 3)
//! setup_timeout_ms = 5000         # 100..=600000: CON_REQ to INFO_RSP (format 3)
//!
//! [[interfaces]]                  # 1..=8
//! name = "eth0"
//! mac = "52:54:00:12:34:56"       # unicast; the image finds its NIC by MAC
//! address = "10.77.0.1/24"        # host address with prefix
//! mtu = 1500                      # optional, 576..=9000 (default 1500)
//!
//! [[pools]]                       # optional, 0..=16: where thin volumes' extents live
//! name = "pool0"                  # thin volumes name it
//! kind = "file"                   # "file" | "block" (hosted target)
//! path = "/var/lib/brick/pool0.img"   # absolute; not also a volume's path
//! size = "64GiB"                  # file: optional (created or grown to it)
//!
//! [[volumes]]                     # 1..=256
//! name = "vol0"
//! kind = "ram"                    # "ram" | "file" | "block" | "virtio-blk" | "nvme" | "thin"
//! size = "256MiB"                 # ram: required; file: optional. KiB/MiB/GiB/TiB
//!                                 # or bytes; nonzero, multiple of 4096
//! device_path = "vol0"            # optional (default: name); what clients map
//! # file:       path = "/var/lib/brick/data.img"   (absolute)
//! # block:      path = "/dev/nvme0n1"
//! # virtio-blk: pci = "00:05.0"   or   serial = "brick-data0"
//! # nvme:       pci = "00:04.0"   or   serial = "brick-nvme0"   (the controller;
//! #             Identify Controller's SN), namespace = 1 (optional, 1..=65535)
//! # thin:       pool = "pool0", size = "1TiB" (required: the virtual size, may
//! #             exceed the pool; at most 50 thin volumes per pool). Extents
//! #             of 2 MiB are allocated on first write (docs/THIN.md)
//!
//! [[access]]                      # 1..=256; first match does not stop the search:
//! sessions = "*"                  # exact name or glob (*, ?) over [A-Za-z0-9_-]
//! source = "10.77.0.0/24"         # optional client network (bare address = /32)
//! volumes = "*"                   # "*" or ["vol0", "vol1"]
//! mode = "rw"                     # "ro" | "rw" (rw also permits MIGRATION opens)
//!
//! [admin]                         # optional (format 4): the hosted target's HTTP
//! address = "127.0.0.1:9100"      # endpoint (GET /metrics, /volumes/NAME/extents,
//! sources = ["127.0.0.1"]         # docs/ADMIN.md); 1..=8 networks allowed to connect
//! ```
//!
//! Unknown keys are errors everywhere, as are keys that do not belong to a
//! volume's kind (`path` on a RAM volume). A client's OPEN names a
//! `device_path`; it reaches the volume with exactly that `device_path`, and
//! is allowed if some access rule matches the session name, the source
//! address and the volume ([`binary::Manifest::access`]: read-write if any
//! matching rule says `rw`).
//!
//! **Chunk size.** A chunk carries `max_io_size = chunk_size - 4096` data
//! bytes (rtrs.md §2.5). The default 132 KiB makes `max_io_size` 128 KiB, so
//! 128 KiB IOs are never split. With the queue depth it must fit the 28-bit
//! RTRS immediate: `ceil(log2(queue_depth)) + ceil(log2(chunk_size)) <= 28`.
//!
//! # Binary format (version 4)
//!
//! All integers little-endian. The blob is a header, a section table, and
//! the sections' records.
//!
//! | Offset | Size | Field |
//! |---|---|---|
//! | 0 | 4 | magic `BRKM` |
//! | 4 | 2 | format version = 4 (the reader also takes 1 to 3) |
//! | 6 | 2 | flags, zero |
//! | 8 | 4 | `total_len`: length of the whole blob |
//! | 12 | 4 | CRC-32 (IEEE, as `crc32fast`) of every byte of the blob except these four |
//! | 16 | 2 | `section_count` (≤ 16) |
//! | 18 | 6 | reserved, zero |
//! | 24 | 12 × n | section table: `id: u16, record_len: u16, count: u32, offset: u32` (offset from blob start, after the table) |
//!
//! Sections (each exactly once; records of exactly `record_len` bytes). A
//! *string ref* is `offset: u32, len: u32` into the STRINGS section (len 0 =
//! absent); strings are UTF-8 without NUL.
//!
//! | Id | Section | Record | Layout |
//! |---|---|---|---|
//! | 1 | TARGET (1 record) | 32 | 0 name ref · 8 uuid\[16\] · 24 port u16 · 26 flags u16 (bit 0 uuid present, bit 1 always_invalidate) · 28 reserved u32 |
//! | 2 | LIMITS (1 record) | 28 (16 in versions 1 and 2) | 0 max_sessions u32 · 4 max_paths_per_session u16 · 6 max_connections_per_path u16 · 8 queue_depth u16 · 10 reserved u16 · 12 chunk_size u32 · from version 3: 16 max_half_open u32 · 20 setup_timeout_ms u32 · 24 max_half_open_per_source u16 · 26 reserved u16 |
//! | 3 | INTERFACES (1..=8) | 24 | 0 name ref · 8 ipv4\[4\] · 12 mac\[6\] · 18 prefix u8 · 19 reserved u8 · 20 mtu u16 · 22 reserved u16 |
//! | 4 | VOLUMES (1..=256) | 40 | 0 name ref · 8 device_path ref · 16 backing ref (file/block path or virtio/NVMe serial) · 24 size u64 (0 = whole device/file) · 32 kind u8 (1 ram, 2 file, 3 block, 4 virtio-blk, 5 nvme: version 2 and up, 6 thin: version 4 and up; a thin volume's backing ref is its pool's name, its size the virtual size) · 33 selector u8 (0 none, 1 pci, 2 serial) · 34 NVMe namespace u16 (1 and up; zero for other kinds and in version 1) · 36 pci u32 (`domain<<16 \| bus<<8 \| dev<<3 \| fn`) |
//! | 5 | ACCESS_RULES (1..=256) | 24 | 0 sessions ref · 8 source ipv4\[4\] · 12 source prefix u8 · 13 flags u8 (bit 0 source present, bit 1 all volumes) · 14 mode u8 (0 ro, 1 rw) · 15 reserved u8 · 16 first u32 · 20 count u32 (a slice of ACCESS_VOLUMES) |
//! | 6 | ACCESS_VOLUMES | 2 | volume index u16 |
//! | 7 | STRINGS | 1 | string bytes |
//! | 8 | POOLS (0..=16; version 4 and up, required there) | 32 | 0 name ref · 8 path ref · 16 size u64 (0 = whole file/device) · 24 kind u8 (2 file, 3 block) · 25 reserved\[7\] |
//! | 9 | ADMIN (0..=1; version 4 and up, required there) | 72 | 0 ipv4\[4\] · 4 port u16 (nonzero) · 6 source count u8 (1..=8) · 7 reserved u8 · 8 sources: 8 × (ipv4\[4\] · prefix u8 · reserved\[3\]), unused ones zero |
//!
//! The reader checks, in order: length, magic, version, `total_len` equal
//! to the blob length, checksum, reserved fields, the section table (known
//! ids, expected record lengths, in bounds, no duplicates, none missing),
//! record counts, limits, then every record: strings (bounds, UTF-8, no
//! NUL, the field's character rules), enum codes, kind-specific fields,
//! sizes, MAC/address/MTU, duplicate interface names/MACs/addresses,
//! duplicate volume names/device paths/backings, and rule volume indexes.
//!
//! **Versioning.** The version is a single number. Any change to the
//! layout or the meaning of a field (a new section, a longer record, a new
//! flag bit or enum code) bumps [`binary::FORMAT_VERSION`]; a reader accepts
//! exactly the versions it knows and refuses others with
//! [`binary::ReadError::UnsupportedVersion`], and unknown section ids, flag
//! bits and codes are errors, never ignored: a boot manifest is either
//! fully understood or refused. The compiler always writes the current
//! version, so rebuild `m.bin` from `m.toml` after an upgrade. Version 2
//! added the `nvme` volume kind and its namespace field; a version-1 blob
//! reads as before. Version 4 added the POOLS section and the `thin`
//! volume kind, and the ADMIN section (the hosted target's admin
//! endpoint); older blobs read with no pools and no admin endpoint, and
//! writing an older version of a config with pools or an admin endpoint
//! is refused. Version 3 lengthened the LIMITS record to 28 bytes
//! (half-open limits, setup timeout); a version 1 or 2 blob reads with
//! their defaults, and `Config::to_binary_version` still writes the older
//! formats for an older image. A blob newer than the reader says so
//! ([`binary::ReadError::UnsupportedVersion`] with `found > supported`):
//! the image stops with its own message and status for it.
//!
//! # What the limits cost
//!
//! [`capacity::Capacity::of`] derives from the limits every count the
//! target allocates at boot (chunk pools, QPs, CQ entries, regions, CM
//! slots, requests) and the bytes they take; `brick manifest check` prints
//! it.
//!
//! # What the image checks itself
//!
//! The reader cannot know the machine. The image calls
//! [`binary::Manifest::check_memory`] with the memory it has (RAM volumes,
//! [`binary::Manifest::ram_volume_bytes`], plus every session's chunk pool,
//! [`types::Limits::max_chunk_pool_bytes`]; the error's `Display` is the
//! boot message), finds each interface's NIC by MAC, each virtio-blk
//! volume by PCI slot or serial and each NVMe volume's controller by PCI
//! address or serial, and refuses to boot if one is missing.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod binary;
pub mod capacity;
pub mod slot;
pub mod types;

#[cfg(feature = "std")]
mod compile;
#[cfg(feature = "std")]
pub mod config;

pub use binary::{Manifest, MemoryError, ReadError};
pub use capacity::Capacity;
#[cfg(feature = "std")]
pub use compile::{build, compile, compile_file, toml_error_location, CompileError};
#[cfg(feature = "std")]
pub use config::Config;
pub use types::{AccessMode, Ipv4Cidr, Limits, MacAddress, PciAddress, VolumeKind};
