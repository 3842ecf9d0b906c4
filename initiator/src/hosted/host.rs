//! The single-threaded host behind a [`super::Session`]: the initiator,
//! its link and clock, one loop turn at a time (receive, poll, transmit,
//! idle or busy-poll), and the events and completions it collects.

use std::net::SocketAddrV4;

use hal::hosted::Packet;

use super::*;

/// How long a session on an RDMA device keeps polling after the last
/// work before it arms its completion queues and sleeps.
const IBV_SPIN_NS: u64 = 20_000_000;

/// The single-threaded host: initiator + link + clock.
pub(super) struct Host {
    pub(super) init: Initiator<HostPort>,
    /// The software HCA's link (none on an RDMA device).
    pub(super) link: Option<Link>,
    /// When the loop last found work (RDMA devices spin for a while after).
    pub(super) last_busy: u64,
    /// Busy polling after the last work on a hosted link (ns).
    pub(super) poll_ns: u64,
    pub(super) clock: MonotonicClock,
    pub(super) waiter: PollIdle,
    pub(super) events: Vec<Event>,
    /// Completions a blocking call reaped that were not its own.
    pub(super) stash: VecDeque<(Completion, Vec<u8>)>,
    pub(super) next_tag: u64,
    pub(super) io_timeout: Duration,
    /// SESS_INFO answered ([`Session::poll_up`]).
    pub(super) up: bool,
}

impl Host {
    /// One loop iteration without blocking; returns whether anything
    /// happened. What was submitted since the last turn is sent before the
    /// link is read (a QD1 request does not wait behind a receive that
    /// finds nothing), then a burst is taken, the initiator polled, and
    /// what that made (ACKs, answers, new requests) sent.
    pub(super) fn pump(&mut self) -> Result<bool, Error> {
        let mut now = self.clock.now();
        let mut busy = self.transmit(now);
        if busy {
            // The send may have yielded to the peer: what arrives now
            // arrived later.
            now = self.clock.now();
        }
        if let (Some(link), Some(hca)) = (self.link.as_mut(), self.init.verbs_mut().hca_mut()) {
            for _ in 0..RX_BURST {
                let received = link
                    .receive(|packet| match packet {
                        Packet::Frame(frame) => hca.receive(now, frame),
                        Packet::Datagram(from, datagram) => {
                            hca.receive_datagram(now, from, datagram)
                        }
                    })
                    .map_err(Error::LinkFailed)?;
                if !received {
                    break;
                }
                busy = true;
            }
        }
        busy |= self.init.poll(now);
        busy |= self.transmit(now);
        while let Some(event) = self.init.next_event() {
            busy = true;
            self.events.push(event);
        }
        if busy {
            self.last_busy = now;
        }
        Ok(busy)
    }

    /// Lets the software HCA send what is queued and flushes the link;
    /// returns whether anything was sent (an RDMA device sends on post).
    /// Busy polling, a send with nothing for the caller yields the core:
    /// what was sent needs the peer to run, and if it waits for this core
    /// it has it now instead of after another turn here.
    fn transmit(&mut self, now: u64) -> bool {
        let (Some(link), Some(hca)) = (self.link.as_mut(), self.init.verbs_mut().hca_mut()) else {
            return false;
        };
        let sent = match link {
            Link::Frame(_) => hca.poll(now, &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                link.transmit(h, p, t)
            }),
            Link::Udp(_) => hca.poll_datagrams(
                now,
                &mut |to: SocketAddrV4, h: &[u8], p: &[&[u8]], t: &[u8]| {
                    link.transmit_datagram(to, h, p, t)
                },
            ),
        };
        if link.has_pending_output() {
            link.flush();
        }
        if sent && self.poll_ns > 0 && self.init.completions_ready() == 0 {
            std::thread::yield_now();
        }
        sent
    }

    /// Blocks until the link (or the RDMA device) has input, or the next
    /// deadline (at most `limit`). On an RDMA device it first keeps
    /// polling for [`IBV_SPIN_NS`] after the last work, then arms the
    /// completion queues, polls once more and sleeps on its channels.
    pub(super) fn idle(&mut self, limit: u64) {
        let now = self.clock.now();
        let port_at = self.init.verbs().poll_at(now);
        let wake = [self.init.poll_at(), port_at, Some(limit)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(limit);
        if wake <= now {
            return;
        }
        self.waiter.clear();
        if let Some(link) = &self.link {
            if now.saturating_sub(self.last_busy) < self.poll_ns {
                // Busy polling, but a runnable peer on this core (the
                // target, on a loaded machine) gets it now, not when the
                // spin ends: without the yield each side of a QD1 round
                // trip spun out its whole --poll-us before the other ran.
                std::thread::yield_now();
                return;
            }
            self.waiter.watch_link(link);
        } else if let Some(fds) = self.init.verbs().wake_fds() {
            if now.saturating_sub(self.last_busy) < IBV_SPIN_NS {
                std::thread::yield_now();
                return;
            }
            let armed = self.init.verbs().arm();
            for fd in fds {
                self.waiter.watch_readable(fd);
            }
            if !armed || self.pump().unwrap_or(true) {
                self.init.verbs().disarm();
                return;
            }
        }
        let _ = self.waiter.wait(Some(wake));
        if self.link.is_none() {
            self.init.verbs().disarm();
            self.last_busy = self.clock.now();
        }
    }

    /// Runs the loop until `done` gives a value or `timeout` passes.
    pub(super) fn run_until<T>(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&mut Host) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        let deadline = self
            .clock
            .now()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        loop {
            let busy = self.pump()?;
            if let Some(value) = done(self) {
                return Ok(Some(value));
            }
            if self.clock.now() >= deadline {
                return Ok(None);
            }
            if !busy {
                self.idle(deadline);
            }
        }
    }

    pub(super) fn take_event(&mut self, pick: impl Fn(&Event) -> bool) -> Option<Event> {
        let at = self.events.iter().position(pick)?;
        Some(self.events.remove(at))
    }

    pub(super) fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// Reaps everything completed: own tags (in `mine`) handed to `own`,
    /// others stashed.
    pub(super) fn reap_into(&mut self, mine: &mut dyn FnMut(&Completion, &[u8]) -> bool) {
        loop {
            let stash = &mut self.stash;
            let reaped = self.init.next_completion(|completion, data| {
                if !mine(completion, data) {
                    stash.push_back((*completion, data.to_vec()));
                }
            });
            if reaped.is_none() {
                return;
            }
        }
    }
}
