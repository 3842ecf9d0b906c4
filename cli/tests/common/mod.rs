//! What the CLI's process tests share: a child's stderr, collected line by
//! line by a reader thread.

use std::io::{BufRead, BufReader};
use std::process::ChildStderr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The lines a child wrote to stderr so far.
pub struct ChildLog {
    text: Arc<Mutex<String>>,
}

impl ChildLog {
    /// Collects `stderr` from now on.
    pub fn collect(stderr: ChildStderr) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&text);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self { text }
    }

    /// Everything so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Whether the log shows `needle` within `within`: a line arrives
    /// through the reader thread, so it can follow what caused it (and a
    /// target notices a client's exit after the client has gone).
    pub fn shows(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.text().contains(needle) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}
