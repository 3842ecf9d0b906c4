//! RDMA Extended Transport Header (RETH, 16 bytes).
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.3.3: virtual address (u64), R_Key (u32) and
//! DMA length (u32), big-endian. Carried by RDMA WRITE First/Only and RDMA READ
//! Request; the DMA length is that of the whole message, not of this packet.
//! After [`Packet::check_len`] succeeds no accessor panics.

use core::fmt;

use super::bytes::{read_u32_be, read_u64_be, write_u32_be, write_u64_be};
use super::ParseError;
use crate::types::Rkey;

mod field {
    use crate::wire::bytes::Field;

    pub const VIRTUAL_ADDRESS: Field = 0..8;
    pub const R_KEY: Field = 8..12;
    pub const DMA_LENGTH: Field = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = field::DMA_LENGTH.end;

header_view!(
    /// A read/write view of a RETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address of the first byte of the message in the remote region.
    pub fn virtual_address(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::VIRTUAL_ADDRESS])
    }

    /// R_Key of the remote region.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32_be(&self.buffer.as_ref()[field::R_KEY]))
    }

    /// DMA length: bytes of the whole message.
    pub fn dma_length(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::DMA_LENGTH])
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

    /// Sets the DMA length.
    pub fn set_dma_length(&mut self, value: u32) {
        write_u32_be(&mut self.buffer.as_mut()[field::DMA_LENGTH], value);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "RETH ({err})"),
        }
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub virtual_address: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Length of the whole RDMA message.
    pub dma_length: u32,
}

impl Repr {
    /// Parses a RETH.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 16 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            dma_length: packet.dma_length(),
        })
    }

    /// Length of the emitted header: 16.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the RETH.
    ///
    /// # Panics
    /// If the buffer is shorter than 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_dma_length(self.dma_length);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va={:#018x} rkey={} len={}",
            self.virtual_address, self.rkey, self.dma_length
        )
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // rping-linux.pcap frame 10: RDMA READ of 64 bytes at 0x564f97ad6d50, rkey 0x584.
    static RETH_READ: [u8; 16] = [
        0x00, 0x00, 0x56, 0x4f, 0x97, 0xad, 0x6d, 0x50, 0x00, 0x00, 0x05, 0x84, 0x00, 0x00, 0x00,
        0x40,
    ];

    fn repr() -> Repr {
        Repr {
            virtual_address: 0x564f_97ad_6d50,
            rkey: Rkey(0x584),
            dma_length: 64,
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&RETH_READ[..]).unwrap();
        assert_eq!(packet.virtual_address(), 0x564f_97ad_6d50);
        assert_eq!(packet.rkey(), Rkey(0x584));
        assert_eq!(packet.dma_length(), 64);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 16];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_virtual_address(0x564f_97ad_6d50);
        packet.set_rkey(Rkey(0x584));
        packet.set_dma_length(64);
        assert_eq!(buf, RETH_READ);
    }

    #[test]
    fn test_parse() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&RETH_READ[..])),
            Ok(repr())
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&RETH_READ[..15])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 16];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, RETH_READ);
    }
}
