//! CM DREP (attribute 0x0016): the answer to a DREQ.
//!
//! ib-cm.md §4.7; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8-231 private data (224)
//! ```
//!
//! The DREP reuses the DREQ's TID; Linux answers even a DREQ for unknown IDs with a
//! DREP with swapped IDs. DREP private data never reaches rdma_cm users.

use core::fmt;

use super::super::bytes::{read_u32_be, write_u32_be};
use super::super::ParseError;
use super::{emit_private_data, BODY_LEN};

mod field {
    use crate::wire::bytes::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

/// Length of the DREP private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

header_view!(
    /// A read/write view of a DREP body.
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

    /// The 224-byte private data area.
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

    /// The private data area, mutably.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// A parsed DREP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a DREP body.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Length of the emitted body: 232.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Writes the DREP body.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes or `private_data` is longer than
    /// [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM DREP lcomm={:#010x} rcomm={:#010x}",
            self.local_comm_id, self.remote_comm_id
        )
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(&Packet::new_unchecked(self.buffer.as_ref())) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "CM DREP ({err})"),
        }
    }
}

#[cfg(test)]
mod test {
    use super::super::body_from_hex;
    use super::*;

    // rping-linux.pcap frame 45.
    const DREP_HEX: &str = "2b2507e668bf50b4";

    fn repr() -> Repr<'static> {
        Repr {
            local_comm_id: 0x2b25_07e6,
            remote_comm_id: 0x68bf_50b4,
            private_data: &[],
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
    fn test_parse() {
        let body = body_from_hex(DREP_HEX);
        let parsed = Repr::parse(&Packet::new_unchecked(&body[..])).unwrap();
        assert_eq!(
            parsed,
            Repr {
                private_data: &body[field::PRIVATE_DATA],
                ..repr()
            }
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&body[..8])),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_emit() {
        let mut body = [0xa5u8; BODY_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut body[..]));
        assert_eq!(body, body_from_hex(DREP_HEX));
    }
}
