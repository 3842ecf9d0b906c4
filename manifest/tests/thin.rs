//! Pools and thin volumes (format version 4): compiled from TOML, written,
//! read back and printed; what the compiler and the reader refuse; older
//! formats still read and cannot carry pools.

use manifest::binary::{Backing, Manifest, Pool, PoolBacking, ReadError, FORMAT_VERSION};
use manifest::types::VolumeKind;
use manifest::Config;

fn manifest_with(body: &str) -> String {
    format!(
        "[target]\nname = \"node\"\n\n[[interfaces]]\nname = \"eth0\"\n\
         mac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n{body}\n\
         [[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
    )
}

const THIN: &str = r#"
[[pools]]
name = "pool0"
kind = "file"
path = "/var/lib/brick/pool0.img"
size = "64MiB"

[[pools]]
name = "disk"
kind = "block"
path = "/dev/sdz"

[[volumes]]
name = "thin0"
kind = "thin"
pool = "pool0"
size = "1TiB"

[[volumes]]
name = "thin1"
kind = "thin"
pool = "pool0"
size = "8GiB"

[[volumes]]
name = "plain"
kind = "ram"
size = "1MiB"
"#;

#[test]
fn thin_volumes_compile_read_back_and_print() {
    let text = manifest_with(THIN);
    let blob = manifest::build(&text, "node.toml").unwrap();
    let m = Manifest::parse(&blob).unwrap();
    assert_eq!(m.version(), FORMAT_VERSION);
    let pool0 = Pool {
        name: "pool0",
        backing: PoolBacking::File {
            path: "/var/lib/brick/pool0.img",
            size: Some(64 << 20),
        },
    };
    let pools: Vec<Pool<'_>> = m.pools().collect();
    assert_eq!(
        pools,
        [
            pool0,
            Pool {
                name: "disk",
                backing: PoolBacking::Block { path: "/dev/sdz" }
            }
        ]
    );
    let backings: Vec<Backing<'_>> = m.volumes().map(|v| v.backing).collect();
    assert_eq!(
        backings,
        [
            Backing::Thin {
                pool: pool0,
                size: 1 << 40
            },
            Backing::Thin {
                pool: pool0,
                size: 8 << 30
            },
            Backing::Ram { size: 1 << 20 },
        ]
    );
    assert_eq!(backings[0].kind(), VolumeKind::Thin);
    assert_eq!(
        m.volume(0).unwrap().to_string(),
        "thin0 (thin 1TiB on pool pool0) as \"thin0\""
    );
    assert_eq!(
        pools[0].to_string(),
        "pool0 (file /var/lib/brick/pool0.img 64MiB)"
    );
    // The canonical TOML compiles to the same config and the same blob.
    let config = Config::from_manifest(&m);
    let canonical = config.to_string();
    assert!(
        canonical.contains("[[pools]]\nname = \"disk\"\nkind = \"block\"\npath = \"/dev/sdz\"\n")
    );
    assert!(canonical
        .contains("kind = \"thin\"\ndevice_path = \"thin1\"\npool = \"pool0\"\nsize = \"8GiB\"\n"));
    let again = manifest::compile(&canonical, "canonical.toml").unwrap();
    assert_eq!(again, config);
    assert_eq!(again.to_binary().unwrap(), blob);
}

