//! ACK Extended Transport Header (AETH, 4 bytes): ACK, RNR NAK and NAK.
//!
//! roce-v2.md §1.5, IBTA Vol. 1 §9.3.4: byte 0 is the syndrome, bytes 1-3 the
//! MSN (24 bits), big-endian. Syndrome bits 6..5 give the kind (00 ACK, 01 RNR
//! NAK, 11 NAK; 10 reserved), bits 4..0 the credit count, RNR timer code or NAK
//! code. rxe always sends 0x1F credits ("unlimited") and ignores them on receive.
//! After [`Packet::check_len`] succeeds no accessor panics.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::bytes::{read_u24_be, write_u24_be};
use super::ParseError;
use crate::types::Msn;

mod field {
    use crate::wire::bytes::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = field::MSN.end;

enum_with_unknown! {
    /// NAK code: the low five bits of a NAK syndrome (0x60 | code).
    pub enum NakCode(u8) {
        /// 0x60: PSN sequence error; the AETH PSN is the expected PSN.
        PsnSequenceError = 0,
        /// 0x61: invalid request (bad opcode sequence, length, access type).
        InvalidRequest = 1,
        /// 0x62: remote access error (R_Key, range or access rights).
        RemoteAccessError = 2,
        /// 0x63: remote operational error.
        RemoteOperationalError = 3,
        /// 0x64: invalid RD request (not used on RC).
        InvalidRdRequest = 4,
    }
}

/// The AETH syndrome, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// 0x00-0x1F: positive acknowledgement with a credit count (0x1F: unlimited).
    Ack {
        /// Credit count, 0..=31.
        credits: u8,
    },
    /// 0x20-0x3F: receiver not ready; retry after the timer code's delay.
    RnrNak {
        /// RNR timer code, 0..=31 (roce-v2.md §2.3.6).
        timer: u8,
    },
    /// 0x60-0x7F: negative acknowledgement.
    Nak(NakCode),
    /// 0x40-0x5F and 0x80-0xFF: reserved encodings, kept verbatim.
    Reserved(u8),
}

impl Syndrome {
    /// The ACK rxe sends: syndrome 0x1F, "unlimited/invalid credits".
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credits: 0x1f };

    /// `true` for every ACK-type syndrome (what READ responses must carry).
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl From<u8> for Syndrome {
    fn from(value: u8) -> Syndrome {
        let low = value & 0x1f;
        match value >> 5 {
            0b000 => Syndrome::Ack { credits: low },
            0b001 => Syndrome::RnrNak { timer: low },
            0b011 => Syndrome::Nak(NakCode::from(low)),
            _ => Syndrome::Reserved(value),
        }
    }
}

/// Encodes a syndrome; credit, timer and NAK codes are truncated to five bits.
impl From<Syndrome> for u8 {
    fn from(value: Syndrome) -> u8 {
        match value {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | (u8::from(code) & 0x1f),
            Syndrome::Reserved(raw) => raw,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            Syndrome::RnrNak { timer } => write!(f, "RNR_NAK timer={timer}"),
            Syndrome::Nak(NakCode::PsnSequenceError) => f.write_str("NAK psn_sequence_error"),
            Syndrome::Nak(NakCode::InvalidRequest) => f.write_str("NAK invalid_request"),
            Syndrome::Nak(NakCode::RemoteAccessError) => f.write_str("NAK remote_access_error"),
            Syndrome::Nak(NakCode::RemoteOperationalError) => {
                f.write_str("NAK remote_operational_error")
            }
            Syndrome::Nak(NakCode::InvalidRdRequest) => f.write_str("NAK invalid_rd_request"),
            Syndrome::Nak(NakCode::Unknown(code)) => write!(f, "NAK code={code}"),
            Syndrome::Reserved(raw) => write!(f, "reserved({raw:#04x})"),
        }
    }
}

header_view!(
    /// A read/write view of an AETH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.syndrome_raw())
    }

    /// Message Sequence Number.
    pub fn msn(&self) -> Msn {
        Msn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::MSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, value: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = value.into();
    }

    /// Sets the MSN.
    pub fn set_msn(&mut self, value: Msn) {
        write_u24_be(&mut self.buffer.as_mut()[field::MSN], value.value());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "AETH ({err})"),
        }
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message Sequence Number.
    pub msn: Msn,
}

impl Repr {
    /// Parses an AETH. Every syndrome byte is representable, so only the length
    /// can fail.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Length of the emitted header: 4.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AETH.
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AETH {} msn={}", self.syndrome, self.msn)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // Worked example 2 of roce-v2.md §1.8: ACK, syndrome 0x1F, MSN 1.
    static AETH_ACK: [u8; 4] = [0x1f, 0x00, 0x00, 0x01];
    // rnbd-lossy.pcap frame 76: NAK PSN sequence error, MSN 3.
    static AETH_NAK_SEQ: [u8; 4] = [0x60, 0x00, 0x00, 0x03];

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&AETH_ACK[..]).unwrap();
        assert_eq!(packet.syndrome(), Syndrome::ACK_UNLIMITED);
        assert_eq!(packet.msn(), Msn::new(1));
        let packet = Packet::new_checked(&AETH_NAK_SEQ[..]).unwrap();
        assert_eq!(packet.syndrome(), Syndrome::Nak(NakCode::PsnSequenceError));
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 4];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_syndrome(Syndrome::Nak(NakCode::PsnSequenceError));
        packet.set_msn(Msn::new(3));
        assert_eq!(buf, AETH_NAK_SEQ);
    }

    #[test]
    fn test_parse() {
        let repr = Repr::parse(&Packet::new_unchecked(&AETH_ACK[..]));
        let expected = Repr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: Msn::new(1),
        };
        assert_eq!(repr, Ok(expected));
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&AETH_ACK[..3])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 4];
        let repr = Repr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: Msn::new(1),
        };
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, AETH_ACK);
    }

    #[test]
    fn test_syndromes_round_trip() {
        for raw in 0..=255u8 {
            assert_eq!(u8::from(Syndrome::from(raw)), raw);
        }
        assert_eq!(Syndrome::from(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from(0x45), Syndrome::Reserved(0x45));
        assert_eq!(Syndrome::from(0x62).to_string(), "NAK remote_access_error");
    }
}
