//! The engine of `engine_frames`: a small manifest, a deterministic key
//! source, the input format and its replay.
//!
//! # Input format
//!
//! A sequence of records `[delay: u8][len: u16 LE][frame: len & 0x7fff bytes]`,
//! each a frame for the engine's interface 0:
//!
//! * `delay` 0..=200: poll the engine once per step of [`STEP`] ns, that
//!   many times, then hand it the frame (0: in the same step as the
//!   previous frame). 201..=255: poll once, then jump `(delay - 200)²`
//!   × 10 ms (CM and RTRS timers, heartbeats).
//! * `len` bit 15 set: the frame goes in as it is. Clear: its IPv4
//!   header checksum and, for RoCEv2 (UDP 4791), its ICRC are recomputed
//!   first, so mutated headers reach the transport instead of dying at
//!   the checksum.
//! * a zero length delivers nothing (only the delay).
//!
//! The engine is built afresh for each input from the same manifest and
//! key seed, so the replay is deterministic: `fuzz-seeds` records the
//! frames Brick's client sends through a whole session (connect, OPEN,
//! writes, reads, close) in this format, and replaying one reaches every
//! state of that session.

use core::fmt;

use manifest::binary::Manifest;
use target_image::{Engine, HcaEngine};
use verbs::KeySource;

/// Nanoseconds of fake time per step.
pub const STEP: u64 = 10_000;
/// Fake time the engine has after `close_all` to let go of everything.
pub const DRAIN: u64 = 60_000_000_000;
/// Step of the drain while the engine is busy or has no timer.
const DRAIN_STEP: u64 = 100_000_000;
/// Timers the drain jumps to before it only steps (a bound on the polls
/// of an engine whose timers come ever faster).
const MAX_DRAIN_JUMPS: u32 = 10_000;
/// The clock at the start of an input.
pub const START: u64 = 1_000_000;
/// Largest frame a record may carry.
pub const MAX_FRAME: usize = 0x7fff;
/// `len` bit: deliver the frame without fixing its checksums.
pub const RAW: u16 = 0x8000;

/// The engine's MAC (the captures' server MAC).
pub const ENGINE_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x77, 0x00, 0x01];

/// Small on purpose (every input builds the engine afresh, and zeroing its
/// memory is most of an input's cost): two sessions, queue depth 8, 16 KiB
/// chunks, two small volumes (one read-only), 10.77.0.1 (the address of the
/// captures in `tests/vectors`).
pub const MANIFEST: &str = r#"
[target]
name = "brick-fuzz"

[limits]
max_sessions = 2
max_paths_per_session = 2
max_connections_per_path = 2
queue_depth = 8
chunk_size = "16KiB"

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "256KiB"

[[volumes]]
name = "ram0"
kind = "ram"
size = "64KiB"

[[access]]
sessions = "*"
volumes = ["vol0"]
mode = "rw"

[[access]]
sessions = "*"
volumes = ["ram0"]
mode = "ro"
"#;

/// The engine's random source: an LCG from a fixed seed.
pub struct EngineKeys(pub u64);

impl KeySource for EngineKeys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

/// The engine under test.
pub type FuzzEngine = HcaEngine<'static, EngineKeys>;

/// The compiled manifest (compiled once per process, kept for good).
pub fn manifest() -> Manifest<'static> {
    static BLOB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let blob = BLOB.get_or_init(|| manifest::build(MANIFEST, "fuzz.toml").expect("fuzz manifest"));
    Manifest::parse(blob).expect("fuzz manifest blob")
}

/// A fresh engine: the same for every input.
pub fn engine() -> FuzzEngine {
    Engine::new(manifest(), |i| EngineKeys(1000 + i as u64)).expect("fuzz engine")
}

/// Step count of a delay byte, and whether it is a jump (one poll).
pub fn delay_steps(delay: u8) -> (u64, bool) {
    if delay <= 200 {
        (u64::from(delay), false)
    } else {
        let tens_of_ms = u64::from(delay - 200).pow(2);
        (tens_of_ms * 10_000_000 / STEP, true)
    }
}

