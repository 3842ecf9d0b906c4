//! `brick_initiator_rxe`: Brick's own initiator on an RDMA device — the
//! initiator VM's Linux rxe through libibverbs (`brick io|bench --link
//! ibv:rxe0`) — against the bed's target: Linux `rnbd_server` on
//! linux-ref, Brick's software HCA on brick-hosted and the images, Brick on
//! rxe on brick-verbs. The VM runs the release `brick` with every library
//! it loads ([`cli_files`]).
//!
//! `daemon_nbd_rxe`: the initiator daemon's NBD export on the same rxe0
//! (`link = "ibv:rxe0"`): the stock `nbd-client` attaches it as
//! `/dev/nbd0` and fio verifies through it — a client with an RDMA device
//! and no RDMA block module.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::target::Bed;
use crate::util::step;

/// Where the dynamically linked `brick` lands in the initiator VM.
const CLI_IN_GUEST: &str = "/bin/brick";
/// Where the dynamically linked `brick-initiatord` lands.
const DAEMON_IN_GUEST: &str = "/bin/brick-initiatord-ibv";
/// The stock NBD client (Debian's nbd-client) in the guest.
const NBD_CLIENT: &str = "/usr/sbin/nbd-client";
/// The kernel's NBD module in the guest (not in the base's modules.dep).
const NBD_MODULE_IN_GUEST: &str = "/lib/brick/nbd.ko";

/// The release `brick` and `brick-initiatord` (dynamic: they link
/// libibverbs), `nbd-client`, all with their libraries, and the kernel's
/// nbd module of `images`, as (host path, guest path) for the initiator's
/// initramfs.
pub fn cli_files(images: &crate::vmimage::Images) -> Result<Vec<(PathBuf, String)>> {
    let built = crate::util::build_release_bins(&[
        ("brick-cli", "brick"),
        ("brick-initiatord", "brick-initiatord"),
    ])?;
    crate::util::require_path(std::path::Path::new(NBD_CLIENT), "nbd-client")?;
    let mut libraries = std::collections::BTreeSet::new();
    for binary in [&built[0], &built[1], &PathBuf::from(NBD_CLIENT)] {
        libraries.extend(crate::vmimage::libraries(binary)?);
    }
    let mut files: Vec<(PathBuf, String)> = libraries
        .into_iter()
        .map(|lib| (PathBuf::from(&lib), lib))
        .collect();
    files.push((built[0].clone(), CLI_IN_GUEST.into()));
    files.push((built[1].clone(), DAEMON_IN_GUEST.into()));
    files.push((PathBuf::from(NBD_CLIENT), NBD_CLIENT.into()));
    files.push((images.module("nbd")?, NBD_MODULE_IN_GUEST.into()));
    Ok(files)
}

/// The daemon's config: volume 0 of the bed as the NBD export `rxe-nbd`
/// on 127.0.0.1:10809, its session on rxe0.
fn nbd_config(bed: &Bed) -> String {
    let path = &bed.target.descriptor.paths[0];
    let volume = &bed.target.descriptor.volumes[0].device_path;
    format!(
        "[[volumes]]\nname = \"rxe-nbd\"\nsession = \"nbd-rxe\"\ndevice_path = \"{volume}\"\n\
         paths = [\"{target}\"]\nexport = \"nbd:tcp:127.0.0.1:10809\"\nlink = \"ibv:rxe0\"\n\
         local = \"{local}\"\n",
        target = path.target,
        local = path.initiator,
    )
}

/// brick-initiatord exports volume 0 over rxe0 as NBD; the stock
/// nbd-client attaches it and fio verifies 4 KiB and 128 KiB writes
/// through `/dev/nbd0`; the export's status shows its session connected;
/// SIGTERM stops the daemon cleanly.
pub fn daemon_nbd_rxe(bed: &mut Bed) -> Result<()> {
    let config = nbd_config(bed);
    let script = format!(
        "D={DAEMON_IN_GUEST}; S=/tmp/initiatord-nbd.sock; L=/tmp/initiatord-nbd.log\n\
         trap 'echo \"--- daemon log ---\"; cat $L 2>/dev/null' EXIT\n\
         modprobe rdma_ucm\n\
         grep -qw nbd /proc/modules || insmod {NBD_MODULE_IN_GUEST} nbds_max=2 || die \"insmod nbd\"\n\
         cat > /tmp/initiator-nbd.toml <<'EOF'\n{config}EOF\n\
         $D --config /tmp/initiator-nbd.toml --check || die \"config refused\"\n\
         $D --config /tmp/initiator-nbd.toml --socket $S > $L 2>&1 &\n\
         pid=$!\n\
         n=0; until grep -q 'connected, .* opened' $L; do n=$((n + 1)); [ $n -ge 600 ] && die \"the export's session did not connect in 60 s\"; sleep 0.1; done\n\
         log \"$(grep -m1 'connected, .* opened' $L)\"\n\
         wait_for /dev/nbd0 10 || die \"no /dev/nbd0\"\n\
         {NBD_CLIENT} 127.0.0.1 10809 /dev/nbd0 -N rxe-nbd > /tmp/nbd-client.log 2>&1 || {{ cat /tmp/nbd-client.log; die \"nbd-client\"; }}\n\
         n=0; while [ \"$(cat /sys/block/nbd0/size)\" = 0 ]; do n=$((n + 1)); [ $n -ge 100 ] && die \"/dev/nbd0 has no size\"; sleep 0.1; done\n\
         log \"nbd0: $(dev_bytes nbd0) bytes\"\n\
         verify nbd0 4k 4M\n\
         verify nbd0 128k 8M --offset=16M\n\
         $D status --json --socket $S > /tmp/nbd-status.json 2>&1 || die \"status: $(cat /tmp/nbd-status.json)\"\n\
         grep -q '\"session_connected\":true' /tmp/nbd-status.json || die \"status: $(cat /tmp/nbd-status.json)\"\n\
         echo \"status: $(cat /tmp/nbd-status.json)\"\n\
         {NBD_CLIENT} -d /dev/nbd0 > /dev/null 2>&1\n\
         kill -TERM $pid\n\
         wait $pid; rc=$?\n\
         [ $rc = 0 ] || die \"brick-initiatord exited with $rc after SIGTERM\"\n\
         trap - EXIT\n"
    );
    let output = bed.initiator.run(&script, Duration::from_secs(600))?;
    for line in output
        .lines()
        .filter(|l| l.contains("verify") || l.contains("nbd0:") || l.contains("opened"))
    {
        step(line.trim());
    }
    Ok(())
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
