//! Compile-time capacities of the RNBD server.
//!
//! Every table the server keeps is fixed-size (STYLE.md §10, ARCHITECTURE.md §6):
//! nothing is allocated after construction. Each constant says what it
//! bounds; rnbd.md §8.3 #39 asks for the per-session device cap.

/// Devices one session may have open at once (rnbd.md §8.3 #39). Device ids
/// are the slot indexes, so ids are always below this. An OPEN beyond it is
/// refused with `EMFILE` ([`crate::server::Error::TooManyDevices`]).
pub const MAX_DEVICES_PER_SESSION: usize = 32;

/// Volumes the server tracks (writer counts and statistics): the manifest's
/// own cap (`manifest::types::MAX_VOLUMES`). [`crate::server::VolumeId`]s are
/// indexes below this.
pub const MAX_VOLUMES: usize = 1024;
