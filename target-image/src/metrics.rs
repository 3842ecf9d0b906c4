//! The engine's metrics in the Prometheus text exposition format 0.0.4
//! (docs/ADMIN.md): per volume, session, path and interface, refusals by
//! reason. [`Engine::write_metrics`] renders into any `fmt::Write`; the
//! hosted admin plane gives it a [`FixedText`], a buffer allocated once
//! that never grows, so rendering allocates nothing.

use alloc::vec::Vec;
use core::fmt::{self, Write};

use hal::block::BlockDevice;
use rnbd::server::Error as RnbdError;

use crate::port::Port;
use crate::{Chunk, Engine, LATENCY_BOUNDS_NS};

/// Text into a buffer of fixed capacity: a write that does not fit fails
/// (`fmt::Error`) and marks the text overflowed; the buffer never grows.
pub struct FixedText {
    buf: Vec<u8>,
    overflowed: bool,
}

impl FixedText {
    /// An empty text of `capacity` bytes (allocated here, once).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
            overflowed: false,
        }
    }

    /// Empties the text (the capacity stays).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.overflowed = false;
    }

    /// The text written.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Whether a write did not fit since the last [`clear`](Self::clear).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The fixed capacity.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

impl Write for FixedText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.buf.capacity() - self.buf.len() < s.len() {
            self.overflowed = true;
            return Err(fmt::Error);
        }
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// What a thin volume adds to its metrics (the hosted target reads it
/// from its pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThinGauges {
    /// Extents the volume has allocated.
    pub allocated_extents: u64,
    /// Extents of its pool.
    pub pool_extents: u64,
    /// Free extents of its pool.
    pub pool_free_extents: u64,
    /// Writes its pool refused with ENOSPC (all its volumes).
    pub pool_enospc: u64,
}

/// RNBD requests the engine refused, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// The access list refused an OPEN.
    pub access_denied: u64,
    /// An OPEN or IO named no volume or device.
    pub no_such_volume: u64,
    /// A write to a read-only mapping, or an upgrade or writer limit.
    pub read_only: u64,
    /// Malformed or out-of-range requests, failed IO, the rest.
    pub invalid: u64,
}

impl Refusals {
    /// Counts one refusal.
    pub(crate) fn count(&mut self, error: &RnbdError) {
        let counter = match error {
            RnbdError::AccessDenied => &mut self.access_denied,
            RnbdError::NoSuchVolume | RnbdError::UnknownDevice => &mut self.no_such_volume,
            RnbdError::ReadOnly | RnbdError::ModeUpgrade | RnbdError::WriterLimit => {
                &mut self.read_only
            }
            _ => &mut self.invalid,
        };
        *counter += 1;
    }
}

/// A label value, escaped as the exposition format asks (`\\`, `\"`,
/// `\n`): session names come from the network.
pub(crate) struct Label<'a>(pub(crate) &'a str);

impl fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Nanoseconds as seconds (`0.00001`, `2.5`).
struct Seconds(u64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 1_000_000_000, self.0 % 1_000_000_000);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let mut digits = 9;
        let mut frac = frac;
        while frac % 10 == 0 {
            frac /= 10;
            digits -= 1;
        }
        write!(f, "{whole}.{frac:0digits$}")
    }
}

/// A metric family: name, help and how to read each series' value.
type Family<'a, F> = (&'a str, &'a str, F);

/// Reads one thin gauge.
type ThinGauge = fn(&ThinGauges) -> u64;

/// `# HELP` and `# TYPE` of one metric family.
pub(crate) fn family(out: &mut dyn Write, name: &str, kind: &str, help: &str) -> fmt::Result {
    writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}")
}

