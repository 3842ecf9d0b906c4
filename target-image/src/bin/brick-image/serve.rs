//! Serving: the virtio-net NICs, the engine and the poll loop.
//!
//! [`open_nics`] claims the modern virtio-net functions (`1af4:1041`) the
//! PCI walk found: memory space and bus mastering on, the virtio vendor
//! capabilities parsed into [`PciRegions`], a [`PciTransport`] over them
//! and one [`VirtioNet`] per manifest interface, with rings and buffers
//! from a [`DmaPool`] over the ring part of the boot pool (identity-mapped:
//! virtual == bus address). Interface `i` takes the first unclaimed NIC
//! whose device MAC equals its manifest MAC, else the first unclaimed NIC
//! in PCI order. The driver always uses the manifest MAC (the engine puts
//! it in every frame it sends); QEMU's virtio-net does not filter received
//! frames by MAC unless the guest programs a filter, so a device MAC that
//! differs only shows in the log (`cargo xtask run-image --nic` gives QEMU
//! the manifest MAC, so they agree).
//!
//! [`serve`] runs on its own stack (the caller switches with
//! [`on_stack`]; [`ENGINE_STACK_BYTES`]: building the engine overflows the
//! 256 KiB boot stack), checks that the heap holds the engine's registered
//! arenas (allocated from the heap; the boot pool holds only the drivers'
//! DMA memory), builds the engine ([`Volume`]: RAM volumes and virtio-blk
//! disks (`1af4:1042`) at the manifest's PCI addresses or with its serials
//! ([`choose_disks`], before the NICs are opened), rings and bounce
//! slots from the same DMA pool as the NICs, chunks transferred in place
//! through [`Engine::set_identity_dma`]; keys from RDRAND) and runs the loop of
//! `brick-target`: a bounded receive burst per NIC into
//! `Engine::receive`, `Engine::poll` transmitting through the NICs, a
//! `flush` per NIC (TX doorbells are batched), then idling.
//!
//! # Idling: halt until the next deadline or frame
//!
//! The drivers are polled and all work happens in the loop; an interrupt
//! only ends a `hlt`. After activity the loop keeps polling for
//! [`SPIN_NS`]; then, if the engine has nothing due, [`FrameWake::halt`]
//! sleeps until the engine's next deadline, at most [`MAX_HALT_NS`] (the
//! PIT one-shot), or until a frame arrives:
//!
//! 1. each NIC publishes its RX buffers, reads its ISR (de-asserting its
//!    INTx line) and enables RX used-buffer interrupts, then re-checks
//!    its RX used ring ([`VirtioNet::enable_rx_interrupt`]); a frame that
//!    arrived before the device saw the change raised no interrupt, so if
//!    one is waiting the loop polls instead of halting;
//! 2. `sti; hlt` with the NICs' lines unmasked on the PIC (interrupts are
//!    off until then, so an interrupt raised after the re-check is held
//!    by the PIC and ends the `hlt` at once);
//! 3. awake, each NIC suppresses RX interrupts again and reads its ISR
//!    ([`VirtioNet::disable_rx_interrupt`]), so the busy loop is never
//!    interrupted and no line stays asserted.
//!
//! The line is the PCI Interrupt Line the firmware routed (INTx: MSI-X is
//! never enabled); virtio-blk disks get INTx disabled in their PCI command
//! register, so a shared line is only ever raised by a NIC. Disks and TX
//! completions do not interrupt: while a disk request is in flight the
//! engine's `poll_at` is due at once and the loop polls without halting,
//! and TX chains only need reclaiming, which polling does.
//!
//! Fallback: if a NIC has no usable line, halts last at most
//! [`HALT_SLICE_NS`] (a frame is then seen within a slice). The same
//! happens, with the lines masked again, after [`STUCK_WAKES`] early
//! wake-ups in a row that no NIC raised: a line held asserted by
//! something else would otherwise turn every halt into a spin.
//!
//! Unsafe: the transport's construction (register addresses vouched for
//! by the PCI probe), the DMA region (carved from free RAM), the engine's
//! identity-DMA promise and the stack switch in [`on_stack`].

#![allow(unsafe_code)]

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use hal::block::{BlockDevice, Either};
use hal::dma::{DmaPool, DmaRegion, DmaWindow};
use hal::nvme::regs::MmioRegisters;
use hal::nvme::{ControllerConfig, NvmeController, NvmeNamespace};
use hal::pci::{Bar, Function, Intx, Mechanism};
use hal::virtio::blk::{BlkConfig, DeviceId, VirtioBlk};
use hal::virtio::net::{NetConfig, VirtioNet};
use hal::virtio::read_config_bytes;
use hal::virtio::transport::{PciRegions, PciTransport, VirtioTransport};
use hal::{Clock, Idle, Nic};
use manifest::binary::{Backing, Manifest};
use manifest::types::{VirtioSelector, VolumeKind};
use rtrs::server::ServerConfig;
use target_image::boot::claim::{
    choose_device, claim_nics, AfterWake, Candidate, ChoiceError, HaltPolicy,
};
use target_image::boot::memory::Range;
use target_image::boot::pvh::Bytes;
use target_image::{BuildError, Chunk, Engine, Port};
use verbs::KeySource;

use crate::clock::Tsc;
use crate::interrupts::PitIdle;
use crate::port::{exit, ExitCode};

