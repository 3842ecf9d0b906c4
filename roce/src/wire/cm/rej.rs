//! CM REJ (attribute 0x0012): reject a REQ or a REP.
//!
//! ib-cm.md §4.6; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8 Message Rejected (7..6)
//! 9 Rejected Info Length (7..1) | 10-11 Reason
//! 12-83 Additional Rejection Information (ARI, 72) | 84-231 private data (148)
//! ```
//!
//! A server rejecting a REQ sends MessageRejected 0, LocalCommID 0, the REQ's
//! TID, and reason 8 (no listener) or 28 (refused).

use wire_enum::enum_with_unknown;

use core::fmt;

use super::super::bytes::{get_bits, read_u16_be, set_bits, write_u16_be};
use super::super::ParseError;
use super::{emit_private_data, MessageKind, TrimmedHex};

mod field {
    use crate::wire::bytes::Field;

    /// Message Rejected (2) | reserved (6).
    pub const MESSAGE: usize = 8;
    /// Rejected Info Length (7) | reserved (1).
    pub const ARI_LENGTH: usize = 9;
    pub const REASON: Field = 10..12;
    pub const ARI: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

/// Length of the ARI field.
pub const ARI_LEN: usize = field::ARI.end - field::ARI.start;

/// Length of the REJ private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

enum_with_unknown! {
    /// REJ reason codes (IBTA Vol. 1 Table 112; ib-cm.md §4.6).
    pub enum RejectReason(u16) {
        /// No QP available.
        NoQp = 1,
        /// No EE context available.
        NoEec = 2,
        /// No resources available.
        NoResources = 3,
        /// Timeout: the sender gave up waiting (ARI = its CA GUID).
        Timeout = 4,
        /// Unsupported request.
        Unsupported = 5,
        /// Invalid communication ID.
        InvalidCommId = 6,
        /// Invalid communication instance.
        InvalidCommInstance = 7,
        /// Invalid service ID: nobody listens there.
        InvalidServiceId = 8,
        /// Invalid transport service type.
        InvalidTransportType = 9,
        /// Stale connection: (GUID, QPN) or (GUID, comm ID) still in use.
        StaleConnection = 10,
        /// RDC does not exist.
        RdcNotExist = 11,
        /// Invalid primary GID (ARI = the correct GID).
        InvalidGid = 12,
        /// Invalid primary LID.
        InvalidLid = 13,
        /// Invalid primary SL.
        InvalidSl = 14,
        /// Invalid primary traffic class.
        InvalidTrafficClass = 15,
        /// Invalid primary hop limit.
        InvalidHopLimit = 16,
        /// Invalid primary packet rate.
        InvalidPacketRate = 17,
        /// Invalid alternate GID.
        InvalidAltGid = 18,
        /// Invalid alternate LID.
        InvalidAltLid = 19,
        /// Invalid alternate SL.
        InvalidAltSl = 20,
        /// Invalid alternate traffic class.
        InvalidAltTrafficClass = 21,
        /// Invalid alternate hop limit.
        InvalidAltHopLimit = 22,
        /// Invalid alternate packet rate.
        InvalidAltPacketRate = 23,
        /// Port CM redirection.
        PortCmRedirect = 24,
        /// Port redirection.
        PortRedirect = 25,
        /// Invalid path MTU.
        InvalidMtu = 26,
        /// Insufficient responder resources.
        InsufficientResponderResources = 27,
        /// Consumer defined: what `rdma_reject()` sends.
        ConsumerDefined = 28,
        /// Invalid RNR retry count.
        InvalidRnrRetry = 29,
        /// Duplicate local communication ID.
        DuplicateLocalCommId = 30,
        /// Invalid class version.
        InvalidClassVersion = 31,
        /// Invalid primary flow label.
        InvalidFlowLabel = 32,
        /// Invalid alternate flow label.
        InvalidAltFlowLabel = 33,
        /// Vendor option not supported (ECE).
        VendorOptionNotSupported = 35,
    }
}

cm_packet! {
    /// A read/write view of a REJ body.
    Packet "REJ";
    /// The 148-byte private data area.
    fn private_data;
    /// Local Communication ID (the sender's; 0 if it never allocated one).
    fn local_comm_id;
    /// Remote Communication ID (the receiver's).
    fn remote_comm_id;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Which message is rejected.
    pub fn message_rejected(&self) -> MessageKind {
        MessageKind::from(get_bits(self.buffer.as_ref()[field::MESSAGE], 6, 2))
    }

    /// Rejected Info Length: valid bytes of the ARI (7 bits).
    pub fn ari_length(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::ARI_LENGTH], 1, 7)
    }

    /// Reason.
    pub fn reason(&self) -> RejectReason {
        RejectReason::from(read_u16_be(&self.buffer.as_ref()[field::REASON]))
    }

    /// The whole 72-byte ARI field (see [`Self::ari_length`]).
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ARI]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets Message Rejected (low 2 bits of its code); clears the reserved bits.
    pub fn set_message_rejected(&mut self, value: MessageKind) {
        let byte = &mut self.buffer.as_mut()[field::MESSAGE];
        *byte = 0;
        set_bits(byte, 6, 2, value.into());
    }

    /// Sets Rejected Info Length (low 7 bits); clears the reserved bit.
    pub fn set_ari_length(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::ARI_LENGTH];
        *byte = 0;
        set_bits(byte, 1, 7, value);
    }

    /// Sets the Reason.
    pub fn set_reason(&mut self, value: RejectReason) {
        write_u16_be(&mut self.buffer.as_mut()[field::REASON], value.into());
    }

    /// The ARI field, mutably.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ARI]
    }
}

