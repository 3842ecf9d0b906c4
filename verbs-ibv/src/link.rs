//! `ibv:DEVICE[:PORT]`: the command-line form of a link on an RDMA device.

use std::fmt;
use std::str::FromStr;

/// An RDMA device port named on a command line (`ibv:rxe0`, `ibv:mlx5_0:1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbvLink {
    /// The device name, as `ibv_devices` and `rdma link` print it.
    pub device: String,
    /// The port, 1 by default.
    pub port: u8,
}

impl fmt::Display for IbvLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ibv:{}:{}", self.device, self.port)
    }
}

impl FromStr for IbvLink {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let rest = spec
            .strip_prefix("ibv:")
            .ok_or_else(|| format!("link `{spec}`: expected ibv:DEVICE[:PORT]"))?;
        let (device, port) = match rest.split_once(':') {
            Some((device, port)) => {
                let port = port
                    .parse::<u8>()
                    .ok()
                    .filter(|&p| p >= 1)
                    .ok_or_else(|| format!("link `{spec}`: expected a port number 1..=255 after the device, found `{port}`"))?;
                (device, port)
            }
            None => (rest, 1),
        };
        let valid = !device.is_empty()
            && device.len() <= 64
            && device
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(format!(
                "link `{spec}`: expected an RDMA device name (letters, digits, `_`, `-`), found `{device}`"
            ));
        }
        Ok(Self {
            device: device.to_owned(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_and_port() {
        assert_eq!(
            "ibv:rxe0".parse::<IbvLink>(),
            Ok(IbvLink {
                device: "rxe0".into(),
                port: 1
            })
        );
        assert_eq!("ibv:mlx5_0:2".parse::<IbvLink>().unwrap().port, 2);
        assert_eq!(
            "ibv:mlx5_0:2".parse::<IbvLink>().unwrap().to_string(),
            "ibv:mlx5_0:2"
        );
        for bad in [
            "rxe0",
            "ibv:",
            "ibv:rxe0:0",
            "ibv:rxe0:x",
            "ibv:a/b",
            "udp:1.2.3.4",
        ] {
            assert!(bad.parse::<IbvLink>().is_err(), "{bad}");
        }
    }
}
