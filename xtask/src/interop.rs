//! Brick's software HCA against the real Linux peer, before any block
//! protocol: rdma-core `rping` in the Linux VM talks to Brick's rping tool
//! (`roce/examples/rping.rs`), which plugs into the VM's link through the
//! relay as a host process speaking QEMU's stream framing.
//!
//! Both directions run on one VM boot: `rping -c` (Linux client) against
//! the Brick server (this checks Brick's passive CM, RDMA READ as
//! requester, RDMA WRITE, SEND both ways), then the Brick client against
//! `rping -s` in the VM (Brick's active CM side). Then the block protocol:
//! Brick's initiator (the `brick` CLI) maps a brd disk from the Linux
//! `rnbd_server` in the same VM, writes, verifies, reads back from a second
//! session and runs a short benchmark: Brick's client side of RTRS/RNBD is
//! accepted by the real Linux server.

use crate::qemu::{NicConfig, Vm, VmConfig};
use crate::relay::Relay;
use crate::suite::Counts;
use crate::util::step;
use crate::vmimage::{Images, Overlays};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BRICK_IP: &str = "10.77.0.1";
const BRICK_MAC: &str = "52:54:00:77:00:01";
const LINUX_IP: &str = "10.77.0.2";

/// Builds Brick's rping tool and returns its path.
fn build_rping() -> Result<PathBuf> {
    step("building Brick's rping tool (roce/examples/rping.rs)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::util::run(Command::new(cargo).current_dir(crate::paths::repo()).args([
        "build",
        "--release",
        "-p",
        "brick-roce",
        "--example",
        "rping",
        "--features",
        "std",
    ]))?;
    Ok(crate::paths::target_dir().join("release/examples/rping"))
}

/// Builds the `brick` CLI and returns its path.
fn build_cli() -> Result<PathBuf> {
    Ok(crate::util::build_release_bins(&[("brick-cli", "brick")])?.remove(0))
}

/// A Brick tool process plugged into the relay's target side.
pub(crate) struct HostTool {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl HostTool {
    pub(crate) fn spawn(
        name: &'static str,
        binary: &Path,
        log: PathBuf,
        args: &[String],
    ) -> Result<HostTool> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        Ok(HostTool { name, child, log })
    }

