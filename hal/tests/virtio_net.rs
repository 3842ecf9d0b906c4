//! virtio-net against a mock device that loops transmitted frames back to
//! the receive queue, processing the real rings from the device side.

#[path = "common/virtio_mock.rs"]
mod mock;

use std::collections::VecDeque;

use hal::nic::{Nic, NicError};
use hal::virtio::net::{NetConfig, VirtioNet, F_MAC, F_MRG_RXBUF, F_MTU, HEADER_LEN, MAX_MTU};
use hal::virtio::{feature, status, InitError};
use mock::{Descriptor, Memory, MockTransport};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// Guest memory layout: the driver's DMA pool, then "registered memory".
const POOL_LEN: usize = 2 << 20;
const REGISTERED: usize = POOL_LEN;
const REGISTERED_LEN: usize = 64 << 10;
/// The longest frame at the default MTU.
const MAX_FRAME_LEN: usize = 1500 + 14;

/// The device side of the loopback.
struct Loopback {
    memory: std::rc::Rc<Memory>,
    transport: MockTransport,
    /// Frames transmitted and not yet delivered.
    wire: VecDeque<Vec<u8>>,
    /// Descriptor chains of every transmitted frame.
    tx_chains: Vec<Vec<Descriptor>>,
}

impl Loopback {
    /// Takes every available TX chain: checks the header, gathers the
    /// frame, returns the chain.
    fn process_tx(&mut self) -> usize {
        let mut state = self.transport.0.borrow_mut();
        let mut count = 0;
        while let Some((head, chain)) = state.queues[1].pop_avail(&self.memory) {
            let mut bytes = Vec::new();
            for descriptor in &chain {
                assert!(!descriptor.writable, "TX descriptor marked writable");
                let mut piece = vec![0; descriptor.len as usize];
                self.memory.read(descriptor.address, &mut piece);
                bytes.extend_from_slice(&piece);
            }
            assert!(bytes.len() >= HEADER_LEN, "TX chain without a header");
            assert_eq!(bytes[..HEADER_LEN], [0; HEADER_LEN], "TX header not zeroed");
            self.wire.push_back(bytes[HEADER_LEN..].to_vec());
            self.tx_chains.push(chain);
            state.queues[1].push_used(&self.memory, u32::from(head), 0);
            count += 1;
        }
        drop(state);
        if count > 0 {
            self.transport.interrupt_if_wanted(&self.memory, 1);
        }
        count
    }

    /// Delivers queued frames into available RX buffers.
    fn process_rx(&mut self) -> usize {
        let mut state = self.transport.0.borrow_mut();
        let mut count = 0;
        while !self.wire.is_empty() {
            let Some((head, chain)) = state.queues[0].pop_avail(&self.memory) else {
                break;
            };
            let frame = self.wire.pop_front().unwrap();
            assert_eq!(chain.len(), 1);
            let buffer = chain[0];
            assert!(buffer.writable);
            let mut header = [0u8; HEADER_LEN];
            header[10] = 1; // num_buffers
            assert!(HEADER_LEN + frame.len() <= buffer.len as usize);
            self.memory.write(buffer.address, &header);
            self.memory
                .write(buffer.address + HEADER_LEN as u64, &frame);
            let len = (HEADER_LEN + frame.len()) as u32;
            state.queues[0].push_used(&self.memory, u32::from(head), len);
            count += 1;
        }
        drop(state);
        if count > 0 {
            self.transport.interrupt_if_wanted(&self.memory, 0);
        }
        count
    }

    fn notifications(&self, queue: usize) -> u64 {
        self.transport.0.borrow().notifications[queue]
    }
}

fn config_space() -> Vec<u8> {
    config_space_with_mtu(0)
}

/// The device configuration: the MAC, and `mtu` at offset 10 (read only
/// if `VIRTIO_NET_F_MTU` is offered).
fn config_space_with_mtu(mtu: u16) -> Vec<u8> {
    let mut config = vec![0; 12];
    config[..6].copy_from_slice(&MAC);
    config[10..12].copy_from_slice(&mtu.to_le_bytes());
    config
}