#[test]
fn the_compiler_says_what_is_wrong() {
    let error = |body: &str| {
        manifest::compile(&manifest_with(body), "m.toml")
            .unwrap_err()
            .to_string()
    };
    let unknown = THIN.replace(
        "pool = \"pool0\"\nsize = \"8GiB\"",
        "pool = \"nope\"\nsize = \"8GiB\"",
    );
    assert!(
        error(&unknown).ends_with("volumes[1].pool: unknown pool \"nope\" (declared: pool0, disk)"),
        "{}",
        error(&unknown)
    );
    let sizeless = THIN.replace("size = \"8GiB\"\n", "");
    assert!(
        error(&sizeless).contains("a thin volume needs `size`"),
        "{}",
        error(&sizeless)
    );
    let with_path = THIN.replace("size = \"8GiB\"", "size = \"8GiB\"\npath = \"/x\"");
    assert!(
        error(&with_path)
            .contains("volumes[1].path: not allowed for a thin volume (allowed: pool, size)"),
        "{}",
        error(&with_path)
    );
    let pool_on_ram = THIN.replace("size = \"1MiB\"", "size = \"1MiB\"\npool = \"pool0\"");
    assert!(error(&pool_on_ram).contains("volumes[2].pool: not allowed for a ram volume"));
    let sized_block = THIN.replace(
        "path = \"/dev/sdz\"",
        "path = \"/dev/sdz\"\nsize = \"1GiB\"",
    );
    assert!(error(&sized_block).contains("pools[1].size: not allowed for a block pool"));
    let twice = THIN.replace("name = \"disk\"", "name = \"pool0\"");
    assert!(error(&twice).contains("pools[1].name: duplicate pool name \"pool0\""));
    let shared =
        format!("{THIN}\n[[volumes]]\nname = \"raw\"\nkind = \"block\"\npath = \"/dev/sdz\"\n");
    assert!(
        error(&shared).contains("pools[1].path: same path as volumes[3] (\"raw\")"),
        "{}",
        error(&shared)
    );
    let bad_kind = THIN.replace("kind = \"block\"", "kind = \"ram\"");
    assert!(error(&bad_kind).contains("unknown pool kind \"ram\""));
    let many: String = (0..51)
        .map(|i| format!("\n[[volumes]]\nname = \"t{i}\"\nkind = \"thin\"\npool = \"disk\"\nsize = \"1GiB\"\n"))
        .collect();
    assert!(
        error(&format!("{THIN}{many}")).contains("51 thin volumes on pool \"disk\", at most 50"),
        "{}",
        error(&format!("{THIN}{many}"))
    );
}

#[test]
fn the_reader_holds_blobs_to_the_same_rules() {
    let config = manifest::compile(&manifest_with(THIN), "m.toml").unwrap();
    let mut unknown = config.clone();
    unknown.pools.remove(0);
    assert_eq!(
        unknown.to_binary().unwrap_err(),
        ReadError::UnknownPool("thin0".try_into().unwrap())
    );
    let mut shared = config.clone();
    shared.volumes[2].backing = manifest::config::Backing::Block {
        path: "/dev/sdz".into(),
    };
    assert_eq!(
        shared.to_binary().unwrap_err(),
        ReadError::DuplicateBacking("plain".try_into().unwrap())
    );
    let mut twice = config.clone();
    twice.pools[1].name = "pool0".into();
    assert_eq!(
        twice.to_binary().unwrap_err(),
        ReadError::DuplicatePool("pool0".try_into().unwrap())
    );
    // Format 3 has no pools: the writer refuses to drop them.
    assert!(matches!(
        config.to_binary_version(3),
        Err(ReadError::BadCount {
            section: "pools",
            ..
        })
    ));
}

#[test]
fn older_formats_read_and_cannot_carry_pools() {
    let plain = manifest_with("[[volumes]]\nname = \"v\"\nkind = \"ram\"\nsize = \"1MiB\"\n");
    let config = manifest::compile(&plain, "m.toml").unwrap();
    for version in 1..=3 {
        let blob = config.to_binary_version(version).unwrap();
        let m = Manifest::parse(&blob).unwrap();
        assert_eq!((m.version(), m.pool_count()), (version, 0));
        assert_eq!(Config::from_manifest(&m), config);
    }
    // A version-4 blob relabelled 3: its pool section is unknown there.
    let mut blob = manifest::build(&manifest_with(THIN), "m.toml").unwrap();
    blob[4] = 3;
    manifest::binary::fix_checksum(&mut blob);
    assert_eq!(
        Manifest::parse(&blob).unwrap_err(),
        ReadError::UnknownSection(manifest::binary::section::POOLS)
    );
}

