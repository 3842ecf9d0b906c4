//! The split virtqueue alone, against the mock device side: descriptor
//! layout, free list, index wrap-around, notification suppression, the
//! used-buffer interrupt enable/disable with its re-check, and a device
//! that lies.

#[path = "common/virtio_mock.rs"]
mod mock;

use hal::virtio::queue::{PushError, Segment, SplitQueue, UsedElement};
use mock::{Descriptor, DeviceQueue, Memory, MockTransport};

fn setup(size: u16) -> (SplitQueue, MockTransport, std::rc::Rc<Memory>) {
    let memory = Memory::new(1 << 20);
    let mut pool = memory.pool(0, 1 << 20);
    let queue = SplitQueue::new(&mut pool, 0, size).unwrap();
    let mut transport = MockTransport::new(0, &[size], Vec::new());
    queue.enable(&mut transport);
    (queue, transport, memory)
}

fn device(transport: &MockTransport) -> std::cell::RefMut<'_, DeviceQueue> {
    std::cell::RefMut::map(transport.0.borrow_mut(), |state| &mut state.queues[0])
}

fn segment(address: u64, len: u32, device_writes: bool) -> Segment {
    Segment {
        address,
        len,
        device_writes,
    }
}

#[test]
fn chains_are_laid_out_and_freed() {
    let (mut queue, transport, memory) = setup(8);
    let chain = [
        segment(0x1000, 16, false),
        segment(0x2000, 512, true),
        segment(0x3000, 1, true),
    ];
    let head = queue.push(&chain).unwrap();
    assert_eq!(queue.free_descriptors(), 5);
    assert_eq!(
        device(&transport).pop_avail(&memory),
        None,
        "not published yet"
    );
    queue.publish();
    let (seen, descriptors) = device(&transport).pop_avail(&memory).unwrap();
    assert_eq!(seen, head);
    let expected: Vec<Descriptor> = chain
        .iter()
        .map(|s| Descriptor {
            address: s.address,
            len: s.len,
            writable: s.device_writes,
        })
        .collect();
    assert_eq!(descriptors, expected);
    assert_eq!(queue.pop_used(), None);
    device(&transport).push_used(&memory, u32::from(head), 513);
    assert_eq!(
        queue.pop_used(),
        Some(UsedElement {
            head,
            len: Some(513)
        })
    );
    assert_eq!(queue.free_descriptors(), 8);
}

#[test]
fn full_and_bad_chains_are_refused() {
    let (mut queue, _transport, _memory) = setup(4);
    assert_eq!(queue.push(&[]), Err(PushError::BadChain));
    let five = [segment(0, 1, false); 5];
    assert_eq!(queue.push(&five), Err(PushError::BadChain));
    queue.push(&five[..3]).unwrap();
    assert_eq!(queue.push(&five[..2]), Err(PushError::Full));
    queue.push(&five[..1]).unwrap();
    assert_eq!(queue.peek_head(), None);
    assert_eq!(queue.push(&five[..1]), Err(PushError::Full));
}

#[test]
fn indices_wrap_around_over_many_chains() {
    let (mut queue, transport, memory) = setup(16);
    let mut in_flight = std::collections::VecDeque::new();
    let mut completed = 0u32;
    for round in 0..70_000u32 {
        let len = 1 + (round % 3) as usize;
        let chain: Vec<Segment> = (0..len)
            .map(|i| segment(u64::from(round) * 8 + i as u64, 100, i == len - 1))
            .collect();
        while queue.free_descriptors() < len as u16 {
            let used = queue.pop_used().expect("device finished something");
            assert_eq!(Some(used.head), in_flight.pop_front());
            assert_eq!(used.len, Some(7));
        }
        let head = queue.push(&chain).unwrap();
        in_flight.push_back(head);
        queue.publish();
        if round % 5 == 0 {
            let mut device = device(&transport);
            while let Some((head, descriptors)) = device.pop_avail(&memory) {
                let round = descriptors[0].address / 8;
                assert_eq!(descriptors.len() as u64, 1 + round % 3);
                assert!(descriptors.last().unwrap().writable);
                device.push_used(&memory, u32::from(head), 7);
                completed += 1;
            }
        }
    }
    assert!(completed > 65_536);
    assert_eq!(u32::from(device(&transport).used_idx), completed % 65_536);
    assert_eq!(queue.stats().unknown_ids, 0);
}

#[test]
fn kick_respects_no_notify_and_only_after_publishing() {
    let (mut queue, mut transport, memory) = setup(8);
    assert!(!queue.kick(&mut transport), "nothing published");
    queue.push(&[segment(0, 1, false)]).unwrap();
    queue.publish();
    assert!(queue.kick_pending());
    assert!(queue.kick(&mut transport));
    assert!(!queue.kick(&mut transport), "one doorbell per publication");
    device(&transport).set_no_notify(&memory, true);
    queue.push(&[segment(0, 1, false)]).unwrap();
    queue.publish();
    assert!(!queue.kick(&mut transport));
    assert_eq!(transport.0.borrow().notifications[0], 1);
    let stats = queue.stats();
    assert_eq!(
        (stats.notifications, stats.suppressed_notifications),
        (1, 1)
    );
}

