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

use super::super::bytes::{get_bits, set_bits};
use super::MessageKind;

mod field {
    use crate::wire::bytes::Field;

    /// Message MRAed (2) | reserved (6).
    pub const MESSAGE: usize = 8;
    /// Service Timeout (5) | reserved (3).
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: Field = 10..232;
}

/// Length of the MRA private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

cm_message! {
    /// A read/write view of an MRA body.
    Packet "MRA";
    /// The 222-byte private data area.
    fn private_data;
    /// Local Communication ID (the sender's).
    fn local_comm_id;
    /// Remote Communication ID (the receiver's).
    fn remote_comm_id;
    /// A parsed MRA.
    Repr "an MRA" {
        /// Which message is acknowledged.
        message_mraed: MessageKind => set_message_mraed,
        /// Service Timeout (5 bits).
        service_timeout: u8 => set_service_timeout,
    }
    Display " message={:?} service_timeout={}";
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Which message is acknowledged.
    pub fn message_mraed(&self) -> MessageKind {
        MessageKind::from(get_bits(self.buffer.as_ref()[field::MESSAGE], 6, 2))
    }

    /// Service Timeout (5-bit IB time exponent).
    pub fn service_timeout(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::SERVICE_TIMEOUT], 3, 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
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
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // MRA(REP) as a Linux client sends it for a duplicate REP: service timeout 24.
    const MRA_HEX: &str = "68bf50b42b2507e640c0";

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0x2b25_07e6,
            message_mraed: MessageKind::Rep,
            service_timeout: 24,
            private_data,
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
    fn test_parse_emit() {
        check_vector(
            MRA_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Mra),
            |private_data| Message::Mra(repr(private_data)),
        );
    }
}
