//! Engine lifecycle: dead clients are reaped, connect/IO/disconnect cycles
//! leak nothing, and steady-state IO allocates nothing.
//!
//! A counting global allocator (the pattern of
//! `rtrs/tests/common/counting_alloc.rs`) counts, while armed on the test's
//! thread, every allocation, and separately those made inside
//! `Engine::receive`/`Engine::poll` but outside the harness callbacks the
//! engine calls (frame sink, logger): see `common::IN_ENGINE` and
//! `common::EXCLUDED`.

mod common;

use std::cell::Cell;

use common::{pattern, with_world, Fabric, World, SECOND};
use rnbd::wire::AccessMode;
use rtrs::server::Usage;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALL: Cell<u64> = const { Cell::new(0) };
    static ENGINE: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    let _ = ARMED.try_with(|armed| {
        if !armed.get() {
            return;
        }
        let _ = ALL.try_with(|count| count.set(count.get() + 1));
        let in_engine = common::IN_ENGINE.try_with(Cell::get).unwrap_or(0) > 0;
        let excluded = common::EXCLUDED.try_with(Cell::get).unwrap_or(1) > 0;
        if in_engine && !excluded {
            let _ = ENGINE.try_with(|count| count.set(count.get() + 1));
        }
    });
}

#[global_allocator]
static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);

/// Runs `f` with allocations counted: (all on this thread, the engine's).
fn counted<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    ALL.with(|c| c.set(0));
    ENGINE.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    let result = f();
    ARMED.with(|a| a.set(false));
    (result, ALL.with(Cell::get), ENGINE.with(Cell::get))
}

/// A tiny target: queue depth 4, 8 KiB chunks (4 KiB of IO each), room for
/// two sessions.
const MANIFEST: &str = r#"
[target]
name = "brick-lifecycle"

[limits]
queue_depth = 4
chunk_size = "8KiB"
max_sessions = 2
max_paths_per_session = 1
max_connections_per_path = 2

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "vol0"
kind = "ram"
size = "1MiB"

[[access]]
sessions = "s*"
volumes = ["vol0"]
mode = "rw"
"#;

const QUEUE_DEPTH: u16 = 4;

/// Registered buffers the engine's HCA holds.
fn engine_buffers(world: &World<'_>) -> usize {
    world.engine.hca(0).unwrap().arena().buffers()
}

/// Asserts the engine holds nothing: no session, RTRS usage all zero,
/// `is_idle`, no volume request, its HCA's registered buffers back to
/// `idle_buffers`.
fn assert_engine_idle(world: &World<'_>, idle_buffers: usize, when: &str) {
    let usage = world.engine.rtrs(0).unwrap().usage();
    assert_eq!(usage, Usage::default(), "{when}: RTRS usage");
    assert_eq!(world.engine.session_count(), 0, "{when}: sessions");
    assert_eq!(
        world.engine.volume_requests_in_flight(),
        0,
        "{when}: volume requests"
    );
    assert!(world.engine.is_idle(), "{when}: engine not idle");
    assert_eq!(
        engine_buffers(world),
        idle_buffers,
        "{when}: HCA registered buffers"
    );
}

