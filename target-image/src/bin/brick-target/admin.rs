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
use target_image::admin::{AdminClient, AdminRequest};
use target_image::admin_http::{
    parse_head, rendered, route, write_response_head, AdminVolumes, ErrorAnswer, Head, JSON_TYPE,
};

/// How long a peer may take to send its request or read the answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the engine may take to render a snapshot.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(5);

/// The volumes as the admin thread knows them: name and whether thin.
struct Volumes(Vec<(String, bool)>);

impl AdminVolumes for Volumes {
    fn admin_volume(&self, index: usize) -> Option<(&str, bool)> {
        self.0.get(index).map(|(name, thin)| (name.as_str(), *thin))
    }
}

/// Binds the admin endpoint and starts its thread.
///
/// # Errors
/// The bind's, naming the address.
pub fn start(admin: Admin, manifest: &Manifest<'_>, client: AdminClient) -> Result<(), String> {
    let listener = TcpListener::bind(admin.address)
        .map_err(|e| format!("admin endpoint {}: bind: {e}", admin.address))?;
    let volumes = Volumes(
        (0..manifest.volume_count())
            .filter_map(|index| manifest.admin_volume(index))
            .map(|(name, thin)| (name.to_owned(), thin))
            .collect(),
    );
    eprintln!("brick-target: admin endpoint http://{admin}");
    std::thread::Builder::new()
        .name("brick-admin".into())
        .spawn(move || serve(&listener, &admin, &volumes, &client))
        .map_err(|e| format!("admin thread: {e}"))?;
    Ok(())
}

fn serve(listener: &TcpListener, admin: &Admin, volumes: &Volumes, client: &AdminClient) {
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
fn answer(mut stream: TcpStream, volumes: &Volumes, client: &AdminClient) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        match parse_head(&head) {
            Head::Incomplete => {}
            Head::Request { method, target } => {
                return match route(method, target, volumes) {
                    Ok(request) => ask(&mut stream, request, client),
                    Err(error) => respond_error(&mut stream, &error),
                };
            }
            Head::Refused(error) => return respond_error(&mut stream, &error),
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(()); // closed before a whole request
        }
        head.extend_from_slice(&buf[..n]);
    }
}

/// Asks the engine for `request`'s snapshot and writes it (or the error
/// that replaces it).
fn ask(stream: &mut TcpStream, request: AdminRequest, client: &AdminClient) -> std::io::Result<()> {
    let Some((answer, body)) = client.ask(request, ENGINE_TIMEOUT) else {
        return respond_error(stream, &ErrorAnswer::timeout());
    };
    match rendered(request, answer) {
        Ok((status, kind)) => respond(stream, status, kind, &body),
        Err(error) => respond_error(stream, &error),
    }
}

fn respond_error(stream: &mut TcpStream, error: &ErrorAnswer<'_>) -> std::io::Result<()> {
    let body = error.to_string();
    respond(stream, error.status(), JSON_TYPE, body.as_bytes())
}

fn respond(stream: &mut TcpStream, status: u16, kind: &str, body: &[u8]) -> std::io::Result<()> {
    let mut head = String::new();
    write_response_head(&mut head, status, kind, body.len())
        .map_err(|_| std::io::Error::other("formatting the response head"))?;
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
