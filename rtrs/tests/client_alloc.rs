//! No allocation on the client's data path after `Client::new` (STYLE.md,
//! ARCHITECTURE.md §6): a counting global allocator sees no client allocation
//! while requests are submitted, laid out, answered (both invalidate modes),
//! heartbeats run, a path fails over and reconnects. Allocations inside the
//! loopback provider (`InProvider`) and in the test harness are not counted.

mod client_support;
#[path = "common/counting_alloc.rs"]
#[macro_use]
mod counting_alloc;

use std::cell::Cell;

use client_support::*;
use rtrs::client::{ClientIo, Direction, Event, ReadBuffer};
use rtrs::server::{AdmitAll, Event as ServerEvent};
use verbs::{AccessFlags, Memory, Sge, Sgl};

counting_allocator!(PROVIDER_DEPTH);

/// `Pair::settle` with only the client's calls counted.
fn settle(pair: &mut Pair) {
    for _ in 0..1000 {
        let now = pair.now;
        let mut busy = armed(|| pair.client.poll(now));
        busy |= pair.server.poll(now, &mut pair.ports, &mut AdmitAll);
        busy |= pair.fabric.run();
        while let Some(event) = pair.server.next_event() {
            busy = true;
            if let ServerEvent::Io { .. } = event {
                pair.serve_io(&event);
            }
        }
        while let Some(event) = armed(|| pair.client.next_event()) {
            busy = true;
            pair.events.push(event);
        }
        if !busy {
            return;
        }
    }
    panic!("did not settle");
}

fn workload(pair: &mut Pair, source: verbs::MemoryRegion, sink: verbs::MemoryRegion) {
    for round in 0..3u64 {
        for i in 0..8u64 {
            let data = Sgl::single(Sge::new(source.lkey, (i * 1024) as u32, 1000));
            let head = header(b'W', i * 4096);
            armed(|| {
                pair.client.submit(ClientIo {
                    tag: round * 100 + i,
                    header: &head,
                    direction: Direction::Write { data },
                    admin: false,
                    hint: Some(i as u16),
                })
            })
            .expect("write");
        }
        settle(pair);
        for i in 0..8u64 {
            let head = header(b'R', i * 4096);
            let dest = ReadBuffer {
                region: sink,
                offset: (i * 1024) as u32,
                len: 1000,
            };
            armed(|| {
                pair.client.submit(ClientIo {
                    tag: round * 100 + 50 + i,
                    header: &head,
                    direction: Direction::Read { dest },
                    admin: i == 0,
                    hint: None,
                })
            })
            .expect("read");
        }
        settle(pair);
    }
}

#[test]
fn client_data_path_does_not_allocate() {
    // The counter works.
    COUNT.with(|c| c.set(0));
    drop(armed(|| Vec::<u8>::with_capacity(10)));
    assert_eq!(COUNT.with(Cell::get), 1);
    for always_invalidate in [true, false] {
        let mut pair = Pair::new(server_config(always_invalidate), client_config());
        pair.connect(2, 3);
        let source = pair.client_buffer(16 * 1024, AccessFlags::LOCAL_WRITE);
        pair.client
            .verbs_mut()
            .write(source.handle, 0, &[0x5a; 16 * 1024])
            .unwrap();
        let sink = pair.client_buffer(
            16 * 1024,
            AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
        );
        // Warm-up: the harness's own queues grow here.
        workload(&mut pair, source, sink);
        pair.events.clear();
        COUNT.with(|c| c.set(0));
        workload(&mut pair, source, sink);
        // Heartbeats, a path failure with failover, and a reconnect.
        for _ in 0..12 {
            pair.now += SECOND;
            settle(&mut pair);
        }
        pair.fabric.kill(server_addr(0).ip());
        settle(&mut pair);
        for _ in 0..3 {
            pair.now += SECOND;
            settle(&mut pair);
        }
        workload(&mut pair, source, sink);
        let completed = pair
            .events
            .iter()
            .filter(|e| matches!(e, Event::IoCompleted { errno: 0, .. }))
            .count();
        assert_eq!(completed, 2 * 48);
        assert!(pair.events.contains(&Event::PathUp { path: 0 }));
        assert_eq!(COUNT.with(Cell::get), 0, "client allocations");
    }
}
