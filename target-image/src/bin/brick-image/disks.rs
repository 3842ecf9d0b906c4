//! Disks: the virtio-blk and NVMe devices behind the manifest's disk
//! volumes and thin pools.
//!
//! [`choose_disks`] probes every virtio-blk function (`1af4:1042`) with a
//! tiny queue for its size and serial (`VIRTIO_BLK_T_GET_ID`) and brings up
//! every NVMe controller (class 01:08:02), then gives each disk volume its
//! device, by PCI address or by serial ([`choose_device`]), refusing the
//! manifest with every reason logged when a choice is impossible.
//! [`open_disk`] then opens a volume's (or pool's) disk with its real
//! queue, rings and bounce slots from the boot pool; chunks are transferred
//! in place (identity DMA, see `serve`).
//!
//! Unsafe: the NVMe register block (BAR0 as the firmware assigned it).

#![allow(unsafe_code)]

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use hal::block::{BlockDevice, Either};
use hal::dma::DmaPool;
use hal::nvme::regs::MmioRegisters;
use hal::nvme::{ControllerConfig, NvmeController};
use hal::pci::{Function, Intx, Mechanism};
use hal::virtio::blk::{BlkConfig, DeviceId, VirtioBlk};
use hal::virtio::transport::PciTransport;
use manifest::binary::{Backing, Manifest};
use manifest::types::{VirtioSelector, VolumeKind};
use rtrs::server::ServerConfig;
use target_image::boot::claim::{choose_device, Candidate, ChoiceError};
use target_image::boot::pvh::Bytes;

use crate::clock::Tsc;
use crate::port::ExitCode;
use crate::serve::{fail, reachable, transport, DiskOf};

/// How long a disk may take to answer `VIRTIO_BLK_T_GET_ID` (QEMU answers
/// at once; a device that never does costs the boot this much).
const GET_ID_TIMEOUT_NS: u64 = 200_000_000;

/// The driver configuration of a probe: the smallest queue, no bounce
/// buffers (a few hundred bytes of the pool per disk).
const PROBE_CONFIG: BlkConfig = BlkConfig {
    queue_depth: 1,
    queue_size: 4,
    max_transfer: 1 << 20,
    bounce: false,
};

/// What the probe of one virtio-blk function found.
struct Probe {
    /// Its ID (serial; empty: none), or why there is none.
    serial: Result<DeviceId, String>,
    /// Its size in bytes, if it came up.
    size: Option<u64>,
}

/// A serial (or its absence) for the log.
struct SerialOf<'a>(&'a Result<DeviceId, String>);

impl fmt::Display for SerialOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Ok(id) if id.is_empty() => f.write_str("no serial"),
            Ok(id) => write!(f, "serial \"{id}\""),
            Err(why) => write!(f, "serial unknown ({why})"),
        }
    }
}

/// Brings up `function` with [`PROBE_CONFIG`], reads its size and its
/// serial (`VIRTIO_BLK_T_GET_ID`), then resets it.
fn probe_disk(pci: &Mechanism, function: &Function, pool: &mut DmaPool, clock: &Tsc) -> Probe {
    let transport = match transport(pci, function, Intx::Disabled) {
        Ok(transport) => transport,
        Err(why) => {
            return Probe {
                serial: Err(why.into()),
                size: None,
            }
        }
    };
    let mut disk = match VirtioBlk::<(), PciTransport>::new(transport, pool, PROBE_CONFIG) {
        Ok(disk) => disk,
        Err(error) => {
            return Probe {
                serial: Err(alloc::format!("virtio-blk: {error}")),
                size: None,
            }
        }
    };
    let size = disk.info().size;
    let serial = disk
        .read_device_id(clock, GET_ID_TIMEOUT_NS)
        .map_err(|error| alloc::format!("GET_ID: {error}"));
    // The reset also takes back a GET_ID the device never answered.
    let serial = match disk.reset() {
        Ok(_transport) => serial,
        Err(error) => Err(alloc::format!("after GET_ID: {error}")),
    };
    Probe {
        serial,
        size: Some(size),
    }
}

/// An NVMe controller the image brought up (or why not).
struct Controller {
    function: Function,
    controller: Result<NvmeController<MmioRegisters>, String>,
    /// Identify Controller's serial, if it came up.
    serial: Option<hal::nvme::IdString<20>>,
}

/// How long an NVMe controller may take to come up and answer each admin
/// command (QEMU's CAP.TO is 7.5 s, far beyond what it takes).
const NVME_TIMEOUT_NS: u64 = 2_000_000_000;

