//! A polled NVMe driver: the controller, its admin queue, and each
//! namespace as a [`BlockDevice`] on its own I/O queue pair.
//!
//! NVM Express Base Specification 1.4 (<https://nvmexpress.org/specifications/>),
//! section numbers below are that document's. Polled, like the virtio
//! drivers: interrupts are masked (INTMS) and never enabled on the queues;
//! the loop reads the completion queues. Layers, each testable on the host:
//!
//! * [`regs::NvmeRegisters`]: BAR0 as 32-bit register accesses
//!   ([`regs::MmioRegisters`] in the image, a mock in the tests).
//! * [`NvmeController`]: reset and enable (§7.6.1), the admin queue pair,
//!   Identify Controller (serial, model, MDTS, volatile write cache,
//!   number of namespaces), Set Features Number of Queues. Admin commands
//!   are synchronous and bounded by a [`Clock`] deadline (CAP.TO, or the
//!   configured timeout).
//! * [`NvmeNamespace`]: [`NvmeController::open_namespace`] identifies a
//!   namespace (size, LBA format) and creates one I/O completion and one
//!   submission queue for it; the namespace then owns them and the
//!   controller may be dropped. Several namespaces of one controller are
//!   several devices, each with its own queue pair and doorbells.
//!
//! # Requests
//!
//! One slot per request in flight ([`DeviceInfo::queue_depth`]); its
//! command identifier is the slot index plus a generation in the top
//! bits, so a completion for a command that is no longer in flight (a
//! duplicate, a stale entry, a CID the driver never used) is recognised,
//! counted ([`NvmeStats::stale_completions`]) and dropped. Data is
//! described with PRPs (§4.3): PRP1 is the buffer's bus address, PRP2 the
//! second page or, for longer transfers, a PRP list in the slot's own list
//! page from the DMA pool. Buffers come straight from the caller when
//! [`BufferAccess::dma_address`] gives their bus address (zero copy), or
//! go through the slot's bounce buffer.
//!
//! # Flush and FUA
//!
//! Identify Controller's VWC bit says whether there is a volatile write
//! cache ([`DeviceInfo::volatile_write_cache`]); with one, [`Op::Flush`]
//! is the Flush command, without one it completes at once. A write with
//! `fua` sets the command's Force Unit Access bit (CDW12 bit 30): NVMe has
//! FUA natively.
//!
//! # Faults
//!
//! A controller is trusted for nothing it writes: a completion whose phase
//! bit is not the expected one is not a completion (the queue is empty), a
//! CID not in flight is dropped, a status other than success is an
//! [`IoError`] with the errno of [`NvmeStatus::errno`]. A request the
//! controller does not complete within the timeout completes with
//! `ETIMEDOUT`; its slot stays reserved until the controller answers it
//! (late), so the CID is never reused for another command while the
//! controller may still act on it. When a poll finds nothing and requests
//! are in flight, CSTS is read: a controller with CSTS.CFS set (fatal
//! status) fails every request in flight and every later one with `EIO`.
//!
//! # Allocation
//!
//! Everything (queues, identify page, PRP list pages, bounce buffers,
//! slot tables) is allocated at construction; submit and poll never
//! allocate.

#[allow(unsafe_code)]
pub mod regs;

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;

use crate::block::{
    BlockDevice, BufferAccess, Completion, DeviceInfo, IoError, Op, OpKind, Request, SubmitError,
};
use crate::dma::{DmaError, DmaPool, DmaSlice};
use crate::Clock;
use regs::{offset, NvmeRegisters};

/// Bytes of a memory page as the driver configures it (CC.MPS = 0).
pub const PAGE: usize = 4096;
/// Bytes of a submission queue entry (CC.IOSQES = 6).
const SQ_ENTRY: usize = 64;
/// Bytes of a completion queue entry (CC.IOCQES = 4).
const CQ_ENTRY: usize = 16;
/// PRP entries in one list page.
const PRPS_PER_PAGE: usize = PAGE / 8;
/// Bits of a command identifier that name the slot (the rest is the
/// slot's generation).
const SLOT_BITS: u32 = 10;
/// Most slots per namespace.
pub const MAX_QUEUE_DEPTH: u16 = 1 << SLOT_BITS;

/// Admin command opcodes (§5).
mod admin_opcode {
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const SET_FEATURES: u8 = 0x09;
}

/// NVM command opcodes (§6).
mod io_opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
}

/// Most logical blocks of one Write Zeroes command (NLB is 16 bits,
/// 0-based).
const MAX_ZEROES_BLOCKS: u64 = 1 << 16;

/// CC bits (§3.1.5).
mod cc {
    pub const ENABLE: u32 = 1;
    /// IOSQES = 6 (64-byte entries), IOCQES = 4 (16-byte entries).
    pub const ENTRY_SIZES: u32 = (6 << 16) | (4 << 20);
}

/// CSTS bits (§3.1.6).
mod csts {
    pub const READY: u32 = 1;
    pub const FATAL: u32 = 1 << 1;
}

/// The driver's timeouts and the admin queue's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ControllerConfig {
    /// Entries of the admin submission and completion queues (2..=4096,
    /// capped by CAP.MQES).
    pub admin_queue_size: u16,
    /// How long enabling, disabling or one admin command may take; `None`:
    /// CAP.TO (the controller's own worst case, 500 ms units).
    pub timeout_ns: Option<u64>,
    /// I/O queue pairs to ask for (Set Features, Number of Queues): one
    /// per namespace the caller will open.
    pub io_queues: u16,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            admin_queue_size: 32,
            timeout_ns: None,
            io_queues: 8,
        }
    }
}

