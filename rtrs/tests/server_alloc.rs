//! No allocation on the data path after warm-up (ARCHITECTURE.md §6): a counting
//! global allocator sees no server allocation while requests are received,
//! dispatched, answered (both invalidate modes) and heartbeats run.
//! Allocations made inside the mock provider are not counted (`InProvider`).

mod server_support;
#[path = "common/counting_alloc.rs"]
#[macro_use]
mod counting_alloc;

use std::cell::Cell;

use rtrs::server::{AdmitAll, Event, ReadData};
use server_support::*;
use verbs::Rkey;

counting_allocator!(PROVIDER_DEPTH);

fn round(h: &mut Harness, path: &mut ClientPath, events: &mut Vec<Event>, chunk: u32) {
    path.write(h, 1, chunk, &[1; 32], &[2; 4096]);
    path.read(h, 0, (chunk + 1) % 8, &[3; 32], 4096, Rkey(0x77), true);
    for _ in 0..4 {
        let now = h.now;
        armed(|| while h.server.poll(now, &mut h.ports, &mut AdmitAll) {});
        h.mock().complete_sends();
    }
    armed(|| {
        while let Some(event) = h.server.next_event() {
            events.push(event); // within the reserved capacity
        }
    });
    for event in events.drain(..) {
        if let Event::Io { token, .. } = event {
            let now = h.now;
            armed(|| {
                h.server
                    .complete_io(token, 0, ReadData::Chunk, now, &mut h.ports)
            })
            .expect("complete");
        }
    }
    let now = h.now;
    armed(|| while h.server.poll(now, &mut h.ports, &mut AdmitAll) {});
    // Track the new rkeys (client side, not counted).
    let sends = h.mock().sends.clone();
    for (_, wr) in sends.iter().rev().take(8) {
        if let verbs::SendOp::SendInline { imm: Some(_), .. } = wr.op {
            if let Ok(rsp) = rtrs::wire::RkeyRsp::parse(&h.mock().gather(wr)) {
                path.chunks[usize::from(rsp.buf_id)].rkey = rsp.rkey;
            }
        }
    }
    h.mock().complete_sends();
    h.now += SECOND;
    let now = h.now;
    armed(|| while h.server.poll(now, &mut h.ports, &mut AdmitAll) {});
    h.mock().deliver_imm(path.conns[0], 0x9000_0000); // HB_ACK keeps it alive
}

#[test]
fn data_path_does_not_allocate() {
    for invalidate in [true, false] {
        let mut config = small_config();
        config.always_invalidate = invalidate;
        let mut h = Harness::new(config);
        let mut path = ClientPath::open(&mut h, 2, 1, 1, "alloc");
        h.drain_events();
        let mut events = Vec::with_capacity(64);
        // The counter works.
        COUNT.with(|c| c.set(0));
        armed(|| drop(std::hint::black_box(vec![1u8; 10])));
        assert_eq!(COUNT.with(Cell::get), 1);
        // Warm-up.
        round(&mut h, &mut path, &mut events, 0);
        COUNT.with(|c| c.set(0));
        for i in 0..50u32 {
            round(&mut h, &mut path, &mut events, (i * 2) % 8);
        }
        let stats = h.server.stats();
        assert_eq!(stats.paths_closed, 0, "path stayed up");
        let usage = h.server.usage();
        assert_eq!((usage.paths, usage.ios), (1, 0));
        let answered: u64 = h.ports[0]
            .sends
            .iter()
            .filter(|(_, wr)| wr.signaled && !matches!(wr.op, verbs::SendOp::LocalInv { .. }))
            .count() as u64;
        assert!(answered >= 102, "requests were answered: {answered}");
        assert_eq!(
            COUNT.with(Cell::get),
            0,
            "server allocations on the data path (invalidate = {invalidate})"
        );
    }
}
