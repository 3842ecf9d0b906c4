//! The test bed: a target, the Linux initiator VM and one relay per path
//! between them (plus the probe port's relay), booted together; restarts
//! of either side.

use super::{mac, Target, TargetKind};
use crate::qemu::{NicConfig, Vm, VmConfig};
use crate::relay::Relay;
use crate::vmimage::{Images, Overlays};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Duration;

/// A target, the Linux initiator VM and one relay per path between them.
pub struct Bed {
    /// The relays, path 0 first (side a = initiator, side b = target).
    pub relays: Vec<Relay>,
    /// The probe port's relay (side a = `hostile_probe`, side b = the
    /// target), if the bed has one and the target serves it.
    pub probe: Option<Relay>,
    /// The target.
    pub target: Target,
    /// What kind of target it is.
    pub kind: TargetKind,
    /// The Linux initiator VM.
    pub initiator: Vm,
    /// How the initiator VM was booted (for [`Bed::reboot_initiator`]).
    initiator_config: VmConfig,
    /// Link MTU.
    pub mtu: u32,
    images: Images,
    dir: std::path::PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        if std::env::var_os("BRICK_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// How to build a bed.
#[derive(Clone, Debug)]
pub struct BedConfig {
    /// Target kind.
    pub kind: TargetKind,
    /// Number of paths (NICs on both sides).
    pub paths: usize,
    /// Link MTU.
    pub mtu: u32,
    /// Initiator vCPUs.
    pub initiator_cpus: u32,
    /// Write a pcap per path into the scratch directory, keeping this
    /// many bytes of each frame.
    pub pcap: Option<usize>,
    /// Give the target a probe port ([`ProbePort`]; the Brick targets
    /// only, see [`TargetKind::has_probe_port`]; other kinds ignore it).
    pub probe: bool,
    /// Extra host files put into the initiator's initramfs (host path,
    /// guest path), e.g. a static `brick-initiatord`.
    pub extra_files: Vec<(PathBuf, String)>,
}

impl BedConfig {
    /// One path, MTU 1500, one vCPU.
    pub fn new(kind: TargetKind) -> BedConfig {
        BedConfig {
            kind,
            paths: 1,
            mtu: 1500,
            initiator_cpus: 1,
            pcap: None,
            probe: false,
            extra_files: Vec::new(),
        }
    }
}

impl Bed {
    /// Starts relays, target and initiator (both VMs boot in parallel).
    pub fn start(images: &Images, config: &BedConfig) -> Result<Bed> {
        let dir = crate::paths::scratch("bed");
        let mut relays = Vec::new();
        for i in 0..config.paths {
            let pcap = config.pcap.map(|_| dir.join(format!("path{i}.pcap")));
            relays.push(Relay::start_capturing(
                &dir.join(format!("a{i}.sock")),
                &dir.join(format!("b{i}.sock")),
                0xb41c + i as u64,
                pcap.as_deref(),
                config.pcap.unwrap_or(0),
            )?);
        }
        let probe = match config.kind {
            kind if kind.has_probe_port() && config.probe => {
                let pcap = config.pcap.map(|_| dir.join("probe.pcap"));
                Some(Relay::start_capturing(
                    &dir.join("probe-a.sock"),
                    &dir.join("probe-b.sock"),
                    0xb41c_9e00,
                    pcap.as_deref(),
                    config.pcap.unwrap_or(0),
                )?)
            }
            _ => None,
        };
        let mut target = Target::spawn(config.kind, images, &relays, probe.as_ref(), config.mtu)?;
        let mut initiator_config = VmConfig::new("initiator");
        initiator_config.mtu = config.mtu;
        initiator_config.cpus = config.initiator_cpus;
        initiator_config.overlays = Overlays {
            fio: true,
            rping: true,
            ext4: true,
        };
        initiator_config.extra_files = config.extra_files.clone();
        initiator_config.nics = relays
            .iter()
            .enumerate()
            .map(|(i, relay)| {
                let address = &target.descriptor.paths[i];
                NicConfig {
                    socket: relay.a.clone(),
                    mac: mac(i, 2),
                    address: format!("{}/{}", address.initiator, address.prefix),
                }
            })
            .collect();
        let mut initiator = Vm::spawn(images, initiator_config.clone())?;
        let links: Vec<&Relay> = relays.iter().chain(probe.as_ref()).collect();
        target.wait_serving(&links)?;
        initiator.wait_ready()?;
        // No ping or arping before the first map: a stock client maps a
        // volume of a target it has never talked to, and the cases see it
        // do so (the first map's ARP exchange is part of what is tested).
        for (i, relay) in relays.iter().enumerate() {
            for side in [0, 1] {
                if !relay.side(side).0 {
                    bail!(
                        "relay of path {i}: side {} has no peer after boot",
                        ["a", "b"][side]
                    );
                }
            }
        }
        Ok(Bed {
            relays,
            probe,
            target,
            kind: config.kind,
            initiator,
            initiator_config,
            mtu: config.mtu,
            images: images.clone(),
            dir,
        })
    }

    /// Boots a fresh initiator VM on the same links (the relays keep the
    /// target's side up): empty neighbour table, no rdma_cm state, no
    /// translated code. Returns how long the boot took.
    pub fn reboot_initiator(&mut self) -> Result<Duration> {
        self.initiator.kill();
        self.initiator = Vm::spawn(&self.images, self.initiator_config.clone())?;
        let booted = self.initiator.wait_ready()?;
        for (i, relay) in self.relays.iter().enumerate() {
            if !relay.side(0).0 {
                bail!("relay of path {i}: the rebooted initiator did not connect");
            }
        }
        Ok(booted)
    }

    /// Restarts the target in place.
    pub fn restart_target(&mut self) -> Result<()> {
        let links: Vec<&Relay> = self.relays.iter().chain(self.probe.as_ref()).collect();
        self.target.restart(&self.images, &links)
    }

    /// `ip:A ip:B` path list for map_device, all paths.
    pub fn all_paths(&self) -> String {
        let targets: Vec<&str> = self
            .target
            .descriptor
            .paths
            .iter()
            .map(|p| p.target.as_str())
            .collect();
        targets.join(" ")
    }
}
