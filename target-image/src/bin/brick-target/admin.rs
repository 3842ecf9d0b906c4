//! The admin plane's HTTP side (docs/ADMIN.md): a thread serving
//! HTTP/1.1 on the manifest's `[admin]` address, one connection at a time,
//! `Connection: close`. Connections from sources the manifest does not
//! allow are closed at accept and counted. `GET /metrics` and
//! `GET /volumes/NAME/extents` are answered with a snapshot the engine
//! thread renders on request (`target_image::admin`): this thread does
//! every socket read and write, the engine never waits on it.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Duration;

use manifest::binary::{Admin, Manifest};
use target_image::admin::{json_error, AdminAnswer, AdminClient, AdminRequest};

/// Longest request head read.
const MAX_HEAD: usize = 8 << 10;
/// How long a peer may take to send its request or read the answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the engine may take to render a snapshot.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(5);

/// A volume as the admin thread knows it: name and whether it is thin.
struct VolumeName {
    name: String,
    thin: bool,
}

/// Binds the admin endpoint and starts its thread.
///
/// # Errors
/// The bind's, naming the address.
pub fn start(admin: Admin, manifest: &Manifest<'_>, client: AdminClient) -> Result<(), String> {
    let listener = TcpListener::bind(admin.address)
        .map_err(|e| format!("admin endpoint {}: bind: {e}", admin.address))?;
    let volumes: Vec<VolumeName> = manifest
        .volumes()
        .map(|v| VolumeName {
            name: v.name.to_owned(),
            thin: matches!(v.backing, manifest::binary::Backing::Thin { .. }),
        })
        .collect();
    eprintln!("brick-target: admin endpoint http://{admin}");
    std::thread::Builder::new()
        .name("brick-admin".into())
        .spawn(move || serve(&listener, &admin, &volumes, &client))
        .map_err(|e| format!("admin thread: {e}"))?;
    Ok(())
}

fn serve(listener: &TcpListener, admin: &Admin, volumes: &[VolumeName], client: &AdminClient) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("brick-target: admin accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let allowed = match peer.ip() {
            IpAddr::V4(ip) => admin.allows(ip),
            IpAddr::V6(ip) => ip.to_ipv4_mapped().is_some_and(|ip| admin.allows(ip)),
        };
        if !allowed {
            client.count_refused();
            eprintln!(
                "brick-target: admin: refused a connection from {peer} (not an admin source)"
            );
            drop(stream);
            continue;
        }
        if let Err(e) = answer(stream, volumes, client) {
            eprintln!("brick-target: admin: {peer}: {e}");
        }
    }
}

/// Reads one request and writes its answer.
fn answer(
    mut stream: TcpStream,
    volumes: &[VolumeName],
    client: &AdminClient,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return respond(&mut stream, 431, "text/plain", b"request head over 8 KiB\n");
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(()); // closed before a whole request
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, kind, body) = route(method, target, volumes, client);
    respond(&mut stream, status, kind, &body)
}

/// The status, content type and body for one request.
fn route(
    method: &str,
    target: &str,
    volumes: &[VolumeName],
    client: &AdminClient,
) -> (u16, &'static str, Vec<u8>) {
    const JSON: &str = "application/json";
    const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return (
            405,
            JSON,
            json_error(&format!("method {method} not allowed: expected GET")).into_bytes(),
        );
    }
    let request = if path == "/metrics" {
        AdminRequest::Metrics
    } else if let Some(name) = path
        .strip_prefix("/volumes/")
        .and_then(|p| p.strip_suffix("/extents"))
    {
        let Some(index) = volumes.iter().position(|v| v.name == name) else {
            let known: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
            let message = format!("no volume {name:?} (volumes: {})", known.join(", "));
            return (404, JSON, json_error(&message).into_bytes());
        };
        if !volumes[index].thin {
            let message = format!("volume {name:?} is not thin: it has no extents");
            return (422, JSON, json_error(&message).into_bytes());
        }
        AdminRequest::Extents(index)
    } else {
        let message = format!("no resource {path:?}: expected /metrics or /volumes/NAME/extents");
        return (404, JSON, json_error(&message).into_bytes());
    };
    let kind = if request == AdminRequest::Metrics {
        TEXT
    } else {
        JSON
    };
    match client.ask(request, ENGINE_TIMEOUT) {
        Some((AdminAnswer::Done, body)) => (200, kind, body),
        Some((AdminAnswer::NotThin, body)) => (422, JSON, body),
        Some((AdminAnswer::NoVolume, _)) => (404, JSON, json_error("no such volume").into_bytes()),
        Some((AdminAnswer::Overflow, _)) => (
            507,
            JSON,
            json_error("the snapshot does not fit the admin buffer").into_bytes(),
        ),
        None => (
            503,
            JSON,
            json_error("the engine did not answer in time").into_bytes(),
        ),
    }
}

fn respond(stream: &mut TcpStream, status: u16, kind: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Error",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}
