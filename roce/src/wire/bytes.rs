//! Named big-endian (and the one little-endian) field helpers.
//!
//! IB transport headers, MADs and CM messages are big-endian; only the ICRC is
//! stored least-significant byte first (roce-v2.md §1.8). The helpers take the
//! exact field slice (`&buf[field::PSN]`) and panic if it is shorter than the
//! field: callers pass fixed ranges that `check_len` has already validated.

/// A byte range within a header.
pub(crate) type Field = core::ops::Range<usize>;

pub(crate) fn read_u16_be(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn read_u24_be(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

pub(crate) fn read_u32_be(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn read_u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn read_u64_be(b: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[..8]);
    u64::from_be_bytes(raw)
}

pub(crate) fn write_u16_be(b: &mut [u8], value: u16) {
    b[..2].copy_from_slice(&value.to_be_bytes());
}

/// Writes the low 24 bits of `value`.
pub(crate) fn write_u24_be(b: &mut [u8], value: u32) {
    b[..3].copy_from_slice(&value.to_be_bytes()[1..]);
}

pub(crate) fn write_u32_be(b: &mut [u8], value: u32) {
    b[..4].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_u32_le(b: &mut [u8], value: u32) {
    b[..4].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn write_u64_be(b: &mut [u8], value: u64) {
    b[..8].copy_from_slice(&value.to_be_bytes());
}

/// The `width`-bit field whose least significant bit is bit `shift` of `byte`
/// (bit 7 = MSB, as the specs number them).
pub(crate) const fn get_bits(byte: u8, shift: u32, width: u32) -> u8 {
    (byte >> shift) & ((1u16 << width) - 1) as u8
}

/// Stores the low `width` bits of `value` at bit `shift` of `byte`, keeping
/// the other bits.
pub(crate) fn set_bits(byte: &mut u8, shift: u32, width: u32, value: u8) {
    let mask = (((1u16 << width) - 1) as u8) << shift;
    *byte = (*byte & !mask) | ((value << shift) & mask);
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_round_trips() {
        let mut b = [0u8; 8];
        write_u24_be(&mut b, 0x12_3456);
        assert_eq!(b[..3], [0x12, 0x34, 0x56]);
        assert_eq!(read_u24_be(&b), 0x12_3456);
        write_u32_le(&mut b, 0xefd0_bc4d);
        assert_eq!(b[..4], [0x4d, 0xbc, 0xd0, 0xef]);
        assert_eq!(read_u32_le(&b), 0xefd0_bc4d);
        write_u64_be(&mut b, 0x0102_0304_0506_0708);
        assert_eq!(read_u64_be(&b), 0x0102_0304_0506_0708);
        let mut byte = 0b1010_1010;
        set_bits(&mut byte, 3, 5, 0b1_1111);
        assert_eq!(byte, 0b1111_1010);
        assert_eq!(get_bits(byte, 1, 2), 0b01);
        set_bits(&mut byte, 0, 8, 0x5a);
        assert_eq!(get_bits(byte, 0, 8), 0x5a);
    }
}
