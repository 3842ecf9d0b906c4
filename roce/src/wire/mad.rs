//! Management Datagram (MAD) common header (24 bytes), as carried on QP1.
//!
//! roce-v2.md §3, IBTA Vol. 1 §13.4.2 (`struct ib_mad_hdr`), big-endian:
//!
//! ```text
//! 0 BaseVersion | 1 MgmtClass | 2 ClassVersion | 3 Method (bit 7 = response)
//! 4-5 Status | 6-7 ClassSpecific | 8-15 TransactionID
//! 16-17 AttributeID | 18-19 reserved | 20-23 AttributeModifier
//! 24-255 class data (for CM: the CM message, see `cm`)
//! ```
//!
//! A MAD is always [`MAD_LEN`] = 256 bytes on the wire: the UD payload of a GSI
//! packet. After [`Packet::check_len`] succeeds no accessor panics;
//! [`Packet::payload`] is the class data.

use wire_enum::enum_with_unknown;

use core::fmt;

use super::bytes::{
    read_u16_be, read_u32_be, read_u64_be, write_u16_be, write_u32_be, write_u64_be,
};
use super::ParseError;

mod field {
    use crate::wire::bytes::Field;

    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TRANSACTION_ID: Field = 8..16;
    pub const ATTRIBUTE_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
}

/// Length of the MAD common header.
pub const HEADER_LEN: usize = field::ATTRIBUTE_MODIFIER.end;

/// Length of every MAD on the wire (header + class data).
pub const MAD_LEN: usize = 256;

/// Length of the class data after the common header (232).
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// The only base version defined (1).
pub const BASE_VERSION: u8 = 1;

enum_with_unknown! {
    /// Management class.
    pub enum MgmtClass(u8) {
        /// Subnet management, LID routed.
        SubnLid = 0x01,
        /// Subnet administration.
        SubnAdm = 0x03,
        /// Performance management.
        Perf = 0x04,
        /// Baseboard management.
        BoardMgmt = 0x05,
        /// Device management.
        DevMgmt = 0x06,
        /// Communication management: IB CM (the only class Brick serves).
        Cm = 0x07,
        /// SNMP tunneling.
        SnmpTunnel = 0x08,
        /// Subnet management, directed route.
        SubnDirectedRoute = 0x81,
    }
}

enum_with_unknown! {
    /// MAD method; bit 7 marks a response.
    pub enum Method(u8) {
        /// Get.
        Get = 0x01,
        /// Set.
        Set = 0x02,
        /// Send: every CM message uses it.
        Send = 0x03,
        /// Trap.
        Trap = 0x05,
        /// Report.
        Report = 0x06,
        /// TrapRepress.
        TrapRepress = 0x07,
        /// GetResp.
        GetResp = 0x81,
        /// ReportResp.
        ReportResp = 0x86,
    }
}

header_view!(
    /// A read/write view of a MAD; `payload()` is the class data.
    Packet,
    HEADER_LEN,
    payload
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// BaseVersion (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }

    /// MgmtClass.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass::from(self.buffer.as_ref()[field::MGMT_CLASS])
    }

    /// ClassVersion (2 for CM).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }

    /// Method.
    pub fn method(&self) -> Method {
        Method::from(self.buffer.as_ref()[field::METHOD])
    }

    /// Status.
    pub fn status(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::STATUS])
    }

    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }

    /// TransactionID.
    pub fn transaction_id(&self) -> u64 {
        read_u64_be(&self.buffer.as_ref()[field::TRANSACTION_ID])
    }

    /// AttributeID (the CM message type for class CM).
    pub fn attribute_id(&self) -> u16 {
        read_u16_be(&self.buffer.as_ref()[field::ATTRIBUTE_ID])
    }

    /// AttributeModifier.
    pub fn attribute_modifier(&self) -> u32 {
        read_u32_be(&self.buffer.as_ref()[field::ATTRIBUTE_MODIFIER])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = value;
    }

    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, value: MgmtClass) {
        self.buffer.as_mut()[field::MGMT_CLASS] = value.into();
    }

    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = value;
    }

    /// Sets Method.
    pub fn set_method(&mut self, value: Method) {
        self.buffer.as_mut()[field::METHOD] = value.into();
    }

    /// Sets Status.
    pub fn set_status(&mut self, value: u16) {
        write_u16_be(&mut self.buffer.as_mut()[field::STATUS], value);
    }

    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, value: u16) {
        write_u16_be(&mut self.buffer.as_mut()[field::CLASS_SPECIFIC], value);
    }

    /// Sets TransactionID.
    pub fn set_transaction_id(&mut self, value: u64) {
        write_u64_be(&mut self.buffer.as_mut()[field::TRANSACTION_ID], value);
    }

    /// Sets AttributeID and clears the reserved bytes after it.
    pub fn set_attribute_id(&mut self, value: u16) {
        let buf = self.buffer.as_mut();
        write_u16_be(&mut buf[field::ATTRIBUTE_ID], value);
        write_u16_be(&mut buf[field::RESERVED], 0);
    }

    /// Sets AttributeModifier.
    pub fn set_attribute_modifier(&mut self, value: u32) {
        write_u32_be(&mut self.buffer.as_mut()[field::ATTRIBUTE_MODIFIER], value);
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Repr::parse(self) {
            Ok(repr) => write!(f, "{repr}"),
            Err(err) => write!(f, "MAD ({err})"),
        }
    }
}