/// PCI vendor id of virtio devices.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// PCI device id of a modern (non-transitional) virtio-net device.
pub const VIRTIO_NET_MODERN: u16 = 0x1041;
/// PCI device id of a modern (non-transitional) virtio-blk device.
pub const VIRTIO_BLK_MODERN: u16 = 0x1042;
/// Virtio capabilities remembered per device (QEMU has five).
const MAX_VIRTIO_CAPABILITIES: usize = 8;
/// Frames taken from one NIC per loop turn (bounds the work per turn).
const RX_BURST: usize = 32;
/// How long the loop keeps polling after the last activity before halting.
pub const SPIN_NS: u64 = 2_000_000;
/// Longest halt while a frame wakes the CPU (within the PIT one-shot's
/// ~55 ms): with no deadline the loop wakes 20 times a second.
pub const MAX_HALT_NS: u64 = 50_000_000;
/// Longest halt when frames cannot wake the CPU (a NIC without a usable
/// interrupt line): a frame waits up to this long.
pub const HALT_SLICE_NS: u64 = 1_000_000;
/// Early wake-ups in a row that no NIC raised before the NICs' lines are
/// deemed stuck (masked; halts sliced).
pub const STUCK_WAKES: u32 = 64;
/// Statistics are logged every this often while frames flow.
const STATS_EVERY_NS: u64 = 30_000_000_000;

/// The image's NIC type.
pub type Net = VirtioNet<PciTransport>;
/// A virtio-blk disk or an NVMe namespace whose requests carry handles `H`.
pub type DiskOf<H> = Either<VirtioBlk<H, PciTransport>, NvmeNamespace<H, MmioRegisters>>;
/// The image's disk type: a virtio-blk disk or an NVMe namespace.
pub type Disk = DiskOf<Chunk>;

/// A volume of the image: RAM, a disk, or a thin volume on a pool disk.
pub type Volume = target_image::RamOr<Box<Either<Disk, crate::thin_pools::Thin>>>;

/// An IRQ line (or its absence) for the log.
struct Irq(Option<u8>);

impl fmt::Display for Irq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(irq) => write!(f, "{irq}"),
            None => f.write_str("none"),
        }
    }
}

/// A MAC address for the log.
struct Mac([u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

fn fail(code: ExitCode, args: fmt::Arguments<'_>) -> ! {
    log!("FATAL: {args}");
    exit(code)
}

/// Whether `function` is a modern virtio-net device.
pub fn is_virtio_net(function: &Function) -> bool {
    function.vendor == VIRTIO_VENDOR && function.device == VIRTIO_NET_MODERN
}

/// Whether `function` is a modern virtio-blk device.
pub fn is_virtio_blk(function: &Function) -> bool {
    function.vendor == VIRTIO_VENDOR && function.device == VIRTIO_BLK_MODERN
}

/// Whether `function` is an NVMe controller (class 01:08:02: mass
/// storage, non-volatile memory, NVM Express).
pub fn is_nvme(function: &Function) -> bool {
    function.class == [0x01, 0x08, 0x02]
}

/// Refuses (exit [`ExitCode::Unsupported`]) a manifest with a volume kind
/// the image does not serve: it serves RAM, virtio-blk and NVMe volumes
/// ([`choose_disks`]) and thin volumes on virtio-blk and NVMe pools
/// ([`crate::thin_pools`]); files and host block devices (as volumes or pools)
/// are the hosted target's.
pub fn check_volume_kinds(manifest: &Manifest<'_>) {
    let mut refused = 0;
    for volume in manifest.volumes() {
        let why = match volume.backing {
            Backing::Ram { .. } | Backing::VirtioBlk(_) | Backing::Nvme { .. } => continue,
            Backing::Thin { pool, .. } if pool.backing.is_device() => continue,
            Backing::Thin { .. } => {
                "its pool is a file or block device: the image takes thin volumes on \
                 virtio-blk and nvme pools"
            }
            _ => "not served by the image (RAM, virtio-blk, NVMe and thin volumes only)",
        };
        log!(
            "volume {}: kind {}: {why}",
            volume.name,
            volume.backing.kind().as_str()
        );
        refused += 1;
    }
    if refused > 0 {
        fail(
            ExitCode::Unsupported,
            format_args!("{refused} volume(s) the image cannot serve: manifest refused"),
        );
    }
}

/// Whether `[address, address + len)` is mapped for the image to reach
/// (the identity map, extended for MMIO above it by `memory::map_mmio`).
fn reachable(address: u64, len: u64) -> bool {
    address != 0 && crate::memory::map_mmio(address, len).is_ok()
}

/// The register blocks of a virtio function, or why not.
fn regions(pci: &Mechanism, function: &Function) -> Result<PciRegions, &'static str> {
    let capabilities =
        hal::pci::virtio_capabilities::<_, MAX_VIRTIO_CAPABILITIES>(pci, function.address);
    let mut bars = [0u64; 6];
    for (slot, bar) in bars.iter_mut().zip(function.bars) {
        if let Some(Bar::Memory { address, .. }) = bar {
            *slot = address;
        }
    }
    let regions = PciRegions::from_capabilities(&bars, &capabilities)
        .ok_or("no common, notify or device virtio capability in a memory BAR")?;
    if !reachable(regions.common, u64::from(regions.common_len))
        || !reachable(regions.notify, u64::from(regions.notify_len))
        || !reachable(regions.device, u64::from(regions.device_len))
        || (regions.isr_len > 0 && !reachable(regions.isr, u64::from(regions.isr_len)))
    {
        return Err("a register block lies outside what the image can map");
    }
    Ok(regions)
}

/// A transport for `function` (memory space and bus master enabled, INTx
/// as `intx` says), or why not.
fn transport(
    pci: &Mechanism,
    function: &Function,
    intx: Intx,
) -> Result<PciTransport, &'static str> {
    let command = hal::pci::enable_memory_and_bus_master(pci, function.address, intx);
    if command & 0b110 != 0b110 {
        return Err("memory space or bus master did not stick");
    }
    let regions = regions(pci, function)?;
    // SAFETY: `regions` come from this function's own virtio capabilities
    // and its firmware-assigned memory BARs, mapped by `reachable`
    // (virtual == physical); memory decoding and bus mastering were just
    // enabled; at most one transport per function exists at a time (a
    // NIC's is made once; a disk's probe transport is dropped after its
    // reset, in `probe_disk`, before the volume's is made in `open_disk`)
    // and nothing else touches its registers.
    unsafe { PciTransport::new(regions) }.ok_or("register block missing or too short")
}

