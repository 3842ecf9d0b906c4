//! Where things live: the repository, the build cache, per-run scratch.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// The repository root (the workspace directory).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Cargo's output directory: `$CARGO_TARGET_DIR`, default `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

/// The build cache for VM images (`$BRICK_BUILD_DIR`, default `build/`).
pub fn build_dir() -> PathBuf {
    std::env::var_os("BRICK_BUILD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("build"))
}

/// Guest-side scripts and the initramfs recipe.
pub fn qemu_dir() -> PathBuf {
    repo().join("qemu")
}

/// A fresh scratch directory for one VM or relay run. Unix socket paths must
/// stay under 108 bytes, so this lives in /tmp with a short name.
pub fn scratch(tag: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(format!("/tmp/brick.{}.{n}.{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch directory in /tmp");
    dir
}
