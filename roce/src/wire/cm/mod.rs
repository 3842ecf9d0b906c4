//! IB Communication Manager messages (REQ, MRA, REJ, REP, RTU, DREQ, DREP).
//!
//! ib-cm.md §4 (IBTA Vol. 1 §12.6; offsets as in Linux `ibta_vol1_c12.h`): each
//! message is the 232-byte class data of a CM MAD (class 0x07, class version 2,
//! method SEND) sent as a UD SEND to QP1. Fields are big-endian; a field of
//! width w "at byte B bits 7..x" occupies the most significant bits of that
//! byte. Offsets in the submodules are relative to the CM body (MAD offset − 24).
//!
//! Each message has a `Packet` view over the body and a `Repr` whose private data
//! is a slice of the fixed-size area (the receiver always sees the whole area:
//! there is no length on the wire, ib-cm.md §4.1). [`Message`] dispatches on the
//! attribute ID; [`Repr`] is a whole CM MAD.
//!
//! Reserved bits are ignored on receive and sent as zero. Parsing checks lengths
//! only: whether a REQ is acceptable (transport type, MTU, service) is the CM
//! state machine's decision, answered with a REJ.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::mad::{self, MgmtClass};
use super::ParseError;

#[macro_use]
mod common;

pub mod drep;
pub mod dreq;
pub mod mra;
pub mod path;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;

pub use self::drep::{Packet as DrepPacket, Repr as DrepRepr};
pub use self::dreq::{Packet as DreqPacket, Repr as DreqRepr};
pub use self::mra::{Packet as MraPacket, Repr as MraRepr};
pub use self::path::{Packet as PathPacket, Repr as PathRepr};
pub use self::rej::{Packet as RejPacket, RejectReason, Repr as RejRepr};
pub use self::rep::{Packet as RepPacket, Repr as RepRepr};
pub use self::req::{Packet as ReqPacket, Repr as ReqRepr, TransportType};
pub use self::rtu::{Packet as RtuPacket, Repr as RtuRepr};

/// Length of every CM message body: the MAD class data (232 bytes).
pub const BODY_LEN: usize = mad::DATA_LEN;

/// The CM class version Linux routes on (`IB_CM_CLASS_VERSION`, roce-v2.md §3).
pub const CLASS_VERSION: u8 = 2;

enum_with_unknown! {
    /// CM attribute IDs (the MAD AttributeID of a CM MAD), ib-cm.md §4.1.
    pub enum AttributeId(u16) {
        /// ClassPortInfo.
        ClassPortInfo = 0x0001,
        /// Connection request.
        Req = 0x0010,
        /// Message receipt acknowledgement.
        Mra = 0x0011,
        /// Reject.
        Rej = 0x0012,
        /// Reply to a request.
        Rep = 0x0013,
        /// Ready to use.
        Rtu = 0x0014,
        /// Disconnect request.
        Dreq = 0x0015,
        /// Disconnect reply.
        Drep = 0x0016,
        /// Service ID resolution request.
        SidrReq = 0x0017,
        /// Service ID resolution reply.
        SidrRep = 0x0018,
        /// Load alternate path.
        Lap = 0x0019,
        /// Alternate path response.
        Apr = 0x001a,
    }
}

enum_with_unknown! {
    /// Which message an MRA acknowledges or a REJ rejects (2 bits).
    pub enum MessageKind(u8) {
        /// A REQ.
        Req = 0,
        /// A REP.
        Rep = 1,
        /// Something else (LAP).
        Other = 2,
    }
}

/// Copies `data` into a fixed-size private-data area and zeroes the rest.
///
/// # Panics
/// If `data` is longer than `area` (a programming error, documented on each
/// `emit` that uses it).
pub(crate) fn emit_private_data(area: &mut [u8], data: &[u8]) {
    assert!(
        data.len() <= area.len(),
        "private data longer than its {}-byte field",
        area.len()
    );
    let (used, rest) = area.split_at_mut(data.len());
    used.copy_from_slice(data);
    rest.fill(0);
}

/// Displays bytes as hex up to the last non-zero byte (at most 64 shown).
pub(crate) struct TrimmedHex<'a>(pub &'a [u8]);

impl fmt::Display for TrimmedHex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 64;
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        for byte in &self.0[..used.min(MAX)] {
            write!(f, "{byte:02x}")?;
        }
        if used > MAX {
            write!(f, "..(+{})", used - MAX)?;
        }
        if used == 0 {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// A CM body from the hex of its leading bytes, zero-padded (test vectors).
#[cfg(test)]
pub(crate) fn body_from_hex(hex: &str) -> [u8; BODY_LEN] {
    let mut body = [0u8; BODY_LEN];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let text = core::str::from_utf8(pair).unwrap();
        body[i] = u8::from_str_radix(text, 16).unwrap();
    }
    body
}

