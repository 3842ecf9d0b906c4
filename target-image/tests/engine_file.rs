//! The engine serving a file-backed volume (`target_image::hosted`): a
//! missing file is created at its manifest size, OPEN_RSP advertises the
//! volatile write cache and FUA the file really has, writes (plain and FUA)
//! and a FLUSH complete asynchronously from the worker pool and read back
//! byte for byte, and after the engine is gone the file holds exactly what
//! was acknowledged. A file larger than its manifest size is refused.

mod common;

use std::path::PathBuf;

use common::{pattern, Fabric, Keys, World};
use manifest::binary::Manifest;
use rnbd::wire::{AccessMode, CachePolicy};
use target_image::{hosted, BuildError, Engine};

/// A fresh scratch path for this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("brick-engine-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn manifest_text(path: &std::path::Path) -> String {
    format!(
        r#"
[target]
name = "brick-file-test"

[limits]
queue_depth = 16

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "data"
kind = "file"
path = "{}"
size = "4MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#,
        path.display()
    )
}

/// Runs `test` on a world whose engine opens its volumes as the hosted
/// target does, on a thread with a large stack.
fn with_file_world(
    text: String,
    test: impl FnOnce(&mut World<'_, hosted::HostedVolume>) + Send + 'static,
) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(&text, "file.toml").expect("manifest");
            let manifest = Manifest::parse(&blob).expect("manifest blob");
            let engine =
                Engine::with_volumes(manifest, |i| Keys(1000 + i as u64), hosted::open_volume)
                    .expect("engine with a file volume");
            let mut world = World::with_engine(engine);
            test(&mut world);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn file_volume_is_created_served_and_keeps_acknowledged_writes() {
    let path = scratch("data.img");
    let writes: Vec<(u64, Vec<u8>)> = vec![
        (0, pattern(1, 4096)),
        (64 * 1024, pattern(2, 128 * 1024)),
        (4 * 1024 * 1024 - 8192, pattern(3, 8192)),
    ];
    let expected = writes.clone();
    with_file_world(manifest_text(&path), move |world| {
        let c = world.add_client(2, 16, 7);
        world.connect(c, "s1", 1).expect("session up");
        let device = world.open(c, 1, "data", AccessMode::ReadWrite).unwrap();
        assert_eq!(device.nsectors, 4 * 1024 * 1024 / 512);
        assert_eq!(
            device.policy,
            CachePolicy(CachePolicy::WRITEBACK.0 | CachePolicy::FUA.0),
            "a file has a volatile cache (the page cache) and honours FUA"
        );
        for (index, (offset, data)) in writes.iter().enumerate() {
            let tag = 10 + 2 * index as u64;
            assert_eq!(world.write(c, tag, &device, *offset, data), 0);
            let (errno, back) = world.read(c, tag + 1, &device, *offset, data.len() as u32);
            assert_eq!(errno, 0);
            assert!(
                back == *data,
                "{}-byte read at {offset} differs",
                data.len()
            );
        }
        // A FUA write and a FLUSH go through the worker pool too.
        let mut header = [0u8; 64];
        let fua = pattern(4, 4096);
        let out = device.write(1 << 20, 4096, true, &mut header).unwrap();
        assert_eq!(
            world.write_request(c, 20, &header[..out.user_header_len], &fua, false),
            0
        );
        // FLUSH travels as an RTRS READ with no buffer (rnbd.md §1.1).
        let out = device.flush(&mut header).unwrap();
        let (errno, _) = world.read_request(c, 21, &header[..out.user_header_len], 0, false);
        assert_eq!(errno, 0);
        let stats = world.engine.stats().to_string();
        assert!(stats.contains("flushes 1"), "{stats}");
        assert_eq!(world.engine.volume_requests_in_flight(), 0);
        world.close_session(c);
    });
    // The engine (and its worker pool) is gone: the file itself holds the
    // acknowledged writes.
    let bytes = std::fs::read(&path).expect("the volume's file exists");
    assert_eq!(bytes.len(), 4 * 1024 * 1024, "created at its manifest size");
    for (offset, data) in &expected {
        let at = *offset as usize;
        assert!(
            bytes[at..at + data.len()] == data[..],
            "file differs at {offset}"
        );
    }
    assert!(bytes[1 << 20..(1 << 20) + 4096] == pattern(4, 4096)[..]);
    assert!(
        bytes[8192..16384].iter().all(|&b| b == 0),
        "untouched range stays zero"
    );
}

#[test]
fn file_larger_than_its_manifest_size_is_refused() {
    let path = scratch("large.img");
    std::fs::write(&path, vec![7u8; 8 * 1024 * 1024]).unwrap();
    let text = manifest_text(&path);
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(&text, "file.toml").expect("manifest");
            let manifest = Manifest::parse(&blob).expect("manifest blob");
            let result =
                Engine::with_volumes(manifest, |i| Keys(1000 + i as u64), hosted::open_volume)
                    .map(|_| ());
            match result {
                Err(BuildError::Volume(name, why)) => {
                    assert_eq!(name, "data");
                    assert!(why.contains("larger than the manifest size"), "{why}");
                }
                Err(other) => panic!("unexpected error: {other}"),
                Ok(()) => panic!("an 8 MiB file was served as a 4 MiB volume"),
            }
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        8 * 1024 * 1024,
        "the refused file is left as it was"
    );
}
