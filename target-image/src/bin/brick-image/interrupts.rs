//! Interrupts, only to wake the idle CPU: IDT, 8259 PIC, PIT one-shot.
//!
//! # Idle design
//!
//! The run loop polls while it has work; when idle it calls
//! [`PitIdle::idle_until`], which arms the PIT (channel 0, mode 0: one
//! interrupt when the count reaches zero) for the time to the deadline
//! (at most [`MAX_ONE_SHOT_NS`], about 55 ms; a longer wait is several
//! sleeps), then runs `sti; hlt; cli`. `sti` takes effect after the next
//! instruction, so an interrupt that is already pending wakes the `hlt`
//! instead of being lost. Interrupts are otherwise off, so the engine
//! never runs inside a handler and needs no locking for it.
//!
//! Besides IRQ 0, the serve loop unmasks the virtio-net NICs' INTx lines
//! ([`unmask_irq`]: the PCI Interrupt Line the firmware routed, IRQ 10 or
//! 11 on QEMU's `pc` machine, level-triggered through the PIIX ELCR), so a
//! received frame ends the `hlt` too. The handlers do no work: they send
//! the PIC its EOI and return to the interrupted `hlt` **with IF clear**
//! (they clear it in the saved RFLAGS). A level-triggered line stays
//! asserted until the loop reads the device's ISR register; returning
//! with interrupts still enabled would take the same interrupt again and
//! again before the `cli` after `hlt` could run. Since interrupts are
//! only ever enabled around that `hlt`, returning with IF clear is
//! exactly what the `cli` would have done.
//!
//! Why PIT + 8259 and not the LAPIC timer, and INTx rather than MSI-X:
//! both exist on every QEMU machine; the PIT needs no calibration of its
//! own (1.193182 MHz), no MMIO mapping and no MSR, and its 55 ms ceiling
//! only costs one wake-up per 55 ms of idleness (about 18 per second;
//! the host CPU stays near zero). INTx through the same PIC needs no
//! LAPIC, no MSI-X table and no per-vector EOI; it costs one ISR read per
//! idle period.
//!
//! CPU exceptions (vectors 0–31) print the vector, error code and faulting
//! RIP to the console and exit QEMU with a failure status.

#![allow(unsafe_code)]

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;

use crate::entry::CODE_SELECTOR;
use crate::port::{ExitCode, Port};

/// Longest one-shot the 16-bit PIT counter holds (65535 / 1.193182 MHz).
pub const MAX_ONE_SHOT_NS: u64 = 54_925_000;
/// PIT input clock, Hz.
pub const PIT_HZ: u64 = 1_193_182;
/// Vector of IRQ 0 after the PIC remap.
const IRQ_BASE: u8 = 0x20;

global_asm!(
    r#"
    .pushsection .text.brick_interrupts, "ax", @progbits
    .irp vector, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31
    .balign 16
brick_exception_\vector:
    push $0                     /* no error code: keep the frame shape */
    push $\vector
    jmp brick_exception_common
    .endr
    .irp vector, 8,10,11,12,13,14,17,21,29,30
    .balign 16
brick_exception_\vector:
    push $\vector               /* the CPU pushed an error code */
    jmp brick_exception_common
    .endr
brick_exception_common:
    mov (%rsp), %rdi            /* vector */
    lea 8(%rsp), %rsi           /* [error code, rip, cs, rflags, rsp, ss] */
    and $-16, %rsp
    call brick_exception
    ud2

    /* The IRQ handlers return with IF clear in the saved RFLAGS (bit 9,
       at 16(%rsp) once %rax is popped): see the module docs. */
    .balign 16
    .global brick_irq_master
brick_irq_master:               /* IRQ 0-7: EOI to the master PIC */
    push %rax
    mov $0x20, %al
    out %al, $0x20
    pop %rax
    andq $~0x200, 16(%rsp)
    iretq

    .balign 16
    .global brick_irq_slave
brick_irq_slave:                /* IRQ 8-15: EOI to both PICs */
    push %rax
    mov $0x20, %al
    out %al, $0xa0
    out %al, $0x20
    pop %rax
    andq $~0x200, 16(%rsp)
    iretq
    .popsection

    .pushsection .rodata.brick_interrupts, "a", @progbits
    .balign 8
    .global brick_exception_table
brick_exception_table:
    .irp vector, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad brick_exception_\vector
    .endr
    .popsection
    "#,
    options(att_syntax)
);