/// The DMA pool over `dma`, the pool carved at boot (rings, frame buffers,
/// bounce slots of every NIC and disk).
pub fn dma_pool(dma: Range) -> DmaPool {
    let len = usize::try_from(dma.len()).unwrap_or(0);
    // SAFETY: `dma` was carved from the free RAM of the memory map (not
    // the image, the heap or loader data) below the 4 GiB identity map, so
    // virtual == physical and QEMU's devices reach it at that address (no
    // IOMMU); only the DMA pool uses it, for as long as the image runs.
    match unsafe { DmaRegion::new(dma.start as usize as *mut u8, dma.start, len) } {
        Ok(region) => DmaPool::new(region),
        Err(error) => fail(ExitCode::Failure, format_args!("DMA region {dma}: {error}")),
    }
}

/// An opened NIC and the legacy IRQ its INTx pin is routed to (`None`:
/// its frames cannot wake the CPU).
pub struct OpenNic {
    /// The driver.
    pub net: Net,
    /// The PIC line, from the PCI Interrupt Line register.
    pub irq: Option<u8>,
}

/// Brings up one [`Net`] per manifest interface from the virtio-net
/// `functions` (PCI order, [`claim_nics`]), with rings and buffers from
/// `pool`. Exits with [`ExitCode::NoNic`] if a NIC is missing or fails to
/// start.
pub fn open_nics(
    pci: &Mechanism,
    functions: &[Function],
    manifest: &Manifest<'_>,
    pool: &mut DmaPool,
) -> Vec<OpenNic> {
    let mut transports: Vec<Option<(PciTransport, [u8; 6])>> = functions
        .iter()
        .map(|function| match transport(pci, function, Intx::Enabled) {
            Ok(mut transport) => {
                let mac = read_config_bytes::<_, 6>(&mut transport, 0);
                Some((transport, mac))
            }
            Err(why) => {
                log!("net: pci {}: not usable: {why}", function.address);
                None
            }
        })
        .collect();
    let macs: Vec<Option<[u8; 6]>> = transports
        .iter()
        .map(|t| t.as_ref().map(|(_, mac)| *mac))
        .collect();
    let wanted: Vec<[u8; 6]> = manifest.interfaces().map(|i| i.mac.0).collect();
    let slots = match claim_nics(&macs, &wanted) {
        Ok(slots) => slots,
        Err(index) => {
            let interface = manifest.interfaces().nth(index);
            fail(
                ExitCode::NoNic,
                format_args!(
                    "interface {index} ({}): no usable virtio-net device left ({} found): boot \
                     QEMU with one -device virtio-net-pci per interface",
                    interface.map_or(alloc::string::String::new(), |i| alloc::format!("{i}")),
                    functions.len()
                ),
            )
        }
    };
    let mut nics = Vec::new();
    for (interface, slot) in manifest.interfaces().zip(slots) {
        let wanted = interface.mac.0;
        let Some((mut transport, device_mac)) = transports[slot].take() else {
            continue;
        };
        let offered = transport.device_features();
        let net_config = NetConfig {
            mac: Some(wanted),
            ..target_image::virtio_net_config(interface.mtu)
        };
        let net = match VirtioNet::new(transport, pool, net_config) {
            Ok(net) => net,
            Err(error) => fail(
                ExitCode::NoNic,
                format_args!(
                    "interface {} on pci {}: virtio-net: {error}",
                    interface.name, functions[slot].address
                ),
            ),
        };
        let agreement = if device_mac == wanted {
            "matches the manifest"
        } else if offered & hal::virtio::net::F_MAC == 0 {
            "device offers no MAC; the manifest MAC is used"
        } else {
            "differs: frames carry the manifest MAC (QEMU does not filter)"
        };
        let irq = hal::pci::legacy_irq(pci, functions[slot].address);
        log!(
            "net: interface {} on pci {}: device MAC {} {agreement}; MTU {}, features {:#x}, IRQ {}, DMA left {} KiB",
            interface.name,
            functions[slot].address,
            Mac(device_mac),
            net.mtu(),
            net.features(),
            Irq(irq),
            pool.remaining() / 1024
        );
        nics.push(OpenNic { net, irq });
    }
    nics
}

/// How long a disk may take to answer `VIRTIO_BLK_T_GET_ID` (QEMU answers
/// at once; a device that never does costs the boot this much).
const GET_ID_TIMEOUT_NS: u64 = 200_000_000;

/// The driver configuration of a probe: the smallest queue, no bounce
/// buffers (a few hundred bytes of the pool per disk).
const PROBE_CONFIG: BlkConfig = BlkConfig {
    queue_depth: 1,
    queue_size: 4,
    max_transfer: 1 << 20,
    bounce: false,
};

/// What the probe of one virtio-blk function found.
struct Probe {
    /// Its ID (serial; empty: none), or why there is none.
    serial: Result<DeviceId, String>,
    /// Its size in bytes, if it came up.
    size: Option<u64>,
}

/// A serial (or its absence) for the log.
struct SerialOf<'a>(&'a Result<DeviceId, String>);

impl fmt::Display for SerialOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Ok(id) if id.is_empty() => f.write_str("no serial"),
            Ok(id) => write!(f, "serial \"{id}\""),
            Err(why) => write!(f, "serial unknown ({why})"),
        }
    }
}

/// Brings up `function` with [`PROBE_CONFIG`], reads its size and its
/// serial (`VIRTIO_BLK_T_GET_ID`), then resets it.
fn probe_disk(pci: &Mechanism, function: &Function, pool: &mut DmaPool, clock: &Tsc) -> Probe {
    let transport = match transport(pci, function, Intx::Disabled) {
        Ok(transport) => transport,
        Err(why) => {
            return Probe {
                serial: Err(why.into()),
                size: None,
            }
        }
    };
    let mut disk = match VirtioBlk::<(), PciTransport>::new(transport, pool, PROBE_CONFIG) {
        Ok(disk) => disk,
        Err(error) => {
            return Probe {
                serial: Err(alloc::format!("virtio-blk: {error}")),
                size: None,
            }
        }
    };
    let size = disk.info().size;
    let serial = disk
        .read_device_id(clock, GET_ID_TIMEOUT_NS)
        .map_err(|error| alloc::format!("GET_ID: {error}"));
    // The reset also takes back a GET_ID the device never answered.
    let serial = match disk.reset() {
        Ok(_transport) => serial,
        Err(error) => Err(alloc::format!("after GET_ID: {error}")),
    };
    Probe {
        serial,
        size: Some(size),
    }
}

