//! The connection options shared by `brick io` and `brick bench`.
//!
//! One RTRS path per `--target`, all over the one `--link`; the session
//! name is what the target's access list matches, the volume is a
//! `device_path` of the target's manifest.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use initiator::hosted::{Error, Session, SessionLink, SessionSpec, Volume};
use initiator::AccessMode;

/// The RDMA CM port a `--target` without one uses (the manifest default).
pub const DEFAULT_RTRS_PORT: u16 = 1234;
/// Most `--target`s: the hosted HCA has 32 queue pairs and every path
/// takes `connections_per_path` (3) of them.
pub const MAX_TARGETS: usize = 8;

/// Where and how to connect.
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// The target's RTRS address, ADDR[:PORT] (port default 1234); give it
    /// once per path, up to 8.
    #[arg(long = "target", value_name = "ADDR[:PORT]", required = true, value_parser = parse_target)]
    pub targets: Vec<SocketAddr>,
    /// The link to open: udp:IP:PORT (a UDP socket; the target's
    /// `--link udp:` must use the same PORT on another IP, e.g.
    /// udp:127.0.0.2:4791 for a target on udp:127.0.0.1:4791),
    /// frame:connect:PATH or frame:listen:PATH (Ethernet frames over a
    /// QEMU stream socket), or ibv:DEVICE[:PORT] (an RDMA device holding
    /// the --local address: a ConnectX, or Linux rxe).
    #[arg(long, value_name = "SPEC")]
    pub link: SessionLink,
    /// Our IPv4 address and prefix on a frame link or RDMA device (UDP
    /// links use the socket's address).
    #[arg(long, value_name = "IP/PREFIX", default_value = "10.77.0.2/24")]
    pub local: LocalAddress,
    /// IP MTU of a udp: or frame: link (576..=9000, as the target's
    /// manifest interface): the path MTU asked for is the largest that
    /// fits, 1024 at 1500, 4096 at 9000. An ibv: device keeps its own.
    #[arg(long, value_name = "BYTES", default_value_t = 1500,
          value_parser = clap::value_parser!(u16).range(576..=9000))]
    pub mtu: u16,
    /// Busy polling on a udp: or frame: link: keep polling this many
    /// microseconds after the last work before sleeping (for a client
    /// that gives the session a core; 0, the default, never spins).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    pub poll_us: u32,
    /// Our MAC on a frame link.
    #[arg(long, value_name = "MAC", default_value = "52:54:00:77:00:02", value_parser = parse_mac)]
    pub mac: [u8; 6],
    /// RTRS session name (the target's access list matches it).
    #[arg(long, value_name = "NAME")]
    pub session: String,
    /// The volume's device_path on the target.
    #[arg(long, value_name = "PATH")]
    pub volume: String,
    /// Map the volume read-only.
    #[arg(long)]
    pub ro: bool,
    /// Seconds to wait for the session to come up.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub connect_timeout: f64,
}

/// `IP/PREFIX` of `--local`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAddress {
    /// The address.
    pub ip: Ipv4Addr,
    /// The prefix length (0..=32). The HCA resolves every peer with ARP,
    /// so only the address is used; the prefix is checked and shown.
    pub prefix: u8,
}

impl FromStr for LocalAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected IPv4/PREFIX like 10.77.0.2/24";
        let (ip, prefix) = text.split_once('/').unwrap_or((text, "32"));
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("{expected}, found {text:?} (bad address)"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("{expected}, found {text:?} (prefix must be 0..=32)"))?;
        Ok(Self { ip, prefix })
    }
}

impl fmt::Display for LocalAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

/// `ADDR[:PORT]`, IPv4 only (the software HCA speaks RoCEv2 over IPv4).
pub fn parse_target(text: &str) -> Result<SocketAddr, String> {
    let address = text
        .parse::<SocketAddr>()
        .or_else(|_| {
            text.parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, DEFAULT_RTRS_PORT))
        })
        .map_err(|_| format!("expected ADDR[:PORT] like 10.77.0.1:1234, found {text:?}"))?;
    if !address.is_ipv4() {
        return Err(format!("expected an IPv4 address, found {text:?}"));
    }
    Ok(address)
}

