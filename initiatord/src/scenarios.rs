//! Reconciliation scenarios against [`FakeKernel`]: every case of issue 7.

use std::time::{Duration, Instant};

use crate::config::{parse, Config};
use crate::fake::{FakeKernel, FakePathState};
use crate::reconcile::{converged, reconcile, Memory, Options, Pass};
use crate::sysfs::Sysfs;

const TWO_VOLUMES: &str = r#"
[daemon]
retry_interval_s = 5
reconnect_after_s = 5

[[volumes]]
name = "db"
session = "host1"
device_path = "vol0"
paths = ["10.77.0.1", "10.78.0.1"]

[[volumes]]
name = "logs"
session = "host1"
device_path = "vol1"
paths = ["10.77.0.1", "10.78.0.1"]
"#;

/// The first volume of [`TWO_VOLUMES`] plus `scratch` (vol2); `logs` gone.
const RELOADED: &str = r#"
[daemon]
retry_interval_s = 5
reconnect_after_s = 5

[[volumes]]
name = "db"
session = "host1"
device_path = "vol0"
paths = ["10.77.0.1", "10.78.0.1"]

[[volumes]]
name = "scratch"
session = "host1"
device_path = "vol2"
paths = ["10.77.0.1", "10.78.0.1"]
"#;

const PATH_A: &str = "ip:10.77.0.2@ip:10.77.0.1";
const PATH_B: &str = "ip:10.78.0.2@ip:10.78.0.1";

struct World {
    kernel: FakeKernel,
    memory: Memory,
    start: Instant,
    log: Vec<String>,
    options: Options,
}

impl World {
    /// A kernel whose target exports vol0..vol3.
    fn new() -> Self {
        let mut kernel = FakeKernel::new();
        for volume in ["vol0", "vol1", "vol2", "vol3"] {
            kernel.export(volume);
        }
        Self {
            kernel,
            memory: Memory::default(),
            start: Instant::now(),
            log: Vec::new(),
            options: Options::default(),
        }
    }

    /// One daemon pass at `seconds` after the start.
    fn pass(&mut self, config: &Config, seconds: u64) -> Pass {
        let now = self.start + Duration::from_secs(seconds);
        let log = &mut self.log;
        let pass = reconcile(
            &mut self.kernel,
            config,
            &mut self.memory,
            now,
            self.options,
            &mut |line| log.push(line.to_owned()),
        )
        .expect("observe never fails on the fake");
        for notice in self.memory.new_notices(&pass.notices) {
            self.log.push(format!("notice: {notice}"));
        }
        pass
    }

    /// Writes made since the last call.
    fn take_writes(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.kernel.writes)
    }

    fn logged(&self, text: &str) -> bool {
        self.log.iter().any(|line| line.contains(text))
    }

    /// A converged start: both volumes mapped and linked.
    fn started() -> (Self, Config) {
        let config = config(TWO_VOLUMES);
        let mut world = Self::new();
        world.pass(&config, 0);
        assert!(converged(&config, &world.pass(&config, 0).observed));
        world.take_writes();
        world.log.clear();
        (world, config)
    }
}

fn config(text: &str) -> Config {
    parse(text, "test.toml").expect("test config")
}

fn writes_to(writes: &[(String, String)], file: &str) -> Vec<String> {
    writes
        .iter()
        .filter(|(path, _)| path.ends_with(file))
        .map(|(path, value)| format!("{path} {value}"))
        .collect()
}

