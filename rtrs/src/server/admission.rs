//! Admission: whether a path may carry its session, decided at INFO_REQ.
//!
//! A CON_REQ only names uuids, which travel in clear and prove nothing, so
//! the server gives a connecting path nothing but its connections and the
//! one small receive buffer its INFO_REQ lands in (rtrs.md §2.4 step 6). The
//! INFO_REQ brings the session name; only then, with the name and the
//! path's client address, does the server ask its owner's [`Admission`]
//! (the engine's access rules) and check its own rules:
//!
//! 1. the session the path asks for: an *open* session with its
//!    `paths_uuid` (the name must be that session's), or a new one (the
//!    CON_REQ had `first_conn`, the name is not an open session's and
//!    `max_sessions` leaves room);
//! 2. `max_paths_per_session` for a path joining a session;
//! 3. [`Admission::admit`] for this path: every path of a session is asked
//!    about, with its own client address, not only the first;
//! 4. the chunk pool and the INFO_RSP buffer, allocated and
//!    registered on the path's port now, when they are first needed: the
//!    client writes into chunks only after INFO_RSP told it where they are
//!    (rtrs.md §3.3; CONN_RSP carries only sizes, §2.5).
//!
//! A path failing any step is closed (every connection disconnected), as
//! Linux closes a path whose INFO_REQ it refuses (rtrs.md §3.2): INFO_RSP has
//! no errno, the client's path attempt fails when its connections go. The
//! server reports [`Event::PathRefused`] with the [`PathRefusal`], counts it
//! in [`ServerStats::paths_refused`](super::ServerStats), and the path holds
//! nothing once its connections are gone: it never had a session slot, a
//! name or a chunk pool.

use core::net::SocketAddr;

use super::table::PathState;
use super::{CloseReason, Event, Lent, SessionId, Verbs};
use crate::wire::PATHNAME_LEN;

/// What the server knows of a path asking to carry a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathRequest<'a> {
    /// The session name from the INFO_REQ (checked: 1..=254 characters of
    /// `[A-Za-z0-9_-]`).
    pub name: &'a str,
    /// The client's address (of the CON_REQ that created the path).
    pub remote: SocketAddr,
    /// The server address the client connected to.
    pub local: SocketAddr,
    /// The port (interface) the path came in on.
    pub port: usize,
    /// The open session the path joins; `None` when it would start a new
    /// session.
    pub joins: Option<SessionId>,
}

/// The owner's access decision, asked once per path at its INFO_REQ,
/// before anything of a session is allocated (the module doc above).
///
/// Implemented for every `FnMut(&PathRequest<'_>) -> bool`; [`AdmitAll`]
/// admits every path (a server without access rules: tests, tools).
pub trait Admission {
    /// Whether `path` may carry session `path.name` from `path.remote`.
    fn admit(&mut self, path: &PathRequest<'_>) -> bool;
}

impl<F: FnMut(&PathRequest<'_>) -> bool> Admission for F {
    fn admit(&mut self, path: &PathRequest<'_>) -> bool {
        self(path)
    }
}

/// Admits every path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmitAll;

impl Admission for AdmitAll {
    fn admit(&mut self, _path: &PathRequest<'_>) -> bool {
        true
    }
}

/// Why a path was refused at INFO_REQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathRefusal {
    /// [`Admission::admit`] said no.
    NotAdmitted,
    /// The name is another open session's (Linux: EPERM).
    NameInUse,
    /// The name differs from the name of the session the path joins.
    NameMismatch,
    /// No open session has the path's `paths_uuid` and its CON_REQ did not
    /// set `first_conn` (Linux: ENXIO).
    NoSession,
    /// `max_sessions` sessions are open.
    TooManySessions,
    /// The session has `max_paths_per_session` paths.
    TooManyPaths,
    /// The port's memory pool could not hold the path's chunk pool.
    OutOfMemory,
}

impl<V: Verbs> Lent<'_, V> {
    /// Steps 1-3 of the module doc for path slot `path` with session name
    /// `name`: the session slot the path joins (`Some`) or `None` for a new
    /// session, or why not.
    pub(super) fn admit_path(
        &mut self,
        path: u16,
        name: &str,
        admission: &mut dyn Admission,
    ) -> Result<Option<u16>, PathRefusal> {
        let slot = &self.server.paths[usize::from(path)];
        let (Some((local, remote)), port) = (slot.addresses, slot.port) else {
            return Err(PathRefusal::NotAdmitted);
        };
        let joins = self.find_session(slot.session_uuid);
        match joins {
            Some(session) => {
                if self.server.sessions[usize::from(session)].name != name {
                    return Err(PathRefusal::NameMismatch);
                }
                let up = self
                    .paths
                    .iter()
                    .filter(|p| p.session == Some(session) && p.state == PathState::Connected)
                    .count();
                if up >= usize::from(self.server.config.max_paths_per_session) {
                    return Err(PathRefusal::TooManyPaths);
                }
            }
            None => {
                if !slot.first_conn {
                    return Err(PathRefusal::NoSession);
                }
                if self
                    .server
                    .sessions
                    .iter()
                    .any(|s| s.open && s.name == name)
                {
                    return Err(PathRefusal::NameInUse);
                }
                let open = self.server.sessions.iter().filter(|s| s.open).count();
                if open >= usize::from(self.server.config.max_sessions) {
                    return Err(PathRefusal::TooManySessions);
                }
            }
        }
        let request = PathRequest {
            name,
            remote,
            local,
            port,
            joins: joins.map(|index| self.session_id(index)),
        };
        if !admission.admit(&request) {
            return Err(PathRefusal::NotAdmitted);
        }
        Ok(joins)
    }

    /// Closes a path refused at INFO_REQ and reports it.
    pub(super) fn refuse_path(
        &mut self,
        path: u16,
        name: heapless::String<PATHNAME_LEN>,
        reason: PathRefusal,
        now: u64,
    ) {
        let slot = &self.server.paths[usize::from(path)];
        let (remote, port) = (slot.remote, slot.port);
        self.server.stats.paths_refused += 1;
        self.push_event(Event::PathRefused {
            name,
            remote,
            port,
            reason,
        });
        self.begin_close(path, CloseReason::Refused, now);
        self.maybe_free_path(path);
    }
}
