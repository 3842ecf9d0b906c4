//! virtio-blk against a mock device with a RAM backing that processes the
//! real request queue from the device side.

#[path = "common/buffers.rs"]
mod buffers;
#[path = "common/virtio_mock.rs"]
mod mock;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use buffers::Buffers;
use hal::block::{
    BlockDevice, BufferAccess, BufferError, Completion, IoError, Op, OpKind, Request, SubmitError,
};
use hal::virtio::blk::{
    BlkConfig, DeviceId, GetIdError, VirtioBlk, F_BLK_SIZE, F_DISCARD, F_FLUSH, F_RO,
    F_WRITE_ZEROES, ID_BYTES,
};
use hal::virtio::{feature, InitError};
use hal::Clock;
use mock::{Memory, MockTransport};

const POOL_LEN: usize = 8 << 20;
/// Guest memory for the zero-copy buffers, after the pool.
const DMA_BUFFERS: usize = POOL_LEN;
const DMA_BUFFER_LEN: usize = 64 << 10;
const DMA_BUFFER_COUNT: usize = 8;
const DISK_SECTORS: u64 = 2048; // 1 MiB

/// What the device does with the next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Normal,
    /// Write this status (and do nothing).
    Status(u8),
    /// Leave the status byte alone.
    NoStatus,
}

/// The device side: a RAM disk.
struct RamDevice {
    memory: Rc<Memory>,
    transport: MockTransport,
    disk: Vec<u8>,
    /// Request types seen, in order.
    types: Vec<u32>,
    next: Behaviour,
    /// What GET_ID answers (QEMU's `serial=`, at most 20 bytes kept).
    serial: Vec<u8>,
}

impl RamDevice {
    fn process(&mut self) -> usize {
        let transport = self.transport.clone();
        let mut state = transport.0.borrow_mut();
        let mut count = 0;
        while let Some((head, chain)) = state.queues[0].pop_avail(&self.memory) {
            assert!(chain.len() >= 2, "request without header and status");
            let header = chain[0];
            assert_eq!((header.len, header.writable), (16, false));
            let request_type = self.memory.read_u32(header.address);
            let sector = self.memory.read_u64(header.address + 8);
            let status = *chain.last().unwrap();
            assert_eq!((status.len, status.writable), (1, true));
            let data = &chain[1..chain.len() - 1];
            self.types.push(request_type);
            let mut written = 1;
            let behaviour = std::mem::replace(&mut self.next, Behaviour::Normal);
            let result = match behaviour {
                Behaviour::Status(code) => Some(code),
                Behaviour::NoStatus => None,
                Behaviour::Normal => Some(self.execute(request_type, sector, data, &mut written)),
            };
            if let Some(code) = result {
                self.memory.write(status.address, &[code]);
            }
            state.queues[0].push_used(&self.memory, u32::from(head), written);
            count += 1;
        }
        count
    }

    fn execute(
        &mut self,
        request_type: u32,
        sector: u64,
        data: &[mock::Descriptor],
        written: &mut u32,
    ) -> u8 {
        let mut position = sector as usize * 512;
        match request_type {
            0 => {
                for piece in data {
                    assert!(piece.writable);
                    let len = piece.len as usize;
                    self.memory
                        .write(piece.address, &self.disk[position..position + len]);
                    position += len;
                    *written += piece.len;
                }
                0
            }
            1 => {
                for piece in data {
                    assert!(!piece.writable);
                    let len = piece.len as usize;
                    let mut bytes = vec![0; len];
                    self.memory.read(piece.address, &mut bytes);
                    self.disk[position..position + len].copy_from_slice(&bytes);
                    position += len;
                }
                0
            }
            4 => {
                assert!(data.is_empty());
                0
            }
            8 => {
                // QEMU: strncpy of the serial into the 20-byte buffer
                // (NUL-padded, not terminated at 20).
                assert_eq!(data.len(), 1);
                assert!(data[0].writable);
                assert_eq!(data[0].len as usize, ID_BYTES);
                let mut id = [0u8; ID_BYTES];
                let len = self.serial.len().min(ID_BYTES);
                id[..len].copy_from_slice(&self.serial[..len]);
                self.memory.write(data[0].address, &id);
                *written += ID_BYTES as u32;
                0
            }
            11 | 13 => {
                assert_eq!(data.len(), 1);
                let start = self.memory.read_u64(data[0].address) as usize * 512;
                let sectors = self.memory.read_u32(data[0].address + 8) as usize;
                self.disk[start..start + sectors * 512].fill(0);
                0
            }
            _ => 2,
        }
    }
}