/// A client that vanishes (its host stops sending and receiving forever)
/// with writes and reads in flight is reaped by the engine's dead-peer
/// detection (heartbeats, rtrs.md §5, or the transport's retry limit on
/// what the engine still sends it) within `heartbeat_interval ×
/// (missed_max + 2)` plus the close timeout: the session goes, and the
/// engine holds nothing afterwards (RTRS usage all zero, `is_idle`,
/// registered memory back to its idle value). It is not reaped while it
/// is alive and quiet for less than that.
#[test]
fn killed_client_mid_io_is_reaped() {
    with_world(MANIFEST, |world| {
        let idle_buffers = engine_buffers(world);
        assert_engine_idle(world, idle_buffers, "before");
        let c = world.add_client(2, QUEUE_DEPTH, 1);
        world.connect(c, "s-victim", 2).expect("session");
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        world.start_workload(c, device, 0, 4, &[4096]);
        world.workload_progress(c, 40);
        world.workload(c).assert_clean(40);

        // Kill it with all four streams (writes and reads) in flight.
        world.run_until("all streams in flight", |w| w.workload_in_flight(c) == 4);
        world.clients[c].alive = false;
        let killed = world.now;
        let config = *world.engine.rtrs(0).unwrap().config();
        let detect = config.heartbeat_interval_ns * (u64::from(config.heartbeat_missed_max) + 2);
        let deadline = killed + detect + config.close_timeout_ns + 5 * SECOND;
        assert_eq!(world.engine.session_count(), 1);
        let mut session_gone = None;
        while world.now < deadline && !(world.engine.session_count() == 0 && world.engine.is_idle())
        {
            world.advance(50_000_000);
            if world.engine.session_count() == 0 {
                session_gone.get_or_insert(world.now - killed);
            }
        }
        let took = world.now - killed;
        assert!(
            world.engine.session_count() == 0 && world.engine.is_idle(),
            "the dead client's session is still held {} s after the kill\n{}",
            took / SECOND,
            world.engine.stats()
        );
        let reasons: Vec<String> = world
            .log
            .borrow()
            .iter()
            .filter(|l| l.starts_with("path down: session \"s-victim\""))
            .cloned()
            .collect();
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(
            reasons[0].ends_with("HeartbeatTimeout") || reasons[0].ends_with("CompletionError"),
            "closed for {reasons:?}"
        );
        let session_gone = session_gone.unwrap();
        if reasons[0].ends_with("HeartbeatTimeout") {
            // rtrs.md §5: not before `missed_max` intervals without a sign of life.
            let earliest = config.heartbeat_interval_ns * u64::from(config.heartbeat_missed_max);
            assert!(
                session_gone >= earliest,
                "reaped after only {session_gone} ns"
            );
        }
        eprintln!(
            "dead client: session closed after {} ms, engine idle after {} ms: {}",
            session_gone / 1_000_000,
            took / 1_000_000,
            reasons[0]
        );
        assert_engine_idle(world, idle_buffers, "after the kill");
    });
}

/// A client that closes its session (DREQ on every connection) with writes
/// and reads in flight: its requests fail locally, and the engine ends up
/// holding nothing (RTRS usage all zero, `is_idle`, registered memory back
/// to its idle value); a new session then works.
#[test]
fn client_disconnecting_mid_io_leaves_nothing() {
    with_world(MANIFEST, |world| {
        let idle_buffers = engine_buffers(world);
        let c = world.add_client(2, QUEUE_DEPTH, 1);
        world.connect(c, "s-leaver", 2).expect("session");
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        world.start_workload(c, device, 0, 4, &[4096]);
        world.workload_progress(c, 40);
        world.run_until("all streams in flight", |w| w.workload_in_flight(c) == 4);
        world.clients[c].workload.as_mut().unwrap().running = false;
        world.close_session(c);
        world.run_until("engine idle", |w| w.engine.is_idle());
        assert_engine_idle(world, idle_buffers, "after the disconnect");
        world.clients[c].alive = false;

        let again = world.add_client(3, QUEUE_DEPTH, 2);
        world.connect(again, "s-again", 2).expect("session");
        let device = world.open(again, 1, "vol0", AccessMode::ReadWrite).unwrap();
        let data = pattern(9, 4096);
        assert_eq!(world.write(again, 2, &device, 8192, &data), 0);
        assert_eq!(world.read(again, 3, &device, 8192, 4096), (0, data));
    });
}

/// A client that stays connected but idle (heartbeats only) for longer
/// than the dead-peer timeout keeps its session: the reaping above is
/// dead-peer detection, not an idle timeout.
#[test]
fn idle_live_client_is_not_reaped() {
    with_world(MANIFEST, |world| {
        let c = world.add_client(2, QUEUE_DEPTH, 1);
        world.connect(c, "s-idle", 2).expect("session");
        let config = *world.engine.rtrs(0).unwrap().config();
        let span = config.heartbeat_interval_ns * (u64::from(config.heartbeat_missed_max) + 3);
        let end = world.now + span;
        while world.now < end {
            // 50 ms of time, then a few fine steps for the round trips.
            world.advance(50_000_000);
            world.run_steps(5);
        }
        assert_eq!(world.engine.session_count(), 1);
        assert_eq!(world.log_count("path down"), 0);
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        let data = pattern(3, 4096);
        assert_eq!(world.write(c, 2, &device, 0, &data), 0);
        assert_eq!(world.read(c, 3, &device, 0, 4096), (0, data));
    });
}

