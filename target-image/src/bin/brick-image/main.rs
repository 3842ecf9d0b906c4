//! `brick-image`: the bare-metal Brick target (x86_64-unknown-none, PVH).
//!
//! Boot skeleton (issue 6): QEMU `-kernel` enters [`entry`] in 32-bit mode,
//! the UEFI loader (`loader/`) at the 64-bit `brick_entry64`; both reach
//! `brick_main` in long mode, which brings up the COM1 console, reads the
//! PVH start info (memory map, modules, command line, RSDP), carves the
//! heap and the preallocated DMA/registered-memory pool from the memory
//! map ([`target_image::boot`], host-tested), installs the idle
//! interrupts, calibrates the TSC, picks the randomness source, walks PCI
//! (ECAM from ACPI MCFG, else the legacy ports), takes the manifest from
//! the boot disk's slot in force (`manifest-slots` on the command line:
//! modules 0 and 1) or from fw_cfg `opt/brick/manifest`, checks it and
//! reports what it will serve. With a manifest and at least one virtio-net
//! device (`1af4:1041`) it then serves ([`serve`]): one NIC per manifest
//! interface, the engine over RAM, virtio-blk (`1af4:1042`) and NVMe
//! (class 01:08:02) volumes, devices chosen by PCI address or serial
//! ([`disks::choose_disks`]), the poll loop, until the VM is stopped.
//! Without a virtio-net device it runs the idle check and exits (the boot
//! test).
//!
//! Exit status through `isa-debug-exit` ([`port::ExitCode`]): 33 when the
//! boot checks pass, 35 on a panic or CPU exception, 37 for a refused
//! manifest (also a disk volume whose PCI address or serial names no
//! device, a serial on two devices, a disk or namespace two volumes
//! select), 39 when the manifest does not fit in memory, 41 when an
//! interface has no usable virtio-net device, 43 for a volume kind the
//! image does not serve (files, host block devices), 45 for a boot disk
//! with no manifest, 47 when both its slots are corrupt, 49 for a manifest
//! newer than the image. Command line
//! words (`-append`): `idle` stays in the idle loop instead of exiting (to
//! watch host CPU use); `panic` and `fault` (a `ud2`) exercise the failure
//! paths; `zero-check` scans the heap for non-zero bytes at boot and
//! `no-pristine` clears every zeroed allocation (see the fresh-RAM
//! assumption in `main`); the loader adds `manifest-slots` and
//! `loader-tsc=N` (the TSC at its start, for the boot-time split).
//!
//! Build with `cargo xtask image`; run with `cargo xtask run-image`. On the
//! host this binary is only a stub that says so (it exists so that
//! `--all-features` builds of the workspace pass).
//!
//! The machine layer is the `x86_64` crate's (port I/O, the GDT and IDT,
//! control registers, page tables, `hlt`, RDRAND) and `spin`'s (the
//! console and heap locks, one-time tables); what stays `unsafe` is what
//! the hardware demands. Unsafe lives in: `entry` (PVH and 64-bit entry,
//! boot page tables, boot GDT), `port` (isa-debug-exit), `serial` (COM1
//! ports), `memory` (boot reads, the global allocator), `paging` (device
//! memory above 4 GiB), `interrupts` (the stubs' gates, the exception
//! frame, the segment reloads, PIC and PIT ports), `clock` (`rdtsc`, the
//! PIT), `main` (the heap ranges, the fw_cfg and PCI mechanisms), `serve`
//! (the virtio and NVMe register constructors, DMA regions, the
//! identity-DMA promise, the stack switch). Every block has a `// SAFETY:`
//! line.

#![cfg_attr(target_os = "none", no_std)]
#![cfg_attr(target_os = "none", no_main)]
#![deny(unsafe_code)]

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "brick-image is the bare-metal Brick image (x86_64-unknown-none): \
         build it with `cargo xtask image`, boot it with `cargo xtask run-image`"
    );
    std::process::exit(2);
}

#[cfg(target_os = "none")]
extern crate alloc;

