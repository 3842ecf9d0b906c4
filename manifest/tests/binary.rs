//! Binary reader tests: every kind of bad blob gets its own error, and no
//! input, however truncated or mangled, makes the reader panic.
//!
//! Blobs are built by the compiler from the example manifests, then patched
//! at the offsets the section table gives (and the CRC fixed where the test
//! is about a field, not the checksum).

use std::net::Ipv4Addr;

use manifest::binary::{fix_checksum, section, Manifest, ReadError, FORMAT_VERSION};
use manifest::config::{
    AccessRule, Backing, Interface, Pool, PoolBacking, Target, Volume, VolumeSet,
};
use manifest::types::{LimitError, Limits, MacAddress, PciAddress};
use manifest::{AccessMode, Config, Ipv4Cidr};
use proptest::prelude::*;

fn example(name: &str) -> Vec<u8> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    manifest::build(&std::fs::read_to_string(&path).unwrap(), name).unwrap()
}

/// (record_len, count, offset) of a section.
fn section_of(blob: &[u8], id: u16) -> (usize, usize, usize) {
    let count = u16::from_le_bytes([blob[16], blob[17]]) as usize;
    for n in 0..count {
        let e = 24 + n * 12;
        if u16::from_le_bytes([blob[e], blob[e + 1]]) == id {
            let record_len = u16::from_le_bytes([blob[e + 2], blob[e + 3]]) as usize;
            let count = u32::from_le_bytes(blob[e + 4..e + 8].try_into().unwrap()) as usize;
            let offset = u32::from_le_bytes(blob[e + 8..e + 12].try_into().unwrap()) as usize;
            return (record_len, count, offset);
        }
    }
    panic!("no section {id}");
}

/// Byte offset of field `field` of record `index` of section `id`.
fn at(blob: &[u8], id: u16, index: usize, field: usize) -> usize {
    let (record_len, _, offset) = section_of(blob, id);
    offset + index * record_len + field
}

/// Applies `patch`, fixes the CRC, parses.
fn patched(mut blob: Vec<u8>, patch: impl FnOnce(&mut Vec<u8>)) -> ReadError {
    patch(&mut blob);
    fix_checksum(&mut blob);
    Manifest::parse(&blob).expect_err("patched blob must be refused")
}

fn two_ram() -> Vec<u8> {
    example("two-ram-volumes.toml")
}

#[test]
fn test_valid_blob_reads() {
    let blob = two_ram();
    let m = Manifest::parse(&blob).unwrap();
    assert_eq!(m.volume_count(), 2);
    assert_eq!(m.interface_count(), 1);
    assert_eq!(m.access_rule_count(), 1);
    assert_eq!(m.as_bytes().len(), blob.len());
    assert_eq!(&blob[..4], b"BRKM");
}

#[test]
fn test_flipped_byte_is_checksum_mismatch() {
    let blob = two_ram();
    // Every byte after the header's CRC field: a flip is caught by the CRC
    // (the section table and records are only looked at after it).
    for i in 16..blob.len() {
        let mut bad = blob.clone();
        bad[i] ^= 0x40;
        match Manifest::parse(&bad) {
            Err(ReadError::ChecksumMismatch { expected, found }) => assert_ne!(expected, found),
            other => panic!("byte {i}: {other:?}"),
        }
    }
    let mut bad = blob.clone();
    bad[13] ^= 1;
    assert!(matches!(
        Manifest::parse(&bad),
        Err(ReadError::ChecksumMismatch { .. })
    ));
}

#[test]
fn test_header_errors() {
    let blob = two_ram();
    let mut bad = blob.clone();
    bad[4] = 5;
    assert_eq!(
        Manifest::parse(&bad).unwrap_err(),
        ReadError::UnsupportedVersion {
            found: 5,
            supported: FORMAT_VERSION
        }
    );
    let mut bad = blob.clone();
    bad[0] = b'X';
    assert_eq!(
        Manifest::parse(&bad).unwrap_err(),
        ReadError::BadMagic(*b"XRKM")
    );
    let mut bad = blob.clone();
    bad.push(0);
    assert!(matches!(
        Manifest::parse(&bad),
        Err(ReadError::LengthMismatch { .. })
    ));
    assert_eq!(
        patched(blob.clone(), |b| b[6] = 1),
        ReadError::ReservedNotZero("header flags")
    );
    assert_eq!(
        patched(blob.clone(), |b| b[20] = 1),
        ReadError::ReservedNotZero("header bytes")
    );
}

