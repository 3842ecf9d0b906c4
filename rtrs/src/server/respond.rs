//! The response chain of an IO (rtrs.md §4.6): the RDMA WRITE of read
//! data, the SEND_WITH_INV of a NEED_INVAL read and the completion
//! (NEW_RKEY's inline RKEY_RSP with always_invalidate, §4.9), posted at once
//! or parked in the chunk's state until send-queue room or the chunk's
//! previous response allow.

use verbs::{Inline, PostError, Rkey, SendOp, SendWr, Sgl, Verbs};

use super::table::Response;
use super::{wr_id, CloseReason, IoState, Lent, ReadData, WrKind};
use crate::wire::{Imm, RkeyRsp};

// The always_invalidate answer goes inline (`respond`).
static_assertions::const_assert!(RkeyRsp::LEN <= verbs::MAX_INLINE);

impl<V: Verbs> Lent<'_, V> {
    /// Posts the answer parked in chunk `chunk`'s state (waiting for
    /// send-queue room or for the chunk's previous response), if it has one.
    pub(super) fn try_respond(&mut self, path: u16, chunk: u16, now: u64) {
        let Some(slot) = self.server.paths[usize::from(path)]
            .chunks
            .get_mut(usize::from(chunk))
        else {
            return;
        };
        // Taken out, not cloned: `respond` parks it again if it must wait.
        let response = match core::mem::take(&mut slot.state) {
            IoState::WaitingForSendQueue(response)
            | IoState::WaitingForPreviousCompletion(response) => response,
            other => {
                slot.state = other;
                return;
            }
        };
        self.respond(path, chunk, response, now);
    }

    /// Builds and posts the response chain of rtrs.md §4.6 for `response`,
    /// the answer of chunk `chunk` (whose state the caller left `Idle`):
    /// the chunk is `Idle` again once it is posted, or holds the answer in
    /// the named wait that keeps it from being posted now.
    pub(super) fn respond(&mut self, path: u16, chunk: u16, mut response: Response, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let id = self.path_id(path);
        let invalidate_mode = self.server.config.always_invalidate;
        let slot = &self.server.paths[index];
        let Some(chunk_slot) = slot.chunks.get(usize::from(chunk)) else {
            return;
        };
        if chunk_slot.sends_in_flight > 0 {
            // The previous response of this chunk still owns its memory.
            self.server.paths[index].chunks[usize::from(chunk)].state =
                IoState::WaitingForPreviousCompletion(response);
            return;
        }
        let Some(conn) = slot.conns.get(usize::from(response.cid)).copied().flatten() else {
            self.begin_close(path, CloseReason::PostFailed, now);
            return;
        };
        let region = chunk_slot.region;
        let mut rkey = region.rkey;
        if invalidate_mode && !response.rekeyed {
            match self.ports[port].rekey(region.lkey) {
                Ok(fresh) => {
                    rkey = fresh;
                    response.rekeyed = true;
                    let chunk_slot = &mut self.server.paths[index].chunks[usize::from(chunk)];
                    chunk_slot.region.rkey = fresh;
                }
                Err(verbs::RegError::Busy) => {
                    self.server.paths[index].chunks[usize::from(chunk)].state =
                        IoState::WaitingForPreviousCompletion(response);
                    self.server.pending = true;
                    return;
                }
                Err(_) => {
                    self.begin_close(path, CloseReason::PostFailed, now);
                    return;
                }
            }
        }
        let mut wrs: heapless::Vec<SendWr, 3> = heapless::Vec::new();
        let mut read_bytes = 0;
        let read = response.read;
        let invalidate = read.and_then(|r| r.need_inval.then_some(r.rkey));
        if response.errno == 0 {
            if let Some(read) = read.filter(|r| r.len > 0) {
                let sgl = match &response.data {
                    ReadData::Chunk => Sgl::single(region.sge(0, read.len)),
                    ReadData::Sgl(sgl) => sgl.clone(),
                };
                read_bytes = read.len;
                let _ = wrs.push(SendWr {
                    wr_id: wr_id(WrKind::IoUnsignaled, id, chunk),
                    signaled: false,
                    op: SendOp::RdmaWrite {
                        sgl,
                        remote_addr: read.addr,
                        rkey: read.rkey,
                        imm: None,
                    },
                });
            }
        }
        if let Some(rkey) = invalidate {
            let _ = wrs.push(SendWr {
                wr_id: wr_id(WrKind::IoUnsignaled, id, chunk),
                signaled: false,
                op: SendOp::SendWithInv {
                    sgl: Sgl::new(),
                    invalidate: rkey,
                },
            });
        }
        let rsp = if invalidate.is_some() {
            Imm::IoRspWithInvalidate {
                msg_id: u32::from(chunk),
                errno: response.errno,
            }
        } else {
            Imm::IoRsp {
                msg_id: u32::from(chunk),
                errno: response.errno,
            }
        };
        // chunk < qd < 2^16 and errno <= 511: always encodable.
        let imm = rsp.encode().unwrap_or(0);
        let completion = if invalidate_mode {
            // rtrs.md §4.9: the fresh rkey rides in the request itself.
            let mut bytes = [0u8; RkeyRsp::LEN];
            let _ = RkeyRsp {
                buf_id: chunk,
                rkey,
            }
            .emit(&mut bytes);
            SendOp::SendInline {
                // RkeyRsp::LEN <= MAX_INLINE: asserted above.
                data: Inline::try_from_slice(&bytes).unwrap_or_default(),
                imm: Some(imm),
            }
        } else {
            SendOp::RdmaWrite {
                sgl: Sgl::new(),
                remote_addr: 0,
                rkey: Rkey(0),
                imm: Some(imm),
            }
        };
        let _ = wrs.push(SendWr {
            wr_id: wr_id(WrKind::IoResponse, id, chunk),
            signaled: true,
            op: completion,
        });
        match self.ports[port].post_send(conn, &wrs) {
            Ok(()) => {
                let is_read = read.is_some();
                let errno = response.errno;
                let slot = &mut self.server.paths[index];
                slot.chunks[usize::from(chunk)].sends_in_flight += 1;
                let session = slot
                    .session
                    .and_then(|s| self.server.sessions.get_mut(usize::from(s)));
                let both = [Some(&mut slot.stats), session.map(|s| &mut s.stats)];
                for stats in both.into_iter().flatten() {
                    if errno != 0 {
                        stats.errors += 1;
                    } else if is_read {
                        stats.reads += 1;
                        stats.read_bytes += u64::from(read_bytes);
                    } else {
                        stats.writes += 1;
                    }
                }
            }
            Err(PostError::QueueFull) => {
                self.server.paths[index].chunks[usize::from(chunk)].state =
                    IoState::WaitingForSendQueue(response);
                self.server.pending = true;
            }
            Err(_) => self.begin_close(path, CloseReason::PostFailed, now),
        }
    }

    pub(super) fn response_done(&mut self, path: u16, chunk: u16, now: u64) {
        let index = usize::from(path);
        let Some(slot) = self.server.paths[index].chunks.get_mut(usize::from(chunk)) else {
            return;
        };
        slot.sends_in_flight = slot.sends_in_flight.saturating_sub(1);
        if matches!(slot.state, IoState::WaitingForPreviousCompletion(_)) {
            self.try_respond(path, chunk, now);
        }
    }
}
