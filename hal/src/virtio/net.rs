//! virtio-net (VIRTIO 1.1 §5.1) as a [`Nic`]: polled, no offloads.
//!
//! Features: `VIRTIO_F_VERSION_1` (mandatory; the header is then the
//! 12-byte `virtio_net_hdr` with `num_buffers`), `VIRTIO_NET_F_MAC` (the MAC
//! from device configuration; without it the caller must supply one),
//! `VIRTIO_NET_F_MTU` when offered (the device's largest MTU: a configured
//! MTU above it is refused), `VIRTIO_F_INDIRECT_DESC` when offered (a
//! gathered frame takes one TX descriptor, see Transmit). Not negotiated: mergeable RX buffers, checksum
//! and segmentation offloads, control queue, link status (the link is
//! assumed up).
//!
//! # MTU
//!
//! [`NetConfig::mtu`] is the IP MTU, [`DEFAULT_MTU`] (1500) up to
//! [`MAX_MTU`] (9000, jumbo frames: a 4096-byte RoCE path MTU needs an IP
//! MTU of 4,192 or more, RDMA CM's rule). Without mergeable RX buffers every RX buffer
//! holds a whole frame (VIRTIO 1.1 §5.1.6.3.1: the device drops a frame
//! that does not fit one buffer), so the buffers are sized for the MTU:
//! [`NetConfig::buffer_stride`] is the 12-byte header, the frame and a
//! VLAN tag rounded up to 64 bytes (1,536 at MTU 1500, 9,088 at 9000).
//! A received frame is then always contiguous and lent in place; mergeable
//! buffers would split a jumbo frame over several 1,536-byte buffers that
//! the engine would have to copy together.
//!
//! # Receive
//!
//! Queue 0. Every descriptor has its own RX buffer of
//! [`NetConfig::buffer_stride`] bytes, all posted at start: buffer `i`
//! always goes with descriptor `i`. [`Nic::receive`] takes
//! one used buffer, lends the frame (after the header) to the closure —
//! the device returned the buffer, so it does not write it — and re-posts
//! it. Re-posted buffers are published in batches of [`RX_PUBLISH_BATCH`]
//! or when the ring is found empty; QEMU sets `VIRTQ_USED_F_NO_NOTIFY` on RX
//! while it has buffers, so RX needs almost no doorbells.
//!
//! # Transmit
//!
//! Queue 1. A frame is one chain: the zeroed virtio header followed by the
//! caller's pieces. With indirect descriptors the chain lives in the head's
//! indirect table and takes one ring descriptor however many pieces it has
//! (QEMU offers them by default), so zero copy does not cut the frames the
//! ring holds from 256 to 85 (a RoCE frame is header, payload and ICRC). A piece that lies inside a registered zero-copy window
//! ([`VirtioNet::add_zero_copy_window`]) gets its own descriptor pointing at
//! it; runs of other pieces are copied, with the header, into the chain's
//! bounce slot (one slot of the buffer stride per descriptor, keyed by
//! the head id, so an in-flight chain's slot is never reused). Chains are
//! published at once but the doorbell is batched: [`VirtioNet::flush`]
//! rings it (at most once), and [`Nic::receive`] and every
//! [`TX_KICK_BATCH`]th frame call it. **The loop owner must call `flush`
//! before idling**, or the last frames of a burst wait for the next
//! receive. Finished chains are reclaimed when transmit needs room and on
//! every receive.
//!
//! # Waking on receive
//!
//! The driver is polled, but an owner that halts the CPU when idle can
//! ask for one interrupt when a frame arrives:
//! [`VirtioNet::enable_rx_interrupt`] before sleeping (it reports frames
//! that are already waiting, which raised no interrupt) and
//! [`VirtioNet::disable_rx_interrupt`] once awake. Both read the ISR,
//! which de-asserts the device's INTx line, so a line asserted for an
//! earlier frame neither wakes the next sleep at once nor stays raised
//! while the loop polls. The TX queue never interrupts: finished chains
//! only free descriptors, and they are reclaimed while polling.

use alloc::vec::Vec;

use super::queue::{PushError, QueueStats, Segment, SplitQueue};
use super::transport::VirtioTransport;
use super::{feature, negotiate, read_config_bytes, InitError};
use crate::dma::{DmaPool, DmaSlice, DmaWindow};
use crate::nic::{Nic, NicError, ETHERNET_HEADER_LEN};

