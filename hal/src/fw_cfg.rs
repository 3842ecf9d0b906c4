//! QEMU's firmware configuration device (fw_cfg): find a named file, read
//! it by DMA.
//!
//! QEMU passes blobs to the guest with `-fw_cfg name=opt/brick/manifest,
//! file=m.bin`. On x86 the device has a selector port (0x510, 16-bit), a
//! data port (0x511, byte at a time) and a DMA address register (0x514, a
//! big-endian 64-bit address written as two 32-bit halves; writing the low
//! half at 0x518 starts the transfer). Reference:
//! <https://www.qemu.org/docs/master/specs/fw_cfg.html>.
//!
//! [`FwCfg::new`] checks the signature (key 0, "QEMU") and the DMA feature
//! bit (key 1); [`FwCfg::find_file`] walks the file directory (key 0x19:
//! a big-endian count, then 64-byte entries `size: u32be, select: u16be,
//! reserved: u16, name: [u8; 56]`) through the data port;
//! [`FwCfg::read_dma`] reads a file into a [`DmaSlice`] with one DMA
//! transfer (16 MiB in ~13 ms under TCG, against 1.6 s through the data
//! port, which [`FwCfg::read_bytes`] uses as a fallback). Everything the
//! device says (count, sizes) is checked before it is used.
//!
//! The ports are behind [`FwCfgPorts`]: [`port::IoPorts`] does real `in`/`out`
//! (x86_64 only); tests use a mock.

use core::sync::atomic::{fence, Ordering};

use crate::dma::{DmaError, DmaPool, DmaSlice};

/// The name under which QEMU passes Brick's boot manifest.
pub const MANIFEST_FILE: &str = "opt/brick/manifest";

/// Keys (selectors).
pub mod key {
    /// "QEMU" signature.
    pub const SIGNATURE: u16 = 0x0000;
    /// Feature bitmap (bit 0: traditional interface, bit 1: DMA).
    pub const ID: u16 = 0x0001;
    /// The file directory.
    pub const FILE_DIR: u16 = 0x0019;
}

/// The DMA interface bit of [`key::ID`].
const FEATURE_DMA: u32 = 1 << 1;
/// DMA control bits.
const CONTROL_ERROR: u32 = 1;
const CONTROL_READ: u32 = 2;
const CONTROL_SELECT: u32 = 8;
/// Length of a directory entry and of its name field.
const ENTRY_LEN: usize = 64;
const NAME_LEN: usize = 56;
/// Reads of the control word before a DMA transfer counts as stuck (QEMU
/// finishes the transfer before the port write returns).
const DMA_POLLS: u32 = 1_000_000;

/// The fw_cfg ports as the driver uses them.
pub trait FwCfgPorts {
    /// Writes the selector port (0x510).
    fn select(&mut self, key: u16);
    /// Reads one byte from the data port (0x511) and advances.
    fn read_data(&mut self) -> u8;
    /// Writes the bus address of a DMA access structure to the DMA
    /// register (0x514/0x518), which starts the transfer.
    fn start_dma(&mut self, access_address: u64);
}

/// Why fw_cfg access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FwCfgError {
    /// No "QEMU" signature: no fw_cfg device.
    NotPresent,
    /// The device lacks the DMA interface.
    NoDma,
    /// The device set the error bit of a DMA transfer.
    DmaFailed,
    /// A DMA transfer did not finish.
    Timeout,
    /// No DMA memory for the access structure.
    Dma(DmaError),
}

impl core::fmt::Display for FwCfgError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotPresent => f.write_str("no QEMU fw_cfg device"),
            Self::NoDma => f.write_str("fw_cfg has no DMA interface"),
            Self::DmaFailed => f.write_str("fw_cfg DMA transfer failed"),
            Self::Timeout => f.write_str("fw_cfg DMA transfer timed out"),
            Self::Dma(error) => write!(f, "fw_cfg DMA memory: {error}"),
        }
    }
}

impl core::error::Error for FwCfgError {}

/// A file in the fw_cfg directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwCfgFile {
    /// Its selector key.
    pub select: u16,
    /// Its size in bytes.
    pub size: u32,
}

/// The fw_cfg device.
#[derive(Debug)]
pub struct FwCfg<P: FwCfgPorts> {
    ports: P,
    /// The 16-byte DMA access structure (control, length, address; all
    /// big-endian).
    access: DmaSlice,
    dma: bool,
}

impl<P: FwCfgPorts> FwCfg<P> {
    /// Checks the signature and features; takes 16 bytes from `pool` for
    /// the DMA access structure.
    ///
    /// # Errors
    ///
    /// [`FwCfgError::NotPresent`] or [`FwCfgError::Dma`].
    pub fn new(mut ports: P, pool: &mut DmaPool) -> Result<Self, FwCfgError> {
        ports.select(key::SIGNATURE);
        let signature = read_array::<_, 4>(&mut ports);
        if &signature != b"QEMU" {
            return Err(FwCfgError::NotPresent);
        }
        ports.select(key::ID);
        let features = u32::from_le_bytes(read_array(&mut ports));
        let access = pool.alloc(16, 16).map_err(FwCfgError::Dma)?;
        Ok(Self {
            ports,
            access,
            dma: features & FEATURE_DMA != 0,
        })
    }

    /// Whether the DMA interface is available.
    pub fn has_dma(&self) -> bool {
        self.dma
    }

