//! One block request's life in the engine, as one state machine per slot.
//!
//! An RTRS request that RNBD turns into a block request takes a slot of a
//! fixed table ([`IoSlots`], one slot for every chunk the engine can hold,
//! allocated once in [`Engine::with_links`](crate::Engine::with_links)); the
//! slot index is the device tag. Requests answered without the device
//! (RNBD control messages, refusals) never take one.
//!
//! ```text
//!   Free ──receive()──► Received ──execute()──► Executing ──finish()──► Free
//!                          │  ▲                                 (the answer goes to RTRS)
//!                  park()  │  │ unpark() (room in the device queue)
//!                          ▼  │
//!                         Parked (in its volume's FIFO, ParkedQueue)
//! ```
//!
//! `finish` also ends a `Received` request the device refused or that names
//! no volume. The answer is posted with the RTRS server at once (it has its
//! own waits for send-queue room, `rtrs::server::IoState`), so answering is
//! the step that frees the slot. The parked FIFO of a volume is a list
//! threaded through the slots: parking moves nothing and allocates nothing.
//!
//! A held request's [`Io`] is valid in every state but `Free`, so a slot is
//! `Free` or `Held` with its [`Stage`]: `execute`, `park` and `unpark`
//! change the stage and leave the request where it is.

use alloc::vec::Vec;

use hal::block::{Op, Request as DeviceRequest};
use rnbd::server::IoTicket;
use rtrs::server::{IoToken, SessionId};

use crate::Chunk;

/// What a busy slot holds: whom to answer, RNBD's ticket (`T`: the
/// engine's is [`IoTicket`]) and the block request (its tag is the slot
/// index).
pub(crate) struct Io<T = IoTicket> {
    /// The RTRS session the request came on.
    pub(crate) session: SessionId,
    /// The RTRS request to answer.
    pub(crate) token: IoToken,
    /// RNBD's ticket, handed back with the result.
    pub(crate) ticket: T,
    /// The volume (index into the engine's volumes).
    pub(crate) volume: usize,
    /// The request the device gets.
    pub(crate) request: DeviceRequest<Chunk>,
    /// When it was received (the engine's clock, ns): its latency runs
    /// from here to its answer.
    pub(crate) received_at: u64,
}

/// Where a held request is (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Built from the RNBD request; not yet taken by the device.
    Received,
    /// Waiting for room in the device queue; `next` is the slot behind it
    /// in its volume's FIFO.
    Parked { next: Option<u32> },
    /// The device holds it; its completion ends it.
    Executing,
}

/// One slot (see the module docs).
pub(crate) enum IoState<T> {
    /// Unused.
    Free,
    /// A request, at `stage`.
    Held { io: Io<T>, stage: Stage },
}

/// A volume's parked requests, oldest first (a list through the slots).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ParkedQueue {
    head: Option<u32>,
    tail: Option<u32>,
    len: usize,
}

impl ParkedQueue {
    /// The oldest parked request's slot.
    pub(crate) fn front(&self) -> Option<u32> {
        self.head
    }

    /// How many requests wait.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }
}

/// The slot table: every block request the engine holds, by device tag.
pub(crate) struct IoSlots<T = IoTicket> {
    slots: Vec<IoState<T>>,
    /// Free slot indices (the next request takes the last).
    free: Vec<u32>,
}

impl<T> IoSlots<T> {
    /// A table of `capacity` free slots, allocated here once.
    pub(crate) fn new(capacity: usize) -> Self {
        let mut slots = Vec::with_capacity(capacity);
        slots.resize_with(capacity, || IoState::Free);
        let free = (0..u32::try_from(capacity).unwrap_or(u32::MAX))
            .rev()
            .collect();
        Self { slots, free }
    }

    /// Requests held (received, parked or executing).
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// `Free -> Received`: takes a slot for `op` of the request `token` on
    /// `volume`, received at `now`; the ticket comes back if every slot is taken (the table
    /// has one for every chunk the engine can hold, so none is).
    pub(crate) fn receive(
        &mut self,
        session: SessionId,
        token: IoToken,
        ticket: T,
        volume: usize,
        op: Op<Chunk>,
        now: u64,
    ) -> Result<u32, T> {
        let Some(slot) = self.free.pop() else {
            return Err(ticket);
        };
        self.slots[slot as usize] = IoState::Held {
            io: Io {
                session,
                token,
                ticket,
                volume,
                request: DeviceRequest {
                    tag: u64::from(slot),
                    op,
                },
                received_at: now,
            },
            stage: Stage::Received,
        };
        Ok(slot)
    }

    /// The volume and device request of a received or parked slot.
    pub(crate) fn request(&self, slot: u32) -> Option<(usize, DeviceRequest<Chunk>)> {
        match self.slots.get(slot as usize)? {
            IoState::Held {
                io,
                stage: Stage::Received | Stage::Parked { .. },
            } => Some((io.volume, io.request)),
            IoState::Free
            | IoState::Held {
                stage: Stage::Executing,
                ..
            } => None,
        }
    }

    /// Whether the device holds slot `tag`'s request (a completion for any
    /// other slot is not the device's to report).
    pub(crate) fn is_executing(&self, tag: u64) -> bool {
        usize::try_from(tag)
            .ok()
            .and_then(|slot| self.slots.get(slot))
            .is_some_and(|state| {
                matches!(
                    state,
                    IoState::Held {
                        stage: Stage::Executing,
                        ..
                    }
                )
            })
    }

