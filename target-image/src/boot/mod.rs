//! Boot logic of the bare-metal image that runs (and is tested) on the host.
//!
//! The image binary (`src/bin/brick-image`) owns the hardware: the PVH entry,
//! port I/O, the serial console, the TSC. Everything it decides with plain
//! arithmetic lives here, free of `unsafe`, so `cargo test -p
//! brick-target-image` checks it on the host:
//!
//! * [`pvh`]: the PVH `hvm_start_info` (Xen's `arch-x86/hvm/start_info.h`)
//!   read through a [`pvh::PhysRead`] view of guest memory into a safe
//!   [`pvh::BootInfo`] (magic and version checked, e820 memory map, modules,
//!   command line); nothing else in the image sees raw boot pointers;
//! * [`memory`]: [`memory::FreeRanges`], a fixed-capacity free list of
//!   physical ranges with first-fit carving and coalescing frees. The image
//!   builds one from the memory map minus what is in use
//!   ([`memory::FreeRanges::from_memory_map`]) and carves the heap and the
//!   DMA/registered-memory pool from it; the image's global allocator is the
//!   same type over the heap ranges;
//! * [`pool`]: how big the preallocated pool is for a manifest;
//! * [`acpi`]: the RSDP, RSDT/XSDT and MCFG (the ECAM window for PCI);
//! * [`claim`]: which disk or controller a volume selects, which NIC an
//!   interface gets, and the idle loop's halt policy.

pub mod acpi;
pub mod claim;
pub mod memory;
pub mod pool;
pub mod pvh;
