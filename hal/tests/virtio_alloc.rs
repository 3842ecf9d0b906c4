//! No allocation after construction: virtio-net transmit/flush/receive,
//! virtio-blk and NVMe submit/poll run thousands of times while a counting global
//! allocator is armed around every driver call (the mock device side, which
//! allocates freely, runs disarmed).
//!
//! Its own test binary without the libtest harness (`harness = false`), so
//! no harness thread allocates while the counter is armed.

#[path = "common/buffers.rs"]
mod buffers;
#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/virtio_mock.rs"]
mod mock;
#[path = "common/nvme_mock.rs"]
mod nvme_mock;

use std::sync::atomic::Ordering;

use buffers::Buffers;
use hal::block::{BlockDevice, Op, Request};
use hal::nic::Nic;
use hal::virtio::blk::{BlkConfig, VirtioBlk, F_FLUSH};
use hal::virtio::feature;
use hal::virtio::net::{NetConfig, VirtioNet, F_MAC};
use mock::{Memory, MockTransport};

use counting_alloc::{ARMED, COUNT};

/// Runs `f` with the counter armed.
fn armed<R>(f: impl FnOnce() -> R) -> R {
    ARMED.store(true, Ordering::SeqCst);
    let result = f();
    ARMED.store(false, Ordering::SeqCst);
    result
}

/// Loops frames through the device side.
fn net() {
    let memory = Memory::new(4 << 20);
    let transport = MockTransport::new(feature::VERSION_1 | F_MAC, &[256, 256], vec![2; 12]);
    let mut pool = memory.pool(0, 2 << 20);
    let mut net = VirtioNet::new(transport.clone(), &mut pool, NetConfig::default()).unwrap();
    let window = memory.window(2 << 20, 64 << 10);
    // SAFETY: guest memory that outlives the driver, at the named addresses.
    assert!(unsafe { net.add_zero_copy_window(window) });
    let payload = memory.bytes(2 << 20, 1024);
    let mut received = 0;
    for round in 0..5_000u32 {
        armed(|| {
            net.transmit(&round.to_le_bytes(), &[payload, &[1, 2, 3]])
                .unwrap();
            net.flush();
        });
        let mut state = transport.0.borrow_mut();
        let (head, chain) = state.queues[1].pop_avail(&memory).unwrap();
        let len: u32 = chain.iter().map(|d| d.len).sum();
        state.queues[1].push_used(&memory, u32::from(head), 0);
        let (head, chain) = state.queues[0].pop_avail(&memory).unwrap();
        memory.write(chain[0].address + 12, &round.to_le_bytes());
        state.queues[0].push_used(&memory, u32::from(head), len);
        drop(state);
        armed(|| {
            while let Some(seq) = net
                .receive(|frame| u32::from_le_bytes(frame[..4].try_into().unwrap()))
                .unwrap()
            {
                assert_eq!(seq, round);
                received += 1;
            }
        });
    }
    assert_eq!(received, 5_000);
}

/// Reads and writes through the device side.
fn blk() {
    let memory = Memory::new(8 << 20);
    let mut config = vec![0; 60];
    config[..8].copy_from_slice(&2048u64.to_le_bytes());
    let transport = MockTransport::new(feature::VERSION_1 | F_FLUSH, &[128], config);
    let mut pool = memory.pool(0, 8 << 20);
    let mut device: VirtioBlk<usize, _> =
        VirtioBlk::new(transport.clone(), &mut pool, BlkConfig::default()).unwrap();
    let mut buffers = Buffers::new(16, 4096);
    let mut completed = 0u64;
    for tag in 0..5_000u64 {
        let op = match tag % 3 {
            0 => Op::Read {
                offset: (tag % 256) * 4096,
                len: 4096,
                buffer: (tag % 16) as usize,
            },
            1 => Op::Write {
                offset: (tag % 256) * 4096,
                len: 4096,
                buffer: (tag % 16) as usize,
                fua: tag % 7 == 0,
            },
            _ => Op::Flush,
        };
        armed(|| {
            device.submit(Request { tag, op }, &mut buffers).unwrap();
            device.poll(0, &mut buffers, 64, &mut |c| {
                assert_eq!(c.result, Ok(()));
                completed += 1;
            });
        });
        // Device side: complete everything available (status OK).
        for _ in 0..2 {
            let mut state = transport.0.borrow_mut();
            while let Some((head, chain)) = state.queues[0].pop_avail(&memory) {
                memory.write(chain.last().unwrap().address, &[0]);
                state.queues[0].push_used(&memory, u32::from(head), 1);
            }
            drop(state);
            armed(|| {
                device.poll(0, &mut buffers, 64, &mut |c| {
                    assert_eq!(c.result, Ok(()));
                    completed += 1;
                });
            });
        }
    }
    assert_eq!(completed, 5_000);
}

/// Reads, writes (some FUA) and flushes through the mock NVMe controller,
/// which runs disarmed between the driver's polls.
fn nvme() {
    use hal::nvme::{ControllerConfig, NvmeController, QueueConfig};
    use hal::Clock;
    struct Ticks(std::cell::Cell<u64>);
    impl hal::Clock for Ticks {
        fn now(&self) -> u64 {
            self.0.set(self.0.get() + 1000);
            self.0.get()
        }
    }
    let clock = Ticks(std::cell::Cell::new(0));
    let memory = Memory::new(8 << 20);
    let regs = nvme_mock::MockRegs::new(&memory, 2048);
    let mut pool = memory.pool(0, 8 << 20);
    let mut controller =
        NvmeController::new(regs.clone(), &mut pool, &clock, ControllerConfig::default()).unwrap();
    let mut device = controller
        .open_namespace::<usize, _>(&clock, 1, &mut pool, QueueConfig::default())
        .unwrap();
    regs.state().hold_io = true;
    let mut buffers = Buffers::new(16, 16384);
    let mut completed = 0u64;
    for tag in 0..5_000u64 {
        let op = match tag % 3 {
            0 => Op::Read {
                offset: (tag % 64) * 16384,
                len: 16384,
                buffer: (tag % 16) as usize,
            },
            1 => Op::Write {
                offset: (tag % 64) * 16384,
                len: 16384,
                buffer: (tag % 16) as usize,
                fua: tag % 7 == 0,
            },
            _ => Op::Flush,
        };
        armed(|| {
            device.submit(Request { tag, op }, &mut buffers).unwrap();
            device.poll(clock.now(), &mut buffers, 64, &mut |c| {
                assert_eq!(c.result, Ok(()));
                completed += 1;
            });
        });
        regs.process();
        armed(|| {
            device.poll(clock.now(), &mut buffers, 64, &mut |c| {
                assert_eq!(c.result, Ok(()));
                completed += 1;
            });
        });
    }
    assert_eq!(completed, 5_000);
    // Every read and write (two of three requests) spans four pages.
    assert_eq!(device.stats().prp_lists, 3334);
}

fn main() {
    // The counter works: an allocation while armed is seen.
    ARMED.store(true, Ordering::SeqCst);
    drop(std::hint::black_box(Box::new(1u64)));
    ARMED.store(false, Ordering::SeqCst);
    assert_eq!(
        COUNT.swap(0, Ordering::SeqCst),
        1,
        "the counting allocator missed an allocation"
    );
    net();
    blk();
    nvme();
    let count = COUNT.load(Ordering::SeqCst);
    assert_eq!(
        count, 0,
        "{count} allocations in driver calls after construction"
    );
    println!(
        "virtio_alloc: no allocation in 15,000 driver rounds (virtio-net, virtio-blk, NVMe): ok"
    );
}
