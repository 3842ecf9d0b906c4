//! The image's thin-volume checks, driven from the host: boots the image
//! under QEMU (the command line in a file, one argument per line), maps
//! its thin volumes with Brick's initiator over the frame relay, and runs
//! [`initiator::crash_check`] against it, SIGKILLing QEMU.
//!
//! ```text
//! thin_crash io|crash --qemu ARGS_FILE --console DIR --link frame:connect:SOCK \
//!     --local 10.77.0.2 --target 10.77.0.1 --pool vpool --volumes thin0,thin1 \
//!     [--runs 4] [--seed N]
//! ```
//!
//! `io`: one boot, [`crash_check::write_discard_read`] on the first volume,
//! then QEMU is killed, booted again and the volume read back. `crash`:
//! [`crash_check::run`] on every volume. The last line says what was
//! checked (`thin_crash: ok: ...`); a failure exits 1 with its reason.
//! `cargo xtask test`'s image suite runs it (`xtask/src/image_thin.rs`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hal::hosted::LinkSpec;
use initiator::crash_check::{self, CrashConfig, CrashTarget};
use initiator::hosted::{Session, SessionSpec, Volume};
use initiator::AccessMode;

/// What the image prints once its poll loop runs.
const SERVING: &str = "[brick] serving after";
/// Boot to serving under TCG, at most.
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

struct Args {
    mode: String,
    qemu: Vec<String>,
    console: PathBuf,
    link: String,
    local: Ipv4Addr,
    target: Ipv4Addr,
    pool: String,
    volumes: Vec<String>,
    runs: usize,
    seed: u64,
}

fn args() -> Result<Args, String> {
    let mut raw = std::env::args().skip(1);
    let mode = raw
        .next()
        .ok_or("usage: thin_crash io|crash --qemu FILE ...")?;
    let mut get = std::collections::HashMap::new();
    while let Some(key) = raw.next() {
        let value = raw.next().ok_or(format!("{key} needs a value"))?;
        get.insert(key, value);
    }
    let mut need = |key: &str| get.remove(key).ok_or(format!("missing {key}"));
    let qemu_file = need("--qemu")?;
    let qemu = std::fs::read_to_string(&qemu_file)
        .map_err(|e| format!("{qemu_file}: {e}"))?
        .lines()
        .map(String::from)
        .collect();
    let parse_ip = |s: String| s.parse::<Ipv4Addr>().map_err(|e| format!("{s}: {e}"));
    Ok(Args {
        mode,
        qemu,
        console: PathBuf::from(need("--console")?),
        link: need("--link")?,
        local: parse_ip(need("--local")?)?,
        target: parse_ip(need("--target")?)?,
        pool: need("--pool")?,
        volumes: need("--volumes")?.split(',').map(String::from).collect(),
        runs: need("--runs").map_or(Ok(4), |s| s.parse().map_err(|e| format!("--runs: {e}")))?,
        seed: need("--seed").map_or(Ok(1), |s| s.parse().map_err(|e| format!("--seed: {e}")))?,
    })
}

/// The image under QEMU; each boot's console in `console/boot-N.log`.
struct Qemu {
    command: Vec<String>,
    console: PathBuf,
    pool: String,
    boots: usize,
    child: Option<Child>,
}

impl Qemu {
    fn log_path(&self) -> PathBuf {
        self.console.join(format!("boot-{}.log", self.boots))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

impl CrashTarget for Qemu {
    fn start(&mut self) -> Result<(), String> {
        self.boots += 1;
        let file = std::fs::File::create(self.log_path()).map_err(|e| e.to_string())?;
        let (program, args) = self.command.split_first().ok_or("empty QEMU command")?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("start {program}: {e}"))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let log = self.log();
            if log.contains(SERVING) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("QEMU exited ({status}) before serving:\n{log}"));
            }
            if started.elapsed() > BOOT_TIMEOUT {
                return Err(format!(
                    "the image did not serve in {BOOT_TIMEOUT:?}:\n{log}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Child::kill is SIGKILL: QEMU stops at once, writes in flight.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pool_report(&self) -> Result<(u64, u64), String> {
        let log = self.log();
        crash_check::pool_report(log.lines(), &self.pool)
            .ok_or_else(|| format!("no \"pool {}:\" report on the console:\n{log}", self.pool))
    }
}

fn connect(args: &Args) -> Result<(Session, Vec<Volume>), String> {
    let link: LinkSpec = args
        .link
        .parse()
        .map_err(|e| format!("{}: {e}", args.link))?;
    let mut spec = SessionSpec::new(
        "thin-crash",
        link,
        vec![SocketAddr::new(args.target.into(), 1234)],
    );
    spec.local_ip = args.local;
    spec.config.queue_depth = 32;
    spec.connect_timeout = Duration::from_secs(60);
    let session = Session::connect(&spec).map_err(|e| format!("session: {e}"))?;
    let volumes = args
        .volumes
        .iter()
        .map(|name| session.open(name, AccessMode::ReadWrite))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("open: {e}"))?;
    Ok((session, volumes))
}

fn io(args: &Args, qemu: &mut Qemu) -> Result<String, String> {
    qemu.start()?;
    let (allocated, reclaimed) = qemu.pool_report()?;
    let (session, volumes) = connect(args)?;
    let first = crash_check::write_discard_read(&volumes[0], 0)?;
    println!("thin_crash: boot 1 (pool: {allocated} allocated, {reclaimed} reclaimed): {first}");
    drop(volumes);
    drop(session);
    qemu.kill();
    qemu.start()?;
    let (allocated, reclaimed) = qemu.pool_report()?;
    let (session, volumes) = connect(args)?;
    let again = crash_check::read_back(&volumes[0], 0)?;
    drop(volumes);
    drop(session);
    Ok(format!(
        "{} on {}: {first}; after a SIGKILL and a boot (pool: {allocated} allocated, {reclaimed} \
         reclaimed) still: {again}",
        args.volumes[0], args.pool
    ))
}

fn crash(args: &Args, qemu: &mut Qemu) -> Result<String, String> {
    let config = CrashConfig {
        volume_bytes: 16 << 20,
        runs: args.runs,
        queue_depth: 16,
        min_load: Duration::from_millis(1500),
        random_load: Duration::from_millis(4000),
        max_write_blocks: 32,
        seed: args.seed,
    };
    let summary = crash_check::run(
        qemu,
        || connect(args),
        &config,
        |line| println!("thin_crash: {line}"),
    )?;
    Ok(format!("{summary} (seed {})", args.seed))
}

fn main() {
    let outcome = args().and_then(|args| {
        let mut qemu = Qemu {
            command: args.qemu.clone(),
            console: args.console.clone(),
            pool: args.pool.clone(),
            boots: 0,
            child: None,
        };
        match args.mode.as_str() {
            "io" => io(&args, &mut qemu),
            "crash" => crash(&args, &mut qemu),
            other => Err(format!("unknown mode {other:?} (io or crash)")),
        }
    });
    match outcome {
        Ok(line) => println!("thin_crash: ok: {line}"),
        Err(why) => {
            println!("thin_crash: FAILED: {why}");
            std::process::exit(1);
        }
    }
}
