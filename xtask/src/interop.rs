//! Brick's software HCA against the real Linux peer, before any block
//! protocol: rdma-core `rping` in the Linux VM talks to Brick's rping tool
//! (`roce/examples/rping.rs`), which plugs into the VM's link through the
//! relay as a host process speaking QEMU's stream framing.
//!
//! Both directions run on one VM boot: `rping -c` (Linux client) against
//! the Brick server (this checks Brick's passive CM, RDMA READ as
//! requester, RDMA WRITE, SEND both ways), then the Brick client against
//! `rping -s` in the VM (Brick's active CM side).

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
    Ok(crate::paths::repo().join("target/release/examples/rping"))
}

/// A Brick rping process on the relay's target side.
struct BrickRping {
    child: Child,
    log: PathBuf,
}

impl BrickRping {
    fn spawn(binary: &Path, socket: &Path, log: PathBuf, args: &[&str]) -> Result<BrickRping> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .args(args)
            .arg("--link")
            .arg(format!("frame:connect:{}", socket.display()))
            .args(["--ip", &format!("{BRICK_IP}/24"), "--mac", BRICK_MAC])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("start Brick's rping")?;
        Ok(BrickRping { child, log })
    }

    /// Waits for the process to exit; returns its log, failing on a
    /// non-zero status or a timeout.
    fn finish(mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                if !status.success() {
                    bail!("Brick rping exited with {status}:\n{log}");
                }
                return Ok(log);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!(
                    "Brick rping did not finish in {} s:\n{log}",
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for BrickRping {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One interop case: (rping binary, relay socket for Brick, scratch dir, VM).
type RpingCase = fn(&Path, &Path, &Path, &mut Vm) -> Result<()>;

/// Runs the rping interop cases; prints one line per case.
pub fn suite(images: &Images, failures: &mut Vec<String>) -> Counts {
    let mut counts = Counts::default();
    let binary = match build_rping() {
        Ok(binary) => binary,
        Err(error) => {
            failures.push(format!("brick-rping build: {error:#}"));
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
            failures.push(format!("brick-rping relay: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let mut config = VmConfig::new("rping-linux");
    config.overlays = Overlays {
        fio: false,
        rping: true,
    };
    config.nics = vec![NicConfig {
        socket: relay.a.clone(),
        mac: "52:54:00:77:00:02".into(),
        address: format!("{LINUX_IP}/24"),
    }];
    let mut vm = match Vm::spawn(images, config).and_then(|mut vm| vm.wait_ready().map(|_| vm)) {
        Ok(vm) => vm,
        Err(error) => {
            failures.push(format!("brick-rping VM: {error:#}"));
            counts.failed += 1;
            return counts;
        }
    };
    let cases: [(&str, RpingCase); 2] = [
        ("linux_client_brick_server", linux_client_brick_server),
        ("brick_client_linux_server", brick_client_linux_server),
    ];
    for (name, case) in cases {
        let start = Instant::now();
        match case(&binary, &relay.b, &dir, &mut vm) {
            Ok(()) => {
                println!(
                    "vm brick-rping {name} ... ok ({:.1} s)",
                    start.elapsed().as_secs_f64()
                );
                counts.passed += 1;
            }
            Err(error) => {
                println!("vm brick-rping {name} ... FAILED");
                println!("{error:#}\n--- relay ---\n{}", relay.summary());
                failures.push(format!("brick-rping {name}"));
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
fn linux_client_brick_server(binary: &Path, socket: &Path, dir: &Path, vm: &mut Vm) -> Result<()> {
    let server = BrickRping::spawn(
        binary,
        socket,
        dir.join("server.log"),
        &["server", "--count", "3"],
    )?;
    let output = vm.run(
        &format!(
            "modprobe rdma_ucm\nwait_peer {BRICK_IP}\n\
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
fn brick_client_linux_server(binary: &Path, socket: &Path, dir: &Path, vm: &mut Vm) -> Result<()> {
    vm.run(
        &format!("modprobe rdma_ucm\nbg rps rping -s -a {LINUX_IP} -v -S 3000\nsleep 1\n"),
        Duration::from_secs(60),
    )?;
    let client = BrickRping::spawn(
        binary,
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
