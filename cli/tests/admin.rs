//! The admin plane end to end: a real `brick-target` with an `[admin]`
//! endpoint, Brick's initiator (`brick io`, `brick bench`) over UDP
//! loopback, and the endpoint read with `brick target status|extents`,
//! plain HTTP, and a real Prometheus server (Debian's `prometheus`; the
//! test says it is skipped, and why, when /usr/bin/prometheus is missing).
//!
//! `brick-target` comes from `BRICK_TARGET` or is built next to `brick`
//! (as in `cli.rs`). Only loopback carries traffic.

mod common;

use common::ChildLog;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Serialises the tests (each starts a target).
fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn target_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("BRICK_TARGET") {
                return PathBuf::from(path);
            }
            let brick = Path::new(env!("CARGO_BIN_EXE_brick"));
            let profile_dir = brick.parent().unwrap();
            let mut build = Command::new(env!("CARGO"));
            build
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "brick-target-image",
                    "--bin",
                    "brick-target",
                ])
                .arg("--target-dir")
                .arg(profile_dir.parent().unwrap())
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                build.arg("--release");
            }
            assert!(
                build.status().unwrap().success(),
                "building brick-target failed"
            );
            profile_dir.join("brick-target")
        })
        .clone()
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A UDP port free on 127.0.0.1 (the target) and 127.0.0.2 (the client).
fn free_udp_port() -> u16 {
    (0..100)
        .find_map(|_| {
            let port = UdpSocket::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port();
            UdpSocket::bind(("127.0.0.2", port)).ok().map(|_| port)
        })
        .expect("a UDP port free on 127.0.0.1 and 127.0.0.2")
}

/// A running `brick-target` with an admin endpoint; killed on drop.
struct Target {
    child: Child,
    udp: u16,
    admin: String,
    log: ChildLog,
    dir: PathBuf,
}