#[test]
fn test_truncation_at_every_length() {
    for blob in [
        two_ram(),
        example("image-virtio-blk.toml"),
        example("file-backed.toml"),
    ] {
        for len in 0..blob.len() {
            match Manifest::parse(&blob[..len]) {
                Err(ReadError::Truncated { found, .. }) => assert_eq!(found, len),
                other => panic!("length {len}: {other:?}"),
            }
        }
    }
}

#[test]
fn test_unknown_volume_kind() {
    let blob = two_ram();
    let kind = at(&blob, section::VOLUMES, 1, 32);
    let error = patched(blob, |b| b[kind] = 99);
    assert_eq!(error, ReadError::UnknownVolumeKind(99));
    assert_eq!(error.to_string(), "manifest: unknown volume kind 99");
}

#[test]
fn test_duplicate_names() {
    let blob = two_ram();
    let (v0, v1) = (
        at(&blob, section::VOLUMES, 0, 0),
        at(&blob, section::VOLUMES, 1, 0),
    );
    let error = patched(blob.clone(), |b| b.copy_within(v0..v0 + 8, v1));
    assert_eq!(
        error,
        ReadError::DuplicateVolume("vol0".try_into().unwrap())
    );
    assert_eq!(
        error.to_string(),
        "manifest: duplicate volume name \"vol0\""
    );
    let (p0, p1) = (
        at(&blob, section::VOLUMES, 0, 8),
        at(&blob, section::VOLUMES, 1, 8),
    );
    let error = patched(blob, |b| b.copy_within(p0..p0 + 8, p1));
    assert_eq!(
        error,
        ReadError::DuplicateDevicePath("vol0".try_into().unwrap())
    );

    let blob = example("multipath.toml");
    let (i0, i1) = (
        at(&blob, section::INTERFACES, 0, 0),
        at(&blob, section::INTERFACES, 1, 0),
    );
    let error = patched(blob.clone(), |b| b.copy_within(i0..i0 + 8, i1));
    assert_eq!(
        error,
        ReadError::DuplicateInterface("eth0".try_into().unwrap())
    );
    let (m0, m1) = (
        at(&blob, section::INTERFACES, 0, 12),
        at(&blob, section::INTERFACES, 1, 12),
    );
    let error = patched(blob, |b| b.copy_within(m0..m0 + 6, m1));
    assert_eq!(error, ReadError::DuplicateMac("eth1".try_into().unwrap()));

    let blob = example("image-virtio-blk.toml");
    // disk0 (by PCI) -> also by serial "brick-data1" like disk1.
    let (s2, s1) = (
        at(&blob, section::VOLUMES, 2, 16),
        at(&blob, section::VOLUMES, 1, 16),
    );
    let error = patched(blob, |b| {
        b.copy_within(s2..s2 + 8, s1);
        b[s1 + 17] = 2; // selector: serial
        b[s1 + 20..s1 + 24].fill(0); // no PCI address
    });
    assert_eq!(
        error,
        ReadError::DuplicateBacking("disk1".try_into().unwrap())
    );
}

#[test]
fn test_section_table_errors() {
    let blob = two_ram();
    assert_eq!(
        patched(blob.clone(), |b| b[24] = 42),
        ReadError::UnknownSection(42)
    );
    assert!(matches!(
        patched(blob.clone(), |b| b[26] = 33),
        ReadError::BadRecordLength {
            section: "target",
            found: 33,
            expected: 32
        }
    ));
    assert_eq!(
        patched(blob.clone(), |b| {
            b[24 + 12] = 1;
            b[24 + 14] = 32;
        }),
        ReadError::DuplicateSection("target")
    );
    assert_eq!(
        patched(blob.clone(), |b| b[32..36]
            .copy_from_slice(&u32::MAX.to_le_bytes())),
        ReadError::SectionOutOfBounds("target")
    );
    assert_eq!(
        patched(blob.clone(), |b| b[28..32]
            .copy_from_slice(&u32::MAX.to_le_bytes())),
        ReadError::SectionOutOfBounds("target")
    );
    assert_eq!(
        patched(blob.clone(), |b| b[16] = 17),
        ReadError::TooManySections(17)
    );
    assert_eq!(
        patched(blob.clone(), |b| b[16] = 7),
        ReadError::MissingSection("strings")
    );
    assert!(matches!(
        patched(blob, |b| b[16] = 200),
        ReadError::TooManySections(200)
    ));
}

