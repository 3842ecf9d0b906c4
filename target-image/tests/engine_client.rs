//! The engine end to end against Brick's own RTRS + RNBD client over two
//! software HCAs in one process: the engine's interface 0 and a client HCA,
//! joined by an in-memory Ethernet link under a fake clock (the harness is
//! `common`). Covers session setup, SESS_INFO, OPEN, byte-exact 4 KiB and
//! 128 KiB writes and reads, a read-only open refusing writes, an unknown
//! volume, and a session name the access list refuses (closed at INFO_REQ).

mod common;

use common::{pattern, with_world, Fabric, World};
use rnbd::wire::AccessMode;
use rtrs::client::PathError;

const MANIFEST: &str = r#"
[target]
name = "brick-test"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "4MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "4MiB"

[[access]]
sessions = "s*"
volumes = ["vol0"]
mode = "rw"

[[access]]
sessions = "s*"
volumes = ["vol1"]
mode = "ro"
"#;

/// One client connected as `session` (one path, one connection).
fn with_client(session: &'static str, test: impl FnOnce(&mut World<'_>, usize) + Send + 'static) {
    with_world(MANIFEST, move |world| {
        let client = world.add_client(2, 16, 7);
        world.connect(client, session, 1).expect("session up");
        test(world, client);
    });
}

/// SESS_INFO answers protocol version 2, OPEN reports the volume size, and
/// 4 KiB and 128 KiB writes read back byte for byte (the read buffer is
/// scrubbed first, so the data must come from the engine).
#[test]
fn sess_info_open_write_read_byte_exact() {
    with_client("s1", |world, c| {
        assert_eq!(world.sess_info(c, 1), 2);
        let device = world.open(c, 2, "vol0", AccessMode::ReadWrite).unwrap();
        assert_eq!(device.nsectors, 4 * 1024 * 1024 / 512);

        for (index, (offset, len)) in [(0u64, 4096usize), (64 * 1024, 128 * 1024)]
            .into_iter()
            .enumerate()
        {
            let data = pattern(index as u64 + 5, len);
            let tag = 10 + 2 * index as u64;
            assert_eq!(world.write(c, tag, &device, offset, &data), 0);
            let (errno, back) = world.read(c, tag + 1, &device, offset, len as u32);
            assert_eq!(errno, 0);
            assert!(back == data, "{len}-byte read differs");
        }
        let stats = world.engine.stats().to_string();
        assert!(stats.contains("session \"s1\""), "{stats}");
        assert!(stats.contains("volume vol0"), "{stats}");
    });
}

/// vol1 is read-only for `s*`: an RW OPEN gets EACCES, an RO OPEN works and
/// a write through it (sent by a client ignoring its mode) gets EPERM; an
/// unknown volume gets ENOENT.
#[test]
fn read_only_open_refuses_writes_and_unknown_volume() {
    with_client("s2", |world, c| {
        assert_eq!(
            world.open(c, 1, "vol1", AccessMode::ReadWrite).unwrap_err(),
            rnbd::errno::EACCES
        );
        let device = world.open(c, 2, "vol1", AccessMode::ReadOnly).unwrap();
        let mut writable = device;
        writable.mode = AccessMode::ReadWrite; // a hostile client ignores its mode
        assert_eq!(
            world.write(c, 3, &writable, 0, &[7; 4096]),
            rnbd::errno::EPERM
        );
        assert_eq!(
            world.open(c, 4, "nope", AccessMode::ReadOnly).unwrap_err(),
            rnbd::errno::ENOENT
        );
    });
}

/// A session name no access rule matches never gets a session: its path
/// is closed at INFO_REQ, and the engine holds nothing of it.
#[test]
fn session_name_refused_by_access_list() {
    with_world(MANIFEST, |world| {
        let c = world.add_client(2, 16, 7);
        assert_eq!(world.connect(c, "other", 1), Err(PathError::Disconnected));
        assert!(world.engine.rtrs(0).unwrap().stats().paths_refused >= 1);
        assert!(world.log_count("refuse: session \"other\"") >= 1);
        assert_eq!(world.log_count("session \"other\" opened"), 0);
        world.close_session(c);
        world.run_until("nothing held", |w| w.engine.is_idle());
    });
}