/// Buffers in guest memory: zero copy through `dma_address`.
struct DmaBuffers(Rc<Memory>);

/// Where DMA buffer `buffer` starts in the mock's memory, if it exists and
/// holds `len` bytes.
fn dma_buffer_offset(buffer: usize, len: u32) -> Result<usize, BufferError> {
    if buffer >= DMA_BUFFER_COUNT {
        return Err(BufferError::Stale);
    }
    if len as usize > DMA_BUFFER_LEN {
        return Err(BufferError::TooShort);
    }
    Ok(DMA_BUFFERS + buffer * DMA_BUFFER_LEN)
}

impl BufferAccess<usize> for DmaBuffers {
    fn with_slice<R>(
        &self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        let offset = dma_buffer_offset(buffer, len)?;
        Ok(f(self.0.bytes(offset, len as usize)))
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: usize,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        let offset = dma_buffer_offset(buffer, len)?;
        Ok(f(self.0.bytes_mut(offset, len as usize)))
    }

    fn dma_address(&self, buffer: usize, len: u32) -> Option<u64> {
        dma_buffer_offset(buffer, len)
            .ok()
            .map(|offset| mock::PHYS_BASE + offset as u64)
    }
}

fn config_space(sectors: u64, block_size: u32) -> Vec<u8> {
    let mut config = vec![0; 60];
    config[..8].copy_from_slice(&sectors.to_le_bytes());
    config[20..24].copy_from_slice(&block_size.to_le_bytes());
    config[36..40].copy_from_slice(&1024u32.to_le_bytes()); // max_discard_sectors
    config[44..48].copy_from_slice(&8u32.to_le_bytes()); // discard_sector_alignment
    config[48..52].copy_from_slice(&1024u32.to_le_bytes()); // max_write_zeroes_sectors
    config
}

fn setup_with(offered: u64, config: BlkConfig) -> (VirtioBlk<usize, MockTransport>, RamDevice) {
    let memory = Memory::new(POOL_LEN + DMA_BUFFER_COUNT * DMA_BUFFER_LEN);
    let transport = MockTransport::new(offered, &[128], config_space(DISK_SECTORS, 4096));
    let mut pool = memory.pool(0, POOL_LEN);
    let device = VirtioBlk::new(transport.clone(), &mut pool, config).expect("device comes up");
    let ram = RamDevice {
        memory,
        transport,
        disk: vec![0; (DISK_SECTORS * 512) as usize],
        types: Vec::new(),
        next: Behaviour::Normal,
        serial: Vec::new(),
    };
    (device, ram)
}

fn setup() -> (VirtioBlk<usize, MockTransport>, RamDevice) {
    setup_with(
        feature::VERSION_1 | F_FLUSH | F_BLK_SIZE | F_DISCARD | F_WRITE_ZEROES,
        BlkConfig::default(),
    )
}

fn poll_all<A: BufferAccess<usize>>(
    device: &mut VirtioBlk<usize, MockTransport>,
    ram: &mut RamDevice,
    buffers: &mut A,
) -> Vec<Completion<usize>> {
    let mut done = Vec::new();
    for _ in 0..8 {
        device.poll(0, buffers, usize::MAX, &mut |c| done.push(c));
        ram.process();
    }
    device.poll(0, buffers, usize::MAX, &mut |c| done.push(c));
    done
}

/// Fills buffer 0 with `pattern(seed, len)` and submits it as write `tag`
/// at `offset`.
fn submit_pattern_write(
    device: &mut VirtioBlk<usize, MockTransport>,
    buffers: &mut Buffers,
    tag: u64,
    offset: u64,
    len: usize,
    seed: u8,
    fua: bool,
) {
    buffers.0[0] = pattern(seed, len);
    let write = Op::Write {
        offset,
        len: len as u32,
        buffer: 0,
        fua,
    };
    device.submit(Request { tag, op: write }, buffers).unwrap();
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed))
        .collect()
}

