//! Why an engine could not be built.

use alloc::string::String;
use core::fmt;

/// Why the engine could not be built from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The manifest names no interface.
    NoInterface,
    /// An interface the HCA cannot serve (name, why).
    Interface(String, &'static str),
    /// A volume could not be opened or is not served by this build
    /// (name, why).
    Volume(String, String),
    /// More volumes than RNBD's table holds.
    TooManyVolumes,
    /// A volume's geometry cannot be announced over RNBD (name, why).
    Geometry(String, &'static str),
    /// The manifest limits do not make a valid RTRS configuration.
    Config(rtrs::server::ConfigError),
    /// The manifest limits need more than one HCA can hold (why).
    Capacity(String),
    /// The RTRS server could not listen.
    Listen(rtrs::server::StartError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoInterface => f.write_str("the manifest has no interface"),
            Self::Interface(name, why) => write!(f, "interface {name}: {why}"),
            Self::Volume(name, why) => write!(f, "volume {name}: {why}"),
            Self::TooManyVolumes => f.write_str("more volumes than RNBD can index"),
            Self::Geometry(name, why) => write!(f, "volume {name}: {why}"),
            Self::Config(e) => write!(f, "RTRS configuration: {e}"),
            Self::Capacity(why) => write!(f, "capacity: {why}"),
            Self::Listen(e) => write!(f, "listen: {e}"),
        }
    }
}

impl core::error::Error for BuildError {}
