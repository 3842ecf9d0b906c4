//! Sessions: the RTRS events (sessions and paths opening, closing,
//! refused), the engine's session table with its deferred CLOSE answers,
//! and the manifest's access rules twice: as the RTRS admission hook
//! ([`AccessRules`], at each path's INFO_REQ) and as the export table one
//! session sees ([`SessionExports`], at each RNBD OPEN).

use alloc::string::String;
use core::net::{IpAddr, Ipv4Addr};

use crate::port::Port;
use hal::block::BlockDevice;
use manifest::binary::Manifest;
use manifest::AccessMode;
use rnbd::server::{Export, Exports, Grant, LookupError};
use rtrs::server::{Admission, Event, IoToken, PathId, PathRefusal, PathRequest, SessionId};

use crate::volumes::Served;
use crate::{Chunk, Engine};

/// Deferred CLOSE answers one session may hold at once; the table holds
/// this many for every session entry, so no session can use up another's.
pub(crate) const MAX_DEFERRED_PER_SESSION: usize = 16;

/// One RNBD session (one RTRS session, its paths on any interfaces).
pub(crate) struct SessionEntry {
    pub(crate) id: SessionId,
    pub(crate) name: String,
    /// The client address of the session's first path (statistics).
    pub(crate) source: Option<Ipv4Addr>,
    /// The paths up and each one's client address: a request is checked
    /// against the access rules with the address of the path it came on.
    pub(crate) paths: heapless::Vec<(PathId, Ipv4Addr), 8>,
    pub(crate) rnbd: rnbd::server::Session,
    /// RTRS closed the session; the entry stays until its IO drains.
    pub(crate) closed: bool,
    /// Device IOs submitted and not completed.
    pub(crate) in_flight: u32,
}

/// A deferred CLOSE: its session, its tag and the request to answer.
#[derive(Clone, Copy)]
pub(crate) struct Deferred {
    pub(crate) session: SessionId,
    pub(crate) tag: u32,
    pub(crate) token: IoToken,
}

/// The export table as one session sees it (rnbd::server::Exports).
pub(crate) struct SessionExports<'e, 'm, D> {
    pub(crate) manifest: &'e Manifest<'m>,
    pub(crate) volumes: &'e [Served<D>],
    pub(crate) session: &'e str,
    pub(crate) source: Ipv4Addr,
}

impl<D> Exports for SessionExports<'_, '_, D> {
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
        let (index, _) = self
            .manifest
            .volume_by_device_path(device_path)
            .ok_or(LookupError::NotFound)?;
        let served = self.volumes.get(index).ok_or(LookupError::NotFound)?;
        let grant = match self.manifest.access(self.session, self.source, index) {
            Some(AccessMode::ReadWrite) => Grant::ReadWrite,
            Some(AccessMode::ReadOnly) => Grant::ReadOnly,
            None => return Err(LookupError::Denied),
        };
        Ok(Export {
            volume: served.info,
            grant,
        })
    }
}

/// The manifest's access rules as the RTRS server's admission hook: a
/// path may carry a session only if some rule admits the session name from
/// the path's client address (IPv4; the HCA speaks nothing else).
pub(crate) struct AccessRules<'e, 'm> {
    pub(crate) manifest: &'e Manifest<'m>,
}

impl Admission for AccessRules<'_, '_> {
    fn admit(&mut self, path: &PathRequest<'_>) -> bool {
        match path.remote.ip() {
            IpAddr::V4(source) => self.manifest.admits(path.name, source),
            IpAddr::V6(_) => false,
        }
    }
}

impl<'m, P: Port, D: BlockDevice<Chunk>> Engine<'m, P, D> {
    pub(crate) fn session_index(&self, id: SessionId) -> Option<usize> {
        self.sessions.iter().position(|s| s.id == id)
    }

    /// Handles an RTRS event about sessions and paths (IO events are
    /// `Engine::handle_events`' own).
    #[cold]
    pub(crate) fn handle_session_event(&mut self, event: Event, now: u64) {
        match event {
            Event::SessionOpened { session, name } => {
                if self.sessions.len() >= self.session_capacity {
                    log!(
                        self,
                        "refuse: session {name:?}: session table full; closing it"
                    );
                    // Its paths will come up; close them as they do.
                    return;
                }
                let name: String = name.as_str().into();
                log!(self, "session {name:?} opened");
                self.sessions.push(SessionEntry {
                    id: session,
                    name,
                    source: None,
                    paths: heapless::Vec::new(),
                    rnbd: rnbd::server::Session::new(),
                    closed: false,
                    in_flight: 0,
                });
            }
            Event::PathUp {
                session,
                path,
                remote,
                port,
            } => {
                // The server asked the access rules before the path came up
                // (`AccessRules`); an address that is not IPv4 was refused.
                let (Some(index), Some(IpAddr::V4(source))) =
                    (self.session_index(session), remote.map(|r| r.ip()))
                else {
                    self.server.close_path(path, now, &mut self.hcas);
                    return;
                };
                let entry = &mut self.sessions[index];
                if entry.paths.push((path, source)).is_err() {
                    self.server.close_path(path, now, &mut self.hcas);
                    return;
                }
                entry.source.get_or_insert(source);
                let interface = self.interfaces.get(port).map_or("?", |i| i.name.as_str());
                log!(
                    self,
                    "path up: session {:?} from {source} on {interface} ({} paths)",
                    self.sessions[index].name,
                    self.sessions[index].paths.len()
                );
            }
            Event::PathRefused {
                name,
                remote,
                port,
                reason,
            } => {
                let shown = remote.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |r| r.ip());
                let interface = self.interfaces.get(port).map_or("?", |i| i.name.as_str());
                log!(
                    self,
                    "refuse: session {name:?} from {shown} on {interface}: {}",
                    match reason {
                        PathRefusal::NotAdmitted => "no access rule admits it",
                        PathRefusal::NameInUse => "the name is another session's",
                        PathRefusal::NameMismatch => "the name differs from its session's",
                        PathRefusal::NoSession => "no such session",
                        PathRefusal::TooManySessions => "session table full",
                        PathRefusal::TooManyPaths => "the session has its paths",
                        PathRefusal::OutOfMemory => "no memory for its chunks",
                        _ => "refused",
                    }
                );
            }
            Event::PathDown {
                session,
                path,
                reason,
            } => {
                if let Some(index) = self.session_index(session) {
                    self.sessions[index].paths.retain(|(p, _)| *p != path);
                    let name = self.sessions[index].name.clone();
                    log!(self, "path down: session {name:?}: {reason:?}");
                }
            }
            Event::SessionClosed { session } => {
                if let Some(index) = self.session_index(session) {
                    let entry = &mut self.sessions[index];
                    let draining = self.rnbd.end_session(&mut entry.rnbd);
                    entry.closed = true;
                    let stats = *entry.rnbd.stats();
                    log!(
                        self,
                        "session {:?} closed ({} opens, {} IOs{})",
                        self.sessions[index].name,
                        stats.opens,
                        stats.io.reads + stats.io.writes,
                        if draining > 0 { ", draining" } else { "" }
                    );
                    self.reap(index);
                }
            }
            // `Engine::handle_events` serves IO events in place (module `io`).
            _ => {}
        }
    }

    /// Drops a closed session once nothing of it is in flight.
    pub(crate) fn reap(&mut self, index: usize) {
        let entry = &self.sessions[index];
        if entry.closed && entry.in_flight == 0 && entry.rnbd.is_idle() {
            self.sessions.swap_remove(index);
        }
    }
}
