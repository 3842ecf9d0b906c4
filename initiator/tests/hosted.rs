//! The hosted layer for real: sockets, the monotonic clock, blocking calls.
//!
//! * Against the target engine on a thread of this process, joined by a
//!   frame link over a Unix socket (`frame:listen:` on the target side,
//!   `frame:connect:` on ours): the blocking API, splitting beyond one IO
//!   slot, the asynchronous submit/reap API at queue depth 16, typed
//!   refusals, close.
//! * Against the `brick-target` process over UDP loopback (ignored until
//!   the binary is built with `--link udp` support; see the test).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hal::hosted::{wait_ready, Link, LinkSpec, MonotonicClock};
use hal::{Clock, Nic};
use initiator::hosted::{Error, Session, SessionSpec};
use initiator::{AccessMode, IoKind, OpenError, SubmitError};
use manifest::binary::Manifest;
use rnbd::client::RemoteError;
use target_image::Engine;
use verbs::KeySource;

const MANIFEST: &str = r#"
[target]
name = "brick-hosted-test"

[limits]
queue_depth = 32

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "8MiB"

[[volumes]]
name = "ro"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "host*"
volumes = ["vol0"]
mode = "rw"

[[access]]
sessions = "host*"
volumes = ["ro"]
mode = "ro"
"#;

struct Keys(u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn transmit(link: &mut hal::hosted::FrameLink, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
    let mut pieces: Vec<&[u8]> = payload.iter().copied().filter(|p| !p.is_empty()).collect();
    if !trailer.is_empty() {
        pieces.push(trailer);
    }
    let _ = link.transmit(headers, &pieces);
}

/// The engine serving `MANIFEST` on a frame link listening at `path`, on
/// its own thread until `stop`.
fn serve_engine(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    serve_engine_at(path, stop, 1500, Arc::default())
}

/// [`serve_engine`] with its interface (manifest and link) at `mtu`;
/// `largest` keeps the longest frame it received or sent.
fn serve_engine_at(
    path: PathBuf,
    stop: Arc<AtomicBool>,
    mtu: usize,
    largest: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let text = MANIFEST.replace(
                "address = \"10.77.0.1/24\"",
                &format!("address = \"10.77.0.1/24\"\nmtu = {mtu}"),
            );
            let blob: &'static [u8] = Box::leak(
                manifest::build(&text, "hosted.toml")
                    .unwrap()
                    .into_boxed_slice(),
            );
            let manifest = Manifest::parse(blob).unwrap();
            let mut engine = Engine::new(manifest, |i| Keys(77 + i as u64)).unwrap();
            let spec: LinkSpec = format!("frame:listen:{}", path.display()).parse().unwrap();
            let Link::Frame(link) = spec.open().unwrap() else {
                panic!("not a frame link")
            };
            let mut link = link
                .with_mac([0x52, 0x54, 0x00, 0x77, 0x00, 0x01])
                .with_mtu(mtu);
            ready_tx.send(()).unwrap();
            let clock = MonotonicClock::new();
            while !stop.load(Ordering::Relaxed) {
                let now = clock.now();
                let mut busy = false;
                for _ in 0..64 {
                    match link.receive(|frame| {
                        largest.fetch_max(frame.len(), Ordering::Relaxed);
                        engine.receive(0, now, frame)
                    }) {
                        Ok(Some(())) => busy = true,
                        _ => break,
                    }
                }
                busy |= engine.poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
                    let len = h.len() + p.iter().map(|p| p.len()).sum::<usize>() + t.len();
                    largest.fetch_max(len, Ordering::Relaxed);
                    transmit(&mut link, h, p, t)
                });
                if link.has_pending_output() {
                    let _ = link.flush();
                }
                if !busy {
                    let limit = now + 10_000_000;
                    let wake = engine.poll_at(now).map_or(limit, |w| w.min(limit));
                    match link.raw_fd() {
                        Some(fd) => {
                            let _ = wait_ready(&[fd], &[], Some(wake));
                        }
                        None => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            }
        })
        .unwrap();
    ready_rx.recv().unwrap();
    handle
}

fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("brick-initiator-{tag}-{}.sock", std::process::id()))
}