fn setup_with(offered: u64, config: NetConfig) -> (VirtioNet<MockTransport>, Loopback) {
    let memory = Memory::new(POOL_LEN + REGISTERED_LEN);
    let transport = MockTransport::new(offered, &[256, 256], config_space());
    assert!(
        config.dma_bytes() <= POOL_LEN,
        "the test pool holds the rings"
    );
    let mut pool = memory.pool(0, POOL_LEN);
    let net = VirtioNet::new(transport.clone(), &mut pool, config).expect("device comes up");
    let loopback = Loopback {
        memory,
        transport,
        wire: VecDeque::new(),
        tx_chains: Vec::new(),
    };
    (net, loopback)
}

fn setup() -> (VirtioNet<MockTransport>, Loopback) {
    setup_with(
        feature::VERSION_1 | F_MAC | F_MRG_RXBUF,
        NetConfig::default(),
    )
}

fn frame(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8)
        .collect()
}

fn receive_all(net: &mut VirtioNet<MockTransport>) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while let Some(frame) = net.receive(|bytes| bytes.to_vec()).unwrap() {
        frames.push(frame);
    }
    frames
}

#[test]
fn init_negotiates_reads_mac_and_posts_rx_buffers() {
    let (net, loopback) = setup();
    assert_eq!(net.mac(), MAC);
    assert_eq!(net.mtu(), 1500);
    // MRG_RXBUF was offered but is not taken; no offloads.
    assert_eq!(net.features(), feature::VERSION_1 | F_MAC);
    let state = loopback.transport.0.borrow();
    assert_eq!(state.driver_features, feature::VERSION_1 | F_MAC);
    assert_eq!(
        state.status,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK
    );
    assert_eq!(state.queues[0].avail_pending(&loopback.memory), 256);
    assert_eq!(state.queues[1].avail_pending(&loopback.memory), 0);
}

#[test]
fn missing_version_1_is_a_clear_error() {
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(F_MAC, &[256, 256], config_space());
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioNet::new(transport.clone(), &mut pool, NetConfig::default()).unwrap_err();
    assert_eq!(error, InitError::MissingFeatures(feature::VERSION_1));
    assert!(error.to_string().contains("VERSION_1"), "{error}");
    assert_ne!(transport.0.borrow().status & status::FAILED, 0);
}

#[test]
fn missing_mac_without_fallback_fails_and_fallback_works() {
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(feature::VERSION_1, &[256, 256], config_space());
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioNet::new(transport, &mut pool, NetConfig::default()).unwrap_err();
    assert_eq!(error, InitError::MissingFeatures(F_MAC));

    let transport = MockTransport::new(feature::VERSION_1, &[256, 256], config_space());
    let mut pool = memory.pool(0, POOL_LEN);
    let mac = [2, 0, 0, 0, 0, 1];
    let config = NetConfig {
        mac: Some(mac),
        ..NetConfig::default()
    };
    let net = VirtioNet::new(transport, &mut pool, config).unwrap();
    assert_eq!(net.mac(), mac);
}

#[test]
fn rejected_features_and_missing_queue_are_errors() {
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256, 256], config_space());
    transport.0.borrow_mut().reject_features = true;
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioNet::new(transport, &mut pool, NetConfig::default()).unwrap_err();
    assert_eq!(error, InitError::FeaturesRejected);

    let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256], config_space());
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioNet::new(transport.clone(), &mut pool, NetConfig::default()).unwrap_err();
    assert_eq!(error, InitError::QueueUnavailable(1));
    assert_ne!(transport.0.borrow().status & status::FAILED, 0);

    let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256, 256], config_space());
    let mut pool = memory.pool(0, 64 << 10);
    let error = VirtioNet::new(transport, &mut pool, NetConfig::default()).unwrap_err();
    assert!(matches!(error, InitError::Dma(_)), "{error:?}");
}

#[test]
fn loopback_bounced_frame_with_pieces() {
    let (mut net, mut loopback) = setup();
    let header = frame(1, 42);
    let piece_a = frame(2, 100);
    let piece_b = frame(3, 7);
    net.transmit(&header, &[&piece_a, &[], &piece_b]).unwrap();
    net.flush();
    assert_eq!(loopback.process_tx(), 1);
    // Nothing was in a window: header + all pieces in one bounce descriptor.
    assert_eq!(loopback.tx_chains[0].len(), 1);
    assert_eq!(loopback.process_rx(), 1);
    let frames = receive_all(&mut net);
    let expected = [header, piece_a, piece_b].concat();
    assert_eq!(frames, vec![expected]);
    assert_eq!(net.stats().rx_frames, 1);
    assert_eq!(net.stats().tx_bounced_bytes, (HEADER_LEN + 149) as u64);
}