/// `VIRTIO_NET_F_MAC`: the device has a MAC address in its configuration.
pub const F_MAC: u64 = 1 << 5;
/// `VIRTIO_NET_F_MTU`: the device reports its largest MTU (§5.1.3).
pub const F_MTU: u64 = 1 << 3;
/// `VIRTIO_NET_F_MRG_RXBUF` (never negotiated).
pub const F_MRG_RXBUF: u64 = 1 << 15;
/// The virtio-net header with `VIRTIO_F_VERSION_1` (§5.1.6).
pub const HEADER_LEN: usize = 12;
/// The IP MTU unless configured otherwise.
pub const DEFAULT_MTU: u16 = 1500;
/// The smallest IP MTU the driver accepts (IPv4's minimum datagram).
pub const MIN_MTU: u16 = 576;
/// The largest IP MTU the driver accepts (jumbo frames).
pub const MAX_MTU: u16 = 9000;
/// Room for one VLAN tag in a received frame.
const VLAN_TAG_LEN: usize = 4;
/// Offset of `mtu` (le16) in the device configuration (§5.1.4).
const CONFIG_MTU: usize = 10;
/// Re-posted RX buffers published together.
pub const RX_PUBLISH_BATCH: u16 = 16;
/// Frames after which transmit rings the doorbell itself.
pub const TX_KICK_BATCH: u32 = 32;
/// Descriptors one frame may use (header run, pieces, bounce runs).
pub const MAX_TX_SEGMENTS: usize = 16;
/// Zero-copy windows a driver remembers.
pub const MAX_WINDOWS: usize = 4;

/// ISR status bit 0: a queue interrupt (§4.1.4.5).
const ISR_QUEUE: u8 = 1;

const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;

/// Queue sizes and the MAC fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetConfig {
    /// RX descriptors (= RX buffers): a power of two, capped by the device.
    pub rx_queue_size: u16,
    /// TX descriptors (= bounce slots): a power of two, capped by the device.
    pub tx_queue_size: u16,
    /// The MAC if the device does not offer `VIRTIO_NET_F_MAC` (or to
    /// override it).
    pub mac: Option<[u8; 6]>,
    /// The IP MTU, [`MIN_MTU`]..=[`MAX_MTU`]: frames of up to
    /// `mtu + 14` bytes are sent, and received with a VLAN tag.
    pub mtu: u16,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            rx_queue_size: 256,
            tx_queue_size: 256,
            mac: None,
            mtu: DEFAULT_MTU,
        }
    }
}

impl NetConfig {
    /// Bytes per RX buffer and per TX bounce slot: the virtio header, a
    /// frame of the MTU, a VLAN tag, rounded up to 64 bytes.
    pub fn buffer_stride(&self) -> usize {
        (HEADER_LEN + ETHERNET_HEADER_LEN + VLAN_TAG_LEN + usize::from(self.mtu))
            .next_multiple_of(64)
    }

    /// The longest frame transmitted (no VLAN tag on transmit).
    pub fn max_frame_len(&self) -> usize {
        usize::from(self.mtu) + ETHERNET_HEADER_LEN
    }

    /// DMA bytes [`VirtioNet::new`] takes from the pool at most (rings,
    /// buffers and alignment padding).
    pub fn dma_bytes(&self) -> usize {
        let ring = |size: usize| 16 * size + 4 + 2 * size + 4 + 8 * size + 32;
        let rx = usize::from(self.rx_queue_size);
        let tx = usize::from(self.tx_queue_size);
        let indirect = SplitQueue::indirect_bytes(self.tx_queue_size, MAX_TX_SEGMENTS as u16) + 16;
        ring(rx) + ring(tx) + (rx + tx) * self.buffer_stride() + 2 * 64 + indirect
    }
}

/// Counters of a [`VirtioNet`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NetStats {
    /// Frames handed to receive closures.
    pub rx_frames: u64,
    /// RX buffers dropped because the device's length was impossible
    /// (shorter than the header, or longer than the buffer).
    pub rx_bad_length: u64,
    /// Frames queued for transmission.
    pub tx_frames: u64,
    /// Pieces sent zero-copy from a window.
    pub tx_zero_copy_pieces: u64,
    /// Bytes copied into bounce slots (headers included).
    pub tx_bounced_bytes: u64,
    /// Transmit attempts refused with `Busy`.
    pub tx_busy: u64,
    /// The RX queue's counters.
    pub rx_queue: QueueStats,
    /// The TX queue's counters.
    pub tx_queue: QueueStats,
    /// Times [`VirtioNet::disable_rx_interrupt`] found the device's
    /// queue interrupt bit set (wake-ups by a frame, roughly).
    pub rx_interrupts: u64,
}

