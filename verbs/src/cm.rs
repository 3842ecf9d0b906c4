//! Connection management: ids, parameters, private data and events.
//!
//! Modelled on librdmacm (`rdma_cm_event`, `rdma_conn_param`) over IB CM as
//! RoCEv2 carries it (`ib-cm.md` §4-5). A connection object (the queue pair
//! and its CM state) is created implicitly: by `Verbs::connect` on the active
//! side, by an incoming request on the passive side. It is released by
//! `Verbs::destroy` (or by `reject`), never behind the consumer's back, so a
//! [`ConnId`] never silently starts naming another connection.
//!
//! Private data lengths are the CM's (`ib-cm.md` §5.2-5.3): a REQ carries 56
//! user bytes after the 36-byte RDMA CM header, a REP 196, a REJ 148. The
//! receiver cannot tell trailing zeros from data, so consumers parse
//! fixed-size structures out of it.

use core::net::SocketAddr;

use crate::error::ConnectError;

/// User bytes in a connect request (REQ private data after the CMA header).
pub const REQ_PRIVATE_DATA_LEN: usize = 56;
/// Bytes in an accept (REP private data).
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Bytes in a reject (REJ private data).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Capacity of [`PrivateData`]: the largest of the three.
pub const MAX_PRIVATE_DATA_LEN: usize = REP_PRIVATE_DATA_LEN;

/// A connection (queue pair + CM identity), chosen by the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ConnId(pub u32);

/// Private data received in a CM message, at most
/// [`MAX_PRIVATE_DATA_LEN`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PrivateData(heapless::Vec<u8, MAX_PRIVATE_DATA_LEN>);

impl PrivateData {
    /// No private data.
    pub const fn new() -> Self {
        Self(heapless::Vec::new())
    }

    /// A copy of `bytes`.
    ///
    /// # Errors
    ///
    /// [`ConnectError::PrivateDataTooLong`] beyond [`MAX_PRIVATE_DATA_LEN`].
    pub fn try_from_slice(bytes: &[u8]) -> Result<Self, ConnectError> {
        heapless::Vec::from_slice(bytes)
            .map(Self)
            .map_err(|()| ConnectError::PrivateDataTooLong)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

/// IB CM REJ reason code (`ib-cm.md` §4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RejectReason(pub u16);

impl RejectReason {
    /// 3: the peer had no resources.
    pub const NO_RESOURCES: Self = Self(3);
    /// 4: the peer timed out waiting.
    pub const TIMEOUT: Self = Self(4);
    /// 8: nobody listens on that port (service id).
    pub const INVALID_SERVICE_ID: Self = Self(8);
    /// 10: stale connection.
    pub const STALE_CONNECTION: Self = Self(10);
    /// 28: the application refused (`rdma_reject`); private data is the
    /// application's.
    pub const CONSUMER_DEFINED: Self = Self(28);
}

/// Parameters of `connect` and `accept` (`rdma_conn_param` plus the queue
/// sizes of the implicitly created queue pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnParams<'a> {
    /// Private data for the REQ (at most [`REQ_PRIVATE_DATA_LEN`]) or REP
    /// (at most [`REP_PRIVATE_DATA_LEN`]).
    pub private_data: &'a [u8],
    /// Send-queue depth: most send work requests outstanding at once.
    pub send_queue_depth: u16,
    /// Receive-queue depth: most receives posted at once.
    pub receive_queue_depth: u16,
    /// Transport retries before `RetryExcErr` (7 = the IB maximum).
    pub retry_count: u8,
    /// Receiver-not-ready retries before `RnrRetryExcErr` (7 = infinite).
    pub rnr_retry_count: u8,
    /// RDMA READs the peer may have outstanding against us (0 forbids them).
    pub responder_resources: u8,
    /// RDMA READs we may have outstanding against the peer.
    pub initiator_depth: u8,
}

impl<'a> ConnParams<'a> {
    /// RTRS's settings (`rtrs.md` §2.6): retries 7/7, no RDMA READ, with the
    /// given private data and queue depths.
    pub const fn new(
        private_data: &'a [u8],
        send_queue_depth: u16,
        receive_queue_depth: u16,
    ) -> Self {
        Self {
            private_data,
            send_queue_depth,
            receive_queue_depth,
            retry_count: 7,
            rnr_retry_count: 7,
            responder_resources: 0,
            initiator_depth: 0,
        }
    }
}

/// A connection event, returned by `Verbs::poll_cm_event`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEvent {
    /// Passive side: a peer asks to connect to a port we listen on. Answer
    /// with `accept` or `reject`; its receive queue accepts posts now.
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// Our address the request was sent to (port = the listen port).
        local: SocketAddr,
        /// The peer's address (its RDMA CM source port).
        remote: SocketAddr,
        /// The REQ's user private data.
        private_data: PrivateData,
    },
    /// The connection can carry sends: on the active side after the REP
    /// (with its private data), on the passive side after the RTU or the
    /// first packet (empty private data).
    Established {
        /// The connection.
        conn: ConnId,
        /// REP private data (active side), else empty.
        private_data: PrivateData,
    },
    /// Active side: the peer rejected our request.
    Rejected {
        /// The connection; `destroy` it.
        conn: ConnId,
        /// Why.
        reason: RejectReason,
        /// REJ private data (meaningful for `CONSUMER_DEFINED`).
        private_data: PrivateData,
    },
    /// Active side: no answer, no route or a protocol error; the attempt
    /// failed. `destroy` the connection.
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is down (DREQ either way, or a fatal transport
    /// error). Outstanding work requests complete with `WrFlushErr`; once
    /// they are polled, `destroy` the connection.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            Self::ConnectRequest { conn, .. }
            | Self::Established { conn, .. }
            | Self::Rejected { conn, .. }
            | Self::Unreachable { conn }
            | Self::Disconnected { conn } => *conn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_bounds() {
        assert!(PrivateData::try_from_slice(&[0; MAX_PRIVATE_DATA_LEN]).is_ok());
        assert_eq!(
            PrivateData::try_from_slice(&[0; MAX_PRIVATE_DATA_LEN + 1]),
            Err(ConnectError::PrivateDataTooLong)
        );
        assert_eq!(
            PrivateData::try_from_slice(b"abc").unwrap().as_slice(),
            b"abc"
        );
    }

    #[test]
    fn event_conn() {
        let event = CmEvent::Disconnected { conn: ConnId(3) };
        assert_eq!(event.conn(), ConnId(3));
    }
}
