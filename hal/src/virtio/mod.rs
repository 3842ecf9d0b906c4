//! Polled virtio drivers: split virtqueues, virtio-net and virtio-blk.
//!
//! VIRTIO 1.1 (<https://docs.oasis-open.org/virtio/virtio/v1.1/virtio-v1.1.html>),
//! modern devices only (`VIRTIO_F_VERSION_1`), polled: the image's loop
//! polls the used rings and does all the work there. The one use of
//! interrupts is waking a halted CPU when a frame arrives (virtio-net's RX
//! queue, INTx: [`net::VirtioNet::enable_rx_interrupt`]). Layers, each
//! testable on the host:
//!
//! * [`transport::VirtioTransport`]: the device's registers (common
//!   configuration, notification, device configuration) as a small trait.
//!   [`transport::PciTransport`] does it with volatile MMIO at the BAR
//!   addresses a PCI probe found; tests use a mock.
//! * [`queue::SplitQueue`]: a split virtqueue (§2.6) in memory from a
//!   [`DmaPool`](crate::dma::DmaPool). It trusts nothing it reads from the
//!   device: used ids it never gave out, lengths beyond a buffer and a used
//!   index that jumps are counted in [`queue::QueueStats`] and ignored.
//! * [`net::VirtioNet`] implements [`Nic`](crate::Nic) and
//!   [`blk::VirtioBlk`] implements [`BlockDevice`](crate::BlockDevice).
//!
//! Device initialisation follows §3.1.1: reset, ACKNOWLEDGE, DRIVER, read
//! and negotiate features, FEATURES_OK (and check it stuck), set up the
//! queues, DRIVER_OK ([`negotiate`] and [`InitError`]).
//!
//! # Allocation
//!
//! Drivers allocate their bookkeeping (`alloc`) and DMA memory at
//! construction; receive, transmit, submit and poll never allocate.

pub mod blk;
#[allow(unsafe_code)]
pub mod net;
pub mod queue;
#[allow(unsafe_code)]
pub mod transport;

use transport::VirtioTransport;

/// Device status bits (§2.1).
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 64;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 128;
}

/// Device-independent feature bits (§6).
pub mod feature {
    /// Descriptors may point to indirect tables (virtio-net's TX queue).
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    /// The used/avail event index mechanism (not used).
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// A modern (VIRTIO 1.x) device: mandatory here.
    pub const VERSION_1: u64 = 1 << 32;
    /// The device needs the platform's address translation (IOMMU).
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// Why a virtio device could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InitError {
    /// The device does not offer these required feature bits (for example
    /// [`feature::VERSION_1`] on a legacy-only device).
    MissingFeatures(u64),
    /// The device cleared FEATURES_OK: it rejected the negotiated subset.
    FeaturesRejected,
    /// The device did not come out of reset.
    ResetTimeout,
    /// The queue with this index does not exist (size 0).
    QueueUnavailable(u16),
    /// The device's maximum size for this queue is too small for the driver
    /// (or not a power of two).
    QueueTooSmall(u16),
    /// Not enough DMA memory for the rings and buffers.
    Dma(crate::dma::DmaError),
    /// The configuration is unusable (a zero size or depth, a block size
    /// that is not a power of two, a capacity that overflows, an MTU out of
    /// range).
    BadConfig,
    /// The configured MTU is above the largest the device reports.
    MtuAboveDevice {
        /// The configured IP MTU.
        wanted: u16,
        /// The device's largest (`VIRTIO_NET_F_MTU`).
        device: u16,
    },
}

impl core::fmt::Display for InitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::MissingFeatures(bits) => {
                write!(f, "device lacks required virtio features {bits:#x}")?;
                if bits & feature::VERSION_1 != 0 {
                    f.write_str(" (VIRTIO_F_VERSION_1: legacy-only device?)")?;
                }
                Ok(())
            }
            Self::FeaturesRejected => f.write_str("device rejected the negotiated features"),
            Self::ResetTimeout => f.write_str("device did not reset"),
            Self::QueueUnavailable(queue) => write!(f, "virtqueue {queue} does not exist"),
            Self::QueueTooSmall(queue) => write!(f, "virtqueue {queue} is too small"),
            Self::Dma(error) => write!(f, "DMA memory: {error}"),
            Self::BadConfig => f.write_str("unusable device or driver configuration"),
            Self::MtuAboveDevice { wanted, device } => write!(
                f,
                "MTU {wanted} wanted, the device carries {device} at most (QEMU: host_mtu=)"
            ),
        }
    }
}