#[test]
fn info_comes_from_features_and_config() {
    let (device, ram) = setup();
    let info = device.info();
    assert_eq!(info.size, DISK_SECTORS * 512);
    assert_eq!(info.logical_block_size, 4096);
    assert_eq!(info.max_transfer, 128 * 1024);
    assert_eq!(info.queue_depth, 32);
    assert!(info.volatile_write_cache);
    assert!(info.fua);
    assert_eq!(info.discard.unwrap().granularity, 4096);
    assert!(info.write_zeroes);
    assert!(!info.read_only);
    assert_eq!(device.poll_at(), None);
    let state = ram.transport.0.borrow();
    assert_eq!(state.queues[0].size, 128);
}

#[test]
fn missing_version_1_is_a_clear_error() {
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(F_FLUSH, &[128], config_space(DISK_SECTORS, 512));
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioBlk::<usize, _>::new(transport, &mut pool, BlkConfig::default()).unwrap_err();
    assert_eq!(error, InitError::MissingFeatures(feature::VERSION_1));
    assert!(error.to_string().contains("VERSION_1"));
}

#[test]
fn bad_block_size_is_refused() {
    let memory = Memory::new(POOL_LEN);
    let transport = MockTransport::new(
        feature::VERSION_1 | F_BLK_SIZE,
        &[128],
        config_space(DISK_SECTORS, 1000),
    );
    let mut pool = memory.pool(0, POOL_LEN);
    let error = VirtioBlk::<usize, _>::new(transport, &mut pool, BlkConfig::default()).unwrap_err();
    assert_eq!(error, InitError::BadConfig);
}

#[test]
fn bounced_reads_and_writes_are_byte_exact() {
    let (mut device, mut ram) = setup();
    let mut buffers = Buffers::new(4, 64 * 1024);
    buffers.0[0] = pattern(3, 64 * 1024);
    let write = Op::Write {
        offset: 8192,
        len: 16384,
        buffer: 0,
        fua: false,
    };
    device
        .submit(Request { tag: 1, op: write }, &mut buffers)
        .unwrap();
    assert_eq!(device.in_flight(), 1);
    assert_eq!(device.poll_at(), Some(0));
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].kind, done[0].result),
        (1, OpKind::Write, Ok(()))
    );
    assert_eq!(ram.disk[8192..8192 + 16384], buffers.0[0][..16384]);
    assert_eq!(ram.disk[..8192], [0; 8192]);

    let read = Op::Read {
        offset: 12288,
        len: 8192,
        buffer: 1,
    };
    device
        .submit(Request { tag: 2, op: read }, &mut buffers)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].buffer, Some(1));
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(buffers.0[1][..8192], buffers.0[0][4096..12288]);
    assert_eq!(device.stats().bounced, 2);
    assert_eq!(device.in_flight(), 0);
    assert_eq!(device.poll_at(), None);
}

#[test]
fn zero_copy_when_buffers_have_dma_addresses() {
    let (mut device, mut ram) = setup();
    let mut buffers = DmaBuffers(ram.memory.clone());
    buffers
        .0
        .bytes_mut(DMA_BUFFERS, 32768)
        .copy_from_slice(&pattern(7, 32768));
    let write = Op::Write {
        offset: 0,
        len: 32768,
        buffer: 0,
        fua: false,
    };
    device
        .submit(Request { tag: 1, op: write }, &mut buffers)
        .unwrap();
    poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(ram.disk[..32768], pattern(7, 32768)[..]);
    let read = Op::Read {
        offset: 4096,
        len: 8192,
        buffer: 3,
    };
    device
        .submit(Request { tag: 2, op: read }, &mut buffers)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].result, Ok(()));
    let target = buffers.0.bytes(DMA_BUFFERS + 3 * DMA_BUFFER_LEN, 8192);
    assert_eq!(target, &pattern(7, 32768)[4096..12288]);
    assert_eq!(device.stats().zero_copy, 2);
    assert_eq!(device.stats().bounced, 0);
}

#[test]
fn flush_and_fua_reach_the_device() {
    let (mut device, mut ram) = setup();
    let mut buffers = Buffers::new(1, 4096);
    device
        .submit(
            Request {
                tag: 1,
                op: Op::Flush,
            },
            &mut buffers,
        )
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(ram.types, [4]);

    let write = Op::Write {
        offset: 4096,
        len: 4096,
        buffer: 0,
        fua: true,
    };
    device
        .submit(Request { tag: 2, op: write }, &mut buffers)
        .unwrap();
    // After the write alone the completion is not delivered yet.
    let mut early = Vec::new();
    device.poll(0, &mut buffers, 16, &mut |c| early.push(c));
    ram.process();
    device.poll(0, &mut buffers, 16, &mut |c| early.push(c));
    assert!(early.is_empty(), "FUA write delivered before its flush");
    assert_eq!(device.in_flight(), 1);
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].kind, done[0].result),
        (2, OpKind::Write, Ok(()))
    );
    assert_eq!(ram.types, [4, 1, 4]);
    assert_eq!(device.stats().fua_flushes, 1);
}

