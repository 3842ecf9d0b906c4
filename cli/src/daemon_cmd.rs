//! `brick status | list | map | unmap`: requests to the running
//! `brick-initiatord` over its control socket.
//!
//! Each command is one typed request of the `control` crate, one JSON
//! object per line each way; what is printed comes from the typed reply
//! (`--json`: the report or the entries as one line of JSON, the format
//! scripts parse; otherwise the daemon's table).
//!
//! `map` sends one volume with the fields of a `[[volumes]]` entry of the
//! daemon's config file, taken from the flags (or read from `--file`, a
//! TOML file holding one such entry); the daemon checks it with the config
//! file's rules, maps it at once and keeps it until `brick unmap` (across
//! daemon restarts, not across reboots: put it in the config file for
//! that). `unmap` removes a volume mapped with `map`; volumes of the
//! config file are removed there (and the daemon reloaded).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use control::{Format, Reply, Request, VolumeSpec, DEFAULT_SOCKET};
use serde::Deserialize;

/// Where the daemon listens.
#[derive(Args, Debug)]
pub struct SocketArg {
    /// The daemon's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
}

/// `brick status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// One line of JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

/// `brick list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// One line of JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

/// `brick map`.
#[derive(Args, Debug)]
pub struct MapArgs {
    /// The stable name: the device appears as /dev/brick/NAME.
    #[arg(required_unless_present = "file")]
    name: Option<String>,
    /// The RTRS session name.
    #[arg(long, required_unless_present = "file")]
    session: Option<String>,
    /// The volume's device path on the target.
    #[arg(long, required_unless_present = "file")]
    device_path: Option<String>,
    /// A path, `[SOURCE@]TARGET` (repeat for multipath).
    #[arg(long = "path", required_unless_present = "file")]
    paths: Vec<String>,
    /// `ro`, `rw` or `migration` (default rw).
    #[arg(long)]
    access_mode: Option<String>,
    /// The target's RTRS port (default 1234).
    #[arg(long)]
    port: Option<u16>,
    /// Read the volume from this TOML file instead: one `[[volumes]]`
    /// entry, as in the daemon's config file (without `export`/`link`:
    /// NBD exports belong in the config file).
    #[arg(long, conflicts_with_all = ["name", "session", "device_path", "paths", "access_mode", "port"])]
    file: Option<PathBuf>,
    #[command(flatten)]
    socket: SocketArg,
}

/// `brick unmap`.
#[derive(Args, Debug)]
pub struct UnmapArgs {
    /// The volume's name.
    name: String,
    /// Unmap even if the device is open, mounted or held.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    socket: SocketArg,
}

/// Sends `request`; an error reply becomes the error.
fn ask(socket: &SocketArg, request: &Request) -> Result<Reply> {
    let reply = control::request(&socket.socket, request).with_context(|| {
        format!(
            "no brick-initiatord answers on {} (is it running? see --socket)",
            socket.socket.display()
        )
    })?;
    match reply {
        Reply::Error { message } => bail!("the daemon refused: {message}"),
        reply => Ok(reply),
    }
}

/// The error for a reply of the wrong kind.
fn unexpected(request: &Request, reply: &Reply) -> anyhow::Error {
    anyhow::anyhow!(
        "expected the daemon's answer to {:?}, found a {:?} reply",
        request.name(),
        reply.name()
    )
}

/// `status` or `list` as `--json` or a table.
fn show(socket: &SocketArg, request: &Request) -> Result<()> {
    match ask(socket, request)? {
        Reply::Status { status } => println!("{}", status.to_json()),
        Reply::List { volumes } => println!(
            "{}",
            serde_json::to_string(&volumes).context("encode the list as JSON")?
        ),
        Reply::Text { text } => println!("{text}"),
        other => return Err(unexpected(request, &other)),
    }
    Ok(())
}

/// The request's format for `--json`.
fn format(json: bool) -> Format {
    if json {
        Format::Json
    } else {
        Format::Text
    }
}

/// `brick status`.
pub fn status(args: &StatusArgs) -> Result<()> {
    show(
        &args.socket,
        &Request::Status {
            format: format(args.json),
        },
    )
}

/// `brick list`.
pub fn list(args: &ListArgs) -> Result<()> {
    show(
        &args.socket,
        &Request::List {
            format: format(args.json),
        },
    )
}

/// The volume `brick map` sends.
fn map_volume(args: &MapArgs) -> Result<VolumeSpec> {
    if let Some(file) = &args.file {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        return volume_from_toml(&text, file);
    }
    Ok(VolumeSpec {
        name: args.name.clone().unwrap_or_default(),
        session: args.session.clone().unwrap_or_default(),
        device_path: args.device_path.clone().unwrap_or_default(),
        access_mode: args.access_mode.clone(),
        port: args.port,
        paths: args.paths.clone(),
    })
}

