//! The HCA's side of connection management: CM events acted on (QP state
//! changes, RTU, rejects) and surfaced as [`CmEvent`]s, active connections
//! waiting for ARP, and connections whose QP failed.
//!
//! Split from `hca.rs` (the device, its tables and QP management); see its
//! module docs, "Connection management", for the whole sequence.

use super::*;

impl<S, K, const N: usize, const Q: usize, const C: usize> Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    /// Moves CM events into the HCA's event queue, acting on each (QP state
    /// changes, RTU, rejects). Bounded by the event queue's room.
    pub(super) fn drain_cm_events(&mut self) {
        while !self.events.is_full() && self.cm.has_events() {
            let Some(event) = self.cm.poll_event() else {
                break;
            };
            self.cm_dirty = true;
            self.on_cm_event(event);
        }
    }

    pub(super) fn push_event(&mut self, event: CmEvent) {
        // The caller checked for room (one event per CM event).
        let _ = self.events.push_back(event);
    }

    /// Flushes a QP's work requests (its state goes to `Err`).
    pub(super) fn flush_slot(&mut self, slot: usize) {
        if let Some(qp) = self.qps[slot].as_mut() {
            if qp.state() != QpState::Err {
                let mut ctx = Context {
                    arena: &mut self.arena,
                    cq: &mut self.cq,
                    reorder: &mut self.reorder,
                    counters: &mut self.counters,
                };
                qp.enter_error(&mut ctx, verbs::WcStatus::WrFlushErr);
            }
        }
        self.touched(slot);
    }

    pub(super) fn on_cm_event(&mut self, event: cm::Event) {
        let now = self.now;
        match event {
            cm::Event::ConnectRequest { conn: cm, request } => {
                let link = Link::Requested {
                    cm,
                    attributes: request.qp,
                    route: request.route,
                    udp_src_port: rdma_cm_udp_src_port(request.cma_src_port, request.port),
                };
                match self.create_linked_qp(link) {
                    Ok((conn, _)) => self.push_event(CmEvent::ConnectRequest {
                        conn,
                        local: request.local_addr(),
                        remote: request.remote_addr(),
                        private_data: request.private_data,
                    }),
                    Err(_) => {
                        self.control.requests_refused += 1;
                        let _ = self.cm.reject(now, cm, cm::RejectReason::NoResources, &[]);
                    }
                }
            }
            cm::Event::Reply { conn: cm, reply } => {
                let Some(slot) = self.slot_of_cm(cm) else {
                    let _ = self.cm.reject(now, cm, cm::RejectReason::NoResources, &[]);
                    return;
                };
                let Link::Requesting {
                    peer,
                    local,
                    udp_src_port,
                    ..
                } = self.links[slot]
                else {
                    return;
                };
                let params = self.qp_params(&reply.qp, local, peer, udp_src_port);
                let connected = self.qps[slot]
                    .as_mut()
                    .is_some_and(|qp| qp.connect(params).is_ok());
                self.touched(slot);
                if connected && self.cm.ready_to_use(cm).is_ok() {
                    self.links[slot] = Link::Connected { cm };
                    let conn = ConnId(local.qpn.value());
                    self.push_event(CmEvent::Established {
                        conn,
                        private_data: reply.private_data,
                    });
                } else {
                    let _ = self.cm.reject(now, cm, cm::RejectReason::NoResources, &[]);
                    self.flush_slot(slot);
                    self.close(
                        slot,
                        CmEvent::Unreachable {
                            conn: self.conn_at(slot),
                        },
                    );
                }
            }
            cm::Event::Established { conn: cm } => {
                if let Some(slot) = self.slot_of_cm(cm) {
                    let ready = self.qps[slot]
                        .as_mut()
                        .is_some_and(|qp| qp.ready_to_send().is_ok());
                    self.touched(slot);
                    if ready {
                        let conn = self.conn_at(slot);
                        self.push_event(CmEvent::Established {
                            conn,
                            private_data: PrivateData::new(),
                        });
                    }
                }
            }
            cm::Event::Rejected {
                conn: cm,
                reason,
                private_data,
            } => {
                if let Some(slot) = self.slot_of_cm(cm) {
                    self.flush_slot(slot);
                    let conn = self.conn_at(slot);
                    let event = if matches!(self.links[slot], Link::Requesting { .. }) {
                        CmEvent::Rejected {
                            conn,
                            reason: RejectReason(reason.into()),
                            private_data,
                        }
                    } else {
                        CmEvent::Disconnected { conn }
                    };
                    self.close(slot, event);
                }
            }
            cm::Event::TimedOut { conn: cm, .. } => {
                if let Some(slot) = self.slot_of_cm(cm) {
                    self.flush_slot(slot);
                    let conn = self.conn_at(slot);
                    let event = if matches!(self.links[slot], Link::Requesting { .. }) {
                        CmEvent::Unreachable { conn }
                    } else {
                        CmEvent::Disconnected { conn }
                    };
                    self.close(slot, event);
                }
            }
            cm::Event::Disconnected { conn: cm, .. } => {
                if let Some(slot) = self.slot_of_cm(cm) {
                    self.flush_slot(slot);
                    let conn = self.conn_at(slot);
                    self.close(slot, CmEvent::Disconnected { conn });
                }
            }
        }
    }

    pub(super) fn conn_at(&self, slot: usize) -> ConnId {
        self.qps[slot].as_ref().map_or(ConnId(0), Qp::conn)
    }

    /// Surfaces `event` once and marks the slot closed.
    pub(super) fn close(&mut self, slot: usize, event: CmEvent) {
        if matches!(self.links[slot], Link::Closed { .. }) {
            return;
        }
        let cm = self.links[slot].cm();
        self.links[slot] = Link::Closed { cm };
        self.push_event(event);
    }

    /// The RC parameters of a CM-made QP.
    pub(super) fn qp_params(
        &self,
        attributes: &QpAttributes,
        local: LocalQp,
        peer: PeerAddr,
        udp_src_port: u16,
    ) -> QpParams {
        let mut remote_access = AccessFlags::REMOTE_WRITE;
        if local.responder_resources > 0 {
            remote_access = remote_access.union(AccessFlags::REMOTE_READ);
        }
        QpParams {
            peer_qpn: attributes.remote_qpn,
            send_psn: attributes.send_psn,
            recv_psn: local.starting_psn,
            mtu: attributes.path_mtu,
            local_ack_timeout: attributes.ack_timeout,
            retry_count: attributes.retry_count,
            rnr_retry: attributes.rnr_retry_count,
            min_rnr_timer: MIN_RNR_TIMER,
            max_rd_atomic: local.initiator_depth.min(attributes.max_initiator_depth),
            max_dest_rd_atomic: local
                .responder_resources
                .min(attributes.peer_initiator_depth),
            remote_access,
            path: Path {
                local_mac: self.config.mac,
                peer_mac: peer.mac.0,
                local_ip: self.config.ip,
                peer_ip: peer.ip.octets(),
                udp_src_port: self.udp_source_port(udp_src_port),
                tos: attributes.traffic_class,
                ttl: attributes.hop_limit,
            },
            selective_retransmission: attributes.selective_retransmission,
        }
    }

    /// Active connections waiting for ARP: send the REQ once the server's
    /// MAC is known, give up when ARP failed.
    pub(super) fn resolve_pending(&mut self, now: u64) {
        let mut next = self.resolving.next_from(0);
        while let Some(slot) = next {
            next = self.resolving.next_from(slot + 1);
            let Some(Link::Resolving(request)) = self.links.get(slot) else {
                self.resolving.remove(slot);
                continue;
            };
            let request = request.clone();
            let neighbor = match self.link_mode {
                LinkMode::Ethernet => self.arp.state(now, request.peer_ip),
                // The kernel resolves: the REQ goes out at once.
                LinkMode::Udp { .. } => NeighborState::Reachable(PSEUDO_MAC),
            };
            match neighbor {
                NeighborState::Reachable(mac) | NeighborState::Stale(mac) => {
                    let peer = PeerAddr {
                        mac,
                        ip: request.peer_ip,
                    };
                    let params = ConnectParams {
                        route: Route {
                            local_ip: Ipv4Address::from(self.config.ip),
                            peer,
                        },
                        port: request.port,
                        src_port: request.src_port,
                        qp: request.local,
                        path_mtu: self.path_mtu,
                        retry_count: request.retry_count,
                        traffic_class: 0,
                        hop_limit: 64,
                        private_data: &request.private_data,
                    };
                    let result = self.cm.connect(now, &mut CmRandom(&mut self.keys), &params);
                    self.cm_dirty = true;
                    match result {
                        Ok(cm) => {
                            self.links[slot] = Link::Requesting {
                                cm,
                                peer,
                                local: request.local,
                                udp_src_port: rdma_cm_udp_src_port(request.src_port, request.port),
                            };
                        }
                        Err(_) => self.fail_resolving(slot),
                    }
                }
                NeighborState::Failed => self.fail_resolving(slot),
                NeighborState::Unknown => {
                    // Evicted or expired before the answer: ask again.
                    let source = Ipv4Address::from(self.config.ip);
                    if let Some(frame) = self.arp.request(now, source, request.peer_ip) {
                        self.queue_arp(frame);
                    }
                }
                NeighborState::Incomplete => {}
            }
        }
    }

    pub(super) fn fail_resolving(&mut self, slot: usize) {
        if self.events.is_full() {
            return; // retried on the next poll
        }
        self.flush_slot(slot);
        let conn = self.conn_at(slot);
        self.close(slot, CmEvent::Unreachable { conn });
    }

    /// Connections whose QP died of a transport error (retries exhausted, a
    /// NAK for a fatal error): send the DREQ so the peer learns, and surface
    /// `Disconnected` now (its work requests already completed with errors).
    pub(super) fn reap_failed_qps(&mut self) {
        let mut next = self.failed.next_from(0);
        while let Some(slot) = next {
            next = self.failed.next_from(slot + 1);
            let failed = self.qps[slot]
                .as_ref()
                .is_some_and(|qp| qp.state() == QpState::Err);
            let cm = match self.links[slot] {
                _ if !failed => None,
                Link::Connected { cm } => Some(cm),
                // Not connected yet: reaped once it is.
                Link::Resolving(_) | Link::Requesting { .. } | Link::Requested { .. } => {
                    continue;
                }
                // Closed, closing or made by hand: never reaped.
                Link::Manual | Link::Closing { .. } | Link::Closed { .. } => None,
            };
            let Some(cm) = cm else {
                self.failed.remove(slot);
                continue;
            };
            if self.events.is_full() {
                continue;
            }
            self.failed.remove(slot);
            let _ = self
                .cm
                .disconnect(self.now, &mut CmRandom(&mut self.keys), cm);
            self.cm_dirty = true;
            let conn = self.conn_at(slot);
            self.close(slot, CmEvent::Disconnected { conn });
        }
    }
}
