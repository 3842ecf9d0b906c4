//! Thin volumes survive SIGKILL: a real `brick-target` process serves two
//! thin volumes that overcommit one file pool; Brick's initiator, over
//! UDP loopback, keeps concurrent writes and discards (whole extents and
//! partial ones) in flight; the target is killed with SIGKILL at a random
//! moment, restarted on the same pool, and every block of both volumes is
//! read back: it must hold the last acknowledged write (or discard), or
//! what an unacknowledged one left. The pool's check at start reports the
//! extents it reclaimed; the test sums them and checks that every extent
//! holding data read back is allocated.
//!
//! Needs the `brick-target` binary: `BRICK_TARGET`, or the one built next
//! to this test (`cargo build -p brick-target-image`; a workspace test run
//! builds it). `THIN_CRASH_SEED` repeats a run.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hal::hosted::LinkSpec;
use initiator::crash_check::{self, CrashConfig, CrashTarget};
use initiator::hosted::{Session, SessionSpec, Volume};
use initiator::AccessMode;

/// Two volumes of 16 extents on a pool of 31 (64 MiB less its metadata
/// extent): 32 promised on 31.
const VOLUME_BYTES: u64 = 32 << 20;
const RUNS: usize = 6;

const MANIFEST: &str = r#"
[target]
name = "brick-thin-crash"

[limits]
queue_depth = 32

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "127.0.0.1/8"

[[pools]]
name = "pool0"
kind = "file"
path = "POOL"
size = "64MiB"

[[volumes]]
name = "thin0"
kind = "thin"
pool = "pool0"
size = "32MiB"

[[volumes]]
name = "thin1"
kind = "thin"
pool = "pool0"
size = "32MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;

/// `brick-target` on the test's pool, restarted for every run.
struct Target {
    binary: PathBuf,
    manifest: PathBuf,
    port: u16,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

impl CrashTarget for Target {
    fn start(&mut self) -> Result<(), String> {
        let mut child = Command::new(&self.binary)
            .arg("--manifest")
            .arg(&self.manifest)
            .arg("--link")
            .arg(format!("udp:127.0.0.1:{}", self.port))
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("brick-target does not start: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        self.log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&self.log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("listening"))
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "brick-target did not come up: {:?}",
                    self.log.lock().unwrap()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Child::kill is SIGKILL.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pool_report(&self) -> Result<(u64, u64), String> {
        let log = self.log.lock().unwrap();
        crash_check::pool_report(log.iter().map(String::as_str), "pool0")
            .ok_or_else(|| format!("no pool report in {log:?}"))
    }
}

fn connect(port: u16) -> Result<(Session, Vec<Volume>), String> {
    let link: LinkSpec = format!("udp:127.0.0.2:{port}").parse().unwrap();
    let target: SocketAddr = "127.0.0.1:1234".parse().unwrap();
    let mut spec = SessionSpec::new("host-crash", link, vec![target]);
    spec.config.queue_depth = 32;
    let session = Session::connect(&spec).map_err(|e| format!("session over UDP: {e}"))?;
    let volumes = ["thin0", "thin1"]
        .iter()
        .map(|name| session.open(name, AccessMode::ReadWrite))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("open: {e}"))?;
    Ok((session, volumes))
}

#[test]
fn thin_volumes_survive_sigkill_under_writes_and_discards() {
    // Next to this test's own profile directory (target/<profile>/deps/..).
    let built = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("brick-target")))
        .unwrap_or_else(|| PathBuf::from("target/debug/brick-target"));
    let binary = std::env::var_os("BRICK_TARGET").map_or(built, PathBuf::from);
    assert!(
        binary.exists(),
        "no brick-target binary at {} (cargo build -p brick-target-image)",
        binary.display()
    );
    let port = 20000 + ((std::process::id() + 7919) % 20000) as u16;
    let dir = std::env::temp_dir().join(format!("brick-thin-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = dir.join("pool0.img");
    let manifest = dir.join("target.toml");
    std::fs::write(&manifest, MANIFEST.replace("POOL", pool.to_str().unwrap())).unwrap();

    let seed = std::env::var("THIN_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| (u64::from(std::process::id()) * 0x9e37_79b9) | 1);
    eprintln!("thin crash: seed {seed} (THIN_CRASH_SEED to repeat)");
    let mut target = Target {
        binary,
        manifest,
        port,
        child: None,
        log: Arc::default(),
    };
    let config = CrashConfig {
        volume_bytes: VOLUME_BYTES,
        runs: RUNS,
        queue_depth: 16,
        min_load: Duration::from_millis(300),
        random_load: Duration::from_millis(1200),
        max_write_blocks: 32,
        seed,
    };
    let summary = crash_check::run(
        &mut target,
        || connect(port),
        &config,
        |line| eprintln!("thin crash: {line}"),
    )
    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    eprintln!("thin crash: {summary}");
    assert_eq!(summary.runs, RUNS);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check itself fails on what it must catch: a block holding another
/// block's (or volume's) pattern, and garbage.
#[test]
fn the_pattern_names_its_write_volume_and_block() {
    let mut block = vec![0u8; crash_check::BLOCK as usize];
    assert_eq!(crash_check::decode(1, 5, &block), Ok(0));
    crash_check::fill(9, 1, 5, &mut block);
    assert_eq!(crash_check::decode(1, 5, &block), Ok(9));
    assert!(
        crash_check::decode(0, 5, &block).is_err(),
        "another volume's"
    );
    assert!(
        crash_check::decode(1, 6, &block).is_err(),
        "another block's"
    );
    block[100] ^= 1;
    assert!(crash_check::decode(1, 5, &block).is_err(), "garbage");
    let log = [
        "brick-target: listening",
        "brick-target: pool pool0: 31 extents, 12 allocated, 3 reclaimed by the check",
    ];
    assert_eq!(crash_check::pool_report(log, "pool0"), Some((12, 3)));
    assert_eq!(crash_check::pool_report(log, "pool1"), None);
}
