//! Declares the `fuzzing` cfg (set by cargo-fuzz) so `cfg(fuzzing)` is not flagged
//! by the `unexpected_cfgs` lint; the crate inherits the workspace lints, which
//! cannot be extended per crate.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(fuzzing)");
}