/// The `test_parse` and `test_emit` of one message against its vector.
///
/// `hex` is the vector ([`body_from_hex`]), `private_data` the message's
/// private-data field, `parse` the message's `Repr::parse` on an unchecked view,
/// and `repr` the message the vector holds, given its private data. Checks that:
/// - parsing the vector gives `repr` of the whole private-data area;
/// - parsing it one byte short fails with [`ParseError::Truncated`];
/// - emitting `repr` of the private data up to its last non-zero byte over a
///   `0xa5`-filled buffer gives the vector back byte for byte: every field,
///   reserved bit and unused private-data byte is written.
#[cfg(test)]
pub(crate) fn check_vector(
    hex: &str,
    private_data: crate::wire::bytes::Field,
    parse: impl Fn(&[u8]) -> Result<Message<'_>, ParseError>,
    repr: impl Fn(&[u8]) -> Message<'_>,
) {
    let body = body_from_hex(hex);
    assert_eq!(parse(&body[..]), Ok(repr(&body[private_data.clone()])));
    assert_eq!(parse(&body[..BODY_LEN - 1]), Err(ParseError::Truncated));

    let area = &body[private_data];
    let used = area.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut emitted = [0xa5u8; BODY_LEN];
    repr(&area[..used]).emit(&mut emitted);
    assert_eq!(emitted, body);
}

