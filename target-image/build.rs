//! Links the bare-metal image (`brick-image`) with `linker/brick-image.ld`
//! when building for a target without an OS (x86_64-unknown-none); host
//! builds are untouched.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let script = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("../linker/brick-image.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        println!(
            "cargo:rustc-link-arg-bin=brick-image=-T{}",
            script.display()
        );
    }
}