/// The blocking and asynchronous APIs end to end over a frame link.
#[test]
fn frame_link_session_against_engine_thread() {
    let path = socket_path("frame");
    let stop = Arc::new(AtomicBool::new(false));
    let engine = serve_engine(path.clone(), Arc::clone(&stop));

    let link: LinkSpec = format!("frame:connect:{}", path.display()).parse().unwrap();
    let target: SocketAddr = "10.77.0.1:1234".parse().unwrap();
    let mut spec = SessionSpec::new("host1", link, vec![target]);
    spec.local_ip = "10.77.0.2".parse().unwrap();
    spec.config.queue_depth = 16;
    spec.io_timeout = Duration::from_secs(20);
    let session = Session::connect(&spec).expect("session");
    assert!(session.is_ready());

    // Typed refusals.
    match session.open("missing", AccessMode::ReadOnly) {
        Err(Error::Open(OpenError::Remote(RemoteError::NotFound))) => {}
        other => panic!("open of a missing volume: {:?}", other.err()),
    }
    let ro = session.open("ro", AccessMode::ReadOnly).unwrap();
    match ro.write(0, &[1; 512], false) {
        Err(Error::Submit(SubmitError::ReadOnly(id))) => assert_eq!(id, ro.id()),
        other => panic!("write through a read-only volume: {other:?}"),
    }

    let volume = session.open("vol0", AccessMode::ReadWrite).unwrap();
    assert_eq!(volume.size(), 8 << 20);
    assert_eq!(volume.block_size(), 512);

    // 3 MiB: three IO slots in parallel, each split into 128 KiB pieces.
    let data = pattern(3, 3 << 20);
    volume.write(512 * 1024, &data, true).unwrap();
    let mut back = vec![0u8; 3 << 20];
    volume.read(512 * 1024, &mut back).unwrap();
    assert!(back == data, "3 MiB read back differs");
    volume.flush().unwrap();
    volume.discard(1 << 20, 1 << 20).unwrap();
    let mut zero = vec![0xffu8; 1 << 20];
    volume.read(1 << 20, &mut zero).unwrap();
    assert!(zero.iter().all(|&b| b == 0), "discarded range not zero");
    match volume.read(8 << 20, &mut [0u8; 512]) {
        Err(Error::Submit(SubmitError::OutOfRange { capacity, .. })) => {
            assert_eq!(capacity, 8 << 20)
        }
        other => panic!("read past the end: {other:?}"),
    }

    // Asynchronous: 128 writes of 16 KiB at queue depth 16, then reads.
    let mut model = vec![0u8; 8 << 20];
    model[512 * 1024..512 * 1024 + (3 << 20)].copy_from_slice(&data);
    model[1 << 20..2 << 20].fill(0);
    let mut submitted = 0u64;
    let mut reaped = 0u64;
    let mut max_in_flight = 0;
    while reaped < 256 {
        while submitted < 256 && session.in_flight() < 16 {
            let block = submitted % 128;
            let offset = block * 16384 + (4 << 20);
            if submitted < 128 {
                let bytes = pattern(1000 + block, 16384);
                model[offset as usize..offset as usize + 16384].copy_from_slice(&bytes);
                volume
                    .submit_write(submitted, offset, &bytes, false)
                    .unwrap();
            } else {
                volume.submit_read(submitted, offset, 16384).unwrap();
            }
            submitted += 1;
            max_in_flight = max_in_flight.max(session.in_flight());
        }
        let n = session
            .reap(64, Duration::from_secs(10), |completion, bytes| {
                assert_eq!(completion.result, Ok(()), "tag {}", completion.tag);
                if completion.kind == IoKind::Read {
                    let at = completion.offset as usize;
                    assert!(
                        bytes == &model[at..at + 16384],
                        "async read {}",
                        completion.tag
                    );
                }
            })
            .unwrap();
        assert!(n > 0, "no completion within 10 s");
        reaped += n as u64;
    }
    assert_eq!(max_in_flight, 16, "the queue depth was used");

    let stats = volume.stats().unwrap();
    assert!(stats.reads >= 128 && stats.writes >= 128, "{stats:?}");
    assert_eq!(stats.errors, 0);
    let mut whole = vec![0u8; 8 << 20];
    volume.read(0, &mut whole).unwrap();
    assert!(whole == model, "volume differs from the model");

    volume.close().unwrap();
    ro.close().unwrap();
    session.close().unwrap();
    stop.store(true, Ordering::Relaxed);
    engine.join().unwrap();
}

