//! The 32-bit immediate data of RTRS: IO requests, responses, heartbeats.
//!
//! rtrs.md §4.2: `imm = (type << 28) | payload`, type in bits 31..28, payload
//! in bits 27..0. The values here are the host values: the IB ImmDt header
//! carries them big-endian and `roce` converts (rtrs.md conventions).
//!
//! | Type | Value | Payload |
//! |---|---|---|
//! | IO_REQ | 0 | `(buf_id << mem_bits) \| offset of the RTRS message in the chunk` |
//! | IO_RSP | 1 | `(errno & 0x1ff) << 19 \| (msg_id & 0x7ffff)` |
//! | IO_RSP_W_INV | 2 | as IO_RSP, after a SEND_WITH_INV of the read buffer |
//! | HB_MSG | 8 | 0 |
//! | HB_ACK | 9 | 0 |
//!
//! The IO_REQ split depends on the session queue depth: [`ImmLayout`].

use core::fmt;

use super::{EmitError, ParseError, IMM_PAYLOAD_BITS};

const PAYLOAD_MASK: u32 = (1 << IMM_PAYLOAD_BITS) - 1;
const TYPE_IO_REQ: u32 = 0;
const TYPE_IO_RSP: u32 = 1;
const TYPE_IO_RSP_W_INV: u32 = 2;
const TYPE_HB_MSG: u32 = 8;
const TYPE_HB_ACK: u32 = 9;
/// Width of the msg_id in an IO response immediate.
const MSG_ID_BITS: u32 = 19;
/// Width of the errno in an IO response immediate.
const ERRNO_BITS: u32 = 9;

/// A decoded RTRS immediate (rtrs.md §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Imm {
    /// `RTRS_IO_REQ_IMM`: 28-bit payload, chunk id and offset; split it with
    /// [`ImmLayout::split`].
    IoReq {
        /// `(buf_id << mem_bits) | offset`.
        payload: u32,
    },
    /// `RTRS_IO_RSP_IMM`: request `msg_id` completed with `errno`.
    IoRsp {
        /// The chunk id of the request (19 bits).
        msg_id: u32,
        /// Absolute value of the negative errno, 0 = success (9 bits).
        errno: u16,
    },
    /// `RTRS_IO_RSP_W_INV_IMM`: as `IoRsp`, and the read buffer's rkey was
    /// invalidated by a SEND_WITH_INV just before.
    IoRspWithInvalidate {
        /// The chunk id of the request (19 bits).
        msg_id: u32,
        /// Absolute value of the negative errno, 0 = success (9 bits).
        errno: u16,
    },
    /// `RTRS_HB_MSG_IMM`: heartbeat (`0x80000000`). A payload is ignored.
    HbMsg,
    /// `RTRS_HB_ACK_IMM`: heartbeat ack (`0x90000000`). A payload is ignored.
    HbAck,
    /// Any other type; the whole raw immediate (Linux logs and ignores it).
    Unknown(u32),
}

impl Imm {
    /// Decodes a host-order immediate. Never fails: unknown types are `Unknown`.
    pub const fn decode(imm: u32) -> Imm {
        let payload = imm & PAYLOAD_MASK;
        let msg_id = payload & ((1 << MSG_ID_BITS) - 1);
        let errno = (payload >> MSG_ID_BITS) as u16; // 9 bits: fits
        match imm >> IMM_PAYLOAD_BITS {
            TYPE_IO_REQ => Imm::IoReq { payload },
            TYPE_IO_RSP => Imm::IoRsp { msg_id, errno },
            TYPE_IO_RSP_W_INV => Imm::IoRspWithInvalidate { msg_id, errno },
            TYPE_HB_MSG => Imm::HbMsg,
            TYPE_HB_ACK => Imm::HbAck,
            _ => Imm::Unknown(imm),
        }
    }

