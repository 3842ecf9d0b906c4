//! `fuzz-seeds DIR`: writes the seed inputs of the stateful targets into
//! `DIR/<target>/`.
//!
//! * `engine_frames`: the frames Brick's own RTRS + RNBD client (the
//!   engine tests' `Node`, `target-image/tests/common/clients.rs`) sends
//!   to the fuzz engine through whole sessions, recorded in the
//!   `engine_frames` input format with the exact step timing, so a replay
//!   on the fresh, deterministic engine goes through the same states; and
//!   the client-to-server frames of every `tests/vectors/*.pcap` (Linux
//!   rnbd_client over rxe: they reach the CM and the QPs, not the chunks,
//!   whose keys differ).
//!
//! The other targets' seeds are small scripts committed under
//! `fuzz/seeds/`.

use std::path::{Path, PathBuf};

use brick_fuzz::engine;
use brick_fuzz::session::clients::{pattern, Fabric};
use brick_fuzz::session::Recorder;
use rnbd::wire::AccessMode;

/// Capture seeds stop after this many bytes (the session set-up and the
/// first requests; the rest is more of the same and slows every run).
const MAX_CAPTURE_SEED: usize = 48 << 10;

/// One recorded session: connect `connections` connections as `name`,
/// then `script` (the IO), then close.
fn session(
    name: &str,
    connections: u16,
    script: impl FnOnce(&mut Recorder, usize),
) -> (Vec<u8>, u64) {
    let mut world = Recorder::recording();
    world.add_client(2);
    world
        .connect(0, name, connections)
        .expect("seed session up");
    script(&mut world, 0);
    let answered = world.engine.answered();
    world.close_session(0);
    world.run_steps(50);
    (world.record.take().unwrap_or_default(), answered)
}

/// (name, input, IO requests the engine answered in the session).
fn engine_seeds() -> Vec<(String, Vec<u8>, u64)> {
    let mut seeds = Vec::new();
    let (bytes, answered) = session("s1", 1, |w, c| {
        assert_eq!(w.sess_info(c, 1), 2);
        let device = w.open(c, 2, "vol0", AccessMode::ReadWrite).expect("open");
        let data = pattern(3, 4096);
        assert_eq!(w.write(c, 3, &device, 0, &data), 0);
        let (errno, back) = w.read(c, 4, &device, 0, 4096);
        assert!(errno == 0 && back == data, "seed read-back");
        let big = pattern(4, 12 * 1024);
        assert_eq!(w.write(c, 5, &device, 128 * 1024, &big), 0);
        assert_eq!(w.read(c, 6, &device, 128 * 1024, 12 * 1024).0, 0);
        assert_eq!(w.close_device(c, 7, &device), 0);
    });
    seeds.push(("session-io".to_string(), bytes, answered));
    let (bytes, answered) = session("s2", 2, |w, c| {
        assert_eq!(w.sess_info(c, 1), 2);
        assert!(w.open(c, 2, "nope", AccessMode::ReadOnly).is_err());
        assert!(w.open(c, 3, "ram0", AccessMode::ReadWrite).is_err());
        let mut device = w.open(c, 4, "ram0", AccessMode::ReadOnly).expect("ro open");
        device.mode = AccessMode::ReadWrite;
        assert_ne!(w.write(c, 5, &device, 0, &[7; 4096]), 0);
        assert_eq!(w.read(c, 6, &device, 4096, 4096).0, 0);
    });
    seeds.push(("session-refusals".to_string(), bytes, answered));
    seeds
}