/// Brings up the NVMe controller at `function`: memory space and bus
/// mastering on (INTx off: polled), BAR0 sized and mapped, reset, enabled,
/// identified, admin queue from `pool`.
fn probe_nvme(
    pci: &Mechanism,
    function: &Function,
    pool: &mut DmaPool,
    clock: &Tsc,
) -> Result<NvmeController<MmioRegisters>, String> {
    let Some(base) = function.memory_bar(0) else {
        return Err("no memory BAR0".into());
    };
    let len = hal::pci::bar_size(pci, function.address, 0).ok_or("BAR0 cannot be sized")?;
    let command = hal::pci::enable_memory_and_bus_master(pci, function.address, Intx::Disabled);
    if command & 0b110 != 0b110 {
        return Err("memory space or bus master did not stick".into());
    }
    if !reachable(base, len) {
        return Err(alloc::format!(
            "BAR0 [{base:#x}, +{len:#x}) is outside what the image can map"
        ));
    }
    let len = usize::try_from(len).map_err(|_| "BAR0 too large")?;
    // SAFETY: BAR0 of this NVMe function as the firmware assigned it and
    // as sized just now, mapped by `reachable`; decoding is on; one
    // controller value per function (probed once, kept in `Disks`), and
    // only the NVMe driver touches its registers.
    let registers = unsafe { MmioRegisters::new(base as usize as *mut u8, len) }
        .ok_or("BAR0 misaligned or shorter than the admin doorbells")?;
    let config = ControllerConfig {
        timeout_ns: Some(NVME_TIMEOUT_NS),
        ..ControllerConfig::default()
    };
    NvmeController::new(registers, pool, clock, config).map_err(|error| alloc::format!("{error}"))
}

/// The disks and controllers, and which one each disk volume got
/// ([`choose_disks`]).
pub struct Disks {
    functions: Vec<Function>,
    probes: Vec<Probe>,
    /// Volume name -> index into `functions`.
    chosen: Vec<(String, usize)>,
    controllers: Vec<Controller>,
    /// NVMe volume name -> (index into `controllers`, namespace).
    namespaces: Vec<(String, usize, u32)>,
}

