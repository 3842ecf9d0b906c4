//! The HCA's transmit side and its clock: one bounded poll sends what the
//! QPs, QP1 and ARP have due, and `poll_at` says when the next is.
//!
//! Split from `hca.rs` (the device, its tables and QP management); see its
//! module docs.

use super::*;

impl<S, K, const N: usize, const Q: usize, const C: usize> Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    /// Sends one MAD on QP1, wrapped as rxe wraps it (roce-v2.md §3).
    fn transmit_mad<F: FrameSink + ?Sized>(&mut self, outbound: &Outbound, sink: &mut F) {
        let headers = FrameHeaders {
            eth: EthernetRepr {
                src_addr: EthernetAddress(self.config.mac),
                dst_addr: outbound.route.peer.mac,
                ethertype: EtherType::Ipv4,
            },
            ip: Ipv4Repr {
                src_addr: outbound.route.local_ip,
                dst_addr: outbound.route.peer.ip,
                protocol: ipv4::Protocol::Udp,
                payload_len: 0,
                ttl: outbound.hop_limit,
                tos: outbound.traffic_class,
                ident: 0,
                dont_frag: true,
            },
            udp: UdpRepr {
                src_port: self.udp_source_port(udp::GSI_SOURCE_PORT),
                dst_port: udp::ROCE_V2_PORT,
            },
            bth: BthRepr {
                opcode: Opcode::UdSendOnly,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: Pkey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::GSI,
                // rxe's GSI QP sets AckReq (roce-v2.md §3).
                ack_req: true,
                psn: self.gsi_psn,
            },
            ext: ExtHeaders {
                deth: Some(DethRepr {
                    qkey: Qkey::GSI,
                    src_qp: Qpn::GSI,
                }),
                ..ExtHeaders::default()
            },
        };
        let mut buf = [0u8; MAX_HEADERS_LEN];
        let Ok(len) = headers.emit_headers(&mut buf, outbound.mad.len()) else {
            return;
        };
        let payload: [&[u8]; 1] = [&outbound.mad];
        let trailer = Trailer::from_seed(&self.icrc, &buf[..len], &payload);
        sink.transmit(&buf[..len], &payload, trailer.as_bytes());
        self.gsi_psn = self.gsi_psn.wrapping_add(1);
        self.control.mads_out += 1;
        self.counters.frames_out += 1;
    }

    /// Runs the timers (CM retransmissions and timeouts, ARP, every QP's),
    /// sends due frames through `sink` and moves connection events to
    /// [`Verbs::poll_cm_event`]: at most [`MAX_TX_BURST`] frames per call,
    /// ARP and MADs first, then QPs round robin. Returns whether any frame
    /// was sent (call again soon if so).
    #[inline]
    pub fn poll<F: FrameSink + ?Sized>(&mut self, now: u64, sink: &mut F) -> bool {
        self.now = self.now.max(now);
        if self.is_quiet(now) {
            // What the walk in `poll_work` would conclude, without the
            // calls: no timer due, nothing queued, no QP to visit.
            self.cm_dirty = false;
            return false;
        }
        self.poll_work(now, sink)
    }

    /// [`Hca::poll`] when something may be due: out of line, so that a
    /// quiet poll does not pay for its frame.
    #[inline(never)]
    fn poll_work<F: FrameSink + ?Sized>(&mut self, now: u64, sink: &mut F) -> bool {
        let mut budget = MAX_TX_BURST;
        // Control path.
        if self.cm.poll(now) {
            self.cm_dirty = true;
        }
        while let Some(frame) = self.arp.poll(now) {
            self.queue_arp(frame);
        }
        self.resolve_pending(now);
        self.drain_cm_events();
        while budget > 0 {
            let Some(frame) = self.arp_out.pop_front() else {
                break;
            };
            sink.transmit(&frame, &[], &[]);
            self.control.arp_out += 1;
            self.counters.frames_out += 1;
            budget -= 1;
        }
        while budget > 0 {
            let outbound = match self.mad_out.take() {
                Some(outbound) => outbound,
                None if !self.cm.has_output() => {
                    self.cm_dirty = false;
                    break;
                }
                None => match self.cm.dispatch() {
                    Some(outbound) => outbound,
                    None => {
                        self.cm_dirty = false;
                        break;
                    }
                },
            };
            self.transmit_mad(&outbound, sink);
            budget -= 1;
        }
        if budget == 0 && self.mad_out.is_none() {
            self.mad_out = self.cm.dispatch();
        }
        self.reap_failed_qps();
        // Data path: the QPs with work due, round robin from `next_poll`
        // (those at or above it, then those below); the others would send
        // nothing and change nothing.
        if !self.wake.any_due(now) {
            return budget < MAX_TX_BURST;
        }
        let start = self.next_poll;
        let qps = self.capacity.qps;
        let mut next = self.wake.next_from(start);
        let mut wrapped = false;
        while budget > 0 {
            let slot = match next {
                Some(slot) if !wrapped || slot < start => slot,
                Some(_) => break,
                None if !wrapped && start > 0 => {
                    wrapped = true;
                    next = self.wake.next_from(0);
                    continue;
                }
                None => break,
            };
            next = self.wake.next_from(slot + 1);
            if !self.wake.is_due(slot, now) {
                continue;
            }
            let Some(qp) = self.qps[slot].as_mut() else {
                self.wake.set(slot, None);
                continue;
            };
            let mut ctx = Context {
                arena: &mut self.arena,
                cq: &mut self.cq,
                reorder: &mut self.reorder,
                counters: &mut self.counters,
            };
            budget -= qp.poll(now, &mut ctx, sink, budget);
            self.touched(slot);
            if budget == 0 {
                self.next_poll = (slot + 1) % qps;
            }
        }
        if budget > 0 {
            // Every due QP was visited: the earliest time is exact again.
            self.wake.settle();
        }
        budget < MAX_TX_BURST
    }

    /// Whether [`Hca::poll`] at `now` would send nothing and change nothing
    /// but `cm_dirty`: no CM or ARP timer due, no connection resolving or
    /// failed, no CM event, ARP frame or MAD queued and no QP due. O(1) but
    /// for the ARP table's entries.
    #[inline]
    fn is_quiet(&self, now: u64) -> bool {
        !self.wake.any_due(now)
            && self.arp_out.is_empty()
            && self.mad_out.is_none()
            && self.resolving.is_empty()
            && self.failed.is_empty()
            && !self.cm.has_output()
            && !self.cm.has_events()
            && !self.cm.timers_due(now)
            && !self.arp.is_due(now)
    }

    /// [`Hca::poll`] for [`LinkMode::Udp`]: the same packets, each handed to
    /// `sink` as a datagram (the frame without its Ethernet, IPv4 and UDP
    /// headers, see [`crate::udp`]) addressed to the peer at the mode's
    /// port. The same budget applies; returns whether anything was sent.
    ///
    /// Meant for a UDP-mode HCA: an Ethernet-mode HCA's packets carry ICRCs
    /// over their real headers (per-QP source ports), which a UDP-mode peer
    /// rejects, and its ARP frames are dropped here. (Conversely, [`Hca::poll`]
    /// on a UDP-mode HCA yields each datagram behind its pseudo-header: a
    /// valid RoCEv2 frame, for captures.)
    pub fn poll_datagrams<D: DatagramSink + ?Sized>(&mut self, now: u64, sink: &mut D) -> bool {
        let port = match self.link_mode {
            LinkMode::Udp { port } => port,
            LinkMode::Ethernet => udp::ROCE_V2_PORT,
        };
        let mut frames = DatagramFrames {
            sink,
            port,
            skipped: 0,
        };
        let sent = self.poll(now, &mut frames);
        self.counters.frames_out -= frames.skipped.min(self.counters.frames_out);
        sent
    }

    /// When [`Hca::poll`] next has work: `Some(now)` if frames or events are
    /// waiting, the earliest timer otherwise (QPs, CM, ARP), `None` if idle.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        let control_ready = self.cm_dirty
            || self.mad_out.is_some()
            || !self.arp_out.is_empty()
            || self
                .resolving
                .iter()
                .any(|slot| matches!(self.links[slot], Link::Resolving(_)));
        let control = if control_ready {
            // Resolving connections wait for ARP: its timers wake us.
            if self.cm_dirty || self.mad_out.is_some() || !self.arp_out.is_empty() {
                Some(now)
            } else {
                self.arp.poll_at()
            }
        } else {
            None
        };
        self.occupied
            .iter()
            .filter_map(|slot| self.qps[slot].as_ref())
            .filter_map(|qp| qp.poll_at(now))
            .chain(control)
            .chain(self.cm.poll_at())
            .chain(self.arp.poll_at())
            .min()
    }
}