    /// `Received -> Executing`: the device took the request.
    pub(crate) fn execute(&mut self, slot: u32) {
        if let Some(IoState::Held { stage, .. }) = self.slots.get_mut(slot as usize) {
            if *stage == Stage::Received {
                *stage = Stage::Executing;
            }
        }
    }

    /// `Received -> Parked`: the request waits at the back of `queue`.
    pub(crate) fn park(&mut self, slot: u32, queue: &mut ParkedQueue) {
        let Some(IoState::Held { stage, .. }) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if *stage != Stage::Received {
            return; // only a received request parks
        }
        *stage = Stage::Parked { next: None };
        if let Some(IoState::Held {
            stage: Stage::Parked { next },
            ..
        }) = queue
            .tail
            .and_then(|tail| self.slots.get_mut(tail as usize))
        {
            *next = Some(slot);
        } else {
            queue.head = Some(slot);
        }
        queue.tail = Some(slot);
        queue.len += 1;
    }

    /// `Parked -> Received`: takes the oldest request out of `queue` and
    /// returns its slot.
    pub(crate) fn unpark(&mut self, queue: &mut ParkedQueue) -> Option<u32> {
        let slot = queue.head?;
        let IoState::Held { stage, .. } = self.slots.get_mut(slot as usize)? else {
            return None;
        };
        // A queue holds only parked slots.
        let Stage::Parked { next } = *stage else {
            return None;
        };
        *stage = Stage::Received;
        queue.head = next;
        if next.is_none() {
            queue.tail = None;
        }
        queue.len -= 1;
        Some(slot)
    }

    /// `Received | Executing -> Free`: the request is done; what to answer
    /// comes back. `None` for a free or parked slot (a parked request is
    /// unparked first) or a tag that is no slot.
    pub(crate) fn finish(&mut self, tag: u64) -> Option<Io<T>> {
        let slot = u32::try_from(tag).ok()?;
        let state = self.slots.get_mut(slot as usize)?;
        match core::mem::replace(state, IoState::Free) {
            IoState::Held {
                io,
                stage: Stage::Received | Stage::Executing,
            } => {
                // Within capacity: this slot came from `free`.
                self.free.push(slot);
                Some(io)
            }
            other => {
                *state = other;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtrs::server::PathId;

    fn token(chunk: u16) -> IoToken {
        IoToken {
            path: PathId {
                index: 0,
                generation: 1,
            },
            chunk,
            generation: 1,
        }
    }

    const SESSION: SessionId = SessionId {
        index: 0,
        generation: 1,
    };

    #[test]
    fn a_request_goes_received_parked_executing_free_and_the_fifo_keeps_order() {
        let mut slots: IoSlots<u32> = IoSlots::new(3);
        let mut queue = ParkedQueue::default();
        let a = slots
            .receive(SESSION, token(0), 10, 0, Op::Flush, 0)
            .unwrap();
        let b = slots
            .receive(SESSION, token(1), 11, 0, Op::Flush, 0)
            .unwrap();
        let c = slots
            .receive(SESSION, token(2), 12, 0, Op::Flush, 0)
            .unwrap();
        assert_eq!([a, b, c], [0, 1, 2], "tags are slot indices, lowest first");
        assert_eq!(slots.in_use(), 3);
        // Full: the ticket comes back.
        assert_eq!(
            slots.receive(SESSION, token(3), 13, 0, Op::Flush, 0),
            Err(13)
        );
        // `a` runs, `b` and `c` park in order.
        slots.execute(a);
        slots.park(b, &mut queue);
        slots.park(c, &mut queue);
        assert_eq!((queue.len(), queue.front()), (2, Some(b)));
        assert_eq!(slots.request(b).map(|(_, r)| r.tag), Some(u64::from(b)));
        // A parked request is not the device's to complete, nor finished
        // before it is unparked; an executing one is.
        assert!(!slots.is_executing(u64::from(b)));
        assert!(slots.finish(u64::from(b)).is_none());
        assert!(slots.is_executing(u64::from(a)));
        let done = slots.finish(u64::from(a)).expect("executing");
        assert_eq!((done.ticket, done.token), (10, token(0)));
        assert!(slots.finish(u64::from(a)).is_none(), "finished once");
        assert!(slots.request(a).is_none());
        // Oldest first out of the FIFO.
        assert_eq!(slots.unpark(&mut queue), Some(b));
        slots.execute(b);
        assert_eq!(slots.unpark(&mut queue), Some(c));
        assert!(queue.is_empty() && queue.front().is_none());
        assert_eq!(slots.unpark(&mut queue), None);
        // A received request the device refused finishes too.
        assert_eq!(slots.finish(u64::from(c)).map(|io| io.ticket), Some(12));
        assert_eq!(slots.finish(u64::from(b)).map(|io| io.ticket), Some(11));
        assert_eq!(slots.in_use(), 0);
        assert!(slots.finish(99).is_none() && slots.finish(u64::MAX).is_none());
        // The queue is reusable after emptying.
        let d = slots
            .receive(SESSION, token(4), 14, 0, Op::Flush, 0)
            .unwrap();
        slots.park(d, &mut queue);
        assert_eq!((queue.len(), queue.front()), (1, Some(d)));
    }
}
