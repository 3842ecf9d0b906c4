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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hal::hosted::LinkSpec;
use initiator::hosted::{Session, SessionSpec, Volume};
use initiator::{AccessMode, IoKind};

const BLOCK: u64 = 4096;
const EXTENT: u64 = 2 << 20;
/// Two volumes of 16 extents on a pool of 31 (64 MiB less its metadata
/// extent): 32 promised on 31.
const VOLUME_BYTES: u64 = 32 << 20;
const VOLUME_BLOCKS: usize = (VOLUME_BYTES / BLOCK) as usize;
const RUNS: usize = 6;
const QUEUE_DEPTH: usize = 16;

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

/// xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A block's bytes for write `id` at block `block` of volume `volume`.
fn fill(id: u32, volume: usize, block: usize, out: &mut [u8]) {
    out.fill(id as u8 ^ 0xa5);
    out[..4].copy_from_slice(&id.to_le_bytes());
    out[4..8].copy_from_slice(&(volume as u32).to_le_bytes());
    out[8..16].copy_from_slice(&(block as u64).to_le_bytes());
}

/// The write id a block holds (0: zeroes), or why it is garbage.
fn decode(volume: usize, block: usize, bytes: &[u8]) -> Result<u32, String> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let id = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    let mut expected = vec![0; bytes.len()];
    fill(id, volume, block, &mut expected);
    if expected == bytes {
        Ok(id)
    } else {
        Err(format!(
            "volume {volume} block {block}: neither zeroes nor a write's pattern"
        ))
    }
}

/// What a block may hold: the last acknowledged value, plus values of
/// requests that had not been acknowledged (in flight at the kill, or
/// failed).
#[derive(Clone, Default)]
struct Cell {
    acked: u32,
    maybe: Vec<u32>,
    busy: bool,
}