#[test]
fn test_maps_two_volumes_at_start_with_symlinks() {
    let config = config(TWO_VOLUMES);
    let mut world = World::new();
    let pass = world.pass(&config, 0);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert!(world.kernel.rnbd_loaded());
    let writes = world.take_writes();
    assert_eq!(
        writes_to(&writes, "map_device"),
        [
            "/sys/devices/virtual/rnbd-client/ctl/map_device sessname=host1 dest_port=1234 \
             path=ip:10.77.0.1 path=ip:10.78.0.1 device_path=vol0 access_mode=rw",
            "/sys/devices/virtual/rnbd-client/ctl/map_device sessname=host1 dest_port=1234 \
             path=ip:10.77.0.1 path=ip:10.78.0.1 device_path=vol1 access_mode=rw",
        ]
    );
    assert_eq!(world.kernel.device_names(), ["rnbd0", "rnbd1"]);
    assert_eq!(world.kernel.link("db"), Some("../rnbd0"));
    assert_eq!(world.kernel.link("logs"), Some("../rnbd1"));
    assert_eq!(
        world.kernel.paths("host1"),
        [
            (PATH_A.to_owned(), FakePathState::Connected),
            (PATH_B.to_owned(), FakePathState::Connected)
        ]
    );
    assert!(converged(&config, &pass.observed));
    // Every action is logged with its reason.
    assert!(world.logged("modprobe rnbd-client: 2 volume(s) configured"));
    assert!(world.logged("map db (sessname=host1"));
    assert!(world.logged("no rnbd device maps it"));
    assert!(world.logged("link /dev/brick/logs -> ../rnbd1: /dev/brick/logs missing"));
}

#[test]
fn test_second_pass_changes_nothing() {
    let (mut world, config) = World::started();
    let pass = world.pass(&config, 1);
    assert!(pass.applied.is_empty());
    assert!(pass.notices.is_empty(), "{:?}", pass.notices);
    assert!(world.take_writes().is_empty());
}

#[test]
fn test_restart_changes_nothing() {
    let (mut world, config) = World::started();
    // A new daemon: nothing remembered.
    world.memory = Memory::default();
    let pass = world.pass(&config, 100);
    assert!(pass.applied.is_empty());
    assert!(world.take_writes().is_empty());
    assert!(world.log.is_empty(), "{:?}", world.log);
}

#[test]
fn test_reload_adds_and_removes_a_volume() {
    let (mut world, _) = World::started();
    let reloaded = config(RELOADED);
    let pass = world.pass(&reloaded, 1);
    assert!(!pass.any_failed(), "{:?}", world.log);
    let writes = world.take_writes();
    assert_eq!(
        writes_to(&writes, "unmap_device"),
        ["/sys/block/rnbd1/rnbd/unmap_device normal"]
    );
    assert!(world.logged("unmap rnbd1 (normal): volume \"logs\" is no longer in the config"));
    assert_eq!(world.kernel.link("logs"), None);
    assert_eq!(
        world.kernel.device_for("host1", "vol0").as_deref(),
        Some("rnbd0")
    );
    let scratch = world
        .kernel
        .device_for("host1", "vol2")
        .expect("scratch mapped");
    assert_eq!(
        world.kernel.link("scratch"),
        Some(format!("../{scratch}").as_str())
    );
    assert_eq!(world.kernel.link("db"), Some("../rnbd0"));
    assert!(!writes.iter().any(|(path, _)| path.contains("rnbd0")));
    assert!(converged(&reloaded, &pass.observed));
    assert!(world.pass(&reloaded, 2).applied.is_empty());
}

#[test]
fn test_reload_never_unmaps_a_mounted_device() {
    let (mut world, _) = World::started();
    world.kernel.mount("rnbd1", "/mnt/logs");
    let reloaded = config(RELOADED);
    world.pass(&reloaded, 1);
    let writes = world.take_writes();
    assert!(writes_to(&writes, "unmap_device").is_empty());
    assert_eq!(
        world.kernel.device_for("host1", "vol1").as_deref(),
        Some("rnbd1")
    );
    assert_eq!(world.kernel.link("logs"), Some("../rnbd1"));
    assert!(world.logged("keeping rnbd1 (/dev/brick/logs)"));
    assert!(world.logged("mounted at /mnt/logs; unmount it or run with --force"));
    // The notice is logged once, not every second.
    let before = world.log.len();
    world.pass(&reloaded, 2);
    assert_eq!(world.log.len(), before);
    // With --force it goes.
    world.options.force = true;
    world.pass(&reloaded, 3);
    let writes = world.take_writes();
    assert_eq!(
        writes_to(&writes, "unmap_device"),
        ["/sys/block/rnbd1/rnbd/unmap_device force"]
    );
    assert_eq!(world.kernel.link("logs"), None);
}

