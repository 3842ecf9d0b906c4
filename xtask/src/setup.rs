//! The machine's packages: what the demo and the tests need, and the one
//! QEMU Brick stands on.
//!
//! Brick stands on **Debian 12's QEMU 7.2** (`qemu-system-x86` and a
//! `qemu-utils` of the same version). The judge is tuned and proven on it
//! (TCG timings, the stream netdev the relay speaks, Linux's long timers),
//! and it comes from the archive the machine already uses. A newer QEMU
//! from backports would add a stream netdev that reconnects and the igb
//! NIC; the relay already keeps every VM's link up across target restarts,
//! and no test needs igb, so neither is worth a second archive.
//!
//! A new machine of this project's kind ships `qemu-utils` 10 (a backport)
//! and no `qemu-system-x86`. The two cannot be installed side by side
//! (qemu-utils 10 breaks qemu-system-common < 8.0), so the plan pins every
//! QEMU package to the 7.2 series and allows the downgrade. The plan is a
//! pure function of `apt-cache policy`'s output ([`plan`]), tested on the
//! outputs of a new machine, of one without QEMU and of one already set up.
//!
//! `cargo xtask setup` (and `.ci/run`) installs what is missing; `cargo
//! xtask demo` and `cargo xtask test` do the same before they start, or,
//! when they cannot install (not root, or `BRICK_NO_INSTALL=1`), fail with
//! the exact `apt-get` line. Every QEMU start goes through [`qemu`], which
//! prints the version once and refuses any other series.

use crate::util::{self, step};
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::sync::OnceLock;

/// The upstream QEMU series Brick stands on (Debian 12's).
pub const QEMU_SERIES: &str = "7.2";

/// QEMU packages that are always installed at the chosen version.
const QEMU_REQUIRED: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "qemu-utils",
];

/// QEMU packages pinned to the chosen series only when already installed
/// (a leftover of another series would hold its siblings back).
const QEMU_IF_INSTALLED: &[&str] = &["qemu-block-extra", "qemu-system-gui"];

/// What a command needs from the machine.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Purpose {
    /// `cargo xtask demo`: QEMU for the image.
    Demo,
    /// The judge (`cargo xtask test`, `vm build`, `demo --linux`): QEMU,
    /// the Debian kernel's headers and source for the rtrs/rnbd modules,
    /// busybox for the initramfs, fio, rping and the rxe provider.
    Judge,
}

/// The packages besides QEMU that `purpose` needs; `abi` is the kernel ABI
/// the judge VMs boot (its headers build the out-of-tree modules).
fn other_packages(purpose: Purpose, abi: &str) -> Vec<String> {
    // Every build of the workspace compiles verbs-ibv against these
    // headers and links the libraries (`brick-target --link ibv:…`).
    let verbs = ["libibverbs-dev", "librdmacm-dev"].map(String::from);
    match purpose {
        Purpose::Demo => verbs.to_vec(),
        Purpose::Judge => verbs
            .into_iter()
            .chain(
                [
                    "busybox-static",
                    "iproute2",
                    "cpio",
                    "kmod",
                    "xz-utils",
                    "build-essential",
                    "bc",
                    "linux-source-6.1",
                    "fio",
                    // mkfs.ext4 for the thin volume's filesystem case.
                    "e2fsprogs",
                    // The stock NBD client for the daemon's NBD export on rxe.
                    "nbd-client",
                    "rdmacm-utils",
                    "ibverbs-providers",
                    // UEFI firmware for the brick-uefi target and the image
                    // suite's disk boots (/usr/share/OVMF).
                    "ovmf",
                    // `cargo xtask bench-cost` counts instructions with callgrind.
                    "valgrind",
                    // The admin plane's test scrapes brick-target with a real Prometheus.
                    "prometheus",
                ]
                .iter()
                .map(|p| p.to_string()),
            )
            .chain([format!("linux-headers-{abi}")])
            .collect(),
    }
}

/// One package of `apt-cache policy`'s output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The package name.
    pub package: String,
    /// The installed version, if any.
    pub installed: Option<String>,
    /// The versions of the version table, highest first, each with
    /// whether an archive offers it (not only `/var/lib/dpkg/status`).
    pub versions: Vec<(String, bool)>,
}

