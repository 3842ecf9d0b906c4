//! TOML compiler tests: the examples, round trips, and one error per mistake.
//!
//! Every bad manifest must be refused with the right line and field path;
//! every example must compile, encode, read back to the same config, and
//! print as TOML that compiles to the same config again.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use manifest::binary::{Backing, Manifest};
use manifest::config::VolumeSet;
use manifest::{compile, AccessMode, Config};

fn examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "expected the example manifests in {}",
        dir.display()
    );
    files
}

fn round_trip(config: &Config) {
    let blob = config.to_binary().expect("encodes");
    let manifest = Manifest::parse(&blob).expect("reads back");
    assert_eq!(&Config::from_manifest(&manifest), config);
    let printed = config.to_string();
    let again = compile(&printed, "printed.toml").unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(&again, config, "Display output compiles to the same config");
}

#[test]
fn test_every_example_compiles_and_round_trips() {
    for path in examples() {
        let config = manifest::compile_file(&path).unwrap_or_else(|e| panic!("{e}"));
        round_trip(&config);
    }
}

#[test]
fn test_two_ram_volumes_example() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/two-ram-volumes.toml");
    let blob = manifest::build(
        &std::fs::read_to_string(&path).unwrap(),
        "two-ram-volumes.toml",
    )
    .unwrap();
    let m = Manifest::parse(&blob).unwrap();
    let names: Vec<_> = m
        .volumes()
        .map(|v| (v.name, v.device_path, v.backing))
        .collect();
    assert_eq!(
        names,
        [
            ("vol0", "vol0", Backing::Ram { size: 256 << 20 }),
            ("vol1", "vol1", Backing::Ram { size: 256 << 20 })
        ]
    );
    assert_eq!(m.ram_volume_bytes(), 512 << 20);
    let interface = m.interfaces().next().unwrap();
    assert_eq!(interface.address.to_string(), "10.77.0.1/24");
    assert_eq!(interface.mtu, 1500);
    let any = Ipv4Addr::new(192, 0, 2, 1);
    assert!(m.admits("whatever-name", any));
    assert_eq!(m.access("s1", any, 1), Some(AccessMode::ReadWrite));
    let target = m.target();
    assert!(target.always_invalidate);
    assert_eq!(target.port, 1234);
    assert_eq!(m.limits(), manifest::Limits::default());
    assert_eq!(m.limits().max_io_size(), 128 * 1024);
}

#[test]
fn test_multipath_example() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/multipath.toml");
    let config = manifest::compile_file(&path).unwrap();
    assert_eq!(config.interfaces.len(), 2);
    assert_eq!(
        config.access[0].volumes,
        VolumeSet::Only(vec!["vol0".into()])
    );
}

#[test]
fn test_access_rules() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/file-backed.toml");
    let blob = manifest::build(&std::fs::read_to_string(&path).unwrap(), "f.toml").unwrap();
    let m = Manifest::parse(&blob).unwrap();
    let lab = Ipv4Addr::new(10, 77, 0, 9);
    let outside = Ipv4Addr::new(10, 99, 0, 9);
    let (data, _) = m.volume_by_device_path("tenant-a/data").unwrap();
    let (shared, _) = m.volume_by_name("shared").unwrap();
    assert_eq!(
        m.access("tenant-a-1", lab, data),
        Some(AccessMode::ReadWrite)
    );
    assert_eq!(m.access("tenant-b-1", lab, data), None);
    assert_eq!(m.access("tenant-a-1", outside, data), None);
    assert_eq!(
        m.access("tenant-b-1", lab, shared),
        Some(AccessMode::ReadOnly)
    );
    assert_eq!(
        m.access("tenant-a-1", lab, shared),
        Some(AccessMode::ReadOnly)
    );
    assert!(!m.admits("anyone", outside));
    assert!(m.volume_by_device_path("data").is_none());
}

/// A valid manifest with known line numbers (line 1 is `[target]`).
const BASE: &str = r#"[target]
name = "t"

[[interfaces]]
name = "eth0"
mac = "52:54:00:00:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "256MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "256MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;

#[test]
fn test_base_is_valid() {
    round_trip(&compile(BASE, "m.toml").unwrap());
}