/// One namespace's queue and transfer geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueConfig {
    /// Requests in flight at most (≤ [`MAX_QUEUE_DEPTH`], and one less
    /// than the queue's entries).
    pub queue_depth: u16,
    /// Entries of the I/O submission and completion queues (capped by
    /// CAP.MQES + 1).
    pub queue_size: u16,
    /// The longest read or write, bytes (capped by MDTS and by one PRP
    /// list page).
    pub max_transfer: u32,
    /// Whether to allocate a bounce buffer per slot for buffers without a
    /// DMA address; without it such requests are refused with
    /// [`SubmitError::Unsupported`].
    pub bounce: bool,
    /// How long a request may stay with the controller before it
    /// completes with `ETIMEDOUT`.
    pub timeout_ns: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            queue_depth: 32,
            queue_size: 64,
            max_transfer: 128 * 1024,
            bounce: true,
            timeout_ns: 30_000_000_000,
        }
    }
}

impl QueueConfig {
    /// DMA bytes [`NvmeController::open_namespace`] takes from the pool at
    /// most (queues, PRP list pages, bounce buffers, alignment padding).
    pub fn dma_bytes(&self) -> usize {
        let size = usize::from(self.queue_size);
        let depth = usize::from(self.queue_depth);
        let bounce = if self.bounce {
            depth * self.max_transfer as usize
        } else {
            0
        };
        (size * SQ_ENTRY).next_multiple_of(PAGE)
            + (size * CQ_ENTRY).next_multiple_of(PAGE)
            + depth * PAGE
            + bounce
            + 4 * PAGE
    }
}

/// An NVMe status field (§4.6.1.2): status code type and status code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmeStatus {
    /// Status code type (0 generic, 1 command specific, 2 media and data
    /// integrity, 3 path related, 7 vendor specific).
    pub code_type: u8,
    /// Status code.
    pub code: u8,
}

impl NvmeStatus {
    /// From the completion entry's DW3 (status field in bits 17..32).
    pub fn from_dw3(dw3: u32) -> Self {
        Self {
            code: (dw3 >> 17) as u8,
            code_type: ((dw3 >> 25) & 0x7) as u8,
        }
    }

    /// Whether it is Successful Completion.
    pub fn is_success(&self) -> bool {
        self.code_type == 0 && self.code == 0
    }

    /// The Linux errno an RNBD response carries for it, after Linux's
    /// `nvme_error_status` (status -> block status -> errno): an invalid
    /// opcode or field is `EOPNOTSUPP`, capacity exceeded `ENOSPC`,
    /// everything else (media errors included) `EIO`.
    pub fn errno(&self) -> i32 {
        let errno = match (self.code_type, self.code) {
            (0, 0x00) => 0,
            // Invalid command opcode, invalid field: the device refuses
            // the operation (BLK_STS_NOTSUPP).
            (0, 0x01 | 0x02) => errno::EOPNOTSUPP,
            // Capacity exceeded.
            (0, 0x81) => errno::ENOSPC,
            // Data transfer, internal, aborted, LBA out of range, other
            // media errors, path errors.
            _ => errno::EIO,
        };
        i32::from(errno)
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match (self.code_type, self.code) {
            (0, 0x00) => "successful completion",
            (0, 0x01) => "invalid command opcode",
            (0, 0x02) => "invalid field in command",
            (0, 0x04) => "data transfer error",
            (0, 0x06) => "internal error",
            (0, 0x07) => "command abort requested",
            (0, 0x0b) => "invalid namespace or format",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (0, 0x82) => "namespace not ready",
            (1, 0x01) => "invalid queue identifier",
            (1, 0x02) => "invalid queue size",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            _ => "status",
        };
        write!(
            f,
            "{name} (SCT {:#x}, SC {:#04x})",
            self.code_type, self.code
        )
    }
}

impl fmt::Debug for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NvmeStatus({self})")
    }
}

/// What a controller step was waiting for when it timed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// CSTS.RDY to clear after CC.EN was cleared.
    Disable,
    /// CSTS.RDY to be set after CC.EN was set.
    Enable,
    /// The completion of the admin command with this opcode.
    Admin(u8),
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disable => f.write_str("CSTS.RDY to clear after disabling"),
            Self::Enable => f.write_str("CSTS.RDY to be set after enabling"),
            Self::Admin(opcode) => write!(f, "admin command {opcode:#04x} to complete"),
        }
    }
}

/// Why the controller or a namespace could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NvmeError {
    /// The controller did not do what it was asked in time.
    Timeout {
        /// What the driver waited for.
        waiting_for: Wait,
        /// How long it waited, ns.
        after_ns: u64,
    },
    /// CSTS.CFS: the controller reports a fatal status.
    ControllerFatal,
    /// The controller does not do what the driver needs (the NVM command
    /// set, 4 KiB pages).
    Unsupported(&'static str),
    /// An admin command completed with an error status.
    CommandFailed {
        /// The admin opcode.
        opcode: u8,
        /// What the controller answered.
        status: NvmeStatus,
    },
    /// The namespace id is 0, above the controller's number of
    /// namespaces, or the namespace is inactive (size 0).
    NoSuchNamespace(u32),
    /// The namespace's format is one the driver does not serve (metadata,
    /// an LBA size below 512 or above a page).
    UnsupportedFormat {
        /// The namespace.
        nsid: u32,
        /// log2 of its LBA size.
        lba_shift: u8,
        /// Metadata bytes per LBA.
        metadata: u16,
    },
    /// The controller granted fewer I/O queue pairs than namespaces
    /// opened.
    NoQueueLeft(u16),
    /// The configuration is unusable (a zero depth or transfer, a queue
    /// smaller than the depth plus one).
    BadConfig,
    /// Not enough DMA memory.
    Dma(DmaError),
}

