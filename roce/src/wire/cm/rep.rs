//! CM REP (attribute 0x0013): the server's reply to a REQ.
//!
//! ib-cm.md §4.3; offsets relative to the CM body:
//!
//! ```text
//! 0-3 Local Comm ID | 4-7 Remote Comm ID | 8-11 Local Q_Key
//! 12-14 Local QPN | 15 Vendor ID 23..16 | 16-18 Local EECN | 19 Vendor ID 15..8
//! 20-22 Starting PSN | 23 Vendor ID 7..0 | 24 Responder Resources
//! 25 Initiator Depth | 26 Target ACK Delay (7..3) | Failover (2..1) | E2E FC (0)
//! 27 RNR Retry Count (7..5) | SRQ (4) | reserved (3..1) | Brick selective (0)
//! 28-35 Local CA GUID | 36-231 private data (196, no RDMA CM header)
//! ```
//!
//! `starting_psn` is the client's first send PSN; `initiator_depth > 0` is what
//! enables RDMA READ from the server (ib-cm.md §4.3, roce-v2.md §2.1).

use core::fmt;

use super::super::bytes::{
    get_bits, read_u24_be, read_u32_be, read_u64_be, set_bits, write_u24_be, write_u32_be,
    write_u64_be,
};
use super::super::ParseError;
use super::common::write_flags;
use super::emit_private_data;
use crate::types::{Psn, Qkey, Qpn};

mod field {
    use crate::wire::bytes::Field;

    pub const LOCAL_QKEY: Field = 8..12;
    pub const LOCAL_QPN: Field = 12..15;
    pub const VENDOR_ID_HI: usize = 15;
    pub const LOCAL_EECN: Field = 16..19;
    pub const VENDOR_ID_MID: usize = 19;
    pub const STARTING_PSN: Field = 20..23;
    pub const VENDOR_ID_LO: usize = 23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    /// Target ACK Delay (5) | Failover Accepted (2) | E2E FC (1).
    pub const BYTE_26: usize = 26;
    /// RNR Retry Count (3) | SRQ (1) | reserved (4).
    pub const BYTE_27: usize = 27;
    pub const LOCAL_CA_GUID: Field = 28..36;
    pub const PRIVATE_DATA: Field = 36..232;
}

/// Length of the REP private data.
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

