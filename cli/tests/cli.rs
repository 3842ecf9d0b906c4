//! `brick` end to end: a real `brick-target` over UDP, and the examples.
//!
//! The built `brick` binary runs against a `brick-target` process over UDP
//! loopback (`io`, `bench`), and on the manifests of `examples/` and
//! broken ones (`manifest check|build`). Each network test starts its own `brick-target` on a free UDP port
//! (bound at 127.0.0.1 by the manifest's interface), and runs `brick` with
//! `--link udp:127.0.0.2:PORT`. The network tests take a lock so that only
//! one target and one client run at a time: the machine may be small and
//! busy, and the initiator declares a silent path dead after 3–4 s.
//!
//! # Where `brick-target` comes from
//!
//! * `BRICK_TARGET=/path/to/brick-target`: used as is (nothing is built);
//! * otherwise the test runs `cargo build -p brick-target-image --bin
//!   brick-target` (with `$CARGO`, the cargo running the tests, into the
//!   same target directory and profile as the `brick` under test) once per
//!   test process, and uses the binary next to `brick`. That build is a
//!   no-op when the binary is fresh, and a stale binary is never tested.

mod common;

use common::ChildLog;
use std::fs::File;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The target's manifest; `PORT`-independent (UDP links bind the
/// interface address, the port comes from `--link`).
const MANIFEST: &str = r#"
[target]
name = "brick-cli-test"

[limits]
max_sessions = 4
queue_depth = 64

[[interfaces]]
name = "lo"
mac = "52:54:00:7f:00:01"
address = "127.0.0.1/8"

[[volumes]]
name = "vol0"
kind = "ram"
size = "16MiB"

[[volumes]]
name = "ro"
kind = "ram"
size = "1MiB"

[[volumes]]
name = "secret"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "*"
volumes = ["vol0"]
mode = "rw"

[[access]]
sessions = "*"
volumes = ["ro"]
mode = "ro"

[[access]]
sessions = "admin"
volumes = ["secret"]
mode = "rw"
"#;

/// Longest a single `brick` run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Serialises the network tests.
fn network_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `brick-target` binary (see the module docs).
fn target_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("BRICK_TARGET") {
                let path = PathBuf::from(path);
                assert!(
                    path.exists(),
                    "BRICK_TARGET={} does not exist",
                    path.display()
                );
                return path;
            }
            let brick = Path::new(env!("CARGO_BIN_EXE_brick"));
            let profile_dir = brick.parent().expect("brick lives in a profile directory");
            let target_dir = profile_dir
                .parent()
                .expect("the profile directory has a parent");
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
                .arg(target_dir)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile_dir
                .file_name()
                .is_some_and(|name| name == "release")
            {
                build.arg("--release");
            }
            let status = build.status().expect("cargo runs");
            assert!(status.success(), "building brick-target failed: {status}");
            let binary = profile_dir.join("brick-target");
            assert!(binary.exists(), "no brick-target at {}", binary.display());
            binary
        })
        .clone()
}

/// A scratch directory for one test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("brick-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A UDP port free on both 127.0.0.1 (the target) and 127.0.0.2 (us).
fn free_port() -> u16 {
    for _ in 0..100 {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        if UdpSocket::bind(("127.0.0.2", port)).is_ok() {
            return port;
        }
    }
    panic!("no UDP port free on both 127.0.0.1 and 127.0.0.2");
}

/// A running `brick-target`; killed on drop. Its stderr is collected.
struct Target {
    child: Child,
    port: u16,
    log: ChildLog,
    _scratch: Scratch,
}

impl Target {
    /// Serves [`MANIFEST`] on 127.0.0.1.
    fn start(name: &str) -> Self {
        Self::start_with(name, MANIFEST, &["127.0.0.1"])
    }