/// Prints one line to the console (COM1), prefixed with `[brick]`.
#[cfg(target_os = "none")]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::serial::write_fmt(format_args!("[brick] {}\n", format_args!($($arg)*)))
    };
}

#[cfg(target_os = "none")]
mod admin;
#[cfg(target_os = "none")]
mod clock;
#[cfg(target_os = "none")]
mod disks;
#[cfg(target_os = "none")]
mod entry;
#[cfg(target_os = "none")]
mod interrupts;
#[cfg(target_os = "none")]
mod memory;
#[cfg(target_os = "none")]
mod paging;
#[cfg(target_os = "none")]
mod port;
#[cfg(target_os = "none")]
mod rng;
#[cfg(target_os = "none")]
mod serial;
#[cfg(target_os = "none")]
mod serve;
#[cfg(target_os = "none")]
mod thin_pools;

#[cfg(target_os = "none")]
mod board {
    use alloc::vec;
    use alloc::vec::Vec;

    use hal::{Clock, Idle, Rng};
    use manifest::binary::Manifest;
    use target_image::boot::memory::{CarveError, FreeRanges, Range};
    use target_image::boot::pool::{PoolPlan, BOOT_HEAP_BYTES, POOL_ALIGN};
    use target_image::boot::pvh::{BootInfo, Bytes};

    use crate::clock::Tsc;
    use crate::interrupts::PitIdle;
    use crate::memory::{Identity, HEAP, IDENTITY_LIMIT};
    use crate::port::{exit, ExitCode};

    use hal::fw_cfg::{FwCfg, MANIFEST_FILE};
    use hal::pci::{ConfigSpace, Mechanism};
    use manifest::binary::ReadError;
    use manifest::slot::BootMediaError;
    use target_image::boot::acpi::{self, Mcfg};
    use target_image::boot::pvh::PhysRead;
    /// Largest manifest read (the format's strings and tables fit easily).
    const MAX_MANIFEST: u32 = 1 << 20;
    /// Free physical ranges tracked while carving.
    const BOOT_RANGES: usize = 64;
    /// The top of RAM the firmware may have scribbled on (see the fresh-RAM
    /// assumption in `main`): not trusted to be zero.
    const FIRMWARE_SCRATCH_BYTES: u64 = 32 << 20;

    fn fail(code: ExitCode, args: core::fmt::Arguments<'_>) -> ! {
        log!("FATAL: {args}");
        exit(code)
    }

    /// Stops the boot for a manifest blob `Manifest::parse` refused: one
    /// newer than this image understands has its own status.
    fn refuse_blob(error: &ReadError) -> ! {
        match error {
            ReadError::UnsupportedVersion { found, supported } if found > supported => fail(
                ExitCode::ManifestTooNew,
                format_args!(
                    "{error} (blob refused): the manifest is newer than this image understands"
                ),
            ),
            _ => fail(
                ExitCode::BadManifest,
                format_args!("{error} (blob refused)"),
            ),
        }
    }

    /// The command-line word the UEFI loader passes when modules 0 and 1
    /// are the boot disk's manifest slots A and B.
    const SLOTS_WORD: &str = "manifest-slots";

    /// The manifest from the boot disk's slots (modules 0 and 1, copied
    /// out of the loader's memory): the slot in force, or the boot stops
    /// with the bad medium's own message and status.
    fn read_slots(info: &BootInfo) -> Vec<u8> {
        let module = |index: usize| -> Option<Vec<u8>> {
            let module = info.modules.get(index)?;
            if module.len == 0 {
                return None;
            }
            let len = usize::try_from(module.len)
                .ok()?
                .min(manifest::slot::SLOT_BYTES);
            let mut bytes = vec![0u8; len];
            Identity.read(module.start, &mut bytes).ok()?;
            Some(bytes)
        };
        let (a, b) = (module(0), module(1));
        match manifest::slot::choose(a.as_deref(), b.as_deref()) {
            Ok(chosen) => {
                let other = match &chosen.other {
                    Ok(sequence) => alloc::format!("valid, older (sequence {sequence})"),
                    Err(error) => alloc::format!("{error}"),
                };
                log!(
                    "manifest: {} (sequence {}) in force, {} bytes; {}: {other}",
                    chosen.name,
                    chosen.sequence,
                    chosen.blob.len(),
                    chosen.name.other()
                );
                chosen.blob.to_vec()
            }
            Err(error @ BootMediaError::NoManifest) => {
                fail(ExitCode::NoManifest, format_args!("{error}"))
            }
            Err(error @ BootMediaError::BothCorrupt { .. }) => {
                fail(ExitCode::SlotsCorrupt, format_args!("{error}"))
            }
            Err(error @ BootMediaError::TooNew { .. }) => {
                fail(ExitCode::ManifestTooNew, format_args!("{error}"))
            }
        }
    }

