//! `brick-loader`: the UEFI loader of the Brick image (x86_64-unknown-uefi).
//!
//! Started by the firmware from the ESP (`\EFI\BOOT\BOOTX64.EFI` on a
//! disk `brick image build` wrote), it reads `\EFI\BRICK\KERNEL` (the
//! `brick-image` ELF), the manifest slots `\EFI\BRICK\MANIFEST.A` and `.B`
//! and an optional `\EFI\BRICK\CMDLINE`, places the image at its physical
//! addresses, builds the PVH start info ([`loader::Handoff`]: the e820
//! map, the RSDP, the slots as modules 0 and 1, `manifest-slots
//! loader-tsc=N` on the command line), exits boot services and jumps to
//! the image's 64-bit entry. The image, not the loader, decides which slot
//! is in force and says why a medium is bad. A failure here is printed on
//! the firmware console and ends the machine through QEMU's
//! `isa-debug-exit` (status 35), or returns to the firmware elsewhere.
//!
//! Built for the host, this binary is only a stub that says how to build
//! it (so workspace builds pass).

#![cfg_attr(target_os = "uefi", no_std)]
#![cfg_attr(target_os = "uefi", no_main)]
#![deny(unsafe_code)]

#[cfg(not(target_os = "uefi"))]
fn main() {
    eprintln!(
        "brick-loader is the UEFI loader of the Brick image (x86_64-unknown-uefi): build it \
         with `cargo xtask image --uefi`, put it on a disk with `brick image build`"
    );
    std::process::exit(2);
}

#[cfg(target_os = "uefi")]
mod firmware;