cm_packet! {
    /// A read/write view of a REP body.
    Packet "REP";
    /// The 196-byte private data area.
    fn private_data;
    /// Local Communication ID (the server's).
    fn local_comm_id;
    /// Remote Communication ID (the client's, from the REQ).
    fn remote_comm_id;
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn byte(&self, index: usize) -> u8 {
        self.buffer.as_ref()[index]
    }

    /// Local Q_Key (0 for RC).
    pub fn local_qkey(&self) -> Qkey {
        Qkey(read_u32_be(&self.buffer.as_ref()[field::LOCAL_QKEY]))
    }

    /// Local QPN (the server's QP).
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::LOCAL_QPN]))
    }

    /// Vendor ID (24 bits, ECE), assembled from its three bytes.
    pub fn vendor_id(&self) -> u32 {
        u32::from_be_bytes([
            0,
            self.byte(field::VENDOR_ID_HI),
            self.byte(field::VENDOR_ID_MID),
            self.byte(field::VENDOR_ID_LO),
        ])
    }

    /// Local EE Context Number (24 bits, 0).
    pub fn local_eecn(&self) -> u32 {
        read_u24_be(&self.buffer.as_ref()[field::LOCAL_EECN])
    }

    /// Starting PSN: the client's first send PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::STARTING_PSN]))
    }

    /// Responder Resources: READ/atomics the server accepts concurrently.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }

    /// Initiator Depth: READ/atomics the server keeps outstanding.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }

    /// Target ACK Delay (5 bits).
    pub fn target_ack_delay(&self) -> u8 {
        get_bits(self.byte(field::BYTE_26), 3, 5)
    }

    /// Failover Accepted (2 bits).
    pub fn failover_accepted(&self) -> u8 {
        get_bits(self.byte(field::BYTE_26), 1, 2)
    }

    /// End-to-End Flow Control.
    pub fn end_to_end_flow_control(&self) -> bool {
        get_bits(self.byte(field::BYTE_26), 0, 1) != 0
    }

    /// RNR Retry Count (3 bits): the client's, for sends to the server.
    pub fn rnr_retry_count(&self) -> u8 {
        get_bits(self.byte(field::BYTE_27), 5, 3)
    }

    /// SRQ.
    pub fn srq(&self) -> bool {
        get_bits(self.byte(field::BYTE_27), 4, 1) != 0
    }

    /// Brick's selective-retransmission acceptance (reserved bit 0 of
    /// byte 27, MAD offset 51; Linux sends 0 and ignores it).
    pub fn brick_selective(&self) -> bool {
        get_bits(self.byte(field::BYTE_27), 0, 1) != 0
    }

    /// Local CA GUID (the server's).
    pub fn local_ca_guid(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn byte_mut(&mut self, index: usize) -> &mut u8 {
        &mut self.buffer.as_mut()[index]
    }

    /// Sets the Local Q_Key.
    pub fn set_local_qkey(&mut self, value: Qkey) {
        write_u32_be(&mut self.buffer.as_mut()[field::LOCAL_QKEY], value.0);
    }

    /// Sets the Local QPN.
    pub fn set_local_qpn(&mut self, value: Qpn) {
        write_u24_be(&mut self.buffer.as_mut()[field::LOCAL_QPN], value.value());
    }

    /// Sets the Vendor ID (low 24 bits).
    pub fn set_vendor_id(&mut self, value: u32) {
        let [_, hi, mid, lo] = value.to_be_bytes();
        *self.byte_mut(field::VENDOR_ID_HI) = hi;
        *self.byte_mut(field::VENDOR_ID_MID) = mid;
        *self.byte_mut(field::VENDOR_ID_LO) = lo;
    }

    /// Sets the Local EECN (low 24 bits).
    pub fn set_local_eecn(&mut self, value: u32) {
        write_u24_be(&mut self.buffer.as_mut()[field::LOCAL_EECN], value);
    }

    /// Sets the Starting PSN.
    pub fn set_starting_psn(&mut self, value: Psn) {
        write_u24_be(
            &mut self.buffer.as_mut()[field::STARTING_PSN],
            value.value(),
        );
    }

    /// Sets Responder Resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }

    /// Sets Initiator Depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }

    /// Sets the Target ACK Delay (low 5 bits).
    pub fn set_target_ack_delay(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 3, 5, value);
    }

    /// Sets Failover Accepted (low 2 bits).
    pub fn set_failover_accepted(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 1, 2, value);
    }

    /// Sets End-to-End Flow Control.
    pub fn set_end_to_end_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_26), 0, 1, value.into());
    }

    /// Sets the RNR Retry Count (low 3 bits) and SRQ; clears the reserved bits.
    pub fn set_rnr_retry_count_and_srq(&mut self, rnr_retry_count: u8, srq: bool) {
        let byte = self.byte_mut(field::BYTE_27);
        *byte = 0;
        set_bits(byte, 5, 3, rnr_retry_count);
        set_bits(byte, 4, 1, srq.into());
    }

    /// Sets Brick's selective-retransmission acceptance (after
    /// `set_rnr_retry_count_and_srq`, which clears the byte).
    pub fn set_brick_selective(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_27), 0, 1, value.into());
    }

    /// Sets the Local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::LOCAL_CA_GUID], value);
    }
}