#[test]
fn scatter_gather_zero_copy_from_registered_memory() {
    let (mut net, mut loopback) = setup();
    let window = loopback.memory.window(REGISTERED, REGISTERED_LEN);
    // SAFETY: the window is guest memory that outlives the driver (the
    // loopback keeps the `Rc<Memory>`), at the bus addresses it names.
    assert!(unsafe { net.add_zero_copy_window(window) });
    let memory = loopback.memory.clone();
    let payload = frame(9, 1024);
    let trailer = frame(10, 4);
    {
        let registered = memory.bytes_mut(REGISTERED, REGISTERED_LEN);
        registered[100..1124].copy_from_slice(&payload);
        registered[5000..5004].copy_from_slice(&trailer);
    }
    let registered = memory.bytes(REGISTERED, REGISTERED_LEN);
    let header = frame(11, 54);
    let stack_piece = frame(12, 6);
    net.transmit(
        &header,
        &[
            &registered[100..612],
            &registered[612..1124],
            &stack_piece,
            &registered[5000..5004],
        ],
    )
    .unwrap();
    net.flush();
    assert_eq!(loopback.process_tx(), 1);
    let chain = &loopback.tx_chains[0];
    // virtio header + Ethernet.. header (bounced), two zero-copy pieces,
    // the stack piece (bounced), the zero-copy trailer.
    let lens: Vec<u32> = chain.iter().map(|d| d.len).collect();
    assert_eq!(lens, [12 + 54, 512, 512, 6, 4]);
    let registered_phys = mock::PHYS_BASE + REGISTERED as u64;
    assert_eq!(chain[1].address, registered_phys + 100);
    assert_eq!(chain[2].address, registered_phys + 612);
    assert_eq!(chain[4].address, registered_phys + 5000);
    assert_eq!(net.stats().tx_zero_copy_pieces, 3);
    loopback.process_rx();
    let frames = receive_all(&mut net);
    assert_eq!(
        frames,
        vec![[header, payload, stack_piece, trailer].concat()]
    );
}

#[test]
fn many_thousand_frames_wrap_the_ring_indices() {
    let (mut net, mut loopback) = setup();
    let window = loopback.memory.window(REGISTERED, REGISTERED_LEN);
    // SAFETY: as in the zero-copy test.
    assert!(unsafe { net.add_zero_copy_window(window) });
    let memory = loopback.memory.clone();
    for (i, byte) in memory
        .bytes_mut(REGISTERED, REGISTERED_LEN)
        .iter_mut()
        .enumerate()
    {
        *byte = (i * 7) as u8;
    }
    let registered = memory.bytes(REGISTERED, REGISTERED_LEN);
    let total = 70_000u32; // > 65536: both queues' 16-bit indices wrap
    let mut sent = 0u32;
    let mut received = 0u32;
    while received < total {
        for _ in 0..(total - sent).min(40) {
            let len = 14 + (sent as usize * 13) % (MAX_FRAME_LEN - 14 - 64);
            let header = sent.to_le_bytes();
            let start = (sent as usize * 101) % (REGISTERED_LEN - 2048);
            let split = start + (len - 4) / 2;
            let end = start + len - 4;
            net.transmit(
                &header,
                &[&registered[start..split], &registered[split..end]],
            )
            .unwrap();
            sent += 1;
        }
        net.flush();
        loopback.process_tx();
        loopback.process_rx();
        while let Some((seq, ok)) = net
            .receive(|bytes| {
                let seq = u32::from_le_bytes(bytes[..4].try_into().unwrap());
                let start = (seq as usize * 101) % (REGISTERED_LEN - 2048);
                let len = 14 + (seq as usize * 13) % (MAX_FRAME_LEN - 14 - 64);
                (
                    seq,
                    bytes.len() == len && bytes[4..] == registered[start..start + len - 4],
                )
            })
            .unwrap()
        {
            assert_eq!(seq, received, "frames out of order");
            assert!(ok, "frame {seq} corrupted");
            received += 1;
        }
    }
    let stats = net.stats();
    assert_eq!(stats.rx_frames, u64::from(total));
    assert_eq!(stats.tx_frames, u64::from(total));
    assert_eq!(stats.rx_queue.unknown_ids + stats.tx_queue.unknown_ids, 0);
    assert_eq!(stats.rx_queue.bad_used_index, 0);
    let state = loopback.transport.0.borrow();
    assert!(state.queues[0].used_idx < 10_000, "RX used index wrapped");
    // Every RX buffer is posted again.
    drop(state);
    net.flush();
    let state = loopback.transport.0.borrow();
    assert_eq!(state.queues[0].avail_pending(&loopback.memory), 256);
}