/// An NVMe controller the image brought up (or why not).
struct Controller {
    function: Function,
    controller: Result<NvmeController<MmioRegisters>, String>,
    /// Identify Controller's serial, if it came up.
    serial: Option<hal::nvme::IdString<20>>,
}

/// How long an NVMe controller may take to come up and answer each admin
/// command (QEMU's CAP.TO is 7.5 s, far beyond what it takes).
const NVME_TIMEOUT_NS: u64 = 2_000_000_000;

/// Brings up the NVMe controller at `function`: memory space and bus
/// mastering on (INTx off: polled), BAR0 sized and mapped, reset, enabled,
/// identified, admin queue from `pool`.
fn probe_nvme(
    pci: &Mechanism,
    function: &Function,
    pool: &mut DmaPool,
    clock: &Tsc,
) -> Result<NvmeController<MmioRegisters>, String> {
    let Some(base) = function.memory_bar(0) else {
        return Err("no memory BAR0".into());
    };
    let len = hal::pci::bar_size(pci, function.address, 0).ok_or("BAR0 cannot be sized")?;
    let command = hal::pci::enable_memory_and_bus_master(pci, function.address, Intx::Disabled);
    if command & 0b110 != 0b110 {
        return Err("memory space or bus master did not stick".into());
    }
    if !reachable(base, len) {
        return Err(alloc::format!(
            "BAR0 [{base:#x}, +{len:#x}) is outside what the image can map"
        ));
    }
    let len = usize::try_from(len).map_err(|_| "BAR0 too large")?;
    // SAFETY: BAR0 of this NVMe function as the firmware assigned it and
    // as sized just now, mapped by `reachable`; decoding is on; one
    // controller value per function (probed once, kept in `Disks`), and
    // only the NVMe driver touches its registers.
    let registers = unsafe { MmioRegisters::new(base as usize as *mut u8, len) }
        .ok_or("BAR0 misaligned or shorter than the admin doorbells")?;
    let config = ControllerConfig {
        timeout_ns: Some(NVME_TIMEOUT_NS),
        ..ControllerConfig::default()
    };
    NvmeController::new(registers, pool, clock, config).map_err(|error| alloc::format!("{error}"))
}

/// The disks and controllers, and which one each disk volume got
/// ([`choose_disks`]).
pub struct Disks {
    functions: Vec<Function>,
    probes: Vec<Probe>,
    /// Volume name -> index into `functions`.
    chosen: Vec<(String, usize)>,
    controllers: Vec<Controller>,
    /// NVMe volume name -> (index into `controllers`, namespace).
    namespaces: Vec<(String, usize, u32)>,
}