struct Target {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &Path, manifest: &Path, port: u16) -> Target {
    let mut child = Command::new(binary)
        .arg("--manifest")
        .arg(manifest)
        .arg("--link")
        .arg(format!("udp:127.0.0.1:{port}"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("brick-target starts");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let lines = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line);
        }
    });
    let target = Target { child, log };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !target.logged("listening") {
        assert!(
            Instant::now() < deadline,
            "brick-target did not come up: {:?}",
            target.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    target
}

impl Target {
    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// `(allocated, reclaimed)` from the pool's open report.
    fn pool_report(&self) -> (u64, u64) {
        let log = self.log.lock().unwrap();
        let line = log
            .iter()
            .find(|l| l.contains("pool pool0:"))
            .unwrap_or_else(|| panic!("no pool report in {log:?}"));
        let number = |after: &str| -> u64 {
            let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
            let at = words.iter().position(|w| *w == after).unwrap();
            words[at - 1].parse().unwrap()
        };
        (number("allocated"), number("reclaimed"))
    }
}

fn connect(port: u16) -> (Session, [Volume; 2]) {
    let link: LinkSpec = format!("udp:127.0.0.2:{port}").parse().unwrap();
    let target: SocketAddr = "127.0.0.1:1234".parse().unwrap();
    let mut spec = SessionSpec::new("host-crash", link, vec![target]);
    spec.config.queue_depth = 32;
    let session = Session::connect(&spec).expect("session over UDP");
    let volumes = [
        session.open("thin0", AccessMode::ReadWrite).unwrap(),
        session.open("thin1", AccessMode::ReadWrite).unwrap(),
    ];
    assert_eq!(volumes[0].size(), VOLUME_BYTES);
    (session, volumes)
}

/// Reads every block back and checks it against the model; what is read
/// becomes the acknowledged value. Returns (written blocks checked,
/// virtual extents holding data).
fn verify(volumes: &[Volume; 2], model: &mut [Vec<Cell>; 2], run: usize) -> (u64, u64) {
    let mut checked = 0;
    let mut extents = 0;
    let mut buffer = vec![0u8; EXTENT as usize];
    for (v, volume) in volumes.iter().enumerate() {
        for extent in 0..VOLUME_BYTES / EXTENT {
            volume.read(extent * EXTENT, &mut buffer).unwrap();
            let mut data = false;
            for i in 0..(EXTENT / BLOCK) as usize {
                let block = (extent * EXTENT / BLOCK) as usize + i;
                let bytes = &buffer[i * BLOCK as usize..(i + 1) * BLOCK as usize];
                let value = decode(v, block, bytes).unwrap_or_else(|e| panic!("run {run}: {e}"));
                let cell = &mut model[v][block];
                assert!(
                    value == cell.acked || cell.maybe.contains(&value),
                    "run {run}: volume {v} block {block} holds write {value}; acknowledged {}, \
                     unacknowledged {:?}",
                    cell.acked,
                    cell.maybe
                );
                if cell.acked != 0 {
                    checked += 1;
                }
                data |= value != 0;
                *cell = Cell {
                    acked: value,
                    ..Cell::default()
                };
            }
            extents += u64::from(data);
        }
    }
    (checked, extents)
}

struct Op {
    volume: usize,
    kind: IoKind,
    first: usize,
    blocks: usize,
    id: u32,
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
    let mut rng = Rng(seed);
    let mut model = [
        vec![Cell::default(); VOLUME_BLOCKS],
        vec![Cell::default(); VOLUME_BLOCKS],
    ];
    let mut next_id = 1u32;
    let (mut acked_writes, mut checked_blocks, mut reclaimed, mut enospc) =
        (0u64, 0u64, 0u64, 0u64);
    let mut data = vec![0u8; 64 * BLOCK as usize];

    for run in 0..=RUNS {
        let target = start(&binary, &manifest, port);
        let (allocated, reclaimed_now) = target.pool_report();
        reclaimed += reclaimed_now;
        let (session, volumes) = connect(port);
        let (checked, extents) = verify(&volumes, &mut model, run);
        checked_blocks += checked;
        // Every extent holding data is allocated; freed ones are not (an
        // extent read back as zeroes may still be allocated: written with
        // zeroes, or its discard not acknowledged).
        assert!(
            allocated >= extents,
            "run {run}: {allocated} extents allocated, {extents} hold data"
        );
        if run == RUNS {
            break;
        }
        // Concurrent writes and discards until the kill.
        let mut in_flight: Vec<Option<Op>> = (0..QUEUE_DEPTH).map(|_| None).collect();
        let kill_at = Instant::now() + Duration::from_millis(300 + rng.below(1200));
        while Instant::now() < kill_at {
            for (tag, slot) in in_flight.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                let volume = rng.below(2) as usize;
                let (kind, first, blocks) = match rng.below(10) {
                    0 => {
                        let extent = rng.below(VOLUME_BYTES / EXTENT) as usize;
                        (
                            IoKind::Discard,
                            extent * (EXTENT / BLOCK) as usize,
                            (EXTENT / BLOCK) as usize,
                        )
                    }
                    1 | 2 => {
                        let blocks = 1 + rng.below(64) as usize;
                        (
                            IoKind::Discard,
                            rng.below((VOLUME_BLOCKS - blocks) as u64) as usize,
                            blocks,
                        )
                    }
                    _ => {
                        let blocks = 1 + rng.below(32) as usize;
                        (
                            IoKind::Write,
                            rng.below((VOLUME_BLOCKS - blocks) as u64) as usize,
                            blocks,
                        )
                    }
                };
                let cells = &mut model[volume][first..first + blocks];
                if cells.iter().any(|c| c.busy) {
                    continue;
                }
                let id = if kind == IoKind::Write {
                    next_id += 1;
                    next_id
                } else {
                    0
                };
                let offset = first as u64 * BLOCK;
                let len = (blocks as u64 * BLOCK) as u32;
                let submitted = if kind == IoKind::Write {
                    for i in 0..blocks {
                        let at = i * BLOCK as usize;
                        fill(id, volume, first + i, &mut data[at..at + BLOCK as usize]);
                    }
                    volumes[volume].submit_write(tag as u64, offset, &data[..len as usize], false)
                } else {
                    volumes[volume].submit_discard(tag as u64, offset, len)
                };
                submitted.unwrap_or_else(|e| panic!("submit: {e}"));
                for cell in cells.iter_mut() {
                    cell.busy = true;
                    cell.maybe.push(id);
                }
                *slot = Some(Op {
                    volume,
                    kind,
                    first,
                    blocks,
                    id,
                });
            }
            session
                .reap(QUEUE_DEPTH, Duration::from_millis(5), |done, _| {
                    let op = in_flight[done.tag as usize]
                        .take()
                        .expect("a completion for a request in flight");
                    let cells = &mut model[op.volume][op.first..op.first + op.blocks];
                    for cell in cells.iter_mut() {
                        cell.busy = false;
                    }
                    match &done.result {
                        Ok(()) => {
                            if op.kind == IoKind::Write {
                                acked_writes += 1;
                            }
                            for cell in cells {
                                cell.acked = op.id;
                                cell.maybe.clear();
                            }
                        }
                        Err(error) => {
                            // Only a write that needs an extent of a full
                            // pool may fail; what it wrote may stay.
                            assert_eq!(op.kind, IoKind::Write, "{error}");
                            assert!(error.to_string().contains("errno 28"), "{error}");
                            enospc += 1;
                        }
                    }
                })
                .unwrap();
        }
        // SIGKILL with requests in flight.
        let busy = in_flight.iter().filter(|op| op.is_some()).count();
        drop(target);
        eprintln!("thin crash: run {run}: killed with {busy} requests in flight");
        drop(volumes);
        drop(session);
    }
    eprintln!(
        "thin crash: {RUNS} SIGKILLs, {acked_writes} writes acknowledged, {checked_blocks} written \
         blocks checked after restarts, {reclaimed} extents reclaimed, {enospc} ENOSPC"
    );
    assert!(acked_writes > 0 && checked_blocks > 0);
    let _ = std::fs::remove_dir_all(&dir);
}