/// The avail ring's flags as the device reads them.
fn avail_flags(transport: &MockTransport, memory: &Memory) -> u16 {
    let addresses = device(transport).addresses.unwrap();
    memory.read_u16(addresses.driver)
}

#[test]
fn interrupts_start_suppressed_and_toggle() {
    let (mut queue, transport, memory) = setup(8);
    assert_eq!(avail_flags(&transport, &memory), 1, "NO_INTERRUPT at start");
    assert!(!queue.interrupts_enabled());
    assert!(!queue.enable_interrupts(), "nothing used: safe to sleep");
    assert_eq!(avail_flags(&transport, &memory), 0);
    assert!(queue.interrupts_enabled());
    assert!(!queue.enable_interrupts(), "idempotent");
    queue.disable_interrupts();
    assert_eq!(avail_flags(&transport, &memory), 1);
    assert!(!queue.interrupts_enabled());
    queue.disable_interrupts();
    assert_eq!(avail_flags(&transport, &memory), 1, "idempotent");
    // The flag shares the ring with the index: publishing keeps it.
    queue.push(&[segment(0, 1, true)]).unwrap();
    queue.publish();
    assert_eq!(avail_flags(&transport, &memory), 1);
    assert!(!queue.enable_interrupts());
    queue.push(&[segment(0, 1, true)]).unwrap();
    queue.publish();
    assert_eq!(avail_flags(&transport, &memory), 0);
    assert_eq!(device(&transport).avail_pending(&memory), 2);
}

#[test]
fn enabling_interrupts_reports_entries_returned_while_suppressed() {
    let (mut queue, transport, memory) = setup(8);
    let head = queue.push(&[segment(0x10, 64, true)]).unwrap();
    queue.publish();
    // The device returns the buffer while interrupts are suppressed: no
    // interrupt...
    {
        let mut device = device(&transport);
        device.pop_avail(&memory).unwrap();
        device.push_used(&memory, u32::from(head), 64);
    }
    assert!(!transport.interrupt_if_wanted(&memory, 0));
    // ...so enabling them must say "do not sleep".
    assert!(queue.enable_interrupts());
    assert!(queue.enable_interrupts(), "until the entry is consumed");
    assert_eq!(
        queue.pop_used(),
        Some(UsedElement {
            head,
            len: Some(64)
        })
    );
    assert!(!queue.enable_interrupts());
    // A buffer returned now interrupts.
    let head = queue.push(&[segment(0x10, 64, true)]).unwrap();
    queue.publish();
    {
        let mut device = device(&transport);
        device.pop_avail(&memory).unwrap();
        device.push_used(&memory, u32::from(head), 1);
    }
    assert!(transport.interrupt_if_wanted(&memory, 0));
    assert_eq!(transport.0.borrow().interrupts[0], 1);
}

/// Where the device's completion falls relative to the driver's steps
/// before sleeping.
#[derive(Clone, Copy, Debug)]
enum Race {
    /// Before `enable_interrupts` (flag still set).
    BeforeEnable,
    /// After it (flag clear) and before the driver would sleep.
    AfterEnable,
    /// None.
    Never,
}

#[test]
fn no_wake_up_is_lost_whatever_the_order() {
    for race in [Race::BeforeEnable, Race::AfterEnable, Race::Never] {
        let (mut queue, transport, memory) = setup(8);
        let head = queue.push(&[segment(0x10, 64, true)]).unwrap();
        queue.publish();
        let complete = || {
            let mut device = device(&transport);
            device.pop_avail(&memory).unwrap();
            device.push_used(&memory, u32::from(head), 8);
            drop(device);
            transport.interrupt_if_wanted(&memory, 0)
        };
        let mut interrupted = false;
        if let Race::BeforeEnable = race {
            interrupted |= complete();
        }
        let waiting = queue.enable_interrupts();
        if let Race::AfterEnable = race {
            interrupted |= complete();
        }
        let completed = !matches!(race, Race::Never);
        // The driver sleeps unless entries were waiting; a completion then
        // must have raised the interrupt that wakes it.
        if completed {
            assert!(waiting || interrupted, "{race:?}: lost wake-up");
        } else {
            assert!(!waiting && !interrupted, "{race:?}: spurious");
        }
        queue.disable_interrupts();
        assert_eq!(queue.pop_used().is_some(), completed, "{race:?}");
    }
}