/// Chooses the device of each disk volume of `manifest`: virtio-blk
/// volumes among `virtio` (the `1af4:1042` functions, PCI order), NVMe
/// volumes' controllers among `nvme` (class 01:08:02), by PCI address or by
/// serial ([`choose_device`]: every device is probed with a tiny queue
/// from `pool` and logged with its serial and size). Refuses the manifest
/// (exit [`ExitCode::BadManifest`], each reason logged) if a volume's PCI
/// address has no device, no device or two have its serial, or two
/// volumes select the same disk (or the same namespace).
pub fn choose_disks(
    pci: &Mechanism,
    virtio: &[Function],
    nvme: &[Function],
    manifest: &Manifest<'_>,
    pool: &mut DmaPool,
    clock: &Tsc,
) -> Disks {
    let mut disks = Disks {
        functions: virtio.to_vec(),
        probes: Vec::new(),
        chosen: Vec::new(),
        controllers: Vec::new(),
        namespaces: Vec::new(),
    };
    // Who needs a disk: "volume NAME" (virtio-blk and NVMe volumes) and
    // "pool NAME" (thin pools on them), the key `open_disk` is given.
    let users: Vec<(String, Backing<'_>)> = manifest
        .volumes()
        .filter(|volume| matches!(volume.backing, Backing::VirtioBlk(_) | Backing::Nvme { .. }))
        .map(|volume| (alloc::format!("volume {}", volume.name), volume.backing))
        .chain(manifest.pools().filter_map(|pool| {
            crate::thin_pools::device_backing(&pool)
                .map(|backing| (crate::thin_pools::pool_key(pool.name), backing))
        }))
        .collect();
    let wants = |kind| users.iter().any(|(_, backing)| backing.kind() == kind);
    if wants(VolumeKind::VirtioBlk) {
        for function in virtio {
            let probe = probe_disk(pci, function, pool, clock);
            match probe.size {
                Some(size) => log!(
                    "disk: pci {}: {}, {}",
                    function.address,
                    SerialOf(&probe.serial),
                    Bytes(size)
                ),
                None => log!(
                    "disk: pci {}: not usable: {}",
                    function.address,
                    SerialOf(&probe.serial)
                ),
            }
            disks.probes.push(probe);
        }
    }
    if wants(VolumeKind::Nvme) {
        for function in nvme {
            let controller = probe_nvme(pci, function, pool, clock);
            match &controller {
                Ok(controller) => {
                    let info = controller.info();
                    log!(
                        "nvme: pci {}: serial \"{}\" model \"{}\", {} namespace(s), write cache {}, \
                         {} I/O queue pair(s)",
                        function.address,
                        info.serial,
                        info.model,
                        info.namespaces,
                        info.volatile_write_cache,
                        controller.granted_queues()
                    );
                }
                Err(why) => log!("nvme: pci {}: not usable: {why}", function.address),
            }
            let serial = controller.as_ref().ok().map(|c| c.info().serial);
            disks.controllers.push(Controller {
                function: *function,
                controller,
                serial,
            });
        }
    }
    let address = |function: &Function| {
        (
            function.address.bus,
            function.address.device,
            function.address.function,
        )
    };
    let virtio_candidates: Vec<Candidate<'_>> = disks
        .functions
        .iter()
        .zip(&disks.probes)
        .map(|(function, probe)| Candidate {
            address: address(function),
            serial: probe.serial.as_ref().ok().map(DeviceId::as_bytes),
        })
        .collect();
    let nvme_candidates: Vec<Candidate<'_>> = disks
        .controllers
        .iter()
        .map(|controller| Candidate {
            address: address(&controller.function),
            serial: controller.serial.as_ref().map(|s| s.as_bytes()),
        })
        .collect();
    let mut refused = 0;
    let mut chosen = Vec::new();
    let mut namespaces: Vec<(String, usize, u32)> = Vec::new();
    let mut owner: Vec<Option<&str>> = alloc::vec![None; virtio.len()];
    for (user, backing) in &users {
        let user = user.as_str();
        let outcome = match *backing {
            Backing::VirtioBlk(selector) => choose_device(selector, &virtio_candidates)
                .map_err(|error| match error {
                    ChoiceError::NoDeviceAt(wanted) => alloc::format!(
                        "no virtio-blk device (1af4:1042) at pci {wanted} ({} found): boot \
                         QEMU with -device virtio-blk-pci,disable-legacy=on,addr={:02x}.{}",
                        virtio.len(),
                        wanted.device,
                        wanted.function
                    ),
                    ChoiceError::NoSerial(serial) => alloc::format!(
                        "no virtio-blk device has serial \"{serial}\" ({} found): boot QEMU \
                         with -device virtio-blk-pci,drive=...,serial={serial}",
                        virtio.len()
                    ),
                    ChoiceError::SerialOnTwo(serial, first, second) => alloc::format!(
                        "serial \"{serial}\" is on more than one virtio-blk device (pci {} and \
                         pci {}): give each disk its own serial or select it by `pci`",
                        virtio[first].address,
                        virtio[second].address
                    ),
                })
                .and_then(|slot| match owner[slot] {
                    Some(other) => Err(alloc::format!(
                        "pci {} is also {other}'s: two volumes or pools cannot share a disk",
                        virtio[slot].address
                    )),
                    None => {
                        owner[slot] = Some(user);
                        log!(
                            "disk: {user} gets pci {} ({}; {})",
                            virtio[slot].address,
                            match selector {
                                VirtioSelector::Serial(_) => "by serial",
                                VirtioSelector::Pci(_) => "by PCI address",
                            },
                            SerialOf(&disks.probes[slot].serial)
                        );
                        chosen.push((String::from(user), slot));
                        Ok(())
                    }
                }),
            Backing::Nvme {
                controller,
                namespace,
            } => choose_device(controller, &nvme_candidates)
                .map_err(|error| match error {
                    ChoiceError::NoDeviceAt(wanted) => alloc::format!(
                        "no NVMe controller (class 01:08:02) at pci {wanted} ({} found): boot \
                         QEMU with -device nvme,serial=...,addr={:02x}.{}",
                        nvme.len(),
                        wanted.device,
                        wanted.function
                    ),
                    ChoiceError::NoSerial(serial) => alloc::format!(
                        "no NVMe controller has serial \"{serial}\" ({} found): boot QEMU with \
                         -device nvme,serial={serial}",
                        nvme.len()
                    ),
                    ChoiceError::SerialOnTwo(serial, first, second) => alloc::format!(
                        "serial \"{serial}\" is on more than one NVMe controller (pci {} and \
                         pci {}): select the controller by `pci`",
                        nvme[first].address,
                        nvme[second].address
                    ),
                })
                .and_then(|index| {
                    if let Some((other, ..)) = namespaces
                        .iter()
                        .find(|(_, i, n)| *i == index && *n == namespace)
                    {
                        return Err(alloc::format!(
                            "namespace {namespace} of pci {} is also {other}'s",
                            nvme[index].address
                        ));
                    }
                    match &disks.controllers[index].controller {
                        Err(why) => Err(alloc::format!(
                            "the NVMe controller at pci {} did not come up: {why}",
                            nvme[index].address
                        )),
                        Ok(controller) if namespace > controller.info().namespaces => {
                            Err(alloc::format!(
                                "the NVMe controller at pci {} has {} namespace(s), not {namespace}",
                                nvme[index].address,
                                controller.info().namespaces
                            ))
                        }
                        Ok(controller) => {
                            log!(
                                "nvme: {user} gets namespace {namespace} of pci {} ({}; \
                                 serial \"{}\")",
                                nvme[index].address,
                                match controller_selector_kind(backing) {
                                    true => "by serial",
                                    false => "by PCI address",
                                },
                                controller.info().serial
                            );
                            namespaces.push((String::from(user), index, namespace));
                            Ok(())
                        }
                    }
                }),
            _ => continue,
        };
        if let Err(why) = outcome {
            log!("{user}: {why}");
            refused += 1;
        }
    }
    drop(virtio_candidates);
    drop(nvme_candidates);
    disks.chosen = chosen;
    disks.namespaces = namespaces;
    if refused > 0 {
        fail(
            ExitCode::BadManifest,
            format_args!("{refused} disk volume(s) or pool(s) without a device: manifest refused"),
        );
    }
    disks
}

/// Whether an NVMe volume selects its controller by serial.
fn controller_selector_kind(backing: &Backing<'_>) -> bool {
    matches!(
        backing,
        Backing::Nvme {
            controller: VirtioSelector::Serial(_),
            ..
        }
    )
}

/// Opens the disk of `user` ("volume NAME" or "pool NAME", backed by
/// `backing`) on the device [`choose_disks`] gave it, rings and bounce
/// slots from `pool`; `H` is the handle its requests carry.
pub fn open_disk<H: Copy>(
    pci: &Mechanism,
    disks: &mut Disks,
    pool: &mut DmaPool,
    clock: &Tsc,
    config: &ServerConfig,
    user: &str,
    backing: &Backing<'_>,
) -> Result<DiskOf<H>, String> {
    if let Backing::Nvme { .. } = backing {
        let Some(&(_, index, namespace)) = disks.namespaces.iter().find(|(name, ..)| name == user)
        else {
            return Err("no NVMe namespace was chosen".into());
        };
        let entry = &mut disks.controllers[index];
        let address = entry.function.address;
        let Ok(controller) = &mut entry.controller else {
            return Err(alloc::format!("pci {address}: controller not up"));
        };
        let device = controller
            .open_namespace(
                clock,
                namespace,
                pool,
                target_image::boot::pool::nvme_queue_config(config),
            )
            .map_err(|error| alloc::format!("pci {address} namespace {namespace}: {error}"))?;
        let info = device.info();
        log!(
            "nvme: {user} on namespace {namespace} of pci {address} (queue pair {}): {} in \
             {}-byte blocks, write cache {}, max transfer {}, DMA left {} KiB",
            device.queue_id(),
            Bytes(info.size),
            info.logical_block_size,
            info.volatile_write_cache,
            Bytes(u64::from(info.max_transfer)),
            pool.remaining() / 1024
        );
        return Ok(Either::Right(device));
    }
    let Some(&(_, slot)) = disks.chosen.iter().find(|(name, _)| name == user) else {
        return Err("no disk was chosen".into());
    };
    let function = &disks.functions[slot];
    let address = function.address;
    let transport = transport(pci, function, Intx::Disabled)
        .map_err(|why| alloc::format!("pci {address}: {why}"))?;
    let disk = VirtioBlk::new(transport, pool, target_image::virtio_blk_config(config))
        .map_err(|error| alloc::format!("pci {address}: virtio-blk: {error}"))?;
    let info = disk.info();
    let how = match backing {
        Backing::VirtioBlk(VirtioSelector::Serial(_)) => "by serial",
        _ => "by PCI address",
    };
    let serial = disks.probes.get(slot).map(|probe| &probe.serial);
    log!(
        "disk: {user} on pci {address} ({how}; {}): {} in {}-byte blocks, write cache {}, \
         features {:#x}, DMA left {} KiB",
        match serial {
            Some(serial) => alloc::format!("{}", SerialOf(serial)),
            None => "serial not read".into(),
        },
        Bytes(info.size),
        info.logical_block_size,
        info.volatile_write_cache,
        disk.features(),
        pool.remaining() / 1024
    );
    Ok(Either::Left(disk))
}

/// Where the time before the image went (for the boot log).
#[derive(Clone, Copy, Debug)]
pub struct BootPhases {
    /// Reset to the loader's start (UEFI) or to the image's entry (PVH).
    pub firmware_ns: Option<u64>,
    /// The UEFI loader's start to the image's entry.
    pub loader_ns: Option<u64>,
}

impl fmt::Display for BootPhases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| (ns / 1_000_000, ns / 1000 % 1000);
        match (self.firmware_ns, self.loader_ns) {
            (Some(firmware), Some(loader)) => {
                let (a, b) = ms(firmware);
                let (c, d) = ms(loader);
                write!(
                    f,
                    "firmware {a}.{b:03} ms, loader {c}.{d:03} ms before the image"
                )
            }
            (Some(firmware), None) => {
                let (a, b) = ms(firmware);
                write!(f, "firmware and loader {a}.{b:03} ms before the image")
            }
            _ => f.write_str("firmware time unknown"),
        }
    }
}

