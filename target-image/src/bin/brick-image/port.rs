//! x86 port I/O (`in`/`out`).
//!
//! Port I/O can reprogram any device (the PIC, the PIT, PCI config space),
//! so every accessor is `unsafe`: callers name the device they own.

#![allow(unsafe_code)]

use core::arch::asm;

/// Writes a byte to `port`.
///
/// # Safety
///
/// The caller owns the device behind `port` and the write has no effect on
/// memory safety (no DMA is started by it).
pub unsafe fn outb(port: u16, value: u8) {
    // SAFETY: forwarded to the caller (see `# Safety`).
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    };
}

/// Writes a 16-bit word to `port`.
///
/// # Safety
///
/// As for [`outb`].
pub unsafe fn outw(port: u16, value: u16) {
    // SAFETY: forwarded to the caller (see `# Safety`).
    unsafe {
        asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags))
    };
}

/// Writes a 32-bit word to `port`.
///
/// # Safety
///
/// As for [`outb`].
pub unsafe fn outl(port: u16, value: u32) {
    // SAFETY: forwarded to the caller (see `# Safety`).
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    };
}

/// Reads a byte from `port`.
///
/// # Safety
///
/// The caller owns the device behind `port` (a read can have side effects,
/// e.g. popping a FIFO).
pub unsafe fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: forwarded to the caller (see `# Safety`).
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack, preserves_flags))
    };
    value
}

/// Reads a 32-bit word from `port`.
///
/// # Safety
///
/// As for [`inb`].
pub unsafe fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: forwarded to the caller (see `# Safety`).
    unsafe {
        asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags))
    };
    value
}

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
}

/// Ends the VM through `isa-debug-exit`; halts forever if the device is
/// absent.
pub fn exit(code: ExitCode) -> ! {
    // SAFETY: port 0xf4 is QEMU's isa-debug-exit device (absent on other
    // machines, where the write is ignored); writing it only stops the VM.
    unsafe { outl(0xf4, code as u32) };
    loop {
        // SAFETY: interrupts are disabled first, so `hlt` parks the CPU
        // for good; nothing else runs.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}
