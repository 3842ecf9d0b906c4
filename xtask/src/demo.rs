//! `cargo xtask demo` and `cargo xtask vm run`.
//!
//! The demo starts the hosted Brick target (`brick-target`) with the
//! built-in demo manifest (`examples/two-ram-volumes.toml`: two 256 MiB RAM
//! volumes), boots the Linux initiator VM on a relay link to it, maps
//! `vol0` with the stock rnbd_client over rdma_rxe, writes and verifies it
//! with fio, and unmaps it. (The bare-metal image and Brick's own
//! userspace initiator take their places in the demo with their issues.)

use crate::target::{Bed, BedConfig, TargetKind};
use crate::util::step;
use crate::vmimage::Images;
use anyhow::Result;
use std::time::Duration;

pub fn run() -> Result<()> {
    let images = Images::build()?;
    step("starting the hosted Brick target (examples/two-ram-volumes.toml) and booting the Linux initiator VM (QEMU, TCG)");
    let mut bed = Bed::start(&images, &BedConfig::new(TargetKind::BrickHosted))?;
    let volume = bed.target.descriptor.volumes[0].clone();
    step(format!(
        "mapping {} from Brick at {} with the stock rnbd_client over rdma_rxe",
        volume.device_path, bed.target.descriptor.paths[0].target
    ));
    let script = format!(
        "d=$(map demo {} \"{}\") || exit 1\n\
         echo \"mapped /dev/$d: $(dev_bytes $d) bytes; paths: $(path_states demo | tr '\\n' ' ')\"\n\
         t0=$(uptime_s)\n\
         verify $d 4k 4M\n\
         echo \"wrote and verified 4 MiB of 4 KiB random writes (fio crc32c) in $(echo \"$(uptime_s) $t0\" | awk '{{print $1-$2}}') s guest time\"\n\
         unmap $d\n\
         echo \"unmapped /dev/$d\"\n",
        volume.device_path,
        bed.all_paths()
    );
    let output = bed.initiator.run(&script, Duration::from_secs(600))?;
    print!("{output}");
    println!(
        "\nThe stock Linux rnbd_client mapped {} from Brick's hosted target over software RoCE.",
        volume.device_path
    );
    Ok(())
}

/// Boots the Linux pair and runs one command in the initiator.
pub fn run_command(command: &str, mtu: u32) -> Result<()> {
    let images = Images::build()?;
    let config = BedConfig {
        mtu,
        ..BedConfig::new(TargetKind::LinuxReference)
    };
    let mut bed = Bed::start(&images, &config)?;
    let output = bed.initiator.sh(command, Duration::from_secs(3600))?;
    print!("{}", output.text);
    println!("(exit status {})", output.status);
    Ok(())
}