#[test]
fn test_record_errors() {
    let blob = two_ram();
    let strings = section_of(&blob, section::STRINGS);
    let name0 = at(&blob, section::VOLUMES, 0, 0);
    assert_eq!(
        patched(blob.clone(), |b| b[name0 + 4..name0 + 8]
            .copy_from_slice(&(strings.1 as u32 + 1).to_le_bytes())),
        ReadError::StringOutOfBounds("volume name")
    );
    let off = u32::from_le_bytes(blob[name0..name0 + 4].try_into().unwrap()) as usize + strings.2;
    assert_eq!(
        patched(blob.clone(), |b| b[off] = 0),
        ReadError::StringHasNul("volume name")
    );
    assert_eq!(
        patched(blob.clone(), |b| b[off] = 0xff),
        ReadError::StringNotUtf8("volume name")
    );
    assert!(matches!(
        patched(blob.clone(), |b| b[off] = b' '),
        ReadError::BadText {
            field: "volume name",
            ..
        }
    ));
    let mode = at(&blob, section::ACCESS_RULES, 0, 14);
    assert_eq!(
        patched(blob.clone(), |b| b[mode] = 7),
        ReadError::UnknownAccessMode(7)
    );
    let size = at(&blob, section::VOLUMES, 0, 24);
    assert!(matches!(
        patched(blob.clone(), |b| b[size..size + 8].fill(0)),
        ReadError::BadVolumeSize { size: 0, .. }
    ));
    assert!(matches!(
        patched(blob.clone(), |b| b[size] = 1),
        ReadError::BadVolumeSize { size: _, .. }
    ));
    assert!(matches!(
        patched(blob.clone(), |b| b[size..size + 8]
            .copy_from_slice(&u64::MAX.wrapping_sub(4095).to_le_bytes())),
        ReadError::RamOverflow
    ));
    let mac = at(&blob, section::INTERFACES, 0, 12);
    assert!(matches!(
        patched(blob.clone(), |b| b[mac] = 1),
        ReadError::BadMac(_)
    ));
    let mtu = at(&blob, section::INTERFACES, 0, 20);
    assert!(matches!(
        patched(blob.clone(), |b| b[mtu..mtu + 2]
            .copy_from_slice(&100u16.to_le_bytes())),
        ReadError::BadMtu { mtu: 100, .. }
    ));
    let prefix = at(&blob, section::INTERFACES, 0, 18);
    assert_eq!(
        patched(blob.clone(), |b| b[prefix] = 40),
        ReadError::BadPrefix(40)
    );
    let qd = at(&blob, section::LIMITS, 0, 8);
    assert_eq!(
        patched(blob.clone(), |b| b[qd..qd + 2].fill(0)),
        ReadError::BadLimits(LimitError::QueueDepth(0))
    );
    let flags = at(&blob, section::TARGET, 0, 26);
    assert_eq!(
        patched(blob.clone(), |b| b[flags] |= 0x80),
        ReadError::ReservedNotZero("target flags")
    );

    let blob = example("multipath.toml");
    let (_, count, offset) = section_of(&blob, section::ACCESS_VOLUMES);
    assert_eq!(count, 1);
    assert_eq!(
        patched(blob.clone(), |b| b[offset] = 9),
        ReadError::VolumeIndexOutOfRange { rule: 0, index: 9 }
    );
    let rule_count = at(&blob, section::ACCESS_RULES, 0, 20);
    assert_eq!(
        patched(blob, |b| b[rule_count] = 2),
        ReadError::SectionOutOfBounds("access volume list")
    );
}

