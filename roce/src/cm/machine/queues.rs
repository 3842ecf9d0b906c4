//! What the CM hands back: the per-slot event queues behind
//! [`Cm::poll_event`], and the outbound MADs behind [`Cm::dispatch`] (each
//! slot's last MAD, kept for retransmission, and the stateless queue for
//! answers that have no slot).

use super::{emit_mad, Cm, DEFAULT_HOP_LIMIT};
use crate::cm::state::EventKind;
use crate::cm::{ConnectRequest, Event, Outbound, Reply, Route, MAD_LEN};
use crate::wire::cm::Message;

impl<const N: usize> Cm<N> {
    pub(super) fn push_event(&mut self, index: usize, kind: EventKind) {
        let seq = self.next_event_seq;
        self.next_event_seq += 1;
        // A lifetime produces at most three events and a slot is reused only once
        // its queue is empty, so this cannot overflow; if it ever did, dropping the
        // event is the bounded choice.
        let pushed = self.conns[index].events.push_back((seq, kind));
        debug_assert!(pushed.is_ok(), "more than EVENTS_PER_CONN events");
        self.with_events.insert(index);
    }

    /// Whether [`Cm::poll_event`] may have an event to report (O(1); false
    /// means it has none).
    pub fn has_events(&self) -> bool {
        !self.with_events.is_empty()
    }

    /// Whether [`Cm::dispatch`] may have a MAD to send (O(1); false means
    /// it has none).
    pub fn has_output(&self) -> bool {
        !self.stateless.is_empty() || !self.tx_ready.is_empty()
    }

    /// The oldest unreported event, or `None`. Bounded: one scan of the
    /// slots that have events (`None` at once when none has).
    pub fn poll_event(&mut self) -> Option<Event> {
        let mut oldest: Option<(u64, usize)> = None;
        let mut next = self.with_events.next_from(0);
        while let Some(index) = next {
            next = self.with_events.next_from(index + 1);
            match self.conns.get(index).and_then(|c| c.events.front()) {
                Some(&(seq, _)) => {
                    if oldest.is_none_or(|(first, _)| seq < first) {
                        oldest = Some((seq, index));
                    }
                }
                None => {
                    self.with_events.remove(index);
                }
            }
        }
        let (_, index) = oldest?;
        let conn = self.conn_id(index);
        let record = &mut self.conns[index];
        let (_, kind) = record.events.pop_front()?;
        if record.events.is_empty() {
            self.with_events.remove(index);
        }
        Some(match kind {
            EventKind::ConnectRequest => Event::ConnectRequest {
                conn,
                request: ConnectRequest {
                    route: record.route,
                    port: record.request.port,
                    cma_src_addr: record.request.cma_src_addr,
                    cma_src_port: record.request.cma_src_port,
                    cma_dst_addr: record.request.cma_dst_addr,
                    qp: record.qp,
                    private_data: record.peer_private_data.clone(),
                },
            },
            EventKind::Reply => Event::Reply {
                conn,
                reply: Reply {
                    qp: record.qp,
                    private_data: record.peer_private_data.clone(),
                },
            },
            EventKind::Established => Event::Established { conn },
            EventKind::Rejected(reason) => Event::Rejected {
                conn,
                reason,
                private_data: record.reject_private_data.clone(),
            },
            EventKind::TimedOut(waiting_for) => Event::TimedOut { conn, waiting_for },
            EventKind::Disconnected(cause) => Event::Disconnected { conn, cause },
        })
    }

    pub(super) fn send(&mut self, index: usize, transaction_id: u64, message: Message<'_>) {
        let conn = &mut self.conns[index];
        emit_mad(&mut conn.tx, transaction_id, message);
        self.mark_tx(index);
    }

    /// Queues slot `index`'s last MAD (`tx`) for [`Cm::dispatch`].
    pub(super) fn mark_tx(&mut self, index: usize) {
        if let Some(conn) = self.conns.get_mut(index) {
            conn.tx_pending = true;
            self.tx_ready.insert(index);
        }
    }

    pub(super) fn send_stateless(
        &mut self,
        route: Route,
        transaction_id: u64,
        message: Message<'_>,
    ) {
        self.send_stateless_with(route, 0, DEFAULT_HOP_LIMIT, transaction_id, message);
    }

    pub(super) fn send_stateless_with(
        &mut self,
        route: Route,
        traffic_class: u8,
        hop_limit: u8,
        transaction_id: u64,
        message: Message<'_>,
    ) {
        let mut out = Outbound {
            route,
            traffic_class,
            hop_limit,
            mad: [0; MAD_LEN],
        };
        emit_mad(&mut out.mad, transaction_id, message);
        if self.stateless.push_back(out).is_err() {
            self.stats.stateless_dropped += 1;
        }
    }

    /// The next MAD to send, or `None`: the slots with one are served
    /// round robin. Bounded: one scan of the slots with a MAD to send
    /// (`None` at once when there is none).
    pub fn dispatch(&mut self) -> Option<Outbound> {
        if let Some(out) = self.stateless.pop_front() {
            return Some(out);
        }
        let slots = self.conns.len();
        while let Some(index) = self.tx_ready.next_cyclic(self.next_tx) {
            self.tx_ready.remove(index);
            let Some(conn) = self.conns.get_mut(index) else {
                continue;
            };
            if conn.tx_pending {
                conn.tx_pending = false;
                self.next_tx = (index + 1) % slots;
                return Some(Outbound {
                    route: conn.route,
                    traffic_class: conn.qp.traffic_class,
                    hop_limit: conn.qp.hop_limit,
                    mad: conn.tx,
                });
            }
        }
        None
    }
}
