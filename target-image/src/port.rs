//! [`Port`]: what the engine needs of the device behind an interface
//! besides verbs — its own progress and its counters. The software HCA
//! (`roce::hca::Hca`, Ethernet frames or UDP datagrams) is one port; a
//! verbs provider over a real HCA or Linux rxe (`verbs-ibv`, hosted only)
//! is another. RTRS and RNBD see only [`verbs::Verbs`].

use core::fmt;
use core::net::SocketAddrV4;

use roce::hca::LinkMode;
use verbs::{ConnId, KeySource, Verbs};

use crate::engine::{EngineHca, Transmit};

/// A device the engine serves an interface through.
pub trait Port: Verbs {
    /// Runs the device's own work once (for a software HCA: packets out,
    /// retransmission and CM timers), sending what it emits on `sink` as
    /// interface `interface`. Returns whether anything happened.
    /// Generic over the sink, so that each frame reaches it with a direct
    /// call (no `dyn` dispatch per frame).
    fn poll_link<T: Transmit + ?Sized>(&mut self, now: u64, interface: usize, sink: &mut T)
        -> bool;

    /// When [`poll_link`](Self::poll_link) next has timed work (`None`:
    /// only input can cause work).
    fn poll_at(&self, now: u64) -> Option<u64>;

    /// Whether registered regions can be re-keyed (`always_invalidate`
    /// needs it; userspace verbs cannot).
    fn can_rekey(&self) -> bool {
        true
    }

    /// The registered memory the port's frames carry payloads from, as
    /// addresses, for a NIC driver that can send from it in place (the
    /// image's virtio-net: `VirtioNet::add_zero_copy_window`). `None` for
    /// a device that moves its own data.
    fn registered_memory(&self) -> Option<core::ops::Range<usize>> {
        None
    }

    /// The device's counters, on one line without a newline.
    ///
    /// # Errors
    /// The formatter's.
    fn write_counters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// The device's counters for the metrics endpoint, one call of
    /// `f(name, help, value)` each: the metric is
    /// `brick_interface_{name}_total` (monotonic). The default has none.
    fn for_each_counter(&self, f: &mut dyn FnMut(&'static str, &'static str, u64)) {
        let _ = f;
    }

    /// Packets connection `conn`'s requester sent again, where the device
    /// counts them per connection (`None`: it does not, or no such
    /// connection; a kernel HCA counts per port only).
    fn retransmissions(&self, conn: ConnId) -> Option<u64> {
        let _ = conn;
        None
    }
}

impl<K: KeySource> Port for EngineHca<K> {
    fn poll_link<T: Transmit + ?Sized>(
        &mut self,
        now: u64,
        interface: usize,
        sink: &mut T,
    ) -> bool {
        if matches!(self.link_mode(), LinkMode::Udp { .. }) {
            return self.poll_datagrams(
                now,
                &mut |to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                    sink.transmit_datagram(interface, to, header, payload, trailer)
                },
            );
        }
        self.poll(now, &mut |headers: &[u8],
                             payload: &[&[u8]],
                             trailer: &[u8]| {
            sink.transmit(interface, headers, payload, trailer)
        })
    }

    fn poll_at(&self, now: u64) -> Option<u64> {
        roce::hca::Hca::poll_at(self, now)
    }

    fn registered_memory(&self) -> Option<core::ops::Range<usize>> {
        let bytes = self.arena().bytes();
        let start = bytes.as_ptr() as usize;
        Some(start..start + bytes.len())
    }

    fn retransmissions(&self, conn: ConnId) -> Option<u64> {
        self.qp(conn).map(roce::qp::Qp::retransmissions)
    }

    fn write_counters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.counters();
        write!(
            f,
            "frames in {} out {} retransmissions {} timeouts {} (early {}) naks sent {} dropped malformed {} checksum {} out-of-sequence {}",
            c.frames_in,
            c.frames_out,
            c.retransmissions,
            c.timeouts,
            c.early_timeouts,
            c.naks_sent,
            c.drop_malformed,
            c.drop_bad_checksum,
            c.drop_out_of_sequence
        )
    }

    fn for_each_counter(&self, f: &mut dyn FnMut(&'static str, &'static str, u64)) {
        let c = self.counters();
        f(
            "frames_received",
            "Frames (or datagrams) received.",
            c.frames_in,
        );
        f("frames_sent", "Frames (or datagrams) sent.", c.frames_out);
        f(
            "drops_malformed",
            "Frames dropped: did not parse.",
            c.drop_malformed,
        );
        f(
            "drops_checksum",
            "Frames dropped: bad ICRC or IPv4 checksum.",
            c.drop_bad_checksum,
        );
        f(
            "drops_address",
            "Frames dropped: not for our address or not from the QP's peer.",
            c.drop_bad_address,
        );
        f(
            "drops_unknown_qp",
            "Frames dropped: no such QP, or not ready.",
            c.drop_unknown_qpn,
        );
        f(
            "drops_out_of_sequence",
            "Frames dropped by a responder after its NAK.",
            c.drop_out_of_sequence,
        );
        f("duplicates", "Duplicate requests seen.", c.duplicates);
        f(
            "retransmissions",
            "Packets sent again (go-back-N).",
            c.retransmissions,
        );
        f("timeouts", "Retransmission timer expiries.", c.timeouts);
        f("naks_sent", "NAKs sent (RNR excluded).", c.naks_sent);
        f(
            "naks_received",
            "NAKs received (RNR excluded).",
            c.naks_received,
        );
        f("rnr_naks_sent", "RNR NAKs sent.", c.rnr_naks_sent);
        f(
            "rnr_naks_received",
            "RNR NAKs received.",
            c.rnr_naks_received,
        );
        f(
            "cq_overflows",
            "Completions lost to a full completion queue.",
            c.cq_overflows,
        );
    }
}