#[test]
fn test_reload_never_unmaps_a_held_device() {
    let (mut world, _) = World::started();
    world.kernel.add_holder("rnbd1", "dm-0");
    world.pass(&config(RELOADED), 1);
    assert!(writes_to(&world.take_writes(), "unmap_device").is_empty());
    assert!(world.logged("it is held by dm-0"));
}

#[test]
fn test_open_device_refused_by_kernel_is_retried_later() {
    let (mut world, _) = World::started();
    // Open but neither mounted nor held (a `dd` running, say): the plan
    // sees no user, the kernel refuses the normal unmap with EBUSY.
    world.kernel.open("rnbd1");
    let reloaded = config(RELOADED);
    let pass = world.pass(&reloaded, 1);
    assert!(pass.any_failed());
    assert!(world.logged("unmap rnbd1 (normal) failed: Device or resource busy"));
    assert_eq!(
        world.kernel.device_for("host1", "vol1").as_deref(),
        Some("rnbd1")
    );
    assert_eq!(world.kernel.link("logs"), Some("../rnbd1"));
    world.take_writes();
    world.pass(&reloaded, 3);
    assert!(writes_to(&world.take_writes(), "unmap_device").is_empty());
}

#[test]
fn test_removed_path_comes_back() {
    let (mut world, config) = World::started();
    world
        .kernel
        .write(
            &format!("/sys/class/rtrs-client/host1/paths/{PATH_B}/remove_path"),
            "1",
        )
        .unwrap();
    assert_eq!(world.kernel.paths("host1").len(), 1);
    world.take_writes();
    world.pass(&config, 1);
    assert_eq!(
        writes_to(&world.take_writes(), "add_path"),
        ["/sys/class/rtrs-client/host1/add_path ip:10.78.0.1"]
    );
    assert!(world.logged(
        "config lists path ip:10.78.0.1 (line 6), session \"host1\" has ip:10.77.0.2@ip:10.77.0.1"
    ));
    assert_eq!(world.kernel.paths("host1").len(), 2);
    assert!(world.pass(&config, 2).applied.is_empty());
}

#[test]
fn test_lost_path_is_reconnected() {
    let (mut world, config) = World::started();
    world.kernel.link_down("10.78.0.1");
    // Down for less than reconnect_after_s: leave it to RTRS.
    assert!(world.pass(&config, 10).applied.is_empty());
    world.kernel.link_up("10.78.0.1");
    assert!(world.pass(&config, 12).applied.is_empty());
    let pass = world.pass(&config, 15);
    assert_eq!(pass.applied.len(), 1, "{:?}", world.log);
    assert_eq!(
        writes_to(&world.take_writes(), "reconnect"),
        [format!(
            "/sys/class/rtrs-client/host1/paths/{PATH_B}/reconnect 1"
        )]
    );
    assert!(world.logged("path disconnected for 5s"));
    assert_eq!(world.kernel.paths("host1")[1].1, FakePathState::Connected);
}

#[test]
fn test_target_reboot_reconnects_and_devices_reopen() {
    let (mut world, config) = World::started();
    world.kernel.target_down();
    assert_eq!(world.kernel.device_state("rnbd0"), Some("closed"));
    world.pass(&config, 10);
    assert!(world.logged("db: rnbd0 is closed; waiting for a path of session \"host1\""));
    world.kernel.target_up();
    // The daemon does not wait for RTRS's 30 s timer.
    let pass = world.pass(&config, 15);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert_eq!(writes_to(&world.take_writes(), "reconnect").len(), 2);
    assert_eq!(world.kernel.device_state("rnbd0"), Some("open"));
    assert_eq!(world.kernel.device_state("rnbd1"), Some("open"));
    assert!(converged(&config, &pass.observed));
    assert!(world.pass(&config, 16).applied.is_empty());
}

