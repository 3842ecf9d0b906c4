//! InfiniBand Base Transport Header (BTH, 12 bytes): the first IB header.
//!
//! Layout (roce-v2.md §1.4, IBTA Vol. 1 §9.2), big-endian, bit 7 = MSB:
//!
//! ```text
//! byte 0     OpCode
//! byte 1     SE(7) | M(6) | PadCnt(5..4) | TVer(3..0)
//! bytes 2-3  P_Key
//! byte 4     FECN(7) | BECN(6) | Resv6a(5..0)     -- ICRC-masked
//! bytes 5-7  DestQP
//! byte 8     AckReq(7) | Resv7(6..0)
//! bytes 9-11 PSN
//! ```
//!
//! The opcode decides which extended transport headers follow, in the fixed IBTA
//! order DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH (§1.6); see
//! [`Opcode::ext_headers`]. After [`Packet::check_len`] succeeds no accessor panics.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::bytes::{get_bits, read_u16_be, read_u24_be, set_bits, write_u16_be, write_u24_be};
use super::ParseError;
use crate::types::{Pkey, Psn, Qpn};

mod field {
    use crate::wire::bytes::Field;

    pub const OPCODE: usize = 0;
    /// SE | M | PadCnt | TVer.
    pub const FLAGS: usize = 1;
    pub const P_KEY: Field = 2..4;
    /// FECN | BECN | Resv6a.
    pub const ECN: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq | Resv7.
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = field::PSN.end;

enum_with_unknown! {
    /// BTH OpCode: transport (top 3 bits) and operation (roce-v2.md §1.6).
    ///
    /// All RC and UD opcodes, the UC SEND/WRITE family and the RoCEv2 CNP are
    /// named; RD, XRC and reserved values are `Unknown`.
    pub enum Opcode(u8) {
        /// RC SEND First.
        RcSendFirst = 0x00,
        /// RC SEND Middle.
        RcSendMiddle = 0x01,
        /// RC SEND Last.
        RcSendLast = 0x02,
        /// RC SEND Last with Immediate (ImmDt).
        RcSendLastWithImmediate = 0x03,
        /// RC SEND Only.
        RcSendOnly = 0x04,
        /// RC SEND Only with Immediate (ImmDt).
        RcSendOnlyWithImmediate = 0x05,
        /// RC RDMA WRITE First (RETH).
        RcRdmaWriteFirst = 0x06,
        /// RC RDMA WRITE Middle.
        RcRdmaWriteMiddle = 0x07,
        /// RC RDMA WRITE Last.
        RcRdmaWriteLast = 0x08,
        /// RC RDMA WRITE Last with Immediate (ImmDt).
        RcRdmaWriteLastWithImmediate = 0x09,
        /// RC RDMA WRITE Only (RETH).
        RcRdmaWriteOnly = 0x0a,
        /// RC RDMA WRITE Only with Immediate (RETH, ImmDt).
        RcRdmaWriteOnlyWithImmediate = 0x0b,
        /// RC RDMA READ Request (RETH, no payload).
        RcRdmaReadRequest = 0x0c,
        /// RC RDMA READ Response First (AETH).
        RcRdmaReadResponseFirst = 0x0d,
        /// RC RDMA READ Response Middle.
        RcRdmaReadResponseMiddle = 0x0e,
        /// RC RDMA READ Response Last (AETH).
        RcRdmaReadResponseLast = 0x0f,
        /// RC RDMA READ Response Only (AETH).
        RcRdmaReadResponseOnly = 0x10,
        /// RC Acknowledge: ACK or NAK (AETH, no payload).
        RcAcknowledge = 0x11,
        /// RC ATOMIC Acknowledge (AETH, AtomicAckETH).
        RcAtomicAcknowledge = 0x12,
        /// RC CmpSwap (AtomicETH).
        RcCompareSwap = 0x13,
        /// RC FetchAdd (AtomicETH).
        RcFetchAdd = 0x14,
        /// RC SEND Last with Invalidate (IETH).
        RcSendLastWithInvalidate = 0x16,
        /// RC SEND Only with Invalidate (IETH).
        RcSendOnlyWithInvalidate = 0x17,
        /// UC SEND First.
        UcSendFirst = 0x20,
        /// UC SEND Middle.
        UcSendMiddle = 0x21,
        /// UC SEND Last.
        UcSendLast = 0x22,
        /// UC SEND Last with Immediate (ImmDt).
        UcSendLastWithImmediate = 0x23,
        /// UC SEND Only.
        UcSendOnly = 0x24,
        /// UC SEND Only with Immediate (ImmDt).
        UcSendOnlyWithImmediate = 0x25,
        /// UC RDMA WRITE First (RETH).
        UcRdmaWriteFirst = 0x26,
        /// UC RDMA WRITE Middle.
        UcRdmaWriteMiddle = 0x27,
        /// UC RDMA WRITE Last.
        UcRdmaWriteLast = 0x28,
        /// UC RDMA WRITE Last with Immediate (ImmDt).
        UcRdmaWriteLastWithImmediate = 0x29,
        /// UC RDMA WRITE Only (RETH).
        UcRdmaWriteOnly = 0x2a,
        /// UC RDMA WRITE Only with Immediate (RETH, ImmDt).
        UcRdmaWriteOnlyWithImmediate = 0x2b,
        /// UD SEND Only (DETH): every MAD on QP1.
        UdSendOnly = 0x64,
        /// UD SEND Only with Immediate (DETH, ImmDt).
        UdSendOnlyWithImmediate = 0x65,
        /// RoCEv2 Congestion Notification Packet (16 reserved payload bytes);
        /// rxe drops it.
        Cnp = 0x81,
    }
}

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (0x00-0x1F).
    Rc,
    /// Unreliable Connected (0x20-0x3F).
    Uc,
    /// Reliable Datagram (0x40-0x5F).
    Rd,
    /// Unreliable Datagram (0x60-0x7F), including the GSI QP.
    Ud,
    /// CNP (0x80-0x9F).
    Cnp,
    /// XRC and reserved (0xA0-0xFF).
    Other,
}