#[test]
fn write_through_device_flushes_locally() {
    let (mut device, mut ram) = setup_with(feature::VERSION_1, BlkConfig::default());
    assert!(!device.info().volatile_write_cache);
    assert_eq!(device.info().logical_block_size, 512);
    let mut buffers = Buffers::new(1, 4096);
    device
        .submit(
            Request {
                tag: 7,
                op: Op::Flush,
            },
            &mut buffers,
        )
        .unwrap();
    let write = Op::Write {
        offset: 512,
        len: 512,
        buffer: 0,
        fua: true,
    };
    device
        .submit(Request { tag: 8, op: write }, &mut buffers)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags, [7, 8]);
    assert_eq!(ram.types, [1], "no flush sent to a write-through device");
    assert_eq!(
        device.submit(
            Request {
                tag: 9,
                op: Op::Discard {
                    offset: 0,
                    len: 512
                }
            },
            &mut buffers
        ),
        Err(SubmitError::Unsupported)
    );
}

#[test]
fn discard_and_write_zeroes() {
    let (mut device, mut ram) = setup();
    ram.disk.fill(0xaa);
    let mut buffers = Buffers::new(1, 4096);
    let ops = [
        Op::Discard {
            offset: 0,
            len: 8192,
        },
        Op::WriteZeroes {
            offset: 16384,
            len: 4096,
        },
    ];
    for (tag, op) in ops.into_iter().enumerate() {
        device
            .submit(
                Request {
                    tag: tag as u64,
                    op,
                },
                &mut buffers,
            )
            .unwrap();
    }
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(ram.types, [11, 13]);
    assert!(ram.disk[..8192].iter().all(|b| *b == 0));
    assert!(ram.disk[8192..16384].iter().all(|b| *b == 0xaa));
    assert!(ram.disk[16384..20480].iter().all(|b| *b == 0));
    let too_long = Op::Discard {
        offset: 0,
        len: 1024 * 512 + 4096,
    };
    assert_eq!(
        device.submit(
            Request {
                tag: 9,
                op: too_long
            },
            &mut buffers
        ),
        Err(SubmitError::TooLong)
    );
}

#[test]
fn status_errors_map_to_io_errors() {
    let (mut device, mut ram) = setup();
    let mut buffers = Buffers::new(1, 4096);
    let read = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 0,
    };
    let cases = [
        (Behaviour::Status(1), IoError::device()),
        (
            Behaviour::Status(2),
            IoError::Io(i32::from(errno::EOPNOTSUPP)),
        ),
        (Behaviour::Status(77), IoError::device()),
        (Behaviour::NoStatus, IoError::device()),
    ];
    for (tag, (behaviour, expected)) in cases.into_iter().enumerate() {
        ram.next = behaviour;
        device
            .submit(
                Request {
                    tag: tag as u64,
                    op: read,
                },
                &mut buffers,
            )
            .unwrap();
        let done = poll_all(&mut device, &mut ram, &mut buffers);
        assert_eq!(done[0].result, Err(expected), "{behaviour:?}");
    }
    assert_eq!(device.stats().bad_status, 2);
}

#[test]
fn stale_buffer_and_checks_refuse_before_submitting() {
    let (mut device, mut ram) = setup();
    let mut buffers = Buffers::new(1, 4096);
    let stale = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 5,
    };
    assert_eq!(
        device.submit(Request { tag: 1, op: stale }, &mut buffers),
        Err(SubmitError::Buffer(BufferError::Stale))
    );
    let misaligned = Op::Read {
        offset: 512,
        len: 4096,
        buffer: 0,
    };
    assert_eq!(
        device.submit(
            Request {
                tag: 2,
                op: misaligned
            },
            &mut buffers
        ),
        Err(SubmitError::Misaligned)
    );
    let beyond = Op::Read {
        offset: DISK_SECTORS * 512,
        len: 4096,
        buffer: 0,
    };
    assert_eq!(
        device.submit(Request { tag: 3, op: beyond }, &mut buffers),
        Err(SubmitError::OutOfRange)
    );
    assert_eq!(device.in_flight(), 0);
    assert_eq!(ram.process(), 0);
}

