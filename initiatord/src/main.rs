//! brick-initiatord: keeps rnbd volumes mapped as /etc/brick/initiator.toml says.
//!
//! `brick-initiatord [--config FILE] [--once] [--force] [--check] [--socket PATH] [--state FILE]`
//! `brick-initiatord status [--json] [--socket PATH]` (asks the running daemon)
//!
//! Loads the config (refusing a bad one with its line), then every
//! `poll_interval_ms` compares sysfs with it and acts (see the library's
//! `reconcile` module). SIGHUP re-reads the config (a bad file is logged and
//! the old one stays in force); SIGTERM/SIGINT stop the daemon, leaving the
//! mappings as they are. Requests (`status`, `list`, `map`, `unmap`: the
//! `brick` command's; typed, one JSON object per line, see the `control`
//! crate) are answered on a unix socket
//! (`/run/brick-initiatord.sock`); volumes added with `brick map` are kept
//! in the state file (`--state`, under `/run`) so a restarted daemon keeps
//! them (library module `daemon`). Logs go to stderr, one line per action with its
//! reason. Exit status: 0 on a clean stop (or `--once` converged), 1 when
//! `--once` could not map everything, 2 for a bad config or command line.
//!
//! Volumes with `export = "nbd:…"` are not the kernel's: the daemon maps
//! them with Brick's userspace initiator and serves them as NBD exports
//! (library module `userspace`), started with the daemon, restarted or
//! stopped on SIGHUP as the config changes, and closed on SIGTERM/SIGINT
//! (listeners closed, unix socket files removed, sessions closed).
//! `--once` does not serve them (they need the running daemon): it says so
//! and handles the kernel volumes only; with nothing but NBD exports
//! configured it exits 1.
//!
//! No unsafe here: the signal handlers are `hal::hosted::signals`.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use control::{ControlServer, Format, Reply, Request, DEFAULT_SOCKET};
use initiatord::config::DEFAULT_CONFIG_PATH;
use initiatord::daemon::{Daemon, DEFAULT_STATE};
use initiatord::reconcile::{converged, Options};
use initiatord::sysfs::HostSysfs;
use initiatord::userspace::{Exports, Tuning};

use hal::hosted::signals;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "brick-initiatord",
    version,
    about = "Keeps Brick volumes mapped through the Linux rnbd client"
)]
struct Args {
    /// The config file.
    #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Map what is missing, then exit (0 if every volume is mapped, open
    /// and linked, 1 otherwise). NBD exports are not served (they need
    /// the running daemon); with only NBD exports configured, exit 1.
    #[arg(long)]
    once: bool,
    /// Unmap volumes removed from the config even if open or mounted.
    #[arg(long)]
    force: bool,
    /// Only check the config and exit.
    #[arg(long)]
    check: bool,
    /// The control socket.
    #[arg(long, global = true, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Where volumes added with `brick map` are kept (default
    /// `/run/brick/initiatord-volumes.toml`, under `--root`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Root of the file system to manage (tests; default `/`).
    #[arg(long, default_value = "/", hide = true)]
    root: PathBuf,
    /// Ask the running daemon instead of being it.
    #[command(subcommand)]
    command: Option<Command>,
}