/// A parsed REP. Fields wider than their wire width are truncated on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the server's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the client's).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: Qkey,
    /// Local QPN (the server's QP).
    pub local_qpn: Qpn,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (the client's first send PSN).
    pub starting_psn: Psn,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay (5 bits; ≤ 17 keeps the client's ACK timeout at 19).
    pub target_ack_delay: u8,
    /// Failover Accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Brick's selective-retransmission acceptance (reserved bit; Linux: 0).
    pub brick_selective: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a REP body.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            vendor_id: packet.vendor_id(),
            local_eecn: packet.local_eecn(),
            starting_psn: packet.starting_psn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            target_ack_delay: packet.target_ack_delay(),
            failover_accepted: packet.failover_accepted(),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            rnr_retry_count: packet.rnr_retry_count(),
            srq: packet.srq(),
            brick_selective: packet.brick_selective(),
            local_ca_guid: packet.local_ca_guid(),
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Writes the REP body (reserved bits and unused private data 0).
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes or `private_data` is longer than
    /// [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_vendor_id(self.vendor_id);
        packet.set_local_eecn(self.local_eecn);
        packet.set_starting_psn(self.starting_psn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_target_ack_delay(self.target_ack_delay);
        packet.set_failover_accepted(self.failover_accepted);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_rnr_retry_count_and_srq(self.rnr_retry_count, self.srq);
        packet.set_brick_selective(self.brick_selective);
        packet.set_local_ca_guid(self.local_ca_guid);
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

/// The message fields on one line; the private data is left to the
/// [`PrettyPrinter`](crate::wire::PrettyPrinter).
impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM REP lcomm={:#010x} rcomm={:#010x} guid={:#018x} qpn={} psn={} rr={} id={} \
             ack_delay={} rnr_retry={}",
            self.local_comm_id,
            self.remote_comm_id,
            self.local_ca_guid,
            self.local_qpn,
            self.starting_psn,
            self.responder_resources,
            self.initiator_depth,
            self.target_ack_delay,
            self.rnr_retry_count
        )?;
        write_flags(
            f,
            &[(self.end_to_end_flow_control, "e2e_fc"), (self.srq, "srq")],
        )?;
        if self.failover_accepted != 0 || self.vendor_id != 0 {
            write!(
                f,
                " failover={} vendor={:#08x}",
                self.failover_accepted, self.vendor_id
            )?;
        }
        if self.local_qkey.0 != 0 || self.local_eecn != 0 {
            write!(f, " qkey={} eecn={:#x}", self.local_qkey, self.local_eecn)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;

    // rnbd-2cpu.pcap frame 6: REP with an RTRS conn_rsp as private data.
    const REP_HEX: &str = concat!(
        "7494ce2f1e9b553400000000000011000000000037d5ec00000078e0505400ff",
        "fe770001bd1b00020000000200f001000010000002",
    );
    const CONN_RSP: [u8; 17] = [
        0xbd, 0x1b, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0xf0, 0x01, 0x00, 0x00, 0x10, 0x00,
        0x00, 0x02,
    ];

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x7494_ce2f,
            remote_comm_id: 0x1e9b_5534,
            local_qkey: Qkey(0),
            local_qpn: Qpn::new(0x11),
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: Psn::new(3_659_244),
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 7,
            srq: false,
            brick_selective: false,
            local_ca_guid: 0x5054_00ff_fe77_0001,
            private_data,
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(REP_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x7494_ce2f);
        assert_eq!(packet.remote_comm_id(), 0x1e9b_5534);
        assert_eq!(packet.local_qpn(), Qpn::new(0x11));
        assert_eq!(packet.starting_psn(), Psn::new(3_659_244));
        assert_eq!(packet.target_ack_delay(), 15);
        assert_eq!(packet.rnr_retry_count(), 7);
        assert!(!packet.srq());
        assert_eq!(packet.local_ca_guid(), 0x5054_00ff_fe77_0001);
        assert_eq!(&packet.private_data()[..17], &CONN_RSP);
    }

    #[test]
    fn test_construct() {
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_local_comm_id(0x7494_ce2f);
        packet.set_remote_comm_id(0x1e9b_5534);
        packet.set_local_qkey(Qkey(0));
        packet.set_local_qpn(Qpn::new(0x11));
        packet.set_vendor_id(0);
        packet.set_local_eecn(0);
        packet.set_starting_psn(Psn::new(3_659_244));
        packet.set_responder_resources(0);
        packet.set_initiator_depth(0);
        packet.set_target_ack_delay(15);
        packet.set_failover_accepted(0);
        packet.set_end_to_end_flow_control(false);
        packet.set_rnr_retry_count_and_srq(7, false);
        packet.set_local_ca_guid(0x5054_00ff_fe77_0001);
        emit_private_data(packet.private_data_mut(), &CONN_RSP);
        assert_eq!(body, body_from_hex(REP_HEX));
    }

    #[test]
    fn test_parse_emit() {
        check_vector(
            REP_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Rep),
            |private_data| Message::Rep(repr(private_data)),
        );
    }

    #[test]
    fn test_vendor_id_split() {
        let mut body = [0u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        packet.set_vendor_id(0xab_cdef);
        assert_eq!((body[15], body[19], body[23]), (0xab, 0xcd, 0xef));
        assert_eq!(Packet::new_unchecked(&body[..]).vendor_id(), 0xab_cdef);
    }
}
