//! A userspace volume end to end, in process: the target engine on UDP
//! loopback (`127.0.0.1`), [`Exports`] mapping its `vol0` with Brick's
//! initiator (from `127.0.0.2`) and serving it over NBD on a unix socket,
//! and a small NBD client speaking the protocol by hand: handshake, verified
//! writes and reads, flush, trim, write-zeroes, errors, status counters.
//! Then the target is stopped and started again (a fresh RAM volume): the
//! export keeps serving once the initiator has reconnected and re-opened.
//! Then it comes back without the volume: IO fails with `EIO`, the export
//! drops the session and reconnects (with backoff) until the volume is
//! served again.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hal::hosted::{wait_ready, Link, LinkSpec, MonotonicClock, UdpNic};
use hal::{Clock, DatagramNic, NicError};
use initiatord::config::parse;
use initiatord::nbd::wire::*;
use initiatord::nbd::Request;
use initiatord::userspace::{Exports, Log, Tuning};
use manifest::binary::Manifest;
use roce::hca::LinkMode;
use target_image::{hosted, Engine, Transmit};
use verbs::KeySource;

const MANIFEST: &str = r#"
[target]
name = "nbd-export-test"

[[interfaces]]
name = "lo"
mac = "52:54:00:7f:00:01"
address = "127.0.0.1/8"

[[volumes]]
name = "vol0"
kind = "ram"
size = "8MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;

/// The same target without `vol0`.
const WITHOUT_VOL0: &str = r#"
[target]
name = "nbd-export-test"

[[interfaces]]
name = "lo"
mac = "52:54:00:7f:00:01"
address = "127.0.0.1/8"

[[volumes]]
name = "other"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "*"
volumes = "*"
mode = "rw"
"#;

const SIZE: u64 = 8 << 20;

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

/// The engine's datagrams onto the socket (drops are the transport's).
struct Sink<'a>(&'a mut UdpNic);

impl Transmit for Sink<'_> {
    fn transmit(&mut self, _: usize, _: &[u8], _: &[&[u8]], _: &[u8]) {}

    fn transmit_datagram(
        &mut self,
        _: usize,
        to: std::net::SocketAddrV4,
        header: &[u8],
        payload: &[&[u8]],
        trailer: &[u8],
    ) {
        let mut pieces: Vec<&[u8]> = payload.iter().copied().filter(|p| !p.is_empty()).collect();
        if !trailer.is_empty() {
            pieces.push(trailer);
        }
        let _ = DatagramNic::transmit(self.0, SocketAddr::V4(to), header, &pieces);
    }
}

