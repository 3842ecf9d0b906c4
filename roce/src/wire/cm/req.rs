//! CM REQ (attribute 0x0010): the client's connection request.
//!
//! ib-cm.md §4.2; offsets relative to the CM body (MAD offset − 24):
//!
//! ```text
//! 0-3 Local Comm ID | 4 reserved (bit 0: Brick extension, see below) | 5-7 Vendor ID | 8-15 Service ID
//! 16-23 Local CA GUID | 24-27 reserved | 28-31 Local Q_Key
//! 32-34 Local QPN | 35 Responder Resources | 36-38 Local EECN | 39 Initiator Depth
//! 40-42 Remote EECN | 43 Remote CM Response Timeout (7..3) | Transport (2..1) | E2E FC (0)
//! 44-46 Starting PSN | 47 Local CM Response Timeout (7..3) | Retry Count (2..0)
//! 48-49 P_Key | 50 Path MTU (7..4) | RDC Exists (3) | RNR Retry Count (2..0)
//! 51 Max CM Retries (7..4) | SRQ (3) | Extended Transport Type (2..0)
//! 52-95 primary path | 96-139 alternate path | 140-231 private data (92)
//! ```
//!
//! The server uses `local_qpn` as its QP's destination, `starting_psn` as its
//! first send PSN, `path_mtu` to segment, and the retry counts for its requester
//! (ib-cm.md §4.2 "passive-side interpretation"). With an RDMA CM service ID the
//! private data starts with the RDMA CM header ([`crate::wire::rdma_cm`]).
//!
//! Brick's extension: bit 0 of the reserved byte 4 (MAD offset 28) offers
//! selective retransmission (`docs/protocol/selective-retransmission.md`).
//! Linux sends the byte 0 and ignores it on receive.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::super::bytes::{
    get_bits, read_u16_be, read_u24_be, read_u32_be, read_u64_be, set_bits, write_u16_be,
    write_u24_be, write_u32_be, write_u64_be,
};
use super::super::ParseError;
use super::common::write_flags;
use super::emit_private_data;
use super::path;
use crate::types::{Mtu, Pkey, Psn, Qkey, Qpn};

mod field {
    use crate::wire::bytes::Field;

    /// Reserved; bit 0 is Brick's selective-retransmission offer.
    pub const BYTE_4: usize = 4;
    pub const VENDOR_ID: Field = 5..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Field = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Field = 40..43;
    /// Remote CM Response Timeout (5) | Transport Service Type (2) | E2E FC (1).
    pub const BYTE_43: usize = 43;
    pub const STARTING_PSN: Field = 44..47;
    /// Local CM Response Timeout (5) | Retry Count (3).
    pub const BYTE_47: usize = 47;
    pub const PARTITION_KEY: Field = 48..50;
    /// Path MTU (4) | RDC Exists (1) | RNR Retry Count (3).
    pub const BYTE_50: usize = 50;
    /// Max CM Retries (4) | SRQ (1) | Extended Transport Type (3).
    pub const BYTE_51: usize = 51;
    pub const PRIMARY_PATH: Field = 52..96;
    pub const ALTERNATE_PATH: Field = 96..140;
    pub const PRIVATE_DATA: Field = 140..232;
    /// Reserved ranges, cleared on emit.
    pub const RESERVED: [Field; 2] = [4..5, 24..28];
}

/// Length of the REQ private data (RDMA CM header 36 + user data 56).
pub const PRIVATE_DATA_LEN: usize = field::PRIVATE_DATA.end - field::PRIVATE_DATA.start;

enum_with_unknown! {
    /// Transport Service Type (2 bits).
    pub enum TransportType(u8) {
        /// Reliable Connected: the only type Brick accepts.
        Rc = 0,
        /// Unreliable Connected.
        Uc = 1,
        /// Extended Reliable Connected.
        Xrc = 3,
    }
}