impl core::error::Error for InitError {}

impl From<crate::dma::DmaError> for InitError {
    fn from(error: crate::dma::DmaError) -> Self {
        Self::Dma(error)
    }
}

/// How many times [`negotiate`] reads the status back after a reset.
const RESET_POLLS: u32 = 1_000_000;

/// Resets the device and negotiates features (§3.1.1 steps 1–6): accepts
/// `required | (optional & offered)`. On success the status is
/// ACKNOWLEDGE | DRIVER | FEATURES_OK; the caller sets up queues and then
/// calls [`driver_ok`]. On failure the FAILED bit is set.
///
/// # Errors
///
/// [`InitError::MissingFeatures`] (the bits of `required` not offered),
/// [`InitError::FeaturesRejected`], [`InitError::ResetTimeout`].
pub fn negotiate<T: VirtioTransport + ?Sized>(
    transport: &mut T,
    required: u64,
    optional: u64,
) -> Result<u64, InitError> {
    transport.set_status(0);
    let mut polls = 0;
    while transport.status() != 0 {
        polls += 1;
        if polls >= RESET_POLLS {
            return Err(InitError::ResetTimeout);
        }
        core::hint::spin_loop();
    }
    transport.set_status(status::ACKNOWLEDGE);
    transport.set_status(status::ACKNOWLEDGE | status::DRIVER);
    let offered = transport.device_features();
    let missing = required & !offered;
    if missing != 0 {
        transport.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FAILED);
        return Err(InitError::MissingFeatures(missing));
    }
    let accepted = required | (optional & offered);
    transport.set_driver_features(accepted);
    let ready = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    transport.set_status(ready);
    if transport.status() & status::FEATURES_OK == 0 {
        transport.set_status(ready | status::FAILED);
        return Err(InitError::FeaturesRejected);
    }
    Ok(accepted)
}

/// Sets DRIVER_OK (§3.1.1 step 8): the device is live.
pub fn driver_ok<T: VirtioTransport + ?Sized>(transport: &mut T) {
    transport
        .set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
}

/// Retries `read` while the configuration generation changes around it
/// (§4.1.4.3.1), at most 16 times (then the last read is returned).
fn consistent<T: VirtioTransport + ?Sized, R>(
    transport: &mut T,
    mut read: impl FnMut(&mut T) -> R,
) -> R {
    for _ in 1..16 {
        let before = transport.config_generation();
        let value = read(transport);
        if transport.config_generation() == before {
            return value;
        }
    }
    read(transport)
}

/// Reads `N` byte-wide fields of device configuration at `offset`
/// consistently (a MAC address).
pub fn read_config_bytes<T: VirtioTransport + ?Sized, const N: usize>(
    transport: &mut T,
    offset: usize,
) -> [u8; N] {
    consistent(transport, |transport| {
        let mut bytes = [0; N];
        for (index, byte) in bytes.iter_mut().enumerate() {
            *byte = transport.read_config_u8(offset + index);
        }
        bytes
    })
}

/// Reads the 32-bit device configuration field at `offset` consistently.
pub fn read_config_u32<T: VirtioTransport + ?Sized>(transport: &mut T, offset: usize) -> u32 {
    consistent(transport, |transport| transport.read_config_u32(offset))
}

/// Reads the 64-bit device configuration field at `offset` consistently
/// (two 32-bit accesses, low half first, under one generation).
pub fn read_config_u64<T: VirtioTransport + ?Sized>(transport: &mut T, offset: usize) -> u64 {
    consistent(transport, |transport| {
        let low = transport.read_config_u32(offset);
        let high = transport.read_config_u32(offset + 4);
        u64::from(low) | (u64::from(high) << 32)
    })
}