impl fmt::Display for NvmeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout {
                waiting_for,
                after_ns,
            } => write!(
                f,
                "timed out after {} ms waiting for {waiting_for}",
                after_ns / 1_000_000
            ),
            Self::ControllerFatal => f.write_str("controller fatal status (CSTS.CFS)"),
            Self::Unsupported(what) => write!(f, "controller lacks {what}"),
            Self::CommandFailed { opcode, status } => {
                write!(f, "admin command {opcode:#04x} failed: {status}")
            }
            Self::NoSuchNamespace(nsid) => write!(f, "namespace {nsid} does not exist or is inactive"),
            Self::UnsupportedFormat {
                nsid,
                lba_shift,
                metadata,
            } => write!(
                f,
                "namespace {nsid}: LBA format of 2^{lba_shift}-byte blocks with {metadata} metadata \
                 bytes is not served (512..4096-byte blocks, no metadata)"
            ),
            Self::NoQueueLeft(granted) => write!(
                f,
                "the controller granted {granted} I/O queue pair(s), all in use"
            ),
            Self::BadConfig => f.write_str("unusable queue configuration"),
            Self::Dma(error) => write!(f, "DMA memory: {error}"),
        }
    }
}

impl core::error::Error for NvmeError {}

impl From<DmaError> for NvmeError {
    fn from(error: DmaError) -> Self {
        Self::Dma(error)
    }
}

/// A 20-byte serial number or 40-byte model string from Identify, with
/// the trailing spaces (NVMe pads with 0x20) removed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdString<const N: usize> {
    bytes: [u8; N],
    len: u8,
}

impl<const N: usize> IdString<N> {
    /// From the raw field: up to the last byte that is not a space or NUL.
    pub fn from_raw(raw: [u8; N]) -> Self {
        let len = raw
            .iter()
            .rposition(|byte| *byte != b' ' && *byte != 0)
            .map_or(0, |last| last + 1);
        Self {
            bytes: raw,
            len: len as u8,
        }
    }

    /// The bytes without padding.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Whether the field is all padding.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Escaped outside printable ASCII: safe to log.
impl<const N: usize> fmt::Display for IdString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_bytes().escape_ascii())
    }
}

impl<const N: usize> fmt::Debug for IdString<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// What Identify Controller said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ControllerInfo {
    /// PCI vendor id (VID).
    pub vendor: u16,
    /// Serial number (SN).
    pub serial: IdString<20>,
    /// Model number (MN).
    pub model: IdString<40>,
    /// Largest transfer in bytes (MDTS; `None`: no limit).
    pub max_transfer: Option<u64>,
    /// Namespaces the controller has (NN: valid ids are 1..=NN).
    pub namespaces: u32,
    /// Whether there is a volatile write cache (VWC bit 0).
    pub volatile_write_cache: bool,
    /// Whether the controller has the Write Zeroes command (ONCS bit 3).
    pub write_zeroes: bool,
    /// The version register (VS): major << 16 | minor << 8 | tertiary.
    pub version: u32,
}

/// What Identify Namespace said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceInfo {
    /// The namespace id.
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// log2 of the logical block size (LBADS of the format in use).
    pub lba_shift: u8,
}

impl NamespaceInfo {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks << self.lba_shift
    }
}

/// One submission/completion queue pair and its doorbells.
#[derive(Debug)]
struct QueuePair {
    id: u16,
    entries: u16,
    sq: DmaSlice,
    cq: DmaSlice,
    sq_tail: u16,
    /// The controller's SQ head, from the last completion.
    sq_head: u16,
    cq_head: u16,
    /// The phase a new completion entry carries.
    phase: bool,
    sq_doorbell: usize,
    cq_doorbell: usize,
    /// Entries pushed since the last SQ doorbell.
    unrung: bool,
    /// Completions consumed since the last CQ doorbell.
    cq_unrung: bool,
}

/// A completion entry as read (§4.6).
#[derive(Clone, Copy, Debug)]
struct Entry {
    dw0: u32,
    sq_head: u16,
    cid: u16,
    status: NvmeStatus,
}

impl QueuePair {
    fn new(pool: &mut DmaPool, id: u16, entries: u16, stride: usize) -> Result<Self, DmaError> {
        let sq = pool.alloc(usize::from(entries) * SQ_ENTRY, PAGE)?;
        let cq = pool.alloc(usize::from(entries) * CQ_ENTRY, PAGE)?;
        Ok(Self {
            id,
            entries,
            sq,
            cq,
            sq_tail: 0,
            sq_head: 0,
            cq_head: 0,
            phase: true,
            sq_doorbell: offset::DOORBELLS + 2 * usize::from(id) * stride,
            cq_doorbell: offset::DOORBELLS + (2 * usize::from(id) + 1) * stride,
            unrung: false,
            cq_unrung: false,
        })
    }

    /// Whether one more command fits (one entry always stays empty: §4.1.1).
    fn has_room(&self) -> bool {
        (self.sq_tail + 1) % self.entries != self.sq_head
    }

    /// Copies `command` into the next SQ entry (the doorbell is rung by
    /// [`ring`](Self::ring)). `false` if the queue is full.
    fn push(&mut self, command: &[u32; 16]) -> bool {
        if !self.has_room() {
            return false;
        }
        let base = usize::from(self.sq_tail) * SQ_ENTRY;
        for (i, dword) in command.iter().enumerate() {
            self.sq.write_u32(base + 4 * i, *dword);
        }
        self.sq_tail = (self.sq_tail + 1) % self.entries;
        self.unrung = true;
        true
    }