#[test]
fn kicks_are_batched_and_respect_no_notify() {
    let (mut net, mut loopback) = setup();
    let before = loopback.notifications(1);
    for seq in 0..5 {
        net.transmit(&frame(seq, 60), &[]).unwrap();
    }
    assert_eq!(loopback.notifications(1), before, "no doorbell per frame");
    assert!(net.flush());
    assert_eq!(loopback.notifications(1), before + 1);
    assert!(!net.flush(), "nothing new: no doorbell");
    loopback.process_tx();
    {
        let state = loopback.transport.0.borrow();
        state.queues[1].set_no_notify(&loopback.memory, true);
    }
    net.transmit(&frame(6, 60), &[]).unwrap();
    net.flush();
    assert_eq!(loopback.notifications(1), before + 1, "NO_NOTIFY honoured");
    assert!(net.stats().tx_queue.suppressed_notifications >= 1);
    // A receive call flushes a pending kick.
    {
        let state = loopback.transport.0.borrow();
        state.queues[1].set_no_notify(&loopback.memory, false);
    }
    net.transmit(&frame(7, 60), &[]).unwrap();
    assert_eq!(net.receive(|_| ()).unwrap(), None);
    assert_eq!(loopback.notifications(1), before + 2);
}

#[test]
fn full_tx_queue_is_busy_until_reclaimed() {
    let config = NetConfig {
        tx_queue_size: 16,
        ..NetConfig::default()
    };
    let (mut net, mut loopback) = setup_with(feature::VERSION_1 | F_MAC, config);
    let mut queued = 0;
    loop {
        match net.transmit(&frame(queued, 64), &[]) {
            Ok(()) => queued += 1,
            Err(NicError::Busy) => break,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(queued, 16);
    assert_eq!(net.tx_in_flight(), 16);
    net.flush();
    loopback.process_tx();
    net.transmit(&frame(99, 64), &[]).unwrap();
    assert_eq!(net.tx_in_flight(), 1);
    assert_eq!(net.stats().tx_busy, 1);
}

#[test]
fn rx_interrupt_wakes_only_while_enabled_and_is_acknowledged() {
    let (mut net, mut device) = setup();
    // Polling: frames raise no interrupt.
    net.transmit(&frame(1, 60), &[]).unwrap();
    net.flush();
    device.process_tx();
    device.process_rx();
    assert!(!device.transport.line_asserted());
    // A frame waiting when the owner wants to sleep: do not sleep.
    assert!(net.enable_rx_interrupt());
    assert_eq!(receive_all(&mut net), vec![frame(1, 60)]);
    assert!(!net.enable_rx_interrupt(), "ring empty: safe to sleep");
    // Sleeping: a frame asserts the line...
    net.transmit(&frame(2, 60), &[]).unwrap();
    net.flush();
    device.process_tx();
    assert!(
        !device.transport.line_asserted(),
        "TX completions never interrupt"
    );
    device.process_rx();
    assert!(device.transport.line_asserted());
    // ...and waking suppresses interrupts and de-asserts it.
    assert!(net.disable_rx_interrupt());
    assert!(!device.transport.line_asserted());
    assert_eq!(net.stats().rx_interrupts, 1);
    net.transmit(&frame(3, 60), &[]).unwrap();
    net.flush();
    device.process_tx();
    device.process_rx();
    assert!(!device.transport.line_asserted(), "suppressed again");
    assert_eq!(receive_all(&mut net), vec![frame(2, 60), frame(3, 60)]);
    // A line left asserted (an interrupt raced the disable) is cleared
    // before the next sleep, so it cannot wake that sleep at once.
    device.transport.0.borrow_mut().isr = 1;
    assert!(!net.enable_rx_interrupt());
    assert!(!device.transport.line_asserted());
    assert!(!net.disable_rx_interrupt());
    assert_eq!(device.transport.0.borrow().interrupts, vec![1, 0]);
}

#[test]
fn enabling_the_rx_interrupt_publishes_reposted_buffers() {
    let (mut net, mut device) = setup();
    let posted = device.transport.0.borrow().queues[0].avail_pending(&device.memory);
    // Fewer frames than a publish batch: their buffers are re-posted but
    // not yet published.
    for seq in 0..3 {
        net.transmit(&frame(seq, 60), &[]).unwrap();
    }
    net.flush();
    device.process_tx();
    device.process_rx();
    for _ in 0..3 {
        // Not `receive_all`: the empty poll at its end would publish.
        assert!(net.receive(|_| ()).unwrap().is_some());
    }
    let before = device.transport.0.borrow().queues[0].avail_pending(&device.memory);
    assert_eq!(before, posted - 3, "re-posted, not yet published");
    assert!(!net.enable_rx_interrupt());
    let pending = device.transport.0.borrow().queues[0].avail_pending(&device.memory);
    assert_eq!(
        pending, posted,
        "every buffer is the device's before sleeping"
    );
    net.disable_rx_interrupt();
}

#[test]
fn frame_too_long_is_refused() {
    let (mut net, _loopback) = setup();
    let big = vec![0; MAX_FRAME_LEN - 13];
    assert_eq!(net.transmit(&[0; 14], &[&big]), Err(NicError::FrameTooLong));
    net.transmit(&[0; 14], &[&big[..MAX_FRAME_LEN - 14]])
        .unwrap();
}

#[test]
fn receive_into_copies() {
    let (mut net, mut loopback) = setup();
    net.transmit(&frame(5, 80), &[]).unwrap();
    net.flush();
    loopback.process_tx();
    loopback.process_rx();
    let mut buffer = [0; 2048];
    assert_eq!(net.receive_into(&mut buffer).unwrap(), Some(80));
    assert_eq!(buffer[..80], frame(5, 80)[..]);
}

/// A misbehaving device: used entries for ids never made available,
/// duplicates, lengths beyond the buffer or below the header, and a used
/// index that goes backwards. The driver counts and carries on.
#[test]
fn misbehaving_device_is_counted_and_ignored() {
    let (mut net, mut loopback) = setup();
    let memory = loopback.memory.clone();
    {
        let mut state = loopback.transport.0.borrow_mut();
        let rx = &mut state.queues[0];
        // Take two real buffers from the device side.
        let (first, _) = rx.pop_avail(&memory).unwrap();
        let (second, _) = rx.pop_avail(&memory).unwrap();
        rx.push_used(&memory, 9999, 60); // id out of range
        rx.push_used(&memory, u32::from(first), 100_000); // longer than the buffer
        rx.push_used(&memory, u32::from(first), 60); // duplicate of a finished id
        rx.push_used(&memory, u32::from(second), 3); // shorter than the header
    }
    // The duplicate names a head that was re-posted meanwhile: it cannot be
    // told from a real completion, so it comes out as one stale frame.
    let delivered = receive_all(&mut net);
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].len(), 60 - HEADER_LEN);
    let stats = net.stats();
    assert_eq!(stats.rx_queue.unknown_ids, 1, "{stats:?}");
    assert_eq!(stats.rx_queue.bad_lengths, 1);
    assert_eq!(stats.rx_bad_length, 2);
    // Re-posting kept every buffer alive.
    net.flush();
    {
        let state = loopback.transport.0.borrow();
        // `first` and `second` came back (plus the duplicate's re-post).
        assert!(state.queues[0].avail_pending(&memory) >= 254);
    }

    // The used index goes backwards: nothing consumed, counted, no panic.
    {
        let state = loopback.transport.0.borrow();
        let rx = &state.queues[0];
        rx.publish_used(&memory, rx.used_idx.wrapping_sub(3));
    }
    assert_eq!(net.receive(|bytes| bytes.len()).unwrap(), None);
    assert!(net.stats().rx_queue.bad_used_index >= 1);
    // The device recovers (index forward again): traffic flows.
    {
        let state = loopback.transport.0.borrow();
        let rx = &state.queues[0];
        rx.publish_used(&memory, rx.used_idx);
    }
    net.transmit(&frame(1, 64), &[]).unwrap();
    net.flush();
    loopback.process_tx();
    loopback.process_rx();
    let frames = receive_all(&mut net);
    assert_eq!(frames.last(), Some(&frame(1, 64)));

    // TX: a used entry for a head never given and a duplicate completion.
    net.transmit(&frame(2, 64), &[]).unwrap();
    net.flush();
    loopback.process_tx();
    {
        let mut state = loopback.transport.0.borrow_mut();
        let tx = &mut state.queues[1];
        tx.push_used(&memory, 200, 0);
        tx.push_used(&memory, 0, 0);
    }
    assert_eq!(net.tx_in_flight(), 0);
    assert!(net.stats().tx_queue.unknown_ids >= 1);
}

