//! The NVMe driver against a mock controller that processes the real
//! queues in fake guest memory: bring-up, identify, I/O through bounce
//! buffers and zero copy (PRP1, PRP2, PRP lists), FUA and FLUSH, several
//! namespaces on their own queue pairs, and a misbehaving controller
//! (never ready, never completing, a wrong CID, wrong phase bits,
//! duplicates, error statuses, CSTS.CFS, a refused queue).

#[path = "common/buffers.rs"]
mod buffers;
#[path = "common/virtio_mock.rs"]
mod mock;
#[path = "common/nvme_mock.rs"]
mod nvme_mock;

use std::cell::Cell;
use std::rc::Rc;

use buffers::Buffers;
use hal::block::{BlockDevice, BufferAccess, BufferError, Completion, IoError, Op, Request};
use hal::nvme::{
    ControllerConfig, NvmeController, NvmeError, NvmeNamespace, NvmeStatus, QueueConfig, Wait,
};
use hal::Clock;
use mock::Memory;
use nvme_mock::{Fault, MockRegs, Namespace};

const POOL_LEN: usize = 16 << 20;
/// Guest memory for the zero-copy buffers, after the pool.
const DMA_BUFFERS: usize = POOL_LEN;
const DMA_BUFFER_LEN: usize = 256 << 10;
const DMA_BUFFER_COUNT: usize = 4;
const BLOCKS: usize = 4096; // 2 MiB

/// A clock that advances 1 ms every time it is read (waits end fast).
struct StepClock(Cell<u64>);

impl Clock for StepClock {
    fn now(&self) -> u64 {
        let now = self.0.get() + 1_000_000;
        self.0.set(now);
        now
    }
}

fn clock() -> StepClock {
    StepClock(Cell::new(0))
}

/// Buffers in guest memory, reached by bus address (zero copy), starting
/// `skew` bytes into each 256 KiB area (to test unaligned PRP1s).
struct DmaBuffers {
    memory: Rc<Memory>,
    skew: usize,
}

impl DmaBuffers {
    fn offset(&self, buffer: usize, len: u32) -> Result<usize, BufferError> {
        if buffer >= DMA_BUFFER_COUNT {
            return Err(BufferError::Stale);
        }
        if len as usize + self.skew > DMA_BUFFER_LEN {
            return Err(BufferError::TooShort);
        }
        Ok(DMA_BUFFERS + buffer * DMA_BUFFER_LEN + self.skew)
    }
}

impl BufferAccess<usize> for DmaBuffers {
    fn with_slice<R>(
        &self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        let offset = self.offset(buffer, len)?;
        Ok(f(self.memory.bytes(offset, len as usize)))
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        let offset = self.offset(buffer, len)?;
        Ok(f(self.memory.bytes_mut(offset, len as usize)))
    }

    fn dma_address(&self, buffer: usize, len: u32) -> Option<u64> {
        self.offset(buffer, len)
            .ok()
            .map(|offset| mock::PHYS_BASE + offset as u64)
    }
}

struct Bed {
    memory: Rc<Memory>,
    regs: MockRegs,
    pool: hal::dma::DmaPool,
    clock: StepClock,
}

fn bed(configure: impl FnOnce(&mut nvme_mock::Controller)) -> Bed {
    let memory = Memory::new(POOL_LEN + DMA_BUFFER_COUNT * DMA_BUFFER_LEN);
    let regs = MockRegs::new(&memory, BLOCKS);
    configure(&mut regs.state());
    let pool = memory.pool(0, POOL_LEN);
    Bed {
        memory,
        regs,
        pool,
        clock: clock(),
    }
}

fn controller(bed: &mut Bed) -> Result<NvmeController<MockRegs>, NvmeError> {
    NvmeController::new(
        bed.regs.clone(),
        &mut bed.pool,
        &bed.clock,
        ControllerConfig::default(),
    )
}

fn open(bed: &mut Bed, nsid: u32, config: QueueConfig) -> NvmeNamespace<usize, MockRegs> {
    let mut controller = controller(bed).unwrap();
    controller
        .open_namespace(&bed.clock, nsid, &mut bed.pool, config)
        .unwrap()
}

