//! `LinkSpec`: the command-line form of a hosted link, and opening it.
//!
//! ```text
//! udp:ADDR            UDP socket on ADDR (IP, or IP:PORT; port 4791 by default)
//! frame:listen:PATH   frame link, listening on a Unix socket
//! frame:connect:PATH  frame link, connecting to a Unix socket
//! tcp:listen:ADDR     frame link, listening on IP:PORT
//! tcp:connect:ADDR    frame link, connecting to IP:PORT
//! ```
//!
//! IPv6 addresses with a port take brackets: `udp:[::1]:4791`.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use super::frame_link::{FrameEndpoint, FrameLink};
use super::link::Link;
use super::udp::{UdpNic, ROCE_V2_PORT};

const FORMS: &str =
    "udp:ADDR, frame:listen:PATH, frame:connect:PATH, tcp:listen:ADDR or tcp:connect:ADDR";

/// A parsed link specification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkSpec {
    /// `udp:ADDR`: a [`UdpNic`] bound to this address.
    Udp(SocketAddr),
    /// `frame:…` or `tcp:…`: a [`FrameLink`] on this endpoint.
    Frame(FrameEndpoint),
}

impl LinkSpec {
    /// Opens the link: binds the socket or listener, or connects.
    ///
    /// # Errors
    ///
    /// The OS error of bind or connect.
    pub fn open(&self) -> io::Result<Link> {
        match self {
            Self::Udp(addr) => UdpNic::bind(*addr).map(Link::Udp),
            Self::Frame(endpoint) => FrameLink::open(endpoint).map(Link::Frame),
        }
    }
}

/// Why a link specification did not parse. Each variant holds the whole
/// specification for the message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkSpecError {
    /// The part before the first `:` is not `udp`, `frame` or `tcp`.
    UnknownKind(String),
    /// `frame:` or `tcp:` not followed by `listen:` or `connect:`.
    UnknownMode(String),
    /// Nothing after the last `:`.
    MissingTarget(String),
    /// The address does not parse (`tcp:` needs IP:PORT).
    BadAddress(String),
}

impl fmt::Display for LinkSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKind(spec) => write!(f, "link `{spec}`: unknown kind; expected {FORMS}"),
            Self::UnknownMode(spec) => write!(
                f,
                "link `{spec}`: expected `listen:` or `connect:` after the kind"
            ),
            Self::MissingTarget(spec) => write!(f, "link `{spec}`: missing address or path"),
            Self::BadAddress(spec) => write!(
                f,
                "link `{spec}`: bad address; expected IP or IP:PORT (tcp: IP:PORT)"
            ),
        }
    }
}

impl std::error::Error for LinkSpecError {}

impl FromStr for LinkSpec {
    type Err = LinkSpecError;

