//! The connection table: one rdma_cm id (and, once sized, one RC queue
//! pair with its work queues' room) per [`ConnId`], lookups by id and by
//! queue-pair number.

use std::collections::HashMap;

use verbs::{ConnId, PrivateData, RecvWr};

use crate::ffi;
use crate::queues::WorkQueues;

/// Receives a passive connection may have posted before it is accepted
/// (RTRS posts one, the INFO_REQ buffer of the service connection).
pub(crate) const PENDING_RECV_PASSIVE: usize = 8;

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Passive: the request arrived; no queue pair until `accept` sizes it.
    Requested,
    /// Passive: accepted, waiting for the RTU.
    Accepted,
    /// Active: resolving the address, then the route.
    Resolving,
    /// Active: the request is out.
    Connecting,
    /// Carries sends.
    Established,
    /// Disconnected, rejected or unreachable: waiting for `destroy`.
    Down,
}

/// What an active connection connects with once its route is known.
#[derive(Clone, Debug)]
pub(crate) struct Dial {
    pub(crate) private_data: PrivateData,
    pub(crate) send_depth: u16,
    pub(crate) recv_depth: u16,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
}

pub(crate) struct Conn {
    pub(crate) id: *mut ffi::CmId,
    pub(crate) state: State,
    pub(crate) qpn: Option<u32>,
    /// Receives posted before the queue pair exists, posted when it does.
    pub(crate) pending: Vec<RecvWr>,
    pub(crate) dial: Option<Dial>,
    /// Completion queue (index) and entries reserved by its queue pair.
    pub(crate) reserved: (usize, u32),
    /// Room on the queue pair's send and receive queues.
    pub(crate) queues: WorkQueues,
}

/// What [`Conns::remove`] destroyed: the queue pair's number, its
/// completion-queue reservation and its requests left, for the caller to
/// release, drain and unpin.
pub(crate) struct Removed {
    pub(crate) qpn: Option<u32>,
    pub(crate) reserved: (usize, u32),
    pub(crate) queues: WorkQueues,
}

const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;

pub(crate) struct Conns {
    slots: Vec<Option<Conn>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    by_id: HashMap<usize, ConnId>,
    by_qpn: HashMap<u32, ConnId>,
    pub(crate) listeners: Vec<(u16, *mut ffi::CmId)>,
}

impl Conns {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, INDEX_MASK as usize);
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            generations: vec![0; capacity],
            free: (0..capacity as u32).rev().collect(),
            by_id: HashMap::with_capacity(capacity),
            by_qpn: HashMap::with_capacity(capacity),
            listeners: Vec::with_capacity(4),
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.by_id.len()
    }

    /// A new connection for `id`, or `None` if the table is full.
    pub(crate) fn insert(
        &mut self,
        id: *mut ffi::CmId,
        state: State,
        pending: usize,
    ) -> Option<ConnId> {
        let index = self.free.pop()?;
        let conn = ConnId((self.generations[index as usize] << INDEX_BITS) | index);
        self.slots[index as usize] = Some(Conn {
            id,
            state,
            qpn: None,
            pending: Vec::with_capacity(pending),
            dial: None,
            reserved: (0, 0),
            queues: WorkQueues::new(0, 0),
        });
        self.by_id.insert(id as usize, conn);
        Some(conn)
    }

    pub(crate) fn get(&self, conn: ConnId) -> Option<&Conn> {
        let index = (conn.0 & INDEX_MASK) as usize;
        let generation = conn.0 >> INDEX_BITS;
        if self.generations.get(index) != Some(&generation) {
            return None;
        }
        self.slots.get(index)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, conn: ConnId) -> Option<&mut Conn> {
        let index = (conn.0 & INDEX_MASK) as usize;
        let generation = conn.0 >> INDEX_BITS;
        if self.generations.get(index) != Some(&generation) {
            return None;
        }
        self.slots.get_mut(index)?.as_mut()
    }

    pub(crate) fn by_id(&self, id: *mut ffi::CmId) -> Option<ConnId> {
        self.by_id.get(&(id as usize)).copied()
    }

    pub(crate) fn by_qpn(&self, qpn: u32) -> Option<ConnId> {
        self.by_qpn.get(&qpn).copied()
    }

    pub(crate) fn set_qp(
        &mut self,
        conn: ConnId,
        qpn: u32,
        reserved: (usize, u32),
        depths: (u32, u32),
    ) {
        if let Some(c) = self.get_mut(conn) {
            c.qpn = Some(qpn);
            c.reserved = reserved;
            c.queues = WorkQueues::new(depths.0, depths.1);
            self.by_qpn.insert(qpn, conn);
        }
    }

    /// Destroys the connection's queue pair and id and frees its slot;
    /// `None` if `conn` names nothing.
    pub(crate) fn remove(&mut self, conn: ConnId) -> Option<Removed> {
        let index = (conn.0 & INDEX_MASK) as usize;
        let c = self.get_mut(conn)?;
        let (id, qpn, reserved) = (c.id, c.qpn, c.reserved);
        let queues = core::mem::replace(&mut c.queues, WorkQueues::new(0, 0));
        // SAFETY: `id` is ours and destroyed once (its slot is cleared
        // below); every event of it was acknowledged when read.
        unsafe { ffi::bi_destroy(id) };
        self.by_id.remove(&(id as usize));
        if let Some(qpn) = qpn {
            self.by_qpn.remove(&qpn);
        }
        self.slots[index] = None;
        self.generations[index] = (self.generations[index] + 1) & (u32::MAX >> INDEX_BITS);
        self.free.push(index as u32);
        Some(Removed {
            qpn,
            reserved,
            queues,
        })
    }

    pub(crate) fn destroy_all(&mut self) {
        let conns: Vec<ConnId> = self.by_id.values().copied().collect();
        for conn in conns {
            self.remove(conn);
        }
    }

    pub(crate) fn destroy_listeners(&mut self) {
        for (_, id) in self.listeners.drain(..) {
            // SAFETY: each listener id is destroyed once, here.
            unsafe { ffi::bi_destroy(id) };
        }
    }

    pub(crate) fn is_listener(&self, id: *mut ffi::CmId) -> bool {
        self.listeners.iter().any(|&(_, l)| l == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_refuses_and_ids_carry_their_slot() {
        let mut conns = Conns::new(2);
        let first = conns
            .insert(16 as *mut ffi::CmId, State::Requested, 1)
            .unwrap();
        let second = conns
            .insert(32 as *mut ffi::CmId, State::Resolving, 4)
            .unwrap();
        assert_ne!(first, second);
        assert!(conns
            .insert(48 as *mut ffi::CmId, State::Requested, 1)
            .is_none());
        assert_eq!(conns.by_id(32 as *mut ffi::CmId), Some(second));
        assert_eq!(conns.get(second).map(|c| c.pending.capacity()), Some(4));
        conns.set_qp(first, 77, (0, 10), (6, 4));
        assert_eq!(conns.by_qpn(77), Some(first));
        // A stale id (another generation of the same slot) names nothing.
        assert!(conns.get(ConnId(first.0 + (1 << INDEX_BITS))).is_none());
        assert_eq!(conns.live(), 2);
    }
}