#[test]
fn test_errors_are_one_line() {
    let blob = two_ram();
    let errors = [
        Manifest::parse(&blob[..10]).unwrap_err(),
        patched(blob.clone(), |b| b[4] = 9),
        patched(blob.clone(), |b| b[24] = 42),
        ReadError::ChecksumMismatch {
            expected: 1,
            found: 2,
        },
        ReadError::BadLimits(LimitError::ImmediateOverflow {
            queue_depth: 512,
            chunk_size: 528384,
        }),
    ];
    for e in errors {
        let text = e.to_string();
        assert!(
            text.starts_with("manifest: ") && !text.contains('\n'),
            "{text}"
        );
    }
    assert_eq!(
        ReadError::ChecksumMismatch {
            expected: 1,
            found: 2
        }
        .to_string(),
        "manifest: checksum mismatch: header has crc32 0x00000001, contents give 0x00000002"
    );
    assert_eq!(
        patched(blob, |b| b[4] = 9).to_string(),
        "manifest: format version 9 is not supported (this build reads versions 1 to 4): \
         the manifest is newer than this build"
    );
}

#[test]
fn test_hand_built_config_is_checked() {
    let mut config = manifest::compile(
        &std::fs::read_to_string(
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/two-ram-volumes.toml"),
        )
        .unwrap(),
        "m.toml",
    )
    .unwrap();
    config.volumes[1].name = "vol0".into();
    assert_eq!(
        config.to_binary().unwrap_err(),
        ReadError::DuplicateVolume("vol0".try_into().unwrap())
    );
    config.volumes[1].name = "vol1".into();
    config.access[0].volumes = VolumeSet::Only(vec!["nope".into()]);
    assert!(matches!(
        config.to_binary(),
        Err(ReadError::VolumeIndexOutOfRange { .. })
    ));
}