/// Polls until `count` completions arrived (at most 1000 polls, 1 ms of
/// clock each), running the controller's held I/O first.
fn collect<A: BufferAccess<usize>>(
    device: &mut NvmeNamespace<usize, MockRegs>,
    bed: &Bed,
    buffers: &mut A,
    count: usize,
) -> Vec<Completion<usize>> {
    let mut done = Vec::new();
    for _ in 0..1000 {
        let now = bed.clock.now();
        device.poll(now, buffers, 64, &mut |c| done.push(c));
        if done.len() >= count {
            break;
        }
    }
    done
}

fn submit<A: BufferAccess<usize>>(
    device: &mut NvmeNamespace<usize, MockRegs>,
    buffers: &mut A,
    tag: u64,
    op: Op<usize>,
) {
    device.submit(Request { tag, op }, buffers).unwrap();
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn identifies_the_controller_and_namespace() {
    let mut bed = bed(|_| {});
    let mut controller = controller(&mut bed).unwrap();
    let info = controller.info();
    assert_eq!(info.serial.as_bytes(), b"BRICKNVME0");
    assert_eq!(info.serial.to_string(), "BRICKNVME0");
    assert_eq!(info.model.as_bytes(), b"Brick mock NVMe");
    assert_eq!(info.vendor, 0x1b36);
    assert_eq!(info.namespaces, 1);
    assert!(info.volatile_write_cache);
    assert_eq!(info.max_transfer, Some(128 << 10));
    assert_eq!(controller.granted_queues(), 4);
    // Polled: every interrupt is masked.
    assert_eq!(bed.regs.state().intms, u32::MAX);
    let namespace = controller.identify_namespace(&bed.clock, 1).unwrap();
    assert_eq!(namespace.bytes(), (BLOCKS * 512) as u64);
    assert_eq!(namespace.lba_shift, 9);
    let device: NvmeNamespace<usize, MockRegs> = controller
        .open_namespace(&bed.clock, 1, &mut bed.pool, QueueConfig::default())
        .unwrap();
    let info = device.info();
    assert_eq!(info.size, (BLOCKS * 512) as u64);
    assert_eq!(info.logical_block_size, 512);
    assert_eq!(info.max_transfer, 128 << 10);
    assert_eq!(info.queue_depth, 32);
    assert!(info.volatile_write_cache && info.fua);
    assert_eq!(device.queue_id(), 1);
}

#[test]
fn namespace_ids_outside_the_controller_are_refused() {
    let mut bed = bed(|c| c.nn = 2);
    let mut controller = controller(&mut bed).unwrap();
    // Namespace 2 is within NN but inactive (Identify returns zeros).
    for nsid in [0, 2, 3] {
        let error = controller
            .open_namespace::<usize, _>(&bed.clock, nsid, &mut bed.pool, QueueConfig::default())
            .unwrap_err();
        assert_eq!(error, NvmeError::NoSuchNamespace(nsid));
        assert!(error.to_string().contains("does not exist or is inactive"));
    }
}

#[test]
fn bounced_reads_and_writes_round_trip() {
    let mut bed = bed(|_| {});
    let mut device = open(&mut bed, 1, QueueConfig::default());
    let mut buffers = Buffers(vec![pattern(7, 64 << 10), vec![0; 64 << 10]]);
    submit(
        &mut device,
        &mut buffers,
        1,
        Op::Write {
            offset: 4096,
            len: 64 << 10,
            buffer: 0,
            fua: false,
        },
    );
    let done = collect(&mut device, &bed, &mut buffers, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(done[0].tag, 1);
    {
        let state = bed.regs.state();
        assert_eq!(
            &state.namespaces[&1].data[4096..4096 + (64 << 10)],
            &buffers.0[0][..]
        );
    }
    submit(
        &mut device,
        &mut buffers,
        2,
        Op::Read {
            offset: 4096,
            len: 64 << 10,
            buffer: 1,
        },
    );
    let done = collect(&mut device, &bed, &mut buffers, 1);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(buffers.0[1], buffers.0[0]);
    let stats = device.stats();
    assert_eq!(stats.bounced, 2);
    // The bounce buffers are page-aligned: 64 KiB is 16 pages, a list.
    assert_eq!(stats.prp_lists, 2);
    assert_eq!(device.in_flight(), 0);
}

#[test]
fn zero_copy_uses_prp1_prp2_and_lists_for_unaligned_buffers() {
    let mut bed = bed(|_| {});
    let mut device = open(
        &mut bed,
        1,
        QueueConfig {
            bounce: false,
            ..QueueConfig::default()
        },
    );
    for (skew, len, list) in [
        (0usize, 4096u32, false), // one page: PRP1 only
        (512, 4096, false),       // two pages: PRP1 + PRP2
        (0, 8192, false),         // two aligned pages
        (512, 8192, true),        // three pages: a list
        (2048, 128 << 10, true),  // 33 pages
    ] {
        let mut buffers = DmaBuffers {
            memory: bed.memory.clone(),
            skew,
        };
        let data = pattern(skew as u8, len as usize);
        buffers
            .with_slice_mut(0, len, |bytes| bytes.copy_from_slice(&data))
            .unwrap();
        let offset = 64 << 10;
        submit(
            &mut device,
            &mut buffers,
            1,
            Op::Write {
                offset,
                len,
                buffer: 0,
                fua: false,
            },
        );
        assert_eq!(
            collect(&mut device, &bed, &mut buffers, 1)[0].result,
            Ok(())
        );
        let used_list = bed.regs.state().seen.last().unwrap().prp_list;
        assert_eq!(used_list, list, "skew {skew} len {len}");
        submit(
            &mut device,
            &mut buffers,
            2,
            Op::Read {
                offset,
                len,
                buffer: 1,
            },
        );
        assert_eq!(
            collect(&mut device, &bed, &mut buffers, 1)[0].result,
            Ok(())
        );
        let read = buffers.with_slice(1, len, |bytes| bytes.to_vec()).unwrap();
        assert!(read == data, "skew {skew} len {len}: data differs");
    }
    assert_eq!(device.stats().bounced, 0);
    // Without bounce buffers, a buffer with no bus address is refused.
    let mut plain = Buffers::new(1, 4096);
    let refused = device.submit(
        Request {
            tag: 9,
            op: Op::Read {
                offset: 0,
                len: 4096,
                buffer: 0,
            },
        },
        &mut plain,
    );
    assert_eq!(refused, Err(hal::block::SubmitError::Unsupported));
}

#[test]
fn fua_sets_the_bit_and_flush_goes_to_the_device_only_with_a_cache() {
    for vwc in [true, false] {
        let mut bed = bed(|c| c.vwc = vwc);
        let mut device = open(&mut bed, 1, QueueConfig::default());
        let mut buffers = Buffers::new(1, 4096);
        submit(
            &mut device,
            &mut buffers,
            1,
            Op::Write {
                offset: 0,
                len: 4096,
                buffer: 0,
                fua: true,
            },
        );
        submit(&mut device, &mut buffers, 2, Op::Flush);
        let done = collect(&mut device, &bed, &mut buffers, 2);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|c| c.result == Ok(())));
        let seen: Vec<(u8, bool)> = bed
            .regs
            .state()
            .seen
            .iter()
            .filter(|s| s.queue != 0)
            .map(|s| (s.opcode, s.fua))
            .collect();
        if vwc {
            assert_eq!(seen, [(0x01, true), (0x00, false)]);
        } else {
            assert_eq!(seen, [(0x01, true)], "no cache: the flush is not sent");
        }
        assert_eq!(device.info().volatile_write_cache, vwc);
    }
}