/// The boot phases, set once by `main`.
pub static BOOT_PHASES: spin::Once<BootPhases> = spin::Once::new();

/// Keys for the engine's memory registrations.
struct Keys(crate::rng::Source);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        hal::Rng::next_u32(&mut self.0)
    }
}

/// Gathers the engine's pieces (payload, then the trailer) without empty
/// ones; `None` if there are more than a frame ever has.
fn gather<'a>(payload: &[&'a [u8]], trailer: &'a [u8], out: &mut [&'a [u8]; 8]) -> Option<usize> {
    let mut count = 0;
    for piece in payload.iter().copied().chain([trailer]) {
        if piece.is_empty() {
            continue;
        }
        *out.get_mut(count)? = piece;
        count += 1;
    }
    Some(count)
}

/// Builds the engine from `manifest` and serves on `nics` until the VM is
/// stopped. `boot_ns` is the image's boot clock at the call (for the
/// "serving after" line).
pub fn serve(
    pci: &Mechanism,
    manifest: Manifest<'_>,
    nics: Vec<OpenNic>,
    mut disks: Disks,
    mut pool: DmaPool,
    clock: Tsc,
) -> ! {
    let mut wake = FrameWake::new(&nics);
    let mut nics: Vec<Net> = nics.into_iter().map(|nic| nic.net).collect();
    // The engine allocates its registered arenas and its tables (QPs, CQs,
    // region tables: manifest::Capacity) from the heap (not from the boot
    // pool, yet): refuse clearly rather than fail an allocation.
    let arenas = (target_image::arena_bytes(&target_image::server_config(&manifest)) as u64)
        .saturating_mul(nics.len() as u64);
    let memory = manifest::Capacity::of(&manifest).memory();
    let tables = memory.total().saturating_sub(memory.chunks);
    let (heap_free, _, _) = crate::memory::HEAP.stats();
    log!(
        "engine: registered arenas {} and tables {} of {} heap",
        Bytes(arenas),
        Bytes(tables),
        Bytes(heap_free)
    );
    if arenas
        .saturating_add(tables)
        .saturating_add(manifest.ram_volume_bytes())
        > heap_free
    {
        fail(
            ExitCode::NoMemory,
            format_args!(
                "the engine needs {} of arenas, {} of tables and {} of RAM volumes, the heap \
                 has {}: give the guest more memory or lower [limits] queue_depth / \
                 max_sessions / max_connections_per_path",
                Bytes(arenas),
                Bytes(tables),
                Bytes(manifest.ram_volume_bytes()),
                Bytes(heap_free)
            ),
        );
    }
    // Boot phases (TCG makes zeroing memory the visible cost): RAM volumes
    // opened, then the rest of the engine (registered arenas, tables).
    let build_start = clock.now();
    let mut volumes_ns = 0;
    let mut pools = crate::thin_pools::Pools::default();
    let open = |config: &ServerConfig, volume: &manifest::binary::Volume<'_>| {
        let start = clock.now();
        let opened = match volume.backing {
            Backing::VirtioBlk(_) | Backing::Nvme { .. } => {
                let user = alloc::format!("volume {}", volume.name);
                open_disk(
                    pci,
                    &mut disks,
                    &mut pool,
                    &clock,
                    config,
                    &user,
                    &volume.backing,
                )
                .map(|disk| Volume::Device(Box::new(Either::Left(disk))))
                .map_err(|why| BuildError::Volume(volume.name.into(), why))
            }
            Backing::Thin {
                pool: thin_pool,
                size,
            } => pools
                .volume(
                    config,
                    &thin_pool,
                    volume.name,
                    size,
                    |config, key, backing| {
                        open_disk(pci, &mut disks, &mut pool, &clock, config, key, backing)
                    },
                )
                .map(|thin| Volume::Device(Box::new(Either::Right(thin))))
                .map_err(|why| BuildError::Volume(volume.name.into(), why)),
            _ => target_image::ram_volume(volume).map(|ram| Volume::Ram(Box::new(ram))),
        };
        volumes_ns += clock.now() - start;
        opened
    };
    let keys = |_| Keys(crate::rng::Source::detect());
    let mut engine = match Engine::with_volumes(manifest, keys, open) {
        Ok(engine) => engine,
        Err(error) => fail(ExitCode::BadManifest, format_args!("engine: {error}")),
    };
    let build_ns = clock.now() - build_start;
    // SAFETY: the engine's arenas are heap `Vec`s, and the heap is RAM
    // carved from the memory map below the 0-4 GiB identity map (virtual
    // == physical == bus address: QEMU has no IOMMU here), so virtio-blk
    // can read and write chunks in place.
    unsafe { engine.set_identity_dma() };
    // Frames carry payloads from the registered arenas without a copy.
    for (index, nic) in nics.iter_mut().enumerate() {
        let Some(arena) = engine.hca(index).and_then(Port::registered_memory) else {
            continue;
        };
        let window = DmaWindow {
            virt: arena.start,
            phys: arena.start as u64,
            len: arena.len(),
        };
        // SAFETY: the arena is a heap `Vec` (identity-mapped below 4 GiB,
        // as above: its virtual addresses are its bus addresses) that the
        // engine owns and never frees or moves while the loop runs, which
        // is the driver's life. The device reads a piece after `transmit`
        // returned: the engine frees or reuses registered memory only when
        // the peer acknowledged the packets that carried it, and a packet
        // sent again re-reads the same memory. Bytes a peer's RDMA READ
        // names may change before the device reads them (the chunk's next
        // IO, same session); the frame's ICRC, computed at emit, then fails
        // at the peer, which drops it as it would a corrupted frame.
        let zero_copy = unsafe { nic.add_zero_copy_window(window) };
        log!(
            "net: interface {index}: zero-copy transmit from the registered arena ({}): {}",
            Bytes(window.len as u64),
            if zero_copy {
                "on"
            } else {
                "off (no window left)"
            }
        );
    }
    engine.set_logger(|args| log!("{args}"));
    log!(
        "engine built in {} us: volumes {} us, arenas and tables {} us (boot until then {} us)",
        build_ns / 1000,
        volumes_ns / 1000,
        build_ns.saturating_sub(volumes_ns) / 1000,
        build_start / 1000
    );
    for volume in engine.manifest().volumes() {
        log!("serving {volume}");
    }
    let mut admin = crate::admin::Admin::open(engine.manifest(), clock.now());
    let target = engine.manifest().target();
    let started = clock.now();
    log!(
        "serving after {} us (image entry to poll loop; RDMA CM port {}, {} NIC(s))",
        started / 1000,
        target.port,
        nics.len()
    );
    if let Some(phases) = BOOT_PHASES.get() {
        let before = phases.firmware_ns.unwrap_or(0) + phases.loader_ns.unwrap_or(0);
        log!(
            "boot to serving: {} ms ({phases}, image {} ms)",
            (before + started) / 1_000_000,
            started / 1_000_000
        );
    }
    let mut idle = PitIdle::new(clock);
    let mut last_busy = started;
    let mut next_stats = started + STATS_EVERY_NS;
    let mut frames_since_stats = 0u64;
    loop {
        let now = clock.now();
        let mut busy = false;
        for (index, nic) in nics.iter_mut().enumerate() {
            for _ in 0..RX_BURST {
                match nic.receive(|frame| {
                    if !admin.take(index, frame) {
                        engine.receive(index, now, frame);
                    }
                }) {
                    Ok(Some(())) => {
                        busy = true;
                        frames_since_stats += 1;
                    }
                    Ok(None) => break,
                    Err(error) => {
                        log!("net: interface {index}: receive: {error}");
                        break;
                    }
                }
            }
        }
        busy |= engine.poll(
            now,
            &mut |interface: usize, headers: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                let mut pieces: [&[u8]; 8] = [&[]; 8];
                if let (Some(nic), Some(count)) = (
                    nics.get_mut(interface),
                    gather(payload, trailer, &mut pieces),
                ) {
                    // Drops (a full ring) are recovered by the transport.
                    let _ = nic.transmit(headers, &pieces[..count]);
                }
            },
        );
        busy |= admin.poll(now, &engine, &mut nics);
        for nic in &mut nics {
            nic.flush();
        }
        if now >= next_stats && frames_since_stats > 0 {
            next_stats = now + STATS_EVERY_NS;
            frames_since_stats = 0;
            for line in alloc::format!("{}", engine.stats()).lines() {
                log!("{line}");
            }
            for (index, nic) in nics.iter().enumerate() {
                let net = nic.stats();
                log!(
                    "net: interface {index}: frames in {} out {}, {} payload pieces sent in place, {} bytes copied to bounce slots, {} busy",
                    net.rx_frames,
                    net.tx_frames,
                    net.tx_zero_copy_pieces,
                    net.tx_bounced_bytes,
                    net.tx_busy
                );
            }
            let frame_wakes: u64 = nics.iter().map(|nic| nic.stats().rx_interrupts).sum();
            log!(
                "idle: {} halts, {frame_wakes} ended by a frame's interrupt",
                idle.halts
            );
        }
        if busy {
            last_busy = now;
            continue;
        }
        let now = clock.now();
        let due = engine
            .poll_at(now)
            .into_iter()
            .chain(admin.poll_at(now))
            .min();
        if due.is_some_and(|due| due <= now) || now.saturating_sub(last_busy) < SPIN_NS {
            continue;
        }
        let longest = now + wake.longest_halt();
        let deadline = due.map_or(longest, |due| due.min(longest));
        wake.halt(&mut nics, &mut idle, deadline);
    }
}

