//! Immediate Data Extended Transport Header (ImmDt, 4 bytes).
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.3.5: 32 opaque bits carried on the last/only
//! packet of a SEND or RDMA WRITE with immediate and delivered to the receiver's
//! completion. Brick reads it as a big-endian `u32`, which is how RTRS defines
//! its immediate layout. After [`Packet::check_len`] succeeds no accessor panics.

use core::fmt;

use super::bytes::{read_u32_be, write_u32_be};
use super::ParseError;

mod field {
    use crate::wire::bytes::Field;

    pub const IMMEDIATE: Field = 0..4;
}

/// Length of the ImmDt header.
pub const HEADER_LEN: usize = field::IMMEDIATE.end;

header_view!(
    /// A read/write view of an ImmDt header at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate value, big-endian.
    pub fn immediate(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::IMMEDIATE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate value.
    pub fn set_immediate(&mut self, value: u32) {
        write_u32_be(&mut self.buffer.as_mut()[field::IMMEDIATE], value);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "ImmDt ({err})"),
        }
    }
}

/// A parsed ImmDt header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The immediate value (network order read as a big-endian `u32`).
    pub immediate: u32,
}

impl Repr {
    /// Parses an ImmDt header.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            immediate: packet.immediate(),
        })
    }

    /// Length of the emitted header: 4.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the ImmDt header.
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_immediate(self.immediate);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImmDt {:#010x}", self.immediate)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // rnbd-2cpu.pcap frame 32: SEND_ONLY_IMM with imm 0x20000000 (RTRS IO_RSP_W_INV).
    static IMMDT: [u8; 4] = [0x20, 0x00, 0x00, 0x00];

    #[test]
    fn test_deconstruct() {
        assert_eq!(
            Packet::new_checked(&IMMDT[..]).unwrap().immediate(),
            0x2000_0000
        );
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 4];
        Packet::new_unchecked(&mut buf[..]).set_immediate(0x2000_0000);
        assert_eq!(buf, IMMDT);
    }

    #[test]
    fn test_parse() {
        let repr = Repr::parse(&Packet::new_unchecked(&IMMDT[..]));
        assert_eq!(
            repr,
            Ok(Repr {
                immediate: 0x2000_0000
            })
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&IMMDT[..3])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 4];
        Repr {
            immediate: 0x2000_0000,
        }
        .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, IMMDT);
    }
}