#[test]
fn read_only_device_refuses_writes() {
    let (mut device, _ram) = setup_with(feature::VERSION_1 | F_RO, BlkConfig::default());
    let mut buffers = Buffers::new(1, 4096);
    let write = Op::Write {
        offset: 0,
        len: 512,
        buffer: 0,
        fua: false,
    };
    assert_eq!(
        device.submit(Request { tag: 1, op: write }, &mut buffers),
        Err(SubmitError::ReadOnly)
    );
}

#[test]
fn queue_full_then_drains_and_doorbell_is_batched() {
    let config = BlkConfig {
        queue_depth: 8,
        ..BlkConfig::default()
    };
    let (mut device, mut ram) = setup_with(feature::VERSION_1 | F_FLUSH, config);
    let mut buffers = Buffers::new(9, 4096);
    for tag in 0..8u64 {
        let op = Op::Read {
            offset: tag * 4096,
            len: 4096,
            buffer: tag as usize,
        };
        device.submit(Request { tag, op }, &mut buffers).unwrap();
    }
    let op = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 8,
    };
    assert_eq!(
        device.submit(Request { tag: 8, op }, &mut buffers),
        Err(SubmitError::QueueFull)
    );
    assert_eq!(ram.transport.0.borrow().notifications[0], 0);
    let mut done = Vec::new();
    device.poll(0, &mut buffers, 3, &mut |c| done.push(c));
    assert_eq!(
        ram.transport.0.borrow().notifications[0],
        1,
        "one doorbell per batch"
    );
    ram.process();
    assert_eq!(device.poll(0, &mut buffers, 3, &mut |c| done.push(c)), 3);
    assert_eq!(device.in_flight(), 5);
    device.submit(Request { tag: 8, op }, &mut buffers).unwrap();
    let rest = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done.len() + rest.len(), 9);
    assert!(done.iter().chain(&rest).all(|c| c.result.is_ok()));
}

/// A misbehaving device: unknown and duplicated used ids, a length beyond
/// the chain, a used index that goes backwards. Counted, ignored, and the
/// device keeps working.
#[test]
fn misbehaving_device_is_counted_and_ignored() {
    let (mut device, mut ram) = setup();
    let memory = ram.memory.clone();
    let mut buffers = Buffers::new(2, 4096);
    submit_pattern_write(&mut device, &mut buffers, 1, 0, 4096, 5, false);
    device.poll(0, &mut buffers, 16, &mut |_| panic!("nothing finished yet"));
    let head = {
        let mut state = ram.transport.0.borrow_mut();
        let queue = &mut state.queues[0];
        let (head, chain) = queue.pop_avail(&memory).unwrap();
        memory.read(chain[1].address, &mut ram.disk[..4096]);
        memory.write(chain[2].address, &[0]);
        queue.push_used(&memory, 127, 1); // in range, never given
        queue.push_used(&memory, 70_000, 1); // out of range
        queue.push_used(&memory, u32::from(head), 1_000_000); // too long
        queue.push_used(&memory, u32::from(head), 1); // duplicate
        head
    };
    let mut done = Vec::new();
    device.poll(0, &mut buffers, 16, &mut |c| done.push(c));
    assert_eq!(done.len(), 1, "the real completion, once");
    assert_eq!(done[0].result, Ok(()));
    let stats = device.stats();
    assert_eq!(stats.queue.unknown_ids, 3, "{stats:?}");
    assert_eq!(stats.queue.bad_lengths, 1);
    assert_eq!(device.in_flight(), 0);

    // Backwards used index.
    {
        let state = ram.transport.0.borrow();
        let queue = &state.queues[0];
        queue.publish_used(&memory, queue.used_idx.wrapping_sub(2));
    }
    assert_eq!(device.poll(0, &mut buffers, 16, &mut |_| {}), 0);
    assert!(device.stats().queue.bad_used_index >= 1);
    {
        let state = ram.transport.0.borrow();
        let queue = &state.queues[0];
        queue.publish_used(&memory, queue.used_idx);
    }
    // A used index far ahead of anything available.
    {
        let state = ram.transport.0.borrow();
        let queue = &state.queues[0];
        queue.publish_used(&memory, queue.used_idx.wrapping_add(5000));
    }
    assert_eq!(device.poll(0, &mut buffers, 16, &mut |_| {}), 0);
    {
        let state = ram.transport.0.borrow();
        let queue = &state.queues[0];
        queue.publish_used(&memory, queue.used_idx);
    }
    // Still works afterwards.
    let read = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 1,
    };
    device
        .submit(Request { tag: 2, op: read }, &mut buffers)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(buffers.0[1], pattern(5, 4096));
    let _ = head;
}

