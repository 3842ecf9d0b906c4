//! The admin endpoint's HTTP (docs/ADMIN.md), shared by the hosted
//! target (std TCP on its admin thread) and the image (TCP over smoltcp,
//! `admin_tcp`): reading a request head, routing it to a snapshot the
//! engine renders or to an error answered from the manifest alone, and
//! framing the answer. HTTP/1.1, `GET` only, `Connection: close`.
//!
//! Nothing here allocates: error bodies are written through
//! [`core::fmt`] into whatever buffer the caller has.

use core::fmt::{self, Write};

use manifest::binary::{Backing, Manifest};

use crate::admin_render::{AdminAnswer, AdminRequest, Json};

/// Longest request head accepted (the request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// The content type of `/metrics`: the Prometheus text format.
pub const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of extent lists and errors.
pub const JSON_TYPE: &str = "application/json";

/// What the bytes received so far hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head<'a> {
    /// No blank line yet: read more.
    Incomplete,
    /// A whole head: its method and request target.
    Request {
        /// `GET`, ...
        method: &'a str,
        /// `/metrics`, ...
        target: &'a str,
    },
    /// An answer without a request: the head is over [`MAX_HEAD`] or its
    /// request line is not text.
    Refused(ErrorAnswer<'a>),
}

/// Reads the request head at the start of `received`.
pub fn parse_head(received: &[u8]) -> Head<'_> {
    let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if received.len() > MAX_HEAD {
            Head::Refused(ErrorAnswer::new(431, Why::HeadTooLarge))
        } else {
            Head::Incomplete
        };
    };
    if end > MAX_HEAD {
        return Head::Refused(ErrorAnswer::new(431, Why::HeadTooLarge));
    }
    let line = received[..end]
        .split(|&b| b == b'\r')
        .next()
        .unwrap_or_default();
    let Ok(line) = core::str::from_utf8(line) else {
        return Head::Refused(ErrorAnswer::new(400, Why::Malformed));
    };
    let mut parts = line.split(' ');
    Head::Request {
        method: parts.next().unwrap_or(""),
        target: parts.next().unwrap_or(""),
    }
}

/// The volumes the router knows: name and whether each is thin.
pub trait AdminVolumes {
    /// Volume `index`'s name and whether it is thin; `None` past the end.
    fn admin_volume(&self, index: usize) -> Option<(&str, bool)>;
}

impl AdminVolumes for Manifest<'_> {
    fn admin_volume(&self, index: usize) -> Option<(&str, bool)> {
        self.volume(index)
            .map(|v| (v.name, matches!(v.backing, Backing::Thin { .. })))
    }
}

/// Why a request gets an error.
#[derive(Clone, Copy)]
enum Why<'a> {
    Malformed,
    HeadTooLarge,
    Method(&'a str),
    NoResource(&'a str),
    NoVolume(&'a str, &'a dyn AdminVolumes),
    NotThin(&'a str),
    EngineNoVolume,
    Overflow,
    Timeout,
}

/// An error answer: its status and a JSON body `{"error":"..."}`
/// ([`Display`](fmt::Display) writes the body).
#[derive(Clone, Copy)]
pub struct ErrorAnswer<'a> {
    status: u16,
    why: Why<'a>,
}

impl fmt::Debug for ErrorAnswer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {self}", self.status)
    }
}

impl PartialEq for ErrorAnswer<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status
    }
}

impl Eq for ErrorAnswer<'_> {}

impl<'a> ErrorAnswer<'a> {
    const fn new(status: u16, why: Why<'a>) -> Self {
        Self { status, why }
    }

    /// The engine did not render in time (503).
    pub const fn timeout() -> ErrorAnswer<'static> {
        ErrorAnswer::new(503, Why::Timeout)
    }

    /// Volume `name` is not thin (422).
    pub(crate) const fn not_thin(name: &'a str) -> Self {
        ErrorAnswer::new(422, Why::NotThin(name))
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }
}

impl fmt::Display for ErrorAnswer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{\"error\":\"")?;
        let mut out = JsonWriter(f);
        match self.why {
            Why::Malformed => out.write_str("the request line is not text"),
            Why::HeadTooLarge => write!(out, "request head over {} KiB", MAX_HEAD >> 10),
            Why::Method(method) => write!(out, "method {method} not allowed: expected GET"),
            Why::NoResource(path) => write!(
                out,
                "no resource {path:?}: expected /metrics or /volumes/NAME/extents"
            ),
            Why::NoVolume(name, volumes) => {
                write!(out, "no volume {name:?} (volumes: ")?;
                let mut index = 0;
                while let Some((known, _)) = volumes.admin_volume(index) {
                    let comma = if index == 0 { "" } else { ", " };
                    write!(out, "{comma}{known}")?;
                    index += 1;
                }
                out.write_str(")")
            }
            Why::NotThin(name) => write!(out, "volume {name:?} is not thin: it has no extents"),
            Why::EngineNoVolume => out.write_str("no such volume"),
            Why::Overflow => out.write_str("the snapshot does not fit the admin buffer"),
            Why::Timeout => out.write_str("the engine did not answer in time"),
        }?;
        f.write_str("\"}")
    }
}

/// Escapes what is written through it as the contents of a JSON string.
struct JsonWriter<'f, 'g>(&'f mut fmt::Formatter<'g>);

