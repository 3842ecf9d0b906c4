//! CM RTU (attribute 0x0014): "ready to use", the client's answer to a REP.
//!
//! ib-cm.md §4.4; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8-231 private data (224)
//! ```
//!
//! The server treats an RTU, or the first valid RC packet, as "established".
//! The view and `Repr` come from `cm_message!`: they are the comm IDs and
//! private data.

mod field {
    use crate::wire::bytes::Field;

    pub const PRIVATE_DATA: Field = 8..232;
}

/// Length of the RTU private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

cm_message! {
    /// A read/write view of an RTU body.
    Packet "RTU";
    /// The 224-byte private data area.
    fn private_data;
    /// Local Communication ID (the client's).
    fn local_comm_id;
    /// Remote Communication ID (the server's).
    fn remote_comm_id;
    /// A parsed RTU.
    Repr "an RTU" {}
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // rping-linux.pcap frame 7.
    const RTU_HEX: &str = "68bf50b42b2507e6";

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0x2b25_07e6,
            private_data,
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(RTU_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x68bf_50b4);
        assert_eq!(packet.remote_comm_id(), 0x2b25_07e6);
        assert!(packet.private_data().iter().all(|&b| b == 0));
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x68bf_50b4);
        packet.set_remote_comm_id(0x2b25_07e6);
        packet.private_data_mut().fill(0);
        assert_eq!(body, body_from_hex(RTU_HEX));
    }

    #[test]
    fn test_parse_emit() {
        check_vector(
            RTU_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Rtu),
            |private_data| Message::Rtu(repr(private_data)),
        );
    }
}
