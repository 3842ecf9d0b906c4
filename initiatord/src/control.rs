//! The control socket: one request line in, one answer line out.
//!
//! The daemon listens on a unix socket ([`DEFAULT_SOCKET`]) and answers,
//! from its poll loop, at most [`MAX_REQUESTS_PER_POLL`] requests per poll,
//! each with short timeouts so a stuck client cannot stall the daemon.
//! The requests and their replies are the daemon's
//! ([`crate::daemon::Daemon::answer`]): `status`, `list`, `map`, `unmap`.
//! `brick status|list|map|unmap` and `brick-initiatord status` are clients
//! ([`request`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the daemon listens unless `--socket` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/brick-initiatord.sock";
/// Requests answered per poll (bounded work, STYLE.md §2).
pub const MAX_REQUESTS_PER_POLL: usize = 8;
/// Longest request line read: a `map` of a volume with the most paths
/// (128) fits many times over.
pub const MAX_REQUEST_LEN: u64 = 64 * 1024;
/// Read/write timeout on an accepted connection.
pub const IO_TIMEOUT: Duration = Duration::from_millis(200);

/// The listening side.
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlServer {
    /// Listens at `path`, replacing a stale socket file.
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

    /// Answers the waiting requests (at most [`MAX_REQUESTS_PER_POLL`]);
    /// `answer` maps a request line to the reply. Returns how many were
    /// answered. A client that misbehaves is dropped, never an error.
    pub fn poll(&self, answer: &mut dyn FnMut(&str) -> String) -> usize {
        let mut answered = 0;
        while answered < MAX_REQUESTS_PER_POLL {
            let Ok((stream, _)) = self.listener.accept() else {
                break; // WouldBlock: nobody waiting (or a transient error)
            };
            answered += 1;
            let _ = serve(stream, answer);
        }
        answered
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(stream: UnixStream, answer: &mut dyn FnMut(&str) -> String) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST_LEN)).read_line(&mut line)?;
    let mut reply = answer(line.trim());
    reply.push('\n');
    (&stream).write_all(reply.as_bytes())
}

/// Sends `request` to the daemon at `socket` and returns its reply.
///
/// # Errors
///
/// The daemon is not running (`NotFound`, `ConnectionRefused`) or did not
/// answer in time.
pub fn request(socket: &Path, request: &str) -> io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_request_and_answer() {
        let path =
            std::env::temp_dir().join(format!("brick-initiatord-ctl-{}.sock", std::process::id()));
        let server = ControlServer::bind(&path).unwrap();
        // A second daemon is refused while the first answers.
        assert_eq!(
            ControlServer::bind(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let client_path = path.clone();
        let client = std::thread::spawn(move || {
            (
                request(&client_path, "status").unwrap(),
                request(&client_path, "bogus").unwrap(),
            )
        });
        // (The refused bind's probe connection is accepted too: it reads
        // nothing and is answered into the void.)
        while !client.is_finished() {
            server.poll(&mut |line| match line {
                "status" => "{\"converged\":true}".into(),
                other => format!("unknown {other}"),
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        let (status, bogus) = client.join().unwrap();
        assert_eq!(status, "{\"converged\":true}\n");
        assert_eq!(bogus, "unknown bogus\n");
        drop(server);
        assert!(!path.exists());
    }
}