    /// PCI configuration space: ECAM from ACPI's MCFG when it names a
    /// window the image can map, else the legacy ports.
    fn pci_mechanism(rsdp: u64) -> Mechanism {
        let legacy = |why: core::fmt::Arguments<'_>| {
            log!("pci: {why}: legacy ports 0xcf8/0xcfc");
            // SAFETY: ring 0 on a PC-compatible machine (QEMU's pc or q35,
            // a storage node): ports 0xcf8-0xcff are the configuration
            // mechanism, used through this value only, on the one CPU.
            #[allow(unsafe_code)]
            let ports = unsafe { hal::pci::LegacyPorts::new() };
            Mechanism::Legacy(ports)
        };
        match acpi::find_mcfg(&Identity, rsdp) {
            Mcfg::Found { rsdp, window } => {
                if crate::memory::map_mmio(window.start(), window.len()).is_err() {
                    return legacy(format_args!("MCFG window {window} cannot be mapped"));
                }
                // SAFETY: the MCFG window (checksummed ACPI table) is the
                // configuration space of segment 0, mapped just now
                // (identity); nothing else in the image drives config space.
                #[allow(unsafe_code)]
                let ecam = unsafe {
                    hal::pci::Ecam::new(
                        window.start() as usize as *mut u8,
                        window.start_bus,
                        window.end_bus,
                    )
                };
                match ecam {
                    Some(ecam) => {
                        log!("pci: ECAM {window} (ACPI MCFG, RSDP at {rsdp:#x})");
                        Mechanism::Ecam(ecam)
                    }
                    None => legacy(format_args!("MCFG window {window} is misaligned")),
                }
            }
            Mcfg::NoMcfg { rsdp } => legacy(format_args!("no MCFG (RSDP at {rsdp:#x})")),
            Mcfg::NoRsdp => legacy(format_args!("no ACPI RSDP")),
        }
    }

    /// Carves `len` bytes or stops the boot.
    fn carve(free: &mut FreeRanges<BOOT_RANGES>, what: &str, len: u64, align: u64) -> Range {
        match free.carve(len, align) {
            Ok(start) => Range {
                start,
                end: start + len,
            },
            Err(error @ CarveError::NoRoom { .. }) => fail(
                ExitCode::NoMemory,
                format_args!("cannot carve the {what} ({}): {error}", Bytes(len)),
            ),
            Err(error) => fail(
                ExitCode::Failure,
                format_args!("cannot carve the {what}: {error}"),
            ),
        }
    }

    /// The manifest blob from fw_cfg (`None`: no fw_cfg or no such file),
    /// read by DMA into RAM carved for it (by the data port where the
    /// device has no DMA); a blob over [`MAX_MANIFEST`] stops the boot.
    fn read_manifest(free: &mut FreeRanges<BOOT_RANGES>) -> Option<Vec<u8>> {
        let mut access = crate::serve::dma_pool(carve(free, "fw_cfg DMA page", 4096, 4096));
        // SAFETY: the image runs in ring 0 on a QEMU x86 machine, whose
        // ports 0x510-0x51b are fw_cfg; nothing else in the image uses them.
        #[allow(unsafe_code)]
        let ports = unsafe { hal::fw_cfg::port::IoPorts::new() };
        let mut fw_cfg = FwCfg::new(ports, &mut access).ok()?;
        let file = match fw_cfg.find_file(MANIFEST_FILE) {
            Ok(Some(file)) => file,
            Ok(None) => return None,
            Err(error) => fail(ExitCode::BadManifest, format_args!("manifest: {error}")),
        };
        if file.size > MAX_MANIFEST {
            fail(
                ExitCode::BadManifest,
                format_args!(
                    "manifest: {MANIFEST_FILE} is {} bytes, at most {MAX_MANIFEST}",
                    file.size
                ),
            );
        }
        let mut blob = vec![0u8; file.size as usize];
        if fw_cfg.has_dma() && file.size > 0 {
            let len = u64::from(file.size).next_multiple_of(4096);
            let mut pool = crate::serve::dma_pool(carve(free, "manifest DMA buffer", len, 4096));
            let target = match pool.alloc(blob.len(), 8) {
                Ok(target) => target,
                Err(error) => fail(ExitCode::Failure, format_args!("manifest buffer: {error}")),
            };
            match fw_cfg.read_dma(file, &target) {
                Ok(read) if read == blob.len() => target.read_bytes(0, &mut blob),
                Ok(read) => fail(
                    ExitCode::BadManifest,
                    format_args!("manifest: fw_cfg DMA read {read} of {} bytes", blob.len()),
                ),
                Err(error) => fail(ExitCode::BadManifest, format_args!("manifest: {error}")),
            }
        } else {
            fw_cfg.read_bytes(file, &mut blob);
        }
        Some(blob)
    }

    pub fn main(start_info: u32) -> ! {
        crate::serial::init();
        log!("Brick image {} (PVH, x86_64)", env!("CARGO_PKG_VERSION"));

        let info = match BootInfo::read(&Identity, u64::from(start_info)) {
            Ok(info) => info,
            Err(error) => fail(ExitCode::Failure, format_args!("boot info: {error}")),
        };
        log!(
            "start info at {:#x}: version {}, {} modules, cmdline {:?}",
            info.start_info,
            info.version,
            info.modules.len(),
            info.cmdline.as_str()
        );
        log!("memory map ({} entries):", info.memory_map.len());
        for region in &info.memory_map {
            log!("  {region}");
        }
        for (i, module) in info.modules.iter().enumerate() {
            log!(
                "module {i}: [{:#x}, {:#x}) {}",
                module.start,
                module.start + module.len,
                Bytes(module.len)
            );
        }
        let image = crate::entry::image_range();
        log!(
            "image: [{:#x}, {:#x}) {}",
            image.0,
            image.1,
            Bytes(image.1 - image.0)
        );

        // Free RAM: above 1 MiB (below it: BIOS data, EBDA), below the end of
        // the identity map, minus the image and the loader's data.
        let mut free = FreeRanges::<BOOT_RANGES>::from_memory_map(
            &info.memory_map,
            core::iter::once(image).chain(info.in_use()),
            1 << 20,
            IDENTITY_LIMIT,
            4096,
        );
        log!(
            "free RAM below 4 GiB: {} in {} ranges",
            Bytes(free.total()),
            free.ranges().len()
        );
        let boot_heap = carve(&mut free, "boot heap", BOOT_HEAP_BYTES, 4096);
        // SAFETY: carved from the free RAM of the memory map, which excludes
        // the image and loader data; nothing else uses it.
        #[allow(unsafe_code)]
        unsafe {
            HEAP.add(boot_heap.start, boot_heap.len())
        };
        log!("boot heap: {boot_heap}");

        crate::interrupts::init();
        let hz = crate::clock::calibrate();
        let clock = Tsc {
            hz,
            base: crate::entry::boot_tsc(),
        };
        log!(
            "TSC: {}.{:03} MHz (calibrated against the PIT)",
            hz / 1_000_000,
            hz / 1000 % 1000
        );

        let mut rng = crate::rng::Source::detect();
        if rng.is_strong() {
            log!("randomness: RDRAND (sample {:#018x})", rng.next_u64());
        } else {
            log!("WARNING: no RDRAND: randomness is a TSC-seeded SplitMix64, NOT cryptographically strong");
        }

        let pci = pci_mechanism(info.rsdp);
        let mut functions = 0;
        let mut virtio_nets = Vec::new();
        let mut virtio_blks = Vec::new();
        let mut nvmes = Vec::new();
        hal::pci::enumerate(&pci, |function| {
            functions += 1;
            if crate::serve::is_virtio_net(function) {
                virtio_nets.push(*function);
            }
            if crate::serve::is_virtio_blk(function) {
                virtio_blks.push(*function);
            }
            if crate::serve::is_nvme(function) {
                nvmes.push(*function);
            }
            log!(
                "pci {} {:04x}:{:04x} class {:02x}{:02x}{:02x}",
                function.address,
                function.vendor,
                function.device,
                function.class[0],
                function.class[1],
                function.class[2]
            );
            for (i, bar) in function.bars.iter().enumerate() {
                if let Some(bar) = bar {
                    log!("    BAR{i} {bar}");
                }
            }
        });
        log!(
            "pci: {functions} functions ({}), {} virtio-net, {} virtio-blk, {} NVMe",
            pci,
            virtio_nets.len(),
            virtio_blks.len(),
            nvmes.len()
        );
        let _ = pci.space_len();

        // The manifest: from the boot disk's slots (UEFI loader), else from
        // fw_cfg (QEMU -kernel).
        let from_disk = info
            .cmdline
            .split_whitespace()
            .any(|word| word == SLOTS_WORD);
        let blob = if from_disk {
            Some(read_slots(&info))
        } else {
            let blob = read_manifest(&mut free);
            match &blob {
                None => log!("manifest: no fw_cfg file {MANIFEST_FILE}: nothing to serve"),
                Some(blob) => {
                    log!("manifest: {} bytes from fw_cfg {MANIFEST_FILE}", blob.len())
                }
            }
            blob
        };
        // With a manifest: the blob and the pool's ring part (for the NICs).
        let served = match blob {
            None => None,
            Some(blob) => {
                let manifest = match Manifest::parse(&blob) {
                    Ok(manifest) => manifest,
                    Err(error) => refuse_blob(&error),
                };
                report(&manifest);
                let plan = PoolPlan::for_manifest(&manifest);
                // One check, everything counted once: the pool (rings), the
                // engine stack and the heap (registered arenas + RAM
                // volumes) out of the free RAM.
                let needed = plan
                    .bytes()
                    .saturating_add(crate::serve::ENGINE_STACK_BYTES)
                    .saturating_add(plan.heap_bytes());
                if needed > free.total() {
                    fail(
                        ExitCode::NoMemory,
                        format_args!(
                            "the manifest needs {} (rings {} + engine stack {} + registered \
                             arenas {} + engine tables {} + RAM volumes {}), {} of RAM is \
                             free: give the guest more memory or lower [limits] queue_depth \
                             / max_sessions",
                            Bytes(needed),
                            Bytes(plan.bytes()),
                            Bytes(crate::serve::ENGINE_STACK_BYTES),
                            Bytes(plan.arenas),
                            Bytes(plan.tables),
                            Bytes(plan.ram_volumes),
                            Bytes(free.total())
                        ),
                    );
                }
                let pool = carve(&mut free, "pool", plan.bytes(), POOL_ALIGN);
                log!("pool (DMA: rings, frame buffers): {pool}");
                let stack = carve(
                    &mut free,
                    "engine stack",
                    crate::serve::ENGINE_STACK_BYTES,
                    4096,
                );
                log!("engine stack: {stack}");
                log!(
                    "heap needs: registered arenas {} + engine tables {} + RAM volumes {}",
                    Bytes(plan.arenas),
                    Bytes(plan.tables),
                    Bytes(plan.ram_volumes)
                );
                // The whole pool is the drivers' DMA memory.
                Some((blob, pool, stack))
            }
        };

        // Everything not carved is heap (the engine's RAM volumes and
        // registered arenas live there), given as zero-filled memory so
        // that `vec![0; n]` does not clear it again (~1 s under TCG for the
        // example manifest).
        //
        // ASSUMPTION: free RAM is zero when the image starts, except the
        // top FIRMWARE_SCRATCH_BYTES below the end of RAM. QEMU backs guest
        // RAM with fresh anonymous memory (zero-filled), a PVH boot loads
        // nothing but the image and the modules (excluded from `free`), and
        // SeaBIOS keeps its tables below 1 MiB or in ranges the map does
        // not list as RAM, but it also uses scratch memory near the top of
        // RAM that QEMU's memory map still calls free: measured with
        // `zero-check` on QEMU 7.2, ~200 KiB of non-zero bytes 16 MiB below
        // the end of RAM, at 832 MiB and at 1400 MiB of guest memory. That
        // top part joins the heap as ordinary (cleared-on-use) memory. A
        // warm reboot or another loader breaks the assumption: boot with
        // `zero-check` (`-append zero-check`) to scan the heap and report
        // non-zero bytes, and with `no-pristine` to clear as usual.
        let trust_zero = !info
            .cmdline
            .split_whitespace()
            .any(|word| word == "no-pristine");
        let zero_check = info
            .cmdline
            .split_whitespace()
            .any(|word| word == "zero-check");
        let end_of_ram = free
            .ranges()
            .iter()
            .map(|range| range.end)
            .max()
            .unwrap_or(0);
        let scratch_from = end_of_ram.saturating_sub(FIRMWARE_SCRATCH_BYTES);
        for range in free.ranges() {
            if zero_check {
                // SAFETY: free RAM inside the identity map, not yet used.
                #[allow(unsafe_code)]
                let (count, found) =
                    unsafe { crate::memory::nonzero_bytes(range.start, range.len()) };
                match found {
                    None => log!("zero-check {range}: all zero"),
                    Some((first, last)) => log!(
                        "zero-check {range}: {count} non-zero bytes in [{first:#x}, {:#x}]",
                        last + 7
                    ),
                }
            }
            let split = if trust_zero {
                scratch_from.clamp(range.start, range.end)
            } else {
                range.start
            };
            if split > range.start {
                // SAFETY: as for the boot heap: free RAM no one else uses;
                // the ranges are dropped from `free` right after.
                // Zero-filled: the assumption above (below the scratch).
                #[allow(unsafe_code)]
                unsafe {
                    HEAP.add_zeroed(range.start, split - range.start)
                };
            }
            if range.end > split {
                // SAFETY: as for the boot heap: free RAM no one else uses;
                // the ranges are dropped from `free` right after.
                #[allow(unsafe_code)]
                unsafe {
                    HEAP.add(split, range.end - split)
                };
            }
        }
        let (heap_free, heap_ranges, _) = HEAP.stats();
        log!(
            "heap: {} free in {heap_ranges} ranges, {} of it known zero",
            Bytes(heap_free),
            Bytes(HEAP.pristine())
        );

        let now = clock.now();
        let since_reset = clock.ticks_to_ns(crate::clock::rdtsc());
        // The UEFI loader passes the TSC at its start: firmware time is
        // reset to loader, loader time loader to image entry.
        let loader_tsc = info.cmdline.split_whitespace().find_map(|word| {
            word.strip_prefix("loader-tsc=")
                .and_then(|n| n.parse::<u64>().ok())
        });
        let phases = match loader_tsc {
            Some(tsc) if tsc <= crate::entry::boot_tsc() => crate::serve::BootPhases {
                firmware_ns: Some(clock.ticks_to_ns(tsc)),
                loader_ns: Some(clock.ticks_to_ns(crate::entry::boot_tsc() - tsc)),
            },
            _ => crate::serve::BootPhases {
                firmware_ns: Some(clock.ticks_to_ns(crate::entry::boot_tsc())),
                loader_ns: None,
            },
        };
        crate::serve::BOOT_PHASES.call_once(|| phases);
        log!(
            "boot: {} us in the image, {} us since reset (TSC); {phases}",
            now / 1000,
            since_reset / 1000
        );

        // Test hooks for the failure paths: `panic` and `fault` (a #UD).
        for word in info.cmdline.split_whitespace() {
            match word {
                "panic" => panic!("requested on the command line"),
                // SAFETY: `ud2` raises #UD on purpose; the exception handler
                // reports it and exits.
                #[allow(unsafe_code)]
                "fault" => unsafe { core::arch::asm!("ud2", options(nomem, nostack)) },
                _ => {}
            }
        }

        if let Some((blob, rings, stack)) = served {
            if virtio_nets.is_empty() {
                log!("net: no virtio-net device: boot checks only, not serving");
                // The disks are still chosen: the log shows which disk each
                // virtio-blk volume gets, and a bad choice refuses the
                // manifest (`run-image --disk` without `--nic`).
                if let Ok(manifest) = Manifest::parse(&blob) {
                    let mut pool = crate::serve::dma_pool(rings);
                    crate::disks::choose_disks(
                        &pci,
                        &virtio_blks,
                        &nvmes,
                        &manifest,
                        &mut pool,
                        &clock,
                    );
                }
            } else {
                crate::serve::on_stack(stack, move || {
                    let manifest = match Manifest::parse(&blob) {
                        Ok(manifest) => manifest,
                        Err(error) => fail(ExitCode::BadManifest, format_args!("{error}")),
                    };
                    crate::serve::check_volume_kinds(&manifest);
                    let mut pool = crate::serve::dma_pool(rings);
                    let disks = crate::disks::choose_disks(
                        &pci,
                        &virtio_blks,
                        &nvmes,
                        &manifest,
                        &mut pool,
                        &clock,
                    );
                    let nics = crate::serve::open_nics(&pci, &virtio_nets, &manifest, &mut pool);
                    crate::serve::serve(&pci, manifest, nics, disks, pool, clock)
                });
            }
        }

        let mut idle = PitIdle::new(clock);
        if info.cmdline.split_whitespace().any(|word| word == "idle") {
            log!("idle: halting until the next timer wake-up, forever (cmdline `idle`)");
            loop {
                idle.idle_until(None);
            }
        }
        // Show the idle path works: five 20 ms sleeps.
        let start = clock.now();
        for i in 1..=5u64 {
            idle.idle_until(Some(start + i * 20_000_000));
            while clock.now() < start + i * 20_000_000 {
                idle.idle_until(Some(start + i * 20_000_000));
            }
        }
        log!(
            "idle: 5 x 20 ms asleep in {} us with {} hlt wake-ups",
            (clock.now() - start) / 1000,
            idle.halts
        );
        log!("boot checks passed");
        exit(ExitCode::Success)
    }

    fn report(manifest: &Manifest<'_>) {
        let target = manifest.target();
        let limits = manifest.limits();
        log!(
            "target {:?}: RDMA CM port {}, always_invalidate {}",
            target.name,
            target.port,
            target.always_invalidate
        );
        log!(
            "limits: {} sessions x queue depth {} x chunk {}, {} paths/session, {} connections/path",
            limits.max_sessions,
            limits.queue_depth,
            Bytes(u64::from(limits.chunk_size)),
            limits.max_paths_per_session,
            limits.max_connections_per_path
        );
        for interface in manifest.interfaces() {
            log!("interface {interface}");
        }
        for volume in manifest.volumes() {
            log!("volume {volume}");
        }
        log!("access rules: {}", manifest.access_rule_count());
    }
}

/// The Rust entry, called by `entry::pvh_start` in long mode with the
/// physical address of the PVH start info.
#[cfg(target_os = "none")]
#[allow(unsafe_code)] // `no_mangle`: the entry code calls it by name.
#[no_mangle]
extern "C" fn brick_main(start_info: u32) -> ! {
    board::main(start_info)
}

#[cfg(target_os = "none")]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    serial::write_fmt_unlocked(format_args!("\n[brick] PANIC: {info}\n"));
    port::exit(port::ExitCode::Failure)
}
