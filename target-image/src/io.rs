//! Serving one RTRS request: the RNBD message is copied out of the chunk
//! and processed, answered at once or handed to its volume as a block
//! request, parked while the device queue is full, and answered with the
//! device's completion. The states one block request goes through are
//! `io_state`'s.

use core::net::Ipv4Addr;
use hal::block::{BlockDevice, Completion as DeviceCompletion, Op, SubmitError};
use rnbd::server::{Action, BlockOp, IoError, Request};
use rnbd::wire::RtrsDirection;
use rtrs::server::{IoDirection, IoToken, ReadData, SessionId};
use verbs::MemoryHandle;

use crate::port::Port;

use crate::sessions::{Deferred, SessionExports, MAX_DEFERRED_PER_SESSION};
use crate::volumes::ChunkMemory;
use crate::{Chunk, Engine};

/// Largest RNBD message served (an OPEN is under 200 bytes).
pub(crate) const MAX_USER_HEADER: usize = 1024;

/// Device completions handled per volume per poll.
pub(crate) const COMPLETION_BURST: usize = 64;

impl<'m, P: Port, D: BlockDevice<Chunk>> Engine<'m, P, D> {
    pub(crate) fn answer(&mut self, token: IoToken, errno: u16, now: u64) {
        self.answered += 1;
        if let Err(error) =
            self.server
                .complete_io(token, errno, ReadData::Chunk, now, &mut self.hcas)
        {
            log!(self, "complete_io({token:?}): {error:?}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve_io(
        &mut self,
        port: usize,
        session: SessionId,
        token: IoToken,
        direction: IoDirection,
        header: MemoryHandle,
        data: MemoryHandle,
        now: u64,
    ) {
        let Some(index) = self
            .session_index(session)
            .filter(|&i| !self.sessions[i].closed)
        else {
            self.answer(token, rtrs::server::errno::ENXIO, now);
            return;
        };
        // rtrs lays the RNBD message out right behind the data area of the
        // chunk: one view of both lets RNBD read the message in place.
        let contiguous = header.region() == data.region()
            && data.offset().checked_add(data.len()) == Some(header.offset());
        let chunk = data
            .len()
            .checked_add(header.len())
            .filter(|_| contiguous && header.len() as usize <= MAX_USER_HEADER)
            .map(|len| MemoryHandle::new(data.region(), data.offset(), len));
        let (rtrs_direction, data_len) = match direction {
            IoDirection::Write => (RtrsDirection::Write, data.len() as usize),
            IoDirection::Read { read_len } => (RtrsDirection::Read, read_len as usize),
        };
        let tag = self.next_tag;
        let Self {
            manifest,
            hcas,
            rnbd,
            sessions,
            volumes,
            ..
        } = self;
        let entry = &mut sessions[index];
        let opens_before = entry.rnbd.stats().opens;
        let exports = SessionExports {
            manifest,
            volumes,
            session: &entry.name,
            // The address of the path this request came on (every path was
            // admitted with its own); unknown paths match no rule.
            source: entry
                .paths
                .iter()
                .find(|(path, _)| *path == token.path)
                .map_or(Ipv4Addr::UNSPECIFIED, |(_, source)| *source),
        };
        let action = chunk.zip(hcas.get_mut(port)).map(|(chunk, hca)| {
            hca.with_slice_mut(chunk, 0, chunk.len(), |bytes| {
                let (response, user_header) = bytes.split_at_mut(data.len() as usize);
                let request = Request {
                    user_header,
                    data_len,
                    direction: rtrs_direction,
                    tag,
                };
                rnbd.process(&mut entry.rnbd, &exports, &request, response)
            })
        });
        // The data area is readable whenever the message behind it is.
        let Some(Ok(action)) = action else {
            log!(self, "refuse: unreadable or oversized RNBD header");
            self.answer(token, rtrs::server::errno::EINVAL, now);
            return;
        };
        self.next_tag = tag.wrapping_add(1);
        match action {
            Action::Respond { .. } => {
                let entry = &self.sessions[index];
                if entry.rnbd.stats().opens > opens_before {
                    log!(
                        self,
                        "serve: session {:?} opened a device ({} in use)",
                        entry.name,
                        entry.rnbd.devices_in_use()
                    );
                }
                self.answer(token, 0, now);
            }
            Action::Refuse(error) => {
                let errno = rnbd::server::status_for(&error);
                self.refusals.count(&error);
                // Disjoint fields: no copy of the name on the IO path.
                log!(
                    self,
                    "refuse: session {:?}: {error} (errno {errno})",
                    self.sessions[index].name
                );
                self.answer(token, errno, now);
            }
            Action::Submit { request, ticket } => {
                let chunk = Chunk { port, handle: data };
                let op = match request.op {
                    BlockOp::Read { offset, len } => Op::Read {
                        offset,
                        len,
                        buffer: chunk,
                    },
                    BlockOp::Write { offset, len, fua } => Op::Write {
                        offset,
                        len,
                        buffer: chunk,
                        fua,
                    },
                    BlockOp::Flush => Op::Flush,
                    BlockOp::Discard { offset, len } => Op::Discard { offset, len },
                    BlockOp::WriteZeroes { offset, len } => Op::WriteZeroes { offset, len },
                };
                let volume = request.volume.index();
                match self.ios.receive(session, token, ticket, volume, op, now) {
                    Ok(slot) => {
                        self.sessions[index].in_flight += 1;
                        self.submit(slot, now);
                    }
                    Err(ticket) => {
                        // Cannot happen: one slot per chunk the engine can hold.
                        let entry = &mut self.sessions[index];
                        let completion =
                            self.rnbd
                                .complete(&mut entry.rnbd, ticket, Err(IoError::Resource));
                        self.answer(token, completion.status, now);
                    }
                }
            }
            Action::CloseDeferred => {
                let held = self
                    .deferred
                    .iter()
                    .filter(|d| d.session == session)
                    .count();
                if held < MAX_DEFERRED_PER_SESSION && self.deferred.len() < self.deferred.capacity()
                {
                    self.deferred.push(Deferred {
                        session,
                        tag,
                        token,
                    });
                } else {
                    // This session holds its share: answer now (the device
                    // is gone for the client either way).
                    self.answer(token, 0, now);
                }
            }
        }
    }

    /// Hands received slot `slot`'s request to its volume (`Received ->
    /// Executing`), or parks it (`Received -> Parked`) behind earlier
    /// parked requests or while the device queue is full. A refusal
    /// finishes it at once with the matching error.
    pub(crate) fn submit(&mut self, slot: u32, now: u64) {
        let Some((volume, request)) = self.ios.request(slot) else {
            return;
        };
        let Some(served) = self.volumes.get_mut(volume) else {
            self.finish(request.tag, Err(IoError::Media), now);
            return;
        };
        if !served.parked.is_empty() {
            served.counters.parked += 1;
            self.ios.park(slot, &mut served.parked);
            return;
        }
        let mut memory = ChunkMemory {
            hcas: &mut self.hcas,
            identity_dma: self.identity_dma,
        };
        match served.device.submit(request, &mut memory) {
            Ok(()) => self.ios.execute(slot),
            Err(SubmitError::QueueFull) => {
                served.counters.parked += 1;
                self.ios.park(slot, &mut served.parked);
            }
            Err(error) => {
                served.counters.device_errors += 1;
                log!(self, "volume {}: refused a request: {error}", served.name);
                self.finish(request.tag, Err(submit_error(error)), now);
            }
        }
    }

    /// Collects volume completions (bounded per volume) and answers them
    /// (`Executing -> Free`), then moves parked requests into the room that
    /// freed (`Parked -> Received -> Executing`), oldest first.
    ///
    /// A volume with nothing parked whose device has no work due
    /// ([`BlockDevice::poll_at`] is `None`) and no descriptor that could
    /// bring some is skipped: its `poll` would find nothing.
    pub(crate) fn poll_volumes(&mut self, now: u64) -> bool {
        let mut busy = false;
        for volume in 0..self.volumes.len() {
            let served = &mut self.volumes[volume];
            if served.parked.is_empty()
                && served.device.poll_at().is_none()
                && served.device.readable_fd().is_none()
            {
                continue;
            }
            let mut done: heapless::Vec<DeviceCompletion<Chunk>, COMPLETION_BURST> =
                heapless::Vec::new();
            let mut memory = ChunkMemory {
                hcas: &mut self.hcas,
                identity_dma: self.identity_dma,
            };
            served
                .device
                .poll(now, &mut memory, COMPLETION_BURST, &mut |completion| {
                    // Cannot overflow: at most COMPLETION_BURST are delivered.
                    let _ = done.push(completion);
                });
            for completion in &done {
                busy = true;
                if !self.ios.is_executing(completion.tag) {
                    log!(
                        self,
                        "volume completion for unknown request {}",
                        completion.tag
                    );
                    continue;
                }
                let result = completion.result.map_err(|error| {
                    self.volumes[volume].counters.device_errors += 1;
                    device_error(error)
                });
                self.finish(completion.tag, result, now);
            }
            while let Some(slot) = self.volumes[volume].parked.front() {
                let Some((_, request)) = self.ios.request(slot) else {
                    break;
                };
                let served = &mut self.volumes[volume];
                let mut memory = ChunkMemory {
                    hcas: &mut self.hcas,
                    identity_dma: self.identity_dma,
                };
                match served.device.submit(request, &mut memory) {
                    Ok(()) => {
                        busy = true;
                        self.ios.unpark(&mut served.parked);
                        self.ios.execute(slot);
                    }
                    Err(SubmitError::QueueFull) => break,
                    Err(error) => {
                        busy = true;
                        served.counters.device_errors += 1;
                        self.ios.unpark(&mut served.parked);
                        self.finish(request.tag, Err(submit_error(error)), now);
                    }
                }
            }
        }
        busy
    }

    /// Reports a request's outcome to RNBD and answers it (`Received |
    /// Executing -> Free`), with the CLOSE it was the last one of.
    pub(crate) fn finish(&mut self, tag: u64, result: Result<(), IoError>, now: u64) {
        let Some(io) = self.ios.finish(tag) else {
            log!(self, "volume completion for unknown request {tag}");
            return;
        };
        if let Some(served) = self.volumes.get_mut(io.volume) {
            served.latency.record(now.saturating_sub(io.received_at));
        }
        let Some(index) = self.session_index(io.session) else {
            // The session entry outlives its requests (see `reap`).
            return;
        };
        let entry = &mut self.sessions[index];
        entry.in_flight = entry.in_flight.saturating_sub(1);
        let completion = self.rnbd.complete(&mut entry.rnbd, io.ticket, result);
        self.answer(io.token, completion.status, now);
        if let Some(close_tag) = completion.close_done {
            if let Some(at) = self
                .deferred
                .iter()
                .position(|d| d.session == io.session && d.tag == close_tag)
            {
                let deferred = self.deferred.swap_remove(at);
                self.answer(deferred.token, 0, now);
            }
        }
        self.reap(index);
    }
}

/// The RNBD error for a device refusal (RNBD's own checks make most of
/// these impossible).
pub(crate) fn submit_error(error: SubmitError) -> IoError {
    match error {
        SubmitError::QueueFull => IoError::Again,
        SubmitError::Unsupported => IoError::Unsupported,
        _ => IoError::Media,
    }
}

/// The RNBD error for a failed device request, by errno.
pub(crate) fn device_error(error: hal::block::IoError) -> IoError {
    match error.errno() {
        28 => IoError::NoSpace,
        110 => IoError::TimedOut,
        95 => IoError::Unsupported,
        12 => IoError::Resource,
        11 => IoError::Again,
        _ => IoError::Media,
    }
}
