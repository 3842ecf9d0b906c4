//! The framing: one request line in, one reply line out, per connection.
//!
//! The daemon answers from its poll loop ([`ControlServer::poll`]): at
//! most [`MAX_REQUESTS_PER_POLL`] connections per poll, each read and
//! written under [`IO_TIMEOUT`] and read no further than
//! [`MAX_REQUEST_LEN`] bytes, so neither a stuck nor a flooding client
//! stalls it. A line that is not a request is answered with a
//! [`Reply::Error`] saying why; a client that sends nothing at all is
//! dropped unanswered.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::message::{Reply, Request, RequestError};
use crate::{CLIENT_TIMEOUT, IO_TIMEOUT, MAX_REPLY_LEN, MAX_REQUESTS_PER_POLL, MAX_REQUEST_LEN};

/// The listening side.
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlServer {
    /// Listens at `path`, replacing a stale socket file. The socket file is
    /// removed when the server is dropped.
    ///
    /// # Errors
    ///
    /// `AddrInUse` if another daemon answers at `path`; otherwise as
    /// `bind(2)`.
    pub fn bind(path: &Path) -> io::Result<Self> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another brick-initiatord answers on {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            path: path.to_owned(),
        })
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers the waiting connections (at most [`MAX_REQUESTS_PER_POLL`]):
    /// `answer` turns each request into its reply; lines that are not
    /// requests are answered here. Returns how many connections were
    /// taken. A client that misbehaves (too slow, gone) is dropped, never
    /// an error.
    pub fn poll(&self, answer: &mut dyn FnMut(Request) -> Reply) -> usize {
        let mut taken = 0;
        while taken < MAX_REQUESTS_PER_POLL {
            let Ok((stream, _)) = self.listener.accept() else {
                break; // WouldBlock: nobody waiting (or a transient error)
            };
            taken += 1;
            let _ = serve(stream, answer);
        }
        taken
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(stream: UnixStream, answer: &mut dyn FnMut(Request) -> Reply) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = Vec::new();
    BufReader::new((&stream).take(MAX_REQUEST_LEN)).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(()); // nothing asked (e.g. a second daemon's probe in `bind`)
    }
    let reply = match decode_request(&line) {
        Ok(request) => answer(request),
        Err(e) => Reply::error(e.to_string()),
    };
    (&stream).write_all(reply.to_line().as_bytes())
}

/// Decodes the bytes a client sent: one request line, its newline
/// included unless the client closed its side right after the request.
///
/// # Errors
///
/// [`RequestError::TooLong`] if `line` is [`MAX_REQUEST_LEN`] bytes or
/// more without a newline; [`RequestError::NotUtf8`]; otherwise as
/// [`Request::from_line`].
pub fn decode_request(line: &[u8]) -> Result<Request, RequestError> {
    let text = match line.strip_suffix(b"\n") {
        Some(text) => text,
        None if line.len() as u64 >= MAX_REQUEST_LEN => {
            return Err(RequestError::TooLong {
                limit: MAX_REQUEST_LEN,
            })
        }
        None => line,
    };
    let text = std::str::from_utf8(text).map_err(|e| RequestError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    Request::from_line(text.strip_suffix('\r').unwrap_or(text))
}

/// Sends `request` to the daemon at `socket` and returns its reply (a
/// refusal is [`Reply::Error`], not an `Err`).
///
/// # Errors
///
/// The daemon is not running (`NotFound`, `ConnectionRefused`), did not
/// answer within [`CLIENT_TIMEOUT`], or answered with something that is
/// not a reply line (`InvalidData`, `UnexpectedEof`).
pub fn request(socket: &Path, request: &Request) -> io::Result<Reply> {
    let line = request.to_line();
    if line.len() as u64 > MAX_REQUEST_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "expected a request of at most {MAX_REQUEST_LEN} bytes (the daemon reads no more), \
                 found {} bytes",
                line.len()
            ),
        ));
    }
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    stream.write_all(line.as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    read_reply(&stream)
}