/// A set of extended transport headers, as an opcode prescribes them.
///
/// Iterating with [`ExtSet::iter`] yields them in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtSet(u8);

impl ExtSet {
    /// No extended header.
    pub const NONE: ExtSet = ExtSet(0);
    /// Datagram ETH (8 bytes).
    pub const DETH: ExtSet = ExtSet(1 << 0);
    /// RDMA ETH (16 bytes).
    pub const RETH: ExtSet = ExtSet(1 << 1);
    /// Atomic ETH (28 bytes).
    pub const ATOMIC_ETH: ExtSet = ExtSet(1 << 2);
    /// ACK ETH (4 bytes).
    pub const AETH: ExtSet = ExtSet(1 << 3);
    /// Atomic ACK ETH (8 bytes).
    pub const ATOMIC_ACK_ETH: ExtSet = ExtSet(1 << 4);
    /// Immediate data (4 bytes).
    pub const IMMDT: ExtSet = ExtSet(1 << 5);
    /// Invalidate ETH (4 bytes).
    pub const IETH: ExtSet = ExtSet(1 << 6);

    /// Every header kind, in wire order, with its length.
    const ORDER: [(ExtSet, usize); 7] = [
        (ExtSet::DETH, super::deth::HEADER_LEN),
        (ExtSet::RETH, super::reth::HEADER_LEN),
        (ExtSet::ATOMIC_ETH, super::atomic_eth::HEADER_LEN),
        (ExtSet::AETH, super::aeth::HEADER_LEN),
        (ExtSet::ATOMIC_ACK_ETH, super::atomic_ack_eth::HEADER_LEN),
        (ExtSet::IMMDT, super::immdt::HEADER_LEN),
        (ExtSet::IETH, super::ieth::HEADER_LEN),
    ];

    /// The union of two sets.
    #[must_use]
    pub const fn union(self, other: ExtSet) -> ExtSet {
        ExtSet(self.0 | other.0)
    }

