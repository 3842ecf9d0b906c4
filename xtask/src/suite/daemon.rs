//! The initiator daemon's cases: map and reload, re-adding a path, restart
//! idempotence, run-time maps, remapping a lost volume, reviving one given
//! up; the daemon and `brick` run statically linked in the initiator VM.

use super::MINUTE;
use crate::target::Bed;
use crate::util::step;
use anyhow::Result;

/// Where the static `brick-initiatord` lands in the initiator VM.
pub(super) const DAEMON_IN_GUEST: &str = "/bin/brick-initiatord";
/// Where the static `brick` command lands in the initiator VM.
pub(super) const CLI_IN_GUEST: &str = "/bin/brick";

/// A `brick-initiatord` config: `[daemon]` timings, then one volume per
/// `(name, device_path)` in session `session` over every path of the bed.
pub(super) fn daemon_config(bed: &Bed, session: &str, volumes: &[(&str, &str)]) -> String {
    daemon_config_with(bed, "", session, volumes)
}

/// [`daemon_config`] with more `[daemon]` keys (`extra`, one per line).
pub(super) fn daemon_config_with(
    bed: &Bed,
    extra: &str,
    session: &str,
    volumes: &[(&str, &str)],
) -> String {
    let paths: Vec<String> = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!("\"{p}\""))
        .collect();
    let mut config = format!("[daemon]\npoll_interval_ms = 500\nretry_interval_s = 2\n{extra}");
    for (name, device_path) in volumes {
        config += &format!(
            "\n[[volumes]]\nname = \"{name}\"\nsession = \"{session}\"\ndevice_path = \"{device_path}\"\npaths = [{}]\n",
            paths.join(", ")
        );
    }
    config
}

