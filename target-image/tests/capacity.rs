//! The engine admits every session its manifest allows: 100 sessions at
//! queue depth 32 connect through the engine at once (each one's chunk
//! pool, QPs and CQ entries come from the manifest, not from a fixed
//! table), every tenth writes and reads its own volume, and the 101st is refused by the session
//! limit (the RTRS server's TooManySessions answer) while the HCA still
//! has room: no hidden ceiling answers first. Closing one session lets
//! the 101st in.

mod common;

use common::{pattern, with_world, Fabric};
use rnbd::wire::AccessMode;
use rtrs::client::PathError;
use rtrs::server::ConnectRefusal;

const SESSIONS: usize = 100;
const QUEUE_DEPTH: u16 = 32;

const MANIFEST: &str = r#"
[target]
name = "brick-capacity"

[limits]
max_sessions = 100
max_paths_per_session = 1
max_connections_per_path = 2
queue_depth = 32
chunk_size = "8KiB"

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol1"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol2"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol3"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol4"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol5"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol6"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol7"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol8"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "vol9"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "s*"
volumes = "*"
mode = "rw"
"#;

#[test]
fn every_session_the_manifest_allows_is_admitted_and_one_more_is_refused_by_the_limit() {
    with_world(MANIFEST, |world| {
        let capacity = world.engine.hca(0).unwrap().capacity();
        let counts = manifest::Capacity::of(world.engine.manifest());
        assert_eq!(capacity.qps as u64, counts.qps);
        assert!(capacity.qps >= SESSIONS * 2, "{capacity:?}");
        let clients: Vec<usize> = (0..=SESSIONS)
            .map(|n| world.add_client(2 + n as u8, QUEUE_DEPTH, 500 + n as u64))
            .collect();
        for (n, &client) in clients[..SESSIONS].iter().enumerate() {
            world
                .connect(client, &format!("s{n}"), 1)
                .unwrap_or_else(|e| panic!("session {n} of {SESSIONS} refused: {e:?}"));
        }
        assert_eq!(world.engine.server().usage().sessions, SESSIONS);
        assert_eq!(world.engine.session_count(), SESSIONS);
        // The sessions work, all at once (every tenth writes its own
        // volume: a volume has one writer).
        for (n, &client) in clients[..SESSIONS].iter().enumerate().step_by(10) {
            let volume = format!("vol{}", n / 10);
            let device = world
                .open(client, 1, &volume, AccessMode::ReadWrite)
                .unwrap_or_else(|e| panic!("session {n}: OPEN errno {e}"));
            let data = pattern(n as u64, 4096);
            let offset = 4096;
            assert_eq!(world.write(client, 2, &device, offset, &data), 0);
            assert_eq!(world.read(client, 3, &device, offset, 4096), (0, data));
        }
        // The HCA could hold another session's path ...
        let hca = world.engine.hca(0).unwrap();
        assert!(hca.qp_count() + 2 <= capacity.qps);
        let regions_free = hca.arena().regions() - hca.arena().buffers();
        assert!(
            regions_free >= usize::from(QUEUE_DEPTH) + 3,
            "{regions_free}"
        );
        // ... so the 101st meets the session limit, and only it.
        let limit = -(ConnectRefusal::TooManySessions.errno() as i16);
        let extra = clients[SESSIONS];
        assert_eq!(
            world.connect(extra, "s-extra", 1),
            Err(PathError::Rejected(limit))
        );
        assert_eq!(world.engine.server().usage().sessions, SESSIONS);
        // One session leaves: the extra one gets in.
        world.close_session(clients[0]);
        world.run_until("the closed session's slot is free", |w| {
            w.engine.server().usage().sessions < SESSIONS
        });
        let again = world.add_client(2 + SESSIONS as u8 + 1, QUEUE_DEPTH, 499);
        world
            .connect(again, "s-extra", 1)
            .expect("admitted once a session left");
        assert_eq!(world.engine.server().usage().sessions, SESSIONS);
    });
}

/// The per-item sizes `manifest::Capacity` counts bytes with are upper
/// bounds of what the engine's HCA really allocates.
#[test]
fn manifest_memory_counts_bound_the_hca_tables() {
    let blob = manifest::build(MANIFEST, "capacity.toml").unwrap();
    let manifest = manifest::binary::Manifest::parse(&blob).unwrap();
    let counts = manifest::Capacity::of(&manifest);
    let config = target_image::server_config(&manifest);
    let hca = target_image::hca_capacity(&config).unwrap();
    assert_eq!(
        (hca.qps as u64, hca.regions as u64, hca.cq_entries as u64),
        (counts.qps, counts.regions, counts.cq_entries)
    );
    let real = hca.memory();
    let counted = counts.memory();
    assert!(real.qps as u64 <= counted.qps, "{real:?} {counted:?}");
    assert!(real.cq as u64 <= counted.cq, "{real:?} {counted:?}");
    assert!(
        (real.cm + real.regions) as u64 <= counted.tables,
        "{real:?} {counted:?}"
    );
    assert!(
        real.reorder as u64 * counts.interfaces <= counted.reorder,
        "{real:?} {counted:?}"
    );
    assert_eq!(
        target_image::arena_bytes(&config) as u64,
        counts.arena_bytes()
    );
}

/// The admin endpoint's count: its snapshot buffer and its sockets and
/// rings, at the largest MTU a manifest may name.
#[test]
fn manifest_memory_counts_the_admin_endpoint() {
    let with_admin = format!(
        "{MANIFEST}\n[admin]\naddress = \"10.77.0.1:9100\"\nsources = [\"10.77.0.0/24\"]\n"
    );
    let blob = manifest::build(&with_admin, "admin.toml").unwrap();
    let manifest = manifest::binary::Manifest::parse(&blob).unwrap();
    let counted = manifest::Capacity::of(&manifest).memory().admin;
    let snapshot = target_image::admin::snapshot_capacity(&manifest) as u64;
    let endpoint = target_image::admin_tcp::fixed_bytes(9000) as u64;
    assert!(snapshot > 0 && endpoint > 0);
    assert!(
        snapshot + endpoint <= counted,
        "snapshot {snapshot} + endpoint {endpoint} > counted {counted}"
    );
    let blob = manifest::build(MANIFEST, "capacity.toml").unwrap();
    let without = manifest::binary::Manifest::parse(&blob).unwrap();
    assert_eq!(manifest::Capacity::of(&without).memory().admin, 0);
}