/// Both ends at MTU 9000: the session asks for path MTU 4096, so a
/// 128 KiB write and read travel in frames above 4 KiB (at 1500 none
/// exceeds 1,500 bytes), and the bytes come back. An MTU no IPv4 link has
/// is refused before anything opens. The session busy-polls.
#[test]
fn jumbo_frames_carry_4096_byte_packets() {
    let path = socket_path("jumbo");
    let stop = Arc::new(AtomicBool::new(false));
    let largest = Arc::new(AtomicUsize::new(0));
    let engine = serve_engine_at(path.clone(), Arc::clone(&stop), 9000, Arc::clone(&largest));

    let link: LinkSpec = format!("frame:connect:{}", path.display()).parse().unwrap();
    let target: SocketAddr = "10.77.0.1:1234".parse().unwrap();
    let mut spec = SessionSpec::new("host3", link, vec![target]);
    spec.local_ip = "10.77.0.2".parse().unwrap();
    spec.config.queue_depth = 16;
    spec.io_timeout = Duration::from_secs(20);
    spec.mtu = 100;
    match Session::connect(&spec) {
        Err(Error::Mtu { found: 100 }) => {}
        other => panic!("a 100-byte MTU: {:?}", other.err()),
    }
    spec.mtu = 9000;
    // And busy polling between IOs (the loop spins instead of sleeping).
    spec.poll = Duration::from_micros(200);
    let session = Session::connect(&spec).expect("session");
    let volume = session.open("vol0", AccessMode::ReadWrite).unwrap();
    let data = pattern(9, 128 << 10);
    volume.write(1 << 20, &data, true).unwrap();
    let written = largest.load(Ordering::Relaxed);
    let mut back = vec![0u8; 128 << 10];
    volume.read(1 << 20, &mut back).unwrap();
    assert!(back == data, "128 KiB read back differs");
    let read = largest.load(Ordering::Relaxed);
    // Ethernet + IPv4 + UDP + BTH + RETH + 4096 payload + ICRC.
    assert!(
        written > 4096 + 60,
        "largest frame of the write: {written} bytes"
    );
    assert!(
        read > 4096 + 60 && read <= 9000 + 14,
        "largest frame: {read} bytes"
    );
    volume.close().unwrap();
    session.close().unwrap();
    stop.store(true, Ordering::Relaxed);
    engine.join().unwrap();
}

/// `brick-target --link udp:127.0.0.1:PORT` in its own process, the
/// initiator on `udp:127.0.0.2:PORT`: connect, open, verified IO.
///
/// Needs a `brick-target` binary that serves UDP links: set
/// `BRICK_TARGET` to it, or build `target/debug/brick-target`
/// (`cargo build -p brick-target-image`).
#[test]
#[ignore = "needs brick-target --link udp (cargo build -p brick-target-image; BRICK_TARGET=path)"]
fn udp_loopback_against_brick_target_process() {
    let binary = std::env::var_os("BRICK_TARGET").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/brick-target"),
        PathBuf::from,
    );
    assert!(
        binary.exists(),
        "no brick-target binary at {}",
        binary.display()
    );
    let port = 20000 + (std::process::id() % 20000) as u16;
    let dir = std::env::temp_dir().join(format!("brick-initiator-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("target.toml");
    std::fs::write(&manifest, MANIFEST.replace("10.77.0.1/24", "127.0.0.1/8")).unwrap();
    let mut child = std::process::Command::new(&binary)
        .arg("--manifest")
        .arg(&manifest)
        .arg("--link")
        .arg(format!("udp:127.0.0.1:{port}"))
        .spawn()
        .expect("brick-target starts");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    if let Ok(Some(status)) = child.try_wait() {
        panic!("brick-target exited at once: {status}");
    }
    let _child = Kill(child);

    let link: LinkSpec = format!("udp:127.0.0.2:{port}").parse().unwrap();
    let target: SocketAddr = "127.0.0.1:1234".parse().unwrap();
    let mut spec = SessionSpec::new("host2", link, vec![target]);
    spec.config.queue_depth = 16;
    let session = Session::connect(&spec).expect("session over UDP");
    let volume = session.open("vol0", AccessMode::ReadWrite).unwrap();
    let data = pattern(9, 2 << 20);
    volume.write(0, &data, false).unwrap();
    let mut back = vec![0u8; 2 << 20];
    volume.read(0, &mut back).unwrap();
    assert!(back == data, "UDP read back differs");
    eprintln!("UDP HCA counters: {:?}", session.hca_counters());
    volume.flush().unwrap();
    volume.close().unwrap();
    session.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