/// Appends one record to `out` (`raw`: checksums left as they are).
pub fn push_record(out: &mut Vec<u8>, delay: u8, frame: &[u8], raw: bool) {
    let len = frame.len().min(MAX_FRAME);
    out.push(delay);
    let mut field = len as u16;
    if raw {
        field |= RAW;
    }
    out.extend_from_slice(&field.to_le_bytes());
    out.extend_from_slice(&frame[..len]);
}

/// The records of an input: `(delay, raw, frame)`; a truncated last
/// record is cut to the bytes present.
pub fn records(input: &[u8]) -> impl Iterator<Item = (u8, bool, &[u8])> {
    let mut rest = input;
    core::iter::from_fn(move || {
        if rest.len() < 3 {
            return None;
        }
        let delay = rest[0];
        let field = u16::from_le_bytes([rest[1], rest[2]]);
        let len = usize::from(field & !RAW).min(rest.len() - 3);
        let frame = &rest[3..3 + len];
        rest = &rest[3 + len..];
        Some((delay, field & RAW != 0, frame))
    })
}

/// Recomputes the IPv4 header checksum and, for RoCEv2, the ICRC.
pub fn fix_checksums(frame: &mut [u8]) {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] || frame[14] != 0x45 {
        return;
    }
    frame[24] = 0;
    frame[25] = 0;
    let sum = internet_checksum(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    if frame[23] == 17 && frame.len() >= 42 && frame[36..38] == 4791u16.to_be_bytes() {
        // A frame too short for an ICRC stays as it is.
        let _ = roce::wire::fill_icrc(frame);
    }
}

fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([
            pair[0],
            pair.get(1).copied().unwrap_or(0),
        ]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Checks what the engine sends: every RoCEv2 frame parses (the peer's
/// HCA must be able to read what we emit).
struct CheckedSink {
    frame: Vec<u8>,
    sent: u64,
}

impl CheckedSink {
    fn transmit(&mut self, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        self.sent += 1;
        let is_roce = headers.len() >= 38
            && headers[12..14] == [0x08, 0x00]
            && headers[23] == 17
            && headers[36..38] == 4791u16.to_be_bytes();
        if !is_roce {
            return;
        }
        self.frame.clear();
        self.frame.extend_from_slice(headers);
        for piece in payload {
            self.frame.extend_from_slice(piece);
        }
        self.frame.extend_from_slice(trailer);
        if let Err(error) = roce::wire::parse_frame(&self.frame) {
            panic!(
                "the engine sent a RoCEv2 frame it cannot parse ({error}): {:02x?}",
                &self.frame[..self.frame.len().min(96)]
            );
        }
    }
}

/// Discards formatted text (the statistics report is only rendered).
struct Discard;

impl fmt::Write for Discard {
    fn write_str(&mut self, _: &str) -> fmt::Result {
        Ok(())
    }
}

/// Replays `input` on a fresh engine, then checks the invariants: no
/// panic, every frame sent parses, the statistics render, the session
/// and request counts stay within the manifest, and after `close_all` the
/// engine lets go of everything (`is_idle`: no session, path, connection,
/// request or registered buffer) within a minute of fake time. Returns
/// what the engine did.
pub fn replay(input: &[u8]) -> Outcome {
    run(input).2
}

/// [`replay`], then a healthy session of Brick's client from another host
/// must work: connect, SESS_INFO, OPEN read-write, a 4 KiB write read back
/// byte for byte, CLOSE. (A wait that runs out of steps panics with the
/// engine's statistics.)
pub fn replay_and_serve(input: &[u8]) -> Outcome {
    use crate::session::clients::{fill_pattern, Fabric};
    use rnbd::wire::AccessMode;
    let (engine, now, outcome) = run(input);
    let mut world = crate::session::Recorder::around(engine, now);
    let c = world.add_light_client(3);
    world
        .connect(c, "healthy", 1)
        .expect("a healthy session connects after the input");
    assert_eq!(world.sess_info(c, 1), 2, "SESS_INFO of the healthy session");
    let device = world
        .open(c, 2, "vol0", AccessMode::ReadWrite)
        .expect("the healthy session opens vol0 read-write");
    let mut data = [0u8; 4096];
    fill_pattern(now, &mut data);
    assert_eq!(world.write(c, 3, &device, 8192, &data), 0, "healthy write");
    let (errno, back) = world.read(c, 4, &device, 8192, 4096);
    assert!(
        errno == 0 && back == data,
        "healthy read-back differs (errno {errno})"
    );
    assert_eq!(world.close_device(c, 5, &device), 0, "healthy CLOSE");
    outcome
}

fn run(input: &[u8]) -> (FuzzEngine, u64, Outcome) {
    let mut engine = engine();
    let mut sink = CheckedSink {
        frame: Vec::with_capacity(16 << 10),
        sent: 0,
    };
    let mut frame = Vec::with_capacity(MAX_FRAME);
    let mut now = START;
    let mut started = false;
    let poll = |engine: &mut FuzzEngine, sink: &mut CheckedSink, now: u64| {
        engine.poll(now, &mut |_: usize, h: &[u8], p: &[&[u8]], t: &[u8]| {
            sink.transmit(h, p, t)
        });
    };
    for (delay, raw, bytes) in records(input) {
        let (steps, jump) = delay_steps(delay);
        if jump {
            poll(&mut engine, &mut sink, now);
            now += steps * STEP;
        } else {
            for _ in 0..steps {
                if started {
                    poll(&mut engine, &mut sink, now);
                }
                now += STEP;
            }
        }
        started = true;
        if bytes.is_empty() {
            continue;
        }
        frame.clear();
        frame.extend_from_slice(bytes);
        if !raw {
            fix_checksums(&mut frame);
        }
        engine.receive(0, now, &frame);
    }
    for _ in 0..16 {
        poll(&mut engine, &mut sink, now);
        now += STEP;
    }
    check_bounds(&engine);
    let answered = engine.answered();
    engine.close_all(now);
    let mut jumps = 0;
    let limit = now + DRAIN;
    while !engine.is_idle() && now < limit {
        poll(&mut engine, &mut sink, now);
        // Straight to the engine's next timer (nothing else can change
        // its state: no frame comes in); while it is busy, says it has no
        // timer, or after MAX_DRAIN_JUMPS timers, in steps of DRAIN_STEP.
        let at = engine
            .poll_at(now)
            .filter(|at| *at > now && jumps < MAX_DRAIN_JUMPS);
        jumps += 1;
        now = at.unwrap_or(now + DRAIN_STEP).min(limit);
    }
    assert!(
        engine.is_idle(),
        "the engine still holds resources 60 s after close_all: {}\nusage {:?}",
        engine.stats(),
        engine.server().usage()
    );
    let outcome = Outcome {
        answered,
        sent: sink.sent,
    };
    (engine, now, outcome)
}

/// What a replay made the engine do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// IO requests answered before `close_all`.
    pub answered: u64,
    /// Frames the engine sent.
    pub sent: u64,
}

fn check_bounds(engine: &FuzzEngine) {
    let manifest = engine.manifest();
    let limits = manifest.limits();
    assert!(
        engine.session_count() <= limits.max_sessions as usize,
        "{} sessions open, the manifest allows {}",
        engine.session_count(),
        limits.max_sessions
    );
    let _ = fmt::write(&mut Discard, format_args!("{}", engine.stats()));
}

/// Stack of the thread that runs the engine (its HCA is built on the
/// stack before it is boxed, as in the engine tests).
pub const STACK: usize = 256 << 20;

/// Keeps freed large blocks in the heap (process-wide) instead of returning them to the
/// kernel: every input builds and drops an engine of some tens of
/// megabytes, and without this each build page-faults all of it in again
/// (about four times slower).
pub fn keep_memory_between_inputs() {
    // SAFETY: mallopt only changes glibc allocator tunables; called before
    // the engine allocates, with valid parameter numbers and values.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
}

/// Runs `f` on a thread with a [`STACK`]-byte stack, propagating its panic.
pub fn on_big_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("engine thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// One thread with a [`STACK`]-byte stack that replays the inputs handed
/// to it ([`replay_and_serve`]), for the whole process (a panic there aborts the process through
/// the fuzzer's panic hook, which is the crash report).
pub fn replay_on_worker(input: &[u8]) {
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::{Mutex, OnceLock};
    type Pipe = (Sender<Vec<u8>>, Receiver<()>);
    static WORKER: OnceLock<Mutex<Pipe>> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        keep_memory_between_inputs();
        let (to_worker, inputs) = channel::<Vec<u8>>();
        let (done, from_worker) = channel::<()>();
        // BRICK_FUZZ_VERBOSE: print what each input made the engine do
        // (to check that a seed replays its whole session).
        let verbose = std::env::var_os("BRICK_FUZZ_VERBOSE").is_some();
        std::thread::Builder::new()
            .name("engine".into())
            .stack_size(STACK)
            .spawn(move || {
                for input in inputs {
                    let outcome = replay_and_serve(&input);
                    if verbose {
                        eprintln!("{} bytes: {outcome:?}", input.len());
                    }
                    if done.send(()).is_err() {
                        break;
                    }
                }
            })
            .expect("engine thread");
        Mutex::new((to_worker, from_worker))
    });
    let pipe = worker
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    pipe.0.send(input.to_vec()).expect("engine thread alive");
    pipe.1.recv().expect("engine thread finished the input");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_truncated_tail_is_cut() {
        let mut input = Vec::new();
        push_record(&mut input, 3, &[1, 2, 3], false);
        push_record(&mut input, 250, &[], true);
        push_record(&mut input, 0, &[9; 10], true);
        input.truncate(input.len() - 4);
        let got: Vec<(u8, bool, Vec<u8>)> = records(&input)
            .map(|(d, raw, f)| (d, raw, f.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (3, false, vec![1, 2, 3]),
                (250, true, vec![]),
                (0, true, vec![9; 6])
            ]
        );
    }

    #[test]
    fn delays_are_steps_then_squared_jumps() {
        assert_eq!(delay_steps(0), (0, false));
        assert_eq!(delay_steps(200), (200, false));
        // 201: 10 ms; 255: 55² × 10 ms = 30.25 s.
        assert_eq!(delay_steps(201), (10_000_000 / STEP, true));
        assert_eq!(delay_steps(255), (3025 * 10_000_000 / STEP, true));
    }

    #[test]
    fn fixed_frames_pass_the_checksums_again() {
        let mut input = Vec::new();
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/seeds/engine_frames/capture-rping-linux"
        );
        input.extend_from_slice(&std::fs::read(dir).expect("committed seed"));
        let (_, _, frame) = records(&input)
            .find(|(_, _, f)| f.len() > 60 && f[23] == 17)
            .expect("a RoCEv2 frame in the rping seed");
        assert!(
            roce::wire::verify_icrc(frame),
            "the captured frame verifies"
        );
        let mut mutated = frame.to_vec();
        mutated[50] ^= 0x40; // a BTH byte
        mutated[22] ^= 1; // the IPv4 TTL
        assert!(!roce::wire::verify_icrc(&mutated));
        fix_checksums(&mut mutated);
        assert!(roce::wire::verify_icrc(&mutated), "ICRC recomputed");
        assert_eq!(
            internet_checksum(&mutated[14..34]),
            0,
            "IPv4 header checksum recomputed"
        );
    }
}
