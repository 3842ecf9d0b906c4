//! The HCA's receive side: a frame or datagram parsed once and checked
//! (address, P_Key, QPN, peer), then handed to its QP, QP1's CM or the
//! neighbour table.
//!
//! Split from `hca.rs` (the device, its tables and QP management); see its
//! module docs.

use super::*;

impl<S, K, const N: usize, const Q: usize, const C: usize> Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    /// Handles one received Ethernet frame: ARP goes to the neighbour table
    /// (a reply is queued for [`Hca::poll`]), QP1 MADs to the CM, RC packets
    /// to their QP. Malformed frames, bad ICRCs, frames not for our IP, with
    /// a foreign P_Key, for an unknown or not-ready QPN, or not from the QP's
    /// peer are dropped silently and counted. Does bounded work (one frame).
    pub fn receive(&mut self, now: u64, frame: &[u8]) {
        self.now = self.now.max(now);
        self.counters.frames_in += 1;
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            self.control.arp_in += 1;
            if let Some(reply) = self.arp.process(now, frame) {
                self.queue_arp(reply);
            }
            if self
                .links
                .iter()
                .any(|link| matches!(link, Link::Resolving(_)))
            {
                self.resolve_pending(now);
            }
            return;
        }
        // The opcode byte first: every other frame goes the general way
        // without the fast path's look at it.
        let continuation = matches!(
            frame
                .get(FIXED_HEADERS_LEN - bth::HEADER_LEN)
                .copied()
                .map(Opcode::from),
            Some(Opcode::RcRdmaWriteMiddle | Opcode::RcRdmaWriteLast)
        );
        if continuation && self.fast_paths {
            if let Some(view) = PacketView::parse(frame) {
                if self.receive_write_continuation(&view) {
                    return;
                }
            }
        }
        let icrc = self.icrc.clone();
        with_parsed_frame(&icrc, frame, |parsed| self.deliver(now, parsed));
    }

    /// The fast path of [`Hca::receive`]: an RDMA WRITE MIDDLE or LAST
    /// packet that continues a WRITE in order goes from the fixed headers
    /// straight to [`Qp::receive_write_continuation`], without the frame's
    /// reprs. It makes the checks [`Hca::deliver`] makes (our IP, the
    /// default P_Key, a QP of ours, its peer's IP) and the ICRC's; any
    /// packet they or the QP turn down returns `false` with nothing
    /// changed and takes the general path, which counts or answers it.
    fn receive_write_continuation(&mut self, view: &PacketView<'_>) -> bool {
        if view.dst_ip() != self.config.ip
            || !view.bth.pkey.is_default_partition()
            || view.bth.dest_qp == Qpn::GSI
        {
            return false;
        }
        let Some(slot) = self.slot_of(ConnId(view.bth.dest_qp.value())) else {
            return false;
        };
        let Some(qp) = self.qps[slot].as_mut() else {
            return false;
        };
        if qp.peer_ip() != Some(view.src_ip()) || !view.icrc_ok(&self.icrc) {
            return false;
        }
        let mut ctx = Context {
            arena: &mut self.arena,
            cq: &mut self.cq,
            reorder: &mut self.reorder,
            counters: &mut self.counters,
        };
        if !qp.receive_write_continuation(&view.bth, view.payload, &mut ctx) {
            return false;
        }
        self.touched(slot);
        true
    }

    /// Handles one datagram received in [`LinkMode::Udp`] from `from`: the
    /// ICRC is checked over the pseudo-header ([`parse_datagram`]), then
    /// everything is as in [`Hca::receive`] (which a UDP-mode HCA does not
    /// need: it has no ARP). Datagrams from non-IPv4 senders are counted in
    /// `drop_bad_address`; any datagram reaching an Ethernet-mode HCA in
    /// `drop_malformed`. Does bounded work (one datagram).
    pub fn receive_datagram(&mut self, now: u64, from: SocketAddr, datagram: &[u8]) {
        self.now = self.now.max(now);
        self.counters.frames_in += 1;
        if !matches!(self.link_mode, LinkMode::Udp { .. }) {
            self.counters.drop_malformed += 1;
            return;
        }
        let SocketAddr::V4(from) = from else {
            self.counters.drop_bad_address += 1;
            return;
        };
        let local = Ipv4Address::from(self.config.ip);
        match parse_datagram(from, local, datagram) {
            Ok(parsed) => self.deliver(now, Ok(&parsed)),
            Err(error) => self.deliver(now, Err(error)),
        }
    }

    /// The checks and dispatch shared by [`Hca::receive`] and
    /// [`Hca::receive_datagram`], after parsing and the ICRC check.
    fn deliver(&mut self, now: u64, parsed: Result<&crate::wire::RoceFrame<'_>, ParseError>) {
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(ParseError::BadChecksum) => {
                self.counters.drop_bad_checksum += 1;
                return;
            }
            Err(_) => {
                self.counters.drop_malformed += 1;
                return;
            }
        };
        if parsed.ip.dst_addr.octets() != self.config.ip {
            self.counters.drop_bad_address += 1;
            return;
        }
        if !parsed.bth.pkey.is_default_partition() {
            self.counters.drop_bad_pkey += 1;
            return;
        }
        if parsed.bth.dest_qp == Qpn::GSI {
            self.receive_gsi(now, parsed);
            return;
        }
        if parsed.bth.opcode.transport() != Transport::Rc {
            self.counters.drop_bad_opcode += 1;
            return;
        }
        let conn = ConnId(parsed.bth.dest_qp.value());
        let Some(slot) = self.slot_of(conn) else {
            self.counters.drop_unknown_qpn += 1;
            return;
        };
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        if qp.peer_ip() != Some(parsed.ip.src_addr.octets()) {
            self.counters.drop_bad_address += 1;
            return;
        }
        let was_rtr = qp.state() == QpState::Rtr;
        let mut ctx = Context {
            arena: &mut self.arena,
            cq: &mut self.cq,
            reorder: &mut self.reorder,
            counters: &mut self.counters,
        };
        qp.receive(now, parsed, &mut ctx);
        self.touched(slot);
        if was_rtr {
            // The first packet before the RTU establishes the connection
            // (ib-cm.md §4.8): the CM reports it, the event moves us to RTS.
            if let Link::Connected { cm } = self.links[slot] {
                let _ = self.cm.notify_data_received(cm);
                self.drain_cm_events();
            }
        }
    }

    /// A frame for QP1: the GSI rules of roce-v2.md §3, then the CM.
    fn receive_gsi(&mut self, now: u64, parsed: &crate::wire::RoceFrame<'_>) {
        let good = parsed.bth.opcode == Opcode::UdSendOnly
            && parsed.ext.deth.is_some_and(|deth| deth.qkey == Qkey::GSI)
            && parsed.payload.len() == cm::MAD_LEN;
        if !good {
            self.control.drop_bad_gsi += 1;
            return;
        }
        let route = Route {
            local_ip: parsed.ip.dst_addr,
            peer: PeerAddr {
                mac: parsed.eth.src_addr,
                ip: parsed.ip.src_addr,
            },
        };
        self.control.mads_in += 1;
        self.cm
            .process_mad(now, &mut CmRandom(&mut self.keys), route, parsed.payload);
        self.cm_dirty = true;
        self.drain_cm_events();
    }

    pub(super) fn queue_arp(&mut self, frame: ArpFrame) {
        if self.arp_out.push_back(frame).is_err() {
            self.control.arp_dropped += 1;
        }
    }
}
