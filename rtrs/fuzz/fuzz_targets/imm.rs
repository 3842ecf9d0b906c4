//! Fuzz `rtrs::wire::Imm` and `ImmLayout`: decode never panics, decoded known
//! types re-encode to a value that decodes the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtrs::wire::{Imm, ImmLayout};

fuzz_target!(|data: [u8; 6]| {
    let raw = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let imm = Imm::decode(raw);
    let _ = imm.to_string();
    if let Ok(encoded) = imm.encode() {
        assert_eq!(Imm::decode(encoded), imm);
    }
    if let Ok(layout) = ImmLayout::for_queue_depth(u16::from_le_bytes([data[4], data[5]])) {
        let (buf_id, offset) = layout.split(raw);
        assert_eq!(layout.join(buf_id, offset), Some(raw & 0x0fff_ffff));
    }
});
