//! The admin endpoint (format version 4): compiled from TOML, written,
//! read back and printed; what the compiler and the reader refuse; older
//! formats read without one and cannot carry one.

use std::net::{Ipv4Addr, SocketAddrV4};

use manifest::binary::{fix_checksum, section, Manifest, ReadError, FORMAT_VERSION};
use manifest::Config;

fn manifest_with(body: &str) -> String {
    format!(
        "[target]\nname = \"node\"\n\n[[interfaces]]\nname = \"eth0\"\n\
         mac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\n\
         [[volumes]]\nname = \"v\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n{body}"
    )
}

const ADMIN: &str =
    "\n[admin]\naddress = \"127.0.0.1:9100\"\nsources = [\"127.0.0.1\", \"10.0.0.0/8\"]\n";

#[test]
fn the_admin_endpoint_compiles_reads_back_and_prints() {
    let blob = manifest::build(&manifest_with(ADMIN), "node.toml").unwrap();
    let m = Manifest::parse(&blob).unwrap();
    assert_eq!(m.version(), FORMAT_VERSION);
    let admin = m.admin().expect("an admin endpoint");
    assert_eq!(admin.address, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9100));
    let sources: Vec<String> = admin.sources().iter().map(ToString::to_string).collect();
    assert_eq!(sources, ["127.0.0.1/32", "10.0.0.0/8"]);
    assert!(admin.allows(Ipv4Addr::LOCALHOST));
    assert!(admin.allows(Ipv4Addr::new(10, 9, 8, 7)));
    assert!(!admin.allows(Ipv4Addr::new(127, 0, 0, 2)));
    let config = Config::from_manifest(&m);
    let printed = config.to_string();
    assert!(
        printed.contains(
            "[admin]\naddress = \"127.0.0.1:9100\"\nsources = [\"127.0.0.1/32\", \"10.0.0.0/8\"]"
        ),
        "{printed}"
    );
    // The printed form compiles to the same blob.
    assert_eq!(manifest::build(&printed, "printed.toml").unwrap(), blob);
}

#[test]
fn without_admin_the_manifest_has_none_and_older_formats_cannot_carry_one() {
    let blob = manifest::build(&manifest_with(""), "node.toml").unwrap();
    assert_eq!(Manifest::parse(&blob).unwrap().admin(), None);
    let config = manifest::compile(&manifest_with(ADMIN), "node.toml").unwrap();
    let err = config.to_binary_version(3).unwrap_err();
    assert!(err.to_string().contains("admin"), "{err}");
    let plain = manifest::compile(&manifest_with(""), "node.toml").unwrap();
    let v3 = plain.to_binary_version(3).unwrap();
    assert_eq!(Manifest::parse(&v3).unwrap().admin(), None);
}

#[test]
fn the_compiler_refuses_bad_admin_fields() {
    for (body, expect) in [
        (
            "address = \"127.0.0.1\"\nsources = [\"127.0.0.1\"]",
            "IPv4 address and port",
        ),
        (
            "address = \"127.0.0.1:0\"\nsources = [\"127.0.0.1\"]",
            "port 0",
        ),
        ("address = \"127.0.0.1:9100\"\nsources = []", "0 sources"),
        (
            "address = \"127.0.0.1:9100\"\nsources = [\"10.0.0.0/33\"]",
            "admin.sources[0]",
        ),
        ("address = \"127.0.0.1:9100\"", "sources"),
        (
            "address = \"127.0.0.1:9100\"\nsources = [\"1.1.1.1\"]\nport = 3",
            "port",
        ),
    ] {
        let err = manifest::compile(&manifest_with(&format!("\n[admin]\n{body}\n")), "m.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{body:?}: {err}");
    }
    let nine: Vec<String> = (1..=9).map(|i| format!("\"10.0.0.{i}\"")).collect();
    let body = format!(
        "\n[admin]\naddress = \"127.0.0.1:9100\"\nsources = [{}]\n",
        nine.join(", ")
    );
    let err = manifest::compile(&manifest_with(&body), "m.toml").unwrap_err();
    assert!(err.to_string().contains("9 sources"), "{err}");
}

/// The admin record's offset in `blob` (from the section table).
fn admin_record(blob: &[u8]) -> usize {
    let count = usize::from(u16::from_le_bytes([blob[16], blob[17]]));
    (0..count)
        .map(|i| &blob[24 + 12 * i..36 + 12 * i])
        .find(|e| u16::from_le_bytes([e[0], e[1]]) == section::ADMIN)
        .map(|e| u32::from_le_bytes([e[8], e[9], e[10], e[11]]) as usize)
        .expect("an admin section")
}

#[test]
fn the_reader_refuses_a_bad_admin_record() {
    let good = manifest::build(&manifest_with(ADMIN), "node.toml").unwrap();
    let at = admin_record(&good);
    for (offset, value, expect) in [
        (4, 0u8, ReadError::BadAdmin("port 0 is not a listen port")),
        (6, 0, ReadError::BadAdmin("source count is not 1..=8")),
        (6, 9, ReadError::BadAdmin("source count is not 1..=8")),
        (7, 1, ReadError::ReservedNotZero("admin bytes")),
        (8 + 4, 40, ReadError::BadAdmin("a source prefix is over 32")),
        (8 + 5, 1, ReadError::ReservedNotZero("admin source bytes")),
        (
            8 + 16,
            1,
            ReadError::BadAdmin("bytes past the last source are not zero"),
        ),
    ] {
        let mut blob = good.clone();
        if offset == 4 {
            blob[at + 5] = 0; // both port bytes
        }
        blob[at + offset] = value;
        fix_checksum(&mut blob);
        assert_eq!(
            Manifest::parse(&blob).unwrap_err(),
            expect,
            "byte {offset} = {value}"
        );
    }
}
