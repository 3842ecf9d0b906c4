//! A mock NVMe controller for the driver tests: BAR0 behind
//! `NvmeRegisters` and a controller side that really reads the driver's
//! submission queues from the fake guest memory of `virtio_mock`, follows
//! its PRPs into RAM namespaces and posts completion entries with phase
//! bits, as a controller does, with knobs to misbehave.
//!
//! Admin commands are executed when their doorbell is written (the driver
//! waits for them synchronously); I/O commands too, unless `hold_io` is
//! set, in which case the test calls `process` when it wants them done.
//! Malformed PRPs or queue use from the driver panic: a driver bug is a
//! test failure.
#![allow(dead_code)] // each test binary uses part of the mock

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use hal::nvme::regs::NvmeRegisters;

use super::mock::Memory;

/// What the controller does wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    None,
    /// CSTS.RDY never rises after CC.EN.
    NeverReady,
    /// I/O commands are fetched and never completed.
    NeverComplete,
    /// Completions carry this CID instead of the command's.
    WrongCid(u16),
    /// Completions are written with the previous phase (look stale).
    WrongPhase,
    /// Every completion is followed by a copy of itself (a duplicate with
    /// the right phase).
    Duplicate,
    /// I/O completes with this status field (SCT << 8 | SC).
    Status(u16),
    /// The next I/O command sets CSTS.CFS and is not completed.
    FatalOnIo,
    /// Create I/O Submission Queue fails with "invalid queue size".
    RefuseQueue,
}

/// One namespace's blocks.
pub struct Namespace {
    pub lba_shift: u8,
    pub data: Vec<u8>,
}

/// A queue as the controller sees it.
#[derive(Clone, Copy, Debug, Default)]
struct Queue {
    base: u64,
    entries: u16,
    /// SQ: the driver's tail (doorbell) and our head. CQ: our tail, our
    /// phase and the driver's head (doorbell).
    tail: u16,
    head: u16,
    phase: bool,
    /// SQ: its completion queue.
    cq: u16,
}

/// What the controller saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub queue: u16,
    pub opcode: u8,
    pub nsid: u32,
    pub fua: bool,
    /// The command used a PRP list.
    pub prp_list: bool,
}

pub struct Controller {
    memory: Rc<Memory>,
    pub cap: u64,
    pub cc: u32,
    pub csts: u32,
    pub intms: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: BTreeMap<u16, Queue>,
    cqs: BTreeMap<u16, Queue>,
    pub namespaces: BTreeMap<u32, Namespace>,
    /// Identify Controller's NN (namespaces 1..=nn may be asked for).
    pub nn: u32,
    pub serial: &'static str,
    pub model: &'static str,
    pub vwc: bool,
    /// Identify Controller's ONCS says Write Zeroes.
    pub write_zeroes: bool,
    pub mdts: u8,
    /// I/O queue pairs granted (0-based in Set Features' answer).
    pub queues_granted: u16,
    pub fault: Fault,
    pub hold_io: bool,
    pub seen: Vec<Seen>,
}

/// BAR0 of the mock controller (clones share it).
#[derive(Clone)]
pub struct MockRegs(pub Rc<RefCell<Controller>>);

impl std::fmt::Debug for MockRegs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MockRegs")
    }
}

impl MockRegs {
    /// A controller with 4096-entry queues, doorbell stride 4, CAP.TO of
    /// 1 (500 ms), the NVM command set, a volatile write cache, MDTS 5
    /// (128 KiB), serial "BRICKNVME0", and namespace 1 of `blocks` 512-byte
    /// blocks.
    pub fn new(memory: &Rc<Memory>, blocks: usize) -> Self {
        let mut namespaces = BTreeMap::new();
        namespaces.insert(
            1,
            Namespace {
                lba_shift: 9,
                data: vec![0; blocks * 512],
            },
        );
        Self(Rc::new(RefCell::new(Controller {
            memory: memory.clone(),
            cap: 4095 | (1 << 16) | (1 << 24) | (1 << 37),
            cc: 0,
            csts: 0,
            intms: 0,
            aqa: 0,
            asq: 0,
            acq: 0,
            sqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            namespaces,
            nn: 1,
            serial: "BRICKNVME0",
            model: "Brick mock NVMe",
            vwc: true,
            write_zeroes: true,
            mdts: 5,
            queues_granted: 4,
            fault: Fault::None,
            hold_io: false,
            seen: Vec::new(),
        })))
    }

