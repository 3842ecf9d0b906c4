//! [`Port`]: what the engine needs of the device behind an interface
//! besides verbs — its own progress and its counters. The software HCA
//! (`roce::hca::Hca`, Ethernet frames or UDP datagrams) is one port; a
//! verbs provider over a real HCA or Linux rxe (`verbs-ibv`, hosted only)
//! is another. RTRS and RNBD see only [`verbs::Verbs`].

use core::fmt;
use core::net::SocketAddrV4;

use roce::hca::LinkMode;
use verbs::{KeySource, Verbs};

use crate::engine::{EngineHca, Transmit};

/// A device the engine serves an interface through.
pub trait Port: Verbs {
    /// Runs the device's own work once (for a software HCA: packets out,
    /// retransmission and CM timers), sending what it emits on `sink` as
    /// interface `interface`. Returns whether anything happened.
    fn poll_link(&mut self, now: u64, interface: usize, sink: &mut dyn Transmit) -> bool;

    /// When [`poll_link`](Self::poll_link) next has timed work (`None`:
    /// only input can cause work).
    fn poll_at(&self, now: u64) -> Option<u64>;

    /// Whether registered regions can be re-keyed (`always_invalidate`
    /// needs it; userspace verbs cannot).
    fn can_rekey(&self) -> bool {
        true
    }

    /// The device's counters, on one line without a newline.
    ///
    /// # Errors
    /// The formatter's.
    fn write_counters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<K: KeySource> Port for EngineHca<K> {
    fn poll_link(&mut self, now: u64, interface: usize, sink: &mut dyn Transmit) -> bool {
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
}
