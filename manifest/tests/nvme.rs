//! NVMe volumes (format version 2): compiled from TOML by controller PCI
//! address or serial plus namespace, written, read back and printed; the
//! rules the compiler and the reader share; version 1 blobs still read,
//! and cannot carry NVMe volumes.

use manifest::binary::{fix_checksum, Backing, Manifest, ReadError, FORMAT_VERSION};
use manifest::types::{PciAddress, VirtioSelector, VolumeKind};
use manifest::Config;

fn manifest_with(volumes: &str) -> String {
    format!(
        "[target]\nname = \"node\"\n\n[[interfaces]]\nname = \"eth0\"\n\
         mac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n{volumes}\n\
         [[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
    )
}

const TWO_NAMESPACES: &str = r#"
[[volumes]]
name = "fast0"
kind = "nvme"
serial = "brick-nvme0"

[[volumes]]
name = "fast1"
kind = "nvme"
serial = "brick-nvme0"
namespace = 2

[[volumes]]
name = "slot4"
kind = "nvme"
pci = "00:04.0"
namespace = 7
"#;

#[test]
fn nvme_volumes_compile_and_read_back() {
    let text = manifest_with(TWO_NAMESPACES);
    let blob = manifest::build(&text, "node.toml").unwrap();
    assert_eq!(u16::from_le_bytes([blob[4], blob[5]]), FORMAT_VERSION);
    let m = Manifest::parse(&blob).unwrap();
    assert_eq!(m.version(), FORMAT_VERSION);
    let backings: Vec<Backing<'_>> = m.volumes().map(|v| v.backing).collect();
    assert_eq!(
        backings,
        [
            Backing::Nvme {
                controller: VirtioSelector::Serial("brick-nvme0"),
                namespace: 1
            },
            Backing::Nvme {
                controller: VirtioSelector::Serial("brick-nvme0"),
                namespace: 2
            },
            Backing::Nvme {
                controller: VirtioSelector::Pci(PciAddress::parse("00:04.0").unwrap()),
                namespace: 7
            },
        ]
    );
    assert!(backings.iter().all(|b| b.kind() == VolumeKind::Nvme));
    let shown: Vec<String> = m.volumes().map(|v| v.to_string()).collect();
    assert_eq!(
        shown[1],
        "fast1 (nvme serial brick-nvme0 namespace 2) as \"fast1\""
    );
    assert_eq!(
        shown[2],
        "slot4 (nvme pci 0000:00:04.0 namespace 7) as \"slot4\""
    );
    // The canonical TOML compiles to the same blob.
    let config = Config::from_manifest(&m);
    let again = manifest::build(&config.to_string(), "canonical.toml").unwrap();
    assert_eq!(again, blob);
}

#[test]
fn the_compiler_says_what_is_wrong_with_an_nvme_volume() {
    for (volume, message) in [
        (
            "kind = \"nvme\"\nserial = \"a\"\nnamespace = 0",
            "volumes[0].namespace: expected a namespace id from 1 to 65535, found 0",
        ),
        (
            "kind = \"nvme\"\nserial = \"a\"\nnamespace = 70000",
            "found 70000",
        ),
        (
            "kind = \"nvme\"\nnamespace = 1",
            "an nvme volume needs `pci` or `serial` (its controller)",
        ),
        (
            "kind = \"nvme\"\npci = \"00:04.0\"\nserial = \"a\"",
            "give either `pci` or `serial`, not both",
        ),
        (
            "kind = \"nvme\"\npci = \"00:04\"",
            "expected a PCI address like \"00:05.0\", found \"00:04\"",
        ),
        (
            "kind = \"virtio-blk\"\nserial = \"a\"\nnamespace = 1",
            "volumes[0].namespace: not allowed for a virtio-blk volume",
        ),
        (
            "kind = \"nvme\"\nserial = \"a\"\nsize = \"1MiB\"",
            "volumes[0].size: not allowed for a nvme volume",
        ),
    ] {
        let text = manifest_with(&format!("\n[[volumes]]\nname = \"v\"\n{volume}\n"));
        let error = manifest::compile(&text, "m.toml").unwrap_err().to_string();
        assert!(error.contains(message), "{volume:?}: {error}");
    }
    // The same namespace of the same controller twice.
    let twice = manifest_with(
        "\n[[volumes]]\nname = \"a\"\nkind = \"nvme\"\nserial = \"s\"\n\
         \n[[volumes]]\nname = \"b\"\nkind = \"nvme\"\nserial = \"s\"\nnamespace = 1\n",
    );
    let error = manifest::compile(&twice, "m.toml").unwrap_err().to_string();
    assert!(
        error.contains("same backing device as volumes[0]"),
        "{error}"
    );
}

/// Offset of volume `index`'s record (VOLUMES is section id 4).
fn volume_record(blob: &[u8], index: usize) -> usize {
    let count = u16::from_le_bytes([blob[16], blob[17]]) as usize;
    (0..count)
        .map(|n| 24 + n * 12)
        .find(|e| u16::from_le_bytes([blob[*e], blob[e + 1]]) == 4)
        .map(|e| u32::from_le_bytes(blob[e + 8..e + 12].try_into().unwrap()) as usize + index * 40)
        .unwrap()
}

#[test]
fn the_reader_holds_blobs_to_the_same_rules() {
    let text = manifest_with(TWO_NAMESPACES);
    let blob = manifest::build(&text, "node.toml").unwrap();
    let patched = |patch: &dyn Fn(&mut Vec<u8>)| {
        let mut bad = blob.clone();
        patch(&mut bad);
        fix_checksum(&mut bad);
        Manifest::parse(&bad).map(|_| ()).unwrap_err()
    };
    let first = volume_record(&blob, 0);
    // Namespace 0.
    let error = patched(&|b| b[first + 34..first + 36].copy_from_slice(&[0, 0]));
    assert!(
        error
            .to_string()
            .contains("an NVMe volume names a namespace"),
        "{error}"
    );
    // A version 1 blob cannot name kind 5.
    let config = manifest::compile(&text, "node.toml").unwrap();
    assert_eq!(
        config.to_binary_version(1).unwrap_err(),
        ReadError::UnknownVolumeKind(5)
    );
    // A namespace on a RAM volume.
    let ram = manifest::build(
        &manifest_with("\n[[volumes]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n"),
        "ram.toml",
    )
    .unwrap();
    let mut bad = ram.clone();
    let record = volume_record(&bad, 0);
    bad[record + 34] = 1;
    fix_checksum(&mut bad);
    assert_eq!(
        Manifest::parse(&bad).unwrap_err(),
        ReadError::ReservedNotZero("volume bytes")
    );
    // The same RAM manifest as version 1 reads as before.
    let _ = ram;
    let config = manifest::compile(
        &manifest_with("\n[[volumes]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n"),
        "ram.toml",
    )
    .unwrap();
    let old = config.to_binary_version(1).unwrap();
    assert_eq!(Manifest::parse(&old).unwrap().version(), 1);
}

#[test]
fn a_newer_blob_says_it_is_newer() {
    let mut blob = manifest::build(&manifest_with(TWO_NAMESPACES), "node.toml").unwrap();
    blob[4] = 5;
    fix_checksum(&mut blob);
    let error = Manifest::parse(&blob).unwrap_err();
    assert_eq!(
        error,
        ReadError::UnsupportedVersion {
            found: 5,
            supported: 4
        }
    );
    assert!(error
        .to_string()
        .ends_with("the manifest is newer than this build"));
}