    /// Rings the SQ tail doorbell if entries were pushed since the last
    /// time. x86 stores are not reordered with other stores, and the
    /// doorbell is an uncached MMIO store after the entry's stores, so no
    /// fence is needed beyond the compiler's (volatile accesses are not
    /// reordered with each other).
    fn ring<R: NvmeRegisters>(&mut self, regs: &R) {
        if self.unrung {
            core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
            regs.write32(self.sq_doorbell, u32::from(self.sq_tail));
            self.unrung = false;
        }
    }

    /// The next completion entry, if its phase bit says it is new.
    fn pop(&mut self) -> Option<Entry> {
        let base = usize::from(self.cq_head) * CQ_ENTRY;
        let dw3 = self.cq.read_u32(base + 12);
        if (dw3 & (1 << 16) != 0) != self.phase {
            return None;
        }
        core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
        let dw0 = self.cq.read_u32(base);
        let dw2 = self.cq.read_u32(base + 8);
        self.cq_head += 1;
        if self.cq_head == self.entries {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        self.cq_unrung = true;
        let sq_head = dw2 as u16;
        if sq_head < self.entries {
            self.sq_head = sq_head;
        }
        Some(Entry {
            dw0,
            sq_head,
            cid: dw3 as u16,
            status: NvmeStatus::from_dw3(dw3),
        })
    }

    /// Rings the CQ head doorbell if entries were consumed.
    fn release<R: NvmeRegisters>(&mut self, regs: &R) {
        if self.cq_unrung {
            regs.write32(self.cq_doorbell, u32::from(self.cq_head));
            self.cq_unrung = false;
        }
    }
}

/// An enabled controller with its admin queue (setup only; drop it once
/// the namespaces are open).
#[derive(Debug)]
pub struct NvmeController<R: NvmeRegisters> {
    regs: R,
    admin: QueuePair,
    identify: DmaSlice,
    info: ControllerInfo,
    stride: usize,
    /// CAP.MQES + 1.
    max_entries: u16,
    timeout_ns: u64,
    next_cid: u16,
    next_queue: u16,
    granted_queues: u16,
}

impl<R: NvmeRegisters> NvmeController<R> {
    /// Resets and enables the controller (§7.6.1), sets up the admin
    /// queue from `pool`, masks its interrupts, identifies it and asks for
    /// `config.io_queues` I/O queue pairs. Waits are bounded by `clock`.
    ///
    /// # Errors
    ///
    /// [`NvmeError::Unsupported`] (no NVM command set, no 4 KiB pages),
    /// [`NvmeError::Timeout`], [`NvmeError::ControllerFatal`],
    /// [`NvmeError::CommandFailed`], [`NvmeError::Dma`],
    /// [`NvmeError::BadConfig`].
    pub fn new<C: Clock + ?Sized>(
        regs: R,
        pool: &mut DmaPool,
        clock: &C,
        config: ControllerConfig,
    ) -> Result<Self, NvmeError> {
        let cap = regs.read64(offset::CAP);
        if cap & (1 << 37) == 0 {
            return Err(NvmeError::Unsupported("the NVM command set (CAP.CSS)"));
        }
        if (cap >> 48) & 0xf != 0 {
            return Err(NvmeError::Unsupported("4 KiB memory pages (CAP.MPSMIN)"));
        }
        let max_entries = ((cap & 0xffff) as u16).saturating_add(1).max(2);
        let stride = 4usize << ((cap >> 32) & 0xf);
        let timeout_ns = config
            .timeout_ns
            .unwrap_or(((cap >> 24) & 0xff).max(1) * 500_000_000);
        if config.admin_queue_size < 2 || config.io_queues == 0 {
            return Err(NvmeError::BadConfig);
        }
        let admin_entries = config.admin_queue_size.min(max_entries).min(4096);

        if regs.read32(offset::CC) & cc::ENABLE != 0 {
            regs.write32(offset::CC, 0);
        }
        wait_status(&regs, clock, timeout_ns, Wait::Disable, |status| {
            status & csts::READY == 0
        })?;
        let admin = QueuePair::new(pool, 0, admin_entries, stride)?;
        let identify = pool.alloc(PAGE, PAGE)?;
        let size = u32::from(admin_entries - 1);
        regs.write32(offset::AQA, (size << 16) | size);
        regs.write64(offset::ASQ, admin.sq.phys());
        regs.write64(offset::ACQ, admin.cq.phys());
        regs.write32(offset::CC, cc::ENTRY_SIZES | cc::ENABLE);
        wait_status(&regs, clock, timeout_ns, Wait::Enable, |status| {
            status & csts::READY != 0
        })?;
        // Polled: no interrupt vector is ever wanted.
        regs.write32(offset::INTMS, u32::MAX);
        let version = regs.read32(offset::VS);
        let mut controller = Self {
            regs,
            admin,
            identify,
            info: ControllerInfo {
                vendor: 0,
                serial: IdString::from_raw([b' '; 20]),
                model: IdString::from_raw([b' '; 40]),
                max_transfer: None,
                namespaces: 0,
                volatile_write_cache: false,
                write_zeroes: false,
                version,
            },
            stride,
            max_entries,
            timeout_ns,
            next_cid: 0,
            next_queue: 1,
            granted_queues: 0,
        };
        // Identify Controller (CNS 1).
        controller.admin_command(clock, admin_opcode::IDENTIFY, 0, 1, 0, true)?;
        let page = &controller.identify;
        let mut serial = [0u8; 20];
        page.read_bytes(4, &mut serial);
        let mut model = [0u8; 40];
        page.read_bytes(24, &mut model);
        let mdts = page.read_u8(77);
        let min_page = 1u64 << (12 + ((cap >> 48) & 0xf));
        controller.info.vendor = page.read_u16(0);
        controller.info.serial = IdString::from_raw(serial);
        controller.info.model = IdString::from_raw(model);
        controller.info.max_transfer = (mdts != 0)
            .then(|| min_page.checked_shl(u32::from(mdts)))
            .flatten();
        controller.info.namespaces = page.read_u32(516);
        controller.info.volatile_write_cache = page.read_u8(525) & 1 != 0;
        controller.info.write_zeroes = page.read_u16(520) & (1 << 3) != 0;
        // Set Features, Number of Queues (FID 7): 0-based counts.
        let wanted = u32::from(config.io_queues - 1);
        let granted = controller.admin_command(
            clock,
            admin_opcode::SET_FEATURES,
            0,
            0x07,
            wanted | (wanted << 16),
            false,
        )?;
        let submission = (granted & 0xffff) as u16;
        let completion = (granted >> 16) as u16;
        controller.granted_queues = submission.min(completion).saturating_add(1);
        Ok(controller)
    }