#[test]
fn many_requests_wrap_the_ring_indices() {
    let config = BlkConfig {
        queue_depth: 16,
        queue_size: 64,
        ..BlkConfig::default()
    };
    let (mut device, mut ram) = setup_with(feature::VERSION_1 | F_FLUSH, config);
    let mut buffers = Buffers::new(16, 512);
    let mut completed = 0u64;
    let mut tag = 0u64;
    while completed < 70_000 {
        while device.in_flight() < 16 {
            let slot = (tag % 16) as usize;
            let offset = (tag % DISK_SECTORS) * 512;
            let op = if tag % 2 == 0 {
                buffers.0[slot] = pattern((tag % 251) as u8, 512);
                Op::Write {
                    offset,
                    len: 512,
                    buffer: slot,
                    fua: false,
                }
            } else {
                Op::Read {
                    offset: offset - 512,
                    len: 512,
                    buffer: slot,
                }
            };
            device.submit(Request { tag, op }, &mut buffers).unwrap();
            tag += 1;
        }
        device.poll(0, &mut buffers, usize::MAX, &mut |c| {
            assert_eq!(c.result, Ok(()));
            completed += 1;
        });
        ram.process();
    }
    let stats = device.stats();
    assert_eq!(stats.queue.unknown_ids + stats.queue.bad_used_index, 0);
    assert!(ram.transport.0.borrow().queues[0].used_idx < 10_000);
}

#[test]
fn dma_bytes_is_enough() {
    for config in [
        BlkConfig::default(),
        BlkConfig {
            bounce: false,
            ..BlkConfig::default()
        },
    ] {
        let memory = Memory::new(POOL_LEN);
        let transport = MockTransport::new(feature::VERSION_1, &[128], config_space(64, 512));
        let len = config.dma_bytes().next_multiple_of(4096);
        let mut pool = memory.pool(0, len);
        VirtioBlk::<usize, _>::new(transport, &mut pool, config).unwrap();
    }
}

#[test]
fn without_bounce_buffers_only_dma_addressable_buffers_work() {
    let config = BlkConfig {
        bounce: false,
        ..BlkConfig::default()
    };
    let (mut device, mut ram) = setup_with(feature::VERSION_1, config);
    let mut plain = Buffers::new(1, 4096);
    let read = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 0,
    };
    assert_eq!(
        device.submit(Request { tag: 1, op: read }, &mut plain),
        Err(SubmitError::Unsupported)
    );
    let mut dma = DmaBuffers(ram.memory.clone());
    device
        .submit(Request { tag: 2, op: read }, &mut dma)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut dma);
    assert_eq!(done[0].result, Ok(()));
}

/// A clock for the synchronous GET_ID wait: each reading advances it by
/// `step` ns and, once `answer_after` readings have passed, lets the device
/// side process its queue (as a device answering a while after the
/// doorbell would).
struct DeviceClock<'a> {
    now: Cell<u64>,
    step: u64,
    readings: Cell<u32>,
    answer_after: Option<u32>,
    ram: RefCell<&'a mut RamDevice>,
}

impl<'a> DeviceClock<'a> {
    fn new(ram: &'a mut RamDevice, answer_after: Option<u32>) -> Self {
        Self {
            now: Cell::new(1_000),
            step: 1_000,
            readings: Cell::new(0),
            answer_after,
            ram: RefCell::new(ram),
        }
    }
}

impl Clock for DeviceClock<'_> {
    fn now(&self) -> u64 {
        let readings = self.readings.get() + 1;
        self.readings.set(readings);
        if self.answer_after.is_some_and(|after| readings > after) {
            self.ram.borrow_mut().process();
        }
        let now = self.now.get();
        self.now.set(now + self.step);
        now
    }
}