/// A parsed MAD common header (base version 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Management class.
    pub mgmt_class: MgmtClass,
    /// Class version.
    pub class_version: u8,
    /// Method.
    pub method: Method,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl Repr {
    /// Parses the common header (the reserved bytes are ignored).
    ///
    /// # Errors
    /// [`ParseError::Truncated`] if shorter than 24 bytes; [`ParseError::Unsupported`]
    /// if BaseVersion ≠ 1 (the Linux MAD layer drops those, `validate_mad()`).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, ParseError> {
        packet.check_len()?;
        if packet.base_version() != BASE_VERSION {
            return Err(ParseError::Unsupported);
        }
        Ok(Repr {
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Length of the emitted header: 24.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the common header (base version 1, reserved bytes 0).
    ///
    /// # Panics
    /// If the buffer is shorter than 24 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(BASE_VERSION);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_attribute_modifier(self.attribute_modifier);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MAD class=")?;
        match self.mgmt_class {
            MgmtClass::Unknown(raw) => write!(f, "{raw:#04x}")?,
            known => write!(f, "{known:?}")?,
        }
        write!(f, " v{} method=", self.class_version)?;
        match self.method {
            Method::Unknown(raw) => write!(f, "{raw:#04x}")?,
            known => write!(f, "{known:?}")?,
        }
        write!(
            f,
            " tid={:#018x} attr={:#06x}",
            self.transaction_id, self.attribute_id
        )?;
        if self.status != 0 || self.class_specific != 0 || self.attribute_modifier != 0 {
            write!(
                f,
                " status={:#06x} class_specific={:#06x} attr_mod={:#010x}",
                self.status, self.class_specific, self.attribute_modifier
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    // rping-linux.pcap frame 5: the CM REQ's MAD header. Linux forms the TID
    // from its agent and the comm ID in host byte order (`cm_form_tid()`).
    static MAD_CM_REQ: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xb4, 0x50, 0xbf,
        0x68, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    fn repr() -> Repr {
        Repr {
            mgmt_class: MgmtClass::Cm,
            class_version: 2,
            method: Method::Send,
            status: 0,
            class_specific: 0,
            transaction_id: 0x0000_0002_b450_bf68,
            attribute_id: 0x0010,
            attribute_modifier: 0,
        }
    }

    #[test]
    fn test_deconstruct() {
        let packet = Packet::new_checked(&MAD_CM_REQ[..]).unwrap();
        assert_eq!(packet.base_version(), 1);
        assert_eq!(packet.mgmt_class(), MgmtClass::Cm);
        assert_eq!(packet.class_version(), 2);
        assert_eq!(packet.method(), Method::Send);
        assert_eq!(packet.status(), 0);
        assert_eq!(packet.transaction_id(), 0x0000_0002_b450_bf68);
        assert_eq!(packet.attribute_id(), 0x0010);
        assert_eq!(packet.attribute_modifier(), 0);
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 24];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_base_version(1);
        packet.set_mgmt_class(MgmtClass::Cm);
        packet.set_class_version(2);
        packet.set_method(Method::Send);
        packet.set_status(0);
        packet.set_class_specific(0);
        packet.set_transaction_id(0x0000_0002_b450_bf68);
        packet.set_attribute_id(0x0010);
        packet.set_attribute_modifier(0);
        assert_eq!(buf, MAD_CM_REQ);
    }

    #[test]
    fn test_parse() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&MAD_CM_REQ[..])),
            Ok(repr())
        );
        let mut bad = MAD_CM_REQ;
        bad[0] = 2;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&bad[..])),
            Err(ParseError::Unsupported)
        );
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xa5u8; 24];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, MAD_CM_REQ);
    }
}