/// The client-to-server frames of a capture (the client's MAC is
/// 52:54:00:77:00:02 in every capture), one step apart.
fn capture_seed(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::read(path).ok()?;
    let reader = roce::pcap::Reader::new(&file).ok()?;
    let mut out = Vec::new();
    for record in reader {
        let Ok(record) = record else { break };
        let frame = record.data;
        if frame.len() > 12 && frame[6..12] == [0x52, 0x54, 0x00, 0x77, 0x00, 0x02] {
            engine::push_record(&mut out, 1, frame, true);
        }
        if out.len() >= MAX_CAPTURE_SEED {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// NBD sessions (the `nbd_server` input: a configuration byte, then the
/// client's bytes): fixed-newstyle handshakes with GO, EXPORT_NAME and
/// INFO + LIST + ABORT, and requests of every command.
fn nbd_seeds() -> Vec<(String, Vec<u8>)> {
    use initiatord::nbd::wire::*;
    use initiatord::nbd::Request;
    fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }
    fn go_data(name: &[u8]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name);
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data
    }
    fn request(out: &mut Vec<u8>, command: u16, flags: u16, offset: u64, length: u32) {
        let header = Request {
            flags,
            command,
            cookie: out.len() as u64,
            offset,
            length,
        };
        out.extend_from_slice(&header.emit());
        if command == CMD_WRITE {
            out.extend(std::iter::repeat_n(0x5a, length as usize));
        }
    }
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let mut go = vec![0x01];
    go.extend_from_slice(&flags);
    option(&mut go, OPT_GO, &go_data(b"vol0"));
    request(&mut go, CMD_WRITE, CMD_FLAG_FUA, 0, 4096);
    request(&mut go, CMD_READ, 0, 0, 4096);
    request(&mut go, CMD_FLUSH, 0, 0, 0);
    request(&mut go, CMD_TRIM, 0, 8192, 4096);
    request(&mut go, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 16384, 8192);
    request(&mut go, CMD_READ, 0, (1 << 20) - 512, 1024);
    request(&mut go, CMD_DISC, 0, 0, 0);
    let mut export = vec![0x06];
    export.extend_from_slice(&flags);
    option(&mut export, OPT_STRUCTURED_REPLY, &[]);
    option(&mut export, OPT_EXPORT_NAME, b"vol0");
    request(&mut export, CMD_WRITE, 0, 512, 512);
    request(&mut export, CMD_READ, 0, 512, 512);
    let mut list = vec![0x00];
    list.extend_from_slice(&flags);
    option(&mut list, OPT_INFO, &go_data(b""));
    option(&mut list, OPT_LIST, &[]);
    option(&mut list, OPT_ABORT, &[]);
    vec![
        ("go-requests".into(), go),
        ("export-name".into(), export),
        ("info-list-abort".into(), list),
    ]
}

/// An RTRS session (the `rtrs_server` script): connect cid 0 of a
/// one-connection path, INFO_REQ as "s1", a 4 KiB WRITE and a READ into
/// chunk 0, a heartbeat, completions, a disconnect.
fn rtrs_seed() -> Vec<u8> {
    let mut script = vec![
        0, 0, 0, 0, 0, // CON_REQ path 0, cid_num 1, cid 0, recon 0
        3, 0, 0, 0, // INFO_REQ on path 0, good name "s1"
        4, 0, 0, 0, 0, 0x00, 0x10, 4, 1, 0, 0, 0, 0, // WRITE 4096 into chunk 0, 4-byte header
        8, // complete sends
        9, 0, 0, // complete the IO
        6, 0, 0, 0, 1, 0x00, 0x10, 4, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0x10, // READ
        7, 0, 0, 0, // heartbeat
        8, 9, 0, 0, // completions
        10, 0, 0, 1, // disconnect
    ];
    script.extend_from_slice(&[12, 5, 12, 0]);
    script
}

fn write_seed(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("seed directory");
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{} ({} bytes)", path.display(), bytes.len());
}

fn main() {
    engine::keep_memory_between_inputs();
    engine::on_big_stack(write_all);
}

fn write_all() {
    if std::env::var_os("FUZZ_SEEDS_TIME").is_some() {
        let t = std::time::Instant::now();
        for _ in 0..20 {
            drop(engine::engine());
        }
        eprintln!("engine build: {:?}", t.elapsed() / 20);
        let t = std::time::Instant::now();
        for _ in 0..20 {
            engine::replay(&[]);
        }
        eprintln!("empty replay: {:?}", t.elapsed() / 20);
        let t = std::time::Instant::now();
        for _ in 0..20 {
            engine::replay_and_serve(&[]);
        }
        eprintln!("empty replay and a healthy session: {:?}", t.elapsed() / 20);
    }
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .expect("usage: fuzz-seeds DIR");
    let dir = out.join("engine_frames");
    for (name, bytes, answered) in engine_seeds() {
        // The replay must go through the session as recorded.
        let outcome = engine::replay_and_serve(&bytes);
        assert_eq!(
            outcome.answered, answered,
            "seed {name}: the replay answered {} IO requests, the session {answered}",
            outcome.answered
        );
        assert!(
            answered > 0,
            "seed {name}: the session answered no IO request"
        );
        println!(
            "{name}: replay answered {answered} IO requests, sent {} frames",
            outcome.sent
        );
        write_seed(&dir, &name, &bytes);
    }
    for (name, bytes) in nbd_seeds() {
        write_seed(&out.join("nbd_server"), &name, &bytes);
    }
    write_seed(&out.join("rtrs_server"), "session", &rtrs_seed());
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
    let mut pcaps: Vec<PathBuf> = std::fs::read_dir(&vectors)
        .expect("tests/vectors")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    pcaps.sort();
    for pcap in pcaps {
        if let Some(bytes) = capture_seed(&pcap) {
            let name = pcap.file_stem().unwrap().to_string_lossy().into_owned();
            write_seed(&dir, &format!("capture-{name}"), &bytes);
        }
    }
}