#[test]
fn test_reconnect_while_target_down_is_throttled() {
    let (mut world, config) = World::started();
    world.kernel.target_down();
    world.pass(&config, 0);
    let pass = world.pass(&config, 5);
    assert!(pass.any_failed());
    assert_eq!(writes_to(&world.take_writes(), "reconnect").len(), 2);
    assert!(world.pass(&config, 7).applied.is_empty());
    assert!(world.take_writes().is_empty());
    assert!(world.logged("held off after a failure or no effect; retried at most every 5s"));
    // Logged once, not at every pass.
    let before = world.log.len();
    world.pass(&config, 8);
    assert_eq!(world.log.len(), before, "{:?}", world.log);
    world.pass(&config, 10);
    assert_eq!(writes_to(&world.take_writes(), "reconnect").len(), 2);
}

#[test]
fn test_lost_volume_is_remapped() {
    let (mut world, config) = World::started();
    // The target restarts without vol1; RTRS reconnects by itself; rnbd's
    // own reopen of vol1 fails, so rnbd1 stays closed.
    world.kernel.target_down();
    world.kernel.unexport("vol1");
    world.kernel.target_up();
    world.kernel.auto_reconnect();
    assert_eq!(world.kernel.device_state("rnbd0"), Some("open"));
    assert_eq!(world.kernel.device_state("rnbd1"), Some("closed"));
    // rnbd reopens asynchronously: give it remap_after_s first.
    assert!(world.pass(&config, 1).applied.is_empty());
    assert!(world.logged("remap_device in 2s unless rnbd reopens it"));
    let pass = world.pass(&config, 3);
    assert!(pass.any_failed());
    assert_eq!(
        writes_to(&world.take_writes(), "remap_device"),
        ["/sys/block/rnbd1/rnbd/remap_device 1"]
    );
    assert!(world.logged("remap logs (rnbd1): rnbd1 is closed while path"));
    assert!(world.logged("remap logs (rnbd1) failed: No such file or directory"));
    // Not retried before retry_interval_s.
    world.pass(&config, 5);
    assert!(world.take_writes().is_empty());
    // The target serves it again.
    world.kernel.export("vol1");
    let pass = world.pass(&config, 8);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert_eq!(world.kernel.device_state("rnbd1"), Some("open"));
    assert!(converged(&config, &pass.observed));
}

#[test]
fn test_given_up_session_is_revived() {
    let (mut world, config) = World::started();
    world.kernel.target_down();
    world.kernel.give_up("host1");
    world.kernel.target_up();
    // RTRS will never retry by itself.
    world.kernel.auto_reconnect();
    assert_eq!(world.kernel.device_state("rnbd0"), Some("closed"));
    world.pass(&config, 0);
    let pass = world.pass(&config, 5);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert_eq!(world.kernel.device_state("rnbd0"), Some("open"));
    assert_eq!(world.kernel.device_state("rnbd1"), Some("open"));
    assert!(converged(&config, &pass.observed));
}

#[test]
fn test_lost_session_is_mapped_again() {
    let (mut world, config) = World::started();
    // The session is gone entirely (its devices were force-unmapped).
    world.kernel.admin_unmap("rnbd0");
    world.kernel.admin_unmap("rnbd1");
    assert!(world.kernel.session_names().is_empty());
    let pass = world.pass(&config, 1);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert_eq!(writes_to(&world.take_writes(), "map_device").len(), 2);
    assert_eq!(world.kernel.paths("host1").len(), 2);
    assert!(converged(&config, &pass.observed));
}

#[test]
fn test_failed_map_is_retried_after_the_interval() {
    let config = config(TWO_VOLUMES);
    let mut world = World::new();
    world.kernel.target_down();
    let pass = world.pass(&config, 0);
    assert!(pass.any_failed());
    assert!(world.logged("map db (sessname=host1"));
    assert!(world.logged("failed: Connection reset by peer"));
    world.take_writes();
    world.pass(&config, 2);
    assert!(world.take_writes().is_empty());
    world.kernel.target_up();
    let pass = world.pass(&config, 5);
    assert!(converged(&config, &pass.observed), "{:?}", world.log);
}