    /// What Identify Controller said.
    pub fn info(&self) -> ControllerInfo {
        self.info
    }

    /// I/O queue pairs the controller granted.
    pub fn granted_queues(&self) -> u16 {
        self.granted_queues
    }

    /// Runs one admin command and waits for it: `cdw10`, `cdw11`, PRP1 =
    /// the identify page if `identify`. Returns the completion's DW0.
    fn admin_command<C: Clock + ?Sized>(
        &mut self,
        clock: &C,
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        cdw11: u32,
        identify: bool,
    ) -> Result<u32, NvmeError> {
        let prp1 = if identify { self.identify.phys() } else { 0 };
        self.admin_with_prp(clock, opcode, nsid, prp1, cdw10, cdw11)
    }

    fn admin_with_prp<C: Clock + ?Sized>(
        &mut self,
        clock: &C,
        opcode: u8,
        nsid: u32,
        prp1: u64,
        cdw10: u32,
        cdw11: u32,
    ) -> Result<u32, NvmeError> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let mut command = [0u32; 16];
        command[0] = u32::from(opcode) | (u32::from(cid) << 16);
        command[1] = nsid;
        command[6] = prp1 as u32;
        command[7] = (prp1 >> 32) as u32;
        command[10] = cdw10;
        command[11] = cdw11;
        let timeout = NvmeError::Timeout {
            waiting_for: Wait::Admin(opcode),
            after_ns: self.timeout_ns,
        };
        // Nothing else is in flight on the admin queue, so a full queue
        // means the controller stopped consuming entries.
        if !self.admin.push(&command) {
            return Err(timeout);
        }
        self.admin.ring(&self.regs);
        let start = clock.now();
        loop {
            if let Some(entry) = self.admin.pop() {
                self.admin.release(&self.regs);
                if entry.cid != cid {
                    continue;
                }
                if !entry.status.is_success() {
                    return Err(NvmeError::CommandFailed {
                        opcode,
                        status: entry.status,
                    });
                }
                return Ok(entry.dw0);
            }
            if self.regs.read32(offset::CSTS) & csts::FATAL != 0 {
                return Err(NvmeError::ControllerFatal);
            }
            if clock.now().saturating_sub(start) >= self.timeout_ns {
                return Err(timeout);
            }
            core::hint::spin_loop();
        }
    }

    /// Identify Namespace (CNS 0) for `nsid`.
    ///
    /// # Errors
    ///
    /// [`NvmeError::NoSuchNamespace`] for an id outside 1..=NN or an
    /// inactive namespace; the admin command's errors.
    pub fn identify_namespace<C: Clock + ?Sized>(
        &mut self,
        clock: &C,
        nsid: u32,
    ) -> Result<NamespaceInfo, NvmeError> {
        if nsid == 0 || nsid > self.info.namespaces {
            return Err(NvmeError::NoSuchNamespace(nsid));
        }
        match self.admin_command(clock, admin_opcode::IDENTIFY, nsid, 0, 0, true) {
            // An id the controller does not know (some answer "invalid
            // field" or "invalid namespace or format" rather than zeros).
            Err(NvmeError::CommandFailed { status, .. })
                if status.code_type == 0 && matches!(status.code, 0x02 | 0x0b) =>
            {
                return Err(NvmeError::NoSuchNamespace(nsid));
            }
            result => result?,
        };
        let page = &self.identify;
        let blocks = page.read_u64(0);
        if blocks == 0 {
            return Err(NvmeError::NoSuchNamespace(nsid));
        }
        let format = usize::from(page.read_u8(26) & 0xf);
        let descriptor = page.read_u32(128 + 4 * format);
        let metadata = descriptor as u16;
        let lba_shift = (descriptor >> 16) as u8;
        if metadata != 0 || !(9..=12).contains(&lba_shift) {
            return Err(NvmeError::UnsupportedFormat {
                nsid,
                lba_shift,
                metadata,
            });
        }
        Ok(NamespaceInfo {
            nsid,
            blocks,
            lba_shift,
        })
    }