    /// Borrows the controller.
    pub fn state(&self) -> std::cell::RefMut<'_, Controller> {
        self.0.borrow_mut()
    }

    /// Executes every I/O command the driver has rung in.
    pub fn process(&self) -> usize {
        let mut controller = self.0.borrow_mut();
        let ids: Vec<u16> = controller
            .sqs
            .keys()
            .copied()
            .filter(|id| *id != 0)
            .collect();
        ids.into_iter().map(|id| controller.run_sq(id)).sum()
    }
}

impl NvmeRegisters for MockRegs {
    fn read32(&self, offset: usize) -> u32 {
        let c = self.0.borrow();
        match offset {
            0x00 => c.cap as u32,
            0x04 => (c.cap >> 32) as u32,
            0x08 => 0x0001_0400,
            0x0c | 0x10 => c.intms,
            0x14 => c.cc,
            0x1c => c.csts,
            0x24 => c.aqa,
            _ => 0,
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        let mut c = self.0.borrow_mut();
        match offset {
            0x0c => c.intms |= value,
            0x14 => c.set_cc(value),
            0x24 => c.aqa = value,
            0x28 => c.asq = (c.asq & !0xffff_ffff) | u64::from(value),
            0x2c => c.asq = (c.asq & 0xffff_ffff) | (u64::from(value) << 32),
            0x30 => c.acq = (c.acq & !0xffff_ffff) | u64::from(value),
            0x34 => c.acq = (c.acq & 0xffff_ffff) | (u64::from(value) << 32),
            0x1000.. => {
                let index = (offset - 0x1000) / 4;
                let queue = (index / 2) as u16;
                if index % 2 == 0 {
                    let sq = c
                        .sqs
                        .get_mut(&queue)
                        .unwrap_or_else(|| panic!("doorbell of SQ {queue}, which does not exist"));
                    assert!(value < u32::from(sq.entries), "SQ tail beyond the queue");
                    sq.tail = value as u16;
                    if queue == 0 || !c.hold_io {
                        c.run_sq(queue);
                    }
                } else {
                    let cq = c
                        .cqs
                        .get_mut(&queue)
                        .unwrap_or_else(|| panic!("doorbell of CQ {queue}, which does not exist"));
                    assert!(value < u32::from(cq.entries), "CQ head beyond the queue");
                    cq.head = value as u16;
                }
            }
            _ => panic!("write of {value:#x} to NVMe register {offset:#x}"),
        }
    }
}

impl Controller {
    fn set_cc(&mut self, value: u32) {
        let was = self.cc & 1;
        self.cc = value;
        if value & 1 == 0 {
            self.csts &= !1;
            self.sqs.clear();
            self.cqs.clear();
        } else if was == 0 {
            assert_eq!((value >> 16) & 0xf, 6, "IOSQES");
            assert_eq!((value >> 20) & 0xf, 4, "IOCQES");
            assert_eq!((value >> 7) & 0xf, 0, "MPS: 4 KiB pages");
            let entries = |bits: u32| (bits & 0xfff) as u16 + 1;
            self.sqs.insert(
                0,
                Queue {
                    base: self.asq,
                    entries: entries(self.aqa),
                    ..Queue::default()
                },
            );
            self.cqs.insert(
                0,
                Queue {
                    base: self.acq,
                    entries: entries(self.aqa >> 16),
                    phase: true,
                    ..Queue::default()
                },
            );
            if self.fault != Fault::NeverReady {
                self.csts |= 1;
            }
        }
    }

    /// Executes the SQ's new commands; returns how many.
    fn run_sq(&mut self, id: u16) -> usize {
        let mut count = 0;
        loop {
            let sq = self.sqs[&id];
            if sq.head == sq.tail || self.csts & 2 != 0 {
                return count;
            }
            let at = sq.base + u64::from(sq.head) * 64;
            let mut command = [0u32; 16];
            for (i, dword) in command.iter_mut().enumerate() {
                *dword = self.memory.read_u32(at + 4 * i as u64);
            }
            let head = (sq.head + 1) % sq.entries;
            self.sqs.get_mut(&id).unwrap().head = head;
            count += 1;
            let cid = (command[0] >> 16) as u16;
            let outcome = if id == 0 {
                Some(self.admin(&command))
            } else {
                self.io(id, &command)
            };
            if let Some((status, dw0)) = outcome {
                let cq = sq.cq;
                self.complete(cq, id, head, cid, status, dw0);
            }
        }
    }

