//! The `brick-initiator` suite: Brick's initiator (the `brick` CLI) against
//! the hosted target as real processes on this host, through the judge's
//! frame relay, no VM: a verify workload through a lossy link (drop,
//! reorder, duplicate in both directions) with 0 data errors, and a target
//! killed and restarted under a write workload, after which the initiator
//! reconnects, re-opens its volume and finishes without an error; and
//! `brick-initiatord` serving a volume as an NBD export (Brick's userspace
//! initiator on UDP loopback) that `qemu-io` and `qemu-img` use with
//! verified data (`qemu-io` comes from Debian's `qemu-utils`; the case
//! fails, not skips, without it).

use crate::demo::{free_port, TargetProcess};
use crate::interop::HostTool;
use crate::relay::{Faults, Relay, A_TO_B, B_TO_A};
use crate::suite::Counts;
use crate::util::step;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A relay, a target behind it and the CLI's connection options.
struct Rig {
    relay: Relay,
    target: Option<TargetProcess>,
    target_binary: PathBuf,
    manifest: PathBuf,
    cli: PathBuf,
    dir: PathBuf,
    starts: u32,
}

impl Rig {
    fn new(
        target_binary: &Path,
        cli: &Path,
        dir: &Path,
        name: &str,
        manifest: &str,
    ) -> Result<Rig> {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let manifest_path = dir.join("manifest.toml");
        std::fs::write(&manifest_path, manifest)?;
        let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 0x1b1c, None)?;
        let mut rig = Rig {
            relay,
            target: None,
            target_binary: target_binary.to_path_buf(),
            manifest: manifest_path,
            cli: cli.to_path_buf(),
            dir,
            starts: 0,
        };
        rig.start_target()?;
        Ok(rig)
    }

    fn start_target(&mut self) -> Result<()> {
        self.starts += 1;
        let log = self.dir.join(format!("target-{}.log", self.starts));
        let target = TargetProcess::start(
            &self.target_binary,
            &self.manifest,
            &format!("frame:connect:{}", self.relay.b.display()),
            log,
        )?;
        // Listening, and connected to the relay.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.relay.side(1).0 {
            if Instant::now() > deadline {
                bail!(
                    "brick-target did not reach the relay in 10 s:\n{}",
                    target.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.target = Some(target);
        Ok(())
    }

    /// Kills the target (SIGKILL: a crash) and starts it again.
    fn crash_and_restart(&mut self) -> Result<()> {
        if let Some(mut target) = self.target.take() {
            let _ = target.child.kill();
            let _ = target.child.wait();
        }
        std::thread::sleep(Duration::from_millis(200));
        self.start_target()
    }

    /// `brick COMMAND` with the connection to this rig's target.
    fn brick(&self, command: &str, session: &str, args: &[&str], log: &str) -> Result<HostTool> {
        let mut all = vec![command.to_string()];
        all.extend(
            [
                "--link",
                &format!("frame:connect:{}", self.relay.a.display()),
                "--local",
                "10.77.0.2/24",
                "--target",
                "10.77.0.1",
                "--session",
                session,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        all.extend(args.iter().map(|s| s.to_string()));
        step(format!("brick {}", all.join(" ")));
        HostTool::spawn("brick", &self.cli, self.dir.join(log), &all)
    }

    fn target_log(&self) -> String {
        self.target
            .as_ref()
            .map(TargetProcess::log)
            .unwrap_or_default()
    }
}

const RAM_MANIFEST: &str = include_str!("../../examples/two-ram-volumes.toml");

/// 0.5 % drop, 1 % reorder, 1 % duplicate of RoCE frames, both directions:
/// `brick io verify` at 4 KiB, then 150 pieces of 512 B to 1 MiB at random
/// offsets, then a second session reading the first region back. The relay
/// must have applied every kind of fault.
fn lossy_verify(target: &Path, cli: &Path, dir: &Path) -> Result<()> {
    let rig = Rig::new(target, cli, dir, "lossy", RAM_MANIFEST)?;
    for direction in [A_TO_B, B_TO_A] {
        rig.relay.set_faults(
            direction,
            Faults {
                drop_rate: 0.005,
                reorder_rate: 0.01,
                duplicate_rate: 0.01,
                ..Faults::default()
            },
        );
    }
    let runs: [(&str, &[&str]); 3] = [
        (
            "lossy1",
            &[
                "--volume",
                "vol0",
                "verify",
                "--size",
                "4M",
                "--bs",
                "4k",
                "--pattern",
                "21",
            ],
        ),
        (
            "lossy2",
            &[
                "--volume",
                "vol0",
                "verify",
                "--offset",
                "16M",
                "--size",
                "32M",
                "--bs",
                "1M",
                "--min-bs",
                "512",
                "--random",
                "150",
                "--pattern",
                "22",
            ],
        ),
        (
            "lossy3",
            &[
                "--volume",
                "vol0",
                "read",
                "--size",
                "4M",
                "--bs",
                "64k",
                "--pattern",
                "21",
            ],
        ),
    ];
    for (session, args) in runs {
        let output = rig
            .brick("io", session, args, &format!("{session}.log"))?
            .finish(Duration::from_secs(300))?;
        for line in output.lines().filter(|l| !l.contains('%')) {
            println!("    {line}");
        }
    }
    let (ab, ba) = (rig.relay.stats(A_TO_B), rig.relay.stats(B_TO_A));
    println!("    relay: {}", rig.relay.summary());
    if ab.dropped + ba.dropped == 0
        || ab.reordered + ba.reordered == 0
        || ab.duplicated + ba.duplicated == 0
    {
        bail!(
            "the relay did not apply every fault: {}",
            rig.relay.summary()
        );
    }
    Ok(())
}

/// A 4 KiB random-write benchmark at queue depth 16 runs for 8 s; 2.5 s in,
/// the target is SIGKILLed and restarted. The benchmark must finish with 0
/// errors and at least one reconnect (IO is held while the session is
/// down, then re-issued on the re-opened volume); a verify afterwards works.
fn restart_under_io(target: &Path, cli: &Path, dir: &Path) -> Result<()> {
    let mut rig = Rig::new(target, cli, dir, "restart", RAM_MANIFEST)?;
    let bench = rig.brick(
        "bench",
        "restart1",
        &[
            "--volume",
            "vol0",
            "--rw",
            "randwrite",
            "--bs",
            "4k",
            "--qd",
            "16",
            "--runtime",
            "8",
            "--size",
            "32M",
            "--json",
        ],
        "bench.log",
    )?;
    std::thread::sleep(Duration::from_millis(2500));
    step("killing brick-target (SIGKILL) under IO and starting it again");
    rig.crash_and_restart()?;
    let output = bench.finish(Duration::from_secs(120))?;
    let json = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("brick bench printed no JSON:\n{output}"))?;
    let value: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("parse {json}"))?;
    let errors = value["errors"].as_u64().unwrap_or(u64::MAX);
    let reconnects = value["initiator"]["reconnects"].as_u64().unwrap_or(0);
    let writes = value["write"]["ios"].as_u64().unwrap_or(0);
    println!(
        "    bench across the restart: {writes} writes, {errors} errors, {reconnects} reconnects"
    );
    if errors != 0 || reconnects == 0 || writes == 0 {
        bail!(
            "expected 0 errors and a reconnect across the restart:\n{json}\n--- target ---\n{}",
            rig.target_log()
        );
    }
    if !rig.target_log().contains("session \"restart1\" opened") {
        bail!(
            "the restarted target never saw the session come back:\n{}",
            rig.target_log()
        );
    }
    rig.brick(
        "io",
        "restart2",
        &["--volume", "vol0", "verify", "--size", "4M", "--bs", "128k"],
        "verify.log",
    )?
    .finish(Duration::from_secs(120))?;
    Ok(())
}

/// `qemu-io`/`qemu-img` with their output; fails if the tool is missing.
fn qemu_tool(tool: &str, args: &[&str]) -> Result<(bool, String)> {
    step(format!("{tool} {}", args.join(" ")));
    let output = match Command::new(tool).args(args).stdin(Stdio::null()).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{tool} is not installed: the NBD export case needs it \
             (Debian package qemu-utils: apt-get install -y qemu-utils; .ci/run installs it)"
        ),
        Err(e) => return Err(e).with_context(|| format!("run {tool}")),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}