/// Parses `apt-cache policy PKG...` output. Packages apt does not know are
/// simply absent (apt-cache prints them nowhere on stdout).
pub fn parse_policy(text: &str) -> Vec<Policy> {
    let mut policies: Vec<Policy> = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            if let Some(name) = line.strip_suffix(':') {
                policies.push(Policy {
                    package: name.to_string(),
                    installed: None,
                    versions: Vec::new(),
                });
                in_table = false;
            }
            continue;
        }
        let Some(policy) = policies.last_mut() else {
            continue;
        };
        let trimmed = line.trim();
        if let Some(version) = trimmed.strip_prefix("Installed:") {
            let version = version.trim();
            policy.installed = (version != "(none)").then(|| version.to_string());
        } else if trimmed.starts_with("Version table:") {
            in_table = true;
        } else if in_table {
            // A version line: "*** 1:7.2+dfsg-7 500" or "1:7.2+dfsg-7 500";
            // an origin line: "500 http://deb.debian.org/debian ..." or
            // "100 /var/lib/dpkg/status".
            let words: Vec<&str> = trimmed
                .trim_start_matches("*** ")
                .split_whitespace()
                .collect();
            match words.as_slice() {
                [priority, origin, ..] if priority.parse::<i32>().is_ok() => {
                    if let Some(last) = policy.versions.last_mut() {
                        last.1 |= *origin != "/var/lib/dpkg/status";
                    }
                }
                [version, priority] if priority.parse::<i32>().is_ok() => {
                    policy.versions.push((version.to_string(), false));
                }
                _ => {}
            }
        }
    }
    policies
}

/// The upstream version of a Debian version: `1:7.2+dfsg-7+deb12u18` -> `7.2+dfsg`.
fn upstream(version: &str) -> &str {
    let without_epoch = version.split_once(':').map_or(version, |(_, rest)| rest);
    without_epoch
        .rsplit_once('-')
        .map_or(without_epoch, |(upstream, _)| upstream)
}

/// Whether a Debian version belongs to [`QEMU_SERIES`].
fn in_series(version: &str) -> bool {
    let upstream = upstream(version);
    upstream
        .strip_prefix(QEMU_SERIES)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '+', '~']))
}

/// What has to be installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The chosen `qemu-system-x86` version.
    pub qemu: String,
    /// `apt-get install` arguments: `pkg` or `pkg=version`.
    pub install: Vec<String>,
    /// An installed package is replaced by an older version.
    pub allow_downgrades: bool,
    /// Installed packages of another version that the plan replaces.
    pub replaced: Vec<(String, String)>,
}

impl Plan {
    /// The exact `apt-get` line that carries the plan out, if anything is missing.
    pub fn apt_line(&self) -> Option<String> {
        if self.install.is_empty() {
            return None;
        }
        let downgrades = if self.allow_downgrades {
            " --allow-downgrades"
        } else {
            ""
        };
        Some(format!(
            "apt-get install -y --no-install-recommends{downgrades} {}",
            self.install.join(" ")
        ))
    }
}

