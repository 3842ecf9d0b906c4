//! Atomic Extended Transport Header (AtomicETH, 28 bytes).
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.3.7: virtual address (u64), R_Key (u32),
//! swap-or-add data (u64), compare data (u64), packed and big-endian. Carried by
//! CmpSwap and FetchAdd (FetchAdd puts its addend in the swap/add slot). Brick
//! does not advertise atomics, but parses them so it can NAK them.
//! After [`Packet::check_len`] succeeds no accessor panics.

use core::fmt;

use super::bytes::{read_u32_be, read_u64_be, write_u32_be, write_u64_be};
use super::ParseError;
use crate::types::Rkey;

mod field {
    use crate::wire::bytes::Field;

    pub const VIRTUAL_ADDRESS: Field = 0..8;
    pub const R_KEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = field::COMPARE.end;

header_view!(
    /// A read/write view of an AtomicETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address of the 8-byte target.
    pub fn virtual_address(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::VIRTUAL_ADDRESS])
    }

    /// R_Key of the remote region.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32_be(&self.buffer.as_ref()[field::R_KEY]))
    }

    /// Swap (CmpSwap) or add (FetchAdd) data.
    pub fn swap_add(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::SWAP_ADD])
    }

    /// Compare data (CmpSwap).
    pub fn compare(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the virtual address.
    pub fn set_virtual_address(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::VIRTUAL_ADDRESS], value);
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, value: Rkey) {
        write_u32_be(&mut self.buffer.as_mut()[field::R_KEY], value.0);
    }

    /// Sets the swap/add data.
    pub fn set_swap_add(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::SWAP_ADD], value);
    }

    /// Sets the compare data.
    pub fn set_compare(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "AtomicETH ({err})"),
        }
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address (must be 8-byte aligned to be executed).
    pub virtual_address: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap or add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl Repr {
    /// Parses an AtomicETH.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 28 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    /// Length of the emitted header: 28.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicETH.
    ///
    /// # Panics
    /// If the buffer is shorter than 28 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AtomicETH va={:#018x} rkey={} swap_add={:#x} compare={:#x}",
            self.virtual_address, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static ATOMIC_ETH: [u8; 28] = [
        0x00, 0x00, 0x56, 0x4f, 0x97, 0xad, 0x6d, 0x50, // va
        0x00, 0x00, 0x05, 0x84, // rkey
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // swap/add
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // compare
    ];

    fn repr() -> Repr {
        Repr {
            virtual_address: 0x564f_97ad_6d50,
            rkey: Rkey(0x584),
            swap_add: 2,
            compare: 1,
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&ATOMIC_ETH[..]).unwrap();
        assert_eq!(packet.virtual_address(), 0x564f_97ad_6d50);
        assert_eq!(packet.rkey(), Rkey(0x584));
        assert_eq!(packet.swap_add(), 2);
        assert_eq!(packet.compare(), 1);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 28];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_virtual_address(0x564f_97ad_6d50);
        packet.set_rkey(Rkey(0x584));
        packet.set_swap_add(2);
        packet.set_compare(1);
        assert_eq!(buf, ATOMIC_ETH);
    }

    #[test]
    fn test_parse() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ATOMIC_ETH[..])),
            Ok(repr())
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ATOMIC_ETH[..27])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 28];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ATOMIC_ETH);
    }
}
