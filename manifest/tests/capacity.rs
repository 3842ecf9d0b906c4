//! `manifest::Capacity`: the counts the limits make the target hold, and
//! the image check naming its numbers.

use manifest::capacity::{Capacity, IMAGE_RAM_LIMIT, MAX_QPS};
use manifest::Limits;

fn limits(max_sessions: u32, paths: u16, connections: u16, queue_depth: u16) -> Limits {
    Limits {
        max_sessions,
        max_paths_per_session: paths,
        max_connections_per_path: connections,
        queue_depth,
        chunk_size: 8 << 10,
        ..Limits::default()
    }
}

#[test]
fn counts_follow_the_limits() {
    // 100 sessions of one path of two connections at queue depth 32.
    let c = Capacity::for_limits(&limits(100, 1, 2, 32), 2, 3);
    assert_eq!(c.path_pools, 125, "100 live paths and a quarter more");
    assert_eq!(
        c.qps,
        (125 + 16) * 2,
        "the pools' paths and 16 half-open ones"
    );
    assert_eq!(c.recv_depth, 513, "the 512 service receives, plus one");
    assert_eq!(c.send_depth, 100, "three WRs per request plus four");
    assert_eq!(c.cq_entries, 282 * 613);
    assert_eq!(c.cm_connections, 2 * 282 + 16);
    assert_eq!(
        c.regions,
        125 * 34 + 16,
        "32 chunks and INFO_REQ, INFO_RSP per pool"
    );
    assert_eq!(c.pool_bytes, 32 * (8192 + 64) + (64 << 10));
    assert_eq!(c.arena_bytes(), 125 * c.pool_bytes);
    assert_eq!(
        c.requests,
        125 * 32 * 2,
        "every chunk of every pool, both interfaces"
    );
    let memory = c.memory();
    assert_eq!(memory.chunks, 2 * c.arena_bytes());
    assert!(memory.qps > 0 && memory.cq > 0 && memory.tables > 0 && memory.requests > 0);
    // One session: its one path.
    assert_eq!(c.session_memory().chunks, c.pool_bytes);
    // A small configuration: one session's paths of replacements.
    let one = Capacity::for_limits(&limits(1, 4, 2, 512), 1, 1);
    assert_eq!(one.path_pools, 8);
    assert_eq!(one.send_depth, 128);
    assert_eq!(one.recv_depth, 513);
}

#[test]
fn the_image_check_names_what_does_not_fit() {
    let small = Capacity::for_limits(&limits(4, 1, 2, 32), 1, 1);
    assert!(small.check_image(64 << 20).is_ok());
    // RAM volumes alone over the limit.
    let error = small.check_image(IMAGE_RAM_LIMIT).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("RAM volumes 3072 MiB"), "{text}");
    assert!(
        text.contains("it can use at most 3072 MiB below 4 GiB"),
        "{text}"
    );
    // More QPs than an HCA holds.
    let huge = Capacity::for_limits(&limits(1024, 128, 2, 32), 1, 1);
    assert!(huge.qps > MAX_QPS);
    let text = huge.check_image(0).unwrap_err().to_string();
    assert!(
        text.contains(&format!(
            "{} queue pairs per interface, an HCA holds at most {MAX_QPS}",
            huge.qps
        )),
        "{text}"
    );
    assert_eq!(huge.check_hca(), Err(("queue pairs", huge.qps, MAX_QPS)));
}
