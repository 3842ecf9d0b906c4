//! CM DREP (attribute 0x0016): the answer to a DREQ.
//!
//! ib-cm.md §4.7; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8-231 private data (224)
//! ```
//!
//! The DREP reuses the DREQ's TID; Linux answers even a DREQ for unknown IDs with a
//! DREP with swapped IDs. DREP private data never reaches rdma_cm users. The view
//! and `Repr` come from `cm_message!`: they are the comm IDs and private data.

mod field {
    use crate::wire::bytes::Field;

    pub const PRIVATE_DATA: Field = 8..232;
}

/// Length of the DREP private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

cm_message! {
    /// A read/write view of a DREP body.
    Packet "DREP";
    /// The 224-byte private data area.
    fn private_data;
    /// Local Communication ID (the sender's).
    fn local_comm_id;
    /// Remote Communication ID (the receiver's).
    fn remote_comm_id;
    /// A parsed DREP.
    Repr "a DREP" {}
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // rping-linux.pcap frame 45.
    const DREP_HEX: &str = "2b2507e668bf50b4";

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x2b25_07e6,
            remote_comm_id: 0x68bf_50b4,
            private_data,
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(DREP_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x2b25_07e6);
        assert_eq!(packet.remote_comm_id(), 0x68bf_50b4);
        assert!(packet.private_data().iter().all(|&b| b == 0));
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x2b25_07e6);
        packet.set_remote_comm_id(0x68bf_50b4);
        packet.private_data_mut().fill(0);
        assert_eq!(body, body_from_hex(DREP_HEX));
    }

    #[test]
    fn test_parse_emit() {
        check_vector(
            DREP_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Drep),
            |private_data| Message::Drep(repr(private_data)),
        );
    }
}