/// The target engine on `udp:127.0.0.1:PORT`, on its own thread.
struct Target {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Target {
    fn start(port: u16, manifest_text: &'static str) -> Target {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(move || {
                let blob: &'static [u8] = Box::leak(
                    manifest::build(manifest_text, "target.toml")
                        .unwrap()
                        .into_boxed_slice(),
                );
                let manifest = Manifest::parse(blob).unwrap();
                let spec: LinkSpec = format!("udp:127.0.0.1:{port}").parse().unwrap();
                let Link::Udp(mut nic) = spec.open().unwrap() else {
                    panic!("not a UDP link")
                };
                let mut engine = Engine::with_links(
                    manifest,
                    |i| Keys(91 + i as u64),
                    &[LinkMode::Udp { port }],
                    hosted::open_volume,
                )
                .unwrap();
                ready_tx.send(()).unwrap();
                let clock = MonotonicClock::new();
                while !flag.load(Ordering::Relaxed) {
                    let now = clock.now();
                    let mut busy = false;
                    for _ in 0..64 {
                        match DatagramNic::receive(&mut nic, |datagram, from| {
                            engine.receive_datagram(0, now, from, datagram)
                        }) {
                            Ok(Some(())) => busy = true,
                            Ok(None) | Err(NicError::LinkDown) => break,
                            Err(error) => panic!("target link: {error}"),
                        }
                    }
                    busy |= engine.poll(now, &mut Sink(&mut nic));
                    if !busy {
                        let wake = engine
                            .poll_at(now)
                            .map_or(now + 20_000_000, |w| w.min(now + 20_000_000));
                        let _ = wait_ready(&[nic.raw_fd()], &[], Some(wake));
                    }
                }
            })
            .unwrap();
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the target starts");
        Target {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A UDP port free on 127.0.0.1 and 127.0.0.2.
fn free_port() -> u16 {
    for _ in 0..50 {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if UdpSocket::bind(("127.0.0.2", port)).is_ok() {
            return port;
        }
    }
    panic!("no UDP port free on 127.0.0.1 and 127.0.0.2")
}

/// A minimal NBD client over a unix socket.
struct Client {
    stream: UnixStream,
    cookie: u64,
}

impl Client {
    /// Connects and negotiates `NBD_OPT_GO` for `name`; returns the size
    /// and transmission flags.
    fn connect(path: &Path, name: &str) -> (Client, u64, u16) {
        let mut stream = UnixStream::connect(path).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut hello = [0u8; 18];
        stream.read_exact(&mut hello).unwrap();
        assert_eq!(hello[..8], NBDMAGIC.to_be_bytes());
        stream
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut option = IHAVEOPT.to_be_bytes().to_vec();
        option.extend_from_slice(&OPT_GO.to_be_bytes());
        option.extend_from_slice(&(name.len() as u32 + 6).to_be_bytes());
        option.extend_from_slice(&(name.len() as u32).to_be_bytes());
        option.extend_from_slice(name.as_bytes());
        option.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&option).unwrap();
        let (mut size, mut flags) = (0, 0);
        loop {
            let mut header = [0u8; 20];
            stream.read_exact(&mut header).unwrap();
            let kind = u32::from_be_bytes(header[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0u8; len];
            stream.read_exact(&mut data).unwrap();
            match kind {
                REP_ACK => break,
                REP_INFO if data[..2] == INFO_EXPORT.to_be_bytes() => {
                    size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes(data[10..12].try_into().unwrap());
                }
                REP_INFO => {}
                other => panic!("GO refused: reply {other:#x}"),
            }
        }
        (Client { stream, cookie: 0 }, size, flags)
    }

    /// Sends one request (with `payload` for a write); returns the errno
    /// and, for a successful read, the data.
    fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> (u32, Vec<u8>) {
        self.cookie += 1;
        let header = Request {
            flags,
            command,
            cookie: self.cookie,
            offset,
            length,
        }
        .emit();
        self.stream.write_all(&header).unwrap();
        self.stream.write_all(payload).unwrap();
        let mut reply = [0u8; SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut reply).unwrap();
        assert_eq!(reply[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(reply[8..], self.cookie.to_be_bytes());
        let errno = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        let mut data = Vec::new();
        if command == CMD_READ && errno == 0 {
            data = vec![0u8; length as usize];
            self.stream.read_exact(&mut data).unwrap();
        }
        (errno, data)
    }

    fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> u32 {
        self.request(CMD_WRITE, flags, offset, data.len() as u32, data)
            .0
    }

    fn read(&mut self, offset: u64, length: u32) -> (u32, Vec<u8>) {
        self.request(CMD_READ, 0, offset, length, &[])
    }

    fn disconnect(mut self) {
        let header = Request {
            flags: 0,
            command: CMD_DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        }
        .emit();
        self.stream.write_all(&header).unwrap();
        // The server closes its end.
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "brick-initiatord-nbd-export-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn nbd_export_serves_a_brick_volume_and_survives_a_target_restart() {
    let dir = scratch();
    let socket = dir.join("vol0.nbd");
    let port = free_port();
    let mut target = Target::start(port, MANIFEST);

    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&lines);
    let log: Log = Arc::new(move |line: &str| {
        eprintln!("brick-initiatord: {line}");
        sink.lock().unwrap().push(line.to_owned());
    });
    let mut exports = Exports::new(
        log,
        Tuning {
            connect_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(1),
        },
    );
    let config = parse(
        &format!(
            "[[volumes]]\nname = \"vol0\"\nsession = \"nbd-test\"\ndevice_path = \"vol0\"\n\
             paths = [\"127.0.0.1\"]\nexport = \"nbd:unix:{}\"\nlink = \"udp:127.0.0.2:{port}\"\n",
            socket.display()
        ),
        "t.toml",
    )
    .unwrap();
    assert_eq!(exports.apply(&config).started, ["vol0"]);
    wait_for("the export to listen", Duration::from_secs(20), || {
        exports.status()[0].listening
    });
    assert!(exports.status()[0].session_connected);

    let (mut client, size, flags) = Client::connect(&socket, "vol0");
    assert_eq!(size, SIZE);
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    assert_ne!(flags & FLAG_SEND_FUA, 0);
    let big = pattern(3, 1 << 20);
    assert_eq!(client.write(4096, &big, CMD_FLAG_FUA), 0);
    let small = pattern(9, 512);
    assert_eq!(client.write(SIZE - 512, &small, 0), 0);
    assert_eq!(client.request(CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    let (errno, back) = client.read(4096, 1 << 20);
    assert_eq!(errno, 0);
    assert!(back == big, "read back differs");
    assert_eq!(client.read(SIZE - 512, 512), (0, small.clone()));
    // Zeroes and trim go to the target too.
    assert_eq!(client.request(CMD_WRITE_ZEROES, 0, 4096, 8192, &[]).0, 0);
    let (errno, zeroes) = client.read(4096, 8192);
    assert_eq!(errno, 0);
    assert!(zeroes.iter().all(|&b| b == 0));
    assert_eq!(client.request(CMD_TRIM, 0, 1 << 20, 65536, &[]).0, 0);
    // Past the end.
    assert_eq!(client.read(SIZE - 512, 1024).0, EINVAL);
    assert_eq!(client.write(SIZE, &small, 0), ENOSPC);
    // Unaligned to the volume's block size.
    assert_eq!(client.read(100, 512).0, EINVAL);
    client.disconnect();

    wait_for("the connection to end", Duration::from_secs(10), || {
        !exports.status()[0].client_connected
    });
    let status = exports.status();
    assert_eq!(status[0].connections, 1);
    assert_eq!(status[0].bytes_written, (1 << 20) + 512 + 8192);
    assert_eq!(status[0].bytes_read, (1 << 20) + 512 + 8192);
    assert_eq!(status[0].errors, 3);
    assert_eq!(status[0].address, format!("nbd:unix:{}", socket.display()));

    // A second connection sees the data (another NBD session, same RTRS
    // session).
    let (mut client, _, _) = Client::connect(&socket, "");
    assert_eq!(client.read(SIZE - 512, 512), (0, small));
    client.disconnect();

    // The target restarts (its RAM volume starts empty): the initiator
    // reconnects and re-opens by itself, IO works again.
    drop(target);
    std::thread::sleep(Duration::from_millis(300));
    target = Target::start(port, MANIFEST);
    let (mut client, _, _) = Client::connect(&socket, "vol0");
    let after = pattern(77, 65536);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        // Held while the session is down, or EIO if it stayed down too
        // long; then retried.
        if client.write(0, &after, CMD_FLAG_FUA) == 0 && client.read(0, 65536) == (0, after.clone())
        {
            break;
        }
        assert!(Instant::now() < deadline, "no IO after the target restart");
        std::thread::sleep(Duration::from_millis(200));
    }
    client.disconnect();
    {
        // Either the initiator hid the restart (held IO, then re-open) or
        // the export made a new session.
        let lines = lines.lock().unwrap();
        let reconnected = lines
            .iter()
            .any(|l| l == "export vol0: session reconnected");
        let new_sessions = lines
            .iter()
            .filter(|l| l.contains("session \"nbd-test\" connected, vol0 opened"))
            .count();
        assert!(reconnected || new_sessions == 2, "{lines:?}");
    }

    // The target comes back without `vol0`: the re-open fails, the export
    // drops the session (EIO meanwhile) and reconnects with backoff until
    // the volume is there again.
    drop(target);
    std::thread::sleep(Duration::from_millis(300));
    target = Target::start(port, WITHOUT_VOL0);
    let (mut client, _, _) = Client::connect(&socket, "vol0");
    let deadline = Instant::now() + Duration::from_secs(90);
    while client.write(0, &after, 0) == 0 {
        assert!(
            Instant::now() < deadline,
            "writes still succeed without vol0"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(client.write(0, &after, 0), EIO);
    wait_for("the session to be dropped", Duration::from_secs(30), || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("export vol0: session lost"))
    });
    drop(target);
    std::thread::sleep(Duration::from_millis(300));
    target = Target::start(port, MANIFEST);
    let deadline = Instant::now() + Duration::from_secs(90);
    while client.write(0, &after, 0) != 0 {
        assert!(Instant::now() < deadline, "no IO after vol0 came back");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(client.read(0, 65536), (0, after.clone()));
    client.disconnect();
    assert!(exports.status()[0].session_connected);

    // Stopping removes the socket and closes the session.
    exports.stop_all();
    assert!(!socket.exists());
    assert!(lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("export vol0: session closed (the export is stopping)")));
    drop(target);
    std::fs::remove_dir_all(&dir).unwrap();
}