/// Halting until the next deadline or frame (see the module docs; the
/// decisions are [`HaltPolicy`]'s).
struct FrameWake {
    /// The NICs' distinct lines, unmasked on the PIC.
    lines: Vec<u8>,
    policy: HaltPolicy,
}

impl FrameWake {
    /// Unmasks the lines of `nics`; frames wake the CPU if every NIC has
    /// one (and there is a NIC).
    fn new(nics: &[OpenNic]) -> Self {
        let mut lines = Vec::new();
        let mut on_frame = !nics.is_empty();
        for (index, nic) in nics.iter().enumerate() {
            match nic.irq {
                Some(irq) if crate::interrupts::unmask_irq(irq) => {
                    if !lines.contains(&irq) {
                        lines.push(irq);
                    }
                }
                _ => {
                    log!(
                        "idle: interface {index} has no usable interrupt line ({}): halting in \
                         slices of {} us",
                        Irq(nic.irq),
                        HALT_SLICE_NS / 1000
                    );
                    on_frame = false;
                }
            }
        }
        if on_frame {
            log!(
                "idle: halting until the next deadline (at most {} ms) or a frame (IRQ {lines:?})",
                MAX_HALT_NS / 1_000_000
            );
        }
        FrameWake {
            lines,
            policy: HaltPolicy {
                on_frame,
                unexplained: 0,
                max_halt_ns: MAX_HALT_NS,
                slice_ns: HALT_SLICE_NS,
                stuck_after: STUCK_WAKES,
            },
        }
    }

