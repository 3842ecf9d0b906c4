//! QEMU fw_cfg through the I/O ports (selector 0x510, data 0x511).
//!
//! Enough to fetch the boot manifest: the signature check, the file
//! directory (key 0x19; big-endian count, then 64-byte entries: size u32
//! BE, select u16 BE, reserved u16, name[56]) and a file read one byte per
//! port access — fine for a manifest of a few KiB. The DMA interface (for
//! large blobs) is the hal's fw_cfg driver's job.
//! Spec: QEMU `docs/specs/fw_cfg.rst`.

#![allow(unsafe_code)]

use crate::port::{inb, outw};

const SELECTOR: u16 = 0x510;
const DATA: u16 = 0x511;
const KEY_SIGNATURE: u16 = 0x0000;
const KEY_FILE_DIR: u16 = 0x0019;

/// A file in the fw_cfg directory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct File {
    /// Bytes.
    pub size: u32,
    /// Its selector key.
    pub key: u16,
}

fn select(key: u16) {
    // SAFETY: the image owns QEMU's fw_cfg ports; selecting an item only
    // resets the data port's read offset.
    unsafe { outw(SELECTOR, key) };
}

fn read(buffer: &mut [u8]) {
    for byte in buffer {
        // SAFETY: as in `select`; each read advances within the item (past
        // its end QEMU returns 0).
        *byte = unsafe { inb(DATA) };
    }
}

/// Whether fw_cfg is present (the "QEMU" signature).
pub fn present() -> bool {
    select(KEY_SIGNATURE);
    let mut signature = [0u8; 4];
    read(&mut signature);
    &signature == b"QEMU"
}

/// Looks `name` up in the file directory.
pub fn find(name: &str) -> Option<File> {
    if !present() {
        return None;
    }
    select(KEY_FILE_DIR);
    let mut count = [0u8; 4];
    read(&mut count);
    for _ in 0..u32::from_be_bytes(count) {
        let mut entry = [0u8; 64];
        read(&mut entry);
        let name_bytes = &entry[8..];
        let len = name_bytes.iter().position(|&b| b == 0).unwrap_or(56);
        if &name_bytes[..len] == name.as_bytes() {
            return Some(File {
                size: u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]),
                key: u16::from_be_bytes([entry[4], entry[5]]),
            });
        }
    }
    None
}

/// Reads `file` whole into `buffer` (`file.size` bytes long).
pub fn read_file(file: File, buffer: &mut [u8]) {
    select(file.key);
    read(buffer);
}
