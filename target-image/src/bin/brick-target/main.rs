//! `brick-target`: the hosted Brick target.
//!
//! ```text
//! brick-target --manifest FILE --link SPEC [--link SPEC ...]
//! ```
//!
//! With `--link ibv:DEVICE[:PORT]` for every interface the engine runs on
//! RDMA devices through libibverbs and rdma_cm (a real HCA, or Linux rxe)
//! instead of its software HCA: see `ibv.rs`.
//!
//! Compiles the manifest (TOML), builds the engine from its checked binary
//! form (the same no_std view the image boots from), opens one link per
//! manifest interface, in order — Ethernet frames (`frame:connect:PATH`,
//! `frame:listen:PATH`, `tcp:…`) or RoCEv2 over UDP (`udp:IP:PORT`, bound
//! to the interface's address, for Brick initiators) — and runs the poll
//! loop: a bounded burst of packets in per link, `Engine::poll`, and when
//! nothing happened a blocking `ppoll` on the link and volume descriptors
//! until the engine's next deadline — it never spins while idle. Volumes
//! are RAM, files and block devices (`target_image::hosted`). Logs what it
//! serves and every refusal to stderr, one line each; prints statistics on
//! SIGUSR1 and on exit; SIGINT/SIGTERM close every path and stop. With
//! an `[admin]` endpoint in the manifest, a thread serves `/metrics` and
//! extent lists over HTTP (`admin.rs`): the loop answers its snapshot
//! requests once per turn (`target_image::admin`).
//!
//! No unsafe here: signals are `hal::hosted::signals`.

#![deny(unsafe_code)]

mod admin;
mod ibv;

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::Ordering;

use clap::Parser;
use std::net::{IpAddr, SocketAddrV4};

use hal::hosted::{signals, Link, LinkSpec, MonotonicClock, Packet, PollIdle, PooledOsRng};
use hal::{Clock, DatagramNic, Rng};
use manifest::binary::Manifest;
use roce::hca::LinkMode;
use target_image::admin::{admin_exchange, snapshot_capacity, AdminEngine};
use target_image::{hosted, Engine, Transmit};
use verbs::KeySource;
use verbs_ibv::IbvLink;

/// Frames taken from each link per loop iteration: a whole burst of a
/// batched UDP link (16 receive batches), so a thousand sessions do not
/// overrun the socket while one engine turn runs.
const RX_BURST: usize = 1024;
/// How long shutdown waits for disconnects to go out.
const SHUTDOWN_NS: u64 = 2_000_000_000;
/// Stack of the engine thread (the HCAs are built on it before boxing).
const ENGINE_STACK: usize = 256 << 20;

/// Serve RTRS/RNBD volumes from a boot manifest.
#[derive(Parser, Debug)]
#[command(name = "brick-target", version)]
struct Args {
    /// The manifest (TOML).
    #[arg(long)]
    manifest: PathBuf,
    /// One link per manifest interface, in order: frame:connect:PATH,
    /// frame:listen:PATH, tcp:listen:ADDR, tcp:connect:ADDR (Ethernet
    /// frames), udp:IP:PORT (RoCEv2 over a UDP socket bound to the
    /// interface's address; Brick initiators only), or ibv:DEVICE[:PORT]
    /// (an RDMA device holding the interface's address; every interface
    /// then names one).
    #[arg(long = "link", required = true)]
    links: Vec<TargetLink>,
    /// Busy polling: on hosted links, keep polling for this many
    /// microseconds after the last work before sleeping in ppoll(2). For
    /// a node that gives the target a core of its own: a frame is picked
    /// up at once instead of after a wake-up. 0 (the default) never spins.
    /// Each idle turn of the spin yields the core, so on a core shared
    /// with the peer the peer runs at once instead of after the spin.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    poll_us: u32,
}

/// One `--link`: a hosted link for the software HCA, or an RDMA device.
#[derive(Clone, Debug)]
enum TargetLink {
    Hosted(LinkSpec),
    Ibv(IbvLink),
}

impl FromStr for TargetLink {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        if spec.starts_with("ibv:") {
            return spec.parse().map(Self::Ibv);
        }
        spec.parse()
            .map(Self::Hosted)
            .map_err(|e| format!("{e}, or ibv:DEVICE[:PORT]"))
    }
}

/// The OS random source, read a block at a time, as the HCA's key source.
struct OsKeys(PooledOsRng);