    /// The longest halt from now.
    fn longest_halt(&self) -> u64 {
        self.policy.longest_halt()
    }

    /// Halts until `deadline` or, if frames wake the CPU, until one
    /// arrives on any of `nics` (returns at once if one is waiting).
    fn halt(&mut self, nics: &mut [Net], idle: &mut PitIdle<Tsc>, deadline: u64) {
        if !self.policy.on_frame {
            idle.idle_until(Some(deadline));
            return;
        }
        let clock = *idle.clock();
        let start = clock.now();
        // Short-circuits: NICs after one with a frame waiting stay
        // suppressed, and the loop polls.
        let waiting = nics.iter_mut().any(|nic| nic.enable_rx_interrupt());
        if !waiting {
            idle.idle_until(Some(deadline));
        }
        let mut raised = false;
        for nic in nics.iter_mut() {
            raised |= nic.disable_rx_interrupt();
        }
        if waiting {
            return;
        }
        let slept = clock.now().saturating_sub(start);
        let planned = deadline.saturating_sub(start);
        if self.policy.after_wake(raised, slept, planned) == AfterWake::MaskLines {
            log!(
                "idle: {STUCK_WAKES} early wake-ups in a row that no NIC raised: IRQ {:?} looks \
                 stuck; masking it and halting in slices of {} us",
                self.lines,
                HALT_SLICE_NS / 1000
            );
            for &line in &self.lines {
                crate::interrupts::mask_irq(line);
            }
        }
    }
}

/// Bytes of the engine's stack: the engine builds large tables on the
/// stack while starting (the hosted runner gives its thread 256 MiB), far
/// beyond the 256 KiB boot stack. No guard page: the identity map uses
/// 2 MiB pages.
pub const ENGINE_STACK_BYTES: u64 = 32 << 20;

/// Runs `f` on the stack `stack` (a carved range nothing else uses);
/// never returns (if `f` does, the image exits with a failure), so the
/// boot stack's frames stay as they are.
pub fn on_stack<F: FnOnce()>(stack: Range, f: F) -> ! {
    extern "C" fn enter<F: FnOnce()>(slot: *mut Option<F>) -> ! {
        // SAFETY: `slot` points at `on_stack`'s local on the boot stack,
        // which is never popped (`on_stack` does not return) and which
        // nothing else references after the switch.
        let slot = unsafe { &mut *slot };
        if let Some(f) = slot.take() {
            f();
        }
        log!("FATAL: the engine's stack frame returned");
        exit(ExitCode::Failure)
    }
    let mut slot = Some(f);
    let top = stack.end & !0xf;
    // SAFETY: `stack` is carved RAM inside the identity map that nothing
    // else uses; `top` is 16-byte aligned so `enter` starts with the ABI's
    // alignment after `call`; `enter` never returns, so the abandoned boot
    // stack is never unwound into; `slot` stays valid (see `enter`).
    unsafe {
        core::arch::asm!(
            "mov rsp, {top}",
            "call {enter}",
            top = in(reg) top,
            enter = sym enter::<F>,
            in("rdi") &raw mut slot,
            options(noreturn)
        )
    }
}