    /// `true` if every header in `other` is in `self`.
    pub const fn contains(self, other: ExtSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length of the headers in the set.
    pub fn len(self) -> usize {
        usize::from(ExtSet::LENGTHS[usize::from(self.0 & 0x7f)])
    }

    /// [`len`](Self::len) of every set, computed once: the receive path asks
    /// for every packet.
    const LENGTHS: [u8; 128] = {
        let mut lengths = [0u8; 128];
        let mut set: usize = 0;
        while set < 128 {
            let mut at = 0;
            while at < ExtSet::ORDER.len() {
                let (header, len) = ExtSet::ORDER[at];
                if set as u8 & header.0 == header.0 {
                    lengths[set] += len as u8;
                }
                at += 1;
            }
            set += 1;
        }
        lengths
    };

    /// `true` for the empty set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The single-header sets in `self`, in wire order, with their lengths.
    pub fn iter(self) -> impl Iterator<Item = (ExtSet, usize)> {
        ExtSet::ORDER
            .into_iter()
            .filter(move |(header, _)| self.contains(*header))
    }
}

impl Opcode {
    /// The transport service, from the top three bits.
    pub fn transport(self) -> Transport {
        match u8::from(self) >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            _ => Transport::Other,
        }
    }

    /// The extended headers that follow the BTH, or `None` for an opcode whose
    /// layout Brick does not know (`Unknown`): such packets are dropped.
    pub fn ext_headers(self) -> Option<ExtSet> {
        use Opcode::*;
        Some(match self {
            RcSendFirst
            | RcSendMiddle
            | RcSendLast
            | RcSendOnly
            | RcRdmaWriteMiddle
            | RcRdmaWriteLast
            | RcRdmaReadResponseMiddle => ExtSet::NONE,
            UcSendFirst | UcSendMiddle | UcSendLast | UcSendOnly | UcRdmaWriteMiddle
            | UcRdmaWriteLast | Cnp => ExtSet::NONE,
            RcSendLastWithImmediate | RcSendOnlyWithImmediate | RcRdmaWriteLastWithImmediate => {
                ExtSet::IMMDT
            }
            UcSendLastWithImmediate | UcSendOnlyWithImmediate | UcRdmaWriteLastWithImmediate => {
                ExtSet::IMMDT
            }
            RcRdmaWriteFirst | RcRdmaWriteOnly | RcRdmaReadRequest => ExtSet::RETH,
            UcRdmaWriteFirst | UcRdmaWriteOnly => ExtSet::RETH,
            RcRdmaWriteOnlyWithImmediate | UcRdmaWriteOnlyWithImmediate => {
                ExtSet::RETH.union(ExtSet::IMMDT)
            }
            RcRdmaReadResponseFirst
            | RcRdmaReadResponseLast
            | RcRdmaReadResponseOnly
            | RcAcknowledge => ExtSet::AETH,
            RcAtomicAcknowledge => ExtSet::AETH.union(ExtSet::ATOMIC_ACK_ETH),
            RcCompareSwap | RcFetchAdd => ExtSet::ATOMIC_ETH,
            RcSendLastWithInvalidate | RcSendOnlyWithInvalidate => ExtSet::IETH,
            UdSendOnly => ExtSet::DETH,
            UdSendOnlyWithImmediate => ExtSet::DETH.union(ExtSet::IMMDT),
            Unknown(_) => return None,
        })
    }

