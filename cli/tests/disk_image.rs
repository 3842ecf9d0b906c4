//! `brick image build`, `brick manifest flash|show` on a disk image file:
//! the GPT and ESP written without root, a reflash into the other slot
//! read back and in force, a flipped byte in the newer slot that leaves
//! the older one in force, both slots bad refused with the image's own
//! message. The loader and image are stand-ins (a PE header, a minimal
//! ELF executable): the layout is what is tested here; the real ones boot
//! in the image suite (`cargo xtask test`, OVMF).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use manifest::slot::{read_slot, SLOT_BYTES, SLOT_HEADER, SLOT_MAGIC};

fn brick(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_brick"))
        .args(args)
        .output()
        .expect("run brick")
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "brick failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("brick-disk-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A minimal ELF64 x86-64 executable with one PT_LOAD segment.
fn kernel() -> Vec<u8> {
    let mut bytes = vec![0u8; 0x2000];
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2;
    bytes[5] = 1;
    bytes[16] = 2;
    bytes[18] = 62;
    bytes[24..32].copy_from_slice(&0x10_0000u64.to_le_bytes());
    bytes[32..40].copy_from_slice(&64u64.to_le_bytes());
    bytes[54] = 56;
    bytes[56] = 1;
    bytes[64..68].copy_from_slice(&1u32.to_le_bytes());
    bytes[72..80].copy_from_slice(&0x1000u64.to_le_bytes());
    bytes[88..96].copy_from_slice(&0x10_0000u64.to_le_bytes());
    bytes[96..104].copy_from_slice(&0x1000u64.to_le_bytes());
    bytes[104..112].copy_from_slice(&0x1000u64.to_le_bytes());
    bytes
}

fn manifest(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[target]\nname = \"{name}\"\n[[interfaces]]\nname = \"eth0\"\n\
             mac = \"52:54:00:77:00:01\"\naddress = \"10.77.0.1/24\"\n\
             [[volumes]]\nname = \"fast\"\nkind = \"nvme\"\nserial = \"brick-nvme0\"\n\
             [[access]]\nsessions = \"*\"\nvolumes = \"*\"\nmode = \"rw\"\n"
        ),
    )
    .unwrap();
    path
}

/// Flips a byte of the blob of the slot with `sequence` in the raw disk.
fn flip(disk: &Path, sequence: u64) {
    let mut image = std::fs::read(disk).unwrap();
    let at = (0..image.len() - SLOT_HEADER)
        .step_by(512)
        .find(|&at| {
            image[at..at + 4] == SLOT_MAGIC
                && read_slot(&image[at..(at + SLOT_BYTES).min(image.len())])
                    .is_ok_and(|slot| slot.sequence == sequence)
        })
        .expect("the slot is in the image");
    image[at + SLOT_HEADER + 30] ^= 0xff;
    std::fs::write(disk, image).unwrap();
}

#[test]
fn build_flash_show_and_a_flipped_slot() {
    let dir = scratch("flash");
    let loader = dir.join("loader.efi");
    std::fs::write(&loader, b"MZ stand-in loader").unwrap();
    let image = dir.join("kernel.elf");
    std::fs::write(&image, kernel()).unwrap();
    let disk = dir.join("node.img");
    let disk_arg = disk.to_str().unwrap();
    let first = manifest(&dir, "first");
    let out = ok(&brick(&[
        "image",
        "build",
        "--manifest",
        first.to_str().unwrap(),
        "-o",
        disk_arg,
        "--loader",
        loader.to_str().unwrap(),
        "--kernel",
        image.to_str().unwrap(),
    ]));
    assert!(out.contains("64 MiB GPT disk"), "{out}");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 64 << 20);
    // A protective MBR and a GPT header.
    let bytes = std::fs::read(&disk).unwrap();
    assert_eq!(&bytes[510..512], &[0x55, 0xaa]);
    assert_eq!(&bytes[512..520], b"EFI PART");
    let shown = ok(&brick(&["manifest", "show", disk_arg]));
    assert!(shown.contains("slot A: valid, sequence 1"), "{shown}");
    assert!(shown.contains("slot B: blank (never flashed)"), "{shown}");
    assert!(shown.contains("name = \"first\""), "{shown}");
    assert!(shown.contains("kind = \"nvme\""), "{shown}");

    // A reflash goes into slot B and is what the next boot serves.
    let second = manifest(&dir, "second");
    let out = ok(&brick(&[
        "manifest",
        "flash",
        disk_arg,
        second.to_str().unwrap(),
    ]));
    assert!(
        out.contains("into slot B (sequence 2), read back and verified"),
        "{out}"
    );
    let shown = ok(&brick(&["manifest", "show", disk_arg]));
    assert!(shown.contains("in force: slot B (sequence 2)"), "{shown}");
    assert!(shown.contains("name = \"second\""), "{shown}");
    // The next one goes back into slot A.
    let third = manifest(&dir, "third");
    let out = ok(&brick(&[
        "manifest",
        "flash",
        disk_arg,
        third.to_str().unwrap(),
    ]));
    assert!(out.contains("into slot A (sequence 3)"), "{out}");

    // A flipped byte in the newer slot: the older one is in force.
    flip(&disk, 3);
    let shown = ok(&brick(&["manifest", "show", disk_arg]));
    assert!(shown.contains("slot A: checksum mismatch"), "{shown}");
    assert!(shown.contains("in force: slot B (sequence 2)"), "{shown}");
    // Flashing now replaces the bad slot, not the one in force, one above
    // the highest valid sequence.
    let out = ok(&brick(&[
        "manifest",
        "flash",
        disk_arg,
        third.to_str().unwrap(),
    ]));
    assert!(out.contains("into slot A (sequence 3)"), "{out}");

    // Both slots bad: refused, with the image's own words.
    flip(&disk, 3);
    flip(&disk, 2);
    let output = brick(&["manifest", "show", disk_arg]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("both manifest slots are bad"), "{error}");
    // Flashing recovers the disk.
    let out = ok(&brick(&[
        "manifest",
        "flash",
        disk_arg,
        first.to_str().unwrap(),
    ]));
    assert!(out.contains("read back and verified"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn build_refuses_what_is_not_a_loader_or_an_image() {
    let dir = scratch("refuse");
    let text = dir.join("not.efi");
    std::fs::write(&text, b"plain text").unwrap();
    let first = manifest(&dir, "first");
    let disk = dir.join("node.img");
    let output = brick(&[
        "image",
        "build",
        "--manifest",
        first.to_str().unwrap(),
        "-o",
        disk.to_str().unwrap(),
        "--loader",
        text.to_str().unwrap(),
        "--kernel",
        text.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("not a UEFI application"), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}
