//! The PVH entry: from 32-bit protected mode to `brick_main` in long mode.
//!
//! QEMU (`-kernel`, PVH boot) loads the ELF and enters `pvh_start`, the
//! address in the `XEN_ELFNOTE_PHYS32_ENTRY` note (type 18; an 8-byte
//! address for a 64-bit ELF), in 32-bit protected mode, paging off,
//! interrupts off, `%ebx` = physical address of `hvm_start_info`. The code:
//!
//! 1. saves `%ebx`, zeroes `.bss` (page tables and stack live there);
//! 2. records the TSC (the start of "time in the image");
//! 3. identity-maps 0–4 GiB with 2 MiB pages: one PML4 entry, four PDPT
//!    entries, 2048 PD entries (no 1 GiB pages: the default CPU lacks them;
//!    every page is write-back cached, including MMIO holes, which is fine
//!    under QEMU TCG and must change for real hardware MMIO);
//! 4. enables PAE, SSE (OSFXSR/OSXMMEXCPT; the target is soft-float, so
//!    this is only for safety), EFER.LME, then paging + protection;
//! 5. loads a GDT (null, 64-bit code 0x08, data 0x10), far-jumps to 64-bit
//!    code, sets the segment registers and a 256 KiB stack, and calls
//!    `brick_main(start_info)`, which never returns.
//!
//! The ELF entry point (`e_entry`) is `brick_entry64`, the same start from
//! 64-bit long mode, for a loader that is already there: the image's UEFI
//! loader (`loader/`), which has exited boot services. `%rdi` = the
//! physical address (below 4 GiB) of a PVH `hvm_start_info` the loader
//! built; paging is on with the firmware's identity map, which must cover
//! the image, the start info and the current stack. The code zeroes
//! `.bss`, records the TSC, builds the same 0-4 GiB identity map, loads it
//! and the GDT, far-returns into 64-bit code with selector 0x08 and joins
//! the PVH path at `long_mode_entry`; nothing of the firmware's (page
//! tables, GDT, IDT, stack) is used after that.

#![allow(unsafe_code)]

/// Bytes of the boot stack.
pub const STACK_BYTES: usize = 256 * 1024;