/// Derives what to install from `apt-cache policy` output for the QEMU
/// packages and `others` (installed if missing, at apt's candidate).
///
/// # Errors
/// A package apt does not know (run `apt-get update`), or no version of
/// the QEMU series in any archive.
pub fn plan(policy_text: &str, others: &[String]) -> Result<Plan> {
    let policies = parse_policy(policy_text);
    let find = |name: &str| policies.iter().find(|p| p.package == name);
    let system = find("qemu-system-x86").context(
        "apt-cache knows no qemu-system-x86: run `apt-get update` (Debian 12's main archive has it)",
    )?;
    let pick = |policy: &Policy, prefer: Option<&str>| -> Option<String> {
        let offered = || {
            policy
                .versions
                .iter()
                .filter(|(v, archive)| *archive && in_series(v))
        };
        prefer
            .and_then(|p| offered().find(|(v, _)| v == p))
            .or_else(|| offered().next())
            .map(|(v, _)| v.clone())
    };
    let qemu = pick(system, None).with_context(|| {
        format!(
            "no archive offers qemu-system-x86 {QEMU_SERIES} (Debian 12's QEMU); apt-cache offers: {}",
            system
                .versions
                .iter()
                .map(|(v, _)| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let mut plan = Plan {
        qemu: qemu.clone(),
        install: Vec::new(),
        allow_downgrades: false,
        replaced: Vec::new(),
    };
    let optional = QEMU_IF_INSTALLED
        .iter()
        .filter(|name| find(name).is_some_and(|p| p.installed.is_some()));
    for name in QEMU_REQUIRED.iter().chain(optional) {
        let policy = find(name)
            .with_context(|| format!("apt-cache knows no {name}: run `apt-get update`"))?;
        // Architecture-independent packages (qemu-system-data) carry no
        // binNMU suffix: take the series' newest where the exact one is absent.
        let version = pick(policy, Some(&qemu)).with_context(|| {
            format!("no archive offers {name} {QEMU_SERIES} to go with qemu-system-x86 {qemu}")
        })?;
        if policy.installed.as_deref() == Some(version.as_str()) {
            continue;
        }
        if let Some(installed) = &policy.installed {
            plan.allow_downgrades = true;
            plan.replaced.push((name.to_string(), installed.clone()));
        }
        plan.install.push(format!("{name}={version}"));
    }
    for name in others {
        let policy = find(name)
            .with_context(|| format!("apt-cache knows no package {name}: run `apt-get update`"))?;
        if policy.installed.is_none() {
            plan.install.push(name.clone());
        }
    }
    Ok(plan)
}

/// The kernel ABI `linux-image-amd64` currently depends on (Debian bumps it
/// with security updates; the judge VMs boot it and build against its headers).
pub fn kernel_abi() -> Result<String> {
    let depends = util::output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    for line in depends.lines() {
        if let Some(name) = line.trim().strip_prefix("Depends: linux-image-") {
            return Ok(name.trim().to_string());
        }
    }
    bail!(
        "apt-cache does not know linux-image-amd64's kernel; run `apt-get update` first \
         (found: {depends:?})"
    )
}

/// The plan for `purpose` on this machine.
fn machine_plan(purpose: Purpose) -> Result<Plan> {
    util::require_tool("apt-cache", "apt").context("Brick's set-up expects a Debian 12 machine")?;
    let abi = match purpose {
        Purpose::Demo => String::new(),
        Purpose::Judge => kernel_abi()?,
    };
    let others = other_packages(purpose, &abi);
    let mut command = Command::new("apt-cache");
    command
        .arg("policy")
        .args(QEMU_REQUIRED)
        .args(QEMU_IF_INSTALLED)
        .args(&others);
    plan(&util::output(&mut command)?, &others)
}

/// Whether this process may install packages itself.
fn may_install() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root && std::env::var_os("BRICK_NO_INSTALL").is_none_or(|v| v.is_empty() || v == "0")
}

/// Makes sure the machine has what `purpose` needs: installs what is
/// missing when it may ([`may_install`]), else fails with the `apt-get`
/// line. Prints the QEMU in use.
pub fn ensure(purpose: Purpose) -> Result<()> {
    let plan = machine_plan(purpose)?;
    if let Some(line) = plan.apt_line() {
        for (package, version) in &plan.replaced {
            eprintln!(
                "    {package} {version} is installed; Brick stands on QEMU {QEMU_SERIES} \
                 (qemu-system-x86 {}), so it is replaced",
                plan.qemu
            );
        }
        if !may_install() {
            bail!(
                "missing packages; install them (as root) with:\n    apt-get update && {line}\n\
                 (`cargo xtask setup` does this; set-up is skipped because this is not root \
                 or BRICK_NO_INSTALL is set)"
            );
        }
        step(format!("installing: {line}"));
        if install(&line).is_err() {
            step("the archive's lists look stale: apt-get update, then again");
            util::run(Command::new("apt-get").args(["update", "-q"])).context("apt-get update")?;
            install(&line)?;
        }
        let after = machine_plan(purpose)?;
        if let Some(line) = after.apt_line() {
            bail!("after installing, apt still reports missing packages: {line}");
        }
    }
    qemu().map(|_| ())
}

/// Runs one `apt-get install` line, quietly; fails with the end of its log.
fn install(line: &str) -> Result<()> {
    let output = Command::new("sh")
        .arg("-c")
        .arg(line)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(std::process::Stdio::null())
        .output()
        .context("could not start apt-get")?;
    if !output.status.success() {
        let log = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("`{line}` failed ({}):\n{}", output.status, tail.join("\n"));
    }
    Ok(())
}

/// The version QEMU reports, e.g. `7.2.19 (Debian 1:7.2+dfsg-7+deb12u18+b2)`,
/// from `qemu-system-x86_64 --version`'s first line.
pub fn parse_qemu_version(text: &str) -> Option<&str> {
    text.lines()
        .next()?
        .split_once("version ")
        .map(|(_, version)| version.trim())
}

/// `qemu-system-x86_64`, checked: it exists and is of [`QEMU_SERIES`].
/// Prints the version the first time.
///
/// # Errors
/// QEMU is missing or of another series: the message carries the exact
/// `apt-get` line.
pub fn qemu() -> Result<&'static str> {
    static VERSION: OnceLock<String> = OnceLock::new();
    if let Some(version) = VERSION.get() {
        return Ok(version);
    }
    let fix = || {
        machine_plan(Purpose::Demo)
            .ok()
            .and_then(|plan| plan.apt_line())
            .map_or_else(
                || "cargo xtask setup".to_string(),
                |line| format!("apt-get update && {line}"),
            )
    };
    let output = match Command::new("qemu-system-x86_64").arg("--version").output() {
        Ok(output) if output.status.success() => output,
        _ => bail!(
            "qemu-system-x86_64 is not installed; Brick stands on QEMU {QEMU_SERIES}: {}",
            fix()
        ),
    };
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let version = parse_qemu_version(&text)
        .with_context(|| format!("qemu-system-x86_64 --version printed {text:?}"))?;
    let series_ok = version
        .strip_prefix(QEMU_SERIES)
        .is_some_and(|rest| rest.starts_with(['.', ' ']) || rest.is_empty());
    if !series_ok {
        bail!(
            "qemu-system-x86_64 is version {version}; Brick stands on QEMU {QEMU_SERIES} \
             (Debian 12's): {}",
            fix()
        );
    }
    step(format!("QEMU {version}"));
    Ok(VERSION.get_or_init(|| version.to_string()))
}

/// `cargo xtask setup`: installs what `--demo-only` or the judge needs.
#[derive(clap::Args)]
pub struct SetupArgs {
    /// Only what `cargo xtask demo` needs (QEMU, the verbs headers).
    #[arg(long)]
    demo_only: bool,
    /// Print the plan and its `apt-get` line; install nothing.
    #[arg(long)]
    check: bool,
}

/// Runs `cargo xtask setup`.
pub fn run(args: SetupArgs) -> Result<()> {
    let purpose = if args.demo_only {
        Purpose::Demo
    } else {
        Purpose::Judge
    };
    if args.check {
        let plan = machine_plan(purpose)?;
        println!("QEMU: qemu-system-x86 {} (series {QEMU_SERIES})", plan.qemu);
        match plan.apt_line() {
            Some(line) => println!("missing: {line}"),
            None => println!("nothing is missing"),
        }
        return Ok(());
    }
    ensure(purpose)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apt-cache policy` on a new machine of this project's kind:
    /// qemu-utils 10 from backports installed, no qemu-system-x86.
    const NEW_MACHINE: &str = include_str!("../testdata/apt-policy-new-machine.txt");
    /// The same archive on a machine with no QEMU at all.
    const NO_QEMU: &str = include_str!("../testdata/apt-policy-no-qemu.txt");
    /// A machine already set up (Debian 12's QEMU 7.2 throughout).
    const SET_UP: &str = include_str!("../testdata/apt-policy-set-up.txt");

    const V72: &str = "1:7.2+dfsg-7+deb12u18+b2";

    #[test]
    fn parses_installed_and_archive_versions() {
        let policies = parse_policy(NEW_MACHINE);
        let utils = policies.iter().find(|p| p.package == "qemu-utils").unwrap();
        assert_eq!(
            utils.installed.as_deref(),
            Some("1:10.0.2+ds-2+deb13u1~bpo12+1")
        );
        assert_eq!(
            utils.versions,
            vec![
                ("1:10.0.2+ds-2+deb13u1~bpo12+1".to_string(), false),
                (V72.to_string(), true),
                ("1:7.2+dfsg-7+deb12u15".to_string(), true),
            ]
        );
        let system = policies
            .iter()
            .find(|p| p.package == "qemu-system-x86")
            .unwrap();
        assert_eq!(system.installed, None);
    }

    #[test]
    fn new_machine_downgrades_qemu_utils_to_the_system_version() {
        let plan = plan(NEW_MACHINE, &[]).unwrap();
        assert_eq!(plan.qemu, V72);
        assert_eq!(
            plan.install,
            vec![
                format!("qemu-system-x86={V72}"),
                format!("qemu-system-common={V72}"),
                "qemu-system-data=1:7.2+dfsg-7+deb12u18".to_string(),
                format!("qemu-utils={V72}"),
            ]
        );
        assert!(plan.allow_downgrades);
        assert_eq!(
            plan.replaced,
            vec![(
                "qemu-utils".to_string(),
                "1:10.0.2+ds-2+deb13u1~bpo12+1".to_string()
            )]
        );
        let line = plan.apt_line().unwrap();
        assert!(line.starts_with("apt-get install -y --no-install-recommends --allow-downgrades "));
        assert!(line.ends_with(&format!("qemu-utils={V72}")), "{line}");
    }

    #[test]
    fn machine_without_qemu_installs_the_series_without_downgrades() {
        let plan = plan(NO_QEMU, &[]).unwrap();
        assert_eq!(plan.qemu, V72);
        assert_eq!(plan.install.len(), 4);
        assert!(plan.install.contains(&format!("qemu-utils={V72}")));
        assert!(!plan.allow_downgrades);
        assert!(plan.replaced.is_empty());
    }

    #[test]
    fn set_up_machine_needs_nothing() {
        let plan = plan(SET_UP, &[]).unwrap();
        assert_eq!(plan.apt_line(), None);
    }

    #[test]
    fn other_packages_missing_or_present() {
        let others = ["fio".to_string(), "prometheus".to_string()];
        let plan = plan(SET_UP, &others).unwrap();
        // fio is installed in the set-up fixture, prometheus is not.
        assert_eq!(plan.install, vec!["prometheus".to_string()]);
        assert!(!plan.allow_downgrades);
    }

    #[test]
    fn unknown_package_asks_for_apt_get_update() {
        let error = plan(SET_UP, &["no-such-package".to_string()]).unwrap_err();
        assert!(format!("{error:#}").contains("apt-get update"), "{error:#}");
        let error = plan("", &[]).unwrap_err();
        assert!(
            format!("{error:#}").contains("qemu-system-x86"),
            "{error:#}"
        );
    }

    #[test]
    fn no_archive_version_of_the_series_is_an_error() {
        // Only the installed backport, no archive: nothing of 7.2 to pick.
        let only_backport = "qemu-system-x86:\n  Installed: 1:10.0.2+ds-2\n  Candidate: 1:10.0.2+ds-2\n  Version table:\n *** 1:10.0.2+ds-2 100\n        100 /var/lib/dpkg/status\n";
        let error = plan(only_backport, &[]).unwrap_err();
        assert!(format!("{error:#}").contains("1:10.0.2+ds-2"), "{error:#}");
    }

    #[test]
    fn series_and_qemu_version() {
        assert!(in_series("1:7.2+dfsg-7+deb12u18+b2"));
        assert!(in_series("1:7.2.5-1"));
        assert!(!in_series("1:7.20+dfsg-1"));
        assert!(!in_series("1:10.0.2+ds-2+deb13u1~bpo12+1"));
        assert_eq!(
            parse_qemu_version(
                "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18+b2)\nCopyright (c) 2003-2022 Fabrice Bellard\n"
            ),
            Some("7.2.19 (Debian 1:7.2+dfsg-7+deb12u18+b2)")
        );
    }
}
