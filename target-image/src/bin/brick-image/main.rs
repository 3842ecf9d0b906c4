//! `brick-image`: the bare-metal Brick target (x86_64-unknown-none, PVH).
//!
//! Boot skeleton (issue 6): QEMU `-kernel` enters [`entry`] in 32-bit mode;
//! it reaches long mode and calls `brick_main`, which brings up the COM1
//! console, reads the PVH start info (memory map, modules, command line),
//! carves the heap and the preallocated DMA/registered-memory pool from the
//! memory map ([`target_image::boot`], host-tested), installs the idle
//! interrupts, calibrates the TSC, picks the randomness source, lists the
//! PCI functions, reads the manifest from fw_cfg `opt/brick/manifest`,
//! checks it and reports what it will serve. With a manifest and at least
//! one virtio-net device (`1af4:1041`) it then serves ([`serve`]): one NIC
//! per manifest interface, the engine over RAM volumes, the poll loop,
//! until the VM is stopped. Without a virtio-net device it runs the idle
//! check and exits (the boot test).
//!
//! Exit status through `isa-debug-exit` ([`port::ExitCode`]): 33 when the
//! boot checks pass, 35 on a panic or CPU exception, 37 for a refused
//! manifest, 39 when the manifest does not fit in memory, 41 when an
//! interface has no usable virtio-net device, 43 for a volume kind the
//! image does not serve yet (anything but RAM). Command line
//! words (`-append`): `idle` stays in the idle loop instead of exiting (to
//! watch host CPU use); `panic` and `fault` (a `ud2`) exercise the failure
//! paths.
//!
//! Build with `cargo xtask image`; run with `cargo xtask run-image`. On the
//! host this binary is only a stub that says so (it exists so that
//! `--all-features` builds of the workspace pass).
//!
//! Unsafe lives in: `entry` (PVH entry, page tables, GDT), `port` (port
//! I/O, isa-debug-exit), `serial`, `sync` (the spin lock), `memory` (boot
//! reads, the global allocator), `interrupts` (IDT, PIC, PIT, `hlt`),
//! `clock` (`rdtsc`), `rng` (`cpuid`, `rdrand`), `pci`, `fw_cfg`, `serve`
//! (the virtio transport and DMA region constructors). Every
//! block has a `// SAFETY:` line.

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
mod clock;
#[cfg(target_os = "none")]
mod entry;
#[cfg(target_os = "none")]
mod fw_cfg;
#[cfg(target_os = "none")]
mod interrupts;
#[cfg(target_os = "none")]
mod memory;
#[cfg(target_os = "none")]
mod pci;
#[cfg(target_os = "none")]
mod port;
#[cfg(target_os = "none")]
mod rng;
#[cfg(target_os = "none")]
mod serial;
#[cfg(target_os = "none")]
mod serve;
#[cfg(target_os = "none")]
mod sync;

#[cfg(target_os = "none")]
mod board {
    use alloc::vec;
    use alloc::vec::Vec;

    use hal::{Clock, Idle, Rng};
    use manifest::binary::Manifest;
    use target_image::boot::memory::{CarveError, FreeRanges, Range};
    use target_image::boot::pool::{PoolPlan, BOOT_HEAP_BYTES, POOL_ALIGN, RING_BYTES};
    use target_image::boot::pvh::{BootInfo, Bytes};

    use crate::clock::Tsc;
    use crate::interrupts::PitIdle;
    use crate::memory::{Identity, HEAP, IDENTITY_LIMIT};
    use crate::port::{exit, ExitCode};

    /// Name of the fw_cfg file holding the binary manifest.
    const MANIFEST_FILE: &str = "opt/brick/manifest";
    /// Largest manifest read (the format's strings and tables fit easily).
    const MAX_MANIFEST: u32 = 1 << 20;
    /// Free physical ranges tracked while carving.
    const BOOT_RANGES: usize = 64;

    fn fail(code: ExitCode, args: core::fmt::Arguments<'_>) -> ! {
        log!("FATAL: {args}");
        exit(code)
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

        let mut functions = 0;
        let mut virtio_nets = Vec::new();
        crate::pci::enumerate(|function| {
            functions += 1;
            if crate::serve::is_virtio_net(function) {
                virtio_nets.push(*function);
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
            "pci: {functions} functions, {} virtio-net",
            virtio_nets.len()
        );

        // With a manifest: the blob and the pool's ring part (for the NICs).
        let served = match crate::fw_cfg::find(MANIFEST_FILE) {
            None => {
                log!("manifest: no fw_cfg file {MANIFEST_FILE}: nothing to serve");
                None
            }
            Some(file) if file.size > MAX_MANIFEST => fail(
                ExitCode::BadManifest,
                format_args!(
                    "manifest: {MANIFEST_FILE} is {} bytes, at most {MAX_MANIFEST}",
                    file.size
                ),
            ),
            Some(file) => {
                let mut blob = vec![0u8; file.size as usize];
                crate::fw_cfg::read_file(file, &mut blob);
                log!("manifest: {} bytes from fw_cfg {MANIFEST_FILE}", blob.len());
                let manifest = match Manifest::parse(&blob) {
                    Ok(manifest) => manifest,
                    Err(error) => fail(
                        ExitCode::BadManifest,
                        format_args!("{error} (blob refused)"),
                    ),
                };
                report(&manifest);
                let plan = PoolPlan::for_manifest(&manifest);
                let available = free.total();
                if let Err(error) = manifest.check_memory(available) {
                    fail(ExitCode::NoMemory, format_args!("{error}"));
                }
                let pool = carve(&mut free, "pool", plan.bytes(), POOL_ALIGN);
                log!(
                    "pool (DMA + registered memory: chunk pools {} + rings {}): {pool}",
                    Bytes(plan.chunk_pools),
                    Bytes(plan.rings)
                );
                let stack = carve(
                    &mut free,
                    "engine stack",
                    crate::serve::ENGINE_STACK_BYTES,
                    4096,
                );
                log!("engine stack: {stack}");
                if free.total() < plan.heap_bytes() {
                    fail(
                        ExitCode::NoMemory,
                        format_args!(
                            "RAM volumes need {} of heap, {} left after the pool",
                            Bytes(plan.heap_bytes()),
                            Bytes(free.total())
                        ),
                    );
                }
                // The last RING_BYTES of the pool: NIC rings and buffers.
                let rings = Range {
                    start: pool.end - RING_BYTES.min(pool.len()),
                    end: pool.end,
                };
                Some((blob, rings, stack))
            }
        };

        // Everything not carved is heap (the engine's RAM volumes live there).
        for range in free.ranges() {
            // SAFETY: as for the boot heap: free RAM no one else uses; the
            // ranges are dropped from `free` right after.
            #[allow(unsafe_code)]
            unsafe {
                HEAP.add(range.start, range.len())
            };
        }
        let (heap_free, heap_ranges, _) = HEAP.stats();
        log!("heap: {} free in {heap_ranges} ranges", Bytes(heap_free));

        let now = clock.now();
        let since_reset = clock.ticks_to_ns(crate::clock::rdtsc());
        log!(
            "boot: {} us in the image, {} us since reset (TSC)",
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
            } else {
                crate::serve::on_stack(stack, move || {
                    let manifest = match Manifest::parse(&blob) {
                        Ok(manifest) => manifest,
                        Err(error) => fail(ExitCode::BadManifest, format_args!("{error}")),
                    };
                    crate::serve::check_volume_kinds(&manifest);
                    let nics = crate::serve::open_nics(&virtio_nets, &manifest, rings);
                    crate::serve::serve(manifest, nics, clock)
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