impl Write for JsonWriter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write!(self.0, "{}", Json(s))
    }
}

/// Routes a request: the snapshot to ask the engine for, or the error
/// answered from the volume table alone (405, 404, 422).
///
/// # Errors
/// The error answer.
pub fn route<'a>(
    method: &'a str,
    target: &'a str,
    volumes: &'a dyn AdminVolumes,
) -> Result<AdminRequest, ErrorAnswer<'a>> {
    if method != "GET" {
        return Err(ErrorAnswer::new(405, Why::Method(method)));
    }
    let path = target.split('?').next().unwrap_or("");
    if path == "/metrics" {
        return Ok(AdminRequest::Metrics);
    }
    let Some(name) = path
        .strip_prefix("/volumes/")
        .and_then(|p| p.strip_suffix("/extents"))
    else {
        return Err(ErrorAnswer::new(404, Why::NoResource(path)));
    };
    let mut index = 0;
    while let Some((known, thin)) = volumes.admin_volume(index) {
        if known == name {
            return if thin {
                Ok(AdminRequest::Extents(index))
            } else {
                Err(ErrorAnswer::new(422, Why::NotThin(name)))
            };
        }
        index += 1;
    }
    Err(ErrorAnswer::new(404, Why::NoVolume(name, volumes)))
}

/// The status and content type of the engine's rendered body for
/// `request`, or the error that replaces it (the volume vanished: 404; it
/// did not fit: 507). A `NotThin` body is the engine's own JSON error.
///
/// # Errors
/// The error answer.
pub fn rendered(
    request: AdminRequest,
    answer: AdminAnswer,
) -> Result<(u16, &'static str), ErrorAnswer<'static>> {
    match answer {
        AdminAnswer::Done if request == AdminRequest::Metrics => Ok((200, METRICS_TYPE)),
        AdminAnswer::Done => Ok((200, JSON_TYPE)),
        AdminAnswer::NotThin => Ok((422, JSON_TYPE)),
        AdminAnswer::NoVolume => Err(ErrorAnswer::new(404, Why::EngineNoVolume)),
        AdminAnswer::Overflow => Err(ErrorAnswer::new(507, Why::Overflow)),
    }
}

/// The reason phrase of `status`.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Error",
    }
}

/// Writes the status line and headers of an answer with a body of
/// `body_len` bytes.
///
/// # Errors
/// `out`'s.
pub fn write_response_head(
    out: &mut dyn Write,
    status: u16,
    content_type: &str,
    body_len: usize,
) -> fmt::Result {
    write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {body_len}\r\n\
         Connection: close\r\n\r\n",
        reason(status)
    )
}

/// Bytes an [`ErrorAnswer`]'s body takes (to frame it before writing it).
pub fn body_len(body: &dyn fmt::Display) -> usize {
    struct Count(usize);
    impl Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = write!(count, "{body}");
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::{String, ToString};

    struct Volumes(&'static [(&'static str, bool)]);

    impl AdminVolumes for Volumes {
        fn admin_volume(&self, index: usize) -> Option<(&str, bool)> {
            self.0.get(index).copied()
        }
    }

    const VOLUMES: Volumes = Volumes(&[("vol0", false), ("thin0", true)]);

    #[test]
    fn heads_are_read_whole_or_refused() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
            Head::Incomplete
        );
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Head::Request {
                method: "GET",
                target: "/metrics"
            }
        );
        let long = [b'a'; MAX_HEAD + 1];
        assert!(matches!(parse_head(&long), Head::Refused(e) if e.status() == 431));
        assert!(
            matches!(parse_head(b"\xff\xfe / HTTP/1.1\r\n\r\n"), Head::Refused(e) if e.status() == 400)
        );
    }

    #[test]
    fn routes_and_errors_match_the_documented_answers() {
        assert_eq!(
            route("GET", "/metrics?x=1", &VOLUMES),
            Ok(AdminRequest::Metrics)
        );
        assert_eq!(
            route("GET", "/volumes/thin0/extents", &VOLUMES),
            Ok(AdminRequest::Extents(1))
        );
        let error = |method, target| route(method, target, &VOLUMES).unwrap_err();
        let e = error("GET", "/volumes/vol0/extents");
        assert_eq!(e.status(), 422);
        assert_eq!(
            e.to_string(),
            r#"{"error":"volume \"vol0\" is not thin: it has no extents"}"#
        );
        let e = error("GET", "/volumes/x/extents");
        assert_eq!(e.status(), 404);
        assert_eq!(
            e.to_string(),
            r#"{"error":"no volume \"x\" (volumes: vol0, thin0)"}"#
        );
        assert_eq!(error("POST", "/metrics").status(), 405);
        assert_eq!(error("GET", "/").status(), 404);
    }

    #[test]
    fn answers_are_framed_with_their_length() {
        let e = ErrorAnswer::timeout();
        let mut head = String::new();
        write_response_head(&mut head, e.status(), JSON_TYPE, body_len(&e)).unwrap();
        assert_eq!(
            head,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
             Content-Length: 45\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(e.to_string().len(), 45);
        assert_eq!(
            rendered(AdminRequest::Extents(0), AdminAnswer::Overflow).map_err(|e| e.status()),
            Err(507)
        );
        assert_eq!(
            rendered(AdminRequest::Metrics, AdminAnswer::Done),
            Ok((200, METRICS_TYPE))
        );
    }
}
