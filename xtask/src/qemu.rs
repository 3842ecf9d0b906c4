//! Booting a Linux judge VM under QEMU and running commands inside it.
//!
//! The console (ttyS0) goes to `console.log` in the VM's scratch directory;
//! the second serial port (ttyS1) is a Unix socket on which the guest's
//! agent (`qemu/guest/agent.sh`) runs the host's shell scripts and returns
//! their output and exit status. NICs are QEMU stream netdevs on Unix
//! sockets (`-netdev stream`, 4-byte big-endian length framing), the only
//! host-local link that is both lossless and free of Nagle delays.

use crate::paths;
use crate::vmimage::{Images, Overlays};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One NIC of a VM: which stream socket it connects to and its addresses.
#[derive(Clone, Debug)]
pub struct NicConfig {
    /// The Unix socket of the link (a relay side listens there).
    pub socket: PathBuf,
    /// MAC address.
    pub mac: String,
    /// IPv4 address with prefix, e.g. `10.77.0.2/24`.
    pub address: String,
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Short name for logs ("initiator", "linux-target").
    pub name: String,
    /// Guest memory.
    pub memory_mib: u32,
    /// vCPUs (RTRS opens nr_cpus + 1 connections per path).
    pub cpus: u32,
    /// NICs, eth0 first.
    pub nics: Vec<NicConfig>,
    /// Link MTU (1500 gives rxe a 1024-byte path MTU, 9000 gives 4096).
    pub mtu: u32,
    /// Initramfs overlays.
    pub overlays: Overlays,
    /// Extra host files (static binaries) put into the guest: host path, guest path.
    pub extra_files: Vec<(PathBuf, String)>,
    /// Raw disk images, virtio-blk in order (`/dev/vda`, `/dev/vdb`, ...).
    pub disks: Vec<PathBuf>,
}

impl VmConfig {
    /// A VM with the defaults the judge uses.
    pub fn new(name: &str) -> VmConfig {
        VmConfig {
            name: name.to_string(),
            memory_mib: 1024,
            cpus: 1,
            nics: Vec::new(),
            mtu: 1500,
            overlays: Overlays::default(),
            extra_files: Vec::new(),
            disks: Vec::new(),
        }
    }
}

/// The result of one command run in the guest.
#[derive(Debug)]
pub struct Output {
    /// Exit status of the script.
    pub status: i32,
    /// stdout and stderr, interleaved.
    pub text: String,
}

/// A running VM.
pub struct Vm {
    /// The configuration it was booted with.
    pub config: VmConfig,
    child: Child,
    control: Option<Channel>,
    diag: Option<Channel>,
    dir: PathBuf,
    next_nonce: u64,
    booted_at: Instant,
}

/// How long a boot may take under TCG before it counts as hung.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

