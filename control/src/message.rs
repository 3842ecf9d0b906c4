//! The requests, the replies and the reports they carry.
//!
//! Every type here is its own JSON encoding (serde derive): a [`Request`]
//! is an object tagged by `request`, a [`Reply`] one tagged by `reply`.
//! [`Request::from_line`] is the only way the daemon reads a request; it
//! never panics and says what was expected and what was found.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How `status` and `list` are answered.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The typed report ([`Reply::Status`], [`Reply::List`]).
    #[default]
    Json,
    /// A table for people ([`Reply::Text`]).
    Text,
}

/// One request to the daemon.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The last reconciliation pass: each volume's device, state, link
    /// and paths, the NBD exports, the notices.
    Status {
        /// Report or table.
        #[serde(default)]
        format: Format,
    },
    /// Every volume in force, with its origin (config file or `map`).
    List {
        /// Entries or table.
        #[serde(default)]
        format: Format,
    },
    /// Add one volume at run time and map it now.
    Map {
        /// The volume, as a `[[volumes]]` entry of the config file says it.
        volume: VolumeSpec,
    },
    /// Unmap a volume added with `map` and forget it.
    Unmap {
        /// The volume's name.
        name: String,
        /// Unmap even if the device is open, mounted or held.
        #[serde(default)]
        force: bool,
    },
}

impl Request {
    /// The `request` names, as the wire spells them.
    pub const NAMES: [&'static str; 4] = ["status", "list", "map", "unmap"];

    /// This request's name on the wire (one of [`Request::NAMES`]).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::List { .. } => "list",
            Self::Map { .. } => "map",
            Self::Unmap { .. } => "unmap",
        }
    }

    /// Decodes one request line (without its newline).
    ///
    /// # Errors
    ///
    /// The line is not a JSON object with a `request` string
    /// ([`RequestError::Malformed`]), names no known request
    /// ([`RequestError::Unknown`]), or has missing, unknown or ill-typed
    /// fields ([`RequestError::BadFields`]).
    pub fn from_line(line: &str) -> Result<Self, RequestError> {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| RequestError::Malformed {
                found: excerpt(line),
                reason: e.to_string(),
            })?;
        let name = match value.get("request") {
            Some(serde_json::Value::String(name)) => name.clone(),
            _ => {
                return Err(RequestError::Malformed {
                    found: excerpt(line),
                    reason: "no \"request\" string".into(),
                })
            }
        };
        if !Self::NAMES.contains(&name.as_str()) {
            return Err(RequestError::Unknown {
                name: excerpt(&name),
            });
        }
        serde_json::from_value(value).map_err(|e| RequestError::BadFields {
            request: name,
            reason: e.to_string(),
        })
    }

    /// The request as one JSON line (newline included).
    pub fn to_line(&self) -> String {
        line(self)
    }
}

/// One `[[volumes]]` entry of the daemon's config file, as `brick map`
/// sends it: the same fields and spellings, minus what a run-time map
/// does not take (`export` and `link`: NBD exports belong in the config
/// file). The daemon checks it with the config file's rules (names,
/// addresses, access modes, conflicts with the volumes in force) and
/// names the field at fault.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    /// The stable name: the device appears as `/dev/brick/<name>`.
    pub name: String,
    /// The rnbd/rtrs session name.
    pub session: String,
    /// The volume's device path on the target.
    pub device_path: String,
    /// `ro`, `rw` or `migration`; the daemon's default (`rw`) if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
    /// The target's RTRS port; the daemon's default (1234) if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The session's paths, `[SOURCE@]TARGET` each (`10.0.0.1`,
    /// `ip:10.0.0.2@ip:10.0.0.1`, `gid:…`).
    pub paths: Vec<String>,
}

/// The daemon's answer to one request.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// To `status` (format `json`).
    Status {
        /// The last pass's report.
        status: Status,
    },
    /// To `list` (format `json`).
    List {
        /// Every volume in force, in config order, run-time ones last.
        volumes: Vec<ListEntry>,
    },
    /// To `status` or `list` with format `text`: the table, without a
    /// trailing newline.
    Text {
        /// The table.
        text: String,
    },
    /// To `map`: the volume is mapped (or kept and retried, if its session
    /// has no connected path yet).
    Mapped {
        /// The volume as `list` shows it now.
        volume: ListEntry,
    },
    /// To `unmap`: the volume is unmapped and forgotten.
    Unmapped {
        /// The volume's name.
        name: String,
        /// The `rnbdN` it was mapped as, if it was.
        device: Option<String>,
    },
    /// The request was refused or was not a request at all.
    Error {
        /// What was expected and what was found.
        message: String,
    },
}