#[test]
fn several_namespaces_have_their_own_queues_and_data() {
    let mut bed = bed(|c| {
        c.nn = 3;
        c.namespaces.insert(
            3,
            Namespace {
                lba_shift: 12,
                data: vec![0; 1 << 20],
            },
        );
    });
    let mut controller = controller(&mut bed).unwrap();
    let mut one: NvmeNamespace<usize, MockRegs> = controller
        .open_namespace(&bed.clock, 1, &mut bed.pool, QueueConfig::default())
        .unwrap();
    let mut three: NvmeNamespace<usize, MockRegs> = controller
        .open_namespace(&bed.clock, 3, &mut bed.pool, QueueConfig::default())
        .unwrap();
    drop(controller);
    assert_eq!((one.queue_id(), three.queue_id()), (1, 2));
    assert_eq!(three.info().logical_block_size, 4096);
    assert_eq!(three.info().size, 1 << 20);
    let mut buffers = Buffers(vec![vec![0x11; 4096], vec![0x33; 4096], vec![0; 4096]]);
    let write = |buffer| Op::Write {
        offset: 8192,
        len: 4096,
        buffer,
        fua: false,
    };
    submit(&mut one, &mut buffers, 1, write(0));
    submit(&mut three, &mut buffers, 3, write(1));
    assert_eq!(collect(&mut one, &bed, &mut buffers, 1)[0].tag, 1);
    assert_eq!(collect(&mut three, &bed, &mut buffers, 1)[0].tag, 3);
    let state = bed.regs.state();
    assert!(state.namespaces[&1].data[8192..12288]
        .iter()
        .all(|b| *b == 0x11));
    assert!(state.namespaces[&3].data[8192..12288]
        .iter()
        .all(|b| *b == 0x33));
    let queues: Vec<(u16, u32)> = state
        .seen
        .iter()
        .filter(|s| s.queue != 0)
        .map(|s| (s.queue, s.nsid))
        .collect();
    assert_eq!(queues, [(1, 1), (2, 3)]);
    drop(state);
    // A 4 KiB-block namespace refuses 512-byte alignment.
    let misaligned = three.submit(
        Request {
            tag: 4,
            op: Op::Read {
                offset: 512,
                len: 4096,
                buffer: 2,
            },
        },
        &mut buffers,
    );
    assert_eq!(misaligned, Err(hal::block::SubmitError::Misaligned));
}

