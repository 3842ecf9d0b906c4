//! The `brick-initiatord` binary with NBD exports in its config: `--check`,
//! `--once`, a refused config, and SIGHUP/SIGTERM starting, restarting and
//! stopping exports. The target is unreachable here (nothing serves the
//! UDP port), so no export gets a session; serving real IO through
//! `qemu-io` is the `nbd_export_qemu_io` case of `cargo xtask test`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_brick-initiatord");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "brick-initiatord-nbd-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("root")).unwrap();
    dir
}

fn unused_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn export_volume(name: &str, socket: &Path, port: u16) -> String {
    format!(
        "[[volumes]]\nname = \"{name}\"\nsession = \"nbd-{name}\"\ndevice_path = \"vol0\"\n\
         paths = [\"127.0.0.1\"]\nexport = \"nbd:unix:{}\"\nlink = \"udp:127.0.0.2:{port}\"\n\n",
        socket.display()
    )
}

const KERNEL_VOLUME: &str =
    "[[volumes]]\nname = \"k\"\nsession = \"s\"\ndevice_path = \"v\"\npaths = [\"10.0.0.1\"]\n\n";

/// The daemon on `dir`'s config and control socket, managing `dir/root`
/// (its state file too) instead of `/`.
fn daemon_command(dir: &Path) -> Command {
    let mut command = Command::new(DAEMON);
    command
        .arg("--config")
        .arg(dir.join("initiator.toml"))
        .arg("--socket")
        .arg(dir.join("control.sock"))
        .arg("--root")
        .arg(dir.join("root"));
    command
}

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let output = daemon_command(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_once_and_refused_configs() {
    let dir = scratch("once");
    let config = dir.join("initiator.toml");
    let port = unused_port();
    std::fs::write(&config, export_volume("db", &dir.join("db.nbd"), port)).unwrap();
    let (code, log) = run(&dir, &["--check"]);
    assert_eq!(code, 0, "{log}");
    assert!(
        log.contains("ok, 1 volume(s), 1 of them NBD export(s)"),
        "{log}"
    );

    // Only exports: --once says it does not serve them and fails.
    let (code, log) = run(&dir, &["--once"]);
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains(
            "--once does not serve NBD exports (they need the running daemon); not serving db"
        ),
        "{log}"
    );
    assert!(!dir.join("db.nbd").exists());

    // With a kernel volume next to it, --once handles the kernel one
    // (which cannot map under this fake root: exit 1 for that reason).
    std::fs::write(
        &config,
        format!(
            "{}{KERNEL_VOLUME}",
            export_volume("db", &dir.join("db.nbd"), port)
        ),
    )
    .unwrap();
    let (_, log) = run(&dir, &["--once"]);
    assert!(log.contains("not serving db"), "{log}");
    assert!(
        !log.contains("every configured volume is an NBD export"),
        "{log}"
    );

    // A TCP export on a non-loopback address: refused with its line.
    std::fs::write(
        &config,
        export_volume("db", &dir.join("db.nbd"), port).replace(
            &format!("nbd:unix:{}", dir.join("db.nbd").display()),
            "nbd:tcp:0.0.0.0:10809",
        ),
    )
    .unwrap();
    let (code, log) = run(&dir, &["--check"]);
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("initiator.toml:6: volumes[0].export: expected a loopback address"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path) -> Self {
        let log = dir.join("daemon.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = daemon_command(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for(&self, text: &str) {
        self.wait_for_count(text, 1);
    }

    /// Waits until `text` is in the log `count` times.
    fn wait_for_count(&self, text: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.log().matches(text).count() < count {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on the pid of a child this test spawned and has
        // not reaped; no memory is involved.
        let result = unsafe { libc::kill(pid, signal) };
        assert_eq!(result, 0, "kill: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sighup_and_sigterm_manage_exports() {
    let dir = scratch("signals");
    let config = dir.join("initiator.toml");
    let port = unused_port();
    std::fs::write(&config, export_volume("db", &dir.join("db.nbd"), port)).unwrap();
    let mut daemon = Daemon::start(&dir);
    daemon.wait_for("NBD exports: started [\"db\"]");
    // No target: the attempt fails with its reason and is retried.
    daemon.wait_for("export db: session \"nbd-db\":");
    daemon.wait_for("next attempt in");

    // Reload: db's socket moves (restart), logs is new.
    std::fs::write(
        &config,
        format!(
            "{}{}",
            export_volume("db", &dir.join("db2.nbd"), port),
            export_volume("logs", &dir.join("logs.nbd"), port).replace("127.0.0.2", "127.0.0.3")
        ),
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_for("NBD exports: started [\"logs\"], restarted [\"db\"], stopped []");
    daemon.wait_for("export db: settings changed in the config; restarting it");

    // A bad config is refused; the exports stay.
    std::fs::write(
        &config,
        export_volume("db", &dir.join("db.nbd"), port).replace("link = ", "lnk = "),
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_for("SIGHUP: new config refused, keeping the old one");

    // Reload without exports: both stop.
    std::fs::write(&config, "").unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_for("stopped [\"db\", \"logs\"]");

    // Back, then SIGTERM closes them.
    std::fs::write(&config, export_volume("db", &dir.join("db.nbd"), port)).unwrap();
    daemon.signal(libc::SIGHUP);
    // (The second such line: the first is from the start.)
    daemon.wait_for_count("NBD exports: started [\"db\"], restarted [], stopped []", 2);
    daemon.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no exit after SIGTERM:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = daemon.log();
    assert!(status.success(), "{status}:\n{log}");
    assert!(
        log.contains("stopping on signal: closing the NBD exports"),
        "{log}"
    );
    assert!(log.contains("export db: stopping"), "{log}");
    assert!(!dir.join("db.nbd").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