/// One CM message, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// Connection request (client → server).
    Req(ReqRepr<'a>),
    /// Message receipt acknowledgement.
    Mra(MraRepr<'a>),
    /// Reject.
    Rej(RejRepr<'a>),
    /// Reply (server → client).
    Rep(RepRepr<'a>),
    /// Ready to use.
    Rtu(RtuRepr<'a>),
    /// Disconnect request.
    Dreq(DreqRepr<'a>),
    /// Disconnect reply.
    Drep(DrepRepr<'a>),
}

impl<'a> Message<'a> {
    /// Parses a CM body according to its attribute ID.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if `body` is shorter than [`BODY_LEN`];
    /// [`ParseError::Unsupported`] for other attributes (SIDR, LAP, APR,
    /// ClassPortInfo, unknown): Linux drops unknown ones too.
    pub fn parse(attribute_id: AttributeId, body: &'a [u8]) -> Result<Message<'a>, ParseError> {
        Ok(match attribute_id {
            AttributeId::Req => Message::Req(ReqRepr::parse(&ReqPacket::new_checked(body)?)?),
            AttributeId::Mra => Message::Mra(MraRepr::parse(&MraPacket::new_checked(body)?)?),
            AttributeId::Rej => Message::Rej(RejRepr::parse(&RejPacket::new_checked(body)?)?),
            AttributeId::Rep => Message::Rep(RepRepr::parse(&RepPacket::new_checked(body)?)?),
            AttributeId::Rtu => Message::Rtu(RtuRepr::parse(&RtuPacket::new_checked(body)?)?),
            AttributeId::Dreq => Message::Dreq(DreqRepr::parse(&DreqPacket::new_checked(body)?)?),
            AttributeId::Drep => Message::Drep(DrepRepr::parse(&DrepPacket::new_checked(body)?)?),
            _ => return Err(ParseError::Unsupported),
        })
    }

    /// The attribute ID that carries this message.
    pub fn attribute_id(&self) -> AttributeId {
        match self {
            Message::Req(_) => AttributeId::Req,
            Message::Mra(_) => AttributeId::Mra,
            Message::Rej(_) => AttributeId::Rej,
            Message::Rep(_) => AttributeId::Rep,
            Message::Rtu(_) => AttributeId::Rtu,
            Message::Dreq(_) => AttributeId::Dreq,
            Message::Drep(_) => AttributeId::Drep,
        }
    }

    /// The message's private data (its whole fixed-size area when parsed).
    pub fn private_data(&self) -> &'a [u8] {
        match self {
            Message::Req(m) => m.private_data,
            Message::Mra(m) => m.private_data,
            Message::Rej(m) => m.private_data,
            Message::Rep(m) => m.private_data,
            Message::Rtu(m) => m.private_data,
            Message::Dreq(m) => m.private_data,
            Message::Drep(m) => m.private_data,
        }
    }

    /// Length of the emitted body: always [`BODY_LEN`].
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Writes the body (all 232 bytes: reserved bits and unused private data 0).
    ///
    /// # Panics
    /// If `body` is shorter than [`BODY_LEN`] or the private data is longer than
    /// the message's private-data field.
    pub fn emit(&self, body: &mut [u8]) {
        match self {
            Message::Req(m) => m.emit(&mut ReqPacket::new_unchecked(body)),
            Message::Mra(m) => m.emit(&mut MraPacket::new_unchecked(body)),
            Message::Rej(m) => m.emit(&mut RejPacket::new_unchecked(body)),
            Message::Rep(m) => m.emit(&mut RepPacket::new_unchecked(body)),
            Message::Rtu(m) => m.emit(&mut RtuPacket::new_unchecked(body)),
            Message::Dreq(m) => m.emit(&mut DreqPacket::new_unchecked(body)),
            Message::Drep(m) => m.emit(&mut DrepPacket::new_unchecked(body)),
        }
    }
}

impl fmt::Display for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::Req(m) => write!(f, "{m}"),
            Message::Mra(m) => write!(f, "{m}"),
            Message::Rej(m) => write!(f, "{m}"),
            Message::Rep(m) => write!(f, "{m}"),
            Message::Rtu(m) => write!(f, "{m}"),
            Message::Dreq(m) => write!(f, "{m}"),
            Message::Drep(m) => write!(f, "{m}"),
        }
    }
}

/// A whole CM MAD: the header fields that vary plus the message.
///
/// The fixed header fields are checked on parse and written on emit: base
/// version 1, class CM (0x07), class version 2, method SEND (roce-v2.md §3).
/// Status and ClassSpecific are ignored on receive, as the Linux CM does, and
/// sent as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Transaction ID: REP/MRA/REJ reuse the REQ's, DREP the DREQ's (ib-cm.md §4.1).
    pub transaction_id: u64,
    /// Attribute modifier (ECE for REQ/REP; Linux sends 0).
    pub attribute_modifier: u32,
    /// The CM message.
    pub message: Message<'a>,
}

impl<'a> Repr<'a> {
    /// Parses a CM MAD (the whole 256-byte UD payload of a GSI packet).
    ///
    /// # Errors
    /// - [`ParseError::BadLength`]: not exactly 256 bytes (checklist B: a MAD
    ///   payload of any other size is dropped);
    /// - [`ParseError::Unsupported`]: base version ≠ 1, class ≠ CM, class version
    ///   ≠ 2, method ≠ SEND, or an attribute other than the seven messages.
    pub fn parse(mad: &'a [u8]) -> Result<Repr<'a>, ParseError> {
        if mad.len() != mad::MAD_LEN {
            return Err(ParseError::BadLength);
        }
        let packet = mad::Packet::new_checked(mad)?;
        let header = mad::Repr::parse(&packet)?;
        if header.mgmt_class != MgmtClass::Cm
            || header.class_version != CLASS_VERSION
            || header.method != mad::Method::Send
        {
            return Err(ParseError::Unsupported);
        }
        let message = Message::parse(AttributeId::from(header.attribute_id), packet.payload())?;
        Ok(Repr {
            transaction_id: header.transaction_id,
            attribute_modifier: header.attribute_modifier,
            message,
        })
    }

    /// Length of the emitted MAD: 256.
    pub const fn buffer_len(&self) -> usize {
        mad::MAD_LEN
    }

    /// The MAD header this message is sent with.
    pub fn mad_header(&self) -> mad::Repr {
        mad::Repr {
            mgmt_class: MgmtClass::Cm,
            class_version: CLASS_VERSION,
            method: mad::Method::Send,
            status: 0,
            class_specific: 0,
            transaction_id: self.transaction_id,
            attribute_id: self.message.attribute_id().into(),
            attribute_modifier: self.attribute_modifier,
        }
    }

    /// Writes the 256-byte MAD.
    ///
    /// # Panics
    /// If `buf` is shorter than 256 bytes or the private data is too long for
    /// the message (see [`Message::emit`]).
    pub fn emit(&self, buf: &mut [u8]) {
        let mut packet = mad::Packet::new_unchecked(&mut buf[..mad::MAD_LEN]);
        self.mad_header().emit(&mut packet);
        self.message.emit(packet.payload_mut());
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tid={:#018x}", self.message, self.transaction_id)?;
        if self.attribute_modifier != 0 {
            write!(f, " attr_mod={:#010x}", self.attribute_modifier)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::types::Qpn;

    #[test]
    fn test_mad_round_trip() {
        let repr = Repr {
            transaction_id: 0x1234,
            attribute_modifier: 0,
            message: Message::Dreq(DreqRepr {
                local_comm_id: 0x0bad_cafe,
                remote_comm_id: 0x5a3c_0e21,
                remote_qpn: Qpn::new(0x11),
                private_data: &[0; dreq::PRIVATE_DATA_LEN],
            }),
        };
        let mut buf = [0xa5u8; 256];
        repr.emit(&mut buf);
        assert_eq!(&buf[..4], &[1, 7, 2, 3]);
        assert_eq!(&buf[16..18], &[0x00, 0x15]);
        assert_eq!(Repr::parse(&buf), Ok(repr));
        assert_eq!(Repr::parse(&buf[..255]), Err(ParseError::BadLength));
        buf[2] = 1;
        assert_eq!(Repr::parse(&buf), Err(ParseError::Unsupported));
        buf[2] = 2;
        buf[17] = 0x17;
        assert_eq!(Repr::parse(&buf), Err(ParseError::Unsupported));
    }

    #[test]
    #[should_panic]
    fn test_private_data_too_long_panics() {
        let mut area = [0u8; 4];
        emit_private_data(&mut area, &[1; 5]);
    }

    #[test]
    fn test_trimmed_hex() {
        assert_eq!(TrimmedHex(&[0x1b, 0xbd, 0, 0]).to_string(), "1bbd");
        assert_eq!(TrimmedHex(&[0; 8]).to_string(), "-");
        assert_eq!(TrimmedHex(&[1; 70]).to_string().len(), 128 + "..(+6)".len());
    }
}
