//! A hostile virtio device against the split virtqueue
//! (`hal::virtio::queue::SplitQueue`), over the hal tests' mock device
//! memory (`hal/tests/common/virtio_mock.rs`): the driver pushes chains
//! and publishes them; the device takes some, then writes used entries
//! with any id and length at any ring position and publishes any used
//! index (backwards, far ahead, wrapping); the driver pops, enables and
//! disables interrupts.
//!
//! Invariants: no panic; every popped element names a chain in flight,
//! and a length it reports fits that chain's device-writable bytes; the
//! free descriptors plus those of the chains in flight are the queue size;
//! the queue never hands out more than it was given.
#![no_main]

#[path = "../../hal/tests/common/virtio_mock.rs"]
#[allow(clippy::all, unused)]
mod mock;

use std::collections::HashMap;

use brick_fuzz::script::Script;
use hal::virtio::queue::{Segment, SplitQueue};
use libfuzzer_sys::fuzz_target;
use mock::{Memory, MockTransport};

fuzz_target!(|input: &[u8]| {
    let mut script = Script::new(input);
    let size = 1u16 << (1 + script.below(8)); // 2..=256
    let memory = Memory::new(1 << 20);
    let mut pool = memory.pool(0, 1 << 20);
    let Ok(mut queue) = SplitQueue::new(&mut pool, 0, size) else {
        return;
    };
    let mut transport = MockTransport::new(0, &[size], Vec::new());
    queue.enable(&mut transport);
    // Chains in flight: head -> (descriptors, device-writable bytes).
    let mut in_flight: HashMap<u16, (u16, u64)> = HashMap::new();
    let mut device_used = 0u16;
    while !script.done() {
        match script.below(8) {
            0 | 1 => {
                let count = 1 + usize::from(script.below(6));
                let segments: Vec<Segment> = (0..count)
                    .map(|i| Segment {
                        address: 0x1000 * (i as u64 + 1),
                        len: u32::from(script.u16()) + 1,
                        device_writes: script.u8() & 1 != 0,
                    })
                    .collect();
                if let Ok(head) = queue.push(&segments) {
                    let writable = segments
                        .iter()
                        .filter(|s| s.device_writes)
                        .map(|s| u64::from(s.len))
                        .sum();
                    let old = in_flight.insert(head, (count as u16, writable));
                    assert!(old.is_none(), "head {head} handed out twice");
                }
            }
            2 => queue.publish(),
            3 => {
                // The device takes what was made available.
                let _ = transport.0.borrow_mut().queues[0].pop_avail(&memory);
            }
            4 => {
                // A used entry: a real head or any id, any length.
                let id = if script.u8() & 1 == 0 && !in_flight.is_empty() {
                    let heads: Vec<u16> = in_flight.keys().copied().collect();
                    u32::from(heads[usize::from(script.u8()) % heads.len()])
                } else {
                    script.u32()
                };
                let len = script.u32();
                let device = transport.0.borrow().queues[0];
                let position = if script.u8() & 1 == 0 {
                    device_used
                } else {
                    script.u16()
                };
                device.write_used_entry(&memory, position, id, len);
                if position == device_used {
                    device_used = device_used.wrapping_add(1);
                }
            }
            5 => {
                let index = match script.below(3) {
                    0 => device_used,
                    1 => device_used.wrapping_add(script.u16()),
                    _ => script.u16(),
                };
                transport.0.borrow().queues[0].publish_used(&memory, index);
            }
            6 => {
                for _ in 0..=usize::from(size) {
                    let Some(element) = queue.pop_used() else {
                        break;
                    };
                    let Some((_, writable)) = in_flight.remove(&element.head) else {
                        panic!("popped {element:?}, no such chain in flight");
                    };
                    if let Some(len) = element.len {
                        assert!(
                            u64::from(len) <= writable,
                            "popped {element:?}: length above the chain's {writable} writable bytes"
                        );
                    }
                }
            }
            _ => {
                if script.u8() & 1 == 0 {
                    let _ = queue.enable_interrupts();
                } else {
                    queue.disable_interrupts();
                }
                let _ = queue.has_used();
            }
        }
        let held: u16 = in_flight.values().map(|(d, _)| d).sum();
        assert_eq!(
            queue.free_descriptors() + held,
            size,
            "free descriptors {} + {held} in flight != queue size {size}",
            queue.free_descriptors()
        );
    }
});