impl Reply {
    /// The reply refusing with `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Self::Error {
            message: message.into(),
        }
    }

    /// This reply's name on the wire (`status`, `list`, `text`, `mapped`,
    /// `unmapped` or `error`), for messages about an unexpected reply.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::List { .. } => "list",
            Self::Text { .. } => "text",
            Self::Mapped { .. } => "mapped",
            Self::Unmapped { .. } => "unmapped",
            Self::Error { .. } => "error",
        }
    }

    /// Decodes one reply line (without its newline).
    ///
    /// # Errors
    ///
    /// The line is not a reply object; the message says what was found.
    pub fn from_line(line: &str) -> Result<Self, String> {
        serde_json::from_str(line).map_err(|e| {
            format!(
                "expected a JSON reply object like {{\"reply\":\"status\",…}}, found {:?}: {e}",
                excerpt(line)
            )
        })
    }

    /// The reply as one JSON line (newline included).
    pub fn to_line(&self) -> String {
        line(self)
    }
}

/// [`VolumeStatus::origin`] and [`ListEntry::origin`] of a volume from the
/// config file.
pub const ORIGIN_CONFIG: &str = "config";
/// [`VolumeStatus::origin`] and [`ListEntry::origin`] of a volume added
/// with `map`.
pub const ORIGIN_RUNTIME: &str = "runtime";

/// The daemon's report (`status`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// Every kernel volume is mapped, open and linked.
    pub converged: bool,
    /// One entry per volume the kernel maps (rnbd), in config order.
    pub volumes: Vec<VolumeStatus>,
    /// One entry per NBD export (volumes Brick's userspace initiator
    /// maps), in config order.
    pub exports: Vec<ExportStatus>,
    /// What the daemon leaves as it is on purpose, and why.
    pub notices: Vec<String>,
}

impl Status {
    /// The report as one line of JSON (what `status --json` prints).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            // Unreachable: strings, booleans and integers always encode.
            serde_json::json!({ "error": e.to_string() }).to_string()
        })
    }
}

/// One kernel volume of the report.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeStatus {
    /// The stable name (`/dev/brick/<name>`).
    pub name: String,
    /// Session name.
    pub session: String,
    /// Device path on the target.
    pub device_path: String,
    /// Where the volume comes from: [`ORIGIN_CONFIG`] (the config file) or
    /// [`ORIGIN_RUNTIME`] (`map`).
    pub origin: String,
    /// `rnbdN`, if mapped.
    pub device: Option<String>,
    /// `open`, `closed`, `init`, `unmapped`, `unknown` or `not mapped`.
    pub state: String,
    /// `/dev/brick/<name>` points at the device.
    pub linked: bool,
    /// The session's paths.
    pub paths: Vec<PathStatus>,
}

/// One path of a volume's session.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathStatus {
    /// `src@dst`.
    pub path: String,
    /// `state` is `connected`.
    pub connected: bool,
}

/// One NBD export of the report.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportStatus {
    /// The volume's name (the NBD export name).
    pub name: String,
    /// `nbd:unix:PATH` or `nbd:tcp:IP:PORT`.
    pub address: String,
    /// The listener is bound.
    pub listening: bool,
    /// The RTRS session is up and the volume open.
    pub session_connected: bool,
    /// A client is being served now.
    pub client_connected: bool,
    /// Clients that reached transmission, in total.
    pub connections: u64,
    /// Requests answered.
    pub requests: u64,
    /// Bytes read by clients.
    pub bytes_read: u64,
    /// Bytes written by clients.
    pub bytes_written: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// The last failure (connect, bind or IO), if any.
    pub last_error: Option<String>,
}

/// One entry of the `list` reply (and the `map` reply's volume).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListEntry {
    /// The stable name.
    pub name: String,
    /// [`ORIGIN_CONFIG`] or [`ORIGIN_RUNTIME`].
    pub origin: String,
    /// Session name.
    pub session: String,
    /// Device path on the target.
    pub device_path: String,
    /// How it is opened.
    pub access_mode: String,
    /// `rnbdN`, if mapped.
    pub device: Option<String>,
    /// As in [`VolumeStatus::state`], or `nbd export`.
    pub state: String,
}

