//! The loader proper: boot services until the jump (see `main.rs`).
//!
//! Unsafe: the copy of the image into the pages allocated at its physical
//! addresses, the handoff region's bytes, `exit_boot_services`, and the
//! jump into the image; each block says why it holds.

#![allow(unsafe_code)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use loader::{e820_type, Handoff, LoadPlan, MemoryMap, HANDOFF_MEMORY_TYPE, MEMMAP_ENTRIES};
use uefi::boot::{self, AllocateType, MemoryType};
use uefi::fs::FileSystem;
use uefi::mem::memory_map::MemoryMap as _;
use uefi::table::cfg::{ACPI2_GUID, ACPI_GUID};
use uefi::{cstr16, CStr16, Status};

/// The most bytes of one manifest slot (`manifest::slot::SLOT_BYTES`).
const SLOT_BYTES: usize = 1 << 20;

fn say(args: core::fmt::Arguments<'_>) {
    uefi::system::with_stdout(|out| {
        let _ = out.write_fmt(format_args!("[brick-loader] {args}\r\n"));
    });
}

/// Ends the machine through QEMU's isa-debug-exit with the image's
/// failure status (35); elsewhere the write is ignored and the loader
/// returns the error to the firmware.
fn give_up(args: core::fmt::Arguments<'_>) -> Status {
    say(format_args!("FATAL: {args}"));
    // SAFETY: port 0xf4 is QEMU's isa-debug-exit (absent on a real node,
    // where the write goes nowhere); writing it only stops the VM.
    unsafe { x86_port_write(0xf4, 0x11) };
    Status::LOAD_ERROR
}

/// `out dx, eax`.
///
/// # Safety
///
/// The port must be one whose write has no effect on memory safety.
unsafe fn x86_port_write(port: u16, value: u32) {
    // SAFETY: the caller vouches for the port.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack))
    };
}

fn rdtsc() -> u64 {
    let (low, high): (u32, u32);
    // SAFETY: `rdtsc` only reads the time-stamp counter.
    unsafe {
        core::arch::asm!("rdtsc", out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags))
    };
    (u64::from(high) << 32) | u64::from(low)
}

fn read(fs: &mut FileSystem, path: &CStr16) -> Option<Vec<u8>> {
    fs.read(path).ok()
}