#[test]
fn lying_device_is_counted_and_ignored() {
    let (mut queue, transport, memory) = setup(8);
    let a = queue
        .push(&[segment(0x10, 4, false), segment(0x20, 64, true)])
        .unwrap();
    let b = queue.push(&[segment(0x30, 32, true)]).unwrap();
    queue.publish();
    {
        let mut device = device(&transport);
        device.pop_avail(&memory).unwrap();
        device.pop_avail(&memory).unwrap();
        device.push_used(&memory, 7, 0); // in range, never given
        device.push_used(&memory, u32::MAX, 0); // out of range
        device.push_used(&memory, u32::from(a), 65); // one byte too many
        device.push_used(&memory, u32::from(a), 1); // duplicate
        device.push_used(&memory, u32::from(b), 32);
    }
    assert_eq!(queue.pop_used(), Some(UsedElement { head: a, len: None }));
    assert_eq!(
        queue.pop_used(),
        Some(UsedElement {
            head: b,
            len: Some(32)
        })
    );
    assert_eq!(queue.pop_used(), None);
    let stats = queue.stats();
    assert_eq!((stats.unknown_ids, stats.bad_lengths), (3, 1));
    assert_eq!(queue.free_descriptors(), 8, "no descriptor freed twice");

    // Backwards and far-forward used indices consume nothing.
    let used_idx = device(&transport).used_idx;
    device(&transport).publish_used(&memory, used_idx.wrapping_sub(1));
    assert_eq!(queue.pop_used(), None);
    device(&transport).publish_used(&memory, used_idx.wrapping_add(9));
    assert_eq!(queue.pop_used(), None);
    assert_eq!(queue.stats().bad_used_index, 2);
    device(&transport).publish_used(&memory, used_idx);
    // Still usable.
    let c = queue.push(&[segment(0x40, 8, true)]).unwrap();
    queue.publish();
    {
        let mut device = device(&transport);
        let (head, _) = device.pop_avail(&memory).unwrap();
        device.push_used(&memory, u32::from(head), 8);
    }
    assert_eq!(
        queue.pop_used(),
        Some(UsedElement {
            head: c,
            len: Some(8)
        })
    );
}

#[test]
fn a_used_ring_full_of_garbage_is_bounded() {
    let (mut queue, transport, memory) = setup(8);
    let device = device(&transport);
    for index in 0..8 {
        device.write_used_entry(&memory, index, 1000 + u32::from(index), 0);
    }
    device.publish_used(&memory, 8);
    drop(device);
    assert_eq!(queue.pop_used(), None);
    assert_eq!(queue.stats().unknown_ids, 8);
}

/// What a test step does: the driver side or a (possibly lying) device.
#[derive(Clone, Debug)]
enum Step {
    Push(u8),
    Publish,
    Pop,
    /// The device finishes the next available chain honestly.
    Complete(u32),
    /// The device writes a used entry of its own invention.
    Garbage(u32, u32),
    /// The device moves its used index by this much without entries.
    Jump(u16),
    /// The driver enables used-buffer interrupts (before sleeping).
    EnableInterrupts,
    /// The driver suppresses them again.
    DisableInterrupts,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (1u8..5).prop_map(Step::Push),
        2 => Just(Step::Publish),
        4 => Just(Step::Pop),
        4 => (0u32..200).prop_map(Step::Complete),
        1 => (any::<u32>(), any::<u32>()).prop_map(|(id, len)| Step::Garbage(id % 40, len)),
        1 => any::<u16>().prop_map(Step::Jump),
        1 => Just(Step::EnableInterrupts),
        1 => Just(Step::DisableInterrupts),
    ]
}

proptest::proptest! {
    /// Whatever the device does, the queue never panics and never frees a
    /// descriptor twice or loses one (free + in flight == size).
    #[test]
    fn any_device_behaviour_keeps_the_free_list_sound(
        steps in proptest::collection::vec(step(), 1..300)
    ) {
        let (mut queue, transport, memory) = setup(16);
        let mut in_flight: std::collections::HashMap<u16, u16> = Default::default();
        for step in steps {
            match step {
                Step::Push(len) => {
                    let chain = vec![segment(0x1000, 64, true); usize::from(len)];
                    if let Ok(head) = queue.push(&chain) {
                        assert!(in_flight.insert(head, u16::from(len)).is_none());
                    }
                }
                Step::Publish => queue.publish(),
                Step::Pop => {
                    if let Some(used) = queue.pop_used() {
                        assert!(in_flight.remove(&used.head).is_some(), "freed twice");
                    }
                }
                Step::Complete(len) => {
                    let mut device = device(&transport);
                    if let Some((head, _)) = device.pop_avail(&memory) {
                        device.push_used(&memory, u32::from(head), len);
                    }
                }
                Step::Garbage(id, len) => device(&transport).push_used(&memory, id, len),
                Step::Jump(by) => {
                    let mut device = device(&transport);
                    device.used_idx = device.used_idx.wrapping_add(by);
                    let index = device.used_idx;
                    device.publish_used(&memory, index);
                }
                Step::EnableInterrupts => {
                    let waiting = queue.enable_interrupts();
                    assert_eq!(waiting, queue.has_used());
                    assert_eq!(avail_flags(&transport, &memory), 0);
                }
                Step::DisableInterrupts => {
                    queue.disable_interrupts();
                    assert_eq!(avail_flags(&transport, &memory), 1);
                }
            }
            // The flag always says what the queue thinks it says.
            assert_eq!(
                avail_flags(&transport, &memory) == 0,
                queue.interrupts_enabled()
            );
            let busy: u16 = in_flight.values().sum();
            assert_eq!(queue.free_descriptors() + busy, 16);
        }
    }
}