/// `brick-initiatord` against the real rnbd client: it maps two volumes
/// and links them under /dev/brick (fio verifies through the links), a
/// SIGHUP with volume b removed (and c added, if the target has a third)
/// unmaps b and maps c, `status --json` agrees, SIGTERM exits 0 and leaves
/// the mappings. Then `--once` maps a fresh config and exits 0, and a
/// second `--once` exits 0 without acting.
pub(super) fn daemon_maps_and_reloads(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let a = volumes[0].device_path.clone();
    let b = volumes[1].device_path.clone();
    let c = volumes.get(2).map(|v| v.device_path.clone());
    let first = daemon_config(bed, "bd", &[("a", &a), ("b", &b)]);
    let mut second_volumes = vec![("a", a.as_str())];
    if let Some(c) = &c {
        second_volumes.push(("c", c));
    }
    let second = daemon_config(bed, "bd", &second_volumes);
    let once = daemon_config(bed, "bo", &[("a", &a)]);
    let has_c = if c.is_some() { 1 } else { 0 };
    let script = format!(
        "D={DAEMON_IN_GUEST}; S=/tmp/brick-initiatord.sock; L=/tmp/initiatord.log\n\
         trap 'echo \"--- daemon log ---\"; cat $L 2>/dev/null; echo \"--- --once logs ---\"; cat /tmp/once1.log /tmp/once2.log 2>/dev/null' EXIT\n\
         file_of() {{ basename \"$(readlink /dev/brick/$1)\"; }}\n\
         mapped() {{ for m in /sys/block/rnbd*; do [ \"$(cat $m/rnbd/session 2>/dev/null)\" = $1 ] && [ \"$(cat $m/rnbd/mapping_path 2>/dev/null)\" = $2 ] && basename $m; done; }}\n\
         mkdir -p /etc/brick\n\
         cat > /etc/brick/initiator.toml <<'EOF'\n{first}EOF\n\
         $D --config /etc/brick/initiator.toml --check || die \"config refused\"\n\
         $D --config /etc/brick/initiator.toml --socket $S > $L 2>&1 &\n\
         pid=$!\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         wait_for /dev/brick/b 60 || die \"/dev/brick/b did not appear\"\n\
         da=$(file_of a); db=$(file_of b)\n\
         log \"a -> $da, b -> $db\"\n\
         wait_for /dev/$da 10 && wait_for /dev/$db 10 || die \"device nodes missing\"\n\
         verify $da 4k 8M\n\
         verify $db 128k 8M\n\
         cat > /etc/brick/initiator.toml <<'EOF'\n{second}EOF\n\
         kill -HUP $pid\n\
         n=0; while [ -e /dev/brick/b ] || [ -n \"$(mapped bd {b})\" ]; do n=$((n + 1)); [ $n -ge 600 ] && die \"b still mapped or linked 60 s after SIGHUP\"; sleep 0.1; done\n\
         log \"b unlinked and {b} unmapped\"\n\
         if [ {has_c} = 1 ]; then wait_for /dev/brick/c 60 || die \"/dev/brick/c did not appear\"; dc=$(file_of c); log \"c -> $dc\"; fi\n\
         [ -e /sys/block/$da ] || die \"$da went away on reload\"\n\
         n=0; until $D status --json --socket $S > /tmp/status.json 2>&1 && grep -q '\"name\":\"a\"' /tmp/status.json && ! grep -q '\"name\":\"b\"' /tmp/status.json && {{ [ {has_c} = 0 ] || grep -q '\"name\":\"c\"' /tmp/status.json; }}; do n=$((n + 1)); [ $n -ge 50 ] && die \"status: $(cat /tmp/status.json)\"; sleep 0.2; done\n\
         echo \"status: $(cat /tmp/status.json)\"\n\
         $D status --socket $S\n\
         kill -TERM $pid\n\
         wait $pid; rc=$?\n\
         [ $rc = 0 ] || die \"daemon exited $rc on SIGTERM\"\n\
         [ -e /sys/block/$da ] || die \"$da unmapped by the stopping daemon\"\n\
         [ \"$(file_of a)\" = $da ] || die \"/dev/brick/a changed on stop\"\n\
         unmap $da\n\
         if [ {has_c} = 1 ]; then unmap $dc; fi\n\
         rm -rf /dev/brick\n\
         cat > /tmp/once.toml <<'EOF'\n{once}EOF\n\
         $D --config /tmp/once.toml --once --socket $S > /tmp/once1.log 2>&1; rc=$?\n\
         [ $rc = 0 ] || die \"first --once exited $rc\"\n\
         [ -e /dev/brick/a ] || die \"--once did not link /dev/brick/a\"\n\
         dn=$(file_of a)\n\
         grep -q 'brick-initiatord: map ' /tmp/once1.log || die \"first --once logged no map\"\n\
         $D --config /tmp/once.toml --once --socket $S > /tmp/once2.log 2>&1; rc=$?\n\
         [ $rc = 0 ] || die \"second --once exited $rc\"\n\
         grep -q 'all volumes mapped' /tmp/once2.log || die \"second --once did not say all volumes mapped\"\n\
         if grep -v -e 'started:' -e 'all volumes mapped' /tmp/once2.log | grep -q .; then die \"second --once acted\"; fi\n\
         [ \"$(file_of a)\" = $dn ] || die \"second --once changed the mapping\"\n\
         unmap $dn\n\
         rm -rf /dev/brick\n"
    );
    let output = bed.initiator.run(&script, 10 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// An operator removes one of a session's two paths (`remove_path`);
/// `brick-initiatord` adds it back (`add_path`) and it connects again,
/// with IO verified on the volume afterwards.
pub(super) fn daemon_readds_path(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    let config = daemon_config(bed, "bp", &[("a", &a)]);
    let script = format!(
        "D={DAEMON_IN_GUEST}; S=/tmp/brick-initiatord-p.sock; L=/tmp/initiatord-p.log\n\
         trap 'echo \"--- daemon log ---\"; cat $L 2>/dev/null' EXIT\n\
         P=/sys/class/rtrs-client/bp/paths\n\
         connected() {{ n=0; for p in $P/*; do [ \"$(cat $p/state 2>/dev/null)\" = connected ] && n=$((n + 1)); done; echo $n; }}\n\
         cat > /tmp/paths.toml <<'EOF'\n{config}EOF\n\
         $D --config /tmp/paths.toml --socket $S > $L 2>&1 &\n\
         pid=$!\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         d=$(basename \"$(readlink /dev/brick/a)\")\n\
         n=0; until [ \"$(connected)\" = 2 ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"not 2 connected paths: $(path_states bp)\"; sleep 0.1; done\n\
         victim=$(ls $P | tail -1)\n\
         log \"removing path $victim\"\n\
         echo 1 > $P/$victim/remove_path || die \"remove_path $victim refused\"\n\
         n=0; while [ -e $P/$victim ]; do n=$((n + 1)); [ $n -ge 100 ] && die \"$victim still listed after remove_path\"; sleep 0.1; done\n\
         log \"path $victim gone; waiting for the daemon\"\n\
         n=0; until [ \"$(cat $P/$victim/state 2>/dev/null)\" = connected ]; do n=$((n + 1)); [ $n -ge 600 ] && die \"$victim not re-added within 60 s: $(path_states bp)\"; sleep 0.1; done\n\
         log \"path $victim back: $(path_states bp | tr '\\n' ' ')\"\n\
         grep -q 'add_path' $L || die \"the daemon logged no add_path\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid\n\
         wait $pid; rc=$?\n\
         [ $rc = 0 ] || die \"daemon exited $rc on SIGTERM\"\n\
         unmap $d\n\
         rm -rf /dev/brick\n"
    );
    let output = bed.initiator.run(&script, 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// The shell around a daemon case's `body`: `D` (the daemon), `B` (the
/// `brick` command), the case's files `/tmp/TAG.{toml,sock,state,log}` as
/// `C`, `S`, `T`, `L` (the config already written), `start_daemon LOG`
/// (in the background, its pid in `pid`), `file_of NAME` (the device
/// `/dev/brick/NAME` links to) and `acted LOG` (the log's lines other
/// than start, stop and convergence: actions and notices). Every
/// `/tmp/TAG*.log` is printed if the body fails.
pub(super) fn daemon_script(tag: &str, config: &str, body: &str) -> String {
    format!(
        "D={DAEMON_IN_GUEST}; B={CLI_IN_GUEST}\n\
         C=/tmp/{tag}.toml; S=/tmp/{tag}.sock; T=/tmp/{tag}.state; L=/tmp/{tag}.log\n\
         file_of() {{ basename \"$(readlink /dev/brick/$1)\"; }}\n\
         acted() {{ grep -v -e 'started:' -e 'all volumes mapped' -e 'stopping on signal' \"$1\"; }}\n\
         start_daemon() {{ $D --config $C --socket $S --state $T > $1 2>&1 & pid=$!; }}\n\
         trap 'for f in /tmp/{tag}*.log; do echo \"--- $f ---\"; cat $f; done' EXIT\n\
         cat > $C <<'EOF'\n{config}EOF\n\
         {body}\
         trap - EXIT\n"
    )
}

/// Restarting the daemon changes nothing that is already right: after a
/// SIGTERM and after a SIGKILL, the new daemon logs no action for two
/// mapped volumes, and their devices and links stay. A bad config is
/// refused with its line, at start (exit 2, nothing mapped) and on SIGHUP
/// (the old config stays in force, nothing unmapped).
pub(super) fn daemon_restart_idempotent(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let (a, b) = (
        volumes[0].device_path.clone(),
        volumes[1].device_path.clone(),
    );
    let config = daemon_config(bed, "bi", &[("a", &a), ("b", &b)]);
    // The same volume name twice: refused, naming the second one's line.
    let bad = daemon_config(bed, "bi", &[("a", &a), ("a", &b)]);
    let bad_line = bad
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("name = \"a\""))
        .nth(1)
        .map_or(0, |(i, _)| i + 1);
    let body = format!(
        "cat > /tmp/bad.toml <<'EOF'\n{bad}EOF\n\
         mapped() {{ ls /sys/block | grep rnbd | tr '\\n' ' '; }}\n\
         start_daemon /tmp/bi.1.log\n\
         wait_for /dev/brick/a 60 && wait_for /dev/brick/b 60 || die \"links did not appear\"\n\
         n=0; until $D status --json --socket $S 2>/dev/null | grep -q '\"converged\":true'; do n=$((n + 1)); [ $n -ge 100 ] && die \"not converged\"; sleep 0.2; done\n\
         links=\"$(file_of a) $(file_of b)\"; devices=$(mapped)\n\
         log \"mapped: links $links, devices $devices\"\n\
         kill -TERM $pid; wait $pid || die \"daemon exited $? on SIGTERM\"\n\
         start_daemon /tmp/bi.2.log; sleep 3\n\
         if acted /tmp/bi.2.log; then die \"the restarted daemon acted (above)\"; fi\n\
         kill -KILL $pid; wait $pid\n\
         start_daemon /tmp/bi.3.log; sleep 3\n\
         if acted /tmp/bi.3.log; then die \"the daemon restarted after SIGKILL acted (above)\"; fi\n\
         [ \"$(file_of a) $(file_of b)\" = \"$links\" ] && [ \"$(mapped)\" = \"$devices\" ] || die \"restarts changed the mappings: $(file_of a) $(file_of b), $(mapped)\"\n\
         log \"two restarts, no action\"\n\
         $D --config /tmp/bad.toml --socket /tmp/bad.sock --state /tmp/bad.state > /tmp/bi.bad.log 2>&1; rc=$?\n\
         [ $rc = 2 ] || die \"a bad config exited $rc, expected 2\"\n\
         grep -q 'bad.toml:{bad_line}:.*volumes\\[1\\].name: expected a unique name' /tmp/bi.bad.log || die \"bad config message: $(cat /tmp/bi.bad.log)\"\n\
         [ \"$(mapped)\" = \"$devices\" ] || die \"a refused config mapped something: $(mapped)\"\n\
         cp /tmp/bad.toml $C; kill -HUP $pid; sleep 3\n\
         grep -q 'new config refused, keeping the old one: .*bi.toml:{bad_line}:' /tmp/bi.3.log || die \"SIGHUP with a bad config was not refused with its line\"\n\
         [ \"$(file_of a) $(file_of b)\" = \"$links\" ] && [ \"$(mapped)\" = \"$devices\" ] || die \"a refused reload changed the mappings\"\n\
         log \"bad config refused at start and on SIGHUP; nothing changed\"\n\
         kill -TERM $pid; wait $pid\n\
         unmap $(file_of a); unmap $(file_of b); rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("bi", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// `brick map`, `list` and `unmap` against the running daemon: a volume
/// mapped at run time appears under /dev/brick and verifies, `list` shows
/// it as `runtime`, a restarted daemon keeps it without acting, bad maps
/// are refused and leave nothing, `unmap` of a config volume is refused,
/// and `unmap` of the run-time one removes device and link for good.
pub(super) fn daemon_runtime_map(bed: &mut Bed) -> Result<()> {
    let volumes = &bed.target.descriptor.volumes;
    let (a, b) = (
        volumes[0].device_path.clone(),
        volumes[1].device_path.clone(),
    );
    let config = daemon_config(bed, "bm", &[("a", &a)]);
    let paths: String = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!(" --path {p}"))
        .collect();
    let body = format!(
        "start_daemon /tmp/bm.1.log\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         $B map x --session bm --device-path {b}{paths} --socket $S || die \"brick map x failed\"\n\
         [ -e /dev/brick/x ] || die \"brick map returned before /dev/brick/x existed\"\n\
         dx=$(file_of x); log \"x -> $dx\"\n\
         verify $dx 4k 4M\n\
         $B list --socket $S\n\
         $B list --json --socket $S | grep -q '\"name\":\"x\",\"origin\":\"runtime\"' || die \"list: $($B list --json --socket $S)\"\n\
         $B status --socket $S\n\
         if $B map y --session bm --device-path {b}{paths} --socket $S 2> /tmp/bm.err; then die \"a second map of {b} in session bm succeeded\"; fi\n\
         grep -q 'already mapped in session' /tmp/bm.err || die \"second map message: $(cat /tmp/bm.err)\"\n\
         if $B map z --session bm2 --device-path no-such-volume{paths} --socket $S 2> /tmp/bm.err; then die \"a map of a missing volume succeeded\"; fi\n\
         grep -q 'kernel refused' /tmp/bm.err || die \"missing-volume map message: $(cat /tmp/bm.err)\"\n\
         [ ! -e /dev/brick/y ] && [ ! -e /dev/brick/z ] || die \"a refused map left a link\"\n\
         if $B list --json --socket $S | grep -q '\"name\":\"z\"'; then die \"a refused map was kept\"; fi\n\
         kill -TERM $pid; wait $pid || die \"daemon exited $? on SIGTERM\"\n\
         start_daemon /tmp/bm.2.log; sleep 3\n\
         if acted /tmp/bm.2.log; then die \"the restarted daemon acted on a run-time volume (above)\"; fi\n\
         [ \"$(file_of x)\" = $dx ] || die \"the restart changed x\"\n\
         if $B unmap a --socket $S 2> /tmp/bm.err; then die \"unmap of a config volume succeeded\"; fi\n\
         grep -q 'remove it there and reload' /tmp/bm.err || die \"unmap a: $(cat /tmp/bm.err)\"\n\
         $B unmap x --socket $S || die \"brick unmap x failed\"\n\
         [ ! -e /sys/block/$dx ] && [ ! -e /dev/brick/x ] || die \"x still mapped or linked after unmap\"\n\
         sleep 2\n\
         [ ! -e /sys/block/$dx ] || die \"the daemon mapped x again after unmap\"\n\
         kill -TERM $pid; wait $pid\n\
         unmap $(file_of a); rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("bm", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// The target loses a volume and serves it again: the session's only path
/// is disconnected, another session (`thief`) opens the volume read-write,
/// the path comes back and rnbd's own reopen is refused (one writer), so
/// the device stays `closed` with a connected path, which the kernel never
/// retries. Once the thief lets go, the daemon's `remap_device` reopens it
/// and IO verifies.
pub(super) fn daemon_remaps_lost_volume(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    // The daemon waits 6 s before reviving the path: time for the thief.
    let config = daemon_config_with(
        bed,
        "reconnect_after_s = 6\nremap_after_s = 2\n",
        "br",
        &[("a", &a)],
    );
    let thief_paths: String = bed
        .all_paths()
        .split_whitespace()
        .map(|p| format!(" path=ip:{p}"))
        .collect();
    let body = format!(
        "start_daemon $L\n\
         wait_for /dev/brick/a 60 || die \"/dev/brick/a did not appear\"\n\
         d=$(file_of a); P=/sys/class/rtrs-client/br/paths\n\
         for p in $P/*; do echo 1 > $p/disconnect || die \"disconnect $p\"; done\n\
         log \"paths of br disconnected: $(path_states br | tr '\\n' ' ')\"\n\
         n=0; until echo \"sessname=thief{thief_paths} device_path={a}\" > /sys/devices/virtual/rnbd-client/ctl/map_device 2>/dev/null; do n=$((n + 1)); [ $n -ge 20 ] && die \"the thief could not open {a}\"; sleep 0.2; done\n\
         t=$(for m in /sys/block/rnbd*; do [ \"$(cat $m/rnbd/session)\" = thief ] && basename $m; done)\n\
         log \"thief holds {a} read-write as $t\"\n\
         n=0; until path_states br | grep -q ' connected$' && [ \"$(cat /sys/block/$d/rnbd/state)\" = closed ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"expected br connected and $d closed: $(path_states br), $(cat /sys/block/$d/rnbd/state)\"; sleep 0.1; done\n\
         log \"path back, $d closed: the target refused rnbd's reopen\"\n\
         sleep 4\n\
         [ \"$(cat /sys/block/$d/rnbd/state)\" = closed ] || die \"$d reopened while the thief held the volume\"\n\
         unmap $t\n\
         log \"thief let go\"\n\
         n=0; until [ \"$(cat /sys/block/$d/rnbd/state)\" = open ]; do n=$((n + 1)); [ $n -ge 300 ] && die \"$d not reopened within 30 s\"; sleep 0.1; done\n\
         grep -q \"remap a ($d)\" $L || die \"the daemon logged no remap\"\n\
         log \"$d open again after the daemon's remap_device\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid; wait $pid\n\
         unmap $d; rm -rf /dev/brick\n"
    );
    let output = bed
        .initiator
        .run(&daemon_script("br", &config, &body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}

/// A session RTRS gives up on (`max_reconnect_attempts` 1, its only path
/// cut until the one attempt has failed and the next would be due) stays
/// down after the link is back, for longer than RTRS's reconnect delay;
/// the daemon, started then, revives it (`reconnect`), rnbd reopens the
/// device, and IO verifies. The kernel's first connect after the long
/// outage may itself time out (measured: 30-60 s, against either target),
/// so the daemon gets 180 s and keeps writing `reconnect`.
pub(super) fn daemon_revives_given_up(bed: &mut Bed) -> Result<()> {
    let a = bed.target.descriptor.volumes[0].device_path.clone();
    let config = daemon_config_with(bed, "reconnect_after_s = 1\n", "bg", &[("a", &a)]);
    let body = "$D --config $C --once --socket $S --state $T > /tmp/bg.once.log 2>&1 || die \"--once failed\"\n\
         file_of a > /tmp/bg.dev\n\
         echo 1 > /sys/class/rtrs-client/bg/max_reconnect_attempts || die \"max_reconnect_attempts refused\"\n\
         log \"$(file_of a) mapped; session bg gives up after one reconnect attempt\"\n";
    bed.initiator
        .run(&daemon_script("bg", &config, body), MINUTE)?;
    step("cutting the only path until RTRS gives up");
    bed.relays[0].set_cut(true);
    // Heartbeats notice the cut (~30 s); after RTRS's delay (30 s) one
    // attempt fails (~30 s), after the next delay the path is closed.
    let wait_failed = "P=/sys/class/rtrs-client/bg/paths\n\
         n=0; while path_states bg | grep -q ' connected$'; do n=$((n + 1)); [ $n -ge 120 ] && die \"the cut went unnoticed\"; sleep 1; done\n\
         log \"noticed: $(path_states bg | tr '\\n' ' ')\"\n\
         n=0; until [ \"$(cut -d' ' -f2 $P/*/stats/reconnects)\" -ge 1 ] 2>/dev/null; do n=$((n + 1)); [ $n -ge 150 ] && die \"no failed reconnect: $(cat $P/*/stats/reconnects)\"; sleep 1; done\n\
         log \"one reconnect failed ($(cat $P/*/stats/reconnects)); waiting out the next delay\"\n\
         sleep 45\n";
    let failed = bed.initiator.run(wait_failed, 5 * MINUTE);
    bed.relays[0].set_cut(false);
    print!("{}", failed?);
    let body = "P=/sys/class/rtrs-client/bg/paths; d=$(cat /tmp/bg.dev)\n\
         log \"link back; the kernel alone for 45 s\"\n\
         sleep 45\n\
         if path_states bg | grep -q ' connected$'; then die \"the path came back without the daemon: RTRS did not give up ($(cat $P/*/stats/reconnects))\"; fi\n\
         log \"still down: $(path_states bg | tr '\\n' ' '), $d $(cat /sys/block/$d/rnbd/state)\"\n\
         start_daemon $L; t0=$(uptime_s)\n\
         n=0; until path_states bg | grep -q ' connected$' && [ \"$(cat /sys/block/$d/rnbd/state)\" = open ]; do n=$((n + 1)); [ $n -ge 1800 ] && die \"not revived within 180 s: $(path_states bg), $(cat /sys/block/$d/rnbd/state)\"; sleep 0.1; done\n\
         grep -q 'reconnect path .* of session bg' $L || die \"the daemon logged no reconnect\"\n\
         log \"revived by the daemon $(echo \"$t0 $(uptime_s)\" | awk '{print $2-$1}') s after it started ($(grep -c 'reconnect path' $L) reconnect lines): $(path_states bg | tr '\\n' ' ')\"\n\
         verify $d 4k 4M\n\
         kill -TERM $pid; wait $pid\n\
         unmap $d; rm -rf /dev/brick\n";
    let output = bed
        .initiator
        .run(&daemon_script("bg", &config, body), 5 * MINUTE)?;
    print!("{output}");
    Ok(())
}