core::arch::global_asm!(
    r#"
    .pushsection .note.Xen, "a", @note
    .balign 4
    .long 4                 /* namesz: "Xen\0" */
    .long 8                 /* descsz: a 64-bit entry address */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .balign 4
    .quad pvh_start
    .balign 4
    .popsection

    .pushsection .data.brick_boot, "aw", @progbits
    .balign 16
    .global brick_boot_tsc
brick_boot_tsc:
    .quad 0
boot_gdt:
    .quad 0
    .quad 0x00af9b000000ffff    /* 0x08: 64-bit code, present, accessed */
    .quad 0x00cf93000000ffff    /* 0x10: data, present, writable, accessed */
boot_gdt_end:
    .balign 8
boot_gdt_pointer:
    .word boot_gdt_end - boot_gdt - 1
    .quad boot_gdt
    .popsection

    .pushsection .bss.brick_boot, "aw", @nobits
    .balign 4096
boot_pml4:
    .skip 4096
boot_pdpt:
    .skip 4096
boot_pd:
    .skip 4 * 4096
    .balign 16
boot_stack_bottom:
    .skip {stack}
boot_stack_top:
    .popsection

    .pushsection .text.boot, "ax", @progbits
    .code32
    .global pvh_start
pvh_start:
    cli
    cld
    mov %ebx, %esi                  /* hvm_start_info, kept in %esi */

    mov $__bss_start, %edi          /* zero .bss */
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    rep stosb

    rdtsc
    mov %eax, brick_boot_tsc
    mov %edx, brick_boot_tsc + 4

    mov $boot_pd, %edi              /* PD: 2048 x 2 MiB, present|writable|PS */
    xor %ecx, %ecx
.Lfill_pd:
    mov %ecx, %eax
    shl $21, %eax
    or $0x83, %eax
    mov %eax, (%edi,%ecx,8)
    inc %ecx
    cmp $2048, %ecx
    jne .Lfill_pd

    mov $boot_pd, %eax              /* PDPT: four PDs */
    or $0x3, %eax
    mov %eax, boot_pdpt
    add $4096, %eax
    mov %eax, boot_pdpt + 8
    add $4096, %eax
    mov %eax, boot_pdpt + 16
    add $4096, %eax
    mov %eax, boot_pdpt + 24
    mov $boot_pdpt, %eax            /* PML4[0] */
    or $0x3, %eax
    mov %eax, boot_pml4
    mov $boot_pml4, %eax
    mov %eax, %cr3

    mov %cr4, %eax                  /* PAE | OSFXSR | OSXMMEXCPT */
    or $((1 << 5) | (1 << 9) | (1 << 10)), %eax
    mov %eax, %cr4

    mov $0xc0000080, %ecx           /* EFER.LME */
    rdmsr
    or $(1 << 8), %eax
    wrmsr

    mov %cr0, %eax                  /* PG | PE | MP, clear EM */
    or $((1 << 31) | (1 << 0) | (1 << 1)), %eax
    and $~(1 << 2), %eax
    mov %eax, %cr0

    lgdt boot_gdt_pointer
    ljmp $0x08, $long_mode_entry

    .code64
    .global brick_entry64
brick_entry64:                      /* %rdi = hvm_start_info (< 4 GiB) */
    cli
    cld
    mov %edi, %esi                  /* kept in %esi, as on the PVH path */

    mov $__bss_start, %edi          /* zero .bss (not the current stack) */
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    rep stosb

    rdtsc
    mov %eax, brick_boot_tsc
    mov %edx, brick_boot_tsc + 4

    mov $boot_pd, %edi              /* PD: 2048 x 2 MiB, present|writable|PS */
    xor %ecx, %ecx
.Lfill_pd64:
    mov %ecx, %eax
    shl $21, %eax
    or $0x83, %eax
    mov %eax, (%rdi,%rcx,8)
    inc %ecx
    cmp $2048, %ecx
    jne .Lfill_pd64
    mov $boot_pd, %eax              /* PDPT: four PDs */
    or $0x3, %eax
    mov %eax, boot_pdpt
    add $4096, %eax
    mov %eax, boot_pdpt + 8
    add $4096, %eax
    mov %eax, boot_pdpt + 16
    add $4096, %eax
    mov %eax, boot_pdpt + 24
    mov $boot_pdpt, %eax            /* PML4[0] */
    or $0x3, %eax
    mov %eax, boot_pml4
    mov $boot_pml4, %eax
    mov %rax, %cr3

    mov %cr4, %rax                  /* OSFXSR | OSXMMEXCPT (PAE is on) */
    or $((1 << 9) | (1 << 10)), %eax
    mov %rax, %cr4

    lgdt boot_gdt_pointer
    mov $boot_stack_top, %esp       /* a stack of our own for the far return */
    push $0x08
    mov $long_mode_entry, %eax
    push %rax
    lretq

long_mode_entry:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    xor %eax, %eax
    mov %ax, %fs
    mov %ax, %gs
    mov $boot_stack_top, %rsp
    xor %ebp, %ebp
    mov %esi, %edi                  /* brick_main(start_info) */
    call brick_main
.Lhalt_forever:
    cli
    hlt
    jmp .Lhalt_forever
    .popsection
    "#,
    stack = const STACK_BYTES,
    options(att_syntax)
);

extern "C" {
    /// The TSC when `pvh_start` ran (written once by the entry code).
    static brick_boot_tsc: u64;
    /// First byte the loader placed (linker script).
    static __image_start: u8;
    /// One past the image's `.bss` (linker script).
    static __image_end: u8;
}

/// The TSC value recorded at the PVH entry.
pub fn boot_tsc() -> u64 {
    // SAFETY: `brick_boot_tsc` is written once by the entry code before any
    // Rust runs and never again; reading a `u64` from `.data` is sound.
    unsafe { (&raw const brick_boot_tsc).read_volatile() }
}

/// The physical range `[start, end)` the image occupies (text to bss,
/// stack and page tables included); identity-mapped, so addresses are
/// physical.
pub fn image_range() -> (u64, u64) {
    // Only the symbols' addresses are taken, never their contents.
    let start = (&raw const __image_start) as u64;
    let end = (&raw const __image_end) as u64;
    (start, end)
}
