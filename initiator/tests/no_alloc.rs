//! The IO path allocates nothing: after the session is up and the volume
//! open, submitting IO and polling the initiator (RTRS client included)
//! never calls the allocator, over a workload of reads, writes, flushes and
//! discards, including 1 MiB IOs split into pieces and IO waiting for
//! permits.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{config, counted, pattern, run, World, COUNTING, SECOND};
use initiator::AccessMode;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn note() {
    if COUNTING.try_with(|c| c.get() > 0).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts allocations made while [`COUNTING`] is raised on the allocating
/// thread (`note`).
#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting::new(note);

const MANIFEST: &str = r#"
[target]
name = "brick-initiator-alloc"

[limits]
queue_depth = 8

[[interfaces]]
name = "eth0"
mac = "52:54:00:77:00:01"
address = "10.77.0.1/24"

[[volumes]]
name = "data"
kind = "ram"
size = "8MiB"

[[access]]
sessions = "*"
volumes = ["data"]
mode = "rw"
"#;

#[test]
fn io_path_allocates_nothing() {
    run(|| {
        let mut world = World::new(MANIFEST);
        let node = world.add_node(2, config(2));
        world.connect(node, "alloc", &["10.77.0.1:1234"]);
        let info = world.open(node, "data", AccessMode::ReadWrite).unwrap();
        let big = pattern(1, 1 << 20);
        let small = pattern(2, 4096);
        ALLOCATIONS.store(0, Ordering::Relaxed);
        let mut tag = 0;
        for round in 0..20u64 {
            // 16 IOs against 8 server permits: pieces wait for permits.
            for i in 0..16u64 {
                tag += 1;
                let now = world.now;
                let init = &mut world.nodes[node].init;
                let offset = (i % 8) << 20;
                let submitted = counted(|| match (round + i) % 5 {
                    0 => init.submit_write(now, tag, info.id, offset, &big, false),
                    1 => init.submit_read(now, tag, info.id, offset, 1 << 20),
                    2 => init.submit_write(now, tag, info.id, offset, &small, true),
                    3 => init.submit_flush(now, tag, info.id),
                    _ => init.submit_discard(now, tag, info.id, offset, 8192),
                });
                submitted.unwrap();
            }
            let last = tag;
            world.run_until("round done", 30 * SECOND, |w| {
                w.nodes[node].completions.iter().any(|(c, _)| c.tag == last)
                    && w.nodes[node].init.in_flight() == 0
            });
            let completions = std::mem::take(&mut world.nodes[node].completions);
            assert_eq!(completions.len(), 16);
            assert!(completions.iter().all(|(c, _)| c.result.is_ok()));
        }
        let stats = world.nodes[node].init.session_stats();
        assert!(stats.permit_waits > 0, "IO waited for permits: {stats:?}");
        assert_eq!(
            ALLOCATIONS.load(Ordering::Relaxed),
            0,
            "allocations on the IO path"
        );
        // The counter works: an allocation while counting is seen.
        counted(|| drop(std::hint::black_box(vec![0u8; 16])));
        assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 1);
    });
}