/// Replaces line `line` (1-based) of BASE.
fn with_line(line: usize, text: &str) -> String {
    BASE.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { text } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

#[track_caller]
fn assert_error(source: &str, line: Option<usize>, path: &str, needle: &str) {
    let error = compile(source, "m.toml").expect_err("must be refused");
    let text = error.to_string();
    assert_eq!(error.line, line, "{text}");
    assert_eq!(error.path, path, "{text}");
    assert!(
        text.contains(needle),
        "{text:?} does not contain {needle:?}"
    );
    assert!(text.starts_with("m.toml:"), "{text}");
    assert!(!text.contains('\n'), "one line: {text:?}");
}

#[test]
fn test_unknown_keys() {
    assert_error(
        &with_line(12, "sise = \"256MiB\""),
        Some(12),
        "volumes[0].sise",
        "unknown field `sise`",
    );
    assert_error(
        &with_line(2, "name = \"t\"\nfoo = 1"),
        Some(3),
        "target.foo",
        "unknown field `foo`",
    );
    assert_error(
        &format!("{BASE}\n[limit]\nqueue_depth = 1\n"),
        Some(24),
        "limit",
        "unknown field `limit`",
    );
    assert_error(
        &format!("{BASE}extra = true\n"),
        Some(23),
        "access[0].extra",
        "unknown field `extra`",
    );
    assert_error(
        &format!("{BASE}\n[limits]\nqueue = 4\n"),
        Some(25),
        "limits.queue",
        "unknown field `queue`",
    );
}

#[test]
fn test_missing_fields() {
    let error = compile(&with_line(11, ""), "m.toml").unwrap_err();
    assert_eq!(error.path, "volumes[0]", "{error}");
    assert!(
        error.to_string().contains("missing field `kind`"),
        "{error}"
    );
    assert_error(&with_line(12, ""), Some(9), "volumes[0]", "needs `size`");
    let error = compile(&with_line(2, ""), "m.toml").unwrap_err();
    assert!(
        error.to_string().contains("missing field `name`"),
        "{error}"
    );
    assert_error(
        &BASE.replace("[target]\nname = \"t\"\n", ""),
        None,
        "",
        "missing field `target`",
    );
    let no_access = &BASE[..BASE.find("[[access]]").unwrap()];
    assert_error(no_access, None, "access", "no [[access]] rules");
}

#[test]
fn test_bad_values() {
    assert_error(
        &with_line(12, "size = \"12XB\""),
        Some(12),
        "volumes[0].size",
        "found \"12XB\"",
    );
    assert_error(
        &with_line(12, "size = \"0MiB\""),
        Some(12),
        "volumes[0].size",
        "must not be zero",
    );
    assert_error(
        &with_line(12, "size = 1000"),
        Some(12),
        "volumes[0].size",
        "not a multiple of 4096",
    );
    assert_error(
        &with_line(12, "size = -4096"),
        Some(12),
        "volumes[0].size",
        "expected a size",
    );
    assert_error(
        &with_line(6, "mac = \"52:54:00:00:01\""),
        Some(6),
        "interfaces[0].mac",
        "expected a MAC",
    );
    assert_error(
        &with_line(6, "mac = \"01:00:5e:00:00:01\""),
        Some(6),
        "interfaces[0].mac",
        "unicast",
    );
    assert_error(
        &with_line(7, "address = \"10.77.0.1/33\""),
        Some(7),
        "interfaces[0].address",
        "prefix",
    );
    assert_error(
        &with_line(7, "address = \"10.77.0.1\""),
        Some(7),
        "interfaces[0].address",
        "with prefix",
    );
    assert_error(
        &with_line(7, "address = \"10.77.0.0/24\""),
        Some(7),
        "interfaces[0].address",
        "not a usable host",
    );
    assert_error(
        &with_line(7, "address = \"10.77.0.1/24\"\nmtu = 100"),
        Some(8),
        "interfaces[0].mtu",
        "576..=9000",
    );
    assert_error(
        &with_line(11, "kind = \"tape\""),
        Some(11),
        "volumes[0].kind",
        "unknown volume kind \"tape\"",
    );
    assert_error(
        &with_line(10, "name = \"vol 0\""),
        Some(10),
        "volumes[0].name",
        "character ' '",
    );
    assert_error(
        &with_line(22, "mode = \"migration\""),
        Some(22),
        "access[0].mode",
        "\"ro\" or \"rw\"",
    );
    assert_error(
        &with_line(20, "sessions = \"a.b\""),
        Some(20),
        "access[0].sessions",
        "'.'",
    );
    assert_error(
        &with_line(21, "volumes = [\"vol9\"]"),
        Some(21),
        "access[0].volumes",
        "unknown volume \"vol9\"",
    );
    assert_error(
        &with_line(21, "volumes = []"),
        Some(21),
        "access[0].volumes",
        "empty volume list",
    );
    assert_error(
        &with_line(21, "volumes = \"all\""),
        Some(21),
        "access[0].volumes",
        "expected \"*\"",
    );
    assert_error(
        &with_line(21, "volumes = [\"vol0\", \"vol0\"]"),
        Some(21),
        "access[0].volumes",
        "listed twice",
    );
    assert_error(
        &with_line(20, "sessions = \"*\"\nsource = \"10.0.0.0/40\""),
        Some(21),
        "access[0].source",
        "IPv4",
    );
    assert_error(
        &with_line(2, "name = 5"),
        Some(2),
        "target.name",
        "invalid type",
    );
    assert_error(
        &with_line(2, "name = \"t\"\nuuid = \"xyz\""),
        Some(3),
        "target.uuid",
        "expected a UUID",
    );
    assert_error(
        &with_line(2, "name = \"t\"\nport = 0"),
        Some(3),
        "target.port",
        "outside 1..=65535",
    );
    assert_error("[target\n", Some(1), "", "");
}

#[test]
fn test_duplicates() {
    assert_error(
        &with_line(15, "name = \"vol0\""),
        Some(15),
        "volumes[1].name",
        "duplicate volume name \"vol0\"",
    );
    let dup_path = with_line(16, "kind = \"ram\"\ndevice_path = \"vol0\"");
    assert_error(
        &dup_path,
        Some(17),
        "volumes[1].device_path",
        "device_path \"vol0\"",
    );
    let two = format!(
        "{BASE}\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:00:00:02\"\naddress = \"10.78.0.1/24\"\n"
    );
    assert_error(
        &two,
        Some(25),
        "interfaces[1].name",
        "duplicate interface name",
    );
    let two = format!(
        "{BASE}\n[[interfaces]]\nname = \"eth1\"\nmac = \"52:54:00:00:00:01\"\naddress = \"10.78.0.1/24\"\n"
    );
    assert_error(
        &two,
        Some(26),
        "interfaces[1].mac",
        "also used by interfaces[0]",
    );
    let disks = format!(
        "{BASE}\n[[volumes]]\nname = \"d0\"\nkind = \"virtio-blk\"\npci = \"00:05.0\"\n\n[[volumes]]\nname = \"d1\"\nkind = \"virtio-blk\"\npci = \"0000:00:05.0\"\n"
    );
    assert_error(
        &disks,
        Some(29),
        "volumes[3]",
        "same backing device as volumes[2]",
    );
}

#[test]
fn test_kind_fields() {
    assert_error(
        &with_line(12, "size = \"1MiB\"\npath = \"/x\""),
        Some(13),
        "volumes[0].path",
        "not allowed for a ram volume",
    );
    let file = with_line(11, "kind = \"file\"\npath = \"relative.img\"");
    assert_error(
        &file,
        Some(12),
        "volumes[0].path",
        "must be an absolute path",
    );
    let virtio = with_line(11, "kind = \"virtio-blk\"").replace(
        "size = \"256MiB\"\n\n[[volumes]]\nname = \"vol1\"",
        "pci = \"00:32.0\"\n\n[[volumes]]\nname = \"vol1\"",
    );
    assert_error(
        &virtio,
        Some(12),
        "volumes[0].pci",
        "expected a PCI address",
    );
    let both = with_line(
        11,
        "kind = \"virtio-blk\"\npci = \"00:05.0\"\nserial = \"s\"",
    )
    .replacen("size = \"256MiB\"\n", "", 1);
    assert_error(&both, Some(13), "volumes[0].serial", "not both");
    let neither = with_line(11, "kind = \"virtio-blk\"").replacen("size = \"256MiB\"\n", "", 1);
    assert_error(&neither, Some(9), "volumes[0]", "needs `pci` or `serial`");
    let block = with_line(11, "kind = \"block\"").replacen("size = \"256MiB\"\n", "", 1);
    assert_error(&block, Some(9), "volumes[0]", "needs `path`");
}

#[test]
fn test_limits() {
    let limits = |body: &str| format!("{BASE}\n[limits]\n{body}\n");
    assert_error(
        &limits("queue_depth = 0"),
        Some(25),
        "limits.queue_depth",
        "0 is outside 1..=512",
    );
    assert_error(
        &limits("queue_depth = 513"),
        Some(25),
        "limits.queue_depth",
        "outside 1..=512",
    );
    assert_error(
        &limits("max_sessions = 0"),
        Some(25),
        "limits.max_sessions",
        "outside 1..=1024",
    );
    assert_error(
        &limits("max_paths_per_session = 129"),
        Some(25),
        "limits.max_paths_per_session",
        "1..=128",
    );
    assert_error(
        &limits("max_connections_per_path = 1"),
        Some(25),
        "limits.max_connections_per_path",
        "2..=1025",
    );
    assert_error(
        &limits("chunk_size = \"4KiB\""),
        Some(25),
        "limits.chunk_size",
        "multiple of 4096 in 8192..=528384",
    );
    assert_error(
        &limits("chunk_size = \"135000\""),
        Some(25),
        "limits.chunk_size",
        "multiple of 4096",
    );
    assert_error(
        &limits("chunk_size = \"516KiB\""),
        Some(25),
        "limits.chunk_size",
        "immediate bits",
    );
    let config = compile(
        &limits("chunk_size = \"516KiB\"\nqueue_depth = 256\nmax_sessions = 2"),
        "m.toml",
    )
    .unwrap();
    assert_eq!(config.limits.max_io_size(), 512 * 1024);
    round_trip(&config);
    let config = compile(
        &limits("chunk_size = \"256KiB\"\nqueue_depth = 64"),
        "m.toml",
    )
    .unwrap();
    assert_eq!(config.limits.chunk_size, 256 * 1024);
}

#[test]
fn test_defaults_and_options() {
    let source = with_line(2, "name = \"t\"\nuuid = \"6f1c3e2a-0b7d-4c1e-9a55-1d2e3f405162\"\nport = 4000\nalways_invalidate = false");
    let config = compile(&source, "m.toml").unwrap();
    assert!(!config.target.always_invalidate);
    assert_eq!(config.target.port, 4000);
    assert!(config.target.uuid.is_some());
    assert_eq!(config.volumes[0].device_path, "vol0");
    assert_eq!(config.interfaces[0].mtu, 1500);
    round_trip(&config);
    let source = with_line(20, "sessions = \"db-?\"\nsource = \"10.77.0.5\"")
        .replace("volumes = \"*\"", "volumes = [\"vol1\"]")
        .replace("mode = \"rw\"", "mode = \"ro\"");
    let config = compile(&source, "m.toml").unwrap();
    assert_eq!(config.access[0].source.unwrap().prefix, 32);
    round_trip(&config);
    let blob = config.to_binary().unwrap();
    let m = Manifest::parse(&blob).unwrap();
    let client = Ipv4Addr::new(10, 77, 0, 5);
    assert_eq!(m.access("db-1", client, 1), Some(AccessMode::ReadOnly));
    assert_eq!(m.access("db-1", client, 0), None);
    assert_eq!(m.access("db-12", client, 1), None);
    assert_eq!(m.access("db-1", Ipv4Addr::new(10, 77, 0, 6), 1), None);
}

proptest::proptest! {
    /// Any text: an error (one line, with the file name) or a config that
    /// round-trips; never a panic.
    #[test]
    fn prop_any_text(text in "\\PC{0,200}") {
        match compile(&text, "m.toml") {
            Err(e) => proptest::prop_assert!(!e.to_string().contains('\n')),
            Ok(config) => round_trip(&config),
        }
    }

    /// The base manifest with one line replaced by arbitrary text.
    #[test]
    fn prop_mangled_line(line in 1usize..=22, text in "\\PC{0,40}") {
        if let Ok(config) = compile(&with_line(line, &text), "m.toml") {
            round_trip(&config);
        }
    }
}

#[test]
fn test_errors_stay_on_one_line() {
    assert_error(
        &with_line(2, "name = \"t\"\n\"a\\nb\" = 1"),
        Some(3),
        "target.a\\nb",
        "unknown field",
    );
    assert_error(
        &with_line(2, "name = \"a\\nb\""),
        Some(2),
        "target.name",
        "\"a\\nb\"",
    );
}

#[test]
fn test_display_escapes_strings() {
    let source = with_line(11, "kind = \"file\"\npath = \"/srv/a \\\"b\\\" \\\\ é\"").replacen(
        "size = \"256MiB\"\n",
        "",
        1,
    );
    let config = compile(&source, "m.toml").unwrap();
    round_trip(&config);
}