impl Vm {
    /// Starts QEMU; call [`Vm::wait_ready`] before running commands.
    pub fn spawn(images: &Images, config: VmConfig) -> Result<Vm> {
        let dir = paths::scratch(&config.name);
        let initrd = dir.join("initrd.cpio");
        images.initrd(config.overlays, &config.extra_files, &initrd)?;
        let control_path = dir.join("ctl.sock");
        let net: Vec<String> = config
            .nics
            .iter()
            .enumerate()
            .map(|(i, nic)| format!("eth{i}:{}", nic.address))
            .collect();
        let append = format!(
            "console=ttyS0 loglevel=4 panic=-1 brick.name={} brick.mtu={} brick.net={}",
            config.name,
            config.mtu,
            net.join(",")
        );
        crate::setup::qemu()?;
        let mut command = Command::new("qemu-system-x86_64");
        command
            .args([
                "-accel",
                "tcg",
                "-cpu",
                "max",
                "-nodefaults",
                "-no-user-config",
            ])
            .args(["-display", "none", "-no-reboot", "-vga", "none"])
            .args(["-m", &config.memory_mib.to_string()])
            .args(["-smp", &config.cpus.to_string()])
            .arg("-kernel")
            .arg(&images.kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", &append])
            .arg("-chardev")
            .arg(format!(
                "file,id=console,path={}",
                dir.join("console.log").display()
            ))
            .args(["-serial", "chardev:console"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=control,path={},server=on,wait=off",
                control_path.display()
            ))
            .args(["-serial", "chardev:control"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=diag,path={},server=on,wait=off",
                dir.join("diag.sock").display()
            ))
            .args(["-serial", "chardev:diag"]);
        for (i, nic) in config.nics.iter().enumerate() {
            command
                .arg("-netdev")
                .arg(format!(
                    "stream,id=n{i},server=off,addr.type=unix,addr.path={}",
                    nic.socket.display()
                ))
                .arg("-device")
                .arg(format!(
                    "virtio-net-pci,netdev=n{i},mac={},romfile=",
                    nic.mac
                ));
        }
        for (i, disk) in config.disks.iter().enumerate() {
            command
                .arg("-drive")
                .arg(format!(
                    "file={},if=none,id=disk{i},format=raw,cache=writeback",
                    disk.display()
                ))
                .arg("-device")
                .arg(format!("virtio-blk-pci,drive=disk{i}"));
        }
        let log = std::fs::File::create(dir.join("qemu.log"))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let die_with_harness = || {
            // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of the calling
            // (child) process and touches no memory of ours.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            Ok(())
        };
        // SAFETY: the closure runs in the forked child before exec and only
        // calls prctl, which is async-signal-safe; it touches no Rust state.
        // It makes QEMU die with the harness, so an interrupted test leaves
        // no QEMU burning a core.
        unsafe { command.pre_exec(die_with_harness) };
        let child = command.spawn().context("start qemu-system-x86_64")?;
        Ok(Vm {
            config,
            child,
            control: None,
            diag: None,
            dir,
            next_nonce: 1,
            booted_at: Instant::now(),
        })
    }

    /// Waits until the guest agents answer; returns the boot time.
    pub fn wait_ready(&mut self) -> Result<Duration> {
        let deadline = self.booted_at + BOOT_TIMEOUT;
        for (name, slot) in [("ctl.sock", 0), ("diag.sock", 1)] {
            let path = self.dir.join(name);
            let channel = loop {
                self.check_alive()?;
                match Channel::connect(&path) {
                    Ok(channel) => break channel,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(error) => return Err(self.failure(&format!("{name}: {error}"))),
                }
            };
            if slot == 0 {
                self.control = Some(channel);
            } else {
                self.diag = Some(channel);
            }
        }
        let mut last_hello = Instant::now() - Duration::from_secs(10);
        loop {
            if last_hello.elapsed() > Duration::from_secs(2) {
                self.control()?.send_line("HELLO")?;
                last_hello = Instant::now();
            }
            let wait = Instant::now() + Duration::from_millis(500);
            if let Some(line) = self.read_control_line(wait)? {
                if line.trim_end() == "@@BRICK-READY" {
                    let took = self.booted_at.elapsed();
                    crate::util::step(format!(
                        "{} booted in {:.1} s",
                        self.config.name,
                        took.as_secs_f64()
                    ));
                    return Ok(took);
                }
            }
            if Instant::now() > deadline {
                return Err(self.failure("the guest agent never answered"));
            }
        }
    }

    /// Runs a script (lib.sh loaded) and returns its status and output.
    pub fn sh(&mut self, script: &str, timeout: Duration) -> Result<Output> {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.control()?.send_run(nonce, script)?;
        let deadline = Instant::now() + timeout;
        let marker = format!("@@BRICK-RC {nonce} ");
        let mut text = String::new();
        loop {
            match self.read_control_line(deadline)? {
                Some(line) => {
                    if let Some(status) = line.trim_end().strip_prefix(&marker) {
                        let status = status.parse().unwrap_or(-1);
                        return Ok(Output { status, text });
                    }
                    if !line.starts_with("@@BRICK-READY") {
                        text.push_str(&line);
                    }
                }
                None => {
                    return Err(self.failure(&format!(
                        "command timed out after {} s:\n{script}\n--- output so far ---\n{text}",
                        timeout.as_secs()
                    )))
                }
            }
        }
    }

    /// Runs a script that must succeed; returns its output. A failure
    /// carries the output, the console and dmesg.
    pub fn run(&mut self, script: &str, timeout: Duration) -> Result<String> {
        let output = self.sh(script, timeout)?;
        if output.status != 0 {
            return Err(self.failure(&format!(
                "command failed with status {}:\n{script}\n--- output ---\n{}",
                output.status, output.text
            )));
        }
        Ok(output.text)
    }

    /// The console log so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// dmesg from the guest, through the diagnostics agent (which answers
    /// even while a command hangs on the control port); empty if it is gone.
    pub fn dmesg(&mut self) -> String {
        if self.check_alive().is_err() {
            return String::new();
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        let Some(diag) = self.diag.as_mut() else {
            return String::new();
        };
        if diag.send_run(nonce, "dmesg").is_err() {
            return String::new();
        }
        let marker = format!("@@BRICK-RC {nonce} ");
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut text = String::new();
        while let Ok(Some(line)) = diag.read_line(deadline) {
            if line.starts_with(&marker) {
                break;
            }
            if !line.starts_with("@@BRICK-READY") {
                text.push_str(&line);
            }
        }
        text
    }

    /// An error that carries the console tail and dmesg.
    pub fn failure(&mut self, what: &str) -> anyhow::Error {
        let console = self.console();
        let tail: Vec<&str> = console.lines().rev().take(80).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let dmesg = self.dmesg();
        let qemu = std::fs::read_to_string(self.dir.join("qemu.log")).unwrap_or_default();
        anyhow::anyhow!(
            "[{}] {what}\n--- {} console (last 80 lines) ---\n{}\n--- {} dmesg ---\n{}\n--- qemu ---\n{qemu}",
            self.config.name,
            self.config.name,
            tail.join("\n"),
            self.config.name,
            if dmesg.is_empty() { "(agent not answering)".to_string() } else { dmesg }
        )
    }

    /// Stops QEMU at once (the guest keeps no state worth a clean shutdown).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let qemu = std::fs::read_to_string(self.dir.join("qemu.log")).unwrap_or_default();
            bail!(
                "[{}] QEMU exited ({status}):\n{qemu}\n--- console ---\n{}",
                self.config.name,
                self.console()
            );
        }
        Ok(())
    }

