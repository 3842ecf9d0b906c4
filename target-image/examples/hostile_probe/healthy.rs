//! The healthy Brick client: verified IO beside the attacks, its rate per
//! case against a baseline measured before the first case.

use rnbd::wire::AccessMode;
use rtrs::client::Event;

use crate::clients::Fabric;
use crate::wire::Wire;
use crate::Args;

/// The healthy client's index in [`Wire::clients`] (kept across cases).
pub const HEALTHY: usize = 0;
/// Concurrent IO streams (each owns 64 KiB of the volume).
const SLOTS: usize = 4;
/// IO sizes the streams pick from.
const SIZES: &[u32] = &[4096, 8192, 16384];
/// Run before the baseline is measured (connections warm, buffers mapped).
const WARM_UP_NS: u64 = 2_000_000_000;
/// How long the baseline is measured, in how many windows.
const BASELINE_NS: u64 = 6_000_000_000;
const BASELINE_WINDOWS: usize = 12;
/// The run's rate may not fall below this share of the baseline.
const FLOOR: f64 = 0.8;

/// Where the healthy client was at a case's start.
#[derive(Clone, Copy)]
pub struct Mark {
    at: u64,
    completed: u64,
}

/// The probe's verdict on the healthy client.
pub struct Verdict {
    pub ok: bool,
    pub report: String,
}

/// The healthy client's account.
pub struct Healthy {
    /// IOs per second before the first case.
    baseline: f64,
    /// IOs and nanoseconds over the cases.
    total_ios: u64,
    total_ns: u64,
    /// The slowest case: (name, IOs per second).
    worst: Option<(&'static str, f64)>,
    /// Trouble seen (errors, mismatches, path events).
    trouble: Vec<String>,
    /// Errors and events already reported.
    errors_seen: usize,
    events_seen: usize,
}

impl Healthy {
    /// Connects `PREFIX-healthy` at `--local`, opens `--healthy-volume`
    /// read-write, starts its verified IO and measures the baseline.
    pub fn start(wire: &mut Wire, args: &Args) -> Result<Self, String> {
        let c = wire.add_client_at(0);
        assert_eq!(c, HEALTHY);
        wire.keep = 1;
        let name = format!("{}-healthy", args.session_prefix);
        wire.connect(c, &name, 2)
            .map_err(|e| format!("session {name}: {e:?}"))?;
        let device = wire
            .open(c, 1, &args.healthy_volume, AccessMode::ReadWrite)
            .map_err(|e| format!("OPEN {}: errno {e}", args.healthy_volume))?;
        if device.nsectors * 512 < SLOTS as u64 * crate::clients::Workload::AREA {
            return Err(format!(
                "{} has {} sectors, the healthy client needs {} KiB",
                args.healthy_volume,
                device.nsectors,
                SLOTS as u64 * 64
            ));
        }
        // Its session coming up is no trouble; anything after is.
        wire.clients[c].events.clear();
        wire.start_workload(c, device, 0, SLOTS, SIZES);
        wire.run_for(WARM_UP_NS);
        // The median of short windows: one slow or fast window (a busy
        // neighbour on the host) does not set the bar.
        let mut windows = Vec::with_capacity(BASELINE_WINDOWS);
        for _ in 0..BASELINE_WINDOWS {
            let start = (wire.now(), wire.workload(c).completed);
            wire.run_for(BASELINE_NS / BASELINE_WINDOWS as u64);
            let ios = wire.workload(c).completed - start.1;
            windows.push(ios as f64 * 1e9 / (wire.now() - start.0) as f64);
        }
        let mut sorted = windows.clone();
        sorted.sort_by(f64::total_cmp);
        let baseline = sorted[sorted.len() / 2];
        let ios = wire.workload(c).completed;
        let shown: Vec<String> = windows.iter().map(|w| format!("{w:.0}")).collect();
        println!(
            "healthy client: session {name}, volume {}, baseline {baseline:.0} IO/s \
             (median of {} s windows: {})",
            args.healthy_volume,
            BASELINE_NS as f64 / 1e9 / BASELINE_WINDOWS as f64,
            shown.join(" ")
        );
        let mut healthy = Healthy {
            baseline,
            total_ios: 0,
            total_ns: 0,
            worst: None,
            trouble: Vec::new(),
            errors_seen: 0,
            events_seen: 0,
        };
        healthy.check(wire, "the baseline");
        if !healthy.trouble.is_empty() || ios == 0 {
            return Err(format!(
                "the healthy client before the first case: {ios} IOs, {}",
                healthy.trouble.join("; ")
            ));
        }
        Ok(healthy)
    }