/// A polled virtio-net device.
#[derive(Debug)]
pub struct VirtioNet<T: VirtioTransport> {
    transport: T,
    mac: [u8; 6],
    features: u64,
    /// The IP MTU.
    mtu: usize,
    /// Bytes per RX buffer and TX bounce slot.
    stride: usize,
    rx: SplitQueue,
    rx_buffers: DmaSlice,
    /// Re-posted, unpublished RX buffers.
    rx_unpublished: u16,
    tx: SplitQueue,
    tx_bounce: DmaSlice,
    /// Frames queued since the last doorbell check.
    tx_unkicked: u32,
    windows: Vec<DmaWindow>,
    stats: NetStats,
}

impl<T: VirtioTransport> VirtioNet<T> {
    /// Brings the device up: negotiates features, reads the MAC, sets up
    /// both queues from `pool`, posts every RX buffer and sets DRIVER_OK.
    ///
    /// # Errors
    ///
    /// [`InitError::MissingFeatures`] (no `VERSION_1`, or no MAC and none
    /// in `config`), [`InitError::FeaturesRejected`],
    /// [`InitError::QueueUnavailable`], [`InitError::QueueTooSmall`],
    /// [`InitError::Dma`], [`InitError::BadConfig`] (an MTU outside
    /// [`MIN_MTU`]..=[`MAX_MTU`]), [`InitError::MtuAboveDevice`]. The
    /// device is left FAILED or reset.
    pub fn new(mut transport: T, pool: &mut DmaPool, config: NetConfig) -> Result<Self, InitError> {
        if !(MIN_MTU..=MAX_MTU).contains(&config.mtu) {
            return Err(InitError::BadConfig);
        }
        let required = feature::VERSION_1 | if config.mac.is_some() { 0 } else { F_MAC };
        let optional = F_MAC | F_MTU | feature::RING_INDIRECT_DESC;
        let features = negotiate(&mut transport, required, optional)?;
        let mac = match config.mac {
            Some(mac) => mac,
            None => read_config_bytes::<_, 6>(&mut transport, 0),
        };
        if features & F_MTU != 0 {
            let device = u16::from_le_bytes(read_config_bytes::<_, 2>(&mut transport, CONFIG_MTU));
            if config.mtu > device {
                transport.set_status(super::status::FAILED);
                return Err(InitError::MtuAboveDevice {
                    wanted: config.mtu,
                    device,
                });
            }
        }
        match Self::set_up(transport, pool, config, features, mac) {
            Ok(net) => Ok(net),
            Err((mut transport, error)) => {
                transport.set_status(super::status::FAILED);
                Err(error)
            }
        }
    }

    fn set_up(
        mut transport: T,
        pool: &mut DmaPool,
        config: NetConfig,
        features: u64,
        mac: [u8; 6],
    ) -> Result<Self, (T, InitError)> {
        let size = |transport: &mut T, queue: u16, wanted: u16| {
            let max = transport.queue_max_size(queue);
            if max == 0 {
                return Err(InitError::QueueUnavailable(queue));
            }
            // The largest power of two within both.
            let size = wanted.min(max);
            let size = if size == 0 {
                0
            } else {
                1 << (15 - size.leading_zeros())
            };
            if size < 2 {
                return Err(InitError::QueueTooSmall(queue));
            }
            Ok(size)
        };
        let built = (|| {
            let rx_size = size(&mut transport, RX_QUEUE, config.rx_queue_size)?;
            let tx_size = size(&mut transport, TX_QUEUE, config.tx_queue_size)?;
            let rx = SplitQueue::new(pool, RX_QUEUE, rx_size)?;
            let mut tx = SplitQueue::new(pool, TX_QUEUE, tx_size)?;
            if features & feature::RING_INDIRECT_DESC != 0 {
                tx.enable_indirect(pool, MAX_TX_SEGMENTS as u16)?;
            }
            let stride = config.buffer_stride();
            let rx_buffers = pool.alloc(usize::from(rx_size) * stride, 64)?;
            let tx_bounce = pool.alloc(usize::from(tx_size) * stride, 64)?;
            Ok::<_, InitError>((rx, tx, rx_buffers, tx_bounce))
        })();
        let (rx, tx, rx_buffers, tx_bounce) = match built {
            Ok(parts) => parts,
            Err(error) => return Err((transport, error)),
        };
        rx.enable(&mut transport);
        tx.enable(&mut transport);
        let mut windows = Vec::new();
        windows.reserve_exact(MAX_WINDOWS);
        let mut net = Self {
            transport,
            mac,
            features,
            mtu: usize::from(config.mtu),
            stride: config.buffer_stride(),
            rx,
            rx_buffers,
            rx_unpublished: 0,
            tx,
            tx_bounce,
            tx_unkicked: 0,
            windows,
            stats: NetStats::default(),
        };
        while net.post_rx_buffer() {}
        net.rx.publish();
        super::driver_ok(&mut net.transport);
        net.rx.kick(&mut net.transport);
        Ok(net)
    }