fn arb_config() -> impl Strategy<Value = Config> {
    let interface = (any::<[u8; 5]>(), 1u8..=30, 576u16..=9000)
        .prop_map(|(mac, prefix, mtu)| (mac, prefix, mtu));
    let volume = (
        0u8..6,
        1u64..1_000_000,
        "[a-z0-9/_-]{1,20}",
        proptest::option::of(0u64..100),
    );
    let rule = (
        "[a-z*?_-]{1,12}",
        proptest::option::of((any::<[u8; 4]>(), 0u8..=32)),
        proptest::option::of(proptest::collection::vec(0usize..16, 1..4)),
        any::<bool>(),
    );
    (
        proptest::collection::vec(interface, 1..=4),
        proptest::collection::vec(volume, 1..=8),
        proptest::collection::vec(rule, 1..=4),
        any::<bool>(),
        proptest::option::of(any::<[u8; 16]>()),
        (1u16..=512, 2u32..=16),
    )
        .prop_map(
            |(interfaces, volumes, rules, invalidate, uuid, (queue_depth, chunk_pages))| {
                let volumes: Vec<Volume> = volumes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (kind, pages, path, size))| {
                        let backing = match kind {
                            0 => Backing::Ram { size: pages * 4096 },
                            1 => Backing::File {
                                path: format!("/srv/{i}/{path}"),
                                size: size.map(|s| (s + 1) * 4096),
                            },
                            2 => Backing::Block {
                                path: format!("/dev/{i}{path}"),
                            },
                            3 => Backing::VirtioPci(PciAddress {
                                domain: 0,
                                bus: i as u8,
                                device: (pages % 32) as u8,
                                function: (pages % 8) as u8,
                            }),
                            4 => Backing::VirtioSerial(format!("s{i}")),
                            _ => Backing::Thin {
                                pool: "p0".into(),
                                size: pages * 4096 * 1024,
                            },
                        };
                        let device_path = if size.is_some() {
                            format!("p{i}/{}", path.replace(['/'], "x"))
                        } else {
                            format!("v{i}")
                        };
                        Volume {
                            name: format!("v{i}"),
                            device_path,
                            backing,
                        }
                    })
                    .collect();
                let volume_count = volumes.len();
                let pools = if volumes
                    .iter()
                    .any(|v| matches!(v.backing, Backing::Thin { .. }))
                {
                    vec![Pool {
                        name: "p0".into(),
                        backing: PoolBacking::File {
                            path: "/pools/p0.img".into(),
                            size: Some(64 << 20),
                        },
                    }]
                } else {
                    Vec::new()
                };
                Config {
                    admin: uuid.map(|u| {
                        manifest::binary::Admin::new(
                            std::net::SocketAddrV4::new(
                                Ipv4Addr::new(127, 0, 0, u[0]),
                                9100 + u16::from(u[1]),
                            ),
                            &[Ipv4Cidr {
                                address: Ipv4Addr::new(10, u[2], 0, 0),
                                prefix: u[3] % 33,
                            }],
                        )
                        .expect("one source")
                    }),
                    pools,
                    target: Target {
                        name: "t".into(),
                        uuid,
                        port: 1234,
                        always_invalidate: invalidate,
                    },
                    interfaces: interfaces
                        .into_iter()
                        .enumerate()
                        .map(|(i, (mac, prefix, mtu))| Interface {
                            name: format!("eth{i}"),
                            mac: MacAddress([0x02, mac[1], mac[2], mac[3], mac[4], i as u8]),
                            address: Ipv4Cidr {
                                address: Ipv4Addr::new(10, i as u8, 0, 1),
                                prefix: prefix.max(8),
                            },
                            mtu,
                        })
                        .collect(),
                    access: rules
                        .into_iter()
                        .map(|(sessions, source, list, rw)| AccessRule {
                            sessions,
                            source: source.map(|(a, p)| Ipv4Cidr {
                                address: Ipv4Addr::from(a),
                                prefix: p,
                            }),
                            volumes: match list {
                                None => VolumeSet::All,
                                Some(list) => {
                                    let mut names: Vec<String> = list
                                        .into_iter()
                                        .map(|i| format!("v{}", i % volume_count))
                                        .collect();
                                    names.dedup();
                                    names.sort();
                                    names.dedup();
                                    VolumeSet::Only(names)
                                }
                            },
                            mode: if rw {
                                AccessMode::ReadWrite
                            } else {
                                AccessMode::ReadOnly
                            },
                        })
                        .collect(),
                    volumes,
                    limits: Limits {
                        queue_depth,
                        chunk_size: chunk_pages * 8192,
                        ..Limits::default()
                    },
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// For any valid config, read(write(c)) == c.
    #[test]
    fn prop_round_trip(config in arb_config()) {
        let blob = config.to_binary().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let manifest = Manifest::parse(&blob).unwrap();
        prop_assert_eq!(Config::from_manifest(&manifest), config);
    }

    /// Arbitrary bytes: Ok or Err, never a panic.
    #[test]
    fn prop_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Manifest::parse(&bytes);
    }

    /// Arbitrary bytes behind a valid header and CRC reach the deep checks.
    #[test]
    fn prop_arbitrary_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut blob = b"BRKM\x01\x00\x00\x00".to_vec();
        blob.extend_from_slice(&((body.len() + 16) as u32).to_le_bytes());
        blob.extend_from_slice(&[0; 4]);
        blob.extend_from_slice(&body);
        fix_checksum(&mut blob);
        if let Ok(m) = Manifest::parse(&blob) {
            prop_assert!(Config::from_manifest(&m).to_binary().is_ok());
        }
    }

    /// A valid blob with a few bytes overwritten (CRC fixed): never a panic,
    /// and anything accepted re-encodes to a blob that is accepted too.
    #[test]
    fn prop_mutated_blob(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut blob = example("image-virtio-blk.toml");
        for (index, value) in edits {
            let i = index.index(blob.len());
            blob[i] = value;
        }
        fix_checksum(&mut blob);
        if let Ok(m) = Manifest::parse(&blob) {
            let config = Config::from_manifest(&m);
            let again = config.to_binary().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(Config::from_manifest(&Manifest::parse(&again).unwrap()), config);
            let _ = m.ram_volume_bytes();
            let _ = m.access("s", Ipv4Addr::LOCALHOST, 0);
        }
    }
}

#[test]
fn test_memory_check() {
    let blob = two_ram();
    let m = Manifest::parse(&blob).unwrap();
    // 512 MiB of RAM volumes + 16 sessions x 512 x 132 KiB of chunks.
    let chunk_pools = 16 * 512 * 132 * 1024;
    assert_eq!(m.limits().max_chunk_pool_bytes(), chunk_pools);
    assert!(m.check_memory((512 << 20) + chunk_pools).is_ok());
    let error = m.check_memory(1 << 30).unwrap_err();
    assert_eq!(
        error.to_string(),
        "manifest: RAM volumes (512 MiB) + chunk pools (1056 MiB) need 1568 MiB, only 1024 MiB available"
    );
}

#[test]
fn test_port_zero_refused() {
    let blob = two_ram();
    let port = at(&blob, section::TARGET, 0, 24);
    assert_eq!(
        patched(blob, |b| b[port..port + 2].fill(0)),
        ReadError::BadPort
    );
}