#[uefi::entry]
fn main() -> Status {
    let tsc = rdtsc();
    say(format_args!("Brick loader {}", env!("CARGO_PKG_VERSION")));
    let image = match boot::get_image_file_system(boot::image_handle()) {
        Ok(protocol) => protocol,
        Err(error) => return give_up(format_args!("no file system on the boot device: {error}")),
    };
    let mut fs = FileSystem::new(image);
    let Some(kernel) = read(&mut fs, cstr16!("\\EFI\\BRICK\\KERNEL")) else {
        return give_up(format_args!(
            "\\EFI\\BRICK\\KERNEL is missing: rebuild the disk with `brick image build`"
        ));
    };
    let slots = [
        read(&mut fs, cstr16!("\\EFI\\BRICK\\MANIFEST.A")),
        read(&mut fs, cstr16!("\\EFI\\BRICK\\MANIFEST.B")),
    ];
    let extra = read(&mut fs, cstr16!("\\EFI\\BRICK\\CMDLINE"))
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_default();
    drop(fs);
    let plan = match LoadPlan::parse(&kernel) {
        Ok(plan) => plan,
        Err(error) => return give_up(format_args!("\\EFI\\BRICK\\KERNEL: {error}")),
    };
    let (start, end) = plan.range();
    let pages = ((end - start) / 4096) as usize;
    let placed =
        match boot::allocate_pages(AllocateType::Address(start), MemoryType::LOADER_CODE, pages) {
            Ok(pointer) => pointer,
            Err(error) => {
                return give_up(format_args!(
                    "cannot place the image at its link address [{start:#x}, {end:#x}): {error}"
                ))
            }
        };
    // SAFETY: the firmware just gave us `pages` pages at `start` (identity
    // mapped: UEFI's x86-64 paging is the identity); nothing else uses them.
    let target = unsafe { core::slice::from_raw_parts_mut(placed.as_ptr(), pages * 4096) };
    target.fill(0);
    for segment in &plan.segments {
        let at = (segment.address - start) as usize;
        target[at..at + segment.file_len]
            .copy_from_slice(&kernel[segment.file_offset..segment.file_offset + segment.file_len]);
    }
    let rsdp = uefi::system::with_config_table(|tables| {
        let find = |guid| {
            tables
                .iter()
                .find(|t| t.guid == guid)
                .map(|t| t.address as u64)
        };
        find(ACPI2_GUID).or_else(|| find(ACPI_GUID)).unwrap_or(0)
    });
    let handoff_len = Handoff {
        base: 0,
        slot_bytes: SLOT_BYTES,
    }
    .len();
    let region = match boot::allocate_pages(
        AllocateType::MaxAddress(0xffff_f000),
        MemoryType(HANDOFF_MEMORY_TYPE),
        handoff_len.div_ceil(4096),
    ) {
        Ok(pointer) => pointer,
        Err(error) => {
            return give_up(format_args!(
                "no memory below 4 GiB for the handoff: {error}"
            ))
        }
    };
    let handoff = Handoff {
        base: region.as_ptr() as u64,
        slot_bytes: SLOT_BYTES,
    };
    // SAFETY: pages the firmware just allocated (identity mapped), ours
    // until the image reads them; reported as reserved to the image.
    let bytes = unsafe { core::slice::from_raw_parts_mut(region.as_ptr(), handoff.len()) };
    let mut lens = [0usize; 2];
    for (index, slot) in slots.iter().enumerate() {
        if let Some(slot) = slot {
            let len = slot.len().min(SLOT_BYTES);
            let at = handoff.slot_offset(index);
            bytes[at..at + len].copy_from_slice(&slot[..len]);
            lens[index] = len;
        }
    }
    let cmdline = format!("manifest-slots loader-tsc={tsc} {}", extra.trim());
    say(format_args!(
        "image {} bytes at {start:#x}, entry {:#x}; slot A {} bytes, slot B {} bytes; RSDP {rsdp:#x}; \
         command line \"{}\"; exiting boot services",
        kernel.len(),
        plan.entry,
        lens[0],
        lens[1],
        cmdline.trim()
    ));
    let entry = plan.entry;
    // The e820 table is built in this memory after boot services are gone
    // (no allocation then): room for every UEFI descriptor and more.
    let scratch: Vec<(u64, u64, u32)> = Vec::with_capacity(1024);
    // SAFETY: no protocol is open any more (`fs` was dropped) and nothing
    // allocated from the pool is used after this point except `cmdline`,
    // `handoff` and `bytes`, which are plain memory (the pool allocator is
    // not called again).
    let map = unsafe { boot::exit_boot_services(None) };
    let converted = MemoryMap::build_in(
        map.entries().map(|descriptor| {
            (
                descriptor.phys_start,
                descriptor.page_count * 4096,
                e820_type(descriptor.ty.0),
            )
        }),
        scratch,
        MEMMAP_ENTRIES,
    );
    let Some(converted) = converted else {
        // No console now: the machine stops as on any other failure.
        // SAFETY: as in `give_up`.
        unsafe { x86_port_write(0xf4, 0x11) };
        loop {
            core::hint::spin_loop();
        }
    };
    handoff.write(bytes, lens, cmdline.trim(), rsdp, &converted);
    let start_info = handoff.base;
    // SAFETY: the image's segments are in place at their link addresses
    // (checked above) and `entry` is its 64-bit entry, which takes the
    // start info's physical address (below 4 GiB) in %rdi, needs nothing
    // of ours (it switches to its own stack, page tables and GDT) and
    // never returns. Interrupts are off from here.
    unsafe {
        core::arch::asm!(
            "cli",
            "jmp {entry}",
            entry = in(reg) entry,
            in("rdi") start_info,
            options(noreturn)
        )
    }
}