    /// Short IBTA-style name, e.g. `RC_SEND_ONLY`.
    pub fn name(self) -> &'static str {
        use Opcode::*;
        match self {
            RcSendFirst => "RC_SEND_FIRST",
            RcSendMiddle => "RC_SEND_MIDDLE",
            RcSendLast => "RC_SEND_LAST",
            RcSendLastWithImmediate => "RC_SEND_LAST_IMM",
            RcSendOnly => "RC_SEND_ONLY",
            RcSendOnlyWithImmediate => "RC_SEND_ONLY_IMM",
            RcRdmaWriteFirst => "RC_RDMA_WRITE_FIRST",
            RcRdmaWriteMiddle => "RC_RDMA_WRITE_MIDDLE",
            RcRdmaWriteLast => "RC_RDMA_WRITE_LAST",
            RcRdmaWriteLastWithImmediate => "RC_RDMA_WRITE_LAST_IMM",
            RcRdmaWriteOnly => "RC_RDMA_WRITE_ONLY",
            RcRdmaWriteOnlyWithImmediate => "RC_RDMA_WRITE_ONLY_IMM",
            RcRdmaReadRequest => "RC_RDMA_READ_REQUEST",
            RcRdmaReadResponseFirst => "RC_RDMA_READ_RESPONSE_FIRST",
            RcRdmaReadResponseMiddle => "RC_RDMA_READ_RESPONSE_MIDDLE",
            RcRdmaReadResponseLast => "RC_RDMA_READ_RESPONSE_LAST",
            RcRdmaReadResponseOnly => "RC_RDMA_READ_RESPONSE_ONLY",
            RcAcknowledge => "RC_ACKNOWLEDGE",
            RcAtomicAcknowledge => "RC_ATOMIC_ACKNOWLEDGE",
            RcCompareSwap => "RC_COMPARE_SWAP",
            RcFetchAdd => "RC_FETCH_ADD",
            RcSendLastWithInvalidate => "RC_SEND_LAST_INV",
            RcSendOnlyWithInvalidate => "RC_SEND_ONLY_INV",
            UcSendFirst => "UC_SEND_FIRST",
            UcSendMiddle => "UC_SEND_MIDDLE",
            UcSendLast => "UC_SEND_LAST",
            UcSendLastWithImmediate => "UC_SEND_LAST_IMM",
            UcSendOnly => "UC_SEND_ONLY",
            UcSendOnlyWithImmediate => "UC_SEND_ONLY_IMM",
            UcRdmaWriteFirst => "UC_RDMA_WRITE_FIRST",
            UcRdmaWriteMiddle => "UC_RDMA_WRITE_MIDDLE",
            UcRdmaWriteLast => "UC_RDMA_WRITE_LAST",
            UcRdmaWriteLastWithImmediate => "UC_RDMA_WRITE_LAST_IMM",
            UcRdmaWriteOnly => "UC_RDMA_WRITE_ONLY",
            UcRdmaWriteOnlyWithImmediate => "UC_RDMA_WRITE_ONLY_IMM",
            UdSendOnly => "UD_SEND_ONLY",
            UdSendOnlyWithImmediate => "UD_SEND_ONLY_IMM",
            Cnp => "CNP",
            Unknown(_) => "UNKNOWN",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(value) => write!(f, "UNKNOWN({value:#04x})"),
            known => f.write_str(known.name()),
        }
    }
}

header_view!(
    /// A read/write view of a BTH at the start of a buffer.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// SE: solicited event.
    pub fn solicited_event(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::FLAGS], 7, 1) != 0
    }

    /// M: migration request (rxe sends 0 and ignores it).
    pub fn mig_req(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::FLAGS], 6, 1) != 0
    }

    /// PadCnt: pad bytes (0..=3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::FLAGS], 4, 2)
    }

    /// TVer: transport header version, must be 0.
    pub fn transport_version(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::FLAGS], 0, 4)
    }

    /// P_Key.
    pub fn pkey(&self) -> Pkey {
        Pkey(read_u16_be(&self.buffer.as_ref()[field::P_KEY]))
    }

    /// FECN: forward explicit congestion notification (ICRC-masked).
    pub fn fecn(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::ECN], 7, 1) != 0
    }

    /// BECN: backward explicit congestion notification (ICRC-masked).
    pub fn becn(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::ECN], 6, 1) != 0
    }

    /// Resv6a: reserved bits of byte 4 (ICRC-masked; sent as 0).
    pub fn reserved_6a(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::ECN], 0, 6)
    }

    /// DestQP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::DEST_QP]))
    }

    /// AckReq: the responder must acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        get_bits(self.buffer.as_ref()[field::ACK_REQ], 7, 1) != 0
    }

    /// Resv7: reserved bits of byte 8 (sent as 0).
    pub fn reserved_7(&self) -> u8 {
        get_bits(self.buffer.as_ref()[field::ACK_REQ], 0, 7)
    }

    /// PSN.
    pub fn psn(&self) -> Psn {
        Psn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the OpCode.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value.into();
    }

    /// Sets SE.
    pub fn set_solicited_event(&mut self, value: bool) {
        set_bits(&mut self.buffer.as_mut()[field::FLAGS], 7, 1, value.into());
    }

    /// Sets M.
    pub fn set_mig_req(&mut self, value: bool) {
        set_bits(&mut self.buffer.as_mut()[field::FLAGS], 6, 1, value.into());
    }

    /// Sets PadCnt (low two bits of `value`).
    pub fn set_pad_count(&mut self, value: u8) {
        set_bits(&mut self.buffer.as_mut()[field::FLAGS], 4, 2, value);
    }

    /// Sets TVer (low four bits of `value`).
    pub fn set_transport_version(&mut self, value: u8) {
        set_bits(&mut self.buffer.as_mut()[field::FLAGS], 0, 4, value);
    }

    /// Sets the P_Key.
    pub fn set_pkey(&mut self, value: Pkey) {
        write_u16_be(&mut self.buffer.as_mut()[field::P_KEY], value.0);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, value: bool) {
        set_bits(&mut self.buffer.as_mut()[field::ECN], 7, 1, value.into());
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, value: bool) {
        set_bits(&mut self.buffer.as_mut()[field::ECN], 6, 1, value.into());
    }

    /// Sets Resv6a (low six bits of `value`).
    pub fn set_reserved_6a(&mut self, value: u8) {
        set_bits(&mut self.buffer.as_mut()[field::ECN], 0, 6, value);
    }

    /// Sets DestQP.
    pub fn set_dest_qp(&mut self, value: Qpn) {
        write_u24_be(&mut self.buffer.as_mut()[field::DEST_QP], value.value());
    }

    /// Sets AckReq.
    pub fn set_ack_req(&mut self, value: bool) {
        set_bits(
            &mut self.buffer.as_mut()[field::ACK_REQ],
            7,
            1,
            value.into(),
        );
    }

    /// Sets Resv7 (low seven bits of `value`).
    pub fn set_reserved_7(&mut self, value: u8) {
        set_bits(&mut self.buffer.as_mut()[field::ACK_REQ], 0, 7, value);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, value: Psn) {
        write_u24_be(&mut self.buffer.as_mut()[field::PSN], value.value());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "BTH ({err})"),
        }
    }
}