    /// Where the healthy client is now.
    pub fn mark(&self, wire: &Wire) -> Mark {
        Mark {
            at: wire.now(),
            completed: wire.workload(HEALTHY).completed,
        }
    }

    /// Notes new trouble of the healthy client (`during` names when).
    fn check(&mut self, wire: &Wire, during: &str) -> bool {
        let node = &wire.clients[HEALTHY];
        let workload = wire.workload(HEALTHY);
        let before = self.trouble.len();
        if let Some(errors) = workload.errors.get(self.errors_seen..) {
            if !errors.is_empty() {
                self.trouble
                    .push(format!("IO errors during {during}: {errors:?}"));
            }
        }
        self.errors_seen = workload.errors.len();
        if workload.mismatches > 0 || workload.submit_failures > 0 {
            self.trouble.push(format!(
                "during {during}: {} read mismatches, {} refused submissions in all",
                workload.mismatches, workload.submit_failures
            ));
        }
        for event in node.events.iter().skip(self.events_seen) {
            if !matches!(event, Event::IoCompleted { .. }) {
                self.trouble.push(format!("during {during}: {event:?}"));
            }
        }
        self.events_seen = node.events.len();
        if !node.client.is_up() {
            self.trouble.push(format!("session down after {during}"));
        }
        self.trouble.len() == before
    }

    /// Accounts for case `name` (started at `mark`): prints its rate;
    /// `Err` with what went wrong if the healthy client saw trouble.
    pub fn after_case(
        &mut self,
        wire: &Wire,
        name: &'static str,
        mark: Mark,
    ) -> Result<(), String> {
        let ios = wire.workload(HEALTHY).completed - mark.completed;
        let ns = wire.now().saturating_sub(mark.at).max(1);
        self.total_ios += ios;
        self.total_ns += ns;
        let rate = ios as f64 * 1e9 / ns as f64;
        println!(
            "healthy client during {name}: {rate:.0} IO/s ({:.0} % of the baseline, {ios} IOs in {:.1} s)",
            100.0 * rate / self.baseline,
            ns as f64 / 1e9
        );
        if self.worst.is_none_or(|(_, worst)| rate < worst) {
            self.worst = Some((name, rate));
        }
        let before = self.trouble.len();
        if self.check(wire, name) {
            Ok(())
        } else {
            Err(self.trouble[before..].join("; "))
        }
    }

    /// Stops the IO (drained), closes the session; the verdict over the
    /// whole run.
    pub fn finish(&mut self, wire: &mut Wire) -> Verdict {
        wire.stop_workload(HEALTHY);
        self.check(wire, "the drain");
        let workload = wire.workload(HEALTHY);
        let (completed, checked) = (workload.completed, workload.reads_checked);
        wire.close_session(HEALTHY);
        let rate = self.total_ios as f64 * 1e9 / self.total_ns.max(1) as f64;
        let share = rate / self.baseline;
        let worst = self.worst.map_or(String::new(), |(name, worst)| {
            format!(
                ", slowest case {name} {worst:.0} IO/s ({:.0} %)",
                100.0 * worst / self.baseline
            )
        });
        let mut report = format!(
            "healthy client: baseline {:.0} IO/s, {rate:.0} IO/s over the cases ({:.0} %){worst}; \
             {completed} verified IOs ({checked} reads compared), {} troubles",
            self.baseline,
            100.0 * share,
            self.trouble.len()
        );
        let slow = self.total_ns > 0 && share < FLOOR;
        if slow {
            report += &format!(
                "\nhealthy client ... FAIL: its rate over the cases fell below {:.0} % of the baseline",
                FLOOR * 100.0
            );
        }
        for trouble in &self.trouble {
            report += &format!("\nhealthy client ... FAIL: {trouble}");
        }
        Verdict {
            ok: !slow && self.trouble.is_empty(),
            report,
        }
    }
}