    /// Looks `name` up in the file directory (through the data port; the
    /// directory is small). `Ok(None)` if there is no such file.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for a DMA directory read.
    pub fn find_file(&mut self, name: &str) -> Result<Option<FwCfgFile>, FwCfgError> {
        let name = name.as_bytes();
        if name.len() >= NAME_LEN {
            return Ok(None);
        }
        self.ports.select(key::FILE_DIR);
        let count = u32::from_be_bytes(read_array(&mut self.ports));
        // A count the device made up cannot make us loop for long: QEMU
        // has at most a few hundred files (FW_CFG_FILE_SLOTS).
        for _ in 0..count.min(4096) {
            let entry = read_array::<_, ENTRY_LEN>(&mut self.ports);
            let entry_name = &entry[8..];
            let end = entry_name
                .iter()
                .position(|byte| *byte == 0)
                .unwrap_or(NAME_LEN);
            if &entry_name[..end] == name {
                return Ok(Some(FwCfgFile {
                    size: u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]),
                    select: u16::from_be_bytes([entry[4], entry[5]]),
                }));
            }
        }
        Ok(None)
    }

    /// Reads the start of `file` into `target` by DMA: `min(file.size,
    /// target.len())` bytes, returned.
    ///
    /// # Errors
    ///
    /// [`FwCfgError::NoDma`], [`FwCfgError::DmaFailed`],
    /// [`FwCfgError::Timeout`].
    pub fn read_dma(&mut self, file: FwCfgFile, target: &DmaSlice) -> Result<usize, FwCfgError> {
        if !self.dma {
            return Err(FwCfgError::NoDma);
        }
        let len = (file.size as usize).min(target.len());
        let control = (u32::from(file.select) << 16) | CONTROL_SELECT | CONTROL_READ;
        self.access.write_bytes(0, &control.to_be_bytes());
        self.access.write_bytes(4, &(len as u32).to_be_bytes());
        self.access.write_bytes(8, &target.phys().to_be_bytes());
        // The access structure must be in memory before the device reads it.
        fence(Ordering::SeqCst);
        self.ports.start_dma(self.access.phys());
        for _ in 0..DMA_POLLS {
            fence(Ordering::SeqCst);
            let mut control = [0; 4];
            self.access.read_bytes(0, &mut control);
            let control = u32::from_be_bytes(control);
            if control & CONTROL_ERROR != 0 {
                return Err(FwCfgError::DmaFailed);
            }
            if control == 0 {
                return Ok(len);
            }
            core::hint::spin_loop();
        }
        Err(FwCfgError::Timeout)
    }

    /// Reads the start of `file` into `target` through the data port (slow:
    /// one port read per byte); returns the bytes read.
    pub fn read_bytes(&mut self, file: FwCfgFile, target: &mut [u8]) -> usize {
        let len = (file.size as usize).min(target.len());
        self.ports.select(file.select);
        for byte in &mut target[..len] {
            *byte = self.ports.read_data();
        }
        len
    }

    /// The ports (for tests and diagnostics).
    pub fn ports(&self) -> &P {
        &self.ports
    }
}

fn read_array<P: FwCfgPorts, const N: usize>(ports: &mut P) -> [u8; N] {
    let mut bytes = [0; N];
    for byte in &mut bytes {
        *byte = ports.read_data();
    }
    bytes
}

/// Real port I/O (x86_64 only).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub mod port {
    use core::arch::asm;
    use x86_64::instructions::port::{Port, PortWriteOnly};

    /// The selector port.
    const SELECTOR: u16 = 0x510;
    /// The data port.
    const DATA: u16 = 0x511;
    /// The DMA address register: high half here, low half at +4.
    const DMA_HIGH: u16 = 0x514;
    const DMA_LOW: u16 = 0x518;

    /// The fw_cfg ports of a QEMU x86 machine.
    #[derive(Debug)]
    pub struct IoPorts {
        selector: PortWriteOnly<u16>,
        data: Port<u8>,
        dma_high: PortWriteOnly<u32>,
    }

    impl IoPorts {
        /// The ports.
        ///
        /// # Safety
        ///
        /// The code must run with I/O privilege (ring 0 in the image) on a
        /// machine whose ports 0x510–0x51b are QEMU's fw_cfg, and nothing
        /// else may use them meanwhile. Calling it in a hosted process
        /// faults.
        pub unsafe fn new() -> Self {
            Self {
                selector: PortWriteOnly::new(SELECTOR),
                data: Port::new(DATA),
                dma_high: PortWriteOnly::new(DMA_HIGH),
            }
        }
    }

    impl super::FwCfgPorts for IoPorts {
        fn select(&mut self, key: u16) {
            // SAFETY: the fw_cfg selector port (`new`'s contract); a write
            // of a key has no effect on memory.
            unsafe { self.selector.write(key) }
        }

        fn read_data(&mut self) -> u8 {
            // SAFETY: the fw_cfg data port (`new`'s contract); reading it
            // only advances the device's offset.
            unsafe { self.data.read() }
        }

        fn start_dma(&mut self, access_address: u64) {
            let high = ((access_address >> 32) as u32).swap_bytes();
            let low = (access_address as u32).swap_bytes();
            // SAFETY: the DMA register's high half (`new`'s contract); it
            // starts nothing by itself.
            unsafe { self.dma_high.write(high) }
            // The low half starts the transfer, which writes memory: it is
            // the one port write here that must not be `nomem` (as the
            // `x86_64` crate's `Port` is), so the compiler keeps the access
            // structure's stores before it and the caller's loads after it.
            // SAFETY: the transfer writes the memory the access structure
            // names, which the caller (`read_dma`) owns as a `DmaSlice`.
            unsafe {
                asm!("out dx, eax", in("dx") DMA_LOW, in("eax") low, options(nostack, preserves_flags));
            }
        }
    }
}