    /// Identifies namespace `nsid`, creates an I/O queue pair for it and
    /// returns it as a block device; rings, PRP list pages and bounce
    /// buffers come from `pool`.
    ///
    /// # Errors
    ///
    /// [`NvmeError::NoSuchNamespace`], [`NvmeError::UnsupportedFormat`],
    /// [`NvmeError::NoQueueLeft`], [`NvmeError::BadConfig`],
    /// [`NvmeError::Dma`], and the admin commands' errors.
    pub fn open_namespace<H: Copy, C: Clock + ?Sized>(
        &mut self,
        clock: &C,
        nsid: u32,
        pool: &mut DmaPool,
        config: QueueConfig,
    ) -> Result<NvmeNamespace<H, R>, NvmeError> {
        let namespace = self.identify_namespace(clock, nsid)?;
        if self.next_queue > self.granted_queues {
            return Err(NvmeError::NoQueueLeft(self.granted_queues));
        }
        let entries = config.queue_size.min(self.max_entries).min(4096);
        let depth = config
            .queue_depth
            .min(entries.saturating_sub(1))
            .min(MAX_QUEUE_DEPTH);
        let block = 1u32 << namespace.lba_shift;
        // One PRP list page covers 512 pages after the first; the buffer
        // may start anywhere in its first page.
        let mut max_transfer = config
            .max_transfer
            .min(((PRPS_PER_PAGE - 1) * PAGE) as u32)
            .min(block.saturating_mul(65536));
        if let Some(limit) = self.info.max_transfer {
            max_transfer = max_transfer.min(u32::try_from(limit).unwrap_or(u32::MAX));
        }
        max_transfer -= max_transfer % block;
        if depth == 0 || max_transfer == 0 || config.timeout_ns == 0 {
            return Err(NvmeError::BadConfig);
        }
        let id = self.next_queue;
        let queue = QueuePair::new(pool, id, entries, self.stride)?;
        let prp_lists = if max_transfer as usize > 2 * PAGE {
            Some(pool.alloc(usize::from(depth) * PAGE, PAGE)?)
        } else {
            None
        };
        let bounce = if config.bounce {
            Some(pool.alloc(usize::from(depth) * max_transfer as usize, PAGE)?)
        } else {
            None
        };
        let size = u32::from(entries - 1) << 16;
        // Create I/O Completion Queue: physically contiguous, interrupts off.
        self.admin_with_prp(
            clock,
            admin_opcode::CREATE_IO_CQ,
            0,
            queue.cq.phys(),
            size | u32::from(id),
            1,
        )?;
        // Create I/O Submission Queue on it: contiguous, urgent priority 0.
        self.admin_with_prp(
            clock,
            admin_opcode::CREATE_IO_SQ,
            0,
            queue.sq.phys(),
            size | u32::from(id),
            (u32::from(id) << 16) | 1,
        )?;
        self.next_queue += 1;
        let info = DeviceInfo {
            size: namespace.bytes(),
            logical_block_size: block,
            physical_block_size: block,
            max_transfer,
            queue_depth: u32::from(depth),
            volatile_write_cache: self.info.volatile_write_cache,
            fua: true,
            discard: None,
            write_zeroes: self.info.write_zeroes,
            read_only: false,
        };
        let empty = Slot {
            stage: Stage::Free,
            generation: 0,
            tag: 0,
            kind: OpKind::Flush,
            buffer: None,
            len: 0,
            bounced: false,
            since: None,
        };
        let mut slots = Vec::new();
        slots.resize(usize::from(depth), empty);
        let free = (0..depth).rev().collect();
        let mut finished = VecDeque::new();
        finished.reserve_exact(usize::from(depth));
        Ok(NvmeNamespace {
            regs: self.regs.clone(),
            queue,
            namespace,
            info,
            prp_lists,
            bounce,
            slots,
            free,
            finished,
            timeout_ns: config.timeout_ns,
            failed: false,
            stats: NvmeStats::default(),
        })
    }
}

/// Waits until `done(CSTS)`, failing on CSTS.CFS or after `timeout_ns`.
fn wait_status<R: NvmeRegisters, C: Clock + ?Sized>(
    regs: &R,
    clock: &C,
    timeout_ns: u64,
    waiting_for: Wait,
    done: impl Fn(u32) -> bool,
) -> Result<(), NvmeError> {
    let start = clock.now();
    loop {
        let status = regs.read32(offset::CSTS);
        if done(status) {
            return Ok(());
        }
        // All ones: the device is gone (a surprise removal reads so).
        if status & csts::FATAL != 0 && status != u32::MAX {
            return Err(NvmeError::ControllerFatal);
        }
        let waited = clock.now().saturating_sub(start);
        if waited >= timeout_ns {
            return Err(NvmeError::Timeout {
                waiting_for,
                after_ns: waited,
            });
        }
        core::hint::spin_loop();
    }
}

/// Counters of an [`NvmeNamespace`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NvmeStats {
    /// Requests sent zero-copy.
    pub zero_copy: u64,
    /// Requests sent through a bounce buffer.
    pub bounced: u64,
    /// Requests that needed a PRP list (more than two pages).
    pub prp_lists: u64,
    /// Completions with an error status.
    pub errors: u64,
    /// Completions for a command not in flight (a CID never given out, a
    /// duplicate, a stale generation): dropped.
    pub stale_completions: u64,
    /// Requests the controller did not complete in time.
    pub timeouts: u64,
    /// Late completions of timed-out requests (their slots freed).
    pub late_completions: u64,
    /// Whether CSTS.CFS was seen (the device then fails every request).
    pub fatal: bool,
}

/// What a slot's request is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Free.
    Free,
    /// With the controller.
    InFlight,
    /// Finished without the controller (a flush without a write cache, a
    /// request to a failed controller); in `finished`.
    Finished,
    /// Completed to the caller with ETIMEDOUT; the controller may still
    /// answer, so the CID stays reserved.
    TimedOut,
}

#[derive(Clone, Copy, Debug)]
struct Slot<H> {
    stage: Stage,
    generation: u16,
    tag: u64,
    kind: OpKind,
    buffer: Option<H>,
    len: u32,
    bounced: bool,
    /// The first poll after submission (the timeout runs from there).
    since: Option<u64>,
}