    fn control(&mut self) -> Result<&mut Channel> {
        self.control
            .as_mut()
            .context("control socket not connected")
    }

    /// One line from the control agent, or None at the deadline; checks
    /// that QEMU is alive while waiting.
    fn read_control_line(&mut self, deadline: Instant) -> Result<Option<String>> {
        loop {
            let step = deadline.min(Instant::now() + Duration::from_millis(200));
            match self.control()?.read_line(step) {
                Ok(Some(line)) => return Ok(Some(line)),
                Ok(None) if Instant::now() >= deadline => return Ok(None),
                Ok(None) => self.check_alive()?,
                Err(error) => {
                    std::thread::sleep(Duration::from_millis(200));
                    self.check_alive()?;
                    return Err(self.failure(&format!("control socket: {error}")));
                }
            }
        }
    }
}

/// One agent's serial port, as a Unix socket with line framing.
struct Channel {
    stream: UnixStream,
    pending: Vec<u8>,
}

impl Channel {
    fn connect(path: &std::path::Path) -> std::io::Result<Channel> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(Channel {
            stream,
            pending: Vec::new(),
        })
    }

    fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        self.stream.write_all(line.as_bytes())?;
        self.stream.write_all(b"\n")
    }

    fn send_run(&mut self, nonce: u64, script: &str) -> std::io::Result<()> {
        self.send_line(&format!("RUN {nonce} {}", base64(script.as_bytes())))
    }

    /// One line, None at the deadline, an error when the socket closed.
    fn read_line(&mut self, deadline: Instant) -> std::io::Result<Option<String>> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            let mut buffer = [0u8; 4096];
            match self.stream.read(&mut buffer) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "agent socket closed",
                    ))
                }
                Ok(n) => self.pending.extend_from_slice(&buffer[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Standard base64 (the guest decodes with busybox `base64 -d`).
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(input.as_bytes()), expected);
        }
    }
}
