//! What the fuzz targets share: the engine of `engine_frames` (its small
//! manifest, its input format, the replay) so that `fuzz-seeds` records
//! inputs the target replays exactly, and a byte reader for the targets
//! whose inputs are operation scripts, and Brick's client driving the
//! engine (recording seeds, checking the engine still serves).
//!
//! Everything here uses the crates' public APIs only.

pub mod engine;
pub mod script;
pub mod session;
