//! `brick-target` on RDMA devices (`--link ibv:DEVICE[:PORT]`): one
//! [`IbvDevice`] per manifest interface, found by the interface's address,
//! the same engine over them, and a loop that polls the completion queues
//! busily while there is work and for a short while after. Only then, idle,
//! it arms the queues and sleeps on the completion and connection-manager
//! channels (and the volumes' descriptors) until the engine's next
//! deadline: under load the data path never waits on a completion channel,
//! and an idle target burns no CPU.

use std::time::Duration;

use hal::hosted::{signals, ArpAnswerer, MonotonicClock, PollIdle};
use hal::Clock;
use manifest::binary::Manifest;
use target_image::ibv::ibv_config;
use target_image::{hosted, server_config, Engine};
use verbs_ibv::{IbvDevice, IbvLink};

/// How long the loop keeps polling after the last work before it sleeps,
/// on bare metal; none inside a VM ([`hal::idle::spin_ns`]).
const SPIN_NS: u64 = 20_000_000;
/// The longest sleep while idle if a completion queue could not be armed
/// (then only polling sees its entries).
const IDLE_SLICE_NS: u64 = 1_000_000;

/// Serves the manifest on `links` (one per interface, in order).
pub fn run(manifest: Manifest<'_>, links: &[IbvLink]) -> Result<(), String> {
    let config = server_config(&manifest);
    let mut devices = Vec::with_capacity(links.len());
    for (link, iface) in links.iter().zip(manifest.interfaces()) {
        let wanted = ibv_config(&config, &iface, link).map_err(|e| e.to_string())?;
        let memory = wanted.memory_bytes;
        let device = IbvDevice::open(wanted)
            .map_err(|e| format!("link {link}: interface {}: {e}", iface.name))?;
        eprintln!(
            "brick-target: interface {iface} on RDMA device {} port {} ({} MiB registered memory)",
            device.device_name(),
            link.port,
            memory >> 20
        );
        devices.push(device);
    }
    // Brick answers ARP for these addresses itself, twice, as its own
    // stack does, so a Linux client's first map does not miss the answer
    // (hal::hosted::arp_answer).
    let mut arp: Vec<ArpAnswerer> = Vec::new();
    for iface in manifest.interfaces() {
        match ArpAnswerer::open(iface.address.address) {
            Ok(answerer) => {
                eprintln!(
                    "brick-target: interface {}: answering ARP for {} (arp_ignore 8 while serving)",
                    iface.name, iface.address.address
                );
                arp.push(answerer);
            }
            Err(e) => eprintln!(
                "brick-target: interface {}: the kernel answers ARP ({e}); a Linux client's first map may wait for its neighbour update",
                iface.name
            ),
        }
    }
    let mut fds: Vec<i32> = devices.iter().flat_map(IbvDevice::wake_fds).collect();
    fds.extend(arp.iter().map(ArpAnswerer::fd));
    let target = manifest.target();
    let mut engine =
        Engine::with_ports(manifest, devices, hosted::open_volume).map_err(|e| e.to_string())?;
    engine.set_logger(|args| eprintln!("brick-target: {args}"));
    let invalidate = if engine.always_invalidate() == target.always_invalidate {
        format!("{}", target.always_invalidate)
    } else {
        "false: the manifest asks for it, userspace verbs cannot re-key chunks".into()
    };
    eprintln!(
        "brick-target: target {} listening on RDMA CM port {} (always_invalidate {invalidate})",
        target.name, target.port
    );
    for volume in engine.manifest().volumes() {
        eprintln!("brick-target: serving {volume}");
    }
    let admin = super::open_admin(engine.manifest())?;
    signals::install().map_err(|e| format!("signals: {e}"))?;

    let clock = MonotonicClock::new();
    let mut idle = PollIdle::new();
    let mut sink = |_: usize, _: &[u8], _: &[&[u8]], _: &[u8]| {};
    let spin = hal::idle::spin_ns(SPIN_NS);
    eprintln!(
        "brick-target: polling {} us after the last work ({})",
        spin / 1000,
        if spin == 0 {
            "under a hypervisor: the loop shares its CPU with rxe and its neighbours"
        } else {
            "bare metal"
        }
    );
    let mut last_work = clock.now();
    let mut stop_deadline = None;
    loop {
        let now = clock.now();
        if super::stopped(&mut engine, now, &mut stop_deadline) {
            let _ = engine.poll(now, &mut sink);
            break;
        }
        let asked = admin.as_ref().is_some_and(|admin| admin.serve(&engine));
        let mut busy = engine.poll(now, &mut sink) || asked;
        for answerer in &mut arp {
            busy |= answerer.poll(now);
        }
        if busy {
            last_work = now;
            continue;
        }
        if now.saturating_sub(last_work) < spin {
            std::thread::yield_now();
            continue;
        }
        // Idle: arm the completion queues, look once more (an entry that
        // came before arming signals nothing), then sleep until a
        // completion, a connection event, a volume or the engine's next
        // deadline.
        let devices = || (0..engine.interface_count()).filter_map(|i| engine.hca(i));
        let armed = devices().all(IbvDevice::arm);
        let busy = engine.poll(now, &mut sink);
        let mut wake = engine.poll_at(now);
        for at in arp.iter().filter_map(ArpAnswerer::poll_at) {
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        if let Some(deadline) = stop_deadline {
            wake = Some(wake.map_or(deadline, |w| w.min(deadline)));
        }
        if !armed {
            wake = Some(wake.map_or(now + IDLE_SLICE_NS, |w| w.min(now + IDLE_SLICE_NS)));
        }
        if !busy && wake.is_none_or(|w| w > now) {
            idle.clear();
            for &fd in &fds {
                idle.watch_readable(fd);
            }
            for fd in engine.volume_fds() {
                idle.watch_readable(fd);
            }
            if let Some(admin) = &admin {
                idle.watch_readable(admin.fd());
            }
            idle.wait(wake).map_err(|e| format!("ppoll: {e}"))?;
        }
        for device in (0..engine.interface_count()).filter_map(|i| engine.hca(i)) {
            device.disarm();
        }
        last_work = clock.now();
    }
    // Let the disconnects reach the wire before the devices close.
    std::thread::sleep(Duration::from_millis(50));
    eprint!("{}", engine.stats());
    eprintln!("brick-target: stopped");
    Ok(())
}
