//! Volumes: OPEN and CLOSE, the session's SESS_INFO, and their answers
//! (rnbd.md §4-§5); a volume re-opens after the session comes back.

use super::*;

impl<V: Verbs> Initiator<V> {
    pub(super) fn id_of(&self, index: usize) -> VolumeId {
        VolumeId {
            index: index as u16,
            generation: self.volumes[index].generation,
        }
    }

    pub(super) fn free_volume(&mut self, index: usize) {
        let slot = &mut self.volumes[index];
        slot.state = None;
        slot.device = None;
        slot.close_sent = false;
        slot.generation = slot.generation.wrapping_add(1);
    }

    /// Opens `device_path` (relative to the server's device search path)
    /// as `mode`. The answer arrives as [`Event::Opened`] for the returned
    /// id; the OPEN is sent once the session is ready.
    ///
    /// # Errors
    ///
    /// [`OpenError::BadPath`], [`OpenError::AlreadyOpen`],
    /// [`OpenError::TooManyVolumes`], [`OpenError::Disconnected`] after
    /// [`Initiator::close_session`].
    pub fn open(&mut self, device_path: &str, mode: AccessMode) -> Result<VolumeId, OpenError> {
        let mut header = [0u8; HEADER_LEN];
        rnbd_client::open(device_path, mode, &mut header).map_err(OpenError::BadPath)?;
        if self.session == SessionState::Closed {
            return Err(OpenError::Disconnected);
        }
        if let Some(index) = self
            .volumes
            .iter()
            .position(|v| v.state.is_some() && v.device_path == device_path)
        {
            return Err(OpenError::AlreadyOpen(self.id_of(index)));
        }
        let index = self.volumes.iter().position(|v| v.state.is_none()).ok_or(
            OpenError::TooManyVolumes {
                max: self.config.max_volumes,
            },
        )?;
        let slot = &mut self.volumes[index];
        slot.state = Some(VolumeState::WaitingForSession);
        slot.device_path.clear();
        slot.device_path.push_str(device_path);
        slot.mode = mode;
        slot.device = None;
        slot.close_sent = false;
        slot.stats = VolumeStats::default();
        let id = self.id_of(index);
        self.admin();
        Ok(id)
    }

    /// Closes a volume: sends CLOSE (answered with [`Event::Closed`]), or,
    /// if the session is down or the volume lost, forgets it at once (the
    /// server already did) and queues [`Event::Closed`].
    ///
    /// # Errors
    ///
    /// [`CloseError`]: unknown volume, IO of the volume not yet completed,
    /// an OPEN in flight, or already closing.
    pub fn close(&mut self, volume: VolumeId) -> Result<(), CloseError> {
        let state = self
            .volume_state(volume)
            .ok_or(CloseError::UnknownVolume(volume))?;
        let in_flight = self
            .slots
            .iter()
            .filter(|s| {
                s.volume == volume
                    && !matches!(s.state, SlotState::Free | SlotState::Completed { .. })
            })
            .count() as u32;
        if in_flight > 0 {
            return Err(CloseError::Busy { in_flight });
        }
        let index = usize::from(volume.index);
        match state {
            VolumeState::Closing => Err(CloseError::AlreadyClosing),
            VolumeState::Opening | VolumeState::Reopening => Err(CloseError::Opening),
            VolumeState::Open => {
                self.volumes[index].state = Some(VolumeState::Closing);
                self.volumes[index].close_sent = false;
                self.admin();
                Ok(())
            }
            VolumeState::WaitingForSession | VolumeState::Disconnected | VolumeState::Lost(_) => {
                self.free_volume(index);
                self.events.push_back(Event::Closed {
                    volume,
                    result: Ok(()),
                });
                Ok(())
            }
        }
    }