/// The one `[[volumes]]` entry of a `--file` (`file` names it in errors).
/// Only the entry's shape is checked here; its values are the daemon's to
/// judge, with the config file's rules.
fn volume_from_toml(text: &str, file: &Path) -> Result<VolumeSpec> {
    /// What a `--file` may hold.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct MapFile {
        #[serde(default)]
        volumes: Vec<VolumeSpec>,
    }
    let document: toml::Table =
        toml::from_str(text).with_context(|| format!("{}: not TOML", file.display()))?;
    if document.contains_key("daemon") {
        bail!(
            "{}: expected only a [[volumes]] entry, found [daemon]: daemon settings belong in the daemon's config file",
            file.display()
        );
    }
    if let Some(toml::Value::Array(entries)) = document.get("volumes") {
        for key in ["export", "link"] {
            if entries
                .iter()
                .any(|entry| entry.as_table().is_some_and(|t| t.contains_key(key)))
            {
                bail!(
                    "{}: expected a volume for the kernel's rnbd client, found `{key}`: \
                     NBD exports are configured in the daemon's config file, not with brick map",
                    file.display()
                );
            }
        }
    }
    let MapFile { mut volumes } = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.to_string().trim_end()))?;
    match (volumes.pop(), volumes.len()) {
        (Some(volume), 0) => Ok(volume),
        (None, _) => bail!(
            "{}: expected one [[volumes]] entry, found none",
            file.display()
        ),
        (Some(_), before) => bail!(
            "{}: expected one [[volumes]] entry, found {}",
            file.display(),
            before + 1
        ),
    }
}

/// `brick map`: prints the mapped volume (name, device, state).
pub fn map(args: &MapArgs) -> Result<()> {
    let request = Request::Map {
        volume: map_volume(args)?,
    };
    match ask(&args.socket, &request)? {
        Reply::Mapped { volume } => println!(
            "{}: {} ({}), /dev/brick/{}",
            volume.name,
            volume.device.as_deref().unwrap_or("-"),
            volume.state,
            volume.name
        ),
        other => return Err(unexpected(&request, &other)),
    }
    Ok(())
}

/// `brick unmap`.
pub fn unmap(args: &UnmapArgs) -> Result<()> {
    let request = Request::Unmap {
        name: args.name.clone(),
        force: args.force,
    };
    match ask(&args.socket, &request)? {
        Reply::Unmapped { name, .. } => println!("{name}: unmapped"),
        other => return Err(unexpected(&request, &other)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> MapArgs {
        MapArgs {
            name: Some("db".into()),
            session: Some("host\"1".into()),
            device_path: Some("vol0".into()),
            paths: vec!["10.0.0.1".into(), "ip:10.0.0.2@ip:10.0.1.1".into()],
            access_mode: Some("ro".into()),
            port: Some(1235),
            file: None,
            socket: SocketArg {
                socket: DEFAULT_SOCKET.into(),
            },
        }
    }

    #[test]
    fn test_map_volume_from_flags() {
        assert_eq!(
            map_volume(&args()).unwrap(),
            VolumeSpec {
                name: "db".into(),
                session: "host\"1".into(),
                device_path: "vol0".into(),
                access_mode: Some("ro".into()),
                port: Some(1235),
                paths: vec!["10.0.0.1".into(), "ip:10.0.0.2@ip:10.0.1.1".into()],
            }
        );
        let plain = MapArgs {
            access_mode: None,
            port: None,
            ..args()
        };
        let volume = map_volume(&plain).unwrap();
        assert_eq!((volume.access_mode, volume.port), (None, None));
    }

    #[test]
    fn test_map_volume_from_a_file() {
        let file = Path::new("db.toml");
        let entry = "[[volumes]]\nname = \"db\"\nsession = \"host\\\"1\"\ndevice_path = \"vol0\"\n\
                     access_mode = \"ro\"\nport = 1235\npaths = [\"10.0.0.1\", \"ip:10.0.0.2@ip:10.0.1.1\"]\n";
        assert_eq!(
            volume_from_toml(entry, file).unwrap(),
            map_volume(&args()).unwrap()
        );
        let cases = [
            (
                format!("{entry}size = 3\n"),
                "db.toml: TOML parse error at line 8",
            ),
            (format!("{entry}size = 3\n"), "unknown field `size`"),
            (entry.replace("port = 1235", "port = 70000"), "70000"),
            (entry.replace("name = \"db\"\n", ""), "missing field `name`"),
            (
                format!("[daemon]\npoll_interval_ms = 100\n\n{entry}"),
                "[daemon]: daemon settings belong in the daemon's config file",
            ),
            (
                format!("{entry}export = \"nbd:tcp:127.0.0.1:10809\"\n"),
                "found `export`: NBD exports are configured in the daemon's config file",
            ),
            (String::new(), "expected one [[volumes]] entry, found none"),
            (
                format!("{entry}\n{entry}"),
                "expected one [[volumes]] entry, found 2",
            ),
            ("volumes = 3".into(), "db.toml:"),
            ("[[volumes]\n".into(), "db.toml: not TOML"),
        ];
        for (text, expected) in cases {
            let e = format!("{:#}", volume_from_toml(&text, file).unwrap_err());
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
