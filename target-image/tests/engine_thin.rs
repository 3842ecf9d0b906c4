//! The engine serving thin volumes as the hosted target does
//! (`target_image::hosted::open_volume`, `hosted_thin`): two volumes that
//! overcommit one file pool share its extents, unallocated space reads
//! zeroes, the write that needs an extent of a full pool is answered
//! ENOSPC and only it, a whole-extent DISCARD frees an extent for the
//! other volume, and an engine built afterwards on the same thread opens
//! the pool afresh from the file (the registry holds only weak handles)
//! and finds every acknowledged write.

mod common;

use std::path::{Path, PathBuf};

use common::{pattern, Fabric, Keys, World};
use manifest::binary::Manifest;
use rnbd::client::Device;
use rnbd::wire::AccessMode;
use target_image::{hosted, Engine};

const MIB: u64 = 1 << 20;
const ENOSPC: u16 = 28;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("brick-engine-thin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// A 16 MiB pool (7 extents after its metadata) under two 8 MiB volumes
/// (4 extents each).
fn manifest_text(pool: &Path) -> String {
    format!(
        r#"
[target]
name = "brick-thin-test"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[pools]]
name = "pool0"
kind = "file"
path = "{}"
size = "16MiB"

[[volumes]]
name = "thin0"
kind = "thin"
pool = "pool0"
size = "8MiB"

[[volumes]]
name = "thin1"
kind = "thin"
pool = "pool0"
size = "8MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#,
        pool.display()
    )
}

/// Builds an engine from `text` and runs `test` on it.
fn serve(text: &str, test: impl FnOnce(&mut World<'_, hosted::HostedVolume>)) {
    let blob = manifest::build(text, "thin.toml").expect("manifest");
    let manifest = Manifest::parse(&blob).expect("manifest blob");
    let engine = Engine::with_volumes(manifest, |i| Keys(1000 + i as u64), hosted::open_volume)
        .expect("engine with thin volumes");
    let mut world = World::with_engine(engine);
    test(&mut world);
}

/// An RNBD DISCARD from client `c`: the errno.
fn discard(
    world: &mut World<'_, hosted::HostedVolume>,
    c: usize,
    tag: u64,
    device: &Device,
    offset: u64,
    len: u32,
) -> u16 {
    let mut header = [0u8; 64];
    let out = device.discard(offset, len, &mut header).unwrap();
    world.write_request(c, tag, &header[..out.user_header_len], &[], false)
}

#[test]
fn thin_volumes_share_a_pool_run_out_free_and_persist() {
    let pool = scratch("pool0.img");
    let text = manifest_text(&pool);
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            serve(&text, |world| {
                let c = world.add_client(2, 16, 7);
                world.connect(c, "s1", 1).expect("session up");
                let thin0 = world.open(c, 1, "thin0", AccessMode::ReadWrite).unwrap();
                let thin1 = world.open(c, 2, "thin1", AccessMode::ReadWrite).unwrap();
                assert_eq!(thin0.nsectors, 8 * MIB / 512);
                assert!(
                    thin0.geometry.max_discard_sectors > 0,
                    "thin volumes discard"
                );
                let (errno, zeroes) = world.read(c, 3, &thin0, MIB, 65536);
                assert_eq!(errno, 0);
                assert!(zeroes.iter().all(|&b| b == 0));
                // 4 + 3 extents fill the 7 of the pool.
                let mut tag = 10;
                for (device, extents) in [(&thin0, 0..4u64), (&thin1, 0..3u64)] {
                    for extent in extents {
                        let data = pattern(tag, 4096);
                        assert_eq!(
                            world.write(c, tag, device, extent * 2 * MIB + 8192, &data),
                            0
                        );
                        tag += 1;
                    }
                }
                let last = pattern(99, 4096);
                assert_eq!(
                    world.write(c, 30, &thin1, 6 * MIB, &last),
                    ENOSPC,
                    "the pool is full"
                );
                // Allocated extents, and reads, go on.
                assert_eq!(world.write(c, 31, &thin1, 65536, &pattern(31, 8192)), 0);
                let (errno, back) = world.read(c, 32, &thin1, 65536, 8192);
                assert_eq!((errno, back == pattern(31, 8192)), (0, true));
                // Freeing thin0's extent 1 makes room for thin1's extent 3.
                assert_eq!(discard(world, c, 33, &thin0, 2 * MIB, (2 * MIB) as u32), 0);
                assert_eq!(world.write(c, 34, &thin1, 6 * MIB, &last), 0);
                let (errno, gone) = world.read(c, 35, &thin0, 2 * MIB + 8192, 4096);
                assert_eq!((errno, gone.iter().all(|&b| b == 0)), (0, true));
                // A partial discard zeroes what it covers, nothing more.
                assert_eq!(discard(world, c, 36, &thin1, 65536, 4096), 0);
                let (errno, back) = world.read(c, 37, &thin1, 65536, 8192);
                assert_eq!(errno, 0);
                assert!(back[..4096].iter().all(|&b| b == 0));
                assert!(back[4096..] == pattern(31, 8192)[4096..]);
                assert_eq!(world.engine.volume_requests_in_flight(), 0);
                world.close_session(c);
            });
            // A new engine on this thread reopens the pool from the file.
            serve(&text, |world| {
                let c = world.add_client(2, 16, 8);
                world.connect(c, "s2", 1).expect("session up");
                let thin0 = world.open(c, 1, "thin0", AccessMode::ReadWrite).unwrap();
                let thin1 = world.open(c, 2, "thin1", AccessMode::ReadWrite).unwrap();
                let check = |world: &mut World<'_, _>, tag, device, offset, expected: &[u8]| {
                    let (errno, back) = world.read(c, tag, device, offset, expected.len() as u32);
                    assert_eq!(errno, 0);
                    assert!(
                        back == expected,
                        "{} bytes at {offset} differ",
                        expected.len()
                    );
                };
                check(world, 3, &thin0, 8192, &pattern(10, 4096));
                check(world, 4, &thin0, 2 * MIB + 8192, &[0; 4096]);
                check(world, 5, &thin0, 6 * MIB + 8192, &pattern(13, 4096));
                check(world, 6, &thin1, 4 * MIB + 8192, &pattern(16, 4096));
                check(world, 7, &thin1, 6 * MIB, &pattern(99, 4096));
                // Still full: 7 extents in use again.
                assert_eq!(
                    world.write(c, 8, &thin0, 2 * MIB, &pattern(8, 4096)),
                    ENOSPC
                );
                world.close_session(c);
            });
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), 16 * MIB);
}

/// A pool on a virtio-blk disk or an NVMe namespace is the image's: the
/// hosted target refuses its thin volumes at build, naming the pool.
#[test]
fn the_hosted_target_refuses_pools_on_the_images_disks() {
    for pool in [
        "kind = \"virtio-blk\"\npci = \"00:10.0\"",
        "kind = \"nvme\"\nserial = \"brick-pool\"",
    ] {
        let text = manifest_text(Path::new("/nonexistent")).replace(
            "kind = \"file\"\npath = \"/nonexistent\"\nsize = \"16MiB\"",
            pool,
        );
        let blob = manifest::build(&text, "thin.toml").expect("manifest");
        let manifest = Manifest::parse(&blob).expect("manifest blob");
        let error = Engine::with_volumes(manifest, |i| Keys(1000 + i as u64), hosted::open_volume)
            .err()
            .expect("the hosted target refuses a device pool")
            .to_string();
        assert!(
            error.contains("pool pool0 is a ")
                && error.contains(
                    " pool, which the image serves; the hosted target takes file and block pools"
                ),
            "{error}"
        );
    }
}
