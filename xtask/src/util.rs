//! Running host commands with progress and errors that say what failed.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// Prints a progress step.
pub fn step(message: impl AsRef<str>) {
    eprintln!("==> {}", message.as_ref());
}

/// Runs `command`, failing with its stderr when it exits non-zero.
pub fn run(command: &mut Command) -> Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Runs `command` and returns its stdout.
pub fn output(command: &mut Command) -> Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs a shell snippet with `sh -c`.
pub fn sh(script: &str) -> Result<()> {
    run(Command::new("sh").arg("-c").arg(script))
}

/// Fails with the install command when `tool` is not on PATH.
pub fn require_tool(tool: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    if !found {
        bail!(
            "`{tool}` is not installed; install it with: apt-get install -y {package} \
             (.ci/run installs everything the tests need)"
        );
    }
    Ok(())
}

/// Fails with the install command when `path` does not exist.
pub fn require_path(path: &Path, package: &str) -> Result<()> {
    if !path.exists() {
        bail!(
            "{} is missing; install it with: apt-get install -y {package} \
             (.ci/run installs everything the tests need)",
            path.display()
        );
    }
    Ok(())
}

/// Builds release binaries, each named by (package, binary), in one cargo
/// invocation, and returns their paths in order. (`--bin` filters every
/// selected package, so each binary is named explicitly.)
pub fn build_release_bins(bins: &[(&str, &str)]) -> Result<Vec<std::path::PathBuf>> {
    let names: Vec<&str> = bins.iter().map(|(_, bin)| *bin).collect();
    step(format!("building {} (release)", names.join(", ")));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(crate::paths::repo())
        .args(["build", "--release"]);
    for (package, bin) in bins {
        command.args(["-p", package, "--bin", bin]);
    }
    run(&mut command)?;
    let release = crate::paths::target_dir().join("release");
    Ok(names.iter().map(|bin| release.join(bin)).collect())
}

/// `brick-target` and the `brick` CLI (release): their paths.
pub fn build_target_and_cli() -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let paths = build_release_bins(&[
        ("brick-target-image", "brick-target"),
        ("brick-cli", "brick"),
    ])?;
    Ok((paths[0].clone(), paths[1].clone()))
}

/// `manifest` (TOML text) with every interface at `mtu`: its own `mtu`
/// lines dropped, one added after each interface address (the only
/// `address = "a.b.c.d/n"` lines).
pub fn manifest_at_mtu(manifest: &str, mtu: u32) -> String {
    let mut text = String::new();
    for line in manifest.lines() {
        if line.starts_with("mtu") {
            continue;
        }
        text += line;
        text += "\n";
        if line.starts_with("address") && line.contains('/') {
            text += &format!("mtu = {mtu}\n");
        }
    }
    text
}
