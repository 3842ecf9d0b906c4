//! The connection table: the listened ports, the [`ConnId`] ↔ slot mapping,
//! lookups by QPN and comm ID, fresh Local Comm IDs and free slots (cutting
//! the oldest timewait short when the table is full).

use super::{Cm, COMM_ID_ATTEMPTS};
use crate::cm::state::Conn;
use crate::cm::{CmError, ConnId, Random, State};
#[cfg(doc)]
use crate::cm::{Stats, MAX_LISTENERS};
use crate::types::Qpn;
use crate::wire::Ipv4Address;

impl<const N: usize> Cm<N> {
    /// Accepts REQs for RDMA_PS_TCP `port` (service ID `0x0106 << 16 | port`,
    /// ib-cm.md §5.1).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`]; [`CmError::NoResources`] beyond
    /// [`MAX_LISTENERS`] ports.
    pub fn listen(&mut self, port: u16) -> Result<(), CmError> {
        if self.listeners.contains(&port) {
            return Err(CmError::AlreadyListening);
        }
        self.listeners.push(port).map_err(|_| CmError::NoResources)
    }

    /// Stops accepting REQs for `port`; existing connections are not affected.
    ///
    /// # Errors
    /// [`CmError::NotListening`].
    pub fn unlisten(&mut self, port: u16) -> Result<(), CmError> {
        let index = self
            .listeners
            .iter()
            .position(|&p| p == port)
            .ok_or(CmError::NotListening)?;
        self.listeners.swap_remove(index);
        Ok(())
    }

    /// Whether REQs for `port` are accepted.
    pub fn is_listening(&self, port: u16) -> bool {
        self.listeners.contains(&port)
    }

    pub(super) fn conn_id(&self, index: usize) -> ConnId {
        // `index < capacity ≤ 65536`: the truncation keeps all of it.
        ConnId(u32::from(self.conns[index].generation) << 16 | index as u32)
    }

    pub(super) fn index_of(&self, conn: ConnId) -> Result<usize, CmError> {
        let index = (conn.0 & 0xffff) as usize;
        let generation = (conn.0 >> 16) as u16;
        match self.conns.get(index) {
            Some(c) if c.generation == generation && c.is_live() => Ok(index),
            _ => Err(CmError::UnknownConnection),
        }
    }

    /// The CM state of a connection, or `None` if the id names no live connection.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.index_of(conn).ok().map(|i| self.conns[i].state)
    }

    /// Our QPN on a connection, once known (after `accept` / `connect`).
    pub fn local_qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.index_of(conn)
            .ok()
            .and_then(|i| self.conns[i].local_qpn)
    }

    /// Whether a connection (in any state, timewait included) still holds `qpn`:
    /// the HCA must not give that QPN to a new QP (ib-cm.md §4.9).
    pub fn qpn_in_use(&self, qpn: Qpn) -> bool {
        self.conns
            .iter()
            .any(|c| c.is_live() && c.local_qpn == Some(qpn))
    }

    /// The connection that uses our QPN `qpn` (not in timewait), for
    /// [`Cm::notify_data_received`].
    pub fn conn_by_qpn(&self, qpn: Qpn) -> Option<ConnId> {
        self.conns
            .iter()
            .position(|c| c.is_live() && c.state != State::Timewait && c.local_qpn == Some(qpn))
            .map(|i| self.conn_id(i))
    }

    /// The live connection with both comm IDs whose peer is `peer`: a
    /// message about a connection counts only from the address that
    /// connection runs to, so a host that learnt (or guessed) the IDs cannot
    /// move another host's connection.
    pub(super) fn find_by_ids(&self, local: u32, remote: u32, peer: Ipv4Address) -> Option<usize> {
        self.conns.iter().position(|c| {
            c.is_live()
                && local != 0
                && c.local_comm_id == local
                && c.remote_comm_id == remote
                && c.route.peer.ip == peer
        })
    }

    /// The live connection with our comm ID `local` whose peer is `peer`.
    pub(super) fn find_local(&self, local: u32, peer: Ipv4Address) -> Option<usize> {
        self.conns.iter().position(|c| {
            c.is_live() && local != 0 && c.local_comm_id == local && c.route.peer.ip == peer
        })
    }

    pub(super) fn fresh_comm_id<R: Random + ?Sized>(&self, rng: &mut R) -> Option<u32> {
        (0..COMM_ID_ATTEMPTS).find_map(|_| {
            let id = rng.next_u32();
            let taken = id == 0
                || self
                    .conns
                    .iter()
                    .any(|c| c.is_live() && c.local_comm_id == id);
            (!taken).then_some(id)
        })
    }

    /// A free slot; when none is, the timewait connection closest to its
    /// end is ended early to make one (timewait only guards against stray
    /// packets of a connection that is gone, a full table must not refuse
    /// new connections for it). Counted in [`Stats::timewaits_cut`].
    pub(super) fn vacant_slot(&mut self) -> Option<usize> {
        if let Some(index) = self.conns.iter().position(Conn::is_reusable) {
            return Some(index);
        }
        let index = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == State::Timewait && !c.tx_pending && c.events.is_empty())
            .min_by_key(|(_, c)| c.timer.map_or(0, |t| t.deadline))
            .map(|(index, _)| index)?;
        let conn = &mut self.conns[index];
        conn.state = State::Idle;
        conn.timer = None;
        self.stats.timewaits_cut += 1;
        Some(index)
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::cm::{Config, MAX_LISTENERS};

    #[test]
    fn test_listen() {
        let mut cm = Cm::<2>::new(Config::new(1));
        assert_eq!(cm.listen(1234), Ok(()));
        assert_eq!(cm.listen(1234), Err(CmError::AlreadyListening));
        assert!(cm.is_listening(1234));
        assert_eq!(cm.unlisten(1234), Ok(()));
        assert_eq!(cm.unlisten(1234), Err(CmError::NotListening));
        for port in 0..MAX_LISTENERS as u16 {
            cm.listen(port).unwrap();
        }
        assert_eq!(cm.listen(999), Err(CmError::NoResources));
    }

    #[test]
    fn test_stale_conn_id_is_unknown() {
        let mut cm = Cm::<2>::new(Config::new(1));
        assert_eq!(cm.state(ConnId(0)), None);
        assert_eq!(
            cm.notify_data_received(ConnId(0x0001_0000)),
            Err(CmError::UnknownConnection)
        );
        assert_eq!(cm.ready_to_use(ConnId(7)), Err(CmError::UnknownConnection));
    }
}