#[test]
fn test_changed_device_path_replaces_the_mapping() {
    let (mut world, _) = World::started();
    let changed = config(&TWO_VOLUMES.replace("\"vol1\"", "\"vol3\""));
    let pass = world.pass(&changed, 1);
    assert!(!pass.any_failed(), "{:?}", world.log);
    assert!(world.logged(
        "unmap rnbd1 (normal): volume \"logs\" now wants \"vol3\" in session \"host1\", rnbd1 maps \"vol1\""
    ));
    assert_eq!(world.kernel.device_for("host1", "vol1"), None);
    let logs = world
        .kernel
        .device_for("host1", "vol3")
        .expect("vol3 mapped");
    assert_eq!(
        world.kernel.link("logs"),
        Some(format!("../{logs}").as_str())
    );
    assert!(converged(&changed, &pass.observed));
}

#[test]
fn test_wrong_link_is_fixed_and_stale_link_removed() {
    let (mut world, config) = World::started();
    world.kernel.set_link("db", "../rnbd1");
    world.kernel.set_link("old", "../rnbd7");
    world.pass(&config, 1);
    assert_eq!(world.kernel.link("db"), Some("../rnbd0"));
    assert_eq!(world.kernel.link("old"), None);
    assert!(world.logged("/dev/brick/db -> ../rnbd1, expected -> ../rnbd0"));
    assert!(world.logged(
        "remove link /dev/brick/old: volume \"old\" is not in the config and ../rnbd7 is gone"
    ));
    // rnbd1 is still wanted (logs): never unmapped because of a wrong link.
    assert_eq!(world.kernel.device_names(), ["rnbd0", "rnbd1"]);
}

#[test]
fn test_devices_not_linked_are_not_ours() {
    let (mut world, _) = World::started();
    // An empty config: the daemon unmaps what it linked, nothing else.
    world
        .kernel
        .write(
            "/sys/devices/virtual/rnbd-client/ctl/map_device",
            "sessname=other path=ip:10.77.0.1 device_path=vol3",
        )
        .unwrap();
    world.take_writes();
    let empty = config("");
    world.pass(&empty, 1);
    let writes = world.take_writes();
    assert_eq!(writes_to(&writes, "unmap_device").len(), 2);
    assert_eq!(world.kernel.device_names(), ["rnbd2"]);
    assert!(world.kernel.link("db").is_none() && world.kernel.link("logs").is_none());
}

#[test]
fn test_access_mode_mismatch_is_reported_not_changed() {
    let (mut world, _) = World::started();
    let readonly = config(&TWO_VOLUMES.replace(
        "device_path = \"vol1\"",
        "device_path = \"vol1\"\naccess_mode = \"ro\"",
    ));
    let pass = world.pass(&readonly, 1);
    assert!(pass.applied.is_empty());
    assert!(world.logged("logs: rnbd1 is mapped rw, the config says ro"));
}

#[test]
fn test_more_than_six_paths_are_added_after_the_map() {
    let paths: Vec<String> = (1..=8).map(|i| format!("\"10.0.{i}.1\"")).collect();
    let text = format!(
        "[[volumes]]\nname = \"wide\"\nsession = \"s\"\ndevice_path = \"vol0\"\npaths = [{}]\n",
        paths.join(", ")
    );
    let config = config(&text);
    let mut world = World::new();
    let pass = world.pass(&config, 0);
    assert!(!pass.any_failed(), "{:?}", world.log);
    let writes = world.take_writes();
    let map = writes_to(&writes, "map_device");
    assert_eq!(map.len(), 1);
    assert_eq!(map[0].matches(" path=").count(), 6);
    assert_eq!(
        writes_to(&writes, "add_path"),
        [
            "/sys/class/rtrs-client/s/add_path ip:10.0.7.1",
            "/sys/class/rtrs-client/s/add_path ip:10.0.8.1"
        ]
    );
    assert_eq!(world.kernel.paths("s").len(), 8);
}

#[test]
fn test_empty_config_does_not_load_the_module() {
    let mut world = World::new();
    let pass = world.pass(&config(""), 0);
    assert!(pass.applied.is_empty());
    assert!(!world.kernel.rnbd_loaded());
}