/// A parsed BTH. Reserved bits (Resv6a, Resv7) are dropped on parse and sent
/// as zero; TVer must be 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode (may be `Unknown`: the frame parser rejects it, this repr does not).
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request.
    pub mig_req: bool,
    /// PadCnt, 0..=3.
    pub pad_count: u8,
    /// P_Key.
    pub pkey: Pkey,
    /// FECN (ICRC-masked).
    pub fecn: bool,
    /// BECN (ICRC-masked).
    pub becn: bool,
    /// DestQP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// Parses a BTH.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 12 bytes; [`ParseError::Unsupported`]
    /// if TVer ≠ 0 (rxe `hdr_check()` drops those).
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        if packet.transport_version() != 0 {
            return Err(ParseError::Unsupported);
        }
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited_event(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the emitted header: 12.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH (TVer 0, reserved bits 0; only the low two bits of
    /// `pad_count` are used).
    ///
    /// # Panics
    /// If the buffer is shorter than 12 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        packet.buffer.as_mut()[field::FLAGS] = 0;
        packet.set_solicited_event(self.solicited);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_count(self.pad_count);
        packet.set_pkey(self.pkey);
        packet.buffer.as_mut()[field::ECN] = 0;
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.buffer.as_mut()[field::ACK_REQ] = 0;
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH {} qp={} psn={}",
            self.opcode, self.dest_qp, self.psn
        )?;
        if self.pkey != Pkey::DEFAULT {
            write!(f, " pkey={}", self.pkey)?;
        }
        for (set, name) in [
            (self.ack_req, " ackreq"),
            (self.solicited, " se"),
            (self.mig_req, " m"),
            (self.fecn, " fecn"),
            (self.becn, " becn"),
        ] {
            if set {
                f.write_str(name)?;
            }
        }
        if self.pad_count != 0 {
            write!(f, " pad={}", self.pad_count)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // Worked example 1 of roce-v2.md §1.8: RC SEND_ONLY, PadCnt 3, QP 0x123,
    // AckReq, PSN 0x123456.
    static BTH_RC_SEND_ONLY: [u8; 12] = [
        0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x01, 0x23, 0x80, 0x12, 0x34, 0x56,
    ];

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 3,
            pkey: Pkey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x123),
            ack_req: true,
            psn: Psn::new(0x12_3456),
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&BTH_RC_SEND_ONLY[..]).unwrap();
        assert_eq!(packet.opcode(), Opcode::RcSendOnly);
        assert!(!packet.solicited_event());
        assert_eq!(packet.pad_count(), 3);
        assert_eq!(packet.transport_version(), 0);
        assert_eq!(packet.pkey(), Pkey(0xffff));
        assert!(!packet.fecn() && !packet.becn());
        assert_eq!(packet.dest_qp(), Qpn::new(0x123));
        assert!(packet.ack_req());
        assert_eq!(packet.psn(), Psn::new(0x12_3456));
        assert!(packet.payload().is_empty());
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 12];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_opcode(Opcode::RcSendOnly);
        packet.set_solicited_event(false);
        packet.set_mig_req(false);
        packet.set_pad_count(3);
        packet.set_transport_version(0);
        packet.set_pkey(Pkey::DEFAULT);
        packet.set_fecn(false);
        packet.set_becn(false);
        packet.set_reserved_6a(0);
        packet.set_dest_qp(Qpn::new(0x123));
        packet.set_ack_req(true);
        packet.set_reserved_7(0);
        packet.set_psn(Psn::new(0x12_3456));
        assert_eq!(buf, BTH_RC_SEND_ONLY);
    }

    #[test]
    fn test_parse() {
        let packet = Packet::new_unchecked(&BTH_RC_SEND_ONLY[..]);
        assert_eq!(Repr::parse(&packet), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BTH_RC_SEND_ONLY);
    }

    #[test]
    fn test_psn_wraps() {
        let mut buf = BTH_RC_SEND_ONLY;
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_psn(Psn::MAX.wrapping_add(1));
        assert_eq!(packet.psn(), Psn::new(0));
        assert_eq!(&buf[9..], &[0, 0, 0]);
    }

    #[test]
    fn test_tver_and_truncation() {
        let mut buf = BTH_RC_SEND_ONLY;
        buf[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&buf[..])),
            Err(ParseError::Unsupported)
        );
        assert_eq!(
            Packet::new_checked(&BTH_RC_SEND_ONLY[..11]),
            Err(ParseError::Truncated)
        );
    }

    #[test]
    fn test_opcode_layouts() {
        assert_eq!(Opcode::from(0x0b), Opcode::RcRdmaWriteOnlyWithImmediate);
        assert_eq!(Opcode::from(0x15), Opcode::Unknown(0x15));
        assert_eq!(
            Opcode::RcRdmaWriteOnlyWithImmediate
                .ext_headers()
                .map(ExtSet::len),
            Some(20)
        );
        assert_eq!(Opcode::UdSendOnly.ext_headers().map(ExtSet::len), Some(8));
        assert_eq!(
            Opcode::RcAtomicAcknowledge.ext_headers().map(ExtSet::len),
            Some(12)
        );
        assert_eq!(Opcode::RcFetchAdd.ext_headers().map(ExtSet::len), Some(28));
        assert_eq!(Opcode::Unknown(0x15).ext_headers(), None);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
        for value in 0..=255u8 {
            assert_eq!(u8::from(Opcode::from(value)), value);
        }
        let order: Vec<ExtSet> = ExtSet::AETH
            .union(ExtSet::DETH)
            .union(ExtSet::IETH)
            .iter()
            .map(|(set, _)| set)
            .collect();
        assert_eq!(order, [ExtSet::DETH, ExtSet::AETH, ExtSet::IETH]);
    }

    #[test]
    fn test_display() {
        assert_eq!(
            repr().to_string(),
            "BTH RC_SEND_ONLY qp=0x000123 psn=1193046 ackreq pad=3"
        );
    }

    #[test]
    fn test_ext_set_len_is_the_sum_over_its_headers() {
        for bits in 0..=u8::MAX {
            let set = ExtSet::ORDER
                .iter()
                .filter(|(header, _)| bits & header.0 != 0)
                .fold(ExtSet::NONE, |set, &(header, _)| set.union(header));
            let sum: usize = set.iter().map(|(_, len)| len).sum();
            assert_eq!(set.len(), sum);
        }
    }
}
