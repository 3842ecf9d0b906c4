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
//!
//! The descriptor tables are the `x86_64` crate's: a
//! `GlobalDescriptorTable` (64-bit code and data, loaded over the entry
//! code's boot GDT) and an `InterruptDescriptorTable` whose gates point at
//! the assembler stubs below (stable Rust has no `x86-interrupt` ABI, so
//! the stubs stay), both built once in a `spin::Once` and loaded from
//! there. `hlt` with interrupts enabled is the crate's `enable_and_hlt`.

#![allow(unsafe_code)]

use core::arch::global_asm;

use x86_64::instructions::segmentation::{Segment, CS, SS};
use x86_64::registers::control::Cr2;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::idt::{Entry, InterruptDescriptorTable};
use x86_64::VirtAddr;

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
    let cr2 = Cr2::read_raw();
    crate::serial::write_fmt_unlocked(format_args!(
        "\n[brick] FATAL: CPU exception {vector} (error code {:#x}) at rip {:#x}, cr2 {cr2:#x}\n",
        words[0], words[1]
    ));
    crate::port::exit(ExitCode::Failure)
}

/// The address of an assembler stub that handles a vector: only
/// [`exception_stub`] and [`irq_stub`] make one, so an IDT entry set from
/// it always points at a handler of this module.
#[derive(Clone, Copy)]
struct Stub(u64);

/// The stub of CPU exception `vector` (0-31).
fn exception_stub(vector: usize) -> Stub {
    // SAFETY: the table is filled by the assembler with the 32 stub
    // addresses and never written; reading a `u64` of it is a plain load.
    let table = unsafe { (&raw const brick_exception_table).read() };
    Stub(table[vector % 32])
}

/// The stub of legacy IRQ `irq` (0-15): master or slave EOI.
fn irq_stub(irq: u8) -> Stub {
    let handler: unsafe extern "C" fn() = if irq < 8 {
        brick_irq_master
    } else {
        brick_irq_slave
    };
    Stub(handler as usize as u64)
}

/// Points `entry` at `stub` (present, ring 0, interrupt gate: IF cleared
/// on entry, the current code segment).
fn install<F>(entry: &mut Entry<F>, stub: Stub) {
    // SAFETY: `stub` is the address of one of this module's assembler
    // handlers (the `Stub` constructors), which keep the frame shape of
    // every vector (a dummy error code where the CPU pushes none) and
    // never return into a wrong frame: exceptions exit, IRQs `iretq`.
    unsafe { entry.set_handler_addr(VirtAddr::new(stub.0)) };
}

/// The IDT, built once by [`init`].
static IDT: spin::Once<InterruptDescriptorTable> = spin::Once::new();

/// The runtime GDT (64-bit code, data), built once by [`init`]; the same
/// layout as the entry code's boot GDT.
static GDT: spin::Once<(GlobalDescriptorTable, SegmentSelector, SegmentSelector)> =
    spin::Once::new();

fn build_idt() -> InterruptDescriptorTable {
    let mut idt = InterruptDescriptorTable::new();
    install(&mut idt.divide_error, exception_stub(0));
    install(&mut idt.debug, exception_stub(1));
    install(&mut idt.non_maskable_interrupt, exception_stub(2));
    install(&mut idt.breakpoint, exception_stub(3));
    install(&mut idt.overflow, exception_stub(4));
    install(&mut idt.bound_range_exceeded, exception_stub(5));
    install(&mut idt.invalid_opcode, exception_stub(6));
    install(&mut idt.device_not_available, exception_stub(7));
    install(&mut idt.double_fault, exception_stub(8));
    install(&mut idt.invalid_tss, exception_stub(10));
    install(&mut idt.segment_not_present, exception_stub(11));
    install(&mut idt.stack_segment_fault, exception_stub(12));
    install(&mut idt.general_protection_fault, exception_stub(13));
    install(&mut idt.page_fault, exception_stub(14));
    install(&mut idt.x87_floating_point, exception_stub(16));
    install(&mut idt.alignment_check, exception_stub(17));
    install(&mut idt.machine_check, exception_stub(18));
    install(&mut idt.simd_floating_point, exception_stub(19));
    install(&mut idt.virtualization, exception_stub(20));
    install(&mut idt.cp_protection_exception, exception_stub(21));
    install(&mut idt.hv_injection_exception, exception_stub(28));
    install(&mut idt.vmm_communication_exception, exception_stub(29));
    install(&mut idt.security_exception, exception_stub(30));
    for irq in 0..16u8 {
        install(&mut idt[IRQ_BASE + irq], irq_stub(irq));
    }
    idt
}

/// Loads the runtime GDT and the IDT (exceptions, IRQ 0-15), remaps the
/// PIC to vectors 0x20-0x2f with only IRQ 0 unmasked, and stops the PIT.
/// Interrupts stay disabled except inside [`PitIdle::idle_until`].
pub fn init() {
    let (gdt, code, data) = GDT.call_once(|| {
        let mut gdt = GlobalDescriptorTable::new();
        let code = gdt.append(Descriptor::kernel_code_segment());
        let data = gdt.append(Descriptor::kernel_data_segment());
        (gdt, code, data)
    });
    gdt.load();
    // SAFETY: `code` is the 64-bit ring 0 code segment of the GDT just
    // loaded (a static: it outlives every use).
    unsafe { CS::set_reg(*code) };
    // SAFETY: `data` is its writable data segment.
    unsafe { SS::set_reg(*data) };
    // Every vector the image can raise has a gate: the exceptions and
    // 0x20-0x2f (the PIC is remapped below and masked but for IRQ 0 and
    // the lines `unmask_irq` opens later).
    IDT.call_once(build_idt).load();

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
        // The IDT and PIC are set up (`init`); `sti` takes effect after
        // `hlt` starts, so a pending IRQ (the PIT's or an unmasked NIC
        // line) wakes it; the handlers only acknowledge the PIC and return
        // with IF clear. `disable` restores the interrupts-off state (for
        // an IRQ-free wake, as after an NMI).
        x86_64::instructions::interrupts::enable_and_hlt();
        x86_64::instructions::interrupts::disable();
    }
}
