//! `brick status | list | map | unmap`: requests to the running
//! `brick-initiatord` over its control socket.
//!
//! `map` sends one `[[volumes]]` entry, written from the flags (or read
//! from `--file`), exactly as the daemon's config file has it; the daemon
//! maps it at once and keeps it until `brick unmap` (across daemon
//! restarts, not across reboots: put it in the config file for that).
//! `unmap` removes a volume mapped with `map`; volumes of the config file
//! are removed there (and the daemon reloaded).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use initiatord::control::{self, DEFAULT_SOCKET};

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
    /// Read the `[[volumes]]` entry from this TOML file instead.
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

/// Sends `request`; a `{"error": ...}` reply becomes the error.
fn ask(socket: &SocketArg, request: &str) -> Result<String> {
    let reply = control::request(&socket.socket, request).with_context(|| {
        format!(
            "no brick-initiatord answers on {} (is it running? see --socket)",
            socket.socket.display()
        )
    })?;
    let reply = reply.trim_end().to_owned();
    if let Ok(serde_json::Value::Object(object)) = serde_json::from_str(&reply) {
        if let Some(serde_json::Value::String(error)) = object.get("error") {
            bail!("the daemon refused: {error}");
        }
    }
    Ok(reply)
}

/// `brick status`.
pub fn status(args: &StatusArgs) -> Result<()> {
    let request = if args.json { "status" } else { "status text" };
    println!("{}", ask(&args.socket, request)?);
    Ok(())
}

/// `brick list`.
pub fn list(args: &ListArgs) -> Result<()> {
    let request = if args.json { "list" } else { "list text" };
    println!("{}", ask(&args.socket, request)?);
    Ok(())
}

/// The `[[volumes]]` entry `brick map` sends.
fn map_toml(args: &MapArgs) -> Result<String> {
    if let Some(file) = &args.file {
        return std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()));
    }
    let mut entry = toml::Table::new();
    let mut put = |key: &str, value: toml::Value| {
        entry.insert(key.to_owned(), value);
    };
    let text = |value: &Option<String>| toml::Value::String(value.clone().unwrap_or_default());
    put("name", text(&args.name));
    put("session", text(&args.session));
    put("device_path", text(&args.device_path));
    if let Some(mode) = &args.access_mode {
        put("access_mode", toml::Value::String(mode.clone()));
    }
    if let Some(port) = args.port {
        put("port", toml::Value::Integer(i64::from(port)));
    }
    put(
        "paths",
        toml::Value::Array(
            args.paths
                .iter()
                .cloned()
                .map(toml::Value::String)
                .collect(),
        ),
    );
    let mut document = toml::Table::new();
    document.insert(
        "volumes".to_owned(),
        toml::Value::Array(vec![toml::Value::Table(entry)]),
    );
    Ok(document.to_string())
}

/// `brick map`: prints the mapped volume (name, device, state).
pub fn map(args: &MapArgs) -> Result<()> {
    let toml = map_toml(args)?;
    let request = format!("map {}", serde_json::to_string(&toml)?);
    let reply = ask(&args.socket, &request)?;
    let entry: serde_json::Value = serde_json::from_str(&reply)
        .with_context(|| format!("expected the mapped volume as JSON, found {reply:?}"))?;
    let field = |key: &str| entry.get(key).and_then(|v| v.as_str()).unwrap_or("-");
    println!(
        "{}: {} ({}), /dev/brick/{}",
        field("name"),
        field("device"),
        field("state"),
        field("name")
    );
    Ok(())
}

/// `brick unmap`.
pub fn unmap(args: &UnmapArgs) -> Result<()> {
    let request = if args.force {
        format!("unmap {} force", args.name)
    } else {
        format!("unmap {}", args.name)
    };
    ask(&args.socket, &request)?;
    println!("{}: unmapped", args.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_map_toml_is_a_config_entry() {
        let args = MapArgs {
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
        };
        let text = map_toml(&args).unwrap();
        let config = initiatord::config::parse(&text, "t").unwrap();
        let volume = &config.volumes[0];
        assert_eq!(
            (
                volume.name.as_str(),
                volume.session.as_str(),
                volume.port,
                volume.paths.len()
            ),
            ("db", "host\"1", 1235, 2)
        );
        assert_eq!(volume.access_mode.as_str(), "ro");
    }
}