#[test]
fn the_queue_fills_and_completions_free_it_in_any_order() {
    let mut bed = bed(|c| c.hold_io = true);
    let mut device = open(
        &mut bed,
        1,
        QueueConfig {
            queue_depth: 4,
            queue_size: 8,
            ..QueueConfig::default()
        },
    );
    let mut buffers = Buffers::new(5, 4096);
    for tag in 0..4 {
        submit(
            &mut device,
            &mut buffers,
            tag,
            Op::Read {
                offset: tag * 4096,
                len: 4096,
                buffer: tag as usize,
            },
        );
    }
    let full = device.submit(
        Request {
            tag: 9,
            op: Op::Flush,
        },
        &mut buffers,
    );
    assert_eq!(full, Err(hal::block::SubmitError::QueueFull));
    assert_eq!(device.in_flight(), 4);
    // Rung at the first poll, executed when the controller runs.
    let mut done = Vec::new();
    device.poll(bed.clock.now(), &mut buffers, 64, &mut |c| done.push(c));
    assert!(done.is_empty());
    assert_eq!(bed.regs.process(), 4);
    let done = collect(&mut device, &bed, &mut buffers, 4);
    assert_eq!(done.len(), 4);
    // Many more rounds than the queue has entries: the phase wraps.
    for round in 0..40u64 {
        submit(&mut device, &mut buffers, 100 + round, Op::Flush);
        device.poll(bed.clock.now(), &mut buffers, 64, &mut |_| {});
        bed.regs.process();
        let done = collect(&mut device, &bed, &mut buffers, 1);
        assert_eq!(done.len(), 1, "round {round}");
        assert_eq!(done[0].tag, 100 + round);
    }
}

