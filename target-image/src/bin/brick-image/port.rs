//! x86 port I/O (the `x86_64` crate's [`Port`]) and QEMU's isa-debug-exit.
//!
//! Port I/O can reprogram any device (the PIC, the PIT, PCI config space),
//! so every access is `unsafe`: callers name the device they own.

#![allow(unsafe_code)]

pub use x86_64::instructions::port::Port;

/// Exit codes written to QEMU's `isa-debug-exit` device (iobase 0xf4,
/// iosize 4); QEMU exits with `(code << 1) | 1`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum ExitCode {
    /// The boot checks passed (QEMU status 33).
    Success = 0x10,
    /// A panic or CPU exception (QEMU status 35).
    Failure = 0x11,
    /// The manifest blob was refused (QEMU status 37).
    BadManifest = 0x12,
    /// The machine cannot hold what the manifest preallocates (QEMU status 39).
    NoMemory = 0x13,
    /// A manifest interface has no usable virtio-net device (QEMU status 41).
    NoNic = 0x14,
    /// The manifest asks for a volume kind the image does not serve yet
    /// (QEMU status 43).
    Unsupported = 0x15,
    /// Booted from a disk with no manifest in either slot (QEMU status 45).
    NoManifest = 0x16,
    /// Both manifest slots of the boot disk are corrupt (QEMU status 47).
    SlotsCorrupt = 0x17,
    /// The manifest is newer than this image understands (QEMU status 49).
    ManifestTooNew = 0x18,
}

/// Ends the VM through `isa-debug-exit`; halts forever if the device is
/// absent.
pub fn exit(code: ExitCode) -> ! {
    // SAFETY: port 0xf4 is QEMU's isa-debug-exit device (absent on other
    // machines, where the write is ignored); writing it only stops the VM.
    unsafe { Port::<u32>::new(0xf4).write(code as u32) };
    // With interrupts off, `hlt` parks the CPU for good; nothing else runs.
    x86_64::instructions::interrupts::disable();
    loop {
        x86_64::instructions::hlt();
    }
}
