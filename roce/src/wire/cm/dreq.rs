//! CM DREQ (attribute 0x0015): disconnect request.
//!
//! ib-cm.md §4.7; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8-10 Remote QPN/EECN | 11 reserved
//! 12-231 private data (220)
//! ```
//!
//! The Remote QPN is the *receiver's* QPN: Linux silently ignores a DREQ whose
//! Remote QPN is not its own, so a server closing a connection puts the client's
//! QPN (REQ.LocalQPN) there.

use core::fmt;

use super::super::bytes::{read_u24_be, read_u32_be, write_u24_be, write_u32_be};
use super::super::ParseError;
use super::{emit_private_data, BODY_LEN};
use crate::types::Qpn;

mod field {
    use crate::wire::bytes::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const REMOTE_QPN: Field = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Field = 12..232;
}

/// Length of the DREQ private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

header_view!(
    /// A read/write view of a DREQ body.
    Packet,
    BODY_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local Communication ID (the sender's).
    pub fn local_comm_id(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }

    /// Remote Communication ID (the receiver's).
    pub fn remote_comm_id(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }

    /// Remote QPN/EECN: the receiver's QPN.
    pub fn remote_qpn(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::REMOTE_QPN]))
    }

    /// The 220-byte private data area.
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, value: u32) {
        write_u32_be(&mut self.buffer.as_mut()[field::LOCAL_COMM_ID], value);
    }

    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, value: u32) {
        write_u32_be(&mut self.buffer.as_mut()[field::REMOTE_COMM_ID], value);
    }

    /// Sets the Remote QPN and clears the reserved byte after it.
    pub fn set_remote_qpn(&mut self, value: Qpn) {
        let buf = self.buffer.as_mut();
        write_u24_be(&mut buf[field::REMOTE_QPN], value.value());
        buf[field::RESERVED] = 0;
    }

    /// The private data area, mutably.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A parsed DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// The receiver's QPN.
    pub remote_qpn: Qpn,
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a DREQ body.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            remote_qpn: packet.remote_qpn(),
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Length of the emitted body: 232.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Writes the DREQ body.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes or `private_data` is longer than
    /// [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_remote_qpn(self.remote_qpn);
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM DREQ lcomm={:#010x} rcomm={:#010x} remote_qpn={}",
            self.local_comm_id, self.remote_comm_id, self.remote_qpn
        )
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(&Packet::new_unchecked(self.buffer.as_ref())) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "CM DREQ ({err})"),
        }
    }
}

#[cfg(test)]
mod test {
    use super::super::body_from_hex;
    use super::*;

    // rping-linux.pcap frame 44: the client's DREQ, Remote QPN = server QP 0x11.
    const DREQ_HEX: &str = "68bf50b42b2507e600001100";

    fn repr() -> Repr<'static> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0x2b25_07e6,
            remote_qpn: Qpn::new(0x11),
            private_data: &[],
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(DREQ_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x68bf_50b4);
        assert_eq!(packet.remote_comm_id(), 0x2b25_07e6);
        assert_eq!(packet.remote_qpn(), Qpn::new(0x11));
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x68bf_50b4);
        packet.set_remote_comm_id(0x2b25_07e6);
        packet.set_remote_qpn(Qpn::new(0x11));
        packet.private_data_mut().fill(0);
        assert_eq!(body, body_from_hex(DREQ_HEX));
    }

    #[test]
    fn test_parse() {
        let body = body_from_hex(DREQ_HEX);
        let parsed = Repr::parse(&Packet::new_unchecked(&body[..])).unwrap();
        assert_eq!(
            parsed,
            Repr {
                private_data: &body[field::PRIVATE_DATA],
                ..repr()
            }
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&body[..12])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut body = [0xa5u8; BODY_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut body[..]));
        assert_eq!(body, body_from_hex(DREQ_HEX));
    }
}