cm_packet! {
    /// A read/write view of a REQ body.
    Packet "REQ";
    /// The 92-byte private data area.
    fn private_data;
    /// Local Communication ID (the client's).
    fn local_comm_id;
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn byte(&self, index: usize) -> u8 {
        self.buffer.as_ref()[index]
    }

    /// Brick's selective-retransmission offer (reserved byte 4, bit 0).
    pub fn brick_selective(&self) -> bool {
        get_bits(self.byte(field::BYTE_4), 0, 1) != 0
    }

    /// Vendor ID (24 bits, ECE).
    pub fn vendor_id(&self) -> u32 {
        read_u24_be(&self.buffer.as_ref()[field::VENDOR_ID])
    }

    /// Service ID (`0x0106 << 16 | port` for RDMA CM over TCP port space).
    pub fn service_id(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::SERVICE_ID])
    }

    /// Local CA GUID (the client's node GUID).
    pub fn local_ca_guid(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }

    /// Local Q_Key (unused for RC).
    pub fn local_qkey(&self) -> Qkey {
        Qkey(read_u32_be(&self.buffer.as_ref()[field::LOCAL_QKEY]))
    }

    /// Local QPN: the client's RC QP.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::LOCAL_QPN]))
    }

    /// Responder Resources: RDMA READ/atomics the client serves for the server.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }

    /// Local EECN (24 bits, 0).
    pub fn local_eecn(&self) -> u32 {
        read_u24_be(&self.buffer.as_ref()[field::LOCAL_EECN])
    }

    /// Initiator Depth: RDMA READ/atomics the client keeps outstanding.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }

    /// Remote EECN (24 bits, 0).
    pub fn remote_eecn(&self) -> u32 {
        read_u24_be(&self.buffer.as_ref()[field::REMOTE_EECN])
    }

    /// Remote CM Response Timeout (5-bit IB time exponent).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        get_bits(self.byte(field::BYTE_43), 3, 5)
    }

    /// Transport Service Type.
    pub fn transport_type(&self) -> TransportType {
        TransportType::from(get_bits(self.byte(field::BYTE_43), 1, 2))
    }

    /// End-to-End Flow Control.
    pub fn end_to_end_flow_control(&self) -> bool {
        get_bits(self.byte(field::BYTE_43), 0, 1) != 0
    }

    /// Starting PSN: the server's first send PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new_truncate(read_u24_be(&self.buffer.as_ref()[field::STARTING_PSN]))
    }

    /// Local CM Response Timeout (5-bit IB time exponent): the server's REP timer.
    pub fn local_cm_response_timeout(&self) -> u8 {
        get_bits(self.byte(field::BYTE_47), 3, 5)
    }

    /// Retry Count (3 bits).
    pub fn retry_count(&self) -> u8 {
        get_bits(self.byte(field::BYTE_47), 0, 3)
    }

    /// Partition Key.
    pub fn pkey(&self) -> Pkey {
        Pkey(read_u16_be(&self.buffer.as_ref()[field::PARTITION_KEY]))
    }

    /// Path Packet Payload MTU.
    pub fn path_mtu(&self) -> Mtu {
        Mtu::from(get_bits(self.byte(field::BYTE_50), 4, 4))
    }

    /// RDC Exists.
    pub fn rdc_exists(&self) -> bool {
        get_bits(self.byte(field::BYTE_50), 3, 1) != 0
    }

    /// RNR Retry Count (3 bits): what the server's QP should use.
    pub fn rnr_retry_count(&self) -> u8 {
        get_bits(self.byte(field::BYTE_50), 0, 3)
    }

    /// Max CM Retries (4 bits).
    pub fn max_cm_retries(&self) -> u8 {
        get_bits(self.byte(field::BYTE_51), 4, 4)
    }

    /// SRQ: the client QP uses a shared receive queue.
    pub fn srq(&self) -> bool {
        get_bits(self.byte(field::BYTE_51), 3, 1) != 0
    }

    /// Extended Transport Type (3 bits).
    pub fn extended_transport_type(&self) -> u8 {
        get_bits(self.byte(field::BYTE_51), 0, 3)
    }

    /// The primary path.
    pub fn primary_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::PRIMARY_PATH])
    }

    /// The alternate path (all zero on RoCE).
    pub fn alternate_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::ALTERNATE_PATH])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn byte_mut(&mut self, index: usize) -> &mut u8 {
        &mut self.buffer.as_mut()[index]
    }

    /// Sets the Vendor ID (low 24 bits).
    pub fn set_vendor_id(&mut self, value: u32) {
        write_u24_be(&mut self.buffer.as_mut()[field::VENDOR_ID], value);
    }

    /// Sets the Service ID.
    pub fn set_service_id(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::SERVICE_ID], value);
    }

    /// Sets the Local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::LOCAL_CA_GUID], value);
    }

    /// Sets the Local Q_Key.
    pub fn set_local_qkey(&mut self, value: Qkey) {
        write_u32_be(&mut self.buffer.as_mut()[field::LOCAL_QKEY], value.0);
    }

    /// Sets the Local QPN.
    pub fn set_local_qpn(&mut self, value: Qpn) {
        write_u24_be(&mut self.buffer.as_mut()[field::LOCAL_QPN], value.value());
    }

    /// Sets Responder Resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }

    /// Sets the Local EECN (low 24 bits).
    pub fn set_local_eecn(&mut self, value: u32) {
        write_u24_be(&mut self.buffer.as_mut()[field::LOCAL_EECN], value);
    }

    /// Sets Initiator Depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }

    /// Sets the Remote EECN (low 24 bits).
    pub fn set_remote_eecn(&mut self, value: u32) {
        write_u24_be(&mut self.buffer.as_mut()[field::REMOTE_EECN], value);
    }

    /// Sets the Remote CM Response Timeout (low 5 bits).
    pub fn set_remote_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_43), 3, 5, value);
    }

    /// Sets the Transport Service Type (low 2 bits of its code).
    pub fn set_transport_type(&mut self, value: TransportType) {
        set_bits(self.byte_mut(field::BYTE_43), 1, 2, value.into());
    }

    /// Sets End-to-End Flow Control.
    pub fn set_end_to_end_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_43), 0, 1, value.into());
    }

    /// Sets the Starting PSN.
    pub fn set_starting_psn(&mut self, value: Psn) {
        write_u24_be(
            &mut self.buffer.as_mut()[field::STARTING_PSN],
            value.value(),
        );
    }

    /// Sets the Local CM Response Timeout (low 5 bits).
    pub fn set_local_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 3, 5, value);
    }

    /// Sets the Retry Count (low 3 bits).
    pub fn set_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 0, 3, value);
    }

    /// Sets the Partition Key.
    pub fn set_pkey(&mut self, value: Pkey) {
        write_u16_be(&mut self.buffer.as_mut()[field::PARTITION_KEY], value.0);
    }

    /// Sets the Path MTU (low 4 bits of its code).
    pub fn set_path_mtu(&mut self, value: Mtu) {
        set_bits(self.byte_mut(field::BYTE_50), 4, 4, value.into());
    }

    /// Sets RDC Exists.
    pub fn set_rdc_exists(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_50), 3, 1, value.into());
    }

    /// Sets the RNR Retry Count (low 3 bits).
    pub fn set_rnr_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_50), 0, 3, value);
    }

    /// Sets Max CM Retries (low 4 bits).
    pub fn set_max_cm_retries(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 4, 4, value);
    }

    /// Sets Brick's selective-retransmission offer (after
    /// `clear_reserved`: the rest of byte 4 stays 0).
    pub fn set_brick_selective(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_4), 0, 1, value.into());
    }

    /// Sets SRQ.
    pub fn set_srq(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_51), 3, 1, value.into());
    }

    /// Sets the Extended Transport Type (low 3 bits).
    pub fn set_extended_transport_type(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 0, 3, value);
    }

    /// The primary path, mutably.
    pub fn primary_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::PRIMARY_PATH])
    }

    /// The alternate path, mutably.
    pub fn alternate_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::ALTERNATE_PATH])
    }

    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        for range in field::RESERVED {
            self.buffer.as_mut()[range].fill(0);
        }
    }
}

