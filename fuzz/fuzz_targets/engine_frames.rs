//! The whole engine (`target_image::Engine`, RAM volumes) fed a sequence
//! of Ethernet frames with delays (the format of `brick_fuzz::engine`).
//! Seeds: whole sessions of Brick's client recorded by `fuzz-seeds`, and
//! the client frames of the Linux captures in `tests/vectors`.
//!
//! Invariants: no panic; every RoCEv2 frame the engine sends parses; the
//! open sessions stay within the manifest's limit; the statistics render;
//! after `close_all` the engine lets go of everything within 60 s of fake
//! time; then a healthy session from another host connects, opens, writes
//! and reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    brick_fuzz::engine::replay_on_worker(input);
});