/// Chooses the device of each disk volume of `manifest`: virtio-blk
/// volumes among `virtio` (the `1af4:1042` functions, PCI order), NVMe
/// volumes' controllers among `nvme` (class 01:08:02), by PCI address or by
/// serial ([`choose_device`]: every device is probed with a tiny queue
/// from `pool` and logged with its serial and size). Refuses the manifest
/// (exit [`ExitCode::BadManifest`], each reason logged) if a volume's PCI
/// address has no device, no device or two have its serial, or two
/// volumes select the same disk (or the same namespace).
pub fn choose_disks(
    pci: &Mechanism,
    virtio: &[Function],
    nvme: &[Function],
    manifest: &Manifest<'_>,
    pool: &mut DmaPool,
    clock: &Tsc,
) -> Disks {
    let mut disks = Disks {
        functions: virtio.to_vec(),
        probes: Vec::new(),
        chosen: Vec::new(),
        controllers: Vec::new(),
        namespaces: Vec::new(),
    };
    // Who needs a disk: "volume NAME" (virtio-blk and NVMe volumes) and
    // "pool NAME" (thin pools on them), the key `open_disk` is given.
    let users: Vec<(String, Backing<'_>)> = manifest
        .volumes()
        .filter(|volume| matches!(volume.backing, Backing::VirtioBlk(_) | Backing::Nvme { .. }))
        .map(|volume| (alloc::format!("volume {}", volume.name), volume.backing))
        .chain(manifest.pools().filter_map(|pool| {
            crate::thin_pools::device_backing(&pool)
                .map(|backing| (crate::thin_pools::pool_key(pool.name), backing))
        }))
        .collect();
    let wants = |kind| users.iter().any(|(_, backing)| backing.kind() == kind);
    if wants(VolumeKind::VirtioBlk) {
        for function in virtio {
            let probe = probe_disk(pci, function, pool, clock);
            match probe.size {
                Some(size) => log!(
                    "disk: pci {}: {}, {}",
                    function.address,
                    SerialOf(&probe.serial),
                    Bytes(size)
                ),
                None => log!(
                    "disk: pci {}: not usable: {}",
                    function.address,
                    SerialOf(&probe.serial)
                ),
            }
            disks.probes.push(probe);
        }
    }
    if wants(VolumeKind::Nvme) {
        for function in nvme {
            let controller = probe_nvme(pci, function, pool, clock);
            match &controller {
                Ok(controller) => {
                    let info = controller.info();
                    log!(
                        "nvme: pci {}: serial \"{}\" model \"{}\", {} namespace(s), write cache {}, \
                         {} I/O queue pair(s)",
                        function.address,
                        info.serial,
                        info.model,
                        info.namespaces,
                        info.volatile_write_cache,
                        controller.granted_queues()
                    );
                }
                Err(why) => log!("nvme: pci {}: not usable: {why}", function.address),
            }
            let serial = controller.as_ref().ok().map(|c| c.info().serial);
            disks.controllers.push(Controller {
                function: *function,
                controller,
                serial,
            });
        }
    }
    let address = |function: &Function| {
        (
            function.address.bus,
            function.address.device,
            function.address.function,
        )
    };
    let virtio_candidates: Vec<Candidate<'_>> = disks
        .functions
        .iter()
        .zip(&disks.probes)
        .map(|(function, probe)| Candidate {
            address: address(function),
            serial: probe.serial.as_ref().ok().map(DeviceId::as_bytes),
        })
        .collect();
    let nvme_candidates: Vec<Candidate<'_>> = disks
        .controllers
        .iter()
        .map(|controller| Candidate {
            address: address(&controller.function),
            serial: controller.serial.as_ref().map(|s| s.as_bytes()),
        })
        .collect();
    let mut refused = 0;
    let mut chosen = Vec::new();
    let mut namespaces: Vec<(String, usize, u32)> = Vec::new();
    let mut owner: Vec<Option<&str>> = alloc::vec![None; virtio.len()];
    for (user, backing) in &users {
        let user = user.as_str();
        let outcome = match *backing {
            Backing::VirtioBlk(selector) => choose_device(selector, &virtio_candidates)
                .map_err(|error| match error {
                    ChoiceError::NoDeviceAt(wanted) => alloc::format!(
                        "no virtio-blk device (1af4:1042) at pci {wanted} ({} found): boot \
                         QEMU with -device virtio-blk-pci,disable-legacy=on,addr={:02x}.{}",
                        virtio.len(),
                        wanted.device,
                        wanted.function
                    ),
                    ChoiceError::NoSerial(serial) => alloc::format!(
                        "no virtio-blk device has serial \"{serial}\" ({} found): boot QEMU \
                         with -device virtio-blk-pci,drive=...,serial={serial}",
                        virtio.len()
                    ),
                    ChoiceError::SerialOnTwo(serial, first, second) => alloc::format!(
                        "serial \"{serial}\" is on more than one virtio-blk device (pci {} and \
                         pci {}): give each disk its own serial or select it by `pci`",
                        virtio[first].address,
                        virtio[second].address
                    ),
                })
                .and_then(|slot| match owner[slot] {
                    Some(other) => Err(alloc::format!(
                        "pci {} is also {other}'s: two volumes or pools cannot share a disk",
                        virtio[slot].address
                    )),
                    None => {
                        owner[slot] = Some(user);
                        log!(
                            "disk: {user} gets pci {} ({}; {})",
                            virtio[slot].address,
                            match selector {
                                VirtioSelector::Serial(_) => "by serial",
                                VirtioSelector::Pci(_) => "by PCI address",
                            },
                            SerialOf(&disks.probes[slot].serial)
                        );
                        chosen.push((String::from(user), slot));
                        Ok(())
                    }
                }),
            Backing::Nvme {
                controller,
                namespace,
            } => choose_device(controller, &nvme_candidates)
                .map_err(|error| match error {
                    ChoiceError::NoDeviceAt(wanted) => alloc::format!(
                        "no NVMe controller (class 01:08:02) at pci {wanted} ({} found): boot \
                         QEMU with -device nvme,serial=...,addr={:02x}.{}",
                        nvme.len(),
                        wanted.device,
                        wanted.function
                    ),
                    ChoiceError::NoSerial(serial) => alloc::format!(
                        "no NVMe controller has serial \"{serial}\" ({} found): boot QEMU with \
                         -device nvme,serial={serial}",
                        nvme.len()
                    ),
                    ChoiceError::SerialOnTwo(serial, first, second) => alloc::format!(
                        "serial \"{serial}\" is on more than one NVMe controller (pci {} and \
                         pci {}): select the controller by `pci`",
                        nvme[first].address,
                        nvme[second].address
                    ),
                })
                .and_then(|index| {
                    if let Some((other, ..)) = namespaces
                        .iter()
                        .find(|(_, i, n)| *i == index && *n == namespace)
                    {
                        return Err(alloc::format!(
                            "namespace {namespace} of pci {} is also {other}'s",
                            nvme[index].address
                        ));
                    }
                    match &disks.controllers[index].controller {
                        Err(why) => Err(alloc::format!(
                            "the NVMe controller at pci {} did not come up: {why}",
                            nvme[index].address
                        )),
                        Ok(controller) if namespace > controller.info().namespaces => {
                            Err(alloc::format!(
                                "the NVMe controller at pci {} has {} namespace(s), not {namespace}",
                                nvme[index].address,
                                controller.info().namespaces
                            ))
                        }
                        Ok(controller) => {
                            log!(
                                "nvme: {user} gets namespace {namespace} of pci {} ({}; \
                                 serial \"{}\")",
                                nvme[index].address,
                                match controller_selector_kind(backing) {
                                    true => "by serial",
                                    false => "by PCI address",
                                },
                                controller.info().serial
                            );
                            namespaces.push((String::from(user), index, namespace));
                            Ok(())
                        }
                    }
                }),
            _ => continue,
        };
        if let Err(why) = outcome {
            log!("{user}: {why}");
            refused += 1;
        }
    }
    drop(virtio_candidates);
    drop(nvme_candidates);
    disks.chosen = chosen;
    disks.namespaces = namespaces;
    if refused > 0 {
        fail(
            ExitCode::BadManifest,
            format_args!("{refused} disk volume(s) or pool(s) without a device: manifest refused"),
        );
    }
    disks
}

/// Whether an NVMe volume selects its controller by serial.
fn controller_selector_kind(backing: &Backing<'_>) -> bool {
    matches!(
        backing,
        Backing::Nvme {
            controller: VirtioSelector::Serial(_),
            ..
        }
    )
}

/// Opens the disk of `user` ("volume NAME" or "pool NAME", backed by
/// `backing`) on the device [`choose_disks`] gave it, rings and bounce
/// slots from `pool`; `H` is the handle its requests carry.
pub fn open_disk<H: Copy>(
    pci: &Mechanism,
    disks: &mut Disks,
    pool: &mut DmaPool,
    clock: &Tsc,
    config: &ServerConfig,
    user: &str,
    backing: &Backing<'_>,
) -> Result<DiskOf<H>, String> {
    if let Backing::Nvme { .. } = backing {
        let Some(&(_, index, namespace)) = disks.namespaces.iter().find(|(name, ..)| name == user)
        else {
            return Err("no NVMe namespace was chosen".into());
        };
        let entry = &mut disks.controllers[index];
        let address = entry.function.address;
        let Ok(controller) = &mut entry.controller else {
            return Err(alloc::format!("pci {address}: controller not up"));
        };
        let device = controller
            .open_namespace(
                clock,
                namespace,
                pool,
                target_image::boot::pool::nvme_queue_config(config),
            )
            .map_err(|error| alloc::format!("pci {address} namespace {namespace}: {error}"))?;
        let info = device.info();
        log!(
            "nvme: {user} on namespace {namespace} of pci {address} (queue pair {}): {} in \
             {}-byte blocks, write cache {}, max transfer {}, DMA left {} KiB",
            device.queue_id(),
            Bytes(info.size),
            info.logical_block_size,
            info.volatile_write_cache,
            Bytes(u64::from(info.max_transfer)),
            pool.remaining() / 1024
        );
        return Ok(Either::Right(device));
    }
    let Some(&(_, slot)) = disks.chosen.iter().find(|(name, _)| name == user) else {
        return Err("no disk was chosen".into());
    };
    let function = &disks.functions[slot];
    let address = function.address;
    let transport = transport(pci, function, Intx::Disabled)
        .map_err(|why| alloc::format!("pci {address}: {why}"))?;
    let disk = VirtioBlk::new(transport, pool, target_image::virtio_blk_config(config))
        .map_err(|error| alloc::format!("pci {address}: virtio-blk: {error}"))?;
    let info = disk.info();
    let how = match backing {
        Backing::VirtioBlk(VirtioSelector::Serial(_)) => "by serial",
        _ => "by PCI address",
    };
    let serial = disks.probes.get(slot).map(|probe| &probe.serial);
    log!(
        "disk: {user} on pci {address} ({how}; {}): {} in {}-byte blocks, write cache {}, \
         features {:#x}, DMA left {} KiB",
        match serial {
            Some(serial) => alloc::format!("{}", SerialOf(serial)),
            None => "serial not read".into(),
        },
        Bytes(info.size),
        info.logical_block_size,
        info.volatile_write_cache,
        disk.features(),
        pool.remaining() / 1024
    );
    Ok(Either::Left(disk))
}
