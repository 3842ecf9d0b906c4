//! The image suite's admin case (docs/ADMIN.md, the image part):
//! `image admin_prometheus`.
//!
//! The bare-metal image under QEMU (TCG) with two NICs: `eth0` on the
//! frame relay (RoCEv2 to Brick's initiator on the host, as the other
//! image cases) and `adm0` on QEMU user networking (`restrict=on`: the
//! guest reaches nothing, the host reaches it only through the forward),
//! 10.0.2.15/24, whose admin endpoint `10.0.2.15:9100` QEMU forwards from
//! a free port of 127.0.0.1 ([`crate::image::user_nic_args`]). Connections
//! through the forward come from QEMU's gateway, 10.0.2.2: the manifest's
//! only admin source.
//!
//! A real Prometheus (`/usr/bin/prometheus`) scrapes the forwarded port
//! every second while `brick bench` runs 4 KiB random reads and writes on
//! `vol0` through the relay; its HTTP API is asked for Brick's IO rate,
//! `sum(rate(brick_volume_reads_total[5s]) + rate(brick_volume_writes_total[5s]))`,
//! once a second from 60% to 90% of the run; the last answer must be above
//! zero, and the case prints the answers next to the IOPS the initiator
//! measured; after the run, the counters it stored must equal the IOs the
//! initiator did. Then, through the same forward: `brick target status
//! --admin`; 4 MiB written to the thin volume `thin0` (on a pool on a
//! virtio-blk disk) and its extents read back with `brick target extents
//! --admin` (two allocated, one range); and `vol0`'s extents (422: a RAM
//! volume is not thin).

use crate::relay::Relay;
use crate::suite::Counts;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The case's name in the image suite.
const NAME: &str = "image admin_prometheus";
/// Debian's Prometheus server.
const PROMETHEUS: &str = "/usr/bin/prometheus";
/// The admin interface's MAC (QEMU's user network's usual guest MAC).
const ADMIN_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// The admin endpoint in the guest.
const ADMIN_GUEST: &str = "10.0.2.15:9100";
/// How long the benchmark runs.
const BENCH_SECONDS: u64 = 20;
/// How long the image may take to serve under TCG.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// The query: IO answered per second, all volumes.
const QUERY: &str = "sum(rate(brick_volume_reads_total[5s]) + rate(brick_volume_writes_total[5s]))";

/// The pool disk: 32 MiB, 15 extents after the metadata.
const POOL_DISK_BYTES: u64 = 32 << 20;

/// The manifest: the relay interface, the admin interface, a RAM volume
/// and a thin volume on a pool on the first virtio-blk disk.
fn manifest() -> String {
    format!(
        concat!(
            "\n[target]\nname = \"brick-image-admin\"\n",
            crate::image::image_limits!(),
            "\n[[interfaces]]\nname = \"eth0\"\nmac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n",
            "\n[[interfaces]]\nname = \"adm0\"\nmac = \"52:54:00:12:34:56\"\naddress = \"10.0.2.15/24\"\n",
            "\n[admin]\naddress = \"{admin}\"\nsources = [\"10.0.2.2\"]\n",
            "\n[[pools]]\nname = \"pool0\"\nkind = \"virtio-blk\"\npci = \"{pool}\"\n",
            "\n[[volumes]]\nname = \"vol0\"\nkind = \"ram\"\nsize = \"64MiB\"\n",
            "\n[[volumes]]\nname = \"thin0\"\nkind = \"thin\"\npool = \"pool0\"\nsize = \"16MiB\"\n",
            "\n[[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
        ),
        admin = ADMIN_GUEST,
        pool = crate::image::disk_pci(0)
    )
}

/// Runs the case if `filter` selects it, adding to `counts` and
/// `failures`; skipped (and said so) without Prometheus.
pub fn suite(filter: Option<&str>, failures: &mut Vec<String>, counts: &mut Counts) {
    if !filter.is_none_or(|f| NAME.contains(f)) {
        return;
    }
    if !Path::new(PROMETHEUS).exists() {
        println!("{NAME} ... SKIPPED ({PROMETHEUS} is missing: cargo xtask setup installs it)");
        counts.skipped += 1;
        return;
    }
    let start = Instant::now();
    match run_case() {
        Ok(note) => {
            println!(
                "{NAME} ... ok ({:.1} s): {note}",
                start.elapsed().as_secs_f64()
            );
            counts.passed += 1;
        }
        Err(error) => {
            println!(
                "{NAME} ... FAILED ({:.1} s)\n{error:#}",
                start.elapsed().as_secs_f64()
            );
            failures.push(NAME.into());
            counts.failed += 1;
        }
    }
}