    /// Sends what the control path owes: SESS_INFO after `SessionUp`, then
    /// OPEN for volumes waiting for it and CLOSE for closing ones, as far
    /// as RTRS permits allow. Returns whether anything was sent.
    pub(super) fn admin(&mut self) -> bool {
        let mut sent = false;
        if self.session == SessionState::SendingSessInfo {
            let mut header = [0u8; HEADER_LEN];
            let Ok(outgoing) = rnbd_client::sess_info(&mut header) else {
                return false;
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(KIND_SESS_INFO, 0, 0),
                header: &header[..outgoing.user_header_len],
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region: self.admin,
                        offset: u32::from(self.config.max_volumes) * ADMIN_SLOT,
                        len: outgoing.data_len,
                    },
                },
                admin: true,
                hint: None,
            });
            match result {
                Ok(()) => {
                    sent = true;
                    self.session = SessionState::WaitingForSessInfo;
                }
                Err(RtrsSubmitError::NoPermit | RtrsSubmitError::Post(PostError::QueueFull)) => {
                    return false
                }
                Err(
                    RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(PostError::NotConnected | PostError::UnknownConnection),
                ) => {
                    // SessionDown follows; SessionUp sends it again.
                    return false;
                }
                // The server's header room cannot hold 36 bytes: it cannot
                // serve RNBD at all. Carry on without SESS_INFO (version 0).
                Err(_) => self.session_ready(),
            }
        }
        if self.session != SessionState::Ready {
            return sent;
        }
        for index in 0..self.volumes.len() {
            let slot = &self.volumes[index];
            // Most turns owe nothing: skip before the header is zeroed.
            let owed = match slot.state {
                Some(VolumeState::WaitingForSession | VolumeState::Disconnected) => true,
                Some(VolumeState::Closing) => !slot.close_sent,
                _ => false,
            };
            if !owed {
                continue;
            }
            let generation = slot.generation;
            let mut header = [0u8; HEADER_LEN];
            let (kind, next, outgoing, read) = match slot.state {
                Some(VolumeState::WaitingForSession | VolumeState::Disconnected) => {
                    let Ok(outgoing) = rnbd_client::open(&slot.device_path, slot.mode, &mut header)
                    else {
                        continue;
                    };
                    let next = if slot.state == Some(VolumeState::WaitingForSession) {
                        VolumeState::Opening
                    } else {
                        VolumeState::Reopening
                    };
                    (KIND_OPEN, next, outgoing, true)
                }
                Some(VolumeState::Closing) if !slot.close_sent => {
                    let Some(Ok(outgoing)) = slot.device.map(|d| d.close(&mut header)) else {
                        continue;
                    };
                    (KIND_CLOSE, VolumeState::Closing, outgoing, false)
                }
                _ => continue,
            };
            let direction = if read {
                Direction::Read {
                    dest: ReadBuffer {
                        region: self.admin,
                        offset: index as u32 * ADMIN_SLOT,
                        len: outgoing.data_len,
                    },
                }
            } else {
                Direction::Write { data: Sgl::new() }
            };
            let result = self.client.submit(ClientIo {
                tag: tag_of(kind, generation, index as u16),
                header: &header[..outgoing.user_header_len],
                direction,
                admin: true,
                hint: None,
            });
            match result {
                Ok(()) => {
                    sent = true;
                    let slot = &mut self.volumes[index];
                    slot.state = Some(next);
                    slot.close_sent = kind == KIND_CLOSE;
                }
                Err(
                    RtrsSubmitError::NoPermit
                    | RtrsSubmitError::NotConnected
                    | RtrsSubmitError::Post(
                        PostError::QueueFull
                        | PostError::NotConnected
                        | PostError::UnknownConnection,
                    ),
                ) => break,
                Err(_) => {
                    // Cannot be carried (header room): fail it.
                    let id = self.id_of(index);
                    if kind == KIND_CLOSE {
                        self.free_volume(index);
                        self.events.push_back(Event::Closed {
                            volume: id,
                            result: Ok(()),
                        });
                    } else {
                        self.open_failed(index, OpenError::Disconnected);
                    }
                }
            }
        }
        sent
    }

    pub(super) fn session_ready(&mut self) {
        self.session = SessionState::Ready;
        let reconnected = core::mem::take(&mut self.reconnected);
        self.events.push_back(Event::SessionUp { reconnected });
    }

    pub(super) fn open_failed(&mut self, index: usize, error: OpenError) {
        let id = self.id_of(index);
        match self.volumes[index].state {
            Some(VolumeState::Opening | VolumeState::WaitingForSession) => {
                self.free_volume(index);
                self.events.push_back(Event::Opened {
                    volume: id,
                    result: Err(error),
                });
            }
            Some(_) => {
                self.volumes[index].state = Some(VolumeState::Lost(error));
                self.events
                    .push_back(Event::ReopenFailed { volume: id, error });
            }
            None => {}
        }
    }

    pub(super) fn piece_max(&self, logical_block_size: u16) -> u32 {
        let block = u32::from(logical_block_size).max(512);
        let max = self.max_io_size.min(self.config.max_transfer);
        (max / block * block).max(block)
    }

    pub(super) fn open_answered(
        &mut self,
        index: usize,
        generation: u16,
        errno: u16,
        aborted: bool,
        read: Option<ReadBuffer>,
    ) {
        let Some(slot) = self
            .volumes
            .get(index)
            .filter(|v| v.generation == generation)
        else {
            self.stats.stale_completions += 1;
            return;
        };
        let (state, mode) = (slot.state, slot.mode);
        if !matches!(state, Some(VolumeState::Opening | VolumeState::Reopening)) {
            self.stats.stale_completions += 1;
            return;
        }
        if aborted {
            // No path carried it: send it again once the session is ready.
            self.volumes[index].state = Some(if state == Some(VolumeState::Opening) {
                VolumeState::WaitingForSession
            } else {
                VolumeState::Disconnected
            });
            return;
        }
        let mut response = [0u8; rnbd::wire::OpenRsp::LEN];
        let copied = read.is_some_and(|read| {
            read.len as usize >= response.len()
                && self.client.read_response(&read, &mut response).is_ok()
        });
        let result = if errno != 0 || copied {
            Device::from_open_rsp(errno, &response, mode)
        } else {
            Err(ClientError::BadResponse(rnbd::wire::ParseError::Truncated))
        };
        match result {
            Ok(device) => {
                let device =
                    device.with_max_io_size(self.piece_max(device.geometry.logical_block_size));
                let id = self.id_of(index);
                let slot = &mut self.volumes[index];
                slot.device = Some(device);
                slot.state = Some(VolumeState::Open);
                let info = VolumeInfo::new(id, device);
                if state == Some(VolumeState::Opening) {
                    self.events.push_back(Event::Opened {
                        volume: id,
                        result: Ok(info),
                    });
                } else {
                    slot.stats.reopens += 1;
                    self.events.push_back(Event::Reopened { volume: id, info });
                }
            }
            Err(ClientError::Remote(error)) => self.open_failed(index, OpenError::Remote(error)),
            Err(error) => self.open_failed(index, OpenError::BadResponse(error)),
        }
    }

    pub(super) fn close_answered(
        &mut self,
        index: usize,
        generation: u16,
        errno: u16,
        aborted: bool,
    ) {
        let matches = self
            .volumes
            .get(index)
            .is_some_and(|v| v.generation == generation && v.state == Some(VolumeState::Closing));
        if !matches {
            self.stats.stale_completions += 1;
            return;
        }
        let id = self.id_of(index);
        self.free_volume(index);
        let result = if aborted {
            // The session went away: the server forgot the device anyway.
            Ok(())
        } else {
            rnbd_client::io_status(errno).map_err(|error| match error {
                ClientError::Remote(remote) => IoError::Remote(remote),
                other => IoError::Refused(other),
            })
        };
        self.events.push_back(Event::Closed { volume: id, result });
    }
}
