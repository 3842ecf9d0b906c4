//! `brick_initiator_rxe`: Brick's own initiator on an RDMA device — the
//! initiator VM's Linux rxe through libibverbs (`brick io|bench --link
//! ibv:rxe0`) — against the bed's target: Linux `rnbd_server` on
//! linux-ref, Brick's software HCA on brick-hosted and the images, Brick on
//! rxe on brick-verbs. The VM runs the release `brick` with every library
//! it loads ([`cli_files`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::target::Bed;
use crate::util::step;

/// Where the dynamically linked `brick` lands in the initiator VM.
const CLI_IN_GUEST: &str = "/bin/brick";

/// The release `brick` (dynamic: it links libibverbs) and its libraries,
/// as (host path, guest path) for the initiator's initramfs.
pub fn cli_files() -> Result<Vec<(PathBuf, String)>> {
    let cli = crate::util::build_release_bins(&[("brick-cli", "brick")])?.remove(0);
    let mut files: Vec<(PathBuf, String)> = crate::vmimage::libraries(&cli)?
        .into_iter()
        .map(|lib| (PathBuf::from(&lib), lib))
        .collect();
    files.push((cli, CLI_IN_GUEST.into()));
    Ok(files)
}

/// Verify at 4 KiB and 128 KiB, a second session reading back what the
/// first wrote, and a 5 s random-read benchmark whose JSON must report
/// IOPS and no errors, all on the VM's rxe0.
pub fn brick_initiator_rxe(bed: &mut Bed) -> Result<()> {
    let path = bed.target.descriptor.paths[0].clone();
    let volume = bed.target.descriptor.volumes[0].device_path.clone();
    let common = format!(
        "--link ibv:rxe0 --local {}/{} --target {} --volume {volume}",
        path.initiator, path.prefix, path.target
    );
    let script = format!(
        "modprobe rdma_ucm\n\
         brick io {common} --session rxe1 verify --size 4M --bs 4k --pattern 21 || die \"4k verify\"\n\
         brick io {common} --session rxe1 verify --offset 8M --size 8M --bs 128k --pattern 22 || die \"128k verify\"\n\
         brick io {common} --session rxe2 read --offset 8M --size 8M --bs 128k --pattern 22 || die \"read back\"\n\
         brick bench {common} --session rxe3 --rw randread --bs 4k --qd 8 --runtime 5 --size 16M --json > /tmp/rxe-bench.json || die \"bench\"\n\
         echo BENCH $(tail -1 /tmp/rxe-bench.json)\n"
    );
    let output = bed.initiator.run(&script, Duration::from_secs(300))?;
    for line in output
        .lines()
        .filter(|l| l.contains("checked") || l.contains("wrote"))
    {
        step(line.trim());
    }
    let json = output
        .lines()
        .find_map(|l| l.strip_prefix("BENCH "))
        .context("no benchmark report in the output")?;
    let report: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("benchmark JSON: {json}"))?;
    let iops = report["read"]["iops"].as_f64().unwrap_or(0.0);
    let errors = report["errors"].as_u64().unwrap_or(u64::MAX);
    step(format!(
        "brick bench on rxe0 against {}: 4k randread QD8 {iops:.0} IOPS, {errors} errors",
        bed.target.descriptor.name
    ));
    if iops <= 0.0 || errors != 0 {
        bail!("expected IOPS and no errors, found {iops} IOPS and {errors} errors:\n{output}");
    }
    Ok(())
}
