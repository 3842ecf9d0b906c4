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
//! ([`crate::disks::choose_disks`], before the NICs are opened), rings and bounce
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
//! [`hal::idle::spin_ns`] (on bare metal [`SPIN_NS`]: a frame that follows
//! soon is taken without a wake-up; under a hypervisor none, see there); then, if
//! the engine has nothing due, [`FrameWake::halt`]
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
use alloc::vec::Vec;
use core::fmt;

use hal::block::Either;
use hal::dma::{DmaPool, DmaRegion, DmaWindow};
use hal::nvme::regs::MmioRegisters;
use hal::nvme::NvmeNamespace;
use hal::pci::{Bar, Function, Intx, Mechanism};
use hal::virtio::blk::VirtioBlk;
use hal::virtio::net::{NetConfig, VirtioNet};
use hal::virtio::read_config_bytes;
use hal::virtio::transport::{PciRegions, PciTransport, VirtioTransport};
use hal::{Clock, Idle, Nic};
use manifest::binary::{Backing, Manifest};
use rtrs::server::ServerConfig;
use target_image::boot::claim::{claim_nics, AfterWake, HaltPolicy};
use target_image::boot::memory::Range;
use target_image::boot::pvh::Bytes;
use target_image::{BuildError, Chunk, Engine, Port};
use verbs::KeySource;

use crate::clock::Tsc;
use crate::disks::{open_disk, Disks};
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
/// How long the loop keeps polling after the last activity before halting,
/// on bare metal ([`hal::idle::spin_ns`]).
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

pub(crate) fn fail(code: ExitCode, args: fmt::Arguments<'_>) -> ! {
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
/// ([`crate::disks::choose_disks`]) and thin volumes on virtio-blk and NVMe pools
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
pub(crate) fn reachable(address: u64, len: u64) -> bool {
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
pub(crate) fn transport(
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
    let spin = hal::idle::spin_ns(SPIN_NS);
    log!(
        "idle: polling {} us after the last activity ({})",
        spin / 1000,
        if spin == 0 {
            "under a hypervisor: vCPUs share host cores"
        } else {
            "bare metal"
        }
    );
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
        if due.is_some_and(|due| due <= now) || now.saturating_sub(last_busy) < spin {
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
