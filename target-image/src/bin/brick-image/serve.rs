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

use hal::block::BlockDevice;
use hal::dma::{DmaPool, DmaRegion};
use hal::virtio::blk::{BlkConfig, DeviceId, VirtioBlk};
use hal::virtio::net::{NetConfig, VirtioNet};
use hal::virtio::read_config_bytes;
use hal::virtio::transport::{PciRegions, PciTransport, VirtioTransport};
use hal::{Clock, Idle, Nic};
use manifest::binary::{Backing, Manifest};
use manifest::types::VirtioSelector;
use rtrs::server::ServerConfig;
use target_image::boot::memory::Range;
use target_image::boot::pvh::Bytes;
use target_image::{BuildError, Chunk, Engine};
use verbs::KeySource;

use crate::clock::Tsc;
use crate::interrupts::PitIdle;
use crate::memory::IDENTITY_LIMIT;
use crate::pci::{self, Bar, Function, Intx};
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
/// The image's disk type (virtio-blk volumes).
pub type Disk = VirtioBlk<Chunk, PciTransport>;

/// A volume of the image: RAM or a virtio-blk disk.
pub type Volume = target_image::RamOr<Box<Disk>>;

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

/// Refuses (exit [`ExitCode::Unsupported`]) a manifest with a volume kind
/// the image does not serve: it serves RAM volumes and virtio-blk volumes
/// (by PCI address or by serial, [`choose_disks`]); files and host block
/// devices are the hosted target's.
pub fn check_volume_kinds(manifest: &Manifest<'_>) {
    let mut refused = 0;
    for volume in manifest.volumes() {
        let why = match volume.backing {
            Backing::Ram { .. } | Backing::VirtioBlk(_) => continue,
            _ => "not served by the image (RAM and virtio-blk volumes only)",
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

/// The register blocks of a virtio function, or why not.
fn regions(function: &Function) -> Result<PciRegions, &'static str> {
    let capabilities = pci::virtio_capabilities::<MAX_VIRTIO_CAPABILITIES>(function.address);
    let mut bars = [0u64; 6];
    for (slot, bar) in bars.iter_mut().zip(function.bars) {
        if let Some(Bar::Memory { address, .. }) = bar {
            *slot = address;
        }
    }
    let regions = PciRegions::from_capabilities(&bars, &capabilities)
        .ok_or("no common, notify or device virtio capability in a memory BAR")?;
    let below_identity_limit = |address: u64, len: u32| {
        address != 0
            && address
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= IDENTITY_LIMIT)
    };
    if !below_identity_limit(regions.common, regions.common_len)
        || !below_identity_limit(regions.notify, regions.notify_len)
        || !below_identity_limit(regions.device, regions.device_len)
        || (regions.isr_len > 0 && !below_identity_limit(regions.isr, regions.isr_len))
    {
        return Err("a register block lies outside the identity-mapped 4 GiB");
    }
    Ok(regions)
}

/// A transport for `function` (memory space and bus master enabled, INTx
/// as `intx` says), or why not.
fn transport(function: &Function, intx: Intx) -> Result<PciTransport, &'static str> {
    let command = pci::enable_memory_and_bus_master(function.address, intx);
    if command & 0b110 != 0b110 {
        return Err("memory space or bus master did not stick");
    }
    let regions = regions(function)?;
    // SAFETY: `regions` come from this function's own virtio capabilities
    // and its firmware-assigned memory BARs, checked to lie inside the
    // 0-4 GiB identity map (virtual == physical; QEMU's MMIO ignores the
    // cache type of the mapping); memory decoding and bus mastering were
    // just enabled; at most one transport per function exists at a time
    // (a NIC's is made once; a disk's probe transport is dropped after its
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
/// `functions` (PCI order), with rings and buffers from `pool`. Exits with
/// [`ExitCode::NoNic`] if a NIC is missing or fails to start.
pub fn open_nics(
    functions: &[Function],
    manifest: &Manifest<'_>,
    pool: &mut DmaPool,
) -> Vec<OpenNic> {
    let config = NetConfig::default();
    let mut claimed = alloc::vec![false; functions.len()];
    let mut transports: Vec<Option<(PciTransport, [u8; 6])>> = functions
        .iter()
        .map(|function| match transport(function, Intx::Enabled) {
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
    let mut nics = Vec::new();
    for (index, interface) in manifest.interfaces().enumerate() {
        if usize::from(interface.mtu) > hal::virtio::net::MTU {
            fail(
                ExitCode::NoNic,
                format_args!(
                    "interface {interface}: the virtio-net driver carries an MTU of {} at most",
                    hal::virtio::net::MTU
                ),
            );
        }
        let wanted = interface.mac.0;
        let by_mac = transports
            .iter()
            .zip(&claimed)
            .position(|(t, used)| !used && t.as_ref().is_some_and(|(_, mac)| *mac == wanted));
        let by_order = || {
            transports
                .iter()
                .zip(&claimed)
                .position(|(t, used)| !used && t.is_some())
        };
        let Some(slot) = by_mac.or_else(by_order) else {
            fail(
                ExitCode::NoNic,
                format_args!(
                    "interface {index} ({interface}): no usable virtio-net device left \
                     ({} found): boot QEMU with one -device virtio-net-pci per interface",
                    functions.len()
                ),
            );
        };
        claimed[slot] = true;
        let Some((mut transport, device_mac)) = transports[slot].take() else {
            continue;
        };
        let offered = transport.device_features();
        let net_config = NetConfig {
            mac: Some(wanted),
            ..config
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
        let irq = pci::legacy_irq(functions[slot].address);
        log!(
            "net: interface {} on pci {}: device MAC {} {agreement}; features {:#x}, IRQ {}, DMA left {} KiB",
            interface.name,
            functions[slot].address,
            Mac(device_mac),
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
fn probe_disk(function: &Function, pool: &mut DmaPool, clock: &Tsc) -> Probe {
    let transport = match transport(function, Intx::Disabled) {
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

/// The virtio-blk functions and which one each virtio-blk volume got
/// ([`choose_disks`]).
pub struct Disks {
    functions: Vec<Function>,
    probes: Vec<Probe>,
    /// Volume name -> index into `functions`.
    chosen: Vec<(String, usize)>,
}

/// Chooses the virtio-blk function of each virtio-blk volume of `manifest`
/// among `functions` (the `1af4:1042` functions, PCI order): by PCI
/// address, or by the serial each function answers to
/// `VIRTIO_BLK_T_GET_ID` (every function is probed with a tiny queue from
/// `pool`, then reset, and logged with its serial and size). Refuses the
/// manifest (exit [`ExitCode::BadManifest`], each reason logged) if a
/// volume's PCI address has no disk, no disk or two disks have its serial,
/// or two volumes select the same disk.
pub fn choose_disks(
    functions: &[Function],
    manifest: &Manifest<'_>,
    pool: &mut DmaPool,
    clock: &Tsc,
) -> Disks {
    let mut disks = Disks {
        functions: functions.to_vec(),
        probes: Vec::new(),
        chosen: Vec::new(),
    };
    let wanted = manifest
        .volumes()
        .any(|volume| matches!(volume.backing, Backing::VirtioBlk(_)));
    if !wanted {
        return disks;
    }
    for function in functions {
        let probe = probe_disk(function, pool, clock);
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
    let mut refused = 0;
    let mut owner: Vec<Option<&str>> = alloc::vec![None; functions.len()];
    for volume in manifest.volumes() {
        let Backing::VirtioBlk(selector) = volume.backing else {
            continue;
        };
        let slot = match selector {
            VirtioSelector::Pci(wanted) => functions
                .iter()
                .position(|function| {
                    wanted.domain == 0
                        && function.address.bus == wanted.bus
                        && function.address.device == wanted.device
                        && function.address.function == wanted.function
                })
                .ok_or_else(|| {
                    alloc::format!(
                        "no virtio-blk device (1af4:1042) at pci {wanted} ({} found): boot \
                         QEMU with -device virtio-blk-pci,disable-legacy=on,addr={:02x}.{}",
                        functions.len(),
                        wanted.device,
                        wanted.function
                    )
                }),
            VirtioSelector::Serial(serial) => {
                let mut matching = disks.probes.iter().enumerate().filter(|(_, probe)| {
                    probe
                        .serial
                        .as_ref()
                        .is_ok_and(|id| id.as_bytes() == serial.as_bytes())
                });
                match (matching.next(), matching.next()) {
                    (Some((slot, _)), None) => Ok(slot),
                    (None, _) => Err(alloc::format!(
                        "no virtio-blk device has serial \"{serial}\" ({} found): boot QEMU \
                         with -device virtio-blk-pci,drive=...,serial={serial}",
                        functions.len()
                    )),
                    (Some((first, _)), Some((second, _))) => Err(alloc::format!(
                        "serial \"{serial}\" is on more than one virtio-blk device (pci {} and \
                         pci {}): give each disk its own serial or select it by `pci`",
                        functions[first].address,
                        functions[second].address
                    )),
                }
            }
        };
        let slot = slot.and_then(|slot| match owner[slot] {
            Some(other) => Err(alloc::format!(
                "pci {} is also volume {other}'s: two volumes cannot share a disk",
                functions[slot].address
            )),
            None => Ok(slot),
        });
        match slot {
            Ok(slot) => {
                owner[slot] = Some(volume.name);
                let how = match selector {
                    VirtioSelector::Serial(_) => "by serial",
                    VirtioSelector::Pci(_) => "by PCI address",
                };
                log!(
                    "disk: volume {} gets pci {} ({how}; {})",
                    volume.name,
                    functions[slot].address,
                    SerialOf(&disks.probes[slot].serial)
                );
                disks.chosen.push((volume.name.into(), slot));
            }
            Err(why) => {
                log!("volume {volume}: {why}");
                refused += 1;
            }
        }
    }
    if refused > 0 {
        fail(
            ExitCode::BadManifest,
            format_args!("{refused} virtio-blk volume(s) without a disk: manifest refused"),
        );
    }
    disks
}

/// Opens the virtio-blk volume `volume` on the disk [`choose_disks`] gave
/// it, rings and bounce slots from `pool`.
fn open_disk(
    disks: &Disks,
    pool: &mut DmaPool,
    config: &ServerConfig,
    volume: &manifest::binary::Volume<'_>,
) -> Result<Disk, BuildError> {
    let refuse = |why: String| BuildError::Volume(volume.name.into(), why);
    let Some(&(_, slot)) = disks.chosen.iter().find(|(name, _)| name == volume.name) else {
        return Err(refuse("no disk was chosen for this volume".into()));
    };
    let function = &disks.functions[slot];
    let address = function.address;
    let transport = transport(function, Intx::Disabled)
        .map_err(|why| refuse(alloc::format!("pci {address}: {why}")))?;
    let disk = Disk::new(transport, pool, target_image::virtio_blk_config(config))
        .map_err(|error| refuse(alloc::format!("pci {address}: virtio-blk: {error}")))?;
    let info = disk.info();
    let how = match volume.backing {
        Backing::VirtioBlk(VirtioSelector::Serial(_)) => "by serial",
        _ => "by PCI address",
    };
    let serial = disks.probes.get(slot).map(|probe| &probe.serial);
    log!(
        "disk: volume {} on pci {address} ({how}; {}): {} in {}-byte blocks, write cache {}, \
         features {:#x}, DMA left {} KiB",
        volume.name,
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
    Ok(disk)
}

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
    manifest: Manifest<'_>,
    nics: Vec<OpenNic>,
    disks: Disks,
    mut pool: DmaPool,
    clock: Tsc,
) -> ! {
    let mut wake = FrameWake::new(&nics);
    let mut nics: Vec<Net> = nics.into_iter().map(|nic| nic.net).collect();
    // The engine allocates its registered arenas from the heap (not from
    // the boot pool, yet): refuse clearly rather than fail an allocation.
    let arenas = (target_image::arena_bytes(&target_image::server_config(&manifest)) as u64)
        .saturating_mul(nics.len() as u64);
    let (heap_free, _, _) = crate::memory::HEAP.stats();
    log!(
        "engine: registered arenas {} of {} heap",
        Bytes(arenas),
        Bytes(heap_free)
    );
    if arenas.saturating_add(manifest.ram_volume_bytes()) > heap_free {
        fail(
            ExitCode::NoMemory,
            format_args!(
                "the engine needs {} of arenas and {} of RAM volumes, the heap has {}: \
                 give the guest more memory or lower [limits] queue_depth / max_sessions",
                Bytes(arenas),
                Bytes(manifest.ram_volume_bytes()),
                Bytes(heap_free)
            ),
        );
    }
    // Boot phases (TCG makes zeroing memory the visible cost): RAM volumes
    // opened, then the rest of the engine (registered arenas, tables).
    let build_start = clock.now();
    let mut volumes_ns = 0;
    let open = |config: &ServerConfig, volume: &manifest::binary::Volume<'_>| {
        let start = clock.now();
        let opened = match volume.backing {
            Backing::VirtioBlk(_) => open_disk(&disks, &mut pool, config, volume)
                .map(|disk| Volume::Device(Box::new(disk))),
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
    let target = engine.manifest().target();
    let started = clock.now();
    log!(
        "serving after {} us (image entry to poll loop; RDMA CM port {}, {} NIC(s))",
        started / 1000,
        target.port,
        nics.len()
    );
    let mut idle = PitIdle::new(clock);
    let mut last_busy = started;
    let mut next_stats = started + STATS_EVERY_NS;
    let mut frames_since_stats = 0u64;
    loop {
        let now = clock.now();
        let mut busy = false;
        for (index, nic) in nics.iter_mut().enumerate() {
            for _ in 0..RX_BURST {
                match nic.receive(|frame| engine.receive(index, now, frame)) {
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
        for nic in &mut nics {
            nic.flush();
        }
        if now >= next_stats && frames_since_stats > 0 {
            next_stats = now + STATS_EVERY_NS;
            frames_since_stats = 0;
            for line in alloc::format!("{}", engine.stats()).lines() {
                log!("{line}");
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
        let due = engine.poll_at(now);
        if due.is_some_and(|due| due <= now) || now.saturating_sub(last_busy) < SPIN_NS {
            continue;
        }
        let longest = now + wake.longest_halt();
        let deadline = due.map_or(longest, |due| due.min(longest));
        wake.halt(&mut nics, &mut idle, deadline);
    }
}

/// Halting until the next deadline or frame (see the module docs).
struct FrameWake {
    /// The NICs' distinct lines, unmasked on the PIC.
    lines: Vec<u8>,
    /// Whether a frame on any NIC ends a halt (every NIC has a line);
    /// else halts are sliced.
    on_frame: bool,
    /// Early wake-ups in a row that no NIC raised.
    unexplained: u32,
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
                        "idle: interface {index} has no usable interrupt line ({}):                          halting in slices of {} us",
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
            on_frame,
            unexplained: 0,
        }
    }

    /// The longest halt from now.
    fn longest_halt(&self) -> u64 {
        if self.on_frame {
            MAX_HALT_NS
        } else {
            HALT_SLICE_NS
        }
    }

    /// Halts until `deadline` or, if frames wake the CPU, until one
    /// arrives on any of `nics` (returns at once if one is waiting).
    fn halt(&mut self, nics: &mut [Net], idle: &mut PitIdle<Tsc>, deadline: u64) {
        if !self.on_frame {
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
        // A wake-up before half the wait that no NIC raised: the stale
        // tick of an earlier one-shot (once), or a line held by something
        // else (every time).
        let early = clock.now().saturating_sub(start) < deadline.saturating_sub(start) / 2;
        if raised || !early {
            self.unexplained = 0;
            return;
        }
        self.unexplained += 1;
        if self.unexplained >= STUCK_WAKES {
            log!(
                "idle: {STUCK_WAKES} early wake-ups in a row that no NIC raised: IRQ {:?}                  looks stuck; masking it and halting in slices of {} us",
                self.lines,
                HALT_SLICE_NS / 1000
            );
            for &line in &self.lines {
                crate::interrupts::mask_irq(line);
            }
            self.on_frame = false;
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