/// `qemu-io -f raw` with `commands` on `url`; every command must succeed
/// and every `read -P` verify (qemu-io may exit 0 after a mismatch, so
/// its output is checked too).
fn qemu_io_ok(url: &str, commands: &[&str]) -> Result<String> {
    let mut args = vec!["-f", "raw"];
    for command in commands {
        args.extend(["-c", command]);
    }
    args.push(url);
    let (ok, output) = qemu_tool("qemu-io", &args)?;
    if !ok
        || output.contains("Pattern verification failed")
        || output.contains("failed")
        || output.contains("error")
    {
        bail!("qemu-io {} failed:\n{output}", commands.join(" ; "));
    }
    Ok(output)
}

/// `brick-initiatord` with the config at `dir/initiator.toml`, kept off the
/// real /sys (`--root`); waits until its export listens.
fn start_initiatord(daemon: &Path, dir: &Path, run: u32) -> Result<TargetProcess> {
    let log = dir.join(format!("initiatord-{run}.log"));
    let file = std::fs::File::create(&log)?;
    let root = dir.join("root");
    std::fs::create_dir_all(&root)?;
    step(format!(
        "brick-initiatord --config {} (run {run})",
        dir.join("initiator.toml").display()
    ));
    let child = Command::new(daemon)
        .args([
            "--config",
            &dir.join("initiator.toml").display().to_string(),
        ])
        .args(["--socket", &dir.join("control.sock").display().to_string()])
        .args(["--root", &root.display().to_string()])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("start brick-initiatord")?;
    let mut process = TargetProcess { child, log };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !process.log().contains("listening on nbd:") {
        if let Ok(Some(status)) = process.child.try_wait() {
            bail!("brick-initiatord exited ({status}):\n{}", process.log());
        }
        if Instant::now() > deadline {
            bail!(
                "brick-initiatord's export did not listen in 20 s:\n{}",
                process.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(process)
}

/// The config of [`nbd_export_qemu_io`]: `vol0` exported at `export`.
fn nbd_config(dir: &Path, export: &str, port: u16) -> Result<()> {
    std::fs::write(
        dir.join("initiator.toml"),
        format!(
            "[[volumes]]\n\
             name = \"vol0\"\n\
             session = \"nbd-export\"\n\
             device_path = \"vol0\"\n\
             paths = [\"127.0.0.1\"]\n\
             export = \"{export}\"\n\
             link = \"udp:127.0.0.2:{port}\"\n"
        ),
    )?;
    Ok(())
}

/// The qemu-io writes of [`nbd_export_qemu_io`]: (pattern, offset,
/// length), including pieces not aligned to 64 KiB or even to 512 bytes,
/// and a 1 MiB one.
const NBD_WRITES: [(u8, u64, u64); 5] = [
    (0xa5, 0, 4096),
    (0xa5, 4096 * 3, 12288),
    (0xa5, 65536 + 512, 1 << 20),
    (0x5c, 3 * (1 << 20) + 1000, 70_000),
    (0x3e, 8 * (1 << 20) - 7, 11),
];

/// `brick-target` on UDP loopback (a 64 MiB RAM `vol0`) and
/// `brick-initiatord` exporting it over NBD on a unix socket, mapped with
/// Brick's userspace initiator: `qemu-io` writes patterns at several
/// offsets and lengths, flushes, reads them back verified; a read past the
/// end fails; `qemu-img info` reports 64 MiB. Then the daemon is stopped
/// (the socket must go), Brick's CLI reads the first region back through
/// its own session, and the daemon restarted with a loopback TCP export
/// serves a second `qemu-io` that verifies everything again: the data
/// reached the target.
fn nbd_export_qemu_io(target: &Path, cli: &Path, dir: &Path) -> Result<()> {
    // Built next to the CLI by `suite`.
    let daemon = cli.with_file_name("brick-initiatord");
    let dir = dir.join("nbd");
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let manifest = dir.join("loopback.toml");
    std::fs::write(&manifest, include_str!("../../examples/loopback.toml"))?;
    let log = dir.join("target.log");
    step(format!(
        "brick-target on udp:127.0.0.1:{port} (examples/loopback.toml)"
    ));
    let target_process =
        TargetProcess::start(target, &manifest, &format!("udp:127.0.0.1:{port}"), log)?;

    let socket = dir.join("vol0.nbd");
    nbd_config(&dir, &format!("nbd:unix:{}", socket.display()), port)?;
    let url = format!("nbd+unix:///vol0?socket={}", socket.display());

    let first = start_initiatord(&daemon, &dir, 1)?;
    if !socket.exists() {
        bail!(
            "brick-initiatord listens but {} is missing",
            socket.display()
        );
    }
    let mut commands: Vec<String> = NBD_WRITES
        .iter()
        .map(|(p, offset, len)| format!("write -P {p:#x} {offset} {len}"))
        .collect();
    commands.push("flush".into());
    commands.extend(
        NBD_WRITES
            .iter()
            .map(|(p, offset, len)| format!("read -P {p:#x} {offset} {len}")),
    );
    let refs: Vec<&str> = commands.iter().map(String::as_str).collect();
    let output = qemu_io_ok(&url, &refs)?;
    let verified = output.matches("read ").count();
    if verified != NBD_WRITES.len() {
        bail!(
            "expected {} verified reads, qemu-io printed:\n{output}",
            NBD_WRITES.len()
        );
    }
    println!(
        "    qemu-io: {} writes, flush, {verified} pattern-verified reads",
        NBD_WRITES.len()
    );

    // A mismatch is noticed (the check above is not vacuous).
    let (_, output) = qemu_tool(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0xa5 4096 512", &url],
    )?;
    if !output.contains("Pattern verification failed") {
        bail!("qemu-io did not notice a wrong pattern:\n{output}");
    }
    // Past the end (64 MiB): must fail.
    let (ok, output) = qemu_tool("qemu-io", &["-f", "raw", "-c", "read 67108352 1024", &url])?;
    if ok && !output.contains("failed") {
        bail!("a read past the end succeeded:\n{output}");
    }
    println!(
        "    qemu-io: read past the end refused ({})",
        output.trim().lines().next().unwrap_or("")
    );
    let (ok, output) = qemu_tool("qemu-img", &["info", "-f", "raw", &url])?;
    if !ok || !output.contains("(67108864 bytes)") {
        bail!("qemu-img info does not report 64 MiB:\n{output}");
    }
    println!("    qemu-img info: virtual size 64 MiB (67108864 bytes)");

    step("stopping brick-initiatord (SIGTERM)");
    let first_log = first.log.clone();
    drop(first);
    let text = std::fs::read_to_string(&first_log).unwrap_or_default();
    if socket.exists() || !text.contains("session closed") {
        bail!("brick-initiatord did not remove its socket and close its session:\n{text}");
    }

    // Brick's own CLI, its own session, read-only: the first 4 KiB.
    let output = HostTool::spawn(
        "brick",
        cli,
        dir.join("brick-read.log"),
        &[
            "io",
            "--link",
            &format!("udp:127.0.0.3:{port}"),
            "--target",
            "127.0.0.1",
            "--session",
            "nbd-check",
            "--volume",
            "vol0",
            "--ro",
            "read",
            "--dump",
            "--size",
            "4k",
            "--bs",
            "4k",
        ]
        .map(String::from),
    )?
    .finish(Duration::from_secs(60))?;
    if !output.contains(&"a5 ".repeat(16)) {
        bail!("brick io read does not see qemu-io's 0xa5 at offset 0:\n{output}");
    }
    println!("    brick io read --dump: offset 0 holds qemu-io's 0xa5");

    // The second run exports over loopback TCP instead.
    let tcp_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    nbd_config(&dir, &format!("nbd:tcp:127.0.0.1:{tcp_port}"), port)?;
    let second = start_initiatord(&daemon, &dir, 2)?;
    let reads: Vec<String> = NBD_WRITES
        .iter()
        .map(|(p, offset, len)| format!("read -P {p:#x} {offset} {len}"))
        .collect();
    let refs: Vec<&str> = reads.iter().map(String::as_str).collect();
    qemu_io_ok(&format!("nbd://127.0.0.1:{tcp_port}/vol0"), &refs)?;
    println!(
        "    after a daemon restart (now on nbd:tcp:127.0.0.1:{tcp_port}), a second qemu-io \
         verified every region again"
    );
    drop(second);
    drop(target_process);
    Ok(())
}

type HostCase = fn(&Path, &Path, &Path) -> Result<()>;

/// Runs the suite; prints one line per case.
pub fn suite(failures: &mut Vec<String>) -> Counts {
    let mut counts = Counts::default();
    // brick-initiatord lands next to `brick` (nbd_export_qemu_io).
    let tools = crate::util::build_release_bins(&[
        ("brick-target-image", "brick-target"),
        ("brick-cli", "brick"),
        ("brick-initiatord", "brick-initiatord"),
    ]);
    let (target, cli) = match tools {
        Ok(paths) => (paths[0].clone(), paths[1].clone()),
        Err(error) => {
            failures.push(format!("brick-initiator build: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let dir = crate::paths::scratch("initiator");
    let cases: [(&str, HostCase); 3] = [
        ("lossy_verify", lossy_verify),
        ("restart_under_io", restart_under_io),
        ("nbd_export_qemu_io", nbd_export_qemu_io),
    ];
    for (name, case) in cases {
        let start = Instant::now();
        match case(&target, &cli, &dir) {
            Ok(()) => {
                println!(
                    "host brick-initiator {name} ... ok ({:.1} s)",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!("host brick-initiator {name} ... FAILED\n{error:#}");
                failures.push(format!("brick-initiator {name}"));
                counts.failed += 1;
            }
        }
    }
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    counts
}