/// A parsed REQ. Fields wider than their wire width are truncated on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    /// Local Communication ID (the client's).
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: Qkey,
    /// Local QPN (the client's RC QP).
    pub local_qpn: Qpn,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type.
    pub transport_type: TransportType,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (the server's first send PSN).
    pub starting_psn: Psn,
    /// Local CM Response Timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry Count (3 bits).
    pub retry_count: u8,
    /// Partition Key.
    pub pkey: Pkey,
    /// Path Packet Payload MTU.
    pub path_mtu: Mtu,
    /// RDC Exists.
    pub rdc_exists: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM Retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended Transport Type (3 bits).
    pub extended_transport_type: u8,
    /// Brick's selective-retransmission offer (reserved bit; Linux: 0).
    pub brick_selective: bool,
    /// Primary path.
    pub primary_path: path::Repr,
    /// Alternate path.
    pub alternate_path: path::Repr,
    /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parses a REQ body.
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, ParseError> {
        packet.check_len()?;
        let buffer: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            local_comm_id: packet.local_comm_id(),
            vendor_id: packet.vendor_id(),
            service_id: packet.service_id(),
            local_ca_guid: packet.local_ca_guid(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            responder_resources: packet.responder_resources(),
            local_eecn: packet.local_eecn(),
            initiator_depth: packet.initiator_depth(),
            remote_eecn: packet.remote_eecn(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            transport_type: packet.transport_type(),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            starting_psn: packet.starting_psn(),
            local_cm_response_timeout: packet.local_cm_response_timeout(),
            retry_count: packet.retry_count(),
            pkey: packet.pkey(),
            path_mtu: packet.path_mtu(),
            rdc_exists: packet.rdc_exists(),
            rnr_retry_count: packet.rnr_retry_count(),
            max_cm_retries: packet.max_cm_retries(),
            srq: packet.srq(),
            extended_transport_type: packet.extended_transport_type(),
            brick_selective: packet.brick_selective(),
            primary_path: path::Repr::parse(&packet.primary_path())?,
            alternate_path: path::Repr::parse(&packet.alternate_path())?,
            private_data: &buffer[field::PRIVATE_DATA],
        })
    }

    /// Writes the REQ body (reserved bits and unused private data 0).
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes or `private_data` is longer than
    /// [`PRIVATE_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.clear_reserved();
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_vendor_id(self.vendor_id);
        packet.set_service_id(self.service_id);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_local_eecn(self.local_eecn);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_remote_eecn(self.remote_eecn);
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_transport_type(self.transport_type);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_starting_psn(self.starting_psn);
        packet.set_local_cm_response_timeout(self.local_cm_response_timeout);
        packet.set_retry_count(self.retry_count);
        packet.set_pkey(self.pkey);
        packet.set_path_mtu(self.path_mtu);
        packet.set_rdc_exists(self.rdc_exists);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_max_cm_retries(self.max_cm_retries);
        packet.set_srq(self.srq);
        packet.set_extended_transport_type(self.extended_transport_type);
        packet.set_brick_selective(self.brick_selective);
        self.primary_path.emit(&mut packet.primary_path_mut());
        self.alternate_path.emit(&mut packet.alternate_path_mut());
        emit_private_data(packet.private_data_mut(), self.private_data);
    }
}

