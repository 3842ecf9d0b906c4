//! Datagram Extended Transport Header (DETH, 8 bytes).
//!
//! roce-v2.md §1.5, §3, IBTA Vol. 1 §9.3.2: Q_Key (bytes 0-3), reserved
//! (byte 4), source QP (bytes 5-7), big-endian. Every UD packet carries one; on
//! QP1 the Q_Key must be 0x80010000. After [`Packet::check_len`] succeeds no
//! accessor panics.

use core::fmt;

use super::bytes::{read_u24_be, read_u32_be, write_u24_be, write_u32_be};
use super::ParseError;
use crate::types::{Qkey, Qpn};

mod field {
    use crate::wire::bytes::Field;

    pub const Q_KEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

/// Length of the DETH.
pub const HEADER_LEN: usize = field::SRC_QP.end;

header_view!(
    /// A read/write view of a DETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Q_Key.
    pub fn qkey(&self) -> Qkey {
        Qkey(read_u32_be(&self.buffer.as_ref()[field::Q_KEY]))
    }

    /// Source QP of the sender.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::SRC_QP]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, value: Qkey) {
        write_u32_be(&mut self.buffer.as_mut()[field::Q_KEY], value.0);
    }

    /// Sets the source QP and clears the reserved byte.
    pub fn set_src_qp(&mut self, value: Qpn) {
        let buf = self.buffer.as_mut();
        buf[field::RESERVED] = 0;
        write_u24_be(&mut buf[field::SRC_QP], value.value());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "DETH ({err})"),
        }
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key.
    pub qkey: Qkey,
    /// Source QP.
    pub src_qp: Qpn,
}

impl Repr {
    /// Parses a DETH; the reserved byte is ignored.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    /// Length of the emitted header: 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the DETH (reserved byte 0).
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_src_qp(self.src_qp);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DETH qkey={} srcqp={}", self.qkey, self.src_qp)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // Every MAD in the captures: GSI Q_Key, source QP 1.
    static DETH_GSI: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

    fn repr() -> Repr {
        Repr {
            qkey: Qkey::GSI,
            src_qp: Qpn::GSI,
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&DETH_GSI[..]).unwrap();
        assert_eq!(packet.qkey(), Qkey::GSI);
        assert_eq!(packet.src_qp(), Qpn::GSI);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 8];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_qkey(Qkey::GSI);
        packet.set_src_qp(Qpn::GSI);
        assert_eq!(buf, DETH_GSI);
    }

    #[test]
    fn test_parse() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&DETH_GSI[..])),
            Ok(repr())
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&DETH_GSI[..7])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 8];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, DETH_GSI);
    }
}