/// One 4 KiB read against a controller with `fault`; the completions
/// within `polls` polls (1 ms each) of a 50 ms timeout.
fn faulty_read(
    fault: Fault,
    polls: usize,
) -> (Vec<Completion<usize>>, NvmeNamespace<usize, MockRegs>) {
    let mut bed = bed(|_| {});
    let mut device = open(
        &mut bed,
        1,
        QueueConfig {
            timeout_ns: 50_000_000,
            ..QueueConfig::default()
        },
    );
    bed.regs.state().fault = fault;
    let mut buffers = Buffers::new(2, 4096);
    submit(
        &mut device,
        &mut buffers,
        7,
        Op::Read {
            offset: 0,
            len: 4096,
            buffer: 0,
        },
    );
    let mut done = Vec::new();
    for _ in 0..polls {
        device.poll(bed.clock.now(), &mut buffers, 64, &mut |c| done.push(c));
    }
    (done, device)
}

#[test]
fn a_controller_that_never_completes_times_out_the_request() {
    let (done, device) = faulty_read(Fault::NeverComplete, 10);
    assert!(done.is_empty(), "not before the timeout");
    let (done, device2) = faulty_read(Fault::NeverComplete, 200);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 7);
    assert_eq!(
        done[0].result,
        Err(IoError::Io(i32::from(errno::ETIMEDOUT)))
    );
    assert_eq!(device2.stats().timeouts, 1);
    // The caller has its completion; the CID stays reserved.
    assert_eq!(device2.in_flight(), 0);
    drop(device);
}

#[test]
fn a_wrong_cid_is_dropped_and_the_request_times_out() {
    let (done, device) = faulty_read(Fault::WrongCid(0x3ff), 200);
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].result,
        Err(IoError::Io(i32::from(errno::ETIMEDOUT)))
    );
    assert_eq!(device.stats().stale_completions, 1);
}

#[test]
fn a_stale_phase_is_not_a_completion() {
    let (done, device) = faulty_read(Fault::WrongPhase, 200);
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].result,
        Err(IoError::Io(i32::from(errno::ETIMEDOUT)))
    );
    assert_eq!(device.stats().stale_completions, 0);
}

#[test]
fn a_duplicate_completion_is_dropped() {
    let (done, device) = faulty_read(Fault::Duplicate, 5);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(device.stats().stale_completions, 1);
}

#[test]
fn error_statuses_become_errnos() {
    for (status, errno) in [
        (0x0002u16, errno::EOPNOTSUPP), // invalid field
        (0x0081, errno::ENOSPC),        // capacity exceeded
        (0x0281, errno::EIO),           // unrecovered read error
        (0x0006, errno::EIO),           // internal error
    ] {
        let (done, device) = faulty_read(Fault::Status(status), 5);
        assert_eq!(done.len(), 1, "{status:#x}");
        assert_eq!(
            done[0].result,
            Err(IoError::Io(i32::from(errno))),
            "{status:#x}"
        );
        assert_eq!(device.stats().errors, 1);
    }
    let status = NvmeStatus::from_dw3(0x0281 << 17);
    assert_eq!((status.code_type, status.code), (2, 0x81));
    assert_eq!(
        status.to_string(),
        "unrecovered read error (SCT 0x2, SC 0x81)"
    );
}

#[test]
fn a_fatal_controller_fails_what_is_in_flight_and_what_follows() {
    let (done, mut device) = faulty_read(Fault::FatalOnIo, 3);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Err(IoError::device()));
    assert!(device.stats().fatal);
    let mut buffers = Buffers::new(1, 4096);
    submit(&mut device, &mut buffers, 8, Op::Flush);
    let mut later = Vec::new();
    device.poll(0, &mut buffers, 64, &mut |c| later.push(c));
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].result, Err(IoError::device()));
}

#[test]
fn a_controller_that_never_gets_ready_times_out() {
    let mut bed = bed(|c| c.fault = Fault::NeverReady);
    let error = controller(&mut bed).unwrap_err();
    assert!(matches!(
        error,
        NvmeError::Timeout {
            waiting_for: Wait::Enable,
            ..
        }
    ));
    assert!(error.to_string().contains("CSTS.RDY to be set"), "{error}");
}

