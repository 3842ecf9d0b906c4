//! Atomic Acknowledge Extended Transport Header (AtomicAckETH, 8 bytes).
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.5.3: the original remote value (u64,
//! big-endian), after the AETH of an ATOMIC Acknowledge. After
//! [`Packet::check_len`] succeeds no accessor panics.

use core::fmt;

use super::bytes::{read_u64_be, write_u64_be};
use super::ParseError;

mod field {
    use crate::wire::bytes::Field;

    pub const ORIGINAL: Field = 0..8;
}

/// Length of the AtomicAckETH.
pub const HEADER_LEN: usize = field::ORIGINAL.end;

header_view!(
    /// A read/write view of an AtomicAckETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The value at the target before the atomic operation.
    pub fn original(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::ORIGINAL])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original value.
    pub fn set_original(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::ORIGINAL], value);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "AtomicAckETH ({err})"),
        }
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The original remote value.
    pub original: u64,
}

impl Repr {
    /// Parses an AtomicAckETH.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            original: packet.original(),
        })
    }

    /// Length of the emitted header: 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicAckETH.
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_original(self.original);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicAckETH original={:#x}", self.original)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static ATOMIC_ACK_ETH: [u8; 8] = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
    const REPR: Repr = Repr {
        original: 0x0102_0304_0506_0708,
    };

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&ATOMIC_ACK_ETH[..]).unwrap();
        assert_eq!(packet.original(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 8];
        Packet::new_unchecked(&mut buf[..]).set_original(0x0102_0304_0506_0708);
        assert_eq!(buf, ATOMIC_ACK_ETH);
    }

    #[test]
    fn test_parse() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ATOMIC_ACK_ETH[..])),
            Ok(REPR)
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&ATOMIC_ACK_ETH[..7])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ATOMIC_ACK_ETH);
    }
}
