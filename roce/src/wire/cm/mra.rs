//! CM MRA (attribute 0x0011): "message received, answer will take longer".
//!
//! ib-cm.md §4.5; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8 Message MRAed (7..6)
//! 9 Service Timeout (7..3) | 10-231 private data (222)
//! ```
//!
//! A server may send MRA(REQ) when it needs longer than the client's REQ timeout;
//! a Linux client sends MRA(REP) with service timeout 24 only for a duplicate REP.

use core::fmt;

use super::super::bytes::{get_bits, read_u32_be, set_bits, write_u32_be};
use super::super::ParseError;
use super::{emit_private_data, MessageKind, BODY_LEN};

mod field {
    use crate::wire::bytes::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message MRAed (2) | reserved (6).
    pub const MESSAGE: usize = 8;
    /// Service Timeout (5) | reserved (3).
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: Field = 10..232;
}

/// Length of the MRA private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

header_view!(
    /// A read/write view of an MRA body.
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

    /// Which message is acknowledged.
    pub fn message_mraed(&self) -> MessageKind {
        MessageKind::from(get_bits(self.buffer.as_ref()[field::MESSAGE], 6, 2))
    }

    /// Service Timeout (5-bit IB time exponent).
    pub fn service_timeout(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::SERVICE_TIMEOUT], 3, 5)
    }

    /// The 222-byte private data area.
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

    /// Sets Message MRAed (low 2 bits of its code); clears the reserved bits.
    pub fn set_message_mraed(&mut self, value: MessageKind) {
        let byte = &mut self.buffer.as_mut()[field::MESSAGE];
        *byte = 0;
        set_bits(byte, 6, 2, value.into());
    }

    /// Sets the Service Timeout (low 5 bits); clears the reserved bits.
    pub fn set_service_timeout(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::SERVICE_TIMEOUT];
        *byte = 0;
        set_bits(byte, 3, 5, value);
    }

    /// The private data area, mutably.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A parsed MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MessageKind,
    /// Service Timeout (5 bits).
    pub service_timeout: u8,
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses an MRA body.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_mraed: packet.message_mraed(),
            service_timeout: packet.service_timeout(),
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Length of the emitted body: 232.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Writes the MRA body.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes or `private_data` is longer than
    /// [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_mraed(self.message_mraed);
        packet.set_service_timeout(self.service_timeout);
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM MRA lcomm={:#010x} rcomm={:#010x} message={:?} service_timeout={}",
            self.local_comm_id, self.remote_comm_id, self.message_mraed, self.service_timeout
        )
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(&Packet::new_unchecked(self.buffer.as_ref())) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "CM MRA ({err})"),
        }
    }
}

#[cfg(test)]
mod test {
    use super::super::body_from_hex;
    use super::*;

    // MRA(REP) as a Linux client sends it for a duplicate REP: service timeout 24.
    const MRA_HEX: &str = "68bf50b42b2507e640c0";

    fn repr() -> Repr<'static> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0x2b25_07e6,
            message_mraed: MessageKind::Rep,
            service_timeout: 24,
            private_data: &[],
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(MRA_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x68bf_50b4);
        assert_eq!(packet.remote_comm_id(), 0x2b25_07e6);
        assert_eq!(packet.message_mraed(), MessageKind::Rep);
        assert_eq!(packet.service_timeout(), 24);
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x68bf_50b4);
        packet.set_remote_comm_id(0x2b25_07e6);
        packet.set_message_mraed(MessageKind::Rep);
        packet.set_service_timeout(24);
        packet.private_data_mut().fill(0);
        assert_eq!(body, body_from_hex(MRA_HEX));
    }

    #[test]
    fn test_parse() {
        let body = body_from_hex(MRA_HEX);
        let parsed = Repr::parse(&Packet::new_unchecked(&body[..])).unwrap();
        assert_eq!(
            parsed,
            Repr {
                private_data: &body[field::PRIVATE_DATA],
                ..repr()
            }
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&body[..10])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut body = [0xa5u8; BODY_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut body[..]));
        assert_eq!(body, body_from_hex(MRA_HEX));
    }
}