#[test]
fn dma_bytes_is_enough() {
    for config in [
        NetConfig::default(),
        NetConfig {
            rx_queue_size: 64,
            tx_queue_size: 32,
            mac: None,
            mtu: 1500,
        },
        NetConfig {
            rx_queue_size: 64,
            tx_queue_size: 32,
            mac: None,
            mtu: MAX_MTU,
        },
    ] {
        let memory = Memory::new(POOL_LEN);
        let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256, 256], config_space());
        let len = config.dma_bytes().next_multiple_of(4096);
        let mut pool = memory.pool(0, len);
        VirtioNet::new(transport, &mut pool, config).unwrap();
    }
}

/// A jumbo configuration whose rings fit the test pool.
fn jumbo(mtu: u16) -> NetConfig {
    NetConfig {
        rx_queue_size: 64,
        tx_queue_size: 64,
        mac: None,
        mtu,
    }
}

#[test]
fn jumbo_frames_round_trip_in_one_buffer_each() {
    let (mut net, mut loopback) = setup_with(feature::VERSION_1 | F_MAC, jumbo(9000));
    assert_eq!(net.mtu(), 9000);
    let stride = jumbo(9000).buffer_stride();
    assert_eq!(
        stride, 9088,
        "header, 9014-byte frame, VLAN tag, rounded to 64"
    );
    {
        // Every RX buffer the device sees holds a whole jumbo frame.
        let mut state = loopback.transport.0.borrow_mut();
        let (_, chain) = state.queues[0].pop_avail(&loopback.memory).unwrap();
        assert_eq!(chain[0].len as usize, stride);
        let queue = &mut state.queues[0];
        queue.last_avail = queue.last_avail.wrapping_sub(1);
    }
    // A RoCE frame at path MTU 4096 (4,096 + 96 bytes of headers) and the
    // largest frame of the MTU, as a header and a payload piece.
    let roce = frame(1, 14 + 4192);
    let largest = frame(2, 14 + 9000);
    net.transmit(&roce[..14], &[&roce[14..]]).unwrap();
    net.transmit(&largest[..14], &[&largest[14..]]).unwrap();
    net.flush();
    assert_eq!(loopback.process_tx(), 2);
    assert_eq!(loopback.process_rx(), 2);
    assert_eq!(receive_all(&mut net), vec![roce, largest]);
    let over = vec![0; 9000 + 1];
    assert_eq!(
        net.transmit(&[0; 14], &[&over]),
        Err(NicError::FrameTooLong)
    );
    assert_eq!(net.stats().rx_bad_length, 0);
}