    /// Brick's rping with the link and Brick's address appended.
    fn rping(binary: &Path, socket: &Path, log: PathBuf, args: &[&str]) -> Result<HostTool> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend([
            "--link".into(),
            format!("frame:connect:{}", socket.display()),
            "--ip".into(),
            format!("{BRICK_IP}/24"),
            "--mac".into(),
            BRICK_MAC.into(),
        ]);
        HostTool::spawn("Brick rping", binary, log, &all)
    }

    /// Waits for the process to exit; returns its log, failing on a
    /// non-zero status or a timeout.
    pub(crate) fn finish(mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                if !status.success() {
                    bail!("{} exited with {status}:\n{log}", self.name);
                }
                return Ok(log);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!(
                    "{} did not finish in {} s:\n{log}",
                    self.name,
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for HostTool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host tools the cases run.
struct Tools {
    rping: PathBuf,
    cli: PathBuf,
}

/// One interop case: (tools, relay socket for Brick, scratch dir, VM).
type InteropCase = fn(&Tools, &Path, &Path, &mut Vm) -> Result<()>;

/// Runs the rping interop cases; prints one line per case.
pub fn suite(images: &Images, failures: &mut Vec<String>) -> Counts {
    let mut counts = Counts::default();
    let tools = match build_rping().and_then(|rping| {
        Ok(Tools {
            rping,
            cli: build_cli()?,
        })
    }) {
        Ok(tools) => tools,
        Err(error) => {
            failures.push(format!("brick-interop build: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let dir = crate::paths::scratch("rping");
    let relay = match Relay::start(
        &dir.join("a.sock"),
        &dir.join("b.sock"),
        7,
        Some(&dir.join("rping.pcap")),
    ) {
        Ok(relay) => relay,
        Err(error) => {
            failures.push(format!("brick-interop relay: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let mut config = VmConfig::new("rping-linux");
    config.overlays = Overlays {
        fio: false,
        rping: true,
        ext4: false,
    };
    config.nics = vec![NicConfig {
        socket: relay.a.clone(),
        mac: "52:54:00:77:00:02".into(),
        address: format!("{LINUX_IP}/24"),
    }];
    let mut vm = match Vm::spawn(images, config).and_then(|mut vm| vm.wait_ready().map(|_| vm)) {
        Ok(vm) => vm,
        Err(error) => {
            failures.push(format!("brick-interop VM: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let cases: [(&str, InteropCase); 3] = [
        ("linux_client_brick_server", linux_client_brick_server),
        ("brick_client_linux_server", brick_client_linux_server),
        (
            "brick_initiator_linux_rnbd_server",
            brick_initiator_linux_rnbd_server,
        ),
    ];
    for (name, case) in cases {
        let start = Instant::now();
        match case(&tools, &relay.b, &dir, &mut vm) {
            Ok(()) => {
                println!(
                    "vm brick-interop {name} ... ok ({:.1} s)",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!("vm brick-interop {name} ... FAILED");
                println!("{error:#}\n--- relay ---\n{}", relay.summary());
                failures.push(format!("brick-interop {name}"));
                counts.failed += 1;
            }
        }
    }
    if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    counts
}

/// Linux `rping -c` against the Brick rping server: 3 pings of 3000 bytes
/// (multi-packet READ responses and WRITEs at path MTU 1024), verified.
fn linux_client_brick_server(tools: &Tools, socket: &Path, dir: &Path, vm: &mut Vm) -> Result<()> {
    let server = HostTool::rping(
        &tools.rping,
        socket,
        dir.join("server.log"),
        &["server", "--count", "3"],
    )?;
    let output = vm.run(
        &format!(
            "modprobe rdma_ucm\n\
             rping -c -a {BRICK_IP} -v -V -C 3 -S 3000 || die \"rping client failed\"\n"
        ),
        Duration::from_secs(120),
    )?;
    if !output.contains("rdma-ping-2: ") {
        bail!("Linux rping client did not complete 3 pings:\n{output}");
    }
    let log = server.finish(Duration::from_secs(30))?;
    step(format!(
        "Brick rping server: {}",
        log.lines().last().unwrap_or("")
    ));
    Ok(())
}

/// The Brick rping client against Linux `rping -s` in the VM.
fn brick_client_linux_server(tools: &Tools, socket: &Path, dir: &Path, vm: &mut Vm) -> Result<()> {
    vm.run(
        &format!("modprobe rdma_ucm\nbg rps rping -s -a {LINUX_IP} -v -S 3000\nsleep 1\n"),
        Duration::from_secs(60),
    )?;
    let client = HostTool::rping(
        &tools.rping,
        socket,
        dir.join("client.log"),
        &[
            "client", "--server", LINUX_IP, "--size", "3000", "--count", "3", "--verify",
        ],
    )?;
    let log = client.finish(Duration::from_secs(120))?;
    step(format!(
        "Brick rping client: {}",
        log.lines().last().unwrap_or("")
    ));
    let server = vm.run(
        "bgwait rps 30 || die \"rping server failed\"",
        Duration::from_secs(60),
    )?;
    if !server.contains("rdma-ping-2: ") {
        bail!("Linux rping server did not see 3 pings:\n{server}\n--- Brick client ---\n{log}");
    }
    Ok(())
}

/// Brick's initiator against the Linux `rnbd_server` in the VM (brd disks
/// of 64 MiB): `brick io verify` at 4 KiB and 128 KiB, a second session
/// reading back what the first wrote, and a 5-second 4 KiB random-read
/// benchmark at queue depth 8 whose JSON must report IOPS. The Linux
/// server must have seen the sessions come and go without an error.
fn brick_initiator_linux_rnbd_server(
    tools: &Tools,
    socket: &Path,
    dir: &Path,
    vm: &mut Vm,
) -> Result<()> {
    vm.run("serve_rnbd 2 64\n", Duration::from_secs(60))?;
    let link = format!("frame:connect:{}", socket.display());
    let common = |session: &str| -> Vec<String> {
        [
            "--link",
            &link,
            "--local",
            &format!("{BRICK_IP}/24"),
            "--mac",
            BRICK_MAC,
            "--target",
            LINUX_IP,
            "--session",
            session,
            "--volume",
            "ram0",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let runs: [(&str, &str, &[&str]); 4] = [
        (
            "io",
            "brick1",
            &["verify", "--size", "4M", "--bs", "4k", "--pattern", "11"],
        ),
        (
            "io",
            "brick1",
            &[
                "verify",
                "--offset",
                "8M",
                "--size",
                "8M",
                "--bs",
                "128k",
                "--pattern",
                "12",
            ],
        ),
        (
            "io",
            "brick2",
            &[
                "read",
                "--offset",
                "8M",
                "--size",
                "8M",
                "--bs",
                "128k",
                "--pattern",
                "12",
            ],
        ),
        (
            "bench",
            "brick3",
            &[
                "--rw",
                "randread",
                "--bs",
                "4k",
                "--qd",
                "8",
                "--runtime",
                "5",
                "--size",
                "16M",
                "--json",
            ],
        ),
    ];
    let mut bench_json = String::new();
    for (index, (command, session, args)) in runs.iter().enumerate() {
        let mut all = vec![command.to_string()];
        all.extend(common(session));
        all.extend(args.iter().map(|a| a.to_string()));
        step(format!("brick {}", all.join(" ")));
        let tool = HostTool::spawn(
            "brick",
            &tools.cli,
            dir.join(format!("brick-{index}.log")),
            &all,
        )?;
        let log = tool.finish(Duration::from_secs(180))?;
        for line in log.lines().filter(|l| !l.contains('\r')).take(20) {
            println!("    {line}");
        }
        if *command == "bench" {
            bench_json = log;
        }
    }
    let json_line = bench_json
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("brick bench --json printed no JSON object:\n{bench_json}"))?;
    let value: serde_json::Value =
        serde_json::from_str(json_line).with_context(|| format!("parse {json_line}"))?;
    let iops = find_number(&value, "iops").unwrap_or(0.0);
    if iops <= 0.0 {
        bail!("brick bench against rnbd_server reported no IOPS: {json_line}");
    }
    let kernel = vm.run(
        "dmesg | grep -iE 'rnbd|rtrs' | tail -40",
        Duration::from_secs(30),
    )?;
    let trouble: Vec<&str> = kernel
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            // Whole words: the module banner says "always_invalidate".
            let words: Vec<&str> = l
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .collect();
            words
                .iter()
                .any(|w| matches!(*w, "error" | "err" | "failed" | "fail" | "invalid"))
                && !l.contains("module verification failed")
        })
        .collect();
    if !trouble.is_empty() {
        // What Brick's side saw of the same sessions: every log line that is
        // not IO progress (path events, reconnects, the reports).
        let mut brick_side = String::new();
        for index in 0..runs.len() {
            let log =
                std::fs::read_to_string(dir.join(format!("brick-{index}.log"))).unwrap_or_default();
            for line in log
                .lines()
                .filter(|l| !l.contains('\r') && !l.contains(" IOPS "))
            {
                brick_side.push_str(&format!("brick-{index}: {line}\n"));
            }
        }
        bail!(
            "the Linux server logged trouble with Brick's initiator:\n{}\n--- Linux rtrs/rnbd log ---\n{kernel}\n--- Brick's logs ---\n{brick_side}",
            trouble.join("\n")
        );
    }
    Ok(())
}

/// The first number under a key named `key` (any depth) in a JSON value.
fn find_number(value: &serde_json::Value, key: &str) -> Option<f64> {
    match value {
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k == key {
                v.as_f64()
            } else {
                find_number(v, key)
            }
        }),
        serde_json::Value::Array(items) => items.iter().find_map(|v| find_number(v, key)),
        _ => None,
    }
}
