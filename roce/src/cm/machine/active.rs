//! The active side, REQ → REP → RTU as a Linux rdma_cm client runs it
//! (ib-cm.md §4.2, §5): [`Cm::connect`] builds and sends the REQ, the REP is
//! taken in, and [`Cm::ready_to_use`] answers it with the RTU.

use super::{copy_private_data, fresh_tid, valid_qpn, Cm, DEFAULT_HOP_LIMIT, NO_QP};
use crate::cm::state::{EventKind, RequestInfo, Role};
use crate::cm::{
    ack_timeout, cm_timeout_ms, CmError, ConnId, ConnectParams, PrivateData, QpAttributes, Random,
    Route, State, MILLISECOND, REQ_USER_DATA_LEN,
};
#[cfg(doc)]
use crate::cm::{Config, Event};
use crate::types::{Gid, Pkey, Qkey};
use crate::wire::cm::{req, Message, PathRepr, RepRepr, ReqRepr, RtuRepr, TransportType};
use crate::wire::rdma_cm::{self, PortSpace};

impl<const N: usize> Cm<N> {
    /// Active: opens a connection to an RDMA CM listener: sends a REQ shaped like a
    /// Linux rdma_cm client's (ib-cm.md §4.2: service ID, CMA header, IPv4-mapped
    /// GIDs, flow label, CM timeouts 20, 15 retries), retransmitted every
    /// `2 × life time + response timeout` (6144 ms by default) until the REP,
    /// a REJ, or the last retry ([`Event::TimedOut`]).
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] (above 56 bytes), [`CmError::InvalidParameter`]
    /// (QPN 0/1, reserved MTU or one above [`Config::max_path_mtu`]), [`CmError::NoResources`] (no free slot or comm ID).
    pub fn connect<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        params: &ConnectParams<'_>,
    ) -> Result<ConnId, CmError> {
        if params.private_data.len() > REQ_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let max_mtu = self.config.max_path_mtu.bytes().unwrap_or(0);
        if !valid_qpn(params.qp.qpn) || params.path_mtu.bytes().is_none_or(|b| b > max_mtu) {
            return Err(CmError::InvalidParameter);
        }
        let index = self.vacant_slot().ok_or(CmError::NoResources)?;
        let local_comm_id = self.fresh_comm_id(rng).ok_or(CmError::NoResources)?;
        let tid = fresh_tid(rng, local_comm_id);
        let config = self.config;
        let hop_limit = if params.hop_limit == 0 {
            DEFAULT_HOP_LIMIT
        } else {
            params.hop_limit
        };
        let local_ack_timeout = ack_timeout(config.local_ca_ack_delay, config.packet_life_time);

        let mut private_data = [0u8; req::PRIVATE_DATA_LEN];
        {
            let mut header = rdma_cm::Packet::new_unchecked(&mut private_data[..]);
            rdma_cm::Repr {
                src_port: params.src_port,
                src_addr: params.route.local_ip,
                dst_addr: params.route.peer.ip,
            }
            .emit(&mut header);
        }
        private_data[rdma_cm::HEADER_LEN..][..params.private_data.len()]
            .copy_from_slice(params.private_data);

        let primary_path = PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Gid::from_ipv4(params.route.local_ip),
            remote_gid: Gid::from_ipv4(params.route.peer.ip),
            flow_label: (u32::from(params.src_port) * 31 + u32::from(params.port)) & 0xf_ffff,
            packet_rate: 0,
            traffic_class: params.traffic_class,
            hop_limit,
            sl: 0,
            subnet_local: hop_limit <= 1,
            local_ack_timeout,
        };
        let retry_count = params.retry_count.min(7);
        let repr = ReqRepr {
            local_comm_id,
            vendor_id: 0,
            service_id: rdma_cm::service_id(PortSpace::Tcp, params.port),
            local_ca_guid: config.local_ca_guid,
            local_qkey: Qkey(0),
            local_qpn: params.qp.qpn,
            responder_resources: params.qp.responder_resources,
            local_eecn: 0,
            initiator_depth: params.qp.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: config.cm_response_timeout.min(31),
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: params.qp.starting_psn,
            local_cm_response_timeout: config.cm_response_timeout.min(31),
            retry_count,
            pkey: Pkey::DEFAULT,
            path_mtu: params.path_mtu,
            rdc_exists: false,
            rnr_retry_count: params.qp.rnr_retry_count.min(7),
            max_cm_retries: config.max_cm_retries.min(15),
            srq: params.qp.srq,
            extended_transport_type: 0,
            brick_selective: config.selective_retransmission,
            primary_path,
            alternate_path: PathRepr::default(),
            private_data: &private_data,
        };

        let interval = (2 * cm_timeout_ms(config.packet_life_time)
            + cm_timeout_ms(config.cm_response_timeout))
            * MILLISECOND;
        let conn = &mut self.conns[index];
        conn.generation = conn.generation.wrapping_add(1);
        conn.state = State::ReqSent;
        conn.role = Role::Active;
        conn.route = params.route;
        conn.local_comm_id = local_comm_id;
        conn.remote_comm_id = 0;
        conn.req_tid = tid;
        conn.local_qpn = Some(params.qp.qpn);
        conn.qp = QpAttributes {
            path_mtu: params.path_mtu,
            retry_count,
            max_initiator_depth: params.qp.initiator_depth,
            traffic_class: params.traffic_class,
            hop_limit,
            ..NO_QP
        };
        conn.request = RequestInfo {
            port: params.port,
            cma_src_addr: params.route.local_ip,
            cma_src_port: params.src_port,
            cma_dst_addr: params.route.peer.ip,
            responder_resources: params.qp.responder_resources,
            initiator_depth: params.qp.initiator_depth,
            flow_control: false,
        };
        conn.cm_timeout = interval;
        conn.cm_retries = config.max_cm_retries;
        conn.events.clear();
        conn.peer_private_data = PrivateData::new();
        conn.reject_private_data = PrivateData::new();
        conn.established = false;
        conn.down_reported = false;
        self.send(index, tid, Message::Req(repr));
        self.start_timer(now, index, interval, config.max_cm_retries);
        Ok(self.conn_id(index))
    }

    pub(super) fn on_rep(&mut self, route: Route, rep: &RepRepr<'_>) -> bool {
        let Some(index) = self.find_local(rep.remote_comm_id, route.peer.ip) else {
            return false;
        };
        let conn = &mut self.conns[index];
        if conn.role != Role::Active {
            return false;
        }
        match conn.state {
            State::ReqSent | State::MraReqRcvd => {
                if !valid_qpn(rep.local_qpn) || rep.local_comm_id == 0 {
                    return false;
                }
                conn.remote_comm_id = rep.local_comm_id;
                conn.qp.remote_qpn = rep.local_qpn;
                conn.qp.send_psn = rep.starting_psn;
                conn.qp.ack_timeout =
                    ack_timeout(rep.target_ack_delay, self.config.packet_life_time);
                conn.qp.rnr_retry_count = rep.rnr_retry_count;
                conn.qp.max_initiator_depth =
                    conn.qp.max_initiator_depth.min(rep.responder_resources);
                conn.qp.peer_initiator_depth = rep.initiator_depth;
                conn.qp.remote_ca_guid = rep.local_ca_guid;
                conn.qp.peer_srq = rep.srq;
                conn.qp.selective_retransmission =
                    rep.brick_selective && self.config.selective_retransmission;
                conn.peer_private_data = copy_private_data(rep.private_data);
                conn.state = State::RepRcvd;
                conn.timer = None;
                self.push_event(index, EventKind::Reply);
                true
            }
            // Our RTU was lost: the duplicate REP asks for it again (ib-cm.md §4.4).
            State::Established if conn.remote_comm_id == rep.local_comm_id => {
                self.mark_tx(index);
                true
            }
            // Duplicate while the HCA sets the QP up: nothing to add.
            State::RepRcvd => true,
            _ => false,
        }
    }

    /// Active: the QP is in RTS with the [`Event::Reply`] attributes: sends the RTU;
    /// the connection is established (Linux reports ESTABLISHED here too, ib-cm.md
    /// §5.4). A duplicate REP later re-sends the RTU.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`], [`CmError::InvalidState`] (no REP pending).
    pub fn ready_to_use(&mut self, conn: ConnId) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        let record = &self.conns[index];
        if record.state != State::RepRcvd {
            return Err(CmError::InvalidState);
        }
        let repr = RtuRepr {
            local_comm_id: record.local_comm_id,
            remote_comm_id: record.remote_comm_id,
            private_data: &[],
        };
        let tid = record.req_tid;
        self.send(index, tid, Message::Rtu(repr));
        let record = &mut self.conns[index];
        record.state = State::Established;
        record.established = true;
        record.timer = None;
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::cm::{Config, LocalQp, PeerAddr, Route};
    use crate::types::{Mtu, Psn, Qpn};
    use crate::wire::{EthernetAddress, Ipv4Address};

    fn route(local: [u8; 4], peer: [u8; 4]) -> Route {
        Route {
            local_ip: Ipv4Address::new(local[0], local[1], local[2], local[3]),
            peer: PeerAddr {
                mac: EthernetAddress([2, 0, 0, 0, 0, peer[3]]),
                ip: Ipv4Address::new(peer[0], peer[1], peer[2], peer[3]),
            },
        }
    }

    #[test]
    fn test_connect_parameter_checks() {
        let mut cm = Cm::<1>::new(Config::new(1));
        let mut rng = || 5u32;
        let qp = LocalQp {
            qpn: Qpn::new(1),
            starting_psn: Psn::new(1),
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 7,
            srq: false,
        };
        let mut params = ConnectParams {
            route: route([10, 0, 0, 1], [10, 0, 0, 2]),
            port: 1234,
            src_port: 40000,
            qp,
            path_mtu: Mtu::Mtu1024,
            retry_count: 7,
            traffic_class: 0,
            hop_limit: 64,
            private_data: &[0; 57],
        };
        assert_eq!(
            cm.connect(0, &mut rng, &params),
            Err(CmError::PrivateDataTooLong)
        );
        params.private_data = &[];
        assert_eq!(
            cm.connect(0, &mut rng, &params),
            Err(CmError::InvalidParameter)
        );
        params.qp.qpn = Qpn::new(0x11);
        let conn = cm.connect(0, &mut rng, &params).unwrap();
        assert_eq!(cm.state(conn), Some(State::ReqSent));
        assert!(cm.qpn_in_use(Qpn::new(0x11)));
        // One slot: the second connect has none; the comm ID 5 is taken anyway.
        params.qp.qpn = Qpn::new(0x12);
        assert_eq!(cm.connect(0, &mut rng, &params), Err(CmError::NoResources));
        let out = cm.dispatch().unwrap();
        assert_eq!(out.mad[16..18], [0x00, 0x10]);
        assert!(cm.dispatch().is_none());
    }
}