    /// Lets transmit point the device at memory in `window` instead of
    /// copying it (zero copy for payloads in registered memory). Returns
    /// `false` if [`MAX_WINDOWS`] windows are registered already.
    ///
    /// # Safety
    ///
    /// `window` must translate its virtual range to the bus addresses the
    /// device reaches it at, and the memory must stay allocated and mapped
    /// for the driver's life: the device reads a transmitted piece after
    /// `transmit` returned, until the chain completes. If the caller
    /// changes a piece's bytes before then, the frame carries the new bytes
    /// (for the engine's registered memory, which is not reused before the
    /// peer acknowledged the data, that does not happen for first
    /// transmissions).
    pub unsafe fn add_zero_copy_window(&mut self, window: DmaWindow) -> bool {
        if self.windows.len() >= MAX_WINDOWS {
            return false;
        }
        self.windows.push(window);
        true
    }

    /// The negotiated feature bits.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The counters.
    pub fn stats(&self) -> NetStats {
        NetStats {
            rx_queue: self.rx.stats(),
            tx_queue: self.tx.stats(),
            ..self.stats
        }
    }

    /// TX descriptors the device has not returned (after reclaiming): 0
    /// when every queued frame was sent.
    pub fn tx_in_flight(&mut self) -> u16 {
        self.reclaim_tx();
        self.tx.size() - self.tx.free_descriptors()
    }

    /// Rings the TX doorbell if frames were queued since the last one (and
    /// the device wants notifications) and publishes re-posted RX buffers.
    /// Call at the end of a burst and always before idling. Returns whether
    /// a doorbell rang.
    pub fn flush(&mut self) -> bool {
        self.tx_unkicked = 0;
        let mut rang = self.tx.kick(&mut self.transport);
        if self.rx_unpublished > 0 {
            self.rx_unpublished = 0;
            self.rx.publish();
        }
        rang |= self.rx.kick(&mut self.transport);
        rang
    }

    /// The transport (for the owner's diagnostics).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Asks for an interrupt when the next frame arrives, before the owner
    /// sleeps: publishes re-posted RX buffers and rings pending doorbells
    /// ([`flush`](Self::flush)), reads the ISR (de-asserting a line still
    /// raised for an earlier frame), then enables the RX queue's
    /// used-buffer interrupts and checks the ring again. Returns `true`
    /// if frames are already waiting: they raised no interrupt, so the
    /// owner must poll them instead of sleeping (interrupts stay enabled
    /// until [`disable_rx_interrupt`](Self::disable_rx_interrupt)).
    #[must_use = "frames already waiting raised no interrupt: poll them before sleeping"]
    pub fn enable_rx_interrupt(&mut self) -> bool {
        self.flush();
        self.transport.read_isr();
        self.rx.enable_interrupts()
    }

    /// Suppresses RX interrupts again once awake (so the busy loop is not
    /// interrupted) and reads the ISR, de-asserting the line if this
    /// device raised it. Returns whether the ISR's queue bit was set.
    pub fn disable_rx_interrupt(&mut self) -> bool {
        self.rx.disable_interrupts();
        let raised = self.transport.read_isr() & ISR_QUEUE != 0;
        if raised {
            self.stats.rx_interrupts += 1;
        }
        raised
    }

    /// Posts the RX buffer of the next free descriptor; `false` if none.
    fn post_rx_buffer(&mut self) -> bool {
        let Some(head) = self.rx.peek_head() else {
            return false;
        };
        let segment = Segment {
            address: self.rx_buffers.phys_at(usize::from(head) * self.stride),
            len: self.stride as u32,
            device_writes: true,
        };
        if self.rx.push(&[segment]).is_err() {
            return false;
        }
        self.rx_unpublished += 1;
        if self.rx_unpublished >= RX_PUBLISH_BATCH {
            self.rx_unpublished = 0;
            self.rx.publish();
            self.rx.kick(&mut self.transport);
        }
        true
    }

    /// Frees finished TX chains (bounded by the queue size).
    fn reclaim_tx(&mut self) {
        while self.tx.pop_used().is_some() {}
    }