    /// Encodes to the host-order immediate.
    ///
    /// # Errors
    /// `FieldTooWide` if a payload exceeds 28 bits, a msg_id 19 bits or an
    /// errno 9 bits (never truncated silently); `Invalid(UnexpectedType)` for
    /// an `Unknown` whose type is a known one (it would decode differently).
    pub const fn encode(self) -> Result<u32, EmitError> {
        match self {
            Imm::IoReq { payload } => {
                if payload > PAYLOAD_MASK {
                    return Err(EmitError::FieldTooWide);
                }
                Ok(payload)
            }
            Imm::IoRsp { msg_id, errno } => Self::encode_rsp(TYPE_IO_RSP, msg_id, errno),
            Imm::IoRspWithInvalidate { msg_id, errno } => {
                Self::encode_rsp(TYPE_IO_RSP_W_INV, msg_id, errno)
            }
            Imm::HbMsg => Ok(TYPE_HB_MSG << IMM_PAYLOAD_BITS),
            Imm::HbAck => Ok(TYPE_HB_ACK << IMM_PAYLOAD_BITS),
            Imm::Unknown(raw) => match raw >> IMM_PAYLOAD_BITS {
                TYPE_IO_REQ | TYPE_IO_RSP | TYPE_IO_RSP_W_INV | TYPE_HB_MSG | TYPE_HB_ACK => {
                    Err(EmitError::Invalid(ParseError::UnexpectedType))
                }
                _ => Ok(raw),
            },
        }
    }

    const fn encode_rsp(kind: u32, msg_id: u32, errno: u16) -> Result<u32, EmitError> {
        if msg_id >= 1 << MSG_ID_BITS || errno as u32 >= 1 << ERRNO_BITS {
            return Err(EmitError::FieldTooWide);
        }
        Ok((kind << IMM_PAYLOAD_BITS) | ((errno as u32) << MSG_ID_BITS) | msg_id)
    }
}

impl fmt::Display for Imm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Imm::IoReq { payload } => write!(f, "IO_REQ payload={payload:#09x}"),
            Imm::IoRsp { msg_id, errno } => write!(f, "IO_RSP msg_id={msg_id} errno={errno}"),
            Imm::IoRspWithInvalidate { msg_id, errno } => {
                write!(f, "IO_RSP_W_INV msg_id={msg_id} errno={errno}")
            }
            Imm::HbMsg => f.write_str("HB_MSG"),
            Imm::HbAck => f.write_str("HB_ACK"),
            Imm::Unknown(raw) => write!(f, "unknown imm {raw:#010x}"),
        }
    }
}

/// How an IO_REQ payload splits into chunk id and offset for one session
/// (rtrs.md §4.2): `chunk_bits = ceil(log2(qd))`, `mem_bits = 28 - chunk_bits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmLayout {
    mem_bits: u32,
}

impl ImmLayout {
    /// The layout for a session of `queue_depth` chunks (both sides compute
    /// it from qd). `queue_depth == 1` gives `chunk_bits = 0` (Linux's
    /// `ilog2(0)` case, rtrs.md §4.2 says avoid it).
    ///
    /// # Errors
    /// `ZeroQueueDepth` for `queue_depth == 0`.
    pub const fn for_queue_depth(queue_depth: u16) -> Result<ImmLayout, ParseError> {
        if queue_depth == 0 {
            return Err(ParseError::ZeroQueueDepth);
        }
        Ok(ImmLayout {
            mem_bits: IMM_PAYLOAD_BITS - ceil_log2(queue_depth as u32),
        })
    }

    /// Bits of the payload that hold the offset (19 for qd 512).
    pub const fn mem_bits(self) -> u32 {
        self.mem_bits
    }

    /// Bits of the payload that hold the chunk id (9 for qd 512).
    pub const fn chunk_bits(self) -> u32 {
        IMM_PAYLOAD_BITS - self.mem_bits
    }

    /// Checks the constraint `chunk_bits + ceil(log2(chunk_size)) <= 28`.
    ///
    /// # Errors
    /// `ImmBitsExceeded`.
    pub const fn check_chunk_size(self, chunk_size: u32) -> Result<(), ParseError> {
        if ceil_log2(chunk_size) > self.mem_bits {
            return Err(ParseError::ImmBitsExceeded);
        }
        Ok(())
    }

    /// Splits an IO_REQ payload into `(buf_id, offset)` (server decode).
    pub const fn split(self, payload: u32) -> (u32, u32) {
        let payload = payload & PAYLOAD_MASK;
        (
            payload >> self.mem_bits,
            payload & ((1 << self.mem_bits) - 1),
        )
    }