impl<P: Port, D: BlockDevice<Chunk>> Engine<'_, P, D> {
    /// Writes every metric in the Prometheus text format 0.0.4 to `out`;
    /// `thin(device)` gives a thin volume's gauges (`None`: not thin).
    /// Allocates nothing itself.
    ///
    /// # Errors
    /// `out`'s (a [`FixedText`] that is full).
    pub fn write_metrics(
        &self,
        out: &mut dyn Write,
        thin: &dyn Fn(&D) -> Option<ThinGauges>,
    ) -> fmt::Result {
        self.write_volume_metrics(out, thin)?;
        self.write_session_metrics(out)?;
        self.write_interface_metrics(out)?;
        self.write_refusals(out)
    }

    fn write_volume_metrics(
        &self,
        out: &mut dyn Write,
        thin: &dyn Fn(&D) -> Option<ThinGauges>,
    ) -> fmt::Result {
        let rnbd = |i: usize| self.rnbd.volume_stats(self.volumes[i].info.id).io;
        let counters: [Family<'_, &dyn Fn(usize) -> u64>; 8] = [
            ("brick_volume_reads_total", "Read requests served.", &|i| {
                rnbd(i).reads
            }),
            (
                "brick_volume_writes_total",
                "Write requests served.",
                &|i| rnbd(i).writes,
            ),
            ("brick_volume_read_bytes_total", "Bytes read.", &|i| {
                rnbd(i).read_bytes
            }),
            ("brick_volume_written_bytes_total", "Bytes written.", &|i| {
                rnbd(i).write_bytes
            }),
            (
                "brick_volume_flushes_total",
                "Flush requests served.",
                &|i| rnbd(i).flushes,
            ),
            (
                "brick_volume_discards_total",
                "Discard and write-zeroes requests served.",
                &|i| rnbd(i).discards + rnbd(i).write_zeroes,
            ),
            (
                "brick_volume_errors_total",
                "Requests failed (RNBD) or refused and failed by the device.",
                &|i| rnbd(i).failed.max(self.volumes[i].counters.device_errors),
            ),
            (
                "brick_volume_parked_total",
                "Requests that waited for room in the device queue.",
                &|i| self.volumes[i].counters.parked,
            ),
        ];
        for (name, help, value) in counters {
            family(out, name, "counter", help)?;
            for (i, v) in self.volumes.iter().enumerate() {
                writeln!(out, "{name}{{volume=\"{}\"}} {}", Label(&v.name), value(i))?;
            }
        }
        family(
            out,
            "brick_volume_in_flight",
            "gauge",
            "Requests held by the device or parked.",
        )?;
        for v in &self.volumes {
            let held = v.device.in_flight() + v.parked.len();
            writeln!(
                out,
                "brick_volume_in_flight{{volume=\"{}\"}} {held}",
                Label(&v.name)
            )?;
        }
        let name = "brick_volume_latency_seconds";
        family(
            out,
            name,
            "histogram",
            "Block requests from receipt to answer.",
        )?;
        for v in &self.volumes {
            let label = Label(&v.name);
            let mut cumulative = 0;
            for (count, bound) in v.latency.counts.iter().zip(LATENCY_BOUNDS_NS) {
                cumulative += count;
                let le = Seconds(bound);
                writeln!(
                    out,
                    "{name}_bucket{{volume=\"{label}\",le=\"{le}\"}} {cumulative}"
                )?;
            }
            let total = v.latency.count();
            writeln!(
                out,
                "{name}_bucket{{volume=\"{label}\",le=\"+Inf\"}} {total}"
            )?;
            writeln!(
                out,
                "{name}_sum{{volume=\"{label}\"}} {}",
                Seconds(v.latency.sum_ns)
            )?;
            writeln!(out, "{name}_count{{volume=\"{label}\"}} {total}")?;
        }
        let gauges: [Family<'_, ThinGauge>; 4] = [
            (
                "brick_volume_allocated_extents",
                "Extents a thin volume has allocated.",
                |g| g.allocated_extents,
            ),
            (
                "brick_volume_pool_extents",
                "Extents of a thin volume's pool.",
                |g| g.pool_extents,
            ),
            (
                "brick_volume_pool_free_extents",
                "Free extents of a thin volume's pool.",
                |g| g.pool_free_extents,
            ),
            (
                "brick_volume_pool_enospc_total",
                "Writes a thin volume's pool refused for want of an extent.",
                |g| g.pool_enospc,
            ),
        ];
        for (name, help, value) in gauges {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            family(out, name, kind, help)?;
            for v in &self.volumes {
                if let Some(g) = thin(&v.device) {
                    writeln!(out, "{name}{{volume=\"{}\"}} {}", Label(&v.name), value(&g))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::{String, ToString};

    #[test]
    fn label_values_are_escaped_and_seconds_are_exact() {
        assert_eq!(
            Label("a\"b\\c\nd").to_string(),
            "a\\\"b\\\\c\\nd",
            "quote, backslash and newline escaped"
        );
        assert_eq!(Label("plain-1.x").to_string(), "plain-1.x");
        for (ns, text) in [
            (10_000, "0.00001"),
            (2_500_000, "0.0025"),
            (1_000_000_000, "1"),
            (1_500_000_001, "1.500000001"),
            (0, "0"),
        ] {
            assert_eq!(Seconds(ns).to_string(), text);
        }
    }

    #[test]
    fn fixed_text_refuses_what_does_not_fit_and_never_grows() {
        let mut text = FixedText::with_capacity(8);
        assert!(text.write_str("12345").is_ok());
        assert!(text.write_str("6789").is_err());
        assert!(text.overflowed());
        assert_eq!((text.as_bytes(), text.capacity()), (&b"12345"[..], 8));
        text.clear();
        assert!(!text.overflowed() && text.as_bytes().is_empty());
        let mut out = String::new();
        family(&mut out, "brick_x_total", "counter", "X.").unwrap();
        assert_eq!(
            out,
            "# HELP brick_x_total X.\n# TYPE brick_x_total counter\n"
        );
    }
}