/// A child process killed (and reaped) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port of 127.0.0.1 free right now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET path` from `address`: status and body (the peer closes).
fn http_get(address: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .with_context(|| format!("read the answer to GET {path} from {address}"))?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path} from {address}: no HTTP head in {text:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("GET {path}: status line {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's JSON answer to `GET path`.
fn prometheus_get(web: &str, path: &str) -> Result<(serde_json::Value, String)> {
    let (status, body) = http_get(web, path)?;
    if status != 200 {
        bail!("Prometheus answered {status} to {path}: {body}");
    }
    Ok((serde_json::from_str(&body)?, body))
}

/// Prometheus's answer to `query` (instant query): the first sample's
/// value and time, and the whole JSON.
fn prometheus_query(web: &str, query: &str) -> Result<(f64, f64, String)> {
    let (value, body) = prometheus_get(web, &format!("/api/v1/query?query={}", encode(query)))?;
    let sample = &value["data"]["result"][0]["value"];
    let number = sample[1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Ok((number, sample[0].as_f64().unwrap_or(0.0), body))
}

fn run_case() -> Result<String> {
    let image = crate::image::build()?;
    let cli = crate::util::build_release_bins(&[("brick-cli", "brick")])?.remove(0);
    let dir = crate::paths::scratch("image-admin");
    let manifest_path = dir.join("admin.toml");
    std::fs::write(&manifest_path, manifest())?;
    let (config, blob, blob_path) = crate::image::compile_to_blob(&manifest_path, &dir)?;
    let mac = config.interfaces.first().context("no interface")?.mac.0;
    let relay = Relay::start(&dir.join("a.sock"), &dir.join("b.sock"), 0xad31, None)?;
    let pool = dir.join("pool.img");
    std::fs::File::create(&pool)?.set_len(POOL_DISK_BYTES)?;
    let forward = free_port()?;
    let admin = format!("127.0.0.1:{forward}");
    let mut command = crate::image::qemu_command(
        &image,
        &blob_path,
        crate::image::guest_mib(&blob),
        &[pool],
        &[(relay.b.clone(), mac)],
    )?;
    command.extend(crate::image::user_nic_args(
        1,
        ADMIN_MAC,
        "10.0.2.0/24",
        &[(forward, ADMIN_GUEST)],
    ));
    println!("  $ {}", command.join(" "));
    let console = dir.join("console.log");
    let file = std::fs::File::create(&console)?;
    let qemu = Killed(
        Command::new("nice")
            .arg("-n10")
            .args(&command)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("start qemu-system-x86_64")?,
    );
    let read_console = || std::fs::read_to_string(&console).unwrap_or_default();
    let started = Instant::now();
    while !read_console().contains("[brick] serving after") {
        if started.elapsed() > BOOT_TIMEOUT {
            bail!(
                "the image did not serve in {BOOT_TIMEOUT:?}:\n{}",
                read_console()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let result = scrape_during_bench(&cli, &relay, &admin, &dir);
    let text = read_console();
    for line in text.lines().filter(|l| l.contains("admin")) {
        println!("  console: {}", line.trim());
    }
    drop(qemu);
    println!("  relay: {}", relay.summary());
    if result.is_ok() && std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.with_context(|| format!("console:\n{text}"))
}

/// Prometheus scraping `admin` while `brick bench` runs; the note.
fn scrape_during_bench(cli: &Path, relay: &Relay, admin: &str, dir: &Path) -> Result<String> {
    let (status, body) = http_get(admin, "/metrics").context("the admin endpoint")?;
    if status != 200 || !body.contains("brick_volume_reads_total{volume=\"vol0\"}") {
        bail!("GET /metrics through the forward: {status}\n{body}");
    }
    let web = format!("127.0.0.1:{}", free_port()?);
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: brick-image\n    static_configs:\n      - targets: ['{admin}']\n"
        ),
    )?;
    let log = dir.join("prometheus.log");
    let prometheus = Killed(
        Command::new("nice")
            .arg("-n10")
            .arg(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("start prometheus")?,
    );
    let link = format!("frame:connect:{}", relay.a.display());
    let bench_args: Vec<String> = [
        "bench",
        "--link",
        &link,
        "--local",
        "10.77.0.2/24",
        "--target",
        "10.77.0.1",
        "--session",
        "prom",
        "--volume",
        "vol0",
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--qd",
        "16",
        "--size",
        "16M",
        "--runtime",
        &BENCH_SECONDS.to_string(),
        "--json",
    ]
    .map(String::from)
    .into();
    println!("  $ brick {}", bench_args.join(" "));
    let started = Instant::now();
    let bench = Command::new(cli)
        .args(&bench_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start brick bench")?;
    // Query once a second from 60% to 90% of the run: by then the
    // rate's window holds only scrapes taken during the benchmark.
    std::thread::sleep(Duration::from_secs(BENCH_SECONDS * 6 / 10));
    let mut rates = Vec::new();
    let mut answer = String::new();
    while started.elapsed() < Duration::from_secs(BENCH_SECONDS * 9 / 10) {
        let (rate, _, json) = prometheus_query(&web, QUERY)?;
        rates.push(rate);
        answer = json;
        std::thread::sleep(Duration::from_secs(1));
    }
    let rate = rates.last().copied().unwrap_or(0.0);
    let targets = http_get(&web, "/api/v1/targets")?.1;
    let scrape = serde_json::from_str::<serde_json::Value>(&targets)
        .ok()
        .and_then(|t| t["data"]["activeTargets"][0]["lastScrapeDuration"].as_f64());
    let output = bench.wait_with_output().context("wait for brick bench")?;
    // Two more scrapes, then the counters as Prometheus stored them and
    // the rate over the whole run, every 2 s.
    std::thread::sleep(Duration::from_secs(3));
    let total_query = "sum(brick_volume_reads_total) + sum(brick_volume_writes_total)";
    let (stored, at, _) = prometheus_query(&web, total_query)?;
    let range = format!(
        "/api/v1/query_range?query={}&start={:.3}&end={:.3}&step=2",
        encode(QUERY),
        at - 3.0 - BENCH_SECONDS as f64,
        at - 3.0
    );
    let (series, _) = prometheus_get(&web, &range)?;
    let profile: Vec<String> = series["data"]["result"][0]["values"]
        .as_array()
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v[1].as_str()?.parse::<f64>().ok())
                .map(|v| format!("{v:.0}"))
                .collect()
        })
        .unwrap_or_default();
    drop(prometheus);
    println!("  prometheus query {QUERY}: {answer}");
    let listed: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "  prometheus IO rate, once a second from {} s to {} s of the run: {}; last scrape took {} ms",
        BENCH_SECONDS * 6 / 10,
        BENCH_SECONDS * 9 / 10,
        listed.join(", "),
        scrape.map_or("?".into(), |s| format!("{:.1}", s * 1000.0))
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "brick bench failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    if rate <= 0.0 {
        bail!(
            "no IO rate from Prometheus: {answer}\ntargets: {targets}\nprometheus log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    if !targets.contains("\"health\":\"up\"") {
        bail!("the image's endpoint is not up for Prometheus: {targets}");
    }
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("brick bench --json printed no JSON object:\n{stdout}"))?;
    let report: serde_json::Value = serde_json::from_str(json)?;
    let iops = ["read", "write"]
        .iter()
        .filter_map(|d| report[d]["iops"].as_f64())
        .sum::<f64>();
    let ios = ["read", "write"]
        .iter()
        .filter_map(|d| report[d]["ios"].as_f64())
        .sum::<f64>();
    println!("  brick bench: {json}");
    println!(
        "  prometheus {total_query} after the run: {stored:.0} (brick bench: {ios:.0} IOs); \
         {QUERY} over the run, every 2 s: {}",
        profile.join(", ")
    );
    if stored != ios {
        bail!("Prometheus stored {stored} IOs for vol0, brick bench did {ios}");
    }
    let status = Command::new(cli)
        .args(["target", "status", "--admin", admin])
        .output()
        .context("run brick target status")?;
    let status_text = String::from_utf8_lossy(&status.stdout);
    if !status.status.success() || !status_text.contains("vol0") {
        bail!(
            "brick target status --admin {admin} ({}):\n{status_text}\n{}",
            status.status,
            String::from_utf8_lossy(&status.stderr)
        );
    }
    println!("  $ brick target status --admin {admin}");
    for line in status_text.lines() {
        println!("    {line}");
    }
    let thin = thin_extents(cli, &link, admin)?;
    let (code, body) = http_get(admin, "/volumes/vol0/extents")?;
    if code != 422 {
        bail!("GET /volumes/vol0/extents: expected 422 (a RAM volume), got {code}: {body}");
    }
    Ok(format!(
        "Prometheus {QUERY} = {rate:.0} IO/s during the run; brick bench measured {iops:.0} IOPS; \
         {thin}"
    ))
}

/// Writes 4 MiB at the start of `thin0` and reads its extents through
/// the endpoint: two allocated extents, one range.
fn thin_extents(cli: &Path, link: &str, admin: &str) -> Result<String> {
    let write = [
        "io",
        "--link",
        link,
        "--local",
        "10.77.0.2/24",
        "--target",
        "10.77.0.1",
        "--session",
        "thin",
        "--volume",
        "thin0",
        "verify",
        "--size",
        "4M",
        "--bs",
        "128k",
    ];
    let output = Command::new(cli)
        .args(write)
        .output()
        .context("run brick io")?;
    if !output.status.success() {
        bail!(
            "brick {} ({}):\n{}{}",
            write.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let args = [
        "target", "extents", "--admin", admin, "--volume", "thin0", "--json",
    ];
    let output = Command::new(cli)
        .args(args)
        .output()
        .context("run brick target extents")?;
    let text = String::from_utf8_lossy(&output.stdout);
    println!("  $ brick {}\n    {}", args.join(" "), text.trim());
    if !output.status.success() {
        bail!(
            "brick {} ({}): {text}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parse {text}"))?;
    let expected =
        serde_json::json!([{"first_extent": 0, "extents": 2, "offset": 0, "length": 4194304}]);
    if json["allocated_extents"] != 2 || json["ranges"] != expected {
        bail!("thin0's extents after 4 MiB written at 0: expected two in one range, got {text}");
    }
    Ok(format!(
        "thin0: {} extents allocated of {}, ranges {}",
        json["allocated_extents"], json["pool_extents"], json["ranges"]
    ))
}