/// `52:54:00:77:00:02` (also `-` separated).
pub fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let bad = || format!("expected a MAC like 52:54:00:77:00:02, found {text:?}");
    let mut mac = [0u8; 6];
    let mut parts = text.split([':', '-']);
    for byte in &mut mac {
        let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

impl ConnectArgs {
    /// The session spec: paths, link, local addresses and `config`
    /// adjustments (`queue_depth`, `max_transfer`) by the caller.
    pub fn spec(&self, queue_depth: u16, max_transfer: u32) -> Result<SessionSpec> {
        let mut spec = SessionSpec::new(&self.session, self.link.clone(), self.targets.clone());
        spec.local_ip = self.local.ip;
        spec.local_mac = self.mac;
        spec.mtu = usize::from(self.mtu);
        spec.poll = Duration::from_micros(u64::from(self.poll_us));
        spec.config.queue_depth = queue_depth;
        spec.config.max_transfer = max_transfer;
        let paths = self.targets.len();
        if paths > MAX_TARGETS {
            bail!("{paths} --target given; expected at most {MAX_TARGETS}");
        }
        spec.config.rtrs.max_paths = spec.config.rtrs.max_paths.max(paths as u16);
        if !(self.connect_timeout.is_finite() && self.connect_timeout > 0.0) {
            bail!(
                "--connect-timeout {}: expected a positive number of seconds",
                self.connect_timeout
            );
        }
        spec.connect_timeout = Duration::from_secs_f64(self.connect_timeout);
        Ok(spec)
    }

    /// The access mode `--ro` asks for.
    pub fn mode(&self) -> AccessMode {
        if self.ro {
            AccessMode::ReadOnly
        } else {
            AccessMode::ReadWrite
        }
    }

    /// Connects and opens the volume; errors say which step failed.
    pub fn open(&self, spec: &SessionSpec) -> Result<(Session, Volume)> {
        let paths: Vec<String> = self.targets.iter().map(|t| t.to_string()).collect();
        let session = Session::connect(spec)
            .map_err(|error| {
                let hint = if matches!(error, Error::ConnectTimeout { .. }) {
                    "\nhint: is brick-target serving these addresses, with its `--link udp:` on the same port? \
                     A session of the same name still open on the target (say, of a killed brick) \
                     holds the name until the target's heartbeat timeout."
                } else {
                    ""
                };
                anyhow::anyhow!(
                    "session {:?} to {} over {}: {error}{hint}",
                    self.session,
                    paths.join(", "),
                    self.link
                )
            })?;
        let mode = self.mode();
        match session.open(&self.volume, mode) {
            Ok(volume) => Ok((session, volume)),
            Err(error) => {
                // Free the session name on the target at once (see `finish`).
                let _ = session.close();
                Err(anyhow::Error::new(error).context(format!(
                    "open volume {:?} {} in session {:?}",
                    self.volume,
                    mode_name(mode),
                    self.session
                )))
            }
        }
    }
}

/// Closes `volume` and `session` after the work that gave `result`.
///
/// Runs on failure too: a session left open keeps its name busy on the
/// target until the target's heartbeat timeout (tens of seconds), so the
/// next run under the same name could not connect. After a failure the
/// close errors are dropped and the work's error is returned.
///
/// # Errors
///
/// The work's error, else a close failure.
pub fn finish<T>(session: Session, volume: Volume, result: Result<T>) -> Result<T> {
    let volume_closed = volume.close().context("close the volume");
    let session_closed = session.close().context("close the session");
    let value = result?;
    volume_closed?;
    session_closed?;
    Ok(value)
}

/// `read-only` / `read-write`.
pub fn mode_name(mode: AccessMode) -> &'static str {
    match mode {
        AccessMode::ReadOnly => "read-only",
        _ => "read-write",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets_macs_and_local() {
        assert_eq!(
            parse_target("127.0.0.1").unwrap(),
            "127.0.0.1:1234".parse().unwrap()
        );
        assert_eq!(
            parse_target("10.0.0.1:99").unwrap(),
            "10.0.0.1:99".parse().unwrap()
        );
        assert!(parse_target("[::1]:1234").is_err());
        assert!(parse_target("host").is_err());
        assert_eq!(
            parse_mac("52:54:00:77:00:02").unwrap(),
            [0x52, 0x54, 0, 0x77, 0, 2]
        );
        assert!(parse_mac("52:54:00:77:00").is_err());
        assert!(parse_mac("52:54:00:77:00:02:03").is_err());
        assert!(parse_mac("5:54:00:77:00:02").is_err());
        let local: LocalAddress = "10.77.0.2/24".parse().unwrap();
        assert_eq!(local.to_string(), "10.77.0.2/24");
        assert!("10.77.0.2/33".parse::<LocalAddress>().is_err());
        assert!("nope/24".parse::<LocalAddress>().is_err());
    }
}
