//! Once-a-second progress lines on stderr.
//!
//! On a terminal the line is redrawn in place (`\r`, padded over the old
//! one); otherwise (a pipe, a log file, a test) each report is its own
//! line, so logs stay readable. Results go to stdout, progress never does.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often a line is printed.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Prints a line at most once per [`INTERVAL`].
pub struct Progress {
    start: Instant,
    next: Instant,
    tty: bool,
    /// Width of the last line drawn in place (to blank its remains).
    drawn: usize,
}

impl Progress {
    /// Starts the clock; the first line is due after one interval.
    pub fn new() -> Self {
        let start = Instant::now();
        Self {
            start,
            next: start + INTERVAL,
            tty: std::io::stderr().is_terminal(),
            drawn: 0,
        }
    }

    /// When the next line is due.
    pub fn due_at(&self) -> Instant {
        self.next
    }

    /// If a line is due, builds it with `line(elapsed)` and prints it.
    pub fn tick(&mut self, line: impl FnOnce(Duration) -> String) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        // Skip missed ticks rather than printing a burst.
        while self.next <= now {
            self.next += INTERVAL;
        }
        let text = line(now - self.start);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let pad = self.drawn.saturating_sub(text.len());
            let _ = write!(err, "\r{text}{:pad$}", "");
            self.drawn = text.len();
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }

    /// Ends an in-place line so what follows starts on a fresh one.
    pub fn finish(&mut self) {
        if self.tty && self.drawn > 0 {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err);
            self.drawn = 0;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