/// A parsed REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageKind,
    /// Reason.
    pub reason: RejectReason,
    /// The valid ARI bytes (Rejected Info Length of them; at most [`ARI_LEN`]).
    pub ari: &'a [u8],
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a REJ body. Bytes of the ARI field beyond Rejected Info Length are
    /// ignored.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes; [`ParseError::BadLength`]
    /// if Rejected Info Length exceeds the 72-byte ARI field.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let ari_len = usize::from(packet.ari_length());
        if ari_len > ARI_LEN {
            return Err(ParseError::BadLength);
        }
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_rejected: packet.message_rejected(),
            reason: packet.reason(),
            ari: &buffer[field::ARI][..ari_len],
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Writes the REJ body; Rejected Info Length is `ari.len()`.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes, `ari` is longer than [`ARI_LEN`]
    /// or `private_data` longer than [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_rejected(self.message_rejected);
        emit_private_data(packet.ari_mut(), self.ari);
        // Cannot truncate: emit_private_data has checked ari.len() <= 72.
        packet.set_ari_length(self.ari.len() as u8);
        packet.set_reason(self.reason);
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

/// The message fields on one line; the private data is left to the
/// [`PrettyPrinter`](crate::wire::PrettyPrinter).
impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM REJ lcomm={:#010x} rcomm={:#010x} message={:?} reason={:?} ari={}",
            self.local_comm_id,
            self.remote_comm_id,
            self.message_rejected,
            self.reason,
            TrimmedHex(self.ari)
        )
    }
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // A client giving up on a REQ: reason 4 (timeout), MessageRejected 2, ARI =
    // its CA GUID (ib-cm.md §4.6).
    const REJ_HEX: &str = "68bf50b40000000080100004505400fffe770002";
    const ARI: [u8; 8] = [0x50, 0x54, 0x00, 0xff, 0xfe, 0x77, 0x00, 0x02];

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            remote_comm_id: 0,
            message_rejected: MessageKind::Other,
            reason: RejectReason::Timeout,
            ari: &ARI,
            private_data,
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(REJ_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x68bf_50b4);
        assert_eq!(packet.message_rejected(), MessageKind::Other);
        assert_eq!(packet.ari_length(), 8);
        assert_eq!(packet.reason(), RejectReason::Timeout);
        assert_eq!(&packet.ari()[..8], &ARI);
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x68bf_50b4);
        packet.set_remote_comm_id(0);
        packet.set_message_rejected(MessageKind::Other);
        packet.set_ari_length(8);
        packet.set_reason(RejectReason::Timeout);
        emit_private_data(packet.ari_mut(), &ARI);
        packet.private_data_mut().fill(0);
        assert_eq!(body, body_from_hex(REJ_HEX));
    }

    #[test]
    fn test_parse_emit() {
        check_vector(
            REJ_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Rej),
            |private_data| Message::Rej(repr(private_data)),
        );
    }

    #[test]
    fn test_bad_ari_length() {
        let mut body = body_from_hex(REJ_HEX);
        body[field::ARI_LENGTH] = 73 << 1;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&body[..])),
            Err(ParseError::BadLength)
        );
    }
}
