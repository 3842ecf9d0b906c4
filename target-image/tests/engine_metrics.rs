//! The engine's metrics (Prometheus text format 0.0.4) and the admin
//! exchange: counters and the latency histogram follow the IO a client
//! does, every line is well formed, a buffer too small fails rather than
//! grows, and a thin volume's extents come back as JSON ranges through the
//! same exchange the hosted admin thread uses.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{pattern, with_world, Fabric, Keys, World};
use manifest::binary::Manifest;
use rnbd::wire::AccessMode;
use target_image::admin::{admin_exchange, AdminAnswer, AdminRequest};
use target_image::{hosted, Engine, FixedText, LATENCY_BOUNDS_NS};

const MANIFEST: &str = r#"
[target]
name = "brick-metrics"

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
name = "hidden"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "s*"
volumes = ["vol0"]
mode = "rw"
"#;

/// The samples of an exposition, by `name{labels}`; checks every line's
/// form and that each sample's family was declared (HELP and TYPE) first.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut declared: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            declared.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value of {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "metric name {name:?}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| declared.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(declared.contains_key(family), "{name} before its # TYPE");
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line:?}");
            }
        }
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

#[test]
fn counters_and_the_latency_histogram_follow_the_io() {
    with_world(MANIFEST, |world| {
        let c = world.add_client(2, 16, 7);
        world.connect(c, "s1", 1).expect("session up");
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        for i in 0..3u64 {
            assert_eq!(
                world.write(c, 10 + i, &device, i * 8192, &pattern(i, 8192)),
                0
            );
        }
        for i in 0..2u64 {
            assert_eq!(world.read(c, 20 + i, &device, i * 8192, 8192).0, 0);
        }
        assert!(world.open(c, 30, "hidden", AccessMode::ReadOnly).is_err());

        let mut text = FixedText::with_capacity(1 << 20);
        world.engine.write_metrics(&mut text, &|_| None).unwrap();
        let text = String::from_utf8(text.as_bytes().to_vec()).unwrap();
        let m = parse(&text);
        let get = |series: &str| {
            *m.get(series)
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        assert_eq!(get("brick_volume_writes_total{volume=\"vol0\"}"), 3.0);
        assert_eq!(get("brick_volume_reads_total{volume=\"vol0\"}"), 2.0);
        assert_eq!(
            get("brick_volume_written_bytes_total{volume=\"vol0\"}"),
            3.0 * 8192.0
        );
        assert_eq!(
            get("brick_volume_read_bytes_total{volume=\"vol0\"}"),
            2.0 * 8192.0
        );
        assert_eq!(
            get("brick_volume_latency_seconds_count{volume=\"vol0\"}"),
            5.0
        );
        assert_eq!(
            get("brick_volume_latency_seconds_bucket{volume=\"vol0\",le=\"+Inf\"}"),
            5.0
        );
        assert_eq!(
            get("brick_volume_latency_seconds_count{volume=\"hidden\"}"),
            0.0
        );
        // Cumulative buckets never fall.
        let mut last = 0.0;
        for bound in LATENCY_BOUNDS_NS {
            let le = bound as f64 / 1e9;
            let series = m
                .iter()
                .find(|(k, _)| {
                    k.starts_with("brick_volume_latency_seconds_bucket{volume=\"vol0\",le=\"")
                        && k.trim_end_matches("\"}")
                            .rsplit('"')
                            .next()
                            .and_then(|v| v.parse::<f64>().ok())
                            == Some(le)
                })
                .unwrap_or_else(|| panic!("no bucket le={le}"));
            assert!(*series.1 >= last);
            last = *series.1;
        }
        assert_eq!(
            get("brick_refusals_total{reason=\"rnbd_access_denied\"}"),
            1.0
        );
        let session = "session=\"s1\",id=\"0\",source=\"10.77.0.2\"";
        assert_eq!(get(&format!("brick_session_up{{{session}}}")), 1.0);
        assert_eq!(
            get(&format!("brick_session_writes_total{{{session}}}")),
            3.0
        );
        let path = m
            .iter()
            .find(|(k, _)| {
                k.starts_with("brick_path_writes_total{session=\"s1\"")
                    && k.contains("interface=\"eth0\"")
            })
            .expect("a path series");
        assert_eq!(*path.1, 3.0);
        assert!(get("brick_interface_frames_received_total{interface=\"eth0\"}") > 0.0);
        assert!(get("brick_interface_frames_sent_total{interface=\"eth0\"}") > 0.0);
        assert_eq!(
            get("brick_interface_drops_checksum_total{interface=\"eth0\"}"),
            0.0
        );

        // A buffer too small fails and says so; it does not grow.
        let mut small = FixedText::with_capacity(256);
        assert!(world.engine.write_metrics(&mut small, &|_| None).is_err());
        assert!(small.overflowed() && small.capacity() == 256 && small.as_bytes().len() <= 256);
    });
}

#[test]
fn extents_and_thin_gauges_come_through_the_admin_exchange() {
    let dir = std::env::temp_dir().join(format!("brick-engine-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool: PathBuf = dir.join("pool0.img");
    let _ = std::fs::remove_file(&pool);
    let text = common::thin_and_ram_manifest("brick-metrics-thin", &pool, "");
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let blob = manifest::build(&text, "thin.toml").unwrap();
            let manifest = Manifest::parse(&blob).unwrap();
            let engine =
                Engine::with_volumes(manifest, |i| Keys(500 + i as u64), hosted::open_volume).unwrap();
            let mut world = World::with_engine(engine);
            let c = world.add_client(2, 16, 7);
            world.connect(c, "s1", 1).expect("session up");
            let thin = world.open(c, 1, "thin0", AccessMode::ReadWrite).unwrap();
            const MIB: u64 = 1 << 20;
            // Extents 0, 1 and 3 (two ranges).
            for (tag, extent) in [(10, 0u64), (11, 1), (12, 3)] {
                assert_eq!(world.write(c, tag, &thin, extent * 2 * MIB, &pattern(tag, 4096)), 0);
            }
            let (engine_end, client) = admin_exchange(1 << 16).unwrap();
            let ask = |world: &mut World<'_, hosted::HostedVolume>, request| {
                let asker = client.clone();
                let answer = std::thread::spawn(move || asker.ask(request, Duration::from_secs(10)));
                while !answer.is_finished() {
                    engine_end.serve(&world.engine);
                    std::thread::sleep(Duration::from_millis(1));
                }
                answer.join().unwrap().expect("the engine answered")
            };
            let (answer, body) = ask(&mut world, AdminRequest::Extents(0));
            assert_eq!(answer, AdminAnswer::Done);
            assert_eq!(
                String::from_utf8(body).unwrap(),
                "{\"volume\":\"thin0\",\"extent_size\":2097152,\"allocated_extents\":3,\"pool_extents\":7,\
                 \"pool_free_extents\":4,\"ranges\":[{\"first_extent\":0,\"extents\":2,\"offset\":0,\
                 \"length\":4194304},{\"first_extent\":3,\"extents\":1,\"offset\":6291456,\"length\":2097152}]}"
            );
            let (answer, body) = ask(&mut world, AdminRequest::Extents(1));
            assert_eq!(answer, AdminAnswer::NotThin);
            assert_eq!(
                String::from_utf8(body).unwrap(),
                r#"{"error":"volume \"ram0\" is not thin: it has no extents"}"#
            );
            assert_eq!(ask(&mut world, AdminRequest::Extents(9)).0, AdminAnswer::NoVolume);
            let (answer, body) = ask(&mut world, AdminRequest::Metrics);
            assert_eq!(answer, AdminAnswer::Done);
            let m = parse(&String::from_utf8(body).unwrap());
            assert_eq!(m["brick_volume_allocated_extents{volume=\"thin0\"}"], 3.0);
            assert_eq!(m["brick_volume_pool_free_extents{volume=\"thin0\"}"], 4.0);
            assert!(!m.contains_key("brick_volume_allocated_extents{volume=\"ram0\"}"));
            assert_eq!(m["brick_admin_requests_total"], 4.0);
            // Nothing waiting: serve does nothing and does not block.
            assert!(!engine_end.serve(&world.engine));
            world.close_session(c);
        })
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Frames the engine sends while the client is cut off are lost: the
/// path's QPs send them again, and `brick_path_retransmissions_total`
/// counts exactly the interface's retransmissions (the only path).
#[test]
fn a_path_counts_the_packets_it_sent_again() {
    with_world(MANIFEST, |world| {
        let c = world.add_client(2, 16, 7);
        world.connect(c, "s1", 1).expect("session up");
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        world.start_workload(c, device, 0, 8, &[4096, 8192]);
        world.workload_progress(c, 50);
        let metrics = |world: &mut World<'_>| {
            let mut text = FixedText::with_capacity(1 << 20);
            world.engine.write_metrics(&mut text, &|_| None).unwrap();
            parse(core::str::from_utf8(text.as_bytes()).unwrap())
        };
        let path_total = |m: &HashMap<String, f64>| {
            let series: Vec<_> = m
                .iter()
                .filter(|(k, _)| k.starts_with("brick_path_retransmissions_total{session=\"s1\""))
                .collect();
            assert_eq!(series.len(), 1, "one path: {series:?}");
            *series[0].1
        };
        let interface = "brick_interface_retransmissions_total{interface=\"eth0\"}";
        let before = metrics(world);
        assert_eq!(path_total(&before), before[interface]);

        // Cut the client off for a few steps while its IO is in flight.
        for _ in 0..4 {
            world.run_until("IO in flight", |w| w.workload_in_flight(c) > 0);
            world.clients[c].alive = false;
            world.step();
            world.clients[c].alive = true;
            world.workload_progress(c, 20);
        }
        world.stop_workload(c);
        let workload = world.workload(c);
        assert_eq!((workload.mismatches, workload.errors.len()), (0, 0));

        let after = metrics(world);
        assert!(
            path_total(&after) > path_total(&before),
            "no retransmission counted on the path: {} then {}",
            path_total(&before),
            path_total(&after)
        );
        assert_eq!(path_total(&after), after[interface]);
    });
}
