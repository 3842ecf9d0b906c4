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

use super::super::bytes::{read_u24_be, write_u24_be};
use crate::types::Qpn;

mod field {
    use crate::wire::bytes::Field;

    pub const REMOTE_QPN: Field = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Field = 12..232;
}

/// Length of the DREQ private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

cm_message! {
    /// A read/write view of a DREQ body.
    Packet "DREQ";
    /// The 220-byte private data area.
    fn private_data;
    /// Local Communication ID (the sender's).
    fn local_comm_id;
    /// Remote Communication ID (the receiver's).
    fn remote_comm_id;
    /// A parsed DREQ.
    Repr "a DREQ" {
        /// The receiver's QPN.
        remote_qpn: Qpn => set_remote_qpn,
    }
    Display " remote_qpn={}";
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote QPN/EECN: the receiver's QPN.
    pub fn remote_qpn(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::REMOTE_QPN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Remote QPN and clears the reserved byte after it.
    pub fn set_remote_qpn(&mut self, value: Qpn) {
        let buf = self.buffer.as_mut();
        write_u24_be(&mut buf[field::REMOTE_QPN], value.value());
        buf[field::RESERVED] = 0;
    }
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // rping-linux.pcap frame 44: the client's DREQ, Remote QPN = server QP 0x11.
    const DREQ_HEX: &str = "68bf50b42b2507e600001100";

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0x2b25_07e6,
            remote_qpn: Qpn::new(0x11),
            private_data,
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
    fn test_parse_emit() {
        check_vector(
            DREQ_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Dreq),
            |private_data| Message::Dreq(repr(private_data)),
        );
    }
}