    fn complete(&mut self, cq: u16, sq: u16, sq_head: u16, cid: u16, status: u16, dw0: u32) {
        let io = sq != 0;
        let cid = match self.fault {
            Fault::WrongCid(wrong) if io => wrong,
            _ => cid,
        };
        let copies = if io && self.fault == Fault::Duplicate {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let queue = self.cqs.get_mut(&cq).expect("CQ exists");
            let next = (queue.tail + 1) % queue.entries;
            assert_ne!(next, queue.head, "the driver let CQ {cq} overflow");
            let phase = if io && self.fault == Fault::WrongPhase {
                !queue.phase
            } else {
                queue.phase
            };
            let at = queue.base + u64::from(queue.tail) * 16;
            self.memory.write_u32(at, dw0);
            self.memory.write_u32(at + 4, 0);
            self.memory
                .write_u32(at + 8, u32::from(sq_head) | (u32::from(sq) << 16));
            self.memory.write_u32(
                at + 12,
                u32::from(cid) | (u32::from(phase) << 16) | (u32::from(status) << 17),
            );
            queue.tail = next;
            if next == 0 {
                queue.phase = !queue.phase;
            }
        }
    }

    /// An admin command: (status, DW0).
    fn admin(&mut self, command: &[u32; 16]) -> (u16, u32) {
        let opcode = command[0] as u8;
        let nsid = command[1];
        let prp1 = u64::from(command[6]) | (u64::from(command[7]) << 32);
        self.seen.push(Seen {
            queue: 0,
            opcode,
            nsid,
            fua: false,
            prp_list: false,
        });
        match opcode {
            0x06 => {
                let mut page = vec![0u8; 4096];
                match command[10] & 0xff {
                    1 => {
                        page[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
                        let mut serial = [b' '; 20];
                        serial[..self.serial.len()].copy_from_slice(self.serial.as_bytes());
                        page[4..24].copy_from_slice(&serial);
                        let mut model = [b' '; 40];
                        model[..self.model.len()].copy_from_slice(self.model.as_bytes());
                        page[24..64].copy_from_slice(&model);
                        page[77] = self.mdts;
                        page[516..520].copy_from_slice(&self.nn.to_le_bytes());
                        page[525] = u8::from(self.vwc);
                        // ONCS: Write Zeroes (bit 3).
                        page[520] = u8::from(self.write_zeroes) << 3;
                    }
                    0 => {
                        if let Some(namespace) = self.namespaces.get(&nsid) {
                            let blocks = (namespace.data.len() >> namespace.lba_shift) as u64;
                            page[0..8].copy_from_slice(&blocks.to_le_bytes());
                            page[8..16].copy_from_slice(&blocks.to_le_bytes());
                            page[26] = 1; // FLBAS: format 1
                            let lbaf = u32::from(namespace.lba_shift) << 16;
                            page[132..136].copy_from_slice(&lbaf.to_le_bytes());
                        } else if nsid > self.nn {
                            return (0x0b, 0); // invalid namespace or format
                        }
                    }
                    _ => return (0x02, 0),
                }
                assert_eq!(prp1 % 4096, 0, "identify buffer must be a page");
                self.memory.write(prp1, &page);
                (0, 0)
            }
            0x09 => {
                assert_eq!(command[10] & 0xff, 7, "only Number of Queues is set");
                let n = u32::from(self.queues_granted - 1);
                (0, n | (n << 16))
            }
            0x05 => {
                let id = command[10] as u16;
                let entries = (command[10] >> 16) as u16 + 1;
                assert_eq!(command[11] & 1, 1, "physically contiguous");
                assert_eq!(command[11] & 2, 0, "interrupts stay off");
                assert!(id > 0 && id <= self.queues_granted, "CQ id {id}");
                assert_eq!(prp1 % 4096, 0);
                self.cqs.insert(
                    id,
                    Queue {
                        base: prp1,
                        entries,
                        phase: true,
                        ..Queue::default()
                    },
                );
                (0, 0)
            }
            0x01 => {
                if self.fault == Fault::RefuseQueue {
                    return (0x102, 0); // command specific: invalid queue size
                }
                let id = command[10] as u16;
                let entries = (command[10] >> 16) as u16 + 1;
                let cq = (command[11] >> 16) as u16;
                assert!(self.cqs.contains_key(&cq), "SQ on a CQ that does not exist");
                assert_eq!(prp1 % 4096, 0);
                self.sqs.insert(
                    id,
                    Queue {
                        base: prp1,
                        entries,
                        cq,
                        ..Queue::default()
                    },
                );
                (0, 0)
            }
            _ => (0x01, 0),
        }
    }

    /// The page addresses and lengths a command's PRPs describe for `len`
    /// bytes, and whether a list was used.
    fn segments(&self, prp1: u64, prp2: u64, len: usize) -> (Vec<(u64, usize)>, bool) {
        assert_eq!(prp1 % 4, 0, "PRP1 must be dword-aligned");
        let first = (4096 - (prp1 % 4096) as usize).min(len);
        let mut segments = vec![(prp1, first)];
        let mut left = len - first;
        if left == 0 {
            return (segments, false);
        }
        if left <= 4096 {
            assert_eq!(prp2 % 4096, 0, "PRP2 must be page-aligned");
            segments.push((prp2, left));
            return (segments, false);
        }
        assert_eq!(prp2 % 8, 0, "a PRP list must be qword-aligned");
        let mut entry = prp2;
        while left > 0 {
            let page = self.memory.read_u64(entry);
            assert_eq!(page % 4096, 0, "PRP list entries must be page-aligned");
            let n = left.min(4096);
            segments.push((page, n));
            left -= n;
            entry += 8;
            assert!(
                entry % 4096 != 0 || left == 0,
                "PRP list chaining is not used"
            );
        }
        (segments, true)
    }

    /// An I/O command: `None` if it is not completed.
    fn io(&mut self, queue: u16, command: &[u32; 16]) -> Option<(u16, u32)> {
        let opcode = command[0] as u8;
        let nsid = command[1];
        let prp1 = u64::from(command[6]) | (u64::from(command[7]) << 32);
        let prp2 = u64::from(command[8]) | (u64::from(command[9]) << 32);
        let lba = u64::from(command[10]) | (u64::from(command[11]) << 32);
        let blocks = (command[12] & 0xffff) as usize + 1;
        let fua = command[12] & (1 << 30) != 0;
        let mut seen = Seen {
            queue,
            opcode,
            nsid,
            fua,
            prp_list: false,
        };
        match self.fault {
            Fault::NeverComplete => {
                self.seen.push(seen);
                return None;
            }
            Fault::FatalOnIo => {
                self.seen.push(seen);
                self.csts |= 2;
                return None;
            }
            Fault::Status(status) => {
                self.seen.push(seen);
                return Some((status, 0));
            }
            _ => {}
        }
        let Some(namespace) = self.namespaces.get(&nsid) else {
            self.seen.push(seen);
            return Some((0x0b, 0));
        };
        let shift = namespace.lba_shift;
        let status = match opcode {
            0x00 => 0,
            0x08 if self.write_zeroes => {
                let start = (lba as usize) << shift;
                let len = blocks << shift;
                if start + len > namespace.data.len() {
                    self.seen.push(seen);
                    return Some((0x80, 0));
                }
                let namespace = self.namespaces.get_mut(&nsid).unwrap();
                namespace.data[start..start + len].fill(0);
                0
            }
            0x01 | 0x02 => {
                let start = (lba as usize) << shift;
                let len = blocks << shift;
                if start + len > namespace.data.len() {
                    self.seen.push(seen);
                    return Some((0x80, 0));
                }
                let (segments, list) = self.segments(prp1, prp2, len);
                seen.prp_list = list;
                let mut position = start;
                for (address, n) in segments {
                    if opcode == 0x01 {
                        let mut bytes = vec![0; n];
                        self.memory.read(address, &mut bytes);
                        let namespace = self.namespaces.get_mut(&nsid).unwrap();
                        namespace.data[position..position + n].copy_from_slice(&bytes);
                    } else {
                        let namespace = &self.namespaces[&nsid];
                        self.memory
                            .write(address, &namespace.data[position..position + n]);
                    }
                    position += n;
                }
                0
            }
            _ => 0x01,
        };
        self.seen.push(seen);
        Some((status, 0))
    }
}