/// Connect / OPEN / write / read / CLOSE / disconnect, 1,000 times, with a fresh
/// client HCA each time: after every cycle the engine is idle, and every
/// 100 cycles its RTRS usage is all zero and its HCA holds exactly the
/// registered buffers it held before the first cycle. The cycles outnumber
/// the engine HCA's QPs, CM slots and memory regions, so a per-cycle leak
/// of any of them would also make a connect fail. Each cycle also reads
/// back the block the previous cycle wrote (data survives sessions).
#[test]
fn connect_io_disconnect_cycles_leak_nothing() {
    // Measured on a 2-core machine: about 10 s in a debug build (roce is
    // optimised in the test profile), about 1 s in release.
    let cycles: u64 = 1000;
    // More cycles than the engine HCA has QPs, CM slots or memory regions:
    // leaking any of them per cycle would make a later connect fail.
    let regions_per_cycle = usize::from(QUEUE_DEPTH) + 3;
    with_world(MANIFEST, move |world| {
        let capacity = world.engine.hca(0).unwrap().capacity();
        assert!(cycles as usize > capacity.qps);
        assert!(cycles as usize * regions_per_cycle > capacity.regions);
        let idle_buffers = engine_buffers(world);
        let started = std::time::Instant::now();
        for cycle in 0..cycles {
            let c = world.add_client(2, QUEUE_DEPTH, 10_000 + cycle);
            world.connect(c, "s-cycle", 1).expect("session");
            let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
            let block = |n: u64| (n % 256) * 4096;
            let data = pattern(cycle, 4096);
            assert_eq!(world.write(c, 2, &device, block(cycle), &data), 0);
            assert_eq!(world.read(c, 3, &device, block(cycle), 4096), (0, data));
            if cycle > 0 {
                let previous = pattern(cycle - 1, 4096);
                assert_eq!(
                    world.read(c, 4, &device, block(cycle - 1), 4096),
                    (0, previous),
                    "cycle {cycle}: the previous cycle's block"
                );
            }
            assert_eq!(world.close_device(c, 5, &device), 0);
            world.close_session(c);
            world.run_until("engine idle after the cycle", |w| w.engine.is_idle());
            assert_eq!(world.engine.session_count(), 0);
            world.clients.clear();
            // Past the CM timewait (4.1 s), so connection slots come back.
            world.advance(5 * SECOND);
            if (cycle + 1) % 100 == 0 {
                assert_engine_idle(world, idle_buffers, &format!("after {} cycles", cycle + 1));
            }
        }
        assert_eq!(world.log_count("complete_io("), 0);
        eprintln!(
            "{cycles} cycles in {:.2} s",
            started.elapsed().as_secs_f64()
        );
    });
}

/// After warm-up, a window of steady-state 4 KiB writes and reads (four
/// streams, every read checked byte for byte) allocates nothing: not in
/// the engine (`receive`/`poll`), and not anywhere on the thread (client,
/// harness; frame buffers are recycled).
#[test]
fn steady_state_io_allocates_nothing() {
    with_world(MANIFEST, |world| {
        let c = world.add_client(2, QUEUE_DEPTH, 1);
        world.connect(c, "s-steady", 2).expect("session");
        let device = world.open(c, 1, "vol0", AccessMode::ReadWrite).unwrap();
        world.start_workload(c, device, 0, 4, &[4096]);
        world.workload_progress(c, 400);
        let completed = world.workload(c).completed;
        let answered = world.engine.answered();
        // The counter is live: an allocation in the window counts, and one
        // made while the engine runs counts as the engine's.
        let (_, all, engine) = counted(|| std::hint::black_box(vec![1u8; 16]));
        assert_eq!((all, engine), (1, 0));
        let (_, all, engine) =
            counted(|| common::as_engine(|| std::hint::black_box(vec![1u8; 16])));
        assert_eq!((all, engine), (1, 1));

        let ((), all, engine) = counted(|| world.run_steps(2_000));
        let done = world.workload(c).completed - completed;
        assert!(done >= 200, "only {done} IOs in the window");
        assert!(world.engine.answered() - answered >= done);
        world.workload(c).assert_clean(400 + done);
        assert_eq!(engine, 0, "allocations inside the engine during {done} IOs");
        assert_eq!(all, 0, "allocations on the thread during {done} IOs");
    });
}
