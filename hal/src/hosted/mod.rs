//! Hosted drivers: the HAL for a Brick engine running as a Linux process.
//!
//! The NIC is either a [`frame_link::FrameLink`] (QEMU's stream-netdev
//! framing, so a VM's NIC plugs straight in and the engine does ARP, IPv4
//! and UDP itself, as the image does) or a [`udp::UdpNic`] (a UDP socket on
//! port 4791; the host kernel does IP). [`link_spec::LinkSpec`] parses the
//! command-line form of either. All sockets are non-blocking; the loop
//! idles in [`wait::PollIdle`] on their file descriptors. Volumes on files or
//! block devices are [`file::FileDevice`]s, whose worker pool wakes the loop
//! through a descriptor of its own. [`signals`] turns SIGINT/SIGTERM,
//! SIGUSR1 and SIGHUP into flags the daemons' loops read.

#[allow(unsafe_code)]
pub mod arp_answer;
pub mod clock;
pub mod file;
pub mod frame_link;
pub mod link;
pub mod link_spec;
pub mod rng;
#[allow(unsafe_code)]
pub mod signals;
#[allow(unsafe_code)]
mod sys;
pub mod udp;
pub mod wait;

pub use arp_answer::ArpAnswerer;
pub use clock::MonotonicClock;
pub use file::{FileConfig, FileDevice};
pub use frame_link::{FrameEndpoint, FrameLink};
pub use link::{Link, Packet};
pub use link_spec::{LinkSpec, LinkSpecError};
pub use rng::{OsRng, PooledOsRng};
pub use udp::UdpNic;
pub use wait::{wait_readable, wait_ready, PollIdle};

use crate::NicError;

/// The NIC error for an OS error: its errno, or `LinkDown` without one.
fn os_error(error: &std::io::Error) -> NicError {
    error
        .raw_os_error()
        .map_or(NicError::LinkDown, NicError::Os)
}