#[test]
fn test_views_display() {
    let blob = example("image-virtio-blk.toml");
    let m = Manifest::parse(&blob).unwrap();
    let volumes: Vec<String> = m.volumes().map(|v| v.to_string()).collect();
    assert_eq!(
        volumes,
        [
            "ram0 (ram 128MiB) as \"ram0\"",
            "disk0 (virtio-blk pci 0000:00:05.0) as \"disk0\"",
            "disk1 (virtio-blk serial brick-data1) as \"data1\""
        ]
    );
    let first = m.interfaces().next().unwrap();
    assert_eq!(
        first.to_string(),
        "net0 52:54:00:77:00:01 10.77.0.1/24 mtu 1500"
    );
}

/// Without `max_half_open` the compiler sizes it from `max_sessions` (one
/// in eight, 16 to 256); a named value is kept as it is.
#[test]
fn test_half_open_default_follows_max_sessions() {
    let half_open = |limits: &str| {
        let text = format!("[target]\nname = \"t\"\n\n[limits]\n{limits}\n\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\n[[volumes]]\nname = \"v\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n");
        let blob = manifest::build(&text, "t.toml").unwrap();
        Manifest::parse(&blob).unwrap().limits().max_half_open
    };
    assert_eq!(half_open("max_sessions = 16"), 16);
    assert_eq!(half_open("max_sessions = 200"), 25);
    assert_eq!(half_open("max_sessions = 1000"), 125);
    assert_eq!(half_open("max_sessions = 1000\nmax_half_open = 10"), 10);
    assert_eq!(Limits::default_half_open(1024), 128);
    assert_eq!(Limits::default_half_open(u32::MAX), 256);
    assert_eq!(Limits::default_half_open(0), 16);
}

/// Format 3's limits record carries the half-open limits and the setup
/// timeout; a format 2 blob (16-byte limits record) still reads, with
/// their defaults.
#[test]
fn test_format_3_limits_and_format_2_blobs() {
    let text = "[target]\nname = \"t\"\n\n[limits]\nmax_half_open = 40\nmax_half_open_per_source = 4\nsetup_timeout_ms = 5000\n\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\n[[volumes]]\nname = \"v\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n";
    let config = manifest::compile(text, "t.toml").unwrap();
    let blob = config.to_binary().unwrap();
    let (record_len, _, _) = section_of(&blob, section::LIMITS);
    assert_eq!(record_len, 28);
    let limits = Manifest::parse(&blob).unwrap().limits();
    assert_eq!(
        (
            limits.max_half_open,
            limits.max_half_open_per_source,
            limits.setup_timeout_ms
        ),
        (40, 4, 5000)
    );
    // The canonical TOML writes them out and compiles to the same blob.
    let canonical = config.to_string();
    assert!(
        canonical
            .contains("max_half_open = 40\nmax_half_open_per_source = 4\nsetup_timeout_ms = 5000"),
        "{canonical}"
    );
    assert_eq!(manifest::build(&canonical, "c.toml").unwrap(), blob);
    // Format 2: a 16-byte limits record, the new limits at their defaults.
    let old = config.to_binary_version(2).unwrap();
    assert_eq!(section_of(&old, section::LIMITS).0, 16);
    let m = Manifest::parse(&old).unwrap();
    assert_eq!(m.version(), 2);
    let defaults = Limits::default();
    assert_eq!(
        m.limits(),
        Limits {
            max_half_open: defaults.max_half_open,
            max_half_open_per_source: defaults.max_half_open_per_source,
            setup_timeout_ms: defaults.setup_timeout_ms,
            ..limits
        }
    );
    // A format 3 blob with a 16-byte limits record is refused by length.
    let mut short = old.clone();
    short[4] = 3;
    fix_checksum(&mut short);
    assert!(matches!(
        Manifest::parse(&short).unwrap_err(),
        ReadError::BadRecordLength {
            found: 16,
            expected: 28,
            ..
        }
    ));
    // The per-source limit cannot exceed the total.
    let error = manifest::compile(
        &text.replace(
            "max_half_open_per_source = 4",
            "max_half_open_per_source = 41",
        ),
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("limits.max_half_open_per_source"), "{error}");
    assert!(
        error.contains("must be in 1..=max_half_open (40)"),
        "{error}"
    );
}