    /// Joins `buf_id` and `offset` into an IO_REQ payload (client encode).
    /// `None` if either does not fit its bits.
    pub const fn join(self, buf_id: u32, offset: u32) -> Option<u32> {
        if offset >= 1 << self.mem_bits {
            return None;
        }
        // chunk_bits() <= 16 (qd is a u16), so the shift cannot overflow.
        if buf_id >= 1 << self.chunk_bits() {
            return None;
        }
        Some((buf_id << self.mem_bits) | offset)
    }
}

/// `ceil(log2(x))` for `x >= 1` (0 for 0 and 1).
const fn ceil_log2(x: u32) -> u32 {
    if x <= 1 {
        0
    } else {
        32 - (x - 1).leading_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_spec_examples() {
        // rtrs.md §4.2 examples, qd 512.
        let layout = ImmLayout::for_queue_depth(512).unwrap();
        assert_eq!(layout.mem_bits(), 19);
        assert_eq!(layout.join(5, 4128), Some(0x0028_1020));
        assert_eq!(layout.split(0x0028_1020), (5, 4128));
        assert_eq!(
            Imm::IoRsp {
                msg_id: 5,
                errno: 0
            }
            .encode(),
            Ok(0x1000_0005)
        );
        assert_eq!(
            Imm::IoRsp {
                msg_id: 5,
                errno: 5
            }
            .encode(),
            Ok(0x1028_0005)
        );
        assert_eq!(
            Imm::IoRspWithInvalidate {
                msg_id: 5,
                errno: 5
            }
            .encode(),
            Ok(0x2028_0005)
        );
        assert_eq!(Imm::HbMsg.encode(), Ok(0x8000_0000));
        assert_eq!(Imm::HbAck.encode(), Ok(0x9000_0000));
        assert_eq!(
            Imm::decode(0x2028_0005),
            Imm::IoRspWithInvalidate {
                msg_id: 5,
                errno: 5
            }
        );
        assert_eq!(Imm::decode(0x0000_0048), Imm::IoReq { payload: 72 });
        assert_eq!(Imm::decode(0x3000_0000), Imm::Unknown(0x3000_0000));
    }

    #[test]
    fn test_layout_bits() {
        assert_eq!(ImmLayout::for_queue_depth(100).unwrap().chunk_bits(), 7);
        assert_eq!(ImmLayout::for_queue_depth(1).unwrap().chunk_bits(), 0);
        assert_eq!(
            ImmLayout::for_queue_depth(0),
            Err(ParseError::ZeroQueueDepth)
        );
        let layout = ImmLayout::for_queue_depth(512).unwrap();
        assert_eq!(layout.check_chunk_size(128 * 1024), Ok(()));
        assert_eq!(layout.check_chunk_size(1 << 19), Ok(()));
        assert_eq!(
            layout.check_chunk_size((1 << 19) + 1),
            Err(ParseError::ImmBitsExceeded)
        );
        assert_eq!(layout.join(512, 0), None);
        assert_eq!(layout.join(0, 1 << 19), None);
        let single = ImmLayout::for_queue_depth(1).unwrap();
        assert_eq!(single.join(0, 5), Some(5));
        assert_eq!(single.join(1, 5), None);
    }

    #[test]
    fn test_encode_rejects_wide_fields() {
        assert_eq!(
            Imm::IoReq { payload: 1 << 28 }.encode(),
            Err(EmitError::FieldTooWide)
        );
        assert_eq!(
            Imm::IoRsp {
                msg_id: 1 << 19,
                errno: 0
            }
            .encode(),
            Err(EmitError::FieldTooWide)
        );
        assert_eq!(
            Imm::IoRsp {
                msg_id: 0,
                errno: 512
            }
            .encode(),
            Err(EmitError::FieldTooWide)
        );
        assert!(Imm::Unknown(0x1000_0000).encode().is_err());
        assert_eq!(Imm::Unknown(0xf000_0001).encode(), Ok(0xf000_0001));
    }

    #[test]
    fn test_display() {
        assert_eq!(
            Imm::decode(0x2000_0001).to_string(),
            "IO_RSP_W_INV msg_id=1 errno=0"
        );
    }
}