#[test]
fn mtu_out_of_range_is_refused() {
    for mtu in [0, 575, MAX_MTU + 1, u16::MAX] {
        let memory = Memory::new(POOL_LEN);
        let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256, 256], config_space());
        let mut pool = memory.pool(0, POOL_LEN);
        let error = VirtioNet::new(transport, &mut pool, jumbo(mtu)).unwrap_err();
        assert_eq!(error, InitError::BadConfig, "MTU {mtu}");
    }
}

#[test]
fn device_mtu_bounds_the_configured_mtu() {
    let offered = feature::VERSION_1 | F_MAC | F_MTU;
    // The device carries 4200 at most: 9000 is refused with both numbers.
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(offered, &[256, 256], config_space_with_mtu(4200));
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioNet::new(transport.clone(), &mut pool, jumbo(9000)).unwrap_err();
    assert_eq!(
        error,
        InitError::MtuAboveDevice {
            wanted: 9000,
            device: 4200
        }
    );
    assert!(error.to_string().contains("MTU 9000 wanted"), "{error}");
    assert_ne!(transport.0.borrow().status & status::FAILED, 0);
    // Up to the device's MTU is fine, and F_MTU is then negotiated.
    let transport = MockTransport::new(offered, &[256, 256], config_space_with_mtu(4200));
    let net = VirtioNet::new(transport, &mut pool, jumbo(4200)).unwrap();
    assert_ne!(net.features() & F_MTU, 0);
    assert_eq!(net.mtu(), 4200);
}

