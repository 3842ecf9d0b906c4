//! `cargo xtask`: Brick's build, test, VM and benchmark driver.
//!
//! Everything a developer or CI does goes through here, in Rust rather than
//! growing shell: building the Linux judge VMs (kernel, out-of-tree
//! rtrs/rnbd modules, initramfs), running them under QEMU, the frame relay
//! that sits between a VM's NIC and a target, the test tiers, the demo and
//! the side-by-side benchmark.

mod bench;
mod bench_cost;
mod bench_initiator;
mod bench_loss;
mod bench_scale;
mod callgrind;
mod demo;
mod first_map;
mod fuzz;
mod image;
mod image_admin;
mod image_thin;
mod initiator_rxe;
mod initiator_suite;
mod interop;
mod paths;
mod qemu;
mod relay;
mod setup;
mod suite;
mod target;
mod thin_case;
mod uefi;
mod util;
mod vmimage;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Brick's build, test and VM driver")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the demo and the tests need (Debian packages, Debian
    /// 12's QEMU 7.2); `--check` prints the `apt-get` line instead.
    Setup(setup::SetupArgs),
    /// Run the tests: host tests plus the VM smoke suites (`--full`: everything).
    Test(suite::TestArgs),
    /// Boot the image under QEMU with a demo volume and map it with Brick's
    /// initiator through a relay (`--hosted`: the hosted target on UDP
    /// loopback; `--linux`: from the stock Linux client in a VM).
    Demo(demo::DemoArgs),
    /// Build the bare-metal image (x86_64-unknown-none, PVH) and print its
    /// path; `--uefi` also builds the UEFI loader and the `brick` CLI that
    /// writes boot disks.
    Image(image::ImageArgs),
    /// Build the image and boot it under QEMU with a manifest (fw_cfg).
    RunImage(image::RunImageArgs),
    /// Boot the image serving with a NIC but no client and print QEMU's
    /// CPU use over idle seconds (percent of one core).
    ImageIdle(image::ImageIdleArgs),
    /// Build or run the Linux judge VMs.
    Vm {
        #[command(subcommand)]
        command: VmCommand,
    },
    /// Run a frame relay between two stream-framed Unix sockets.
    Relay(relay::RelayArgs),
    /// The side-by-side benchmark: the same fio jobs against every target
    /// (Linux rnbd_server and nvmet-rdma, brick-hosted, brick-image).
    BenchVm(bench::BenchArgs),
    /// Brick's initiator (`brick bench`) against every target it reaches.
    BenchInitiator(bench_initiator::BenchInitiatorArgs),
    /// Brick's initiator and the hosted target through the relay,
    /// lossless and with the loss mix of issue 17: MB/s and the ratio.
    BenchLoss(bench_loss::BenchLossArgs),
    /// One hosted target against 10, 100 and 1,000 concurrent sessions
    /// (and 100 `brick bench` processes): connect time, IOPS, latency,
    /// memory and CPU per session.
    BenchScale(bench_scale::BenchScaleArgs),
    /// Instructions per IO of the target (engine, HCA, RTRS, RNBD) by
    /// layer, counted by callgrind, for 4 KiB and 128 KiB reads and
    /// writes from Brick's initiator; allocations per IO.
    BenchCost(bench_cost::BenchCostArgs),
    /// Build the fuzz targets (nightly, cargo-fuzz) and run each for
    /// `--time` seconds (niced); prints executions, exec/s, corpus size
    /// and crashes per target.
    Fuzz(fuzz::FuzzArgs),
}

#[derive(Subcommand)]
enum VmCommand {
    /// Build (or reuse) the kernel, modules and initramfs images.
    Build,
    /// Boot the Linux reference target and the initiator VM and run one
    /// shell command in the initiator (e.g. `cargo xtask vm run -- 'map ram0 && lsblk'`).
    Run {
        /// Shell command to run inside the initiator VM (lib.sh helpers available).
        command: String,
        /// Link MTU.
        #[arg(long, default_value_t = 1500)]
        mtu: u32,
    },
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Setup(args) => setup::run(args),
        Command::Test(args) => suite::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Image(args) => image::run_build(args),
        Command::RunImage(args) => image::run(args),
        Command::ImageIdle(args) => image::run_idle(args),
        Command::Vm { command } => match command {
            VmCommand::Build => setup::ensure(setup::Purpose::Judge)
                .and_then(|()| vmimage::Images::build())
                .map(|images| images.describe()),
            VmCommand::Run { command, mtu } => demo::run_command(&command, mtu),
        },
        Command::Relay(args) => relay::run_standalone(args),
        Command::BenchVm(args) => bench::run(args),
        Command::BenchInitiator(args) => bench_initiator::run(args),
        Command::BenchLoss(args) => bench_loss::run(args),
        Command::BenchScale(args) => bench_scale::run(args),
        Command::BenchCost(args) => bench_cost::run(args),
        Command::Fuzz(args) => fuzz::run_fuzz(args),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
