//! Halting when there is no work: `Idle`.
//!
//! The run loop spins while it has work and otherwise idles until its next
//! deadline or until input arrives (ARCHITECTURE.md §6): `hlt` with a timer and
//! NIC wake-up in the image, ppoll(2) on the link's file descriptors hosted.

/// Blocks the loop until a deadline or readiness.
pub trait Idle {
    /// Returns once `deadline` (on the [`Clock`](crate::Clock) scale) has
    /// passed or an event source is ready, whichever is first; `None` waits
    /// for an event only. May return early (a spurious wake-up): the caller
    /// polls everything again anyway.
    fn idle_until(&mut self, deadline: Option<u64>);
}

/// Whether the CPU runs under a hypervisor (CPUID.1:ECX bit 31, which
/// hypervisors set and bare metal leaves clear). `false` off x86_64.
pub fn under_hypervisor() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        core::arch::x86_64::__cpuid(1).ecx & (1 << 31) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How long a run loop keeps polling after its last work before it idles:
/// `bare_metal` when the loop owns its cores, 0 under a hypervisor.
///
/// A vCPU is a host thread that shares cores with its neighbours, and
/// inside a VM the kernel's own RDMA work (rxe's tasks, softirqs) shares
/// the vCPU with the loop: there, spinning takes the time the work it waits
/// for needs. Measured on the 2-core judge bed (`cargo xtask bench-vm`,
/// one run each): the image's 2 ms spin cost the stock client's 4 KiB QD1
/// reads 22 % (278 against 357 IOPS, MTU 9000), and `brick-target` on rxe
/// inside a VM did 327 4 KiB QD32 reads per second with a 20 ms spin and
/// 544 without. A halted or blocked loop is woken by the frame's interrupt
/// or the completion channel in microseconds.
pub fn spin_ns(bare_metal: u64) -> u64 {
    if under_hypervisor() {
        0
    } else {
        bare_metal
    }
}