    /// Serves `manifest`, one UDP link per interface address in
    /// `addresses` (the manifest's interfaces, in order).
    fn start_with(name: &str, manifest_text: &str, addresses: &[&str]) -> Self {
        let scratch = Scratch::new(name);
        let manifest = scratch.path("target.toml");
        std::fs::write(&manifest, manifest_text).unwrap();
        let port = free_port();
        let mut command = Command::new(target_binary());
        command.arg("--manifest").arg(&manifest);
        for address in addresses {
            command.arg("--link").arg(format!("udp:{address}:{port}"));
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("brick-target starts");
        let log = ChildLog::collect(child.stderr.take().unwrap());
        let target = Self {
            child,
            port,
            log,
            _scratch: scratch,
        };
        if !target
            .log
            .shows("listening on RDMA CM port", Duration::from_secs(30))
        {
            panic!(
                "brick-target did not start listening within 30 s; its log:\n{}",
                target.log()
            );
        }
        target
    }

    fn log(&self) -> String {
        self.log.text()
    }

    /// Whether the target's log shows `needle` within 10 s.
    fn log_shows(&self, needle: &str) -> bool {
        self.log.shows(needle, Duration::from_secs(10))
    }

    /// The connection options for session `session`, volume `volume`.
    fn connect_args(&self, session: &str, volume: &str) -> Vec<String> {
        [
            "--target",
            "127.0.0.1",
            "--link",
            &format!("udp:127.0.0.2:{}", self.port),
            "--session",
            session,
            "--volume",
            volume,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one `brick` run did.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn expect_success(self, what: &str) -> Self {
        assert!(
            self.status.success(),
            "{what}: brick failed ({})\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    fn expect_code(self, code: i32, what: &str) -> Self {
        assert_eq!(
            self.status.code(),
            Some(code),
            "{what}: exit status\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `brick` with `args`, killing it after [`RUN_TIMEOUT`].
fn brick<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let scratch = Scratch::new(&format!(
        "run-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let out = scratch.path("stdout");
    let err = scratch.path("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_brick"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .expect("brick starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "brick {:?} still running after {RUN_TIMEOUT:?}; stderr:\n{}",
                args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        status,
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap(),
    }
}

/// `brick io` with the target's connection options, then `extra`.
fn io(target: &Target, session: &str, volume: &str, extra: &[&str]) -> Run {
    let mut args = vec!["io".to_owned()];
    args.extend(target.connect_args(session, volume));
    args.extend(extra.iter().map(|s| s.to_string()));
    brick(&args)
}

/// Random pieces of 512 B to 1 MiB at random offsets are written, flushed
/// and read back byte-exact; a second process re-checks the same pieces,
/// and a different seed (another pattern) is caught as a mismatch.
#[test]
fn io_verify_random_512_to_1m() {
    let _lock = network_lock();
    let target = Target::start("random");
    let args = [
        "--offset",
        "2M",
        "--size",
        "6M",
        "--bs",
        "1M",
        "--min-bs",
        "512",
        "--random",
        "200",
        "--pattern",
        "7",
    ];
    let mut verify = vec!["verify"];
    verify.extend(args);
    let run = io(&target, "host1", "vol0", &verify).expect_success("random verify");
    assert!(
        run.stdout
            .contains("read and checked 200 random pieces of 512B..1MiB"),
        "{}",
        run.stdout
    );
    let mut read = vec!["read"];
    read.extend(args);
    io(&target, "host2", "vol0", &read).expect_success("random re-read");
    let mut wrong = read.clone();
    let seed = wrong.len() - 1;
    wrong[seed] = "8";
    io(&target, "host3", "vol0", &wrong).expect_code(3, "a foreign pattern is a data mismatch");
}

#[test]
fn io_verify_4k_and_1m() {
    let _lock = network_lock();
    let target = Target::start("verify");
    let run = io(&target, "host1", "vol0", &["verify", "--size", "4k"]).expect_success("4k");
    assert!(
        run.stdout.contains("wrote 4KiB (4096 bytes) at offset 0"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("read and checked 4KiB (4096 bytes)"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("MB/s"), "{}", run.stdout);
    let run = io(
        &target,
        "host1",
        "vol0",
        &["verify", "--offset", "1M", "--size", "1M", "--fua"],
    )
    .expect_success("1M");
    assert!(
        run.stdout
            .contains("read and checked 1MiB (1048576 bytes) at offset 1048576"),
        "{}",
        run.stdout
    );
    // Several 1 MiB pieces, each several parallel 128 KiB requests.
    io(
        &target,
        "host1",
        "vol0",
        &["verify", "--offset", "4M", "--size", "4M", "--bs", "2M"],
    )
    .expect_success("4M in 2M pieces");
    assert!(
        target.log_shows("session \"host1\" closed"),
        "{}",
        target.log()
    );
}

#[test]
fn io_verify_over_two_paths() {
    let _lock = network_lock();
    let manifest = MANIFEST.replace(
        "address = \"127.0.0.1/8\"\n",
        "address = \"127.0.0.1/8\"\n\n[[interfaces]]\nname = \"lo3\"\nmac = \"52:54:00:7f:00:03\"\naddress = \"127.0.0.3/8\"\n",
    );
    let target = Target::start_with("two-paths", &manifest, &["127.0.0.1", "127.0.0.3"]);
    let mut args = vec![
        "io".to_owned(),
        "--target".to_owned(),
        "127.0.0.3:1234".to_owned(),
    ];
    args.extend(target.connect_args("multi", "vol0"));
    args.extend(["verify", "--size", "4M", "--bs", "4M"].map(String::from));
    brick(&args).expect_success("verify over two paths");
    let log = target.log();
    assert!(
        log.contains("path up: session \"multi\" from 127.0.0.2 on lo ")
            && log.contains("path up: session \"multi\" from 127.0.0.2 on lo3 "),
        "{log}"
    );
}

#[test]
fn io_read_checks_what_an_earlier_process_wrote() {
    let _lock = network_lock();
    let target = Target::start("read-back");
    io(
        &target,
        "writer",
        "vol0",
        &["write", "--offset", "2M", "--size", "1M", "--pattern", "7"],
    )
    .expect_success("write");
    let run = io(
        &target,
        "reader",
        "vol0",
        &["read", "--offset", "2M", "--size", "1M", "--pattern", "7"],
    )
    .expect_success("read of what the writer left");
    assert!(
        run.stdout.contains("read and checked 1MiB"),
        "{}",
        run.stdout
    );

    // Another seed: the data is named as the writer's.
    let run = io(
        &target,
        "reader",
        "vol0",
        &["read", "--offset", "2M", "--size", "4k", "--pattern", "8"],
    )
    .expect_code(3, "read with the wrong seed");
    assert!(
        run.stderr
            .contains("data mismatch at volume offset 2097160")
            && run.stderr.contains("expected 0x")
            && run.stderr.contains("found 0x")
            && run
                .stderr
                .contains("pattern data for offset 2097152 seed 7"),
        "{}",
        run.stderr
    );
    // A range never written: the zeros are named as such.
    let run = io(
        &target,
        "reader",
        "vol0",
        &["read", "--offset", "3M", "--size", "4k", "--pattern", "7"],
    )
    .expect_code(3, "read of a range never written");
    assert!(run.stderr.contains("all zeros"), "{}", run.stderr);

    let run = io(
        &target,
        "reader",
        "vol0",
        &[
            "read",
            "--offset",
            "2M",
            "--size",
            "2M",
            "--bs",
            "512k",
            "--pattern",
            "7",
            "--dump",
        ],
    )
    .expect_success("dump");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", run.stdout);
    assert!(lines[0].starts_with("0x0000200000"), "{}", run.stdout);
    assert!(lines[..2].iter().all(|l| l.ends_with("pattern ok")));
    assert!(lines[2..4].iter().all(|l| l.ends_with("all zeros")));
    assert!(
        lines[4].contains("2 pieces differ from the pattern"),
        "{}",
        run.stdout
    );
}

#[test]
fn read_only_mappings_refuse_writes() {
    let _lock = network_lock();
    let target = Target::start("read-only");
    let run = io(&target, "host1", "vol0", &["--ro", "write", "--size", "4k"])
        .expect_code(1, "write through --ro");
    assert!(
        run.stderr.contains("write of 4096 bytes at offset 0")
            && run.stderr.contains("mapped read-only"),
        "{}",
        run.stderr
    );
    // The access list grants `ro` read-only: the target refuses a
    // read-write open with its errno.
    let run = io(&target, "host1", "ro", &["write", "--size", "4k"])
        .expect_code(1, "read-write open of a read-only volume");
    assert!(
        run.stderr
            .contains("open volume \"ro\" read-write in session \"host1\"")
            && run.stderr.contains("errno 13"),
        "{}",
        run.stderr
    );
    // Read-only is fine.
    io(
        &target,
        "host1",
        "ro",
        &["--ro", "read", "--size", "4k", "--dump"],
    )
    .expect_success("read-only read");
}

#[test]
fn access_list_refuses_a_volume() {
    let _lock = network_lock();
    let target = Target::start("access");
    let run = io(&target, "host1", "secret", &["verify", "--size", "4k"])
        .expect_code(1, "refused volume");
    assert!(
        run.stderr
            .contains("the target refused the open: AccessDenied (errno 13)"),
        "{}",
        run.stderr
    );
    let run =
        io(&target, "host1", "missing", &["read", "--size", "4k"]).expect_code(1, "missing volume");
    assert!(run.stderr.contains("(errno 2)"), "{}", run.stderr);
    // The session the rule names gets it, and the refused session above
    // was closed (its name is free at once).
    io(&target, "admin", "secret", &["verify", "--size", "4k"]).expect_success("admin");
    io(&target, "host1", "vol0", &["verify", "--size", "4k"]).expect_success("host1 again");
}

#[test]
fn ranges_past_the_end_are_refused() {
    let _lock = network_lock();
    let target = Target::start("range");
    let run = io(
        &target,
        "host1",
        "vol0",
        &["read", "--offset", "16M", "--size", "4k"],
    )
    .expect_code(1, "offset at the end");
    assert!(
        run.stderr.contains(
            "--offset 16777216 (16MiB) is past the end of volume \"vol0\": it has 16777216 bytes (16MiB)"
        ),
        "{}",
        run.stderr
    );
    let run = io(
        &target,
        "host1",
        "vol0",
        &["write", "--offset", "15M", "--size", "2M"],
    )
    .expect_code(1, "range over the end");
    assert!(
        run.stderr.contains(
            "bytes 15728640..17825792 run past the end of volume \"vol0\": it has 16777216 bytes (16MiB); expected offset + --size <= 16777216"
        ),
        "{}",
        run.stderr
    );
    let run = io(
        &target,
        "host1",
        "vol0",
        &["read", "--offset", "100", "--size", "4k"],
    )
    .expect_code(1, "misaligned");
    assert!(
        run.stderr
            .contains("--offset 100 is not a multiple of the 512-byte block size"),
        "{}",
        run.stderr
    );
}

#[test]
fn bench_json_for_two_seconds() {
    let _lock = network_lock();
    let target = Target::start("bench");
    let mut args = vec!["bench".to_owned()];
    args.extend(target.connect_args("bench", "vol0"));
    args.extend(
        [
            "--rw",
            "randrw:70",
            "--bs",
            "4k",
            "--qd",
            "16",
            "--runtime",
            "2",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let run = brick(&args).expect_success("bench");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{}", run.stdout));
    assert_eq!(report["workload"], "randrw:70");
    assert_eq!(report["read_percent"], 70);
    assert_eq!(report["block_size"], 4096);
    assert_eq!(report["queue_depth"], 16);
    assert_eq!(report["errors"], 0, "{report}");
    assert!(report["first_error"].is_null());
    let elapsed = report["elapsed_s"].as_f64().unwrap();
    assert!((2.0..30.0).contains(&elapsed), "{report}");
    for direction in ["read", "write"] {
        let d = &report[direction];
        let ios = d["ios"].as_u64().unwrap();
        assert!(ios > 0, "{direction}: {report}");
        assert_eq!(d["bytes"].as_u64().unwrap(), ios * 4096);
        assert!(d["iops"].as_f64().unwrap() > 0.0, "{report}");
        assert!(d["mb_per_s"].as_f64().unwrap() > 0.0, "{report}");
        let l = &d["latency_ns"];
        let [min, p50, p99, p999, max] =
            ["min", "p50", "p99", "p99_9", "max"].map(|k| l[k].as_u64().unwrap());
        let mean = l["mean"].as_f64().unwrap();
        assert!(
            0 < min && min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
            "{direction} percentiles out of order: {l}"
        );
        assert!(min as f64 <= mean && mean <= max as f64, "{l}");
    }
    let read = report["read"]["ios"].as_u64().unwrap() as f64;
    let write = report["write"]["ios"].as_u64().unwrap() as f64;
    let share = read / (read + write);
    assert!(
        (0.55..0.85).contains(&share),
        "read share {share}: {report}"
    );
    // Progress: plain lines on a non-terminal stderr, one a second.
    assert!(
        run.stderr
            .lines()
            .any(|l| l.trim_start().starts_with("1s ")),
        "{}",
        run.stderr
    );
}

#[test]
fn bench_text_report() {
    let _lock = network_lock();
    let target = Target::start("bench-text");
    let mut args = vec!["bench".to_owned()];
    args.extend(target.connect_args("bench", "vol0"));
    args.extend(
        [
            "--rw",
            "write",
            "--bs",
            "128k",
            "--qd",
            "4",
            "--runtime",
            "1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let run = brick(&args).expect_success("bench");
    assert!(
        run.stdout.starts_with("write bs=128KiB qd=4:"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("  write:"), "{}", run.stdout);
    assert!(run.stdout.contains("p99.9"), "{}", run.stdout);
    assert!(!run.stdout.contains("  read :"), "{}", run.stdout);
    assert!(run.stdout.contains("errors: 0"), "{}", run.stdout);
}

/// The workspace's `examples/` directory.
fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

#[test]
fn manifest_check_passes_every_example() {
    for file in examples() {
        let run = brick(&["manifest".as_ref(), "check".as_ref(), file.as_os_str()])
            .expect_success(&file.display().to_string());
        assert!(run.stdout.contains(": ok\n"), "{}", run.stdout);
        for heading in [
            "target ",
            "interfaces ",
            "volumes ",
            "access ",
            "limits ",
            "binary ",
        ] {
            assert!(
                run.stdout.lines().any(|l| l.starts_with(heading)),
                "{heading} missing:\n{}",
                run.stdout
            );
        }
        if file.ends_with("image-thin.toml") {
            for line in [
                "pools       2",
                "  vpool (virtio-blk pci 0000:00:10.0): thin volumes promise 80GiB; its tables take 32 B per 2 MiB extent of the disk, counted at boot",
                "  thin2 (thin 1TiB on pool npool) as \"thin2\"",
            ] {
                assert!(
                    run.stdout.lines().any(|l| l == line),
                    "no {line:?} in:\n{}",
                    run.stdout
                );
            }
            // 1,104 GiB of virtual extents at 16 B each (8.6 MiB), three
            // volumes' slots and two pools' buffers: 10.8 MiB of thin maps
            // in the engine's memory.
            assert!(
                run.stdout.contains(", thin maps 10.8 MiB"),
                "{}",
                run.stdout
            );
            assert!(run.stdout.contains("image       fits: "), "{}", run.stdout);
        }
        if file.ends_with("thin-pool.toml") {
            for line in [
                "pools       1",
                "  pool0 (file /var/lib/brick/pool0.img 64GiB): thin volumes promise 1536GiB",
                "  thin0 (thin 1TiB on pool pool0) as \"thin0\"",
            ] {
                assert!(
                    run.stdout.lines().any(|l| l == line),
                    "no {line:?} in:\n{}",
                    run.stdout
                );
            }
        }
    }
}

/// `manifest check` prints what the limits make the target allocate, per
/// session and in all, and refuses what the target cannot hold with the
/// numbers: an image manifest over the image's RAM, limits over an HCA's
/// QP table.
#[test]
fn manifest_check_prints_memory_and_refuses_what_cannot_fit() {
    let scratch = Scratch::new("capacity");
    let file = scratch.path("m.toml");
    std::fs::write(&file, MANIFEST).unwrap();
    let run = brick(&["manifest".as_ref(), "check".as_ref(), file.as_os_str()])
        .expect_success("manifest check");
    for heading in [
        "capacity    per interface: ",
        "per session ",
        "engine      ",
        "image       fits: ",
    ] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(heading)),
            "no {heading:?} line in:\n{}",
            run.stdout
        );
    }
    // 4 sessions × 4 paths plus 4 replacements, and 16 half-open paths,
    // 65 connections each.
    assert!(run.stdout.contains("20 chunk pools"), "{}", run.stdout);
    assert!(run.stdout.contains("2340 QPs"), "{}", run.stdout);
    // An image manifest with the default limits does not fit below 4 GiB.
    let image = r#"
[target]
name = "img"

[[interfaces]]
name = "net0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "data"
kind = "virtio-blk"
serial = "d"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;
    std::fs::write(&file, image).unwrap();
    let run = brick(&["manifest".as_ref(), "check".as_ref(), file.as_os_str()])
        .expect_code(1, "image manifest over the image's RAM");
    assert!(
        run.stderr.contains("the image needs ")
            && run
                .stderr
                .contains("it can use at most 3072 MiB below 4 GiB"),
        "{}",
        run.stderr
    );
    // 1,024 sessions of 128 paths: more QPs than an HCA holds.
    let huge = MANIFEST.replace(
        "max_sessions = 4",
        "max_sessions = 1024\nmax_paths_per_session = 128",
    );
    std::fs::write(&file, huge).unwrap();
    let run = brick(&["manifest".as_ref(), "check".as_ref(), file.as_os_str()])
        .expect_code(1, "limits over the QP table");
    assert!(
        run.stderr
            .contains("queue pairs per interface, an HCA holds at most 65536"),
        "{}",
        run.stderr
    );
}

/// A manifest that puts thin volumes on a file pool beside a virtio-blk
/// disk is one neither target serves: `manifest check` says why.
#[test]
fn manifest_check_refuses_host_pools_in_an_image_manifest() {
    let scratch = Scratch::new("thin-image");
    let file = scratch.path("m.toml");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/image-thin.toml");
    let text = std::fs::read_to_string(example).unwrap().replace(
        "kind = \"nvme\"\nserial = \"brick-pool\"\nnamespace = 1",
        "kind = \"file\"\npath = \"/var/lib/brick/p.img\"",
    );
    std::fs::write(&file, text).unwrap();
    let run = brick(&["manifest".as_ref(), "check".as_ref(), file.as_os_str()])
        .expect_code(1, "a file pool in an image manifest");
    assert!(
        run.stderr.contains(
            "pool npool is a file pool, which only the hosted target serves, but vpool is on a \
             virtio-blk or NVMe device, which only the image serves"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn manifest_check_names_line_and_field() {
    let scratch = Scratch::new("broken");
    let bad = scratch.path("bad.toml");
    let cases = [
        (
            MANIFEST.replace("size = \"16MiB\"", "size = \"16XB\""),
            "bad.toml:17: volumes[0].size: expected a size like",
        ),
        (
            MANIFEST.replace("queue_depth = 64", "queue_depth = 64\nbogus = 1"),
            "bad.toml:8: limits.bogus:",
        ),
        (
            MANIFEST.replace("mode = \"ro\"", "mode = \"rx\""),
            "bad.toml:37: access[1].mode:",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&bad, text).unwrap();
        let run = brick(&["manifest".as_ref(), "check".as_ref(), bad.as_os_str()])
            .expect_code(1, expected);
        assert!(
            run.stderr.contains(expected),
            "expected {expected:?} in:\n{}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
}

#[test]
fn manifest_build_output_reads_back() {
    let scratch = Scratch::new("build");
    let source = scratch.path("m.toml");
    let output = scratch.path("m.bin");
    std::fs::write(&source, MANIFEST).unwrap();
    let run = brick(&[
        "manifest".as_ref(),
        "build".as_ref(),
        source.as_os_str(),
        "-o".as_ref(),
        output.as_os_str(),
    ])
    .expect_success("build");
    let blob = std::fs::read(&output).unwrap();
    let manifest = manifest::binary::Manifest::parse(&blob).expect("the output parses");
    assert_eq!(manifest.target().name, "brick-cli-test");
    assert_eq!(manifest.volume_count(), 3);
    assert_eq!(manifest.access_rule_count(), 3);
    assert_eq!(manifest.limits().queue_depth, 64);
    assert_eq!(blob, manifest::build(MANIFEST, "m.toml").unwrap());
    let crc = u32::from_le_bytes(blob[12..16].try_into().unwrap());
    assert!(
        run.stdout.contains(&format!(
            "{} bytes, format version {}, crc32 {crc:#010x}",
            blob.len(),
            manifest::binary::FORMAT_VERSION
        )),
        "{}",
        run.stdout
    );
}

#[test]
fn bad_options_are_usage_errors() {
    let run = brick(&[
        "io",
        "--target",
        "127.0.0.1",
        "--link",
        "bogus:1",
        "--session",
        "s",
        "--volume",
        "v",
        "read",
    ])
    .expect_code(2, "bad link");
    assert!(run.stderr.contains("unknown kind"), "{}", run.stderr);
    let run = brick(&[
        "bench",
        "--target",
        "127.0.0.1",
        "--link",
        "udp:127.0.0.2:1",
        "--session",
        "s",
        "--volume",
        "v",
        "--rw",
        "randrw:101",
    ])
    .expect_code(2, "bad mix");
    assert!(run.stderr.contains("0..=100"), "{}", run.stderr);
}