extern "C" {
    static brick_exception_table: [u64; 32];
    fn brick_irq_master();
    fn brick_irq_slave();
}

/// Called by the exception stubs; prints and exits.
#[no_mangle]
extern "C" fn brick_exception(vector: u64, frame: *const u64) -> ! {
    let mut words = [0u64; 3];
    for (i, word) in words.iter_mut().enumerate() {
        // SAFETY: the stub passes a pointer to the CPU's exception frame on
        // the current stack (error code, RIP, CS, ... : at least 5 words).
        *word = unsafe { frame.wrapping_add(i).read_volatile() };
    }
    let cr2: u64;
    // SAFETY: reading CR2 has no side effect.
    unsafe { asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags)) };
    crate::serial::write_fmt_unlocked(format_args!(
        "\n[brick] FATAL: CPU exception {vector} (error code {:#x}) at rip {:#x}, cr2 {cr2:#x}\n",
        words[0], words[1]
    ));
    crate::port::exit(ExitCode::Failure)
}

/// The interrupt descriptor table: 256 16-byte gates.
#[repr(C, align(16))]
struct Idt(UnsafeCell<[u64; 512]>);

// SAFETY: written only by `init`, on the one CPU, before `lidt` and with
// interrupts off; afterwards only the CPU reads it.
unsafe impl Sync for Idt {}

static IDT: Idt = Idt(UnsafeCell::new([0; 512]));

fn gate(handler: u64) -> [u64; 2] {
    let low = (handler & 0xffff)
        | (u64::from(CODE_SELECTOR) << 16)
        | (0x8e << 40) // present, DPL 0, 64-bit interrupt gate
        | ((handler >> 16) & 0xffff) << 48;
    [low, handler >> 32]
}

/// Installs the IDT (exceptions, IRQ 0-15), remaps the PIC to vectors
/// 0x20-0x2f with only IRQ 0 unmasked, and stops the PIT. Interrupts stay
/// disabled (`cli`) except inside [`PitIdle::idle_until`].
pub fn init() {
    // SAFETY: the table is filled by the assembler with the 32 stub
    // addresses and never written.
    let exceptions = unsafe { (&raw const brick_exception_table).read() };
    let master = brick_irq_master as *const () as u64;
    let slave = brick_irq_slave as *const () as u64;
    // SAFETY: see `Idt`: only this function writes the table, once, on the
    // one CPU with interrupts off.
    let table = unsafe { &mut *IDT.0.get() };
    for (vector, handler) in exceptions.iter().enumerate() {
        table[2 * vector..2 * vector + 2].copy_from_slice(&gate(*handler));
    }
    for irq in 0..16usize {
        let vector = usize::from(IRQ_BASE) + irq;
        let handler = if irq < 8 { master } else { slave };
        table[2 * vector..2 * vector + 2].copy_from_slice(&gate(handler));
    }
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    let pointer = Pointer {
        limit: (256 * 16 - 1) as u16,
        base: IDT.0.get() as u64,
    };
    // SAFETY: the IDT is a static with valid gates for vectors 0-47 (the
    // others are not present and are never raised: the PIC is remapped
    // below and masked but for IRQ 0 and the lines `unmask_irq` opens
    // later, all in 0x20-0x2f); `lidt` copies the pointer.
    unsafe {
        asm!("lidt [{}]", in(reg) &raw const pointer, options(readonly, nostack, preserves_flags))
    };

    let pic: [(u16, u8); 10] = [
        (0x20, 0x11), // ICW1: init, ICW4 follows
        (0xa0, 0x11),
        (0x21, IRQ_BASE), // ICW2: vector base
        (0xa1, IRQ_BASE + 8),
        (0x21, 0x04), // ICW3: slave on IRQ 2
        (0xa1, 0x02),
        (0x21, 0x01), // ICW4: 8086 mode
        (0xa1, 0x01),
        (0x21, 0xfe), // mask all but IRQ 0
        (0xa1, 0xff),
    ];
    for (port, value) in pic {
        // SAFETY: the image owns the legacy PICs; interrupts are off.
        unsafe { Port::<u8>::new(port).write(value) };
    }
    // Stop the PIT's periodic (BIOS) mode: one-shot with the longest count;
    // the one interrupt it may raise is harmless.
    arm_one_shot(0xffff);
}

