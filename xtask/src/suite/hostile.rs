//! `hostile_neighbour`: the hostile probe (target-image/examples/
//! hostile_probe) on the bed's probe port beside the verifying Linux client.

use super::{map_line, Skip, MINUTE};
use crate::target::Bed;
use crate::util::step;
use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why a target kind skips the probe cases.
pub(super) const NO_PROBE_PORT: &str =
    "the target has no probe port (hostile_probe drives the Brick targets, hosted and image)";

/// How long the probe may run in all (each of its waits is bounded too):
/// 54 cases with a 4.5 s pause after each, a 20 s silent client, a
/// vanished session released by heartbeats (~40 s): about 6 minutes.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(720);

/// Runs `hostile_probe` on the bed's probe port; returns its exit status
/// and its output (stdout, then stderr), killing it at [`PROBE_TIMEOUT`].
pub(super) fn run_probe(
    bed: &Bed,
    binary: &std::path::Path,
) -> Result<(std::process::ExitStatus, String)> {
    let (Some(relay), Some(port)) = (bed.probe.as_ref(), bed.target.descriptor.probe.as_ref())
    else {
        return Err(Skip(NO_PROBE_PORT).into());
    };
    let dir = crate::paths::scratch("hostile-probe");
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let mut child = Command::new(binary)
        .args(["--link", &format!("frame:connect:{}", relay.a.display())])
        .args(["--target", &port.target])
        .args(["--local", &port.local])
        .args(["--mac", &port.mac])
        .args(["--session-prefix", &port.session_prefix])
        .args(["--refused-session", &port.refused_session])
        .args(["--ro-volume", &port.ro_volume])
        .args(["--rw-volume", &port.rw_volume])
        .args(["--max-connections", &port.max_connections.to_string()])
        .args(["--max-sessions", &port.max_sessions.to_string()])
        .args(["--healthy-volume", &port.healthy_volume])
        .args(["--pinned-prefix", &port.pinned_prefix])
        .args(["--outsider", &port.outsider])
        .args(["--max-half-open", &port.max_half_open.to_string()])
        .args([
            "--max-half-open-per-source",
            &port.max_half_open_per_source.to_string(),
        ])
        .args(["--setup-timeout-ms", &port.setup_timeout_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let output = std::fs::read_to_string(&out_path).unwrap_or_default();
            bail!(
                "hostile_probe still running after {} s; its output so far:\n{output}",
                PROBE_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let errors = std::fs::read_to_string(&err_path).unwrap_or_default();
    if !errors.trim().is_empty() {
        output += "--- hostile_probe stderr ---\n";
        output += &errors;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((status, output))
}

/// Kernel log lines of an RTRS/RNBD path or IO in trouble (Linux 6.1
/// rtrs-clt and rnbd-clt, and the block layer's "I/O error, dev rnbd0");
/// mapping, "connected" and other info lines are benign, and so is the
/// taint notice of loading the (unsigned) modules.
pub(super) fn is_client_error_line(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    if lower.contains("module verification failed") {
        return false;
    }
    let ours = lower.contains("rtrs") || lower.contains("rnbd");
    let trouble = [
        "error",
        "fail",
        "reconnect",
        "disconnect",
        "timed out",
        "timeout",
        "hb ",
        "heartbeat",
    ]
    .iter()
    .any(|w| lower.contains(w));
    ours && trouble
}

/// A healthy Linux client keeps a verifying fio running on vol0 while
/// `hostile_probe` plays hostile clients on the probe port (54 cases:
/// malformed CON_REQs and CON_REQ storms, the half-open limits and
/// deadline, takeovers, too many connections and sessions, refused and
/// squatted names, access rules on a second path, dropped and vanished
/// sessions, bad immediates, chunk ids, offsets and READ descriptors,
/// request and heartbeat floods, clients that stop reading, RNBD OPEN,
/// CLOSE and IO misuse) beside its own healthy Brick client: every attack
/// gets its answer, the probe exits 0 (which needs its healthy client to
/// see 0 errors and keep 80 % of its baseline rate), fio verifies with 0
/// errors and the client's kernel log shows no RTRS/RNBD trouble.
pub(super) fn hostile_neighbour(bed: &mut Bed) -> Result<()> {
    if bed.probe.is_none() || bed.target.descriptor.probe.is_none() {
        return Err(Skip(NO_PROBE_PORT).into());
    }
    let binary = crate::target::build_hostile_probe()?;
    // The kernel log is checked from the mapped device on.
    let script = map_line(bed, "d", 0)
        + "echo $d > /tmp/hostile.dev\ndmesg | wc -l > /tmp/hostile.dmesg\n\
           bg v verify $d 4k 16M\nsleep 1\n";
    bed.initiator.run(&script, 2 * MINUTE)?;
    let relay = bed.probe.as_ref().expect("checked above");
    let (before_in, before_out) = (
        relay.stats(crate::relay::A_TO_B).frames,
        relay.stats(crate::relay::B_TO_A).frames,
    );
    step("running hostile_probe against the target's probe port");
    let (status, output) = run_probe(bed, &binary)?;
    print!("{output}");
    let relay = bed.probe.as_ref().expect("checked above");
    let sent = relay.stats(crate::relay::A_TO_B).frames - before_in;
    let answered = relay.stats(crate::relay::B_TO_A).frames - before_out;
    println!("probe port: {sent} frames from the probe, {answered} from the target");
    // Whether fio was still at work when the probe finished.
    let overlap = bed.initiator.run(
        "[ -e /tmp/bg.v.rc ] && echo finished || echo running\n",
        MINUTE,
    )?;
    println!("fio verify when the probe finished: {}", overlap.trim());
    let verify = bed.initiator.run(
        "bgwait v 600 || die \"fio verify beside the hostile probe\"\n\
         d=$(cat /tmp/hostile.dev)\nunmap $d\n",
        11 * MINUTE,
    )?;
    print!("{verify}");
    let dmesg = bed.initiator.run(
        "dmesg | tail -n +$(( $(cat /tmp/hostile.dmesg) + 1 ))\n",
        MINUTE,
    )?;
    let client_lines = dmesg
        .lines()
        .filter(|l| l.contains("rtrs") || l.contains("rnbd"))
        .count();
    let trouble: Vec<&str> = dmesg.lines().filter(|l| is_client_error_line(l)).collect();
    println!(
        "client kernel log since the map: {client_lines} rtrs/rnbd lines, {} in trouble",
        trouble.len()
    );
    if !status.success() {
        bail!("hostile_probe failed ({status})");
    }
    if sent == 0 || answered == 0 {
        bail!("the probe port carried {sent} frames out and {answered} back: the probe never reached the target");
    }
    if !trouble.is_empty() {
        bail!(
            "the Linux client logged RTRS/RNBD trouble during the probe:\n{}",
            trouble.join("\n")
        );
    }
    Ok(())
}