/// One namespace on its own I/O queue pair: a [`BlockDevice`].
#[derive(Debug)]
pub struct NvmeNamespace<H: Copy, R: NvmeRegisters> {
    regs: R,
    queue: QueuePair,
    namespace: NamespaceInfo,
    info: DeviceInfo,
    prp_lists: Option<DmaSlice>,
    bounce: Option<DmaSlice>,
    slots: Vec<Slot<H>>,
    free: Vec<u16>,
    /// Slots finished without the controller, with their results.
    finished: VecDeque<(u16, Result<(), IoError>)>,
    timeout_ns: u64,
    failed: bool,
    stats: NvmeStats,
}

impl<H: Copy, R: NvmeRegisters> NvmeNamespace<H, R> {
    /// What Identify Namespace said.
    pub fn namespace(&self) -> NamespaceInfo {
        self.namespace
    }

    /// The I/O queue pair's id.
    pub fn queue_id(&self) -> u16 {
        self.queue.id
    }

    /// The counters.
    pub fn stats(&self) -> NvmeStats {
        self.stats
    }

    fn cid(&self, slot: u16) -> u16 {
        slot | (self.slots[usize::from(slot)].generation << SLOT_BITS)
    }

    /// The slot a CID names, if that command is what the slot holds now.
    fn slot_of(&self, cid: u16) -> Option<u16> {
        let slot = cid & (MAX_QUEUE_DEPTH - 1);
        let state = self.slots.get(usize::from(slot))?;
        (matches!(state.stage, Stage::InFlight | Stage::TimedOut) && self.cid(slot) == cid)
            .then_some(slot)
    }

    /// The data's bus address for slot `slot`: the caller's buffer, or the
    /// slot's bounce buffer (filled now for a write).
    fn data_address<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        buffer: H,
        len: u32,
        write: bool,
        buffers: &mut A,
    ) -> Result<(u64, bool), SubmitError> {
        buffers
            .with_slice(buffer, len, |_| ())
            .map_err(SubmitError::Buffer)?;
        // PRP1 must be dword-aligned (§4.3).
        if let Some(address) = buffers.dma_address(buffer, len).filter(|a| a % 4 == 0) {
            return Ok((address, false));
        }
        let Some(bounce) = &self.bounce else {
            return Err(SubmitError::Unsupported);
        };
        let offset = usize::from(slot) * self.info.max_transfer as usize;
        if write {
            buffers
                .with_slice(buffer, len, |bytes| bounce.write_bytes(offset, bytes))
                .map_err(SubmitError::Buffer)?;
        }
        Ok((bounce.phys_at(offset), true))
    }

    /// PRP1 and PRP2 for `len` bytes at bus address `address` (the PRP list
    /// of `slot` filled when more than two pages are touched).
    fn prps(&mut self, slot: u16, address: u64, len: u32) -> (u64, u64) {
        let page = PAGE as u64;
        let end = address + u64::from(len);
        let second = (address & !(page - 1)) + page;
        if end <= second {
            return (address, 0);
        }
        if end <= second + page {
            return (address, second);
        }
        // `start` refuses transfers over two pages when there are no
        // lists (max_transfer is then at most two pages).
        let Some(lists) = &self.prp_lists else {
            return (address, second);
        };
        let base = usize::from(slot) * PAGE;
        let mut at = second;
        let mut index = 0;
        while at < end && index < PRPS_PER_PAGE {
            lists.write_u64(base + 8 * index, at);
            at += page;
            index += 1;
        }
        self.stats.prp_lists += 1;
        (address, lists.phys_at(base))
    }

    fn start<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<Stage, SubmitError> {
        let state = &mut self.slots[usize::from(slot)];
        state.tag = request.tag;
        state.kind = request.op.kind();
        state.buffer = request.op.buffer();
        state.len = 0;
        state.bounced = false;
        state.since = None;
        let shift = self.namespace.lba_shift;
        let mut command = [0u32; 16];
        command[1] = self.namespace.nsid;
        let (opcode, bounced) = match request.op {
            Op::Read {
                offset,
                len,
                buffer,
            }
            | Op::Write {
                offset,
                len,
                buffer,
                ..
            } => {
                let write = matches!(request.op, Op::Write { .. });
                let (address, bounced) = self.data_address(slot, buffer, len, write, buffers)?;
                if self.prp_lists.is_none()
                    && (address % PAGE as u64) + u64::from(len) > 2 * PAGE as u64
                {
                    return Err(SubmitError::Unsupported);
                }
                let (prp1, prp2) = self.prps(slot, address, len);
                let lba = offset >> shift;
                let blocks = (len >> shift) - 1;
                command[6] = prp1 as u32;
                command[7] = (prp1 >> 32) as u32;
                command[8] = prp2 as u32;
                command[9] = (prp2 >> 32) as u32;
                command[10] = lba as u32;
                command[11] = (lba >> 32) as u32;
                command[12] = blocks;
                if let Op::Write { fua: true, .. } = request.op {
                    command[12] |= 1 << 30;
                }
                self.slots[usize::from(slot)].len = len;
                self.slots[usize::from(slot)].bounced = bounced;
                let opcode = if write {
                    io_opcode::WRITE
                } else {
                    io_opcode::READ
                };
                (opcode, Some(bounced))
            }
            Op::Flush if !self.info.volatile_write_cache => return Ok(Stage::Finished),
            Op::Flush => (io_opcode::FLUSH, None),
            // No data: SLBA and NLB only. `DeviceInfo::check` refused it
            // if the controller lacks the command.
            Op::WriteZeroes { offset, len } => {
                let blocks = u64::from(len) >> shift;
                if blocks == 0 || blocks > MAX_ZEROES_BLOCKS {
                    return Err(SubmitError::TooLong);
                }
                let lba = offset >> shift;
                command[10] = lba as u32;
                command[11] = (lba >> 32) as u32;
                command[12] = (blocks - 1) as u32;
                (io_opcode::WRITE_ZEROES, None)
            }
            // `DeviceInfo::check` refused it (no discard).
            Op::Discard { .. } => return Err(SubmitError::Unsupported),
        };
        command[0] = u32::from(opcode) | (u32::from(self.cid(slot)) << 16);
        if !self.queue.push(&command) {
            return Err(SubmitError::QueueFull);
        }
        match bounced {
            Some(true) => self.stats.bounced += 1,
            Some(false) => self.stats.zero_copy += 1,
            None => {}
        }
        Ok(Stage::InFlight)
    }

    /// Delivers slot `slot` with `result` (copying a bounced read out) and
    /// frees it.
    fn deliver<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        mut result: Result<(), IoError>,
        buffers: &mut A,
        on_completion: &mut impl FnMut(Completion<H>),
    ) {
        let state = self.slots[usize::from(slot)];
        if let (Ok(()), OpKind::Read, true, Some(buffer), Some(bounce)) = (
            result,
            state.kind,
            state.bounced,
            state.buffer,
            &self.bounce,
        ) {
            let offset = usize::from(slot) * self.info.max_transfer as usize;
            result = buffers
                .with_slice_mut(buffer, state.len, |bytes| bounce.read_bytes(offset, bytes))
                .map_err(IoError::Buffer);
        }
        self.release(slot);
        on_completion(Completion {
            tag: state.tag,
            kind: state.kind,
            buffer: state.buffer,
            result,
        });
    }

    fn release(&mut self, slot: u16) {
        let state = &mut self.slots[usize::from(slot)];
        state.stage = Stage::Free;
        state.generation = (state.generation + 1) % (1 << (16 - SLOT_BITS));
        self.free.push(slot);
    }

    /// CSTS.CFS: every request with the controller fails with EIO (their
    /// slots are freed: a dead controller answers nothing), and so does
    /// every later one.
    fn fail_all(&mut self) {
        self.failed = true;
        self.stats.fatal = true;
        for slot in 0..self.slots.len() as u16 {
            match self.slots[usize::from(slot)].stage {
                Stage::InFlight => {
                    self.slots[usize::from(slot)].stage = Stage::Finished;
                    self.finished.push_back((slot, Err(IoError::device())));
                }
                Stage::TimedOut => self.release(slot),
                Stage::Free | Stage::Finished => {}
            }
        }
    }
}

