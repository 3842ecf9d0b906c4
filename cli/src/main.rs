//! `brick`: block IO, benchmarks and manifests for Brick targets.
//!
//! ```text
//! brick io    --target ADDR[:PORT]... --link SPEC --session S --volume V [--ro] write|read|verify ...
//! brick bench --target ADDR[:PORT]... --link SPEC --session S --volume V --rw W --bs N --qd N --runtime SECS [--json]
//! brick manifest check FILE.toml
//! brick manifest build FILE.toml -o FILE.bin
//! brick manifest flash DISK FILE.toml | show DISK
//! brick image build --manifest FILE.toml -o DISK.img [--loader FILE.efi] [--kernel ELF]
//! brick target status --admin ADDR [--json] | extents --admin ADDR --volume V [--json]
//! brick status [--json] | list [--json] | map NAME --session S --device-path P --path A... | unmap NAME [--force]
//! ```
//!
//! `io` and `bench` are clients of [`initiator::hosted`]: one RTRS session
//! (a path per `--target`) over one link, one volume. `io` writes and checks
//! a position-dependent pattern ([`pattern`]) with the blocking API; `bench`
//! keeps a queue depth of IOs in flight with the submit/reap API and reports
//! IOPS, MB/s and latency percentiles ([`histogram`]). `manifest` compiles
//! and checks boot manifests ([`manifest_cmd`]) and flashes them onto a
//! boot disk that `image build` wrote ([`disk_image`]). `status`, `list`, `map` and
//! `unmap` are requests to the running `brick-initiatord` ([`daemon_cmd`]); `target`
//! reads a `brick-target`'s admin endpoint ([`target_cmd`]).
//!
//! Exit status: 0 success, 1 failure (the message on stderr says which
//! step, what was expected and what was found), 2 bad usage, 3 data that is
//! not the expected pattern (`io read`/`verify`).
//!
//! The crate has no `unsafe`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bench;
mod connect;
mod daemon_cmd;
mod disk_image;
mod histogram;
mod io;
mod manifest_cmd;
mod manifest_memory;
mod pattern;
mod progress;
mod scale;
mod size;
mod target_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Block IO, benchmarks and manifests for Brick RTRS/RNBD targets.
#[derive(Parser, Debug)]
#[command(name = "brick", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Command {
    /// Write, read or verify a deterministic pattern on a volume.
    ///
    /// The pattern depends on a seed and the absolute volume offset, so a
    /// read in a later run checks what an earlier write left and names
    /// misplaced or stale blocks. Sizes take suffixes (4k, 1M, 1GiB; powers
    /// of 1024).
    #[command(
        after_help = "Example (a target started with --link udp:127.0.0.1:4791):\n  \
        brick io --target 127.0.0.1 --link udp:127.0.0.2:4791 --session host1 --volume vol0 verify --size 64M"
    )]
    Io(io::IoArgs),
    /// Run a fixed-queue-depth load and report IOPS, MB/s and latency.
    ///
    /// Progress goes to stderr once a second; the result to stdout (text,
    /// or one JSON object with --json). MB/s is 10^6 bytes per second.
    /// Latency percentiles are at most 6.25 % above the true value.
    #[command(after_help = "Example:\n  \
        brick bench --target 127.0.0.1 --link udp:127.0.0.2:4791 --session host1 --volume vol0 --rw randread --bs 4k --qd 32 --runtime 10")]
    Bench(bench::BenchArgs),
    /// Many sessions from one process, each from its own loopback
    /// address, doing verified IO at a fixed queue depth.
    ///
    /// Session i binds FIRST_SOURCE + i on the target's UDP port and is
    /// named PREFIX-i; all connect at once. Reports the time until all are
    /// up, IOPS over all, per-session latency and errors.
    #[command(
        after_help = "Example (a target on --link udp:127.0.0.1:4791 whose manifest admits 100 sessions):\n  \
        brick scale --target 127.0.0.1 --udp-port 4791 --sessions 100 --volume vol0 --qd 16 --runtime 10"
    )]
    Scale(scale::ScaleArgs),
    /// Check or build a boot manifest, flash it onto a boot disk, show
    /// what a disk boots with.
    #[command(subcommand)]
    Manifest(manifest_cmd::ManifestCommand),
    /// Build a bootable disk image (GPT, a FAT EFI system partition with
    /// the UEFI loader, the image and the manifest).
    #[command(subcommand)]
    Image(ImageCommand),
    /// Read a running brick-target's admin endpoint: its metrics, a thin
    /// volume's extents.
    #[command(subcommand)]
    Target(target_cmd::TargetCommand),
    /// Show the volumes brick-initiatord keeps mapped, with their paths.
    Status(daemon_cmd::StatusArgs),
    /// List the volumes brick-initiatord keeps mapped and where each comes
    /// from (config file or `brick map`).
    List(daemon_cmd::ListArgs),
    /// Ask brick-initiatord to map a volume now and keep it mapped.
    #[command(after_help = "Example:\n  \
        brick map db --session host1 --device-path vol0 --path 10.0.0.1 --path 10.0.1.1")]
    Map(daemon_cmd::MapArgs),
    /// Ask brick-initiatord to unmap a volume added with `brick map`.
    Unmap(daemon_cmd::UnmapArgs),
}

/// `brick image` subcommands.
#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Write a GPT disk image that boots a node (UEFI) with a manifest.
    #[command(after_help = "Example:\n  \
        brick image build --manifest node.toml -o node.img && dd if=node.img of=/dev/sdX bs=1M")]
    Build(disk_image::BuildArgs),
}

/// Exit status of a data mismatch.
const EXIT_MISMATCH: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Io(args) => io::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Scale(args) => scale::run(args),
        Command::Manifest(command) => manifest_cmd::run(command),
        Command::Image(ImageCommand::Build(args)) => disk_image::build(args),
        Command::Target(command) => target_cmd::run(command),
        Command::Status(args) => daemon_cmd::status(args),
        Command::List(args) => daemon_cmd::list(args),
        Command::Map(args) => daemon_cmd::map(args),
        Command::Unmap(args) => daemon_cmd::unmap(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("brick: error: {error:#}");
            if error.downcast_ref::<io::DataMismatch>().is_some() {
                ExitCode::from(EXIT_MISMATCH)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
