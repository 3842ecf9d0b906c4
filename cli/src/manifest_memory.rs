//! The memory part of `brick manifest check`: what the limits make the
//! target allocate at boot ([`manifest::Capacity`]), per session and in
//! total, and whether the bare-metal image can hold it.

use anyhow::{anyhow, Result};
use manifest::binary::Manifest;
use manifest::capacity::{Capacity, Memory, IMAGE_RAM_LIMIT};
use manifest::VolumeKind;

/// Bytes in the largest unit that keeps a whole part, one decimal
/// (`1.5 GiB`, `66.1 MiB`, `896 B`).
fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let tenths = (u128::from(bytes) * 10 / u128::from(unit)) as u64;
            return format!("{}.{} {name}", tenths / 10, tenths % 10);
        }
    }
    format!("{bytes} B")
}

/// One line of memory by kind.
fn by_kind(memory: &Memory) -> String {
    let mut line = format!(
        "chunks {}, QPs {}, CQs {}, tables {}",
        format_size(memory.chunks),
        format_size(memory.qps),
        format_size(memory.cq),
        format_size(memory.tables)
    );
    if memory.reorder > 0 {
        line += &format!(", reorder buffers {}", format_size(memory.reorder));
    }
    if memory.requests > 0 {
        line += &format!(", requests {}", format_size(memory.requests));
    }
    if memory.thin > 0 {
        line += &format!(", thin maps {}", format_size(memory.thin));
    }
    if memory.admin > 0 {
        line += &format!(", admin {}", format_size(memory.admin));
    }
    line
}

/// Prints the capacity lines of `m`, then refuses (the error names the
/// numbers) limits no HCA can hold, and an image manifest (one with
/// virtio-blk or NVMe volumes or pools, which only the image serves) that does not
/// fit the image's RAM; other manifests that do not fit get a note.
///
/// # Errors
/// The refusal.
pub fn print_and_check(m: &Manifest<'_>) -> Result<()> {
    let capacity = Capacity::of(m);
    let limits = m.limits();
    println!(
        "capacity    per interface: {} chunk pools of {}, {} QPs (send depth {}, receive depth {}), {} CQ entries, {} memory regions, {} CM slots; {} requests in all",
        capacity.path_pools,
        format_size(capacity.pool_bytes),
        capacity.qps,
        capacity.send_depth,
        capacity.recv_depth,
        capacity.cq_entries,
        capacity.regions,
        capacity.cm_connections,
        capacity.requests
    );
    let session = capacity.session_memory();
    println!(
        "per session {} ({} paths of {} connections): {}",
        format_size(session.total()),
        limits.max_paths_per_session,
        limits.max_connections_per_path,
        by_kind(&session)
    );
    let memory = capacity.memory();
    println!(
        "engine      {} over {} interfaces: {}",
        format_size(memory.total()),
        capacity.interfaces,
        by_kind(&memory)
    );
    if let Err((what, count, most)) = capacity.check_hca() {
        return Err(anyhow!(
            "the limits need {count} {what} per interface, an HCA holds at most {most}: lower [limits] max_sessions / max_paths_per_session / max_connections_per_path / queue_depth"
        ));
    }
    let image_only = m
        .volumes()
        .any(|v| matches!(v.backing.kind(), VolumeKind::VirtioBlk | VolumeKind::Nvme))
        || m.pools().any(|p| p.backing.is_device());
    match capacity.check_image(m.ram_volume_bytes()) {
        Ok(()) => println!(
            "image       fits: needs {} of the {} below 4 GiB it can use",
            format_size(
                memory
                    .total()
                    .saturating_add(m.ram_volume_bytes())
                    .saturating_add(manifest::capacity::IMAGE_FIXED_BYTES)
            ),
            format_size(IMAGE_RAM_LIMIT)
        ),
        Err(error) if image_only => return Err(anyhow!("{error}")),
        Err(error) => println!("note        the bare-metal image could not serve this: {error}"),
    }
    Ok(())
}
