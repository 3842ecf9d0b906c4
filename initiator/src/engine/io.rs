//! IO: submission, pieces, the issue queue, held IO and completion (the
//! IO life in the module docs of `engine`).

use super::*;

impl<V: Verbs> Initiator<V> {
    /// Submits a read of `len` bytes at byte `offset`; the data comes with
    /// the completion ([`Initiator::next_completion`]).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_read(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Read, offset, u64::from(len))?;
        self.start(index, now, tag, volume, IoKind::Read, offset, len, false);
        Ok(())
    }

    /// Submits a write of `data` at byte `offset` (copied into the IO
    /// slot's registered buffer now), durable before completion if `fua`.
    /// On a volume without write cache every write is durable and no FUA
    /// flag is sent; on a write-back volume without native FUA the write
    /// is followed by a FLUSH before it completes.
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_write(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), SubmitError> {
        let len = data.len() as u64;
        let index = self.prepare(volume, IoKind::Write, offset, len)?;
        let base = index as u32 * self.config.max_transfer;
        let handle = self.data.handle;
        if self.client.verbs_mut().write(handle, base, data).is_err() {
            // `prepare` checked the length against the slot: cannot happen.
            self.release(index);
            return Err(SubmitError::TooLarge {
                len,
                max: self.config.max_transfer,
            });
        }
        self.start(
            index,
            now,
            tag,
            volume,
            IoKind::Write,
            offset,
            len as u32,
            fua,
        );
        Ok(())
    }

    /// Submits a flush of the volume's write cache. On a volume without one
    /// it completes at once, successfully, without a request (nothing is
    /// volatile; Linux strips such flushes too, rnbd.md §3).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_flush(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Flush, 0, 0)?;
        self.start(index, now, tag, volume, IoKind::Flush, 0, 0, false);
        Ok(())
    }

    /// Submits a discard of `len` bytes at byte `offset` (split into
    /// pieces of at most the volume's discard limit). Reads of a discarded
    /// range return what the volume says (zeroes on Brick RAM volumes).
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing was queued then.
    pub fn submit_discard(
        &mut self,
        now: u64,
        tag: u64,
        volume: VolumeId,
        offset: u64,
        len: u32,
    ) -> Result<(), SubmitError> {
        let index = self.prepare(volume, IoKind::Discard, offset, u64::from(len))?;
        self.start(index, now, tag, volume, IoKind::Discard, offset, len, false);
        Ok(())
    }

    /// Checks a submission against the volume and takes an IO slot.
    pub(super) fn prepare(
        &mut self,
        volume: VolumeId,
        kind: IoKind,
        offset: u64,
        len: u64,
    ) -> Result<usize, SubmitError> {
        let slot = self
            .volume_slot(volume)
            .ok_or(SubmitError::UnknownVolume(volume))?;
        let state = slot.state.ok_or(SubmitError::UnknownVolume(volume))?;
        let usable = match state {
            VolumeState::Open => true,
            VolumeState::Disconnected | VolumeState::Reopening => false,
            _ => return Err(SubmitError::NotOpen { volume, state }),
        };
        if !usable && self.config.on_disconnect == OnDisconnect::Fail {
            return Err(SubmitError::Disconnected);
        }
        let device = slot.device.ok_or(SubmitError::NotOpen { volume, state })?;
        let writes = matches!(kind, IoKind::Write | IoKind::Discard);
        if writes && !slot.mode.is_writable() {
            return Err(SubmitError::ReadOnly(volume));
        }
        if kind != IoKind::Flush {
            if len == 0 {
                return Err(SubmitError::Empty);
            }
            let block = u64::from(device.geometry.logical_block_size.max(512));
            if offset % block != 0 || len % block != 0 {
                return Err(SubmitError::Misaligned {
                    offset,
                    len,
                    block_size: block as u32,
                });
            }
            let capacity = device.capacity_bytes();
            if offset.checked_add(len).is_none_or(|end| end > capacity) {
                return Err(SubmitError::OutOfRange {
                    offset,
                    len,
                    capacity,
                });
            }
        }
        match kind {
            IoKind::Read | IoKind::Write if len > u64::from(self.config.max_transfer) => {
                return Err(SubmitError::TooLarge {
                    len,
                    max: self.config.max_transfer,
                });
            }
            IoKind::Discard if device.geometry.max_discard_sectors == 0 => {
                return Err(SubmitError::DiscardUnsupported(volume));
            }
            _ => {}
        }
        let index = self.free_slots.pop().ok_or(SubmitError::QueueFull {
            queue_depth: self.config.queue_depth,
        })?;
        Ok(usize::from(index))
    }

    pub(super) fn release(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(index as u16);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        &mut self,
        index: usize,
        now: u64,
        tag: u64,
        volume: VolumeId,
        kind: IoKind,
        offset: u64,
        len: u32,
        fua: bool,
    ) {
        let device = self.volumes[usize::from(volume.index)].device;
        let write_cache = device.is_some_and(|d| d.has_write_cache());
        let native_fua = device.is_some_and(|d| d.policy.contains(CachePolicy::FUA));
        let slot = &mut self.slots[index];
        slot.tag = tag;
        slot.volume = volume;
        slot.kind = kind;
        slot.fua = fua && write_cache && native_fua;
        slot.flush_after = kind == IoKind::Write && fua && write_cache && !native_fua;
        slot.offset = offset;
        slot.len = len;
        slot.submitted_at = now;
        slot.held_since = None;
        if kind == IoKind::Flush && !write_cache {
            self.complete(index, Ok(()), now);
            return;
        }
        if self.volume_ready(volume) {
            self.begin(index);
            self.issue(now);
        } else {
            self.hold(index, now);
        }
    }

    pub(super) fn volume_ready(&self, volume: VolumeId) -> bool {
        self.session == SessionState::Ready && self.volume_state(volume) == Some(VolumeState::Open)
    }

    /// Puts slot `index` into `Issuing` from the start and queues it.
    pub(super) fn begin(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Issuing {
            issued: 0,
            in_flight: 0,
            phase: if slot.kind == IoKind::Flush {
                Phase::Flush { sent: false }
            } else {
                Phase::Data
            },
            failure: None,
            retry: false,
        };
        self.enqueue(index);
    }

    pub(super) fn enqueue(&mut self, index: usize) {
        if !self.slots[index].queued {
            self.slots[index].queued = true;
            self.issue_queue.push_back(index as u16);
        }
    }

    /// Holds slot `index` until its volume is open again, or completes it
    /// with the reason it cannot wait.
    pub(super) fn hold(&mut self, index: usize, now: u64) {
        let volume = self.slots[index].volume;
        let state = self.volume_state(volume);
        let since = *self.slots[index].held_since.get_or_insert(now);
        let held_ns = now.saturating_sub(since);
        let error = match (state, self.config.on_disconnect) {
            _ if self.session == SessionState::Closed => Some(IoError::Closed),
            (None | Some(VolumeState::Closing), _) => Some(IoError::Closed),
            (Some(VolumeState::Lost(error)), _) => Some(IoError::VolumeLost(error)),
            (_, OnDisconnect::Fail) => Some(IoError::Disconnected { held_ns }),
            (_, OnDisconnect::Hold { hold_timeout_ns }) if held_ns >= hold_timeout_ns => {
                Some(IoError::Disconnected { held_ns })
            }
            _ => None,
        };
        match error {
            Some(error) => self.complete(index, Err(error), now),
            None => {
                if self.slots[index].state != SlotState::WaitingForVolume {
                    self.slots[index].state = SlotState::WaitingForVolume;
                    self.volumes[usize::from(volume.index)].stats.held += 1;
                }
            }
        }
    }

    /// Finishes slot `index` and queues its completion.
    pub(super) fn complete(&mut self, index: usize, result: Result<(), IoError>, now: u64) {
        let slot = &mut self.slots[index];
        slot.state = SlotState::Completed { result };
        slot.completed_at = now;
        let latency = now.saturating_sub(slot.submitted_at);
        let (kind, len, volume) = (slot.kind, u64::from(slot.len), slot.volume);
        self.completions.push_back(index as u16);
        let Some(volume) = self
            .volumes
            .get_mut(usize::from(volume.index))
            .filter(|v| v.generation == volume.generation && v.state.is_some())
        else {
            return;
        };
        let stats = &mut volume.stats;
        if result.is_err() {
            stats.errors += 1;
            return;
        }
        stats.latency.record(latency);
        match kind {
            IoKind::Read => {
                stats.reads += 1;
                stats.read_bytes += len;
            }
            IoKind::Write => {
                stats.writes += 1;
                stats.written_bytes += len;
            }
            IoKind::Flush => stats.flushes += 1,
            IoKind::Discard => {
                stats.discards += 1;
                stats.discarded_bytes += len;
            }
        }
    }

    /// Sends pieces from the issue queue while RTRS has permits.
    pub(super) fn issue(&mut self, now: u64) -> bool {
        let mut sent = false;
        while let Some(&index) = self.issue_queue.front() {
            let index = usize::from(index);
            let (progress, blocked) = self.issue_slot(index, now);
            sent |= progress;
            if blocked {
                break;
            }
            self.issue_queue.pop_front();
            self.slots[index].queued = false;
        }
        sent
    }

    /// Sends slot `index`'s next pieces. Returns (sent any, blocked on
    /// permits).
    pub(super) fn issue_slot(&mut self, index: usize, now: u64) -> (bool, bool) {
        let mut sent = false;
        loop {
            let slot = &self.slots[index];
            let SlotState::Issuing {
                issued,
                in_flight,
                phase,
                failure,
                retry,
            } = slot.state
            else {
                return (sent, false);
            };
            if failure.is_some() || retry {
                return (sent, false);
            }
            let volume = slot.volume;
            let device = match (
                self.volume_ready(volume),
                self.volumes[usize::from(volume.index)].device,
            ) {
                (true, Some(device)) => device,
                _ => {
                    // The volume went away under the IO: re-issue it later.
                    self.set_retry(index, now);
                    return (sent, false);
                }
            };
            let base = index as u32 * self.config.max_transfer;
            let mut header = [0u8; HEADER_LEN];
            let (built, direction, piece, next_phase) = match phase {
                Phase::Data => {
                    if issued >= slot.len {
                        return (sent, false);
                    }
                    let remaining = slot.len - issued;
                    let at = slot.offset + u64::from(issued);
                    match slot.kind {
                        IoKind::Read => {
                            let piece = remaining.min(device.max_io_size);
                            (
                                device.read(at, piece, &mut header),
                                Direction::Read {
                                    dest: ReadBuffer {
                                        region: self.data,
                                        offset: base + issued,
                                        len: piece,
                                    },
                                },
                                piece,
                                Phase::Data,
                            )
                        }
                        IoKind::Write => {
                            let piece = remaining.min(device.max_io_size);
                            (
                                device.write(at, piece, slot.fua, &mut header),
                                Direction::Write {
                                    data: Sgl::single(self.data.sge(base + issued, piece)),
                                },
                                piece,
                                Phase::Data,
                            )
                        }
                        IoKind::Discard | IoKind::Flush => {
                            let max = device.geometry.max_discard_sectors.saturating_mul(512);
                            let block = u32::from(device.geometry.logical_block_size.max(512));
                            let piece = remaining.min((max / block * block).max(block));
                            (
                                device.discard(at, piece, &mut header),
                                Direction::Write { data: Sgl::new() },
                                piece,
                                Phase::Data,
                            )
                        }
                    }
                }
                Phase::Flush { sent: true } => return (sent, false),
                Phase::Flush { sent: false } => (
                    device.flush(&mut header),
                    Direction::Read {
                        dest: ReadBuffer {
                            region: self.data,
                            offset: base,
                            len: 0,
                        },
                    },
                    0,
                    Phase::Flush { sent: true },
                ),
            };
            let outgoing = match built {
                Ok(outgoing) => outgoing,
                Err(error) => {
                    self.set_failure(index, IoError::Refused(error), now);
                    return (sent, false);
                }
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(KIND_IO, self.slots[index].generation, index as u16),
                header: &header[..outgoing.user_header_len],
                direction,
                admin: false,
                hint: Some(index as u16),
            });
            match result {
                Ok(()) => {
                    sent = true;
                    self.slots[index].state = SlotState::Issuing {
                        issued: issued + piece,
                        in_flight: in_flight + 1,
                        phase: next_phase,
                        failure: None,
                        retry: false,
                    };
                    self.volumes[usize::from(volume.index)].stats.requests += 1;
                }
                // Out of permits or send-queue room: wait for completions.
                Err(RtrsSubmitError::NoPermit | RtrsSubmitError::Post(PostError::QueueFull)) => {
                    self.stats.permit_waits += 1;
                    return (sent, true);
                }
                // The path went away under us: re-issue once it is back.
                Err(
                    RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(PostError::NotConnected | PostError::UnknownConnection),
                ) => {
                    self.set_retry(index, now);
                    return (sent, false);
                }
                Err(error) => {
                    self.set_failure(index, IoError::Transport(error), now);
                    return (sent, false);
                }
            }
        }
    }

    pub(super) fn set_retry(&mut self, index: usize, now: u64) {
        if let SlotState::Issuing { retry, .. } = &mut self.slots[index].state {
            *retry = true;
        }
        self.settle(index, now);
    }

    pub(super) fn set_failure(&mut self, index: usize, error: IoError, now: u64) {
        if let SlotState::Issuing { failure, .. } = &mut self.slots[index].state {
            failure.get_or_insert(error);
        }
        self.settle(index, now);
    }

    /// Ends slot `index` if nothing of it is in flight and nothing more is
    /// to be sent: completes it, holds it for a retry, or moves an
    /// emulated FUA write on to its FLUSH.
    pub(super) fn settle(&mut self, index: usize, now: u64) {
        let slot = &self.slots[index];
        let SlotState::Issuing {
            issued,
            in_flight,
            phase,
            failure,
            retry,
        } = slot.state
        else {
            return;
        };
        if in_flight > 0 {
            return;
        }
        if let Some(error) = failure {
            self.complete(index, Err(error), now);
        } else if retry {
            self.hold(index, now);
        } else {
            match phase {
                Phase::Data if issued < slot.len => {}
                Phase::Data if slot.flush_after => {
                    self.slots[index].state = SlotState::Issuing {
                        issued,
                        in_flight: 0,
                        phase: Phase::Flush { sent: false },
                        failure: None,
                        retry: false,
                    };
                    self.enqueue(index);
                }
                Phase::Flush { sent: false } => {}
                _ => self.complete(index, Ok(()), now),
            }
        }
    }

    pub(super) fn io_answered(
        &mut self,
        index: usize,
        generation: u16,
        errno: u16,
        aborted: bool,
        now: u64,
    ) {
        let Some(slot) = self
            .slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
        else {
            self.stats.stale_completions += 1;
            return;
        };
        let SlotState::Issuing {
            in_flight,
            failure,
            retry,
            ..
        } = &mut slot.state
        else {
            self.stats.stale_completions += 1;
            return;
        };
        if *in_flight == 0 {
            self.stats.stale_completions += 1;
            return;
        }
        *in_flight -= 1;
        match errno {
            0 => {}
            // The RTRS client's own "no path took it" (rtrs.md §7).
            _ if aborted => *retry = true,
            errno => {
                let error = match rnbd_client::io_status(errno) {
                    Err(ClientError::Remote(remote)) => IoError::Remote(remote),
                    Err(other) => IoError::Refused(other),
                    Ok(()) => IoError::Refused(ClientError::Empty),
                };
                failure.get_or_insert(error);
            }
        }
        self.settle(index, now);
    }

    /// Re-issues held IO whose volume is open again; completes held IO
    /// that timed out or whose volume is lost or closed.
    pub(super) fn resume_held(&mut self, now: u64) -> bool {
        let mut busy = false;
        for index in 0..self.slots.len() {
            if self.slots[index].state != SlotState::WaitingForVolume {
                continue;
            }
            let volume = self.slots[index].volume;
            if self.volume_ready(volume) {
                busy = true;
                self.volumes[usize::from(volume.index)].stats.reissued += 1;
                self.begin(index);
            } else {
                self.hold(index, now);
                busy |= self.slots[index].state != SlotState::WaitingForVolume;
            }
        }
        busy
    }
}