#[test]
fn a_refused_queue_is_a_typed_error() {
    let mut bed = bed(|c| c.fault = Fault::RefuseQueue);
    let mut controller = controller(&mut bed).unwrap();
    let error = controller
        .open_namespace::<usize, _>(&bed.clock, 1, &mut bed.pool, QueueConfig::default())
        .unwrap_err();
    let NvmeError::CommandFailed { opcode, status } = error else {
        panic!("{error:?}");
    };
    assert_eq!(opcode, 0x01);
    assert_eq!((status.code_type, status.code), (1, 0x02));
    assert!(error.to_string().contains("invalid queue size"), "{error}");
}

#[test]
fn the_granted_queues_bound_the_namespaces() {
    let mut bed = bed(|c| {
        c.queues_granted = 1;
        c.nn = 2;
        c.namespaces.insert(
            2,
            Namespace {
                lba_shift: 9,
                data: vec![0; 1 << 20],
            },
        );
    });
    let mut controller = controller(&mut bed).unwrap();
    let _first: NvmeNamespace<usize, MockRegs> = controller
        .open_namespace(&bed.clock, 1, &mut bed.pool, QueueConfig::default())
        .unwrap();
    let error = controller
        .open_namespace::<usize, _>(&bed.clock, 2, &mut bed.pool, QueueConfig::default())
        .unwrap_err();
    assert_eq!(error, NvmeError::NoQueueLeft(1));
}

/// Write Zeroes (ONCS bit 3): advertised as `write_zeroes`, sent as
/// opcode 0x08 with the range and no data, zeroing only its range; longer
/// than NLB holds is refused; a controller without the command does not
/// advertise it and refuses the op before it reaches the queue.
#[test]
fn write_zeroes_zeroes_its_range_and_only_where_the_controller_has_it() {
    let mut small = bed(|_| {});
    let mut device = open(&mut small, 1, QueueConfig::default());
    assert!(device.info().write_zeroes);
    let mut buffers = Buffers(vec![vec![0x5a; 16384]]);
    submit(
        &mut device,
        &mut buffers,
        1,
        Op::Write {
            offset: 0,
            len: 16384,
            buffer: 0,
            fua: false,
        },
    );
    submit(
        &mut device,
        &mut buffers,
        2,
        Op::WriteZeroes {
            offset: 4096,
            len: 8192,
        },
    );
    let done = collect(&mut device, &small, &mut buffers, 2);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.result == Ok(())), "{done:?}");
    let state = small.regs.state();
    let data = &state.namespaces[&1].data;
    assert!(data[..4096].iter().all(|b| *b == 0x5a));
    assert!(data[4096..12288].iter().all(|b| *b == 0));
    assert!(data[12288..16384].iter().all(|b| *b == 0x5a));
    let last = state.seen.last().unwrap();
    assert_eq!((last.opcode, last.prp_list), (0x08, false));
    drop(state);
    // NLB holds 65,536 blocks: one more is refused (a 33 MiB namespace of
    // 512-byte blocks, so the range itself is in bounds).
    let mut large = bed(|c| {
        c.nn = 2;
        c.namespaces.insert(
            2,
            Namespace {
                lba_shift: 9,
                data: vec![0; 33 << 20],
            },
        );
    });
    let mut big = open(&mut large, 2, QueueConfig::default());
    let zeroes = |len| Request {
        tag: 3,
        op: Op::WriteZeroes { offset: 0, len },
    };
    assert_eq!(
        big.submit(zeroes((65536 + 1) * 512), &mut buffers),
        Err(hal::block::SubmitError::TooLong)
    );
    big.submit(zeroes(65536 * 512), &mut buffers).unwrap();
    let done = collect(&mut big, &large, &mut buffers, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(()));

    let mut without = bed_without_write_zeroes();
    let mut device = open(&mut without, 1, QueueConfig::default());
    assert!(!device.info().write_zeroes);
    let refused = device.submit(
        Request {
            tag: 4,
            op: Op::WriteZeroes {
                offset: 0,
                len: 4096,
            },
        },
        &mut buffers,
    );
    assert_eq!(refused, Err(hal::block::SubmitError::Unsupported));
}

fn bed_without_write_zeroes() -> Bed {
    bed(|c| c.write_zeroes = false)
}