impl KeySource for OsKeys {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

/// The engine's packets onto the links; transmit errors are drops (the
/// transport and CM retransmit).
struct Sink<'a> {
    links: &'a mut [Link],
    /// Something was handed to a link (sent, or queued for its flush).
    sent: bool,
}

impl<'a> Sink<'a> {
    fn new(links: &'a mut [Link]) -> Self {
        Self { links, sent: false }
    }
}

impl Transmit for Sink<'_> {
    fn transmit(&mut self, interface: usize, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        if let Some(link) = self.links.get_mut(interface) {
            link.transmit(headers, payload, trailer);
            self.sent = true;
        }
    }

    fn transmit_datagram(
        &mut self,
        interface: usize,
        to: SocketAddrV4,
        header: &[u8],
        payload: &[&[u8]],
        trailer: &[u8],
    ) {
        if let Some(link) = self.links.get_mut(interface) {
            link.transmit_datagram(to, header, payload, trailer);
            self.sent = true;
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let config = manifest::compile_file(&args.manifest).map_err(|e| e.to_string())?;
    let blob = config.to_binary().map_err(|e| format!("manifest: {e}"))?;
    let manifest = Manifest::parse(&blob).map_err(|e| format!("manifest: {e}"))?;
    if args.links.len() != manifest.interface_count() {
        return Err(format!(
            "{} --link given, the manifest has {} interfaces (one --link per interface, in order)",
            args.links.len(),
            manifest.interface_count()
        ));
    }
    let ibv: Vec<IbvLink> = args
        .links
        .iter()
        .filter_map(|link| match link {
            TargetLink::Ibv(link) => Some(link.clone()),
            TargetLink::Hosted(_) => None,
        })
        .collect();
    if ibv.len() == args.links.len() {
        return ibv::run(manifest, &ibv);
    }
    if !ibv.is_empty() {
        return Err(format!(
            "{} of {} --link name RDMA devices: expected every interface on an RDMA device (ibv:) or none",
            ibv.len(),
            args.links.len()
        ));
    }
    let specs = args.links.iter().filter_map(|link| match link {
        TargetLink::Hosted(spec) => Some(spec),
        TargetLink::Ibv(_) => None,
    });
    let mut links = Vec::new();
    let mut modes = Vec::new();
    for (spec, iface) in specs.zip(manifest.interfaces()) {
        if let LinkSpec::Udp(addr) = spec {
            if addr.ip() != IpAddr::V4(iface.address.address) {
                return Err(format!(
                    "link {spec}: interface {} has address {}; a UDP link must bind that address \
                     (the HCA's address is the socket's)",
                    iface.name, iface.address.address
                ));
            }
        }
        match spec.open().map_err(|e| format!("link {spec}: {e}"))? {
            Link::Frame(link) => {
                eprintln!("brick-target: interface {iface} on link {spec}");
                links.push(Link::Frame(
                    link.with_mac(iface.mac.0).with_mtu(usize::from(iface.mtu)),
                ));
                modes.push(LinkMode::Ethernet);
            }
            Link::Udp(nic) => {
                let port = nic.local_addr().port();
                eprintln!("brick-target: interface {iface} on link {spec} (RoCEv2 over UDP port {port}, Brick peers only)");
                links.push(Link::Udp(nic.with_mtu(usize::from(iface.mtu))));
                modes.push(LinkMode::Udp { port });
            }
        }
    }
    let target = manifest.target();
    let mut engine = Engine::with_links(
        manifest,
        |_| OsKeys(PooledOsRng::new()),
        &modes,
        hosted::open_volume,
    )
    .map_err(|e| e.to_string())?;
    engine.set_logger(|args| eprintln!("brick-target: {args}"));
    eprintln!(
        "brick-target: target {} listening on RDMA CM port {} (always_invalidate {})",
        target.name, target.port, target.always_invalidate
    );
    for volume in engine.manifest().volumes() {
        eprintln!("brick-target: serving {volume}");
    }
    let admin = open_admin(engine.manifest())?;
    signals::install().map_err(|e| format!("signals: {e}"))?;

    let clock = MonotonicClock::new();
    let mut idle = PollIdle::new();
    let poll_ns = u64::from(args.poll_us) * 1_000;
    if poll_ns > 0 {
        eprintln!(
            "brick-target: busy polling {} us after the last work",
            args.poll_us
        );
    }
    let mut last_busy = 0;
    let mut stop_deadline = None;
    loop {
        let now = clock.now();
        if stopped(&mut engine, now, &mut stop_deadline) {
            // Let the last frames out.
            let _ = engine.poll(now, &mut Sink::new(&mut links));
            for link in &mut links {
                link.flush();
            }
            break;
        }
        let mut busy = false;
        for (index, link) in links.iter_mut().enumerate() {
            for _ in 0..RX_BURST {
                let received = link
                    .receive(|packet| match packet {
                        Packet::Frame(frame) => engine.receive(index, now, frame),
                        Packet::Datagram(from, datagram) => {
                            engine.receive_datagram(index, now, from, datagram)
                        }
                    })
                    .map_err(|e| format!("link receive: {e}"))?;
                if !received {
                    break;
                }
                busy = true;
            }
        }
        let mut sink = Sink::new(&mut links);
        busy |= engine.poll(now, &mut sink);
        let sent = sink.sent;
        if let Some(admin) = &admin {
            busy |= admin.serve(&engine);
        }
        for link in &mut links {
            if link.has_pending_output() {
                link.flush();
            }
        }
        if sent && poll_ns > 0 {
            // Busy polling: the answers just sent need their initiator to
            // run; if it waits for this core, let it have it now.
            std::thread::yield_now();
        }
        if busy {
            last_busy = now;
            continue;
        }
        let now = clock.now();
        if now.saturating_sub(last_busy) < poll_ns {
            // Spin, but let a runnable process on this core (the
            // initiator, on a loaded machine) have it now rather than when
            // the spin ends.
            std::thread::yield_now();
            continue;
        }
        let mut wake = engine.poll_at(now);
        if let Some(deadline) = stop_deadline {
            wake = Some(wake.map_or(deadline, |w| w.min(deadline)));
        }
        if wake.is_some_and(|w| w <= now) {
            continue;
        }
        idle.clear();
        for link in &links {
            idle.watch_link(link);
        }
        for fd in engine.volume_fds() {
            idle.watch_readable(fd);
        }
        if let Some(admin) = &admin {
            idle.watch_readable(admin.fd());
        }
        idle.wait(wake).map_err(|e| format!("ppoll: {e}"))?;
    }
    eprint!("{}", engine.stats());
    eprintln!("brick-target: stopped");
    Ok(())
}

/// Starts the admin endpoint the manifest names, if any: its thread and
/// the engine's end of the snapshot exchange.
fn open_admin(manifest: &Manifest<'_>) -> Result<Option<AdminEngine>, String> {
    let Some(endpoint) = manifest.admin() else {
        return Ok(None);
    };
    let (engine_end, client) =
        admin_exchange(snapshot_capacity(manifest)).map_err(|e| format!("admin endpoint: {e}"))?;
    admin::start(endpoint, manifest, client)?;
    Ok(Some(engine_end))
}

/// Answers the signals once per loop turn: SIGUSR1 prints statistics;
/// SIGINT/SIGTERM start closing every path and set `stop_deadline`.
/// Returns whether the loop should stop now (the deadline passed, or every
/// path is gone).
fn stopped<P: target_image::Port, D: hal::block::BlockDevice<target_image::Chunk>>(
    engine: &mut Engine<'_, P, D>,
    now: u64,
    stop_deadline: &mut Option<u64>,
) -> bool {
    if signals::STATS.swap(false, Ordering::SeqCst) {
        eprint!("{}", engine.stats());
    }
    if stop_deadline.is_none() && signals::STOP.load(Ordering::SeqCst) {
        eprintln!("brick-target: stopping: closing every path");
        engine.close_all(now);
        *stop_deadline = Some(now + SHUTDOWN_NS);
    }
    stop_deadline.is_some_and(|deadline| now >= deadline || engine.is_quiet())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let worker = std::thread::Builder::new()
        .name("brick-engine".into())
        .stack_size(ENGINE_STACK)
        .spawn(move || run(args));
    signals::block_here();
    match worker.map(|w| w.join()) {
        Ok(Ok(Ok(()))) => ExitCode::SUCCESS,
        Ok(Ok(Err(message))) => {
            eprintln!("brick-target: {message}");
            ExitCode::FAILURE
        }
        _ => {
            eprintln!("brick-target: engine thread failed");
            ExitCode::FAILURE
        }
    }
}