    fn from_str(spec: &str) -> Result<Self, LinkSpecError> {
        let unknown_kind = || LinkSpecError::UnknownKind(spec.to_owned());
        let (kind, rest) = spec.split_once(':').ok_or_else(unknown_kind)?;
        if kind == "udp" {
            if rest.is_empty() {
                return Err(LinkSpecError::MissingTarget(spec.to_owned()));
            }
            let addr = rest
                .parse::<SocketAddr>()
                .or_else(|_| {
                    rest.parse::<IpAddr>()
                        .map(|ip| SocketAddr::new(ip, ROCE_V2_PORT))
                })
                .map_err(|_| LinkSpecError::BadAddress(spec.to_owned()))?;
            return Ok(Self::Udp(addr));
        }
        if kind != "frame" && kind != "tcp" {
            return Err(unknown_kind());
        }
        let (mode, target) = rest
            .split_once(':')
            .ok_or_else(|| LinkSpecError::UnknownMode(spec.to_owned()))?;
        let listen = match mode {
            "listen" => true,
            "connect" => false,
            _ => return Err(LinkSpecError::UnknownMode(spec.to_owned())),
        };
        if target.is_empty() {
            return Err(LinkSpecError::MissingTarget(spec.to_owned()));
        }
        let endpoint = if kind == "frame" {
            let path = PathBuf::from(target);
            if listen {
                FrameEndpoint::UnixListen(path)
            } else {
                FrameEndpoint::UnixConnect(path)
            }
        } else {
            let addr = target
                .parse()
                .map_err(|_| LinkSpecError::BadAddress(spec.to_owned()))?;
            if listen {
                FrameEndpoint::TcpListen(addr)
            } else {
                FrameEndpoint::TcpConnect(addr)
            }
        };
        Ok(Self::Frame(endpoint))
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Udp(addr) => write!(f, "udp:{addr}"),
            Self::Frame(FrameEndpoint::UnixListen(path)) => {
                write!(f, "frame:listen:{}", path.display())
            }
            Self::Frame(FrameEndpoint::UnixConnect(path)) => {
                write!(f, "frame:connect:{}", path.display())
            }
            Self::Frame(FrameEndpoint::TcpListen(addr)) => write!(f, "tcp:listen:{addr}"),
            Self::Frame(FrameEndpoint::TcpConnect(addr)) => write!(f, "tcp:connect:{addr}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<LinkSpec, LinkSpecError> {
        spec.parse()
    }

    #[test]
    fn valid_forms() {
        assert_eq!(
            parse("udp:127.0.0.2"),
            Ok(LinkSpec::Udp("127.0.0.2:4791".parse().unwrap()))
        );
        assert_eq!(
            parse("udp:127.0.0.1:5000"),
            Ok(LinkSpec::Udp("127.0.0.1:5000".parse().unwrap()))
        );
        assert_eq!(
            parse("udp:::1"),
            Ok(LinkSpec::Udp("[::1]:4791".parse().unwrap()))
        );
        assert_eq!(
            parse("udp:[::1]:9"),
            Ok(LinkSpec::Udp("[::1]:9".parse().unwrap()))
        );
        assert_eq!(
            parse("frame:listen:/tmp/a:b.sock"),
            Ok(LinkSpec::Frame(FrameEndpoint::UnixListen(
                "/tmp/a:b.sock".into()
            )))
        );
        assert_eq!(
            parse("frame:connect:x"),
            Ok(LinkSpec::Frame(FrameEndpoint::UnixConnect("x".into())))
        );
        assert_eq!(
            parse("tcp:listen:127.0.0.1:7000"),
            Ok(LinkSpec::Frame(FrameEndpoint::TcpListen(
                "127.0.0.1:7000".parse().unwrap()
            )))
        );
        assert_eq!(
            parse("tcp:connect:[::1]:7000"),
            Ok(LinkSpec::Frame(FrameEndpoint::TcpConnect(
                "[::1]:7000".parse().unwrap()
            )))
        );
    }

    #[test]
    fn display_round_trips() {
        for spec in [
            "udp:127.0.0.2:4791",
            "frame:listen:/run/brick.sock",
            "tcp:connect:127.0.0.1:1",
        ] {
            assert_eq!(parse(spec).unwrap().to_string(), spec);
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            ("", LinkSpecError::UnknownKind(String::new())),
            ("eth0", LinkSpecError::UnknownKind("eth0".into())),
            ("raw:eth0", LinkSpecError::UnknownKind("raw:eth0".into())),
            ("udp:", LinkSpecError::MissingTarget("udp:".into())),
            (
                "udp:localhost",
                LinkSpecError::BadAddress("udp:localhost".into()),
            ),
            (
                "udp:1.2.3.4:99999",
                LinkSpecError::BadAddress("udp:1.2.3.4:99999".into()),
            ),
            (
                "frame:/tmp/x",
                LinkSpecError::UnknownMode("frame:/tmp/x".into()),
            ),
            (
                "frame:bind:/tmp/x",
                LinkSpecError::UnknownMode("frame:bind:/tmp/x".into()),
            ),
            (
                "frame:listen:",
                LinkSpecError::MissingTarget("frame:listen:".into()),
            ),
            (
                "tcp:connect:127.0.0.1",
                LinkSpecError::BadAddress("tcp:connect:127.0.0.1".into()),
            ),
        ];
        for (spec, error) in cases {
            assert_eq!(parse(spec), Err(error), "{spec}");
        }
        let message = parse("raw:eth0").unwrap_err().to_string();
        assert!(
            message.contains("raw:eth0") && message.contains("frame:listen:PATH"),
            "{message}"
        );
    }
}