/// Reads one reply line from `stream`.
fn read_reply(stream: &UnixStream) -> io::Result<Reply> {
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_REPLY_LEN)).read_until(b'\n', &mut line)?;
    let Some(text) = line.strip_suffix(b"\n") else {
        return Err(if line.is_empty() {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "expected a reply line, found the connection closed without one",
            )
        } else {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "expected a reply line of at most {MAX_REPLY_LEN} bytes ending in a newline, \
                     found {} bytes without one",
                    line.len()
                ),
            )
        });
    };
    let text = String::from_utf8_lossy(text);
    Reply::from_line(&text).map_err(|message| io::Error::new(io::ErrorKind::InvalidData, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Format;
    use std::time::Duration;

    fn socket_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("brick-control-{tag}-{}.sock", std::process::id()))
    }

    /// Serves `server` (answering `status` with a text reply, refusing the
    /// rest) until `client` finishes; returns the client's result.
    fn serve_until<T: Send + 'static>(
        server: &ControlServer,
        client: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let client = std::thread::spawn(client);
        while !client.is_finished() {
            server.poll(&mut |request| match request {
                Request::Status { format } => Reply::Text {
                    text: format!("status as {format:?}"),
                },
                other => Reply::error(format!("not here: {}", other.name())),
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        client.join().unwrap()
    }

    /// Sends raw `bytes` (ignoring a write the server cut short) and
    /// returns the reply line.
    fn raw(path: &Path, bytes: Vec<u8>) -> String {
        let mut stream = UnixStream::connect(path).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        // One line: after it, a server that did not read everything may
        // have reset the connection.
        let mut reply = String::new();
        let _ = BufReader::new(&stream).read_line(&mut reply);
        reply
    }

    #[test]
    fn test_request_and_answer() {
        let path = socket_path("answer");
        let server = ControlServer::bind(&path).unwrap();
        assert_eq!(server.path(), path);
        // A second daemon is refused while the first answers.
        assert_eq!(
            ControlServer::bind(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let client_path = path.clone();
        let (status, unmap) = serve_until(&server, move || {
            (
                request(
                    &client_path,
                    &Request::Status {
                        format: Format::Text,
                    },
                )
                .unwrap(),
                request(
                    &client_path,
                    &Request::Unmap {
                        name: "x".into(),
                        force: false,
                    },
                )
                .unwrap(),
            )
        });
        assert_eq!(
            status,
            Reply::Text {
                text: "status as Text".into()
            }
        );
        assert_eq!(unmap, Reply::error("not here: unmap"));
        drop(server);
        assert!(!path.exists());
    }

    #[test]
    fn test_lines_that_are_not_requests_get_an_error_reply() {
        let path = socket_path("bad");
        let server = ControlServer::bind(&path).unwrap();
        let client_path = path.clone();
        let replies = serve_until(&server, move || {
            let mut long = b"{\"request\":\"status\",\"format\":\"".to_vec();
            long.resize(2 * MAX_REQUEST_LEN as usize, b'x');
            long.extend_from_slice(b"\"}\n");
            [
                b"status\n".to_vec(),
                b"{\"request\":\"status\"\n".to_vec(),
                b"{\"request\":\"frobnicate\"}\n".to_vec(),
                b"{\"request\":\"unmap\"}\n".to_vec(),
                b"\xff\xfe\n".to_vec(),
                long,
                // No newline, but the client closed its side: still a request.
                b"{\"request\":\"status\"}".to_vec(),
            ]
            .map(|bytes| raw(&client_path, bytes))
        });
        let expected = [
            "expected one JSON object per line",
            "expected one JSON object per line",
            "found unknown request \\\"frobnicate\\\"",
            "request \\\"unmap\\\": missing field `name`",
            "expected a UTF-8 request line",
            "expected a request line of at most 65536 bytes",
        ];
        for (reply, expected) in replies.iter().zip(expected) {
            assert!(
                reply.starts_with("{\"reply\":\"error\",\"message\":\"")
                    && reply.contains(expected),
                "{expected}: {reply}"
            );
            assert!(matches!(
                Reply::from_line(reply.trim_end()),
                Ok(Reply::Error { .. })
            ));
        }
        assert_eq!(
            replies[6],
            "{\"reply\":\"text\",\"text\":\"status as Json\"}\n"
        );
        // The server is still there.
        let client_path = path.clone();
        let again = serve_until(&server, move || {
            request(
                &client_path,
                &Request::Status {
                    format: Format::Json,
                },
            )
            .unwrap()
        });
        assert!(matches!(again, Reply::Text { .. }));
    }

    #[test]
    fn test_client_errors() {
        // Nobody listening.
        let path = socket_path("none");
        let _ = std::fs::remove_file(&path);
        let e = request(
            &path,
            &Request::Status {
                format: Format::Json,
            },
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);

        // A request the daemon would not read is not sent.
        let huge = Request::Unmap {
            name: "x".repeat(MAX_REQUEST_LEN as usize),
            force: false,
        };
        let e = request(&path, &huge).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("at most 65536 bytes"), "{e}");

        // Something that answers, but not with a reply.
        let listener = UnixListener::bind(&path).unwrap();
        let answers: [&[u8]; 3] = [b"", b"{\"error\":\"old\"}\n", b"{\"reply\":\"text\""];
        let server = std::thread::spawn(move || {
            for answer in answers {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = String::new();
                BufReader::new(&stream).read_line(&mut request).unwrap();
                stream.write_all(answer).unwrap();
            }
        });
        let kinds: Vec<(io::ErrorKind, String)> = (0..3)
            .map(|_| {
                let e = request(
                    &path,
                    &Request::Status {
                        format: Format::Json,
                    },
                )
                .unwrap_err();
                (e.kind(), e.to_string())
            })
            .collect();
        server.join().unwrap();
        assert_eq!(kinds[0].0, io::ErrorKind::UnexpectedEof, "{kinds:?}");
        assert_eq!(kinds[1].0, io::ErrorKind::InvalidData, "{kinds:?}");
        assert!(
            kinds[1].1.starts_with("expected a JSON reply object"),
            "{kinds:?}"
        );
        assert_eq!(kinds[2].0, io::ErrorKind::InvalidData, "{kinds:?}");
        assert!(kinds[2].1.contains("without one"), "{kinds:?}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn test_decode_request_limits() {
        let exactly = {
            let mut line = b"{\"request\":\"unmap\",\"name\":\"".to_vec();
            line.resize(MAX_REQUEST_LEN as usize - 3, b'a');
            line.extend_from_slice(b"\"}\n");
            line
        };
        assert_eq!(exactly.len() as u64, MAX_REQUEST_LEN);
        assert!(matches!(
            decode_request(&exactly),
            Ok(Request::Unmap { .. })
        ));
        // As long, without the newline: the line goes on past the limit.
        let mut cut = exactly.clone();
        cut.pop();
        cut.push(b' ');
        assert_eq!(
            decode_request(&cut),
            Err(RequestError::TooLong {
                limit: MAX_REQUEST_LEN
            })
        );
        assert_eq!(
            decode_request(b"{\"request\":\"list\"}\r\n"),
            Ok(Request::List {
                format: Format::Json
            })
        );
    }
}