/// Queues zero-copy RoCE-shaped frames (header, registered payload,
/// trailer) on a 16-descriptor TX ring until it is busy; returns how many
/// fit and the loopback.
fn fill_ring_with_gathered_frames(offered: u64) -> (usize, VirtioNet<MockTransport>, Loopback) {
    let config = NetConfig {
        tx_queue_size: 16,
        ..NetConfig::default()
    };
    let (mut net, loopback) = setup_with(offered, config);
    let window = loopback.memory.window(REGISTERED, REGISTERED_LEN);
    // SAFETY: the window is guest memory that outlives the driver (the
    // loopback keeps the `Rc<Memory>`), at the bus addresses it names.
    assert!(unsafe { net.add_zero_copy_window(window) });
    let memory = loopback.memory.clone();
    let registered = memory.bytes(REGISTERED, REGISTERED_LEN);
    let mut queued = 0;
    loop {
        let payload = &registered[1024 * (queued % 32)..][..1024];
        match net.transmit(&frame(queued as u32, 62), &[payload, &[1, 2, 3, 4]]) {
            Ok(()) => queued += 1,
            Err(NicError::Busy) => break,
            Err(other) => panic!("{other}"),
        }
    }
    (queued, net, loopback)
}

#[test]
fn indirect_descriptors_keep_a_gathered_frame_to_one_ring_slot() {
    let with = feature::VERSION_1 | F_MAC | feature::RING_INDIRECT_DESC;
    let (queued, mut net, mut loopback) = fill_ring_with_gathered_frames(with);
    assert_ne!(net.features() & feature::RING_INDIRECT_DESC, 0);
    assert_eq!(queued, 16, "one ring descriptor per frame");
    net.flush();
    assert_eq!(loopback.process_tx(), 16);
    assert_eq!(loopback.transport.0.borrow().queues[1].indirect_chains, 16);
    // Each chain is the bounced header run, the payload in place and the
    // bounced trailer, as without indirect tables.
    let registered_phys = mock::PHYS_BASE + REGISTERED as u64;
    for (index, chain) in loopback.tx_chains.iter().enumerate() {
        let lens: Vec<u32> = chain.iter().map(|d| d.len).collect();
        assert_eq!(lens, [12 + 62, 1024, 4]);
        assert_eq!(chain[1].address, registered_phys + 1024 * index as u64);
    }
    loopback.process_rx();
    let frames = receive_all(&mut net);
    assert_eq!(frames.len(), 16);
    let registered = loopback.memory.bytes(REGISTERED, REGISTERED_LEN);
    assert_eq!(
        frames[3],
        [&frame(3, 62)[..], &registered[3072..4096], &[1, 2, 3, 4]].concat()
    );
    // The slots are the heads': after the device returned them, the ring
    // takes a full ring of frames again.
    assert_eq!(net.tx_in_flight(), 0);
    for seq in 0..16 {
        net.transmit(&frame(seq, 62), &[&registered[..1024], &[9; 4]])
            .unwrap();
    }

    // Without the feature a frame takes three descriptors.
    let (queued, _net, _loopback) = fill_ring_with_gathered_frames(feature::VERSION_1 | F_MAC);
    assert_eq!(queued, 5);
}