/// The message fields on one line; the paths and the private data are left to
/// their own `Display`s (the [`PrettyPrinter`](crate::wire::PrettyPrinter) prints them).
impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM REQ lcomm={:#010x} svc={:#018x} guid={:#018x} qpn={} psn={} \
             rr={} id={} transport={:?} mtu={} retry={} rnr_retry={} pkey={} \
             cm_timeouts={}/{} max_cm_retries={}",
            self.local_comm_id,
            self.service_id,
            self.local_ca_guid,
            self.local_qpn,
            self.starting_psn,
            self.responder_resources,
            self.initiator_depth,
            self.transport_type,
            self.path_mtu,
            self.retry_count,
            self.rnr_retry_count,
            self.pkey,
            self.local_cm_response_timeout,
            self.remote_cm_response_timeout,
            self.max_cm_retries
        )?;
        write_flags(
            f,
            &[
                (self.end_to_end_flow_control, "e2e_fc"),
                (self.srq, "srq"),
                (self.rdc_exists, "rdc"),
            ],
        )?;
        if self.vendor_id != 0 || self.extended_transport_type != 0 {
            write!(
                f,
                " vendor={:#08x} ext_transport={}",
                self.vendor_id, self.extended_transport_type
            )?;
        }
        if self.local_qkey.0 != 0 || self.local_eecn != 0 || self.remote_eecn != 0 {
            write!(
                f,
                " qkey={} eecn={:#x}/{:#x}",
                self.local_qkey, self.local_eecn, self.remote_eecn
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::super::{body_from_hex, check_vector, Message, BODY_LEN};
    use super::*;
    use crate::types::Gid;
    use core::net::Ipv4Addr;

    // rping-linux.pcap frame 5 (CM REQ body, trailing zeros omitted).
    const REQ_HEX: &str = concat!(
        "68bf50b4000000000000000001061c06505400fffe7700020000000000000000",
        "0000110100000001000000a0d8e8a3a7ffff37f0ffffffff0000000000000000",
        "0000ffff0a4d000200000000000000000000ffff0a4d000173b7300000400098",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000040bef30000000000000000000000000a4d0002",
        "0000000000000000000000000a4d0001",
    );

    fn repr(private_data: &[u8]) -> Repr<'_> {
        Repr {
            local_comm_id: 0x68bf_50b4,
            vendor_id: 0,
            service_id: 0x0106_1c06,
            local_ca_guid: 0x5054_00ff_fe77_0002,
            local_qkey: Qkey(0),
            local_qpn: Qpn::new(0x11),
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: Psn::new(14_215_331),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: Pkey::DEFAULT,
            path_mtu: Mtu::Mtu1024,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            brick_selective: false,
            primary_path: path::Repr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 2)),
                remote_gid: Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1)),
                flow_label: 0x7_3b73,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 19,
            },
            alternate_path: path::Repr::default(),
            private_data,
        }
    }

    #[test]
    fn test_deconstruct() {
        let body = body_from_hex(REQ_HEX);
        let packet = Packet::new_checked(&body[..]).unwrap();
        assert_eq!(packet.local_comm_id(), 0x68bf_50b4);
        assert_eq!(packet.service_id(), 0x0000_0000_0106_1c06);
        assert_eq!(packet.local_qpn(), Qpn::new(0x11));
        assert_eq!(packet.starting_psn(), Psn::new(14_215_331));
        assert_eq!(packet.responder_resources(), 1);
        assert_eq!(packet.initiator_depth(), 1);
        assert_eq!(packet.transport_type(), TransportType::Rc);
        assert_eq!(packet.retry_count(), 7);
        assert_eq!(packet.rnr_retry_count(), 7);
        assert_eq!(packet.path_mtu(), Mtu::Mtu1024);
        assert_eq!(packet.max_cm_retries(), 15);
        assert_eq!(packet.primary_path().local_ack_timeout(), 19);
        assert_eq!(&packet.private_data()[..4], &[0x00, 0x40, 0xbe, 0xf3]);
    }

    #[test]
    fn test_construct() {
        let expected = body_from_hex(REQ_HEX);
        let mut body = [0xa5u8; BODY_LEN];
        let mut packet = Packet::new_unchecked(&mut body[..]);
        let r = repr(&expected[field::PRIVATE_DATA]);
        packet.clear_reserved();
        packet.set_local_comm_id(r.local_comm_id);
        packet.set_vendor_id(0);
        packet.set_service_id(r.service_id);
        packet.set_local_ca_guid(r.local_ca_guid);
        packet.set_local_qkey(Qkey(0));
        packet.set_local_qpn(r.local_qpn);
        packet.set_responder_resources(1);
        packet.set_local_eecn(0);
        packet.set_initiator_depth(1);
        packet.set_remote_eecn(0);
        packet.set_remote_cm_response_timeout(20);
        packet.set_transport_type(TransportType::Rc);
        packet.set_end_to_end_flow_control(false);
        packet.set_starting_psn(r.starting_psn);
        packet.set_local_cm_response_timeout(20);
        packet.set_retry_count(7);
        packet.set_pkey(Pkey::DEFAULT);
        packet.set_path_mtu(Mtu::Mtu1024);
        packet.set_rdc_exists(false);
        packet.set_rnr_retry_count(7);
        packet.set_max_cm_retries(15);
        packet.set_srq(false);
        packet.set_extended_transport_type(0);
        r.primary_path.emit(&mut packet.primary_path_mut());
        r.alternate_path.emit(&mut packet.alternate_path_mut());
        packet.private_data_mut().copy_from_slice(r.private_data);
        assert_eq!(body, expected);
    }

    #[test]
    fn test_parse_emit() {
        // Emits the RDMA CM header alone: the rest of the 92-byte area is zero-padded.
        check_vector(
            REQ_HEX,
            field::PRIVATE_DATA,
            |body| Repr::parse(&Packet::new_unchecked(body)).map(Message::Req),
            |private_data| Message::Req(repr(private_data)),
        );
    }
}
