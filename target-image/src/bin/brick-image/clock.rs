//! The TSC clock, calibrated against the PIT.
//!
//! [`calibrate`] gates PIT channel 2 (the speaker channel, whose output is
//! readable in port 0x61 bit 5) for [`CALIBRATION_MS`] in mode 0 and counts
//! TSC ticks until its output rises, three times, keeping the smallest count
//! (a late look at the output only adds ticks). Linux's `pit_calibrate_tsc`
//! does the same. Under QEMU TCG both the TSC and the PIT follow host time.
//! [`Tsc`] then implements [`hal::Clock`]: nanoseconds since the PVH entry.

#![allow(unsafe_code)]

use core::arch::asm;

use crate::interrupts::PIT_HZ;
use crate::port::Port;

/// Length of one calibration run.
pub const CALIBRATION_MS: u64 = 10;

/// Reads the time-stamp counter.
pub fn rdtsc() -> u64 {
    let low: u32;
    let high: u32;
    // SAFETY: `rdtsc` only reads the counter (CR4.TSD is clear: ring 0).
    unsafe {
        asm!("rdtsc", out("eax") low, out("edx") high, options(nomem, nostack, preserves_flags))
    };
    (u64::from(high) << 32) | u64::from(low)
}

fn one_run() -> u64 {
    let count = (PIT_HZ * CALIBRATION_MS / 1000) as u16;
    let [low, high] = count.to_le_bytes();
    // SAFETY: the image owns the PIT's channel 2 and port 0x61 (speaker
    // gate): gate on, speaker off.
    let gate = unsafe { Port::<u8>::new(0x61).read() };
    // SAFETY: as above.
    unsafe { Port::<u8>::new(0x61).write((gate & !0x02) | 0x01) };
    // SAFETY: as above: channel 2, low/high byte, mode 0, binary.
    unsafe { Port::<u8>::new(0x43).write(0xb0) };
    // SAFETY: as above.
    unsafe { Port::<u8>::new(0x42).write(low) };
    // SAFETY: as above.
    unsafe { Port::<u8>::new(0x42).write(high) };
    let start = rdtsc();
    // SAFETY: reading port 0x61 has no side effect.
    while unsafe { Port::<u8>::new(0x61).read() } & 0x20 == 0 {
        core::hint::spin_loop();
    }
    rdtsc() - start
}

/// TSC ticks per second, measured against the PIT.
pub fn calibrate() -> u64 {
    let ticks = (0..3).map(|_| one_run()).min().unwrap_or(0);
    ticks * 1000 / CALIBRATION_MS
}

/// The TSC as a monotonic nanosecond clock since the PVH entry.
#[derive(Clone, Copy, Debug)]
pub struct Tsc {
    /// Ticks per second.
    pub hz: u64,
    /// The TSC at time zero.
    pub base: u64,
}

impl Tsc {
    /// Nanoseconds of `ticks` TSC ticks.
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        (u128::from(ticks) * 1_000_000_000 / u128::from(self.hz.max(1))) as u64
    }
}

impl hal::Clock for Tsc {
    fn now(&self) -> u64 {
        self.ticks_to_ns(rdtsc().saturating_sub(self.base))
    }
}
