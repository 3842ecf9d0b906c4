//! The hosted loop of the rping tool: one `Hca` on one `hal` NIC.
//!
//! Receives a bounded burst of frames, polls the HCA (timers, CM, QPs) into
//! the NIC, lets the rping session react, and when nothing happened blocks on
//! the link's descriptor until it is readable or the HCA's next deadline
//! (`hal::hosted::wait_readable`): it never spins. ICMP echo requests to our
//! address are answered here (the HCA ignores ICMP), so a peer's `ping` can
//! wait for the tool to come up.

#![allow(dead_code)] // the example and the test use different parts

use std::os::fd::RawFd;
use std::time::Duration;

use hal::hosted::{wait_readable, FrameLink, MonotonicClock};
use hal::{Clock, Nic, NicError, Rng};
use roce::hca::{Hca, HcaConfig};
use verbs::KeySource;

/// Frames taken from the link per loop iteration.
pub const RX_BURST: usize = 32;

/// The tool's HCA: 16 regions, 2 QPs, 256 completions.
pub type RpingHca<K> = Hca<Vec<u8>, K, 16, 2, 256>;

/// Registered memory of the tool's HCA.
pub const ARENA_LEN: usize = 1 << 20;

/// A `hal` random source as the HCA's key source.
pub struct RngKeys<R>(pub R);

impl<R: Rng> KeySource for RngKeys<R> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

/// A boxed HCA with our addresses.
pub fn new_hca<K: KeySource>(keys: K, mac: [u8; 6], ip: [u8; 4]) -> Box<RpingHca<K>> {
    Box::new(Hca::new(vec![0u8; ARENA_LEN], keys, HcaConfig { mac, ip }))
}

/// Sends one HCA frame (headers + payload pieces + trailer) on `nic`.
/// Transmit errors are drops: the transport and CM retransmit.
fn transmit<N: Nic>(nic: &mut N, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
    let mut pieces: [&[u8]; 8] = [&[]; 8];
    let mut count = 0;
    for piece in payload.iter().copied().chain([trailer]) {
        if piece.is_empty() {
            continue;
        }
        if count == pieces.len() {
            return; // more pieces than any HCA frame has
        }
        pieces[count] = piece;
        count += 1;
    }
    let _ = nic.transmit(headers, &pieces[..count]);
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], chunk.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The echo reply to `frame` if it is an ICMP echo request to `ip` (no IP
/// options, not fragmented, valid lengths); `None` for anything else.
pub fn icmp_echo_reply(frame: &[u8], ip: [u8; 4]) -> Option<Vec<u8>> {
    let ip_header = frame.get(14..34)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip_header[0] != 0x45 || ip_header[9] != 1 {
        return None;
    }
    if ip_header[16..20] != ip || ip_header[6] & 0x3f != 0 || ip_header[7] != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip_header[2], ip_header[3]]));
    let icmp = frame.get(34..14 + total)?;
    if total < 28 || icmp[0] != 8 || icmp[1] != 0 {
        return None;
    }
    let mut reply = frame[..14 + total].to_vec();
    reply.copy_within(6..12, 0);
    reply[6..12].copy_from_slice(&frame[0..6]);
    reply[20..22].fill(0); // no DF, as Linux answers
    reply[22] = 64; // TTL
    reply[26..30].copy_from_slice(&ip);
    reply[30..34].copy_from_slice(&ip_header[12..16]);
    reply[24..26].fill(0);
    let ip_sum = checksum(&reply[14..34]);
    reply[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    reply[34] = 0; // echo reply
    reply[36..38].fill(0);
    let icmp_sum = checksum(&reply[34..]);
    reply[36..38].copy_from_slice(&icmp_sum.to_be_bytes());
    Some(reply)
}

/// Runs `step` (the rping session) against `hca` on `link` until it returns
/// `Some`, or `deadline` (ns on the monotonic clock) passes.
///
/// # Errors
/// A message if the link failed or the deadline passed.
pub fn run<K: KeySource, T>(
    hca: &mut RpingHca<K>,
    link: &mut FrameLink,
    deadline: u64,
    mut step: impl FnMut(&mut RpingHca<K>) -> Option<T>,
) -> Result<T, String> {
    let clock = MonotonicClock::new();
    let ip = hca.config().ip;
    loop {
        let now = clock.now();
        if now >= deadline {
            return Err("timed out".into());
        }
        let mut busy = false;
        for _ in 0..RX_BURST {
            let received = link.receive(|frame| {
                let reply = icmp_echo_reply(frame, ip);
                if reply.is_none() {
                    hca.receive(now, frame);
                }
                reply
            });
            match received {
                Ok(Some(reply)) => {
                    busy = true;
                    if let Some(reply) = reply {
                        let _ = link.transmit(&reply, &[]);
                    }
                }
                Ok(None) => break,
                Err(NicError::LinkDown) => {
                    // A listening link whose peer left, or not there yet.
                    break;
                }
                Err(error) => return Err(format!("link receive: {error}")),
            }
        }
        busy |=
            hca.poll(now, &mut |headers: &[u8],
                                payload: &[&[u8]],
                                trailer: &[u8]| {
                transmit(link, headers, payload, trailer)
            });
        if let Some(result) = step(hca) {
            // Let the last frames (DREP, ACKs) out before returning.
            let _ = hca.poll(clock.now(), &mut |h: &[u8], p: &[&[u8]], t: &[u8]| {
                transmit(link, h, p, t)
            });
            let _ = link.flush();
            return Ok(result);
        }
        if link.has_pending_output() {
            let _ = link.flush();
        }
        if busy {
            continue;
        }
        let now = clock.now();
        let wake = hca.poll_at(now).map_or(deadline, |at| at.min(deadline));
        if wake <= now {
            continue;
        }
        let fds: Vec<RawFd> = link.raw_fd().into_iter().collect();
        if fds.is_empty() {
            std::thread::sleep(Duration::from_nanos((wake - now).min(10_000_000)));
        } else {
            wait_readable(&fds, Some(wake)).map_err(|e| format!("poll: {e}"))?;
        }
    }
}
