//! The requests outstanding on one queue pair's send and receive queues:
//! their room, so that a list of work requests is posted all or none (as
//! the verbs seam promises), and the regions they pin.
//!
//! libibverbs posts a list up to the first request it refuses and keeps the
//! ones before it: with the room checked here first, a full queue refuses
//! the whole list before anything reaches the device. Each queue completes
//! in order. A successful send completion retires its signaled request and
//! every unsignaled one before it (they have no completion of their own);
//! an error or flush completion retires the request it names and those
//! before it. A receive completion retires its receive. Retiring a request
//! unpins the regions its scatter-gather list names.

use std::collections::VecDeque;

use verbs::{PostError, Sge, MAX_SGE};

/// One posted request: its tag and the regions (lkeys) it pins.
#[derive(Clone, Copy)]
struct Outstanding {
    wr_id: u64,
    signaled: bool,
    len: u8,
    lkeys: [u32; MAX_SGE],
}

impl Outstanding {
    fn new(wr_id: u64, signaled: bool, sgl: &[Sge]) -> Self {
        let mut lkeys = [0; MAX_SGE];
        let len = sgl.len().min(MAX_SGE);
        for (slot, sge) in lkeys.iter_mut().zip(sgl) {
            *slot = sge.lkey.0;
        }
        Self {
            wr_id,
            signaled,
            len: len as u8,
            lkeys,
        }
    }

    fn lkeys(&self) -> &[u32] {
        &self.lkeys[..usize::from(self.len)]
    }
}

/// The send and receive queues of one queue pair.
pub(crate) struct WorkQueues {
    send_depth: usize,
    recv_depth: usize,
    /// Sends posted and not yet retired, oldest first.
    sends: VecDeque<Outstanding>,
    /// Receives posted and not yet retired, oldest first.
    recvs: VecDeque<Outstanding>,
    /// An error completion arrived or the device refused a post: the queue
    /// pair is in the error state and every request left is flushed.
    broken: bool,
}

impl WorkQueues {
    /// Queues of the given depths (room for every request allocated here,
    /// at connection setup, not on the data path).
    pub(crate) fn new(send_depth: u32, recv_depth: u32) -> Self {
        Self {
            send_depth: send_depth as usize,
            recv_depth: recv_depth as usize,
            sends: VecDeque::with_capacity(send_depth as usize),
            recvs: VecDeque::with_capacity(recv_depth as usize),
            broken: false,
        }
    }

    /// Whether `n` more sends fit.
    pub(crate) fn check_sends(&self, n: usize) -> Result<(), PostError> {
        Self::check(self.broken, self.sends.len(), n, self.send_depth)
    }

    /// Whether `n` more receives fit.
    pub(crate) fn check_recvs(&self, n: usize) -> Result<(), PostError> {
        Self::check(self.broken, self.recvs.len(), n, self.recv_depth)
    }

