//! The console: COM1 (16550 UART at port 0x3f8), 115200 8N1, polled.
//!
//! `log!` formats a line to it. Output is written under a spin
//! lock; interrupt handlers never log, so the lock cannot deadlock.

#![allow(unsafe_code)]

use core::fmt::{self, Write};

use crate::port::Port;
use spin::Mutex;

const COM1: u16 = 0x3f8;
/// Line status register: transmit holding register empty.
const LSR_THR_EMPTY: u8 = 1 << 5;

struct Com1;

static CONSOLE: Mutex<Com1> = Mutex::new(Com1);

/// Programs COM1 (115200 baud, 8N1, FIFOs on, its interrupts off).
pub fn init() {
    let setup: [(u16, u8); 6] = [
        (1, 0x00), // interrupts off
        (3, 0x80), // DLAB on
        (0, 0x01), // divisor 1 = 115200 baud
        (1, 0x00),
        (3, 0x03), // 8N1, DLAB off
        (2, 0xc7), // FIFOs on and cleared
    ];
    for (offset, value) in setup {
        // SAFETY: COM1 is the image's console and nothing else drives it.
        unsafe { Port::<u8>::new(COM1 + offset).write(value) };
    }
}

impl Com1 {
    fn put(&mut self, byte: u8) {
        // SAFETY: reading COM1's line status has no side effect.
        while unsafe { Port::<u8>::new(COM1 + 5).read() } & LSR_THR_EMPTY == 0 {
            core::hint::spin_loop();
        }
        // SAFETY: COM1 is the image's console; the transmitter is empty.
        unsafe { Port::<u8>::new(COM1).write(byte) };
    }
}

impl Write for Com1 {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for byte in text.bytes() {
            if byte == b'\n' {
                self.put(b'\r');
            }
            self.put(byte);
        }
        Ok(())
    }
}

/// Writes formatted text to the console (used by `log!`).
pub fn write_fmt(args: fmt::Arguments<'_>) {
    let _ = CONSOLE.lock().write_fmt(args);
}

/// Writes formatted text even if the console lock is held (the panic and
/// exception paths: the holder will never run again).
pub fn write_fmt_unlocked(args: fmt::Arguments<'_>) {
    let _ = Com1.write_fmt(args);
}