    fn translate(&self, piece: &[u8]) -> Option<u64> {
        self.windows
            .iter()
            .find_map(|window| window.translate(piece))
    }
}

impl<T: VirtioTransport> Nic for VirtioNet<T> {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    /// Takes one used RX buffer (skipping, and counting, buffers with an
    /// impossible length: at most one ring's worth per call).
    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, NicError> {
        if self.tx_unkicked > 0 {
            self.flush();
        }
        self.reclaim_tx();
        for _ in 0..self.rx.size() {
            let Some(used) = self.rx.pop_used() else {
                if self.rx_unpublished > 0 {
                    self.flush();
                }
                return Ok(None);
            };
            let offset = usize::from(used.head) * self.stride;
            let frame_len = used
                .len
                .and_then(|len| (len as usize).checked_sub(HEADER_LEN))
                .filter(|len| *len <= self.stride - HEADER_LEN);
            let Some(frame_len) = frame_len else {
                self.stats.rx_bad_length += 1;
                self.post_rx_buffer();
                continue;
            };
            // SAFETY: descriptor `used.head` (whose buffer this is, the
            // RX invariant) came back through the used ring and was freed
            // by `pop_used`; it is posted again only after the closure
            // returns, and nothing writes the buffer meanwhile. The range is
            // inside the buffer (`frame_len <= STRIDE - HEADER_LEN`).
            let frame = unsafe { self.rx_buffers.slice(offset + HEADER_LEN, frame_len) };
            let result = f(frame);
            self.stats.rx_frames += 1;
            self.post_rx_buffer();
            return Ok(Some(result));
        }
        Ok(None)
    }

    fn transmit(&mut self, header: &[u8], payload: &[&[u8]]) -> Result<(), NicError> {
        let total = payload
            .iter()
            .try_fold(header.len(), |sum, piece| sum.checked_add(piece.len()));
        if total.is_none_or(|total| total > self.mtu + ETHERNET_HEADER_LEN) {
            return Err(NicError::FrameTooLong);
        }
        if self.tx.free_descriptors() < MAX_TX_SEGMENTS as u16 {
            self.reclaim_tx();
        }
        let Some(head) = self.tx.peek_head() else {
            self.stats.tx_busy += 1;
            return Err(NicError::Busy);
        };
        let slot = usize::from(head) * self.stride;
        let mut segments = [Segment {
            address: 0,
            len: 0,
            device_writes: false,
        }; MAX_TX_SEGMENTS];
        let mut count = 0;
        // The open bounce run: it starts with the zeroed virtio header.
        self.tx_bounce.fill(slot, HEADER_LEN, 0);
        let mut run_start = 0;
        let mut cursor = HEADER_LEN;
        let mut bounced = HEADER_LEN;
        let pieces = core::iter::once(header).chain(payload.iter().copied());
        for piece in pieces.filter(|piece| !piece.is_empty()) {
            // Room for this piece's descriptor, the run before it and a
            // final run after it.
            let zero_copy = if count + 3 <= MAX_TX_SEGMENTS {
                self.translate(piece)
            } else {
                None
            };
            if let Some(address) = zero_copy {
                if cursor > run_start {
                    segments[count] = Segment {
                        address: self.tx_bounce.phys_at(slot + run_start),
                        len: (cursor - run_start) as u32,
                        device_writes: false,
                    };
                    count += 1;
                    run_start = cursor;
                }
                segments[count] = Segment {
                    address,
                    len: piece.len() as u32,
                    device_writes: false,
                };
                count += 1;
                self.stats.tx_zero_copy_pieces += 1;
            } else {
                self.tx_bounce.write_bytes(slot + cursor, piece);
                cursor += piece.len();
                bounced += piece.len();
            }
        }
        if cursor > run_start {
            segments[count] = Segment {
                address: self.tx_bounce.phys_at(slot + run_start),
                len: (cursor - run_start) as u32,
                device_writes: false,
            };
            count += 1;
        }
        match self.tx.push(&segments[..count]) {
            Ok(_) => {}
            Err(PushError::Full | PushError::BadChain) => {
                self.stats.tx_busy += 1;
                return Err(NicError::Busy);
            }
        }
        self.tx.publish();
        self.stats.tx_frames += 1;
        self.stats.tx_bounced_bytes += bounced as u64;
        self.tx_unkicked += 1;
        if self.tx_unkicked >= TX_KICK_BATCH {
            self.flush();
        }
        Ok(())
    }
}