/// The PIC input the slave PIC cascades into (never a device's line).
const CASCADE_IRQ: u8 = 2;

/// Unmasks legacy interrupt `irq` (1-15 but the cascade, 2) on the 8259
/// PICs, and the cascade for a slave line (8-15), so that it wakes
/// [`PitIdle::idle_until`]'s `hlt`. Returns `false` (and changes nothing)
/// for an IRQ that cannot be a device's line. Call with interrupts off
/// (they always are outside the `hlt`).
pub fn unmask_irq(irq: u8) -> bool {
    if irq == 0 || irq == CASCADE_IRQ || irq >= 16 {
        return false;
    }
    if irq >= 8 {
        set_masked(irq - 8, 0xa1, false);
        set_masked(CASCADE_IRQ, 0x21, false);
    } else {
        set_masked(irq, 0x21, false);
    }
    true
}

/// Masks legacy interrupt `irq` again (1-15 but the cascade; others are
/// ignored). The cascade stays open (other slave lines may use it).
pub fn mask_irq(irq: u8) {
    match irq {
        0 | CASCADE_IRQ | 16.. => {}
        8.. => set_masked(irq - 8, 0xa1, true),
        _ => set_masked(irq, 0x21, true),
    }
}

/// Sets or clears bit `bit` of the interrupt mask register at `port`
/// (0x21 master, 0xa1 slave: OCW1).
fn set_masked(bit: u8, port: u16, masked: bool) {
    // SAFETY: the image owns the PICs (`init` programmed them); reading
    // OCW1 returns the mask register and has no side effect.
    let mask = unsafe { Port::<u8>::new(port).read() };
    let mask = if masked {
        mask | 1 << bit
    } else {
        mask & !(1 << bit)
    };
    // SAFETY: as above; every unmasked vector has a gate in the IDT
    // (`init` fills 0x20-0x2f), and interrupts are off (callers).
    unsafe { Port::<u8>::new(port).write(mask) };
}

fn arm_one_shot(count: u16) {
    let [low, high] = count.to_le_bytes();
    // SAFETY: the image owns PIT channel 0 (mode register 0x43, counter
    // 0x40): channel 0, low then high byte, mode 0 (interrupt on terminal
    // count), binary.
    unsafe { Port::<u8>::new(0x43).write(0x30) };
    // SAFETY: as above.
    unsafe { Port::<u8>::new(0x40).write(low) };
    // SAFETY: as above.
    unsafe { Port::<u8>::new(0x40).write(high) };
}

/// [`hal::Idle`] for the image: PIT one-shot + `hlt`.
pub struct PitIdle<C> {
    clock: C,
    /// `hlt`s executed (for the boot report).
    pub halts: u64,
}

impl<C: hal::Clock> PitIdle<C> {
    /// Idling against `clock`; [`init`] must have run.
    pub fn new(clock: C) -> Self {
        PitIdle { clock, halts: 0 }
    }

    /// The clock it idles against.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: hal::Clock> hal::Idle for PitIdle<C> {
    fn idle_until(&mut self, deadline: Option<u64>) {
        let wait = match deadline {
            Some(deadline) => deadline.saturating_sub(self.clock.now()),
            None => MAX_ONE_SHOT_NS,
        };
        if wait == 0 {
            return;
        }
        let ticks = (wait.min(MAX_ONE_SHOT_NS) * PIT_HZ).div_ceil(1_000_000_000);
        arm_one_shot(ticks.clamp(1, 0xffff) as u16);
        self.halts += 1;
        // SAFETY: the IDT and PIC are set up (`init`); `sti` takes effect
        // after `hlt` starts, so a pending IRQ (the PIT's or an unmasked
        // NIC line) wakes it; the handlers only acknowledge the PIC and
        // return with IF clear. `cli` restores the interrupts-off state
        // (for an IRQ-free wake, as after an NMI).
        unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) };
    }
}
