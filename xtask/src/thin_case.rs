//! The stock Linux client on a thin volume (`thin_fstrim`): `mkfs.ext4`, a
//! mount, a fio verify through the filesystem and `fstrim`, with the
//! target's extent count read from its admin endpoint (docs/ADMIN.md) at
//! each step: it rises with the data written and falls after the trim.

use crate::suite::{Skip, MINUTE};
use crate::target::Bed;
use crate::util::step as step_note;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The file fio writes and verifies through ext4.
const FILE_MIB: u64 = 48;
/// Extent size of the judge's pool (the thin crate's default).
const EXTENT_MIB: u64 = 2;

/// What the admin endpoint says of a thin volume.
struct Extents {
    allocated: u64,
    pool_free: u64,
    ranges: String,
}

/// `GET /volumes/NAME/extents` on `admin`.
fn extents(admin: &str, volume: &str) -> Result<Extents> {
    let mut stream = TcpStream::connect(admin)
        .with_context(|| format!("connect to the admin endpoint {admin}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(
        stream,
        "GET /volumes/{volume}/extents HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .with_context(|| format!("read the answer of {admin}"))?;
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        bail!("{admin}: expected an HTTP answer, found {answer:?}");
    };
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("GET /volumes/{volume}/extents on {admin}: expected 200, found {status:?}: {body}");
    }
    let json: serde_json::Value = serde_json::from_str(body)
        .with_context(|| format!("{admin}: expected the extent list as JSON, found {body:?}"))?;
    let number = |key: &str| {
        json[key]
            .as_u64()
            .with_context(|| format!("{admin}: the extent list has no number {key:?}: {body}"))
    };
    let ranges: Vec<String> = json["ranges"]
        .as_array()
        .map(|ranges| {
            ranges
                .iter()
                .map(|r| format!("{}+{}", r["first_extent"], r["extents"]))
                .collect()
        })
        .unwrap_or_default();
    Ok(Extents {
        allocated: number("allocated_extents")?,
        pool_free: number("pool_free_extents")?,
        ranges: ranges.join(" "),
    })
}

/// Reads the extent list and prints it under `label`.
fn report(admin: &str, volume: &str, label: &str) -> Result<Extents> {
    let now = extents(admin, volume)?;
    step_note(format!(
        "{label}: {} extents allocated, {} free in the pool; ranges (first+count): {}",
        now.allocated, now.pool_free, now.ranges
    ));
    Ok(now)
}

/// mkfs.ext4, mount, fio verify of a file, delete, fstrim; the extent count
/// must rise by about the file and fall by about as much after the trim,
/// and a file written after the trim survives a remount.
pub fn thin_fstrim(bed: &mut Bed) -> Result<()> {
    let descriptor = &bed.target.descriptor;
    let Some(index) = descriptor.volumes.iter().position(|v| v.thin) else {
        return Err(Skip("the target serves no thin volume").into());
    };
    let Some(admin) = descriptor.admin.clone() else {
        return Err(Skip("the target has no admin endpoint to list extents").into());
    };
    let volume = descriptor.volumes[index].device_path.clone();
    report(&admin, &volume, "before the map")?;
    // Inode tables and the journal are written by mkfs, not by ext4's
    // background initialisation, so the counts below move only with what
    // the case writes and trims.
    let script = crate::suite::map_line(bed, "d", index)
        + "echo $d > /tmp/thin.dev\n\
           max=$(cat /sys/block/$d/queue/discard_max_bytes)\n\
           [ \"$max\" -gt 0 ] || die \"$d advertises no discard (discard_max_bytes $max)\"\n\
           load_ext4\n\
           /usr/sbin/mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/$d > /tmp/mkfs.out 2>&1 || { cat /tmp/mkfs.out; die \"mkfs.ext4 /dev/$d\"; }\n\
           mkdir -p /mnt/thin && mount -t ext4 /dev/$d /mnt/thin || die \"mount /dev/$d\"\n\
           log \"mkfs.ext4 and mount of $d ok (discard_max_bytes $max)\"\n";
    bed.initiator.run(&script, 5 * MINUTE)?;
    let formatted = report(&admin, &volume, "after mkfs.ext4")?;
    let script = format!(
        "fio --name=thin --filename=/mnt/thin/data --size={FILE_MIB}M --bs=128k --rw=write \
         --direct=1 --ioengine=libaio --iodepth=4 --verify=crc32c --verify_fatal=1 --do_verify=1 \
         --output-format=terse --terse-version=3 > /tmp/fio.thin.out 2>&1 || {{ cat /tmp/fio.thin.out; die \"fio verify on /mnt/thin/data\"; }}\n\
         err=$(cut -d';' -f5 /tmp/fio.thin.out | head -1)\n\
         [ \"$err\" = 0 ] || {{ cat /tmp/fio.thin.out; die \"fio reported error $err\"; }}\n\
         sync\nlog \"fio wrote and verified {FILE_MIB} MiB through ext4\"\n"
    );
    bed.initiator.run(&script, 10 * MINUTE)?;
    let written = report(&admin, &volume, "after the fio verify")?;
    let script = "rm /mnt/thin/data && sync\n\
                  trimmed=$(fstrim -v /mnt/thin) || die \"fstrim /mnt/thin\"\n\
                  log \"fstrim: $trimmed\"\n";
    bed.initiator.run(script, 5 * MINUTE)?;
    let trimmed = report(&admin, &volume, "after rm and fstrim")?;
    let file_extents = FILE_MIB / EXTENT_MIB;
    if written.allocated < formatted.allocated + file_extents * 3 / 4 {
        bail!(
            "after writing {FILE_MIB} MiB the volume holds {} extents, {} after mkfs: \
             expected at least {} more",
            written.allocated,
            formatted.allocated,
            file_extents * 3 / 4
        );
    }
    if trimmed.allocated + file_extents * 3 / 4 > written.allocated {
        bail!(
            "fstrim after deleting the {FILE_MIB} MiB file left {} extents of {}: expected at \
             least {} fewer",
            trimmed.allocated,
            written.allocated,
            file_extents * 3 / 4
        );
    }
    if trimmed.pool_free <= written.pool_free {
        bail!(
            "the pool's free extents did not grow after fstrim: {} before, {} after",
            written.pool_free,
            trimmed.pool_free
        );
    }
    // What the trim freed is reusable and the filesystem is whole.
    let script = "d=$(cat /tmp/thin.dev)\n\
                  head -c 8388608 /dev/urandom > /mnt/thin/after && sync\n\
                  sum=$(md5sum < /mnt/thin/after)\n\
                  umount /mnt/thin && mount -t ext4 /dev/$d /mnt/thin || die \"remount /dev/$d\"\n\
                  [ \"$(md5sum < /mnt/thin/after)\" = \"$sum\" ] || die \"a file written after fstrim reads back different after a remount\"\n\
                  umount /mnt/thin\nunmap $d\nlog \"a file written after the trim survived a remount\"\n";
    bed.initiator.run(script, 5 * MINUTE)?;
    step_note(format!(
        "thin volume {volume}: {} extents after mkfs, {} after {FILE_MIB} MiB, {} after fstrim",
        formatted.allocated, written.allocated, trimmed.allocated
    ));
    Ok(())
}
