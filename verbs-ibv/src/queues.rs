//! Room on one queue pair's send and receive queues, counted here so that a
//! list of work requests is posted all or none (as the verbs seam promises)
//! and a queue pair the device has given up on refuses further posts.
//!
//! libibverbs posts a list up to the first request it refuses and keeps the
//! ones before it: with the room checked here first, a full queue refuses
//! the whole list before anything reaches the device. A send slot is free
//! again when the send completes; an unsignaled send has no completion of
//! its own and frees its slot with the next signaled one (send queues
//! complete in order). A receive slot is free when its receive completes.

use std::collections::VecDeque;

use verbs::PostError;

/// The send and receive queues of one queue pair.
pub(crate) struct WorkQueues {
    send_depth: u32,
    recv_depth: u32,
    /// Sends posted and not yet known complete.
    sends: u32,
    /// Receives posted and not yet completed.
    recvs: u32,
    /// Unsignaled sends posted since the last signaled one.
    unsignaled: u32,
    /// For each signaled send not yet complete, oldest first: the slots its
    /// completion frees (its own and the unsignaled ones before it).
    signaled: VecDeque<u32>,
    /// An error completion arrived or the device refused a post: the queue
    /// pair is in the error state and every request left is flushed.
    broken: bool,
}

impl WorkQueues {
    /// Queues of the given depths (capacity for every signaled send
    /// allocated here, at connection setup, not on the data path).
    pub(crate) fn new(send_depth: u32, recv_depth: u32) -> Self {
        Self {
            send_depth,
            recv_depth,
            sends: 0,
            recvs: 0,
            unsignaled: 0,
            signaled: VecDeque::with_capacity(send_depth as usize),
            broken: false,
        }
    }

    /// Whether `n` more sends fit.
    pub(crate) fn check_sends(&self, n: usize) -> Result<(), PostError> {
        if self.broken {
            return Err(PostError::NotConnected);
        }
        if u64::from(self.sends) + n as u64 > u64::from(self.send_depth) {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// Whether `n` more receives fit.
    pub(crate) fn check_recvs(&self, n: usize) -> Result<(), PostError> {
        if self.broken {
            return Err(PostError::NotConnected);
        }
        if u64::from(self.recvs) + n as u64 > u64::from(self.recv_depth) {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// Counts sends the device took, signaled or not, in order.
    pub(crate) fn posted_sends(&mut self, signaled: impl IntoIterator<Item = bool>) {
        for signaled in signaled {
            self.sends += 1;
            if signaled {
                self.signaled.push_back(self.unsignaled + 1);
                self.unsignaled = 0;
            } else {
                self.unsignaled += 1;
            }
        }
    }

    /// Counts receives the device took.
    pub(crate) fn posted_recvs(&mut self, n: usize) {
        self.recvs = self.recvs.saturating_add(n as u32);
    }

    /// One completion of this queue pair: frees its slots; an error marks
    /// the queue pair broken.
    pub(crate) fn completed(&mut self, send: bool, ok: bool) {
        if !ok {
            self.broken = true;
        }
        if self.broken {
            return; // flushed: nothing is posted any more, room is moot
        }
        if send {
            let freed = self.signaled.pop_front().unwrap_or(1);
            self.sends = self.sends.saturating_sub(freed);
        } else {
            self.recvs = self.recvs.saturating_sub(1);
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

    #[test]
    fn a_list_that_does_not_fit_is_refused_whole() {
        let mut q = WorkQueues::new(4, 2);
        q.check_sends(4).unwrap();
        q.posted_sends([false, false, true]);
        assert_eq!(q.check_sends(2), Err(PostError::QueueFull));
        q.check_sends(1).unwrap();
        q.check_recvs(2).unwrap();
        q.posted_recvs(2);
        assert_eq!(q.check_recvs(1), Err(PostError::QueueFull));
        q.completed(false, true);
        q.check_recvs(1).unwrap();
    }

    #[test]
    fn unsignaled_sends_free_their_slots_with_the_next_signaled_completion() {
        let mut q = WorkQueues::new(4, 1);
        q.posted_sends([false, false, true, true]);
        assert_eq!(q.check_sends(1), Err(PostError::QueueFull));
        q.completed(true, true); // the first signaled: frees three
        q.check_sends(3).unwrap();
        assert_eq!(q.check_sends(4), Err(PostError::QueueFull));
        q.completed(true, true);
        q.check_sends(4).unwrap();
    }

    #[test]
    fn after_an_error_completion_or_a_refusal_nothing_is_posted() {
        let mut q = WorkQueues::new(8, 8);
        q.posted_sends([true]);
        q.completed(true, false);
        assert_eq!(q.check_sends(1), Err(PostError::NotConnected));
        assert_eq!(q.check_recvs(1), Err(PostError::NotConnected));
        let mut q = WorkQueues::new(8, 8);
        q.refused();
        assert_eq!(q.check_sends(1), Err(PostError::NotConnected));
    }
}