    fn check(broken: bool, used: usize, n: usize, depth: usize) -> Result<(), PostError> {
        if broken {
            return Err(PostError::NotConnected);
        }
        if used.saturating_add(n) > depth {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// A send the device took; the caller pins the regions of `sgl`.
    pub(crate) fn posted_send(&mut self, wr_id: u64, signaled: bool, sgl: &[Sge]) {
        if self.sends.len() < self.send_depth {
            self.sends.push_back(Outstanding::new(wr_id, signaled, sgl));
        }
    }

    /// A receive the device took; the caller pins the regions of `sgl`.
    pub(crate) fn posted_recv(&mut self, wr_id: u64, sgl: &[Sge]) {
        if self.recvs.len() < self.recv_depth {
            self.recvs.push_back(Outstanding::new(wr_id, true, sgl));
        }
    }

    /// One completion of this queue pair, for request `wr_id`: retires it
    /// and the requests before it on its queue, calling `unpin` for each
    /// lkey they named. `send` is the completion's side; an error
    /// completion carries no valid opcode, so it is looked for among the
    /// sends first, then the receives, and marks the queue pair broken.
    pub(crate) fn completed(
        &mut self,
        send: bool,
        ok: bool,
        wr_id: u64,
        mut unpin: impl FnMut(u32),
    ) {
        if !ok {
            self.broken = true;
            if !Self::retire(&mut self.sends, |o| o.wr_id == wr_id, &mut unpin) {
                Self::retire(&mut self.recvs, |o| o.wr_id == wr_id, &mut unpin);
            }
        } else if send {
            // Only a signaled send completes successfully.
            Self::retire(
                &mut self.sends,
                |o| o.wr_id == wr_id && o.signaled,
                &mut unpin,
            );
        } else {
            Self::retire(&mut self.recvs, |o| o.wr_id == wr_id, &mut unpin);
        }
    }

    /// Retires the requests up to and including the first that `is` names;
    /// false if none does (then nothing is retired).
    fn retire(
        queue: &mut VecDeque<Outstanding>,
        is: impl Fn(&Outstanding) -> bool,
        unpin: &mut impl FnMut(u32),
    ) -> bool {
        let Some(at) = queue.iter().position(is) else {
            return false;
        };
        for done in queue.drain(..=at) {
            done.lkeys().iter().copied().for_each(&mut *unpin);
        }
        true
    }

    /// The queue pair is destroyed: every request left is retired.
    pub(crate) fn retire_all(&mut self, mut unpin: impl FnMut(u32)) {
        for done in self.sends.drain(..).chain(self.recvs.drain(..)) {
            done.lkeys().iter().copied().for_each(&mut unpin);
        }
    }

    /// The device refused a post part way through a list: what it took
    /// before the refusal cannot be taken back, so the connection is done.
    pub(crate) fn refused(&mut self) {
        self.broken = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs::Lkey;

    fn sgl(keys: &[u32]) -> Vec<Sge> {
        keys.iter().map(|&k| Sge::new(Lkey(k), 0, 64)).collect()
    }

    #[test]
    fn a_list_that_does_not_fit_is_refused_whole() {
        let mut q = WorkQueues::new(4, 2);
        q.check_sends(4).unwrap();
        for (id, signaled) in [(1, false), (2, false), (3, true)] {
            q.posted_send(id, signaled, &[]);
        }
        assert_eq!(q.check_sends(2), Err(PostError::QueueFull));
        q.check_sends(1).unwrap();
        q.posted_recv(10, &[]);
        q.posted_recv(11, &[]);
        assert_eq!(q.check_recvs(1), Err(PostError::QueueFull));
        q.completed(false, true, 10, |_| {});
        q.check_recvs(1).unwrap();
    }

    #[test]
    fn unsignaled_sends_retire_with_the_next_signaled_completion_and_unpin() {
        let mut q = WorkQueues::new(4, 1);
        q.posted_send(7, false, &sgl(&[1, 2]));
        q.posted_send(7, false, &sgl(&[3]));
        q.posted_send(7, true, &sgl(&[4]));
        q.posted_send(8, true, &sgl(&[5]));
        assert_eq!(q.check_sends(1), Err(PostError::QueueFull));
        let mut unpinned = Vec::new();
        // The unsignaled sends share the tag: the signaled one retires them.
        q.completed(true, true, 7, |k| unpinned.push(k));
        assert_eq!(unpinned, [1, 2, 3, 4]);
        q.check_sends(3).unwrap();
        assert_eq!(q.check_sends(4), Err(PostError::QueueFull));
        q.completed(true, true, 8, |k| unpinned.push(k));
        assert_eq!(unpinned, [1, 2, 3, 4, 5]);
        q.check_sends(4).unwrap();
        // A completion naming nothing outstanding retires nothing.
        q.completed(true, true, 99, |_| panic!("nothing to unpin"));
    }

    #[test]
    fn after_an_error_completion_or_a_refusal_nothing_is_posted() {
        let mut q = WorkQueues::new(8, 8);
        q.posted_send(1, false, &sgl(&[1]));
        q.posted_recv(2, &sgl(&[2]));
        let mut unpinned = Vec::new();
        // A flushed receive: not a send's tag, found among the receives.
        q.completed(false, false, 2, |k| unpinned.push(k));
        assert_eq!(unpinned, [2]);
        assert_eq!(q.check_sends(1), Err(PostError::NotConnected));
        assert_eq!(q.check_recvs(1), Err(PostError::NotConnected));
        // The flushed unsignaled send completes too, and unpins.
        q.completed(true, false, 1, |k| unpinned.push(k));
        assert_eq!(unpinned, [2, 1]);
        let mut q = WorkQueues::new(8, 8);
        q.refused();
        assert_eq!(q.check_sends(1), Err(PostError::NotConnected));
    }

    #[test]
    fn destroying_retires_everything_left() {
        let mut q = WorkQueues::new(4, 4);
        q.posted_send(1, true, &sgl(&[1, 2]));
        q.posted_recv(2, &sgl(&[3]));
        let mut unpinned = Vec::new();
        q.retire_all(|k| unpinned.push(k));
        assert_eq!(unpinned, [1, 2, 3]);
        q.check_sends(4).unwrap();
    }
}