const ID_TIMEOUT_NS: u64 = 1_000_000;

fn read_id(
    device: &mut VirtioBlk<usize, MockTransport>,
    ram: &mut RamDevice,
    answer_after: Option<u32>,
) -> (Result<DeviceId, GetIdError>, u32) {
    let clock = DeviceClock::new(ram, answer_after);
    let result = device.read_device_id(&clock, ID_TIMEOUT_NS);
    (result, clock.readings.get())
}

#[test]
fn device_id_of_exactly_20_bytes() {
    let (mut device, mut ram) = setup();
    ram.serial = b"ABCDEFGHIJKLMNOPQRST".to_vec();
    let (id, _) = read_id(&mut device, &mut ram, Some(0));
    let id = id.unwrap();
    assert_eq!(id.as_bytes(), b"ABCDEFGHIJKLMNOPQRST");
    assert_eq!(id.as_str(), Some("ABCDEFGHIJKLMNOPQRST"));
    assert_eq!(ram.types, [8]);
    assert_eq!(
        ram.transport.0.borrow().notifications[0],
        1,
        "the doorbell is rung at once"
    );
}

#[test]
fn short_device_id_loses_its_padding() {
    let (mut device, mut ram) = setup();
    ram.serial = b"brick-data1".to_vec();
    // The device answers a few clock readings after the doorbell.
    let (id, readings) = read_id(&mut device, &mut ram, Some(3));
    let id = id.unwrap();
    assert!(readings > 3);
    assert_eq!(id.as_bytes(), b"brick-data1");
    assert_eq!(id.to_string(), "brick-data1");
    assert_eq!(format!("{id:?}"), "DeviceId(\"brick-data1\")");
    assert!(!id.is_empty());

    // No serial: an empty ID, not an error.
    ram.serial.clear();
    let (id, _) = read_id(&mut device, &mut ram, Some(0));
    assert!(id.unwrap().is_empty());
}

#[test]
fn device_id_bytes_are_escaped_for_the_log() {
    let mut raw = [0u8; ID_BYTES];
    raw[..4].copy_from_slice(b"a\xffb\n");
    raw[5] = b'z'; // after the first NUL: padding, ignored
    let id = DeviceId::from_raw(raw);
    assert_eq!(id.as_bytes(), b"a\xffb\n");
    assert_eq!(id.as_str(), None);
    assert_eq!(id.to_string(), "a\\xffb\\n");
}

#[test]
fn device_id_unsupported_and_other_statuses_are_errors() {
    let (mut device, mut ram) = setup();
    ram.serial = b"never-seen".to_vec();
    let cases = [
        (Behaviour::Status(2), GetIdError::Unsupported),
        (Behaviour::Status(1), GetIdError::IoError),
        (Behaviour::Status(9), GetIdError::BadStatus(9)),
        (Behaviour::NoStatus, GetIdError::BadStatus(0xff)),
    ];
    for (behaviour, expected) in cases {
        ram.next = behaviour;
        let (result, _) = read_id(&mut device, &mut ram, Some(0));
        assert_eq!(result, Err(expected), "{behaviour:?}");
        assert!(!expected.to_string().is_empty());
    }
    assert!(GetIdError::Unsupported.to_string().contains("UNSUPP"));
    // The device still works.
    ram.next = Behaviour::Normal;
    let (result, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(result.unwrap().as_bytes(), b"never-seen");
}

#[test]
fn device_that_never_answers_times_out_and_io_goes_on() {
    let (mut device, mut ram) = setup();
    ram.serial = b"late".to_vec();
    let (result, readings) = read_id(&mut device, &mut ram, None);
    assert_eq!(result, Err(GetIdError::Timeout));
    // Bounded by the deadline: about timeout / step readings.
    assert!(
        (1000..=1002).contains(&readings),
        "{readings} clock readings"
    );
    assert!(GetIdError::Timeout.to_string().contains("in time"));
    // The chain stays with the device: a second GET_ID is refused.
    let (again, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(again, Err(GetIdError::Busy));

    // IO goes on; the late answer is dropped, not taken for a completion.
    let mut buffers = Buffers::new(2, 4096);
    submit_pattern_write(&mut device, &mut buffers, 1, 4096, 4096, 9, false);
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].tag, done[0].result), (1, Ok(())));
    assert_eq!(ram.types, [8, 1], "the late GET_ID reached the device");
    let stats = device.stats();
    assert_eq!(stats.queue.unknown_ids + stats.bad_status, 0, "{stats:?}");
    // Answered now: GET_ID can be sent again.
    let (id, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(id.unwrap().as_bytes(), b"late");
}

