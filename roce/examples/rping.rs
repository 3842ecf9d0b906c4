//! `rping` over Brick's software HCA: rdma-core rping's protocol on a hosted link.
//!
//! ```text
//! cargo run -p brick-roce --example rping --features std -- server \
//!     --link frame:connect:PATH --ip 10.77.0.1/24 --mac 52:54:00:77:00:01 \
//!     [--port 7174] [--count N] [--timeout SECS] [--verbose]
//! cargo run -p brick-roce --example rping --features std -- client \
//!     --link frame:connect:PATH --ip 10.77.0.2/24 --mac 52:54:00:77:00:02 \
//!     --server 10.77.0.1 [--port 7174] [--size 64] [--count 3] [--verify] [--timeout SECS]
//! ```
//!
//! The link is a `hal` link specification (`frame:listen:PATH`,
//! `frame:connect:PATH`, `tcp:...`): Brick does ARP/IPv4/UDP itself. The
//! protocol (tests/vectors/README.md): the client SENDs its source buffer's
//! `{be64 addr, be32 rkey, be32 size}`, the server RDMA READs it and SENDs
//! "go ahead", the client SENDs its sink buffer, the server RDMA WRITEs the
//! data back and SENDs "go ahead". The server serves one client and exits
//! when it disconnects (with `--count N`, it fails unless exactly N pings
//! were served); the client disconnects (DREQ/DREP) after `--count` pings.
//! Exit status 0 on success, 1 on failure (the message says why), 2 on a
//! usage error. The prefix length of `--ip` is accepted and ignored (the peer
//! is on-link).

#[path = "rping/hosted.rs"]
mod hosted;
#[path = "rping/session.rs"]
mod session;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::str::FromStr;

use hal::hosted::{Link, LinkSpec, MonotonicClock, OsRng};
use hal::Clock;

use hosted::{new_hca, run, RngKeys};
use session::{Client, Server, Status, DEFAULT_PORT, DEFAULT_SIZE};

const USAGE: &str = "usage:
  rping server --link SPEC --ip A.B.C.D[/LEN] --mac XX:XX:XX:XX:XX:XX [--port 7174] [--count N] [--timeout SECS] [--verbose]
  rping client --link SPEC --ip A.B.C.D[/LEN] --mac XX:XX:XX:XX:XX:XX --server A.B.C.D [--port 7174] [--size 64] [--count 3] [--verify] [--timeout SECS]";

/// Parsed command line.
struct Options {
    server_mode: bool,
    link: String,
    ip: Ipv4Addr,
    mac: [u8; 6],
    server: Option<Ipv4Addr>,
    port: u16,
    size: u32,
    count: Option<u32>,
    verify: bool,
    verbose: bool,
    timeout_secs: u64,
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("bad MAC address {text:?}"));
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|_| format!("bad MAC address {text:?}"))?;
    }
    Ok(mac)
}

fn parse_ip(text: &str) -> Result<Ipv4Addr, String> {
    let address = text.split('/').next().unwrap_or(text);
    if let Some(prefix) = text.split('/').nth(1) {
        match prefix.parse::<u8>() {
            Ok(len) if len <= 32 => {}
            _ => return Err(format!("bad prefix length in {text:?}")),
        }
    }
    Ipv4Addr::from_str(address).map_err(|_| format!("bad IPv4 address {text:?}"))
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut iter = args.iter();
    let server_mode = match iter.next().map(String::as_str) {
        Some("server") => true,
        Some("client") => false,
        Some(other) => return Err(format!("unknown mode {other:?}")),
        None => return Err("missing mode (server or client)".into()),
    };
    let (mut link, mut ip, mut mac, mut server) = (None, None, None, None);
    let mut options = Options {
        server_mode,
        link: String::new(),
        ip: Ipv4Addr::UNSPECIFIED,
        mac: [0; 6],
        server: None,
        port: DEFAULT_PORT,
        size: DEFAULT_SIZE,
        count: None,
        verify: false,
        verbose: false,
        timeout_secs: if server_mode { 300 } else { 60 },
    };
    while let Some(flag) = iter.next() {
        let mut value = || {
            iter.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--link" => link = Some(value()?),
            "--ip" => ip = Some(parse_ip(&value()?)?),
            "--mac" => mac = Some(parse_mac(&value()?)?),
            "--server" if !server_mode => server = Some(parse_ip(&value()?)?),
            "--port" => {
                options.port = value()?.parse().map_err(|_| "bad --port".to_string())?;
            }
            "--size" if !server_mode => {
                options.size = value()?.parse().map_err(|_| "bad --size".to_string())?;
            }
            "--count" => {
                options.count = Some(value()?.parse().map_err(|_| "bad --count".to_string())?);
            }
            "--timeout" => {
                options.timeout_secs = value()?.parse().map_err(|_| "bad --timeout".to_string())?;
            }
            "--verify" if !server_mode => options.verify = true,
            "--verbose" | "-v" => options.verbose = true,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    options.link = link.ok_or("missing --link")?;
    options.ip = ip.ok_or("missing --ip")?;
    options.mac = mac.ok_or("missing --mac")?;
    if !server_mode {
        options.server = Some(server.ok_or("missing --server")?);
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("rping: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run_tool(&options) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("rping: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_tool(options: &Options) -> Result<String, String> {
    let spec = LinkSpec::from_str(&options.link).map_err(|e| format!("--link: {e}"))?;
    let mut link = match spec
        .open()
        .map_err(|e| format!("open {}: {e}", options.link))?
    {
        Link::Frame(link) => link.with_mac(options.mac),
        Link::Udp(_) => return Err("rping needs an Ethernet frame link (frame: or tcp:)".into()),
    };
    let mut hca = new_hca(RngKeys(OsRng), options.mac, options.ip.octets());
    let deadline = MonotonicClock::new()
        .now()
        .saturating_add(options.timeout_secs.saturating_mul(1_000_000_000));
    let mut log = |line: &str| println!("{line}");
    if options.server_mode {
        let mut server = Server::new(&mut *hca, options.port, options.verbose)?;
        println!("rping server listening on {}:{}", options.ip, options.port);
        let status = run(&mut hca, &mut link, deadline, |hca| {
            match server.step(hca, &mut log) {
                Status::Running => None,
                other => Some(other),
            }
        })
        .map_err(|e| format!("{e} after {} pings", server.pings()))?;
        match status {
            Status::Done(pings) => match options.count {
                Some(count) if count != pings => {
                    Err(format!("served {pings} pings, expected {count}"))
                }
                _ => Ok(format!("rping server: {pings} pings served, disconnected")),
            },
            Status::Failed(message) => Err(message),
            Status::Running => Err("stopped early".into()),
        }
    } else {
        let server_ip = options.server.ok_or("missing --server")?;
        let remote = SocketAddr::new(IpAddr::V4(server_ip), options.port);
        let count = options.count.unwrap_or(3);
        let mut client = Client::new(&mut *hca, remote, options.size, count, options.verify)?;
        let status = run(&mut hca, &mut link, deadline, |hca| {
            match client.step(hca, &mut log) {
                Status::Running => None,
                other => Some(other),
            }
        })
        .map_err(|e| format!("{e} after {} pings", client.pings()))?;
        match status {
            Status::Done(pings) => Ok(format!(
                "rping client: {pings} pings of {} bytes to {remote}{}, disconnected",
                options.size,
                if options.verify { ", verified" } else { "" }
            )),
            Status::Failed(message) => Err(message),
            Status::Running => Err("stopped early".into()),
        }
    }
}