/// Why a line is not a request (the daemon answers it with
/// [`Reply::Error`], the message being this error's text).
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum RequestError {
    /// The line reached [`crate::MAX_REQUEST_LEN`] bytes without a newline.
    TooLong {
        /// The limit, in bytes, newline included.
        limit: u64,
    },
    /// The line is not UTF-8.
    NotUtf8 {
        /// Where the first bad byte is.
        offset: usize,
    },
    /// The line is not a JSON object with a `request` string.
    Malformed {
        /// The start of the line.
        found: String,
        /// What the decoder said.
        reason: String,
    },
    /// `request` names no request of [`Request::NAMES`].
    Unknown {
        /// The name found.
        name: String,
    },
    /// A known request whose fields are missing, unknown or ill-typed.
    BadFields {
        /// The request's name.
        request: String,
        /// What the decoder said, naming the field.
        reason: String,
    },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong { limit } => write!(
                f,
                "expected a request line of at most {limit} bytes ending in a newline, found a longer one"
            ),
            Self::NotUtf8 { offset } => write!(
                f,
                "expected a UTF-8 request line, found a byte that is not UTF-8 at offset {offset}"
            ),
            Self::Malformed { found, reason } => write!(
                f,
                "expected one JSON object per line like {{\"request\":\"status\",\"format\":\"json\"}}, \
                 found {found:?} ({reason})"
            ),
            Self::Unknown { name } => write!(
                f,
                "expected a request of {}, found unknown request {name:?}",
                Request::NAMES.map(|n| format!("{n:?}")).join(", ")
            ),
            Self::BadFields { request, reason } => {
                write!(f, "request {request:?}: {reason}")
            }
        }
    }
}

impl std::error::Error for RequestError {}

/// Longest piece of a peer's text quoted back in a message.
const EXCERPT_CHARS: usize = 80;

