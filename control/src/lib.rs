//! The `brick-initiatord` control socket: typed requests and replies.
//!
//! The daemon listens on a unix socket ([`DEFAULT_SOCKET`]); a client
//! (`brick status|list|map|unmap`, `brick-initiatord status`) connects,
//! writes one [`Request`] and reads one [`Reply`]. Both travel as one JSON
//! object on one line (serde_json, `\n`-terminated), tagged by the field
//! `request` or `reply`:
//!
//! | request | its reply |
//! |---|---|
//! | `{"request":"status","format":"json"}` | `{"reply":"status","status":{"converged":true,"volumes":[…],"exports":[],"notices":[]}}` |
//! | `{"request":"status","format":"text"}` | `{"reply":"text","text":"NAME  DEVICE …"}` |
//! | `{"request":"list","format":"json"}` | `{"reply":"list","volumes":[{"name":"db","origin":"config",…}]}` |
//! | `{"request":"list","format":"text"}` | `{"reply":"text","text":"NAME  ORIGIN …"}` |
//! | `{"request":"map","volume":{"name":"db","session":"s","device_path":"vol0","paths":["10.0.0.1"]}}` | `{"reply":"mapped","volume":{"name":"db","origin":"runtime",…}}` |
//! | `{"request":"unmap","name":"db","force":false}` | `{"reply":"unmapped","name":"db","device":"rnbd0"}` |
//!
//! Any request may instead get `{"reply":"error","message":"…"}`
//! ([`Reply::Error`]): the daemon refused it, or the line was not a
//! request at all ([`RequestError`]: over-long, not UTF-8, not JSON, an
//! unknown `request`, missing or unknown fields). `format` defaults to
//! `json` and `force` to `false`; unknown fields are refused.
//!
//! The framing is here too: [`request`] is the client, [`ControlServer`]
//! the daemon's side (bind, then a bounded [`ControlServer::poll`] from
//! the daemon's loop, each connection under short timeouts so a stuck
//! client cannot stall the daemon). What the daemon does with a request is
//! the daemon's (`initiatord::daemon::Daemon::answer`); a [`VolumeSpec`]
//! is checked there with the config file's rules.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod message;
mod socket;

pub use message::{
    ExportStatus, Format, ListEntry, PathStatus, Reply, Request, RequestError, Status, VolumeSpec,
    VolumeStatus, ORIGIN_CONFIG, ORIGIN_RUNTIME,
};
pub use socket::{decode_request, request, ControlServer};

use std::time::Duration;

/// Where the daemon listens unless `--socket` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/brick-initiatord.sock";
/// Requests answered per [`ControlServer::poll`] (bounded work).
pub const MAX_REQUESTS_PER_POLL: usize = 8;
/// Longest request line the daemon reads, its newline included: a `map`
/// of a volume with the most paths (128) fits many times over.
pub const MAX_REQUEST_LEN: u64 = 64 * 1024;
/// Longest reply line a client reads, its newline included: the status of
/// many volumes with many paths each fits many times over.
pub const MAX_REPLY_LEN: u64 = 16 * 1024 * 1024;
/// Read and write timeout on a connection the daemon accepted.
pub const IO_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a client waits for the daemon's reply (a `map` waits for the
/// kernel's `map_device`).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