impl Target {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("brick-admin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let admin = format!("127.0.0.1:{}", free_tcp_port());
        let manifest = format!(
            r#"
[target]
name = "brick-admin-test"

[limits]
queue_depth = 64

[[interfaces]]
name = "lo"
mac = "52:54:00:7f:00:01"
address = "127.0.0.1/8"

[[pools]]
name = "pool0"
kind = "file"
path = "{}"
size = "64MiB"

[[volumes]]
name = "vol0"
kind = "ram"
size = "16MiB"

[[volumes]]
name = "thin0"
kind = "thin"
pool = "pool0"
size = "32MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"

[admin]
address = "{admin}"
sources = ["127.0.0.1"]
"#,
            dir.join("pool0.img").display()
        );
        let path = dir.join("target.toml");
        std::fs::write(&path, manifest).unwrap();
        let udp = free_udp_port();
        let mut child = Command::new(target_binary())
            .arg("--manifest")
            .arg(&path)
            .arg("--link")
            .arg(format!("udp:127.0.0.1:{udp}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("brick-target starts");
        let log = ChildLog::collect(child.stderr.take().unwrap());
        let target = Self {
            child,
            udp,
            admin,
            log,
            dir,
        };
        assert!(
            target
                .log
                .shows("admin endpoint http://", Duration::from_secs(30)),
            "no admin endpoint; log:\n{}",
            target.log()
        );
        target
    }

    fn log(&self) -> String {
        self.log.text()
    }

    /// Whether the target's log shows `needle` within 10 s.
    fn log_shows(&self, needle: &str) -> bool {
        self.log.shows(needle, Duration::from_secs(10))
    }

    fn connect_args(&self, session: &str, volume: &str) -> Vec<String> {
        let link = format!("udp:127.0.0.2:{}", self.udp);
        [
            "--target",
            "127.0.0.1",
            "--link",
            &link,
            "--session",
            session,
            "--volume",
            volume,
        ]
        .map(String::from)
        .to_vec()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn brick(args: &[String]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_brick"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "brick {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `GET path` over a plain TCP connection: status code and body.
fn http_get(stream: TcpStream, path: &str) -> (u16, String) {
    let mut stream = stream;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{text:?}"));
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

/// The samples of `/metrics` by `name{labels}`.
fn scrape(admin: &str) -> HashMap<String, f64> {
    let (code, body) = http_get(TcpStream::connect(admin).unwrap(), "/metrics");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn metrics_follow_brick_io_and_other_sources_are_refused() {
    let _lock = lock();
    let target = Target::start("metrics");
    let mut io = vec!["io".to_owned()];
    io.extend(target.connect_args("host1", "vol0"));
    io.extend(["--size", "1M", "verify"].map(String::from));
    brick(&io);
    let mut io = vec!["io".to_owned()];
    io.extend(target.connect_args("host1", "thin0"));
    io.extend(["--size", "4M", "verify"].map(String::from));
    brick(&io);

    let m = scrape(&target.admin);
    let get = |s: &str| *m.get(s).unwrap_or_else(|| panic!("no {s} in {m:?}"));
    for volume in ["vol0", "thin0"] {
        let v = |metric: &str| get(&format!("brick_volume_{metric}{{volume=\"{volume}\"}}"));
        let bytes = if volume == "vol0" { 1 << 20 } else { 4 << 20 } as f64;
        assert_eq!(v("written_bytes_total"), bytes, "{volume}");
        assert_eq!(v("read_bytes_total"), bytes, "{volume}");
        assert!(v("reads_total") > 0.0 && v("writes_total") > 0.0);
        let ios = v("reads_total") + v("writes_total") + v("flushes_total") + v("discards_total");
        assert_eq!(
            v("latency_seconds_count"),
            ios,
            "{volume}: one latency per block request"
        );
        let inf = get(&format!(
            "brick_volume_latency_seconds_bucket{{volume=\"{volume}\",le=\"+Inf\"}}"
        ));
        assert_eq!(inf, ios);
        assert_eq!(v("errors_total"), 0.0);
    }
    assert_eq!(get("brick_volume_allocated_extents{volume=\"thin0\"}"), 2.0);
    assert_eq!(
        get("brick_volume_pool_free_extents{volume=\"thin0\"}"),
        29.0
    );
    assert!(get("brick_rtrs_accepted_total") >= 2.0);
    assert!(get("brick_interface_frames_received_total{interface=\"lo\"}") > 0.0);

    // The CLI's views of the same endpoint.
    let admin = ["--admin".to_owned(), target.admin.clone()];
    let status = brick(&[&["target".to_owned(), "status".to_owned()][..], &admin].concat());
    let text = String::from_utf8(status.stdout).unwrap();
    assert!(text.contains("volume vol0: reads"), "{text}");
    assert!(
        text.contains("thin: 2 extents allocated, pool 29 of 31 free"),
        "{text}"
    );
    let args = ["target", "extents", "--volume", "thin0", "--json"].map(String::from);
    let extents = brick(&[&args[..], &admin].concat());
    let json: serde_json::Value = serde_json::from_slice(&extents.stdout).unwrap();
    assert_eq!(json["allocated_extents"], 2);
    assert_eq!(
        json["ranges"],
        serde_json::json!([{"first_extent": 0, "extents": 2, "offset": 0, "length": 4194304}])
    );
    let (code, body) = http_get(
        TcpStream::connect(&target.admin).unwrap(),
        "/volumes/vol0/extents",
    );
    assert_eq!((code, body.contains("is not thin")), (422, true), "{body}");
    let (code, body) = http_get(
        TcpStream::connect(&target.admin).unwrap(),
        "/volumes/nope/extents",
    );
    assert_eq!((code, body.contains("no volume")), (404, true), "{body}");

    // From 127.0.0.2 (not an admin source): closed at accept, no answer.
    use rustix::net::{bind, connect, socket, AddressFamily, SocketType};
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    bind(&fd, &SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 0)).unwrap();
    connect(&fd, &target.admin.parse::<SocketAddrV4>().unwrap()).unwrap();
    let mut refused = TcpStream::from(fd);
    refused
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = refused.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
    let mut answer = Vec::new();
    let _ = refused.read_to_end(&mut answer); // EOF or a reset
    assert!(
        answer.is_empty(),
        "a refused source got {:?}",
        String::from_utf8_lossy(&answer)
    );
    let m = scrape(&target.admin);
    assert_eq!(m["brick_admin_connections_refused_total"], 1.0);
    assert!(
        target.log_shows("admin: refused a connection from 127.0.0.2"),
        "{}",
        target.log()
    );
}

/// Prometheus's HTTP API: `query`'s JSON result.
fn prometheus_query(address: &str, query: &str) -> serde_json::Value {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (code, body) = http_get(
        TcpStream::connect(address).unwrap(),
        &format!("/api/v1/query?query={encoded}"),
    );
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_the_io_rate_during_a_benchmark() {
    if !Path::new(PROMETHEUS).exists() {
        eprintln!(
            "SKIPPED a_real_prometheus_scrapes_the_io_rate_during_a_benchmark: {PROMETHEUS} is \
             missing (apt-get install prometheus, or cargo xtask setup)"
        );
        return;
    }
    let _lock = lock();
    let target = Target::start("prometheus");
    let web = format!("127.0.0.1:{}", free_tcp_port());
    let config = target.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: brick\n    \
             static_configs:\n      - targets: ['{}']\n",
            target.admin
        ),
    )
    .unwrap();
    let tsdb = target.dir.join("tsdb");
    let prometheus = Killed(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(target.dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus starts"),
    );
    let mut bench = vec!["bench".to_owned()];
    bench.extend(target.connect_args("bench1", "vol0"));
    bench.extend(
        [
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--qd",
            "16",
            "--runtime",
            "10",
            "--json",
        ]
        .map(String::from),
    );
    let started = Instant::now();
    let bench = std::thread::spawn(move || brick(&bench));
    // Query while the benchmark runs (from 7 s in: a few scrapes taken).
    std::thread::sleep(Duration::from_secs(7));
    let query = "sum(rate(brick_volume_reads_total[5s]) + rate(brick_volume_writes_total[5s]))";
    let mut result = serde_json::Value::Null;
    let mut rate = 0.0;
    while started.elapsed() < Duration::from_secs(10) && rate == 0.0 {
        result = prometheus_query(&web, query);
        rate = result["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if rate == 0.0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    println!("prometheus query {query}: {result}");
    let targets = http_get(TcpStream::connect(&web).unwrap(), "/api/v1/targets").1;
    let output = bench.join().unwrap();
    assert!(
        rate > 0.0,
        "no IO rate from Prometheus: {result}\ntargets: {targets}\nprometheus log:\n{}",
        std::fs::read_to_string(target.dir.join("prometheus.log")).unwrap_or_default()
    );
    assert!(targets.contains("\"health\":\"up\""), "{targets}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "bench --json: {e}: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    let ios = report["read"]["ios"].as_u64().unwrap() + report["write"]["ios"].as_u64().unwrap();
    println!(
        "brick bench: {ios} IOs, {:.0} read + {:.0} write IOPS; Prometheus rate {rate:.0} IO/s",
        report["read"]["iops"].as_f64().unwrap(),
        report["write"]["iops"].as_f64().unwrap()
    );
    // Once a scrape after the benchmark is stored, Prometheus holds exactly
    // the IOs the benchmark did.
    let total = "sum(brick_volume_reads_total{volume=\"vol0\"}) + sum(brick_volume_writes_total{volume=\"vol0\"})";
    let deadline = Instant::now() + Duration::from_secs(15);
    let stored = loop {
        let result = prometheus_query(&web, total);
        let stored = result["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if stored as u64 == ios || Instant::now() > deadline {
            println!("prometheus query {total}: {result}");
            break stored as u64;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    drop(prometheus);
    assert_eq!(
        stored, ios,
        "the counters Prometheus stored against the benchmark's IOs"
    );
}