/// The start of `text`, for messages (at most [`EXCERPT_CHARS`] characters).
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// `value` as one JSON line.
fn line(value: &impl Serialize) -> String {
    let mut text = serde_json::to_string(value).unwrap_or_else(|e| {
        // Unreachable: strings, booleans and integers always encode.
        Reply::error(format!("cannot encode: {e}")).to_line()
    });
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> VolumeSpec {
        VolumeSpec {
            name: "db".into(),
            session: "host\"1".into(),
            device_path: "vol0".into(),
            access_mode: Some("ro".into()),
            port: Some(1235),
            paths: vec!["10.0.0.1".into(), "ip:10.0.0.2@ip:10.0.1.1".into()],
        }
    }

    fn list_entry() -> ListEntry {
        ListEntry {
            name: "db".into(),
            origin: ORIGIN_RUNTIME.into(),
            session: "s".into(),
            device_path: "vol0".into(),
            access_mode: "rw".into(),
            device: Some("rnbd0".into()),
            state: "open".into(),
        }
    }

    fn status() -> Status {
        Status {
            converged: false,
            volumes: vec![VolumeStatus {
                name: "db".into(),
                session: "s".into(),
                device_path: "vol0".into(),
                origin: ORIGIN_CONFIG.into(),
                device: None,
                state: "not mapped".into(),
                linked: false,
                paths: vec![PathStatus {
                    path: "ip:10.0.0.2@ip:10.0.0.1".into(),
                    connected: true,
                }],
            }],
            exports: vec![ExportStatus {
                name: "n".into(),
                address: "nbd:unix:/run/brick/n.nbd".into(),
                listening: true,
                session_connected: false,
                client_connected: false,
                connections: 2,
                requests: u64::MAX,
                bytes_read: 4096,
                bytes_written: 8192,
                errors: 1,
                last_error: Some("past the end".into()),
            }],
            notices: vec!["rnbd7 is not in the config".into()],
        }
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::Status {
                format: Format::Json,
            },
            Request::Status {
                format: Format::Text,
            },
            Request::List {
                format: Format::Json,
            },
            Request::List {
                format: Format::Text,
            },
            Request::Map { volume: volume() },
            Request::Map {
                volume: VolumeSpec {
                    access_mode: None,
                    port: None,
                    paths: Vec::new(),
                    ..volume()
                },
            },
            Request::Unmap {
                name: "db".into(),
                force: false,
            },
            Request::Unmap {
                name: "db".into(),
                force: true,
            },
        ]
    }

    fn replies() -> Vec<Reply> {
        vec![
            Reply::Status { status: status() },
            Reply::List {
                volumes: vec![list_entry(), list_entry()],
            },
            Reply::List {
                volumes: Vec::new(),
            },
            Reply::Text {
                text: "NAME\ndb \"x\"".into(),
            },
            Reply::Mapped {
                volume: list_entry(),
            },
            Reply::Unmapped {
                name: "db".into(),
                device: Some("rnbd0".into()),
            },
            Reply::Unmapped {
                name: "db".into(),
                device: None,
            },
            Reply::error("no volume \"nope\""),
        ]
    }

    #[test]
    fn test_every_request_round_trips_as_one_line() {
        let mut names = Vec::new();
        for request in requests() {
            let line = request.to_line();
            assert!(line.ends_with('\n'), "{line:?}");
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(Request::from_line(line.trim_end()), Ok(request.clone()));
            names.push(request.name());
        }
        names.dedup();
        assert_eq!(names, Request::NAMES);
    }

    #[test]
    fn test_every_reply_round_trips_as_one_line() {
        for reply in replies() {
            let line = reply.to_line();
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(Reply::from_line(line.trim_end()), Ok(reply.clone()));
            assert!(
                line.starts_with(&format!("{{\"reply\":\"{}\"", reply.name())),
                "{line}"
            );
        }
    }

    #[test]
    fn test_wire_spelling() {
        assert_eq!(
            Request::Status {
                format: Format::Json
            }
            .to_line(),
            "{\"request\":\"status\",\"format\":\"json\"}\n"
        );
        assert_eq!(
            Request::Unmap {
                name: "db".into(),
                force: true
            }
            .to_line(),
            "{\"request\":\"unmap\",\"name\":\"db\",\"force\":true}\n"
        );
        // Absent optional fields are left out.
        let map = Request::Map {
            volume: VolumeSpec {
                access_mode: None,
                port: None,
                ..volume()
            },
        };
        assert_eq!(
            map.to_line(),
            "{\"request\":\"map\",\"volume\":{\"name\":\"db\",\"session\":\"host\\\"1\",\
             \"device_path\":\"vol0\",\"paths\":[\"10.0.0.1\",\"ip:10.0.0.2@ip:10.0.1.1\"]}}\n"
        );
        assert_eq!(
            Reply::error("bad").to_line(),
            "{\"reply\":\"error\",\"message\":\"bad\"}\n"
        );
        // The report inside a status reply is what `status --json` prints.
        let line = Reply::Status { status: status() }.to_line();
        assert_eq!(
            line,
            format!(
                "{{\"reply\":\"status\",\"status\":{}}}\n",
                status().to_json()
            )
        );
        assert!(status()
            .to_json()
            .starts_with("{\"converged\":false,\"volumes\":[{\"name\":\"db\",\"session\":\"s\""));
    }

    #[test]
    fn test_defaults() {
        assert_eq!(
            Request::from_line("{\"request\":\"status\"}"),
            Ok(Request::Status {
                format: Format::Json
            })
        );
        assert_eq!(
            Request::from_line("{\"request\":\"unmap\",\"name\":\"x\"}"),
            Ok(Request::Unmap {
                name: "x".into(),
                force: false
            })
        );
    }

    #[test]
    fn test_lines_that_are_not_requests() {
        let malformed = [
            "",
            "status",
            "status text",
            "map \"[[volumes]]\"",
            "{",
            "[1,2]",
            "\"status\"",
            "{\"format\":\"json\"}",
            "{\"request\":3}",
            "{\"request\":\"status\"} trailing",
        ];
        for line in malformed {
            let e = Request::from_line(line).unwrap_err();
            assert!(matches!(e, RequestError::Malformed { .. }), "{line}: {e:?}");
            assert!(e.to_string().starts_with("expected one JSON object"), "{e}");
        }
        let e = Request::from_line("{\"request\":\"frobnicate\"}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "expected a request of \"status\", \"list\", \"map\", \"unmap\", \
             found unknown request \"frobnicate\""
        );
        let bad_fields = [
            ("{\"request\":\"status\",\"format\":\"xml\"}", "unknown variant `xml`"),
            ("{\"request\":\"status\",\"verbose\":true}", "unknown field `verbose`"),
            ("{\"request\":\"unmap\"}", "missing field `name`"),
            ("{\"request\":\"unmap\",\"name\":\"x\",\"force\":\"yes\"}", "expected a boolean"),
            ("{\"request\":\"map\"}", "missing field `volume`"),
            (
                "{\"request\":\"map\",\"volume\":{\"name\":\"x\",\"session\":\"s\",\"device_path\":\"v\"}}",
                "missing field `paths`",
            ),
            (
                "{\"request\":\"map\",\"volume\":{\"name\":\"x\",\"session\":\"s\",\"device_path\":\"v\",\
                 \"paths\":[],\"export\":\"nbd:tcp:127.0.0.1:1\"}}",
                "unknown field `export`",
            ),
            (
                "{\"request\":\"map\",\"volume\":{\"name\":\"x\",\"session\":\"s\",\"device_path\":\"v\",\
                 \"paths\":[],\"port\":70000}}",
                "70000",
            ),
        ];
        for (line, reason) in bad_fields {
            let e = Request::from_line(line).unwrap_err();
            assert!(matches!(e, RequestError::BadFields { .. }), "{line}: {e:?}");
            assert!(e.to_string().contains(reason), "{line}: {e}");
        }
        // A long line is quoted back only in part.
        let long = format!("{{\"request\":\"{}\"}}", "é".repeat(1000));
        let message = Request::from_line(&long).unwrap_err().to_string();
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn test_lines_that_are_not_replies() {
        for line in [
            "",
            "{\"error\":\"old style\"}",
            "{\"reply\":\"nope\"}",
            "ok",
        ] {
            let e = Reply::from_line(line).unwrap_err();
            assert!(e.starts_with("expected a JSON reply object"), "{e}");
        }
    }
}