#[test]
fn device_id_is_refused_while_io_is_in_flight() {
    let (mut device, mut ram) = setup();
    let mut buffers = Buffers::new(1, 4096);
    let read = Op::Read {
        offset: 0,
        len: 4096,
        buffer: 0,
    };
    device
        .submit(Request { tag: 1, op: read }, &mut buffers)
        .unwrap();
    let (result, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(result, Err(GetIdError::Busy));
    assert!(ram.types.is_empty(), "nothing sent");
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(ram.types, [0]);
}

#[test]
fn io_works_after_the_device_id() {
    let (mut device, mut ram) = setup();
    ram.serial = b"disk-a".to_vec();
    let (id, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(id.unwrap().as_bytes(), b"disk-a");
    assert_eq!(device.in_flight(), 0);
    assert_eq!(device.poll_at(), None);
    let mut buffers = Buffers::new(2, 8192);
    submit_pattern_write(&mut device, &mut buffers, 1, 0, 8192, 11, true);
    let read = Op::Read {
        offset: 4096,
        len: 4096,
        buffer: 1,
    };
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].result, Ok(()));
    device
        .submit(Request { tag: 2, op: read }, &mut buffers)
        .unwrap();
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!((done[0].tag, done[0].result), (2, Ok(())));
    assert_eq!(buffers.0[1][..4096], pattern(11, 8192)[4096..]);
    assert_eq!(ram.types, [8, 1, 4, 0]);
    // Many more requests wrap past the GET_ID's descriptors: nothing leaks.
    for tag in 3..300u64 {
        device
            .submit(Request { tag, op: read }, &mut buffers)
            .unwrap();
        let done = poll_all(&mut device, &mut ram, &mut buffers);
        assert_eq!((done.len(), done[0].result), (1, Ok(())));
    }
    let stats = device.stats();
    assert_eq!(stats.queue.unknown_ids + stats.queue.bad_used_index, 0);
}

/// A probe (the image's): a tiny queue, GET_ID, reset; then the real
/// driver comes up on the same device and serves IO.
#[test]
fn reset_after_a_probe_then_the_device_comes_up_again() {
    let memory = Memory::new(POOL_LEN + DMA_BUFFER_COUNT * DMA_BUFFER_LEN);
    let transport = MockTransport::new(
        feature::VERSION_1 | F_FLUSH,
        &[128],
        config_space(DISK_SECTORS, 512),
    );
    let mut pool = memory.pool(0, POOL_LEN);
    let probe_config = BlkConfig {
        queue_depth: 1,
        queue_size: 4,
        max_transfer: 1 << 20,
        bounce: false,
    };
    let before = pool.remaining();
    let mut probe = VirtioBlk::<usize, _>::new(transport.clone(), &mut pool, probe_config).unwrap();
    assert!(before - pool.remaining() <= probe_config.dma_bytes());
    let mut ram = RamDevice {
        memory,
        transport: transport.clone(),
        disk: vec![0; (DISK_SECTORS * 512) as usize],
        types: Vec::new(),
        next: Behaviour::Normal,
        serial: b"probed".to_vec(),
    };
    // A GET_ID the device never answers is dropped by the reset.
    let (result, _) = read_id(&mut probe, &mut ram, None);
    assert_eq!(result, Err(GetIdError::Timeout));
    let transport = probe.reset().unwrap();
    assert_eq!(ram.transport.0.borrow().status, 0);
    assert!(ram.transport.0.borrow().queues[0].addresses.is_none());

    let mut device = VirtioBlk::<usize, _>::new(transport, &mut pool, BlkConfig::default())
        .expect("comes up again");
    let (id, _) = read_id(&mut device, &mut ram, Some(0));
    assert_eq!(id.unwrap().as_bytes(), b"probed");
    let mut buffers = Buffers::new(1, 4096);
    submit_pattern_write(&mut device, &mut buffers, 1, 0, 4096, 13, false);
    let done = poll_all(&mut device, &mut ram, &mut buffers);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(ram.disk[..4096], pattern(13, 4096)[..]);
    assert_eq!(ram.types, [8, 1], "the dropped GET_ID was never processed");
}