impl<H: Copy, R: NvmeRegisters> BlockDevice<H> for NvmeNamespace<H, R> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        self.info.check(&request.op)?;
        let Some(&slot) = self.free.last() else {
            return Err(SubmitError::QueueFull);
        };
        let stage = if self.failed {
            let state = &mut self.slots[usize::from(slot)];
            state.tag = request.tag;
            state.kind = request.op.kind();
            state.buffer = request.op.buffer();
            state.bounced = false;
            self.finished.push_back((slot, Err(IoError::device())));
            Stage::Finished
        } else {
            let stage = self.start(slot, request, buffers)?;
            if stage == Stage::Finished {
                self.finished.push_back((slot, Ok(())));
            }
            stage
        };
        self.free.pop();
        self.slots[usize::from(slot)].stage = stage;
        Ok(())
    }

    /// Rings the SQ doorbell once if commands were queued, delivers up to
    /// `max` completions (those finished without the controller first),
    /// rings the CQ doorbell, then times out requests older than the
    /// timeout and checks CSTS.CFS when nothing completed.
    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        self.queue.ring(&self.regs);
        let mut delivered = 0;
        while delivered < max {
            if let Some((slot, result)) = self.finished.pop_front() {
                self.deliver(slot, result, buffers, on_completion);
                delivered += 1;
                continue;
            }
            // At most a queue's worth of entries per poll (a controller
            // that keeps posting bogus entries cannot hold the loop).
            let Some(entry) = self.queue.pop() else {
                break;
            };
            let _ = (entry.dw0, entry.sq_head);
            let Some(slot) = self.slot_of(entry.cid) else {
                self.stats.stale_completions += 1;
                continue;
            };
            if self.slots[usize::from(slot)].stage == Stage::TimedOut {
                self.stats.late_completions += 1;
                self.release(slot);
                continue;
            }
            let result = if entry.status.is_success() {
                Ok(())
            } else {
                self.stats.errors += 1;
                Err(IoError::Io(entry.status.errno()))
            };
            self.deliver(slot, result, buffers, on_completion);
            delivered += 1;
        }
        self.queue.release(&self.regs);
        let mut waiting = false;
        for slot in 0..self.slots.len() {
            if delivered >= max {
                break;
            }
            let state = &mut self.slots[slot];
            if state.stage != Stage::InFlight {
                continue;
            }
            waiting = true;
            let since = *state.since.get_or_insert(now);
            if now.saturating_sub(since) >= self.timeout_ns {
                state.stage = Stage::TimedOut;
                self.stats.timeouts += 1;
                on_completion(Completion {
                    tag: state.tag,
                    kind: state.kind,
                    buffer: state.buffer,
                    result: Err(IoError::Io(i32::from(errno::ETIMEDOUT))),
                });
                delivered += 1;
            }
        }
        if delivered == 0 && waiting && self.regs.read32(offset::CSTS) & csts::FATAL != 0 {
            self.fail_all();
        }
        delivered
    }

    fn poll_at(&self) -> Option<u64> {
        (self.in_flight() > 0 || self.queue.unrung).then_some(0)
    }

    /// Requests not yet delivered (timed-out requests whose CID is still
    /// reserved are not counted: the caller has their completion).
    fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| matches!(slot.stage, Stage::InFlight | Stage::Finished))
            .count()
    }
}