/// Requests to the running daemon.
#[derive(Subcommand, Debug)]
enum Command {
    /// Print each volume's device, state, link and paths.
    Status {
        /// One line of JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `brick-initiatord status`: one request over the control socket.
fn client(socket: &std::path::Path, command: &Command) -> ExitCode {
    let Command::Status { json } = command;
    let format = if *json { Format::Json } else { Format::Text };
    match control::request(socket, &Request::Status { format }) {
        Ok(Reply::Status { status }) => {
            println!("{}", status.to_json());
            ExitCode::SUCCESS
        }
        Ok(Reply::Text { text }) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Reply::Error { message }) => {
            eprintln!("brick-initiatord: the daemon refused: {message}");
            ExitCode::from(1)
        }
        Ok(other) => {
            eprintln!(
                "brick-initiatord: expected a status reply, found a {} reply",
                other.name()
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!(
                "brick-initiatord: no daemon answers on {}: {e}",
                socket.display()
            );
            ExitCode::from(1)
        }
    }
}

fn log(line: &str) {
    eprintln!("brick-initiatord: {line}");
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(command) = &args.command {
        return client(&args.socket, command);
    }
    let options = Options { force: args.force };
    let mut daemon = match Daemon::load(&args.config, options) {
        Ok(daemon) => daemon,
        Err(e) => {
            log(&format!("config refused: {e}"));
            return ExitCode::from(2);
        }
    };
    let exported: Vec<String> = daemon
        .config
        .userspace_volumes()
        .map(|v| v.name.clone())
        .collect();
    if args.check {
        log(&format!(
            "{}: ok, {} volume(s), {} of them NBD export(s)",
            args.config.display(),
            daemon.config.volumes.len(),
            exported.len()
        ));
        return ExitCode::SUCCESS;
    }
    let state = args
        .state
        .clone()
        .unwrap_or_else(|| args.root.join(DEFAULT_STATE.trim_start_matches('/')));
    match daemon.with_state(&state) {
        Ok(superseded) if !superseded.is_empty() => log(&format!(
            "run-time volumes {superseded:?} dropped from {}: the config file names them now",
            state.display()
        )),
        Ok(_) => {}
        Err(e) => {
            log(&format!("state file refused: {e}"));
            return ExitCode::from(2);
        }
    }
    let mut sysfs = HostSysfs::with_root(&args.root);
    log(&format!(
        "started: config {}, {} volume(s), {} of them NBD export(s){}",
        args.config.display(),
        daemon.config.volumes.len(),
        exported.len(),
        if args.force { ", --force" } else { "" }
    ));

    if args.once {
        if !exported.is_empty() {
            log(&format!(
                "--once does not serve NBD exports (they need the running daemon); \
                 not serving {}",
                exported.join(", ")
            ));
            if exported.len() == daemon.config.volumes.len() {
                log("--once: every configured volume is an NBD export; nothing to do");
                return ExitCode::from(1);
            }
        }
        return match daemon.tick(&mut sysfs, Instant::now(), &mut log) {
            Ok(pass) if converged(&daemon.config, &pass.observed) => {
                log("all volumes mapped");
                ExitCode::SUCCESS
            }
            Ok(_) => {
                log("not every volume could be mapped (see above)");
                ExitCode::from(1)
            }
            Err(e) => {
                log(&format!("cannot read sysfs: {e}"));
                ExitCode::from(1)
            }
        };
    }

    if let Err(e) = signals::install() {
        log(&format!("cannot install signal handlers: {e}"));
        return ExitCode::from(1);
    }
    let server = match ControlServer::bind(&args.socket) {
        Ok(server) => server,
        Err(e) => {
            log(&format!("control socket {}: {e}", args.socket.display()));
            return ExitCode::from(1);
        }
    };
    let mut exports = Exports::new(Arc::new(log), Tuning::default());
    while !signals::STOP.load(Ordering::SeqCst) {
        // Userspace volumes: start, restart or stop NBD exports as the
        // config in force says (a no-op when it did not change).
        let summary = exports.apply(&daemon.config);
        if !summary.is_empty() {
            log(&format!(
                "NBD exports: started {:?}, restarted {:?}, stopped {:?}",
                summary.started, summary.restarted, summary.stopped
            ));
        }
        if signals::RELOAD.swap(false, Ordering::SeqCst) {
            match daemon.reload() {
                Ok(summary) => log(&format!(
                    "SIGHUP: config reloaded ({} volume(s); added {:?}, removed {:?}, changed {:?}{})",
                    daemon.config.volumes.len(),
                    summary.added,
                    summary.removed,
                    summary.changed,
                    if summary.superseded.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; run-time volumes {:?} now come from the config file",
                            summary.superseded
                        )
                    }
                )),
                Err(e) => log(&format!("SIGHUP: new config refused, keeping the old one: {e}")),
            }
            continue;
        }
        if let Err(e) = daemon.tick(&mut sysfs, Instant::now(), &mut log) {
            log(&format!("cannot read sysfs: {e}"));
        }
        daemon.status.exports = exports.status();
        // Sleep in short slices so a signal is acted on promptly
        // (`thread::sleep` resumes after EINTR).
        let deadline =
            Instant::now() + Duration::from_millis(daemon.config.daemon.poll_interval_ms);
        while Instant::now() < deadline
            && !signals::STOP.load(Ordering::SeqCst)
            && !signals::RELOAD.load(Ordering::SeqCst)
        {
            server.poll(&mut |request| {
                daemon.answer(request, &mut sysfs, Instant::now(), &mut |line| log(line))
            });
            std::thread::sleep(Duration::from_millis(50).min(deadline - Instant::now()));
        }
    }
    if !exports.is_empty() {
        log("stopping on signal: closing the NBD exports");
        exports.stop_all();
    }
    log("stopping on signal; mappings are left as they are");
    ExitCode::SUCCESS
}
