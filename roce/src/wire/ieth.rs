//! Invalidate Extended Transport Header (IETH, 4 bytes).
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.3.6: the R_Key the responder invalidates when
//! the SEND with Invalidate completes (RTRS uses it to re-key client buffers).
//! Big-endian. After [`Packet::check_len`] succeeds no accessor panics.

use core::fmt;

use super::bytes::{read_u32_be, write_u32_be};
use super::ParseError;
use crate::types::Rkey;

mod field {
    use crate::wire::bytes::Field;

    pub const R_KEY: Field = 0..4;
}

/// Length of the IETH.
pub const HEADER_LEN: usize = field::R_KEY.end;

header_view!(
    /// A read/write view of an IETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32_be(&self.buffer.as_ref()[field::R_KEY]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: Rkey) {
        write_u32_be(&mut self.buffer.as_mut()[field::R_KEY], value.0);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "IETH ({err})"),
        }
    }
}

/// A parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: Rkey,
}

impl Repr {
    /// Parses an IETH.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            rkey: packet.rkey(),
        })
    }

    /// Length of the emitted header: 4.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the IETH.
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IETH rkey={}", self.rkey)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // rnbd-2cpu.pcap frame 29: SEND_ONLY_INV invalidating client rkey 0x371.
    static IETH: [u8; 4] = [0x00, 0x00, 0x03, 0x71];

    #[test]
    fn test_deconstruct() {
        assert_eq!(Packet::new_checked(&IETH[..]).unwrap().rkey(), Rkey(0x371));
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 4];
        Packet::new_unchecked(&mut buf[..]).set_rkey(Rkey(0x371));
        assert_eq!(buf, IETH);
    }

    #[test]
    fn test_parse() {
        let repr = Repr::parse(&Packet::new_unchecked(&IETH[..]));
        assert_eq!(repr, Ok(Repr { rkey: Rkey(0x371) }));
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&IETH[..2])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 4];
        Repr { rkey: Rkey(0x371) }.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, IETH);
    }
}