/// Pools on the image's disks: a virtio-blk disk (by PCI address or
/// serial) and an NVMe namespace, read back, printed as TOML that compiles
/// to the same blob; what the compiler refuses about them.
#[test]
fn device_pools_compile_read_back_and_print() {
    use manifest::types::{PciAddress, VirtioSelector};
    let body = r#"
[[pools]]
name = "vpool"
kind = "virtio-blk"
pci = "00:10.0"

[[pools]]
name = "spool"
kind = "virtio-blk"
serial = "pool-disk"

[[pools]]
name = "npool"
kind = "nvme"
serial = "brick-nvme"
namespace = 2

[[volumes]]
name = "t0"
kind = "thin"
pool = "vpool"
size = "1GiB"

[[volumes]]
name = "t1"
kind = "thin"
pool = "npool"
size = "64MiB"
"#;
    let blob = manifest::build(&manifest_with(body), "m.toml").unwrap();
    let m = Manifest::parse(&blob).unwrap();
    let backings: Vec<PoolBacking<'_>> = m.pools().map(|p| p.backing).collect();
    assert_eq!(
        backings,
        [
            PoolBacking::VirtioBlk(VirtioSelector::Pci(PciAddress::parse("00:10.0").unwrap())),
            PoolBacking::VirtioBlk(VirtioSelector::Serial("pool-disk")),
            PoolBacking::Nvme {
                controller: VirtioSelector::Serial("brick-nvme"),
                namespace: 2
            },
        ]
    );
    assert!(backings.iter().all(PoolBacking::is_device));
    assert_eq!(backings[2].kind(), VolumeKind::Nvme);
    let shown: Vec<String> = m.pools().map(|p| p.to_string()).collect();
    assert_eq!(
        shown,
        [
            "vpool (virtio-blk pci 0000:00:10.0)",
            "spool (virtio-blk serial \"pool-disk\")",
            "npool (nvme serial \"brick-nvme\" namespace 2)"
        ]
    );
    let config = Config::from_manifest(&m);
    let canonical = config.to_string();
    assert!(canonical.contains("kind = \"nvme\"\nserial = \"brick-nvme\"\nnamespace = 2\n"));
    let again = manifest::compile(&canonical, "canonical.toml").unwrap();
    assert_eq!(again.to_binary().unwrap(), blob);

    let error = |body: &str| {
        manifest::compile(&manifest_with(body), "m.toml")
            .unwrap_err()
            .to_string()
    };
    let with_path = body.replace("pci = \"00:10.0\"", "pci = \"00:10.0\"\npath = \"/x\"");
    assert!(
        error(&with_path)
            .contains("pools[0].path: not allowed for a virtio-blk pool (allowed: pci, serial)"),
        "{}",
        error(&with_path)
    );
    let sized = body.replace("pci = \"00:10.0\"", "pci = \"00:10.0\"\nsize = \"1GiB\"");
    assert!(error(&sized).contains("pools[0].size: not allowed for a virtio-blk pool"));
    let neither = body.replace("pci = \"00:10.0\"\n", "");
    assert!(error(&neither).contains("pools[0]: a virtio-blk pool needs `pci` or `serial`"));
    let twice = body.replace("serial = \"pool-disk\"", "pci = \"00:10.0\"");
    assert!(
        error(&twice).contains("pools[1]: same device as pools[0] (\"vpool\")"),
        "{}",
        error(&twice)
    );
    let shared =
        format!("{body}\n[[volumes]]\nname = \"raw\"\nkind = \"virtio-blk\"\npci = \"00:10.0\"\n");
    assert!(
        error(&shared).contains("pools[0].kind: same device as volumes[2] (\"raw\")"),
        "{}",
        error(&shared)
    );
    // The reader refuses the same sharing in a blob.
    let mut config = manifest::compile(&manifest_with(body), "m.toml").unwrap();
    config.volumes.push(manifest::config::Volume {
        name: "raw".into(),
        device_path: "raw".into(),
        backing: manifest::config::Backing::VirtioPci(PciAddress::parse("00:10.0").unwrap()),
    });
    assert_eq!(
        config.to_binary().unwrap_err(),
        ReadError::DuplicateBacking("raw".try_into().unwrap())
    );
}
