//! The Linux judge VM images, built from Debian packages only and cached.
//!
//! - the Debian 6.1 kernel (`linux-image-amd64`'s current ABI, resolved with
//!   apt-cache rather than hard-coded: Debian bumps it with security updates);
//! - rtrs-core/-client/-server and rnbd-client/-server, which Debian leaves
//!   out, built out of tree from `linux-source-6.1` against the matching
//!   `linux-headers-<abi>-amd64` (one Kbuild over both folders so one modpost
//!   pass resolves rtrs's exported symbols for rnbd);
//! - initramfs pieces, as uncompressed newc cpio archives that QEMU's
//!   `-initrd` takes concatenated: `base` (busybox, the module closure, the
//!   `rdma` tool), `fio`, `rping` and `ext4` overlays (big: used only when
//!   a test needs them), and `scripts` (qemu/guest, rebuilt every time).

use crate::paths;
use crate::util::{self, step};
use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the recipe changes so stale caches are rebuilt.
const RECIPE: u32 = 1;

/// Modules the guests load (dependencies are added from modules.dep).
const GUEST_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "crc32_generic",
    "crc32-pclmul",
    "rdma_rxe",
    "rdma_ucm",
    "ib_uverbs",
    "brd",
    "configfs",
    "nvme-rdma",
    "nvmet-rdma",
];

/// Our out-of-tree modules, installed under `extra/`.
const RNBD_MODULES: &[&str] = &[
    "rtrs/rtrs-core.ko",
    "rtrs/rtrs-client.ko",
    "rtrs/rtrs-server.ko",
    "rnbd/rnbd-client.ko",
    "rnbd/rnbd-server.ko",
];

/// Which overlays a VM's initramfs carries.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overlays {
    /// fio and its ~64 libraries.
    pub fio: bool,
    /// rping, librdmacm/libibverbs and the rxe provider.
    pub rping: bool,
    /// `mkfs.ext4` and the ext4 module closure ([`EXT4_MODULES_LIST`]).
    pub ext4: bool,
}

/// The ext4 overlay's module list, in load order (dependencies first):
/// paths under `/lib/modules/<abi>/`. The overlay's modules are not in the
/// base's `modules.dep`, so the guest `insmod`s them in this order
/// (`load_ext4` in qemu/guest/lib.sh).
pub const EXT4_MODULES_LIST: &str = "/lib/brick/ext4.modules";

/// What the ext4 overlay loads: the filesystem and the checksum its
/// metadata uses (requested by name at mount, which the guest's module
/// loader cannot resolve from the base's `modules.dep`).
const EXT4_MODULES: &[&str] = &["crc32c_generic", "ext4"];

/// Paths of the built images.
#[derive(Clone, Debug)]
pub struct Images {
    /// Kernel ABI, e.g. `6.1.0-57-amd64`.
    pub abi: String,
    /// The kernel image.
    pub kernel: PathBuf,
    base: PathBuf,
    fio: PathBuf,
    rping: PathBuf,
    ext4: PathBuf,
    scripts: PathBuf,
}

impl Images {
    /// Builds what is missing and returns the image paths.
    pub fn build() -> Result<Images> {
        crate::setup::qemu()?;
        for (tool, package) in [
            ("cpio", "cpio"),
            ("depmod", "kmod"),
            ("dpkg-deb", "dpkg"),
            ("apt-get", "apt"),
            ("make", "build-essential"),
        ] {
            util::require_tool(tool, package)?;
        }
        let abi = crate::setup::kernel_abi()?;
        let dir = paths::build_dir().join(format!("vm-{abi}-r{RECIPE}"));
        fs::create_dir_all(&dir)?;
        let kernel_root = dir.join("kernel");
        if !kernel_root.join("done").exists()
            || !kernel_root
                .join(format!("lib/modules/{abi}/modules.dep"))
                .exists()
        {
            fetch_kernel(&abi, &kernel_root)?;
        }
        let modules = dir.join("rnbd-modules");
        if !modules.join("done").exists() {
            build_rnbd_modules(&abi, &modules)?;
        }
        let base = dir.join("base.cpio");
        if !base.exists() {
            build_base(&abi, &kernel_root, &modules, &base)?;
        }
        let fio = dir.join("fio.cpio");
        if !fio.exists() {
            util::require_path(Path::new("/usr/bin/fio"), "fio")?;
            build_overlay("fio", &["/usr/bin/fio"], &[], &fio)?;
        }
        let rping = dir.join("rping.cpio");
        if !rping.exists() {
            util::require_path(Path::new("/usr/bin/rping"), "rdmacm-utils")?;
            let provider = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so");
            util::require_path(provider, "ibverbs-providers")?;
            build_overlay(
                "rping",
                &["/usr/bin/rping", provider.to_str().unwrap_or_default()],
                &[
                    "/etc/libibverbs.d/rxe.driver",
                    "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                ],
                &rping,
            )?;
        }
        let ext4 = dir.join("ext4.cpio");
        if !ext4.exists() {
            build_ext4(&abi, &kernel_root, &ext4)?;
        }
        let scripts = dir.join("scripts.cpio");
        build_scripts(&scripts)?;
        Ok(Images {
            kernel: kernel_root.join(format!("boot/vmlinuz-{abi}")),
            abi,
            base,
            fio,
            rping,
            ext4,
            scripts,
        })
    }

    /// A module of the judge kernel (its `modules.dep` path resolved), for
    /// a VM that loads it with `insmod` (it is not in the base).
    pub fn module(&self, name: &str) -> Result<PathBuf> {
        let root = self
            .kernel
            .parent()
            .and_then(Path::parent)
            .context("the kernel image has no root")?
            .join(format!("lib/modules/{}", self.abi));
        let deps = read_modules_dep(&root)?;
        let Some((path, module_deps)) = deps.get(&name.replace('-', "_")) else {
            bail!("module {name} is not in {}'s modules.dep", root.display());
        };
        if !module_deps.is_empty() {
            bail!("module {name} needs {module_deps:?}: load them too");
        }
        Ok(root.join(path))
    }

    /// Prints where the images are.
    pub fn describe(&self) {
        println!("kernel ABI  {}", self.abi);
        println!("kernel      {}", self.kernel.display());
        for path in [
            &self.base,
            &self.fio,
            &self.rping,
            &self.ext4,
            &self.scripts,
        ] {
            let size = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            println!(
                "initramfs   {} ({:.1} MiB)",
                path.display(),
                size as f64 / 1048576.0
            );
        }
    }

    /// Concatenates the initramfs pieces for one VM into `out`, plus an
    /// extra archive with `extra` files (host path -> guest path).
    pub fn initrd(
        &self,
        overlays: Overlays,
        extra: &[(PathBuf, String)],
        out: &Path,
    ) -> Result<()> {
        let mut parts = vec![self.base.clone(), self.scripts.clone()];
        if overlays.fio {
            parts.push(self.fio.clone());
        }
        if overlays.rping {
            parts.push(self.rping.clone());
        }
        if overlays.ext4 {
            parts.push(self.ext4.clone());
        }
        if !extra.is_empty() {
            let stage = out.with_extension("extra.d");
            let _ = fs::remove_dir_all(&stage);
            for (host, guest) in extra {
                let target = stage.join(guest.trim_start_matches('/'));
                fs::create_dir_all(target.parent().unwrap_or(&stage))?;
                fs::copy(host, &target)
                    .with_context(|| format!("copy {} into the initramfs", host.display()))?;
            }
            let archive = out.with_extension("extra.cpio");
            make_cpio(&stage, &archive)?;
            parts.push(archive);
        }
        let mut file = fs::File::create(out)?;
        for part in parts {
            let mut input = fs::File::open(&part)
                .with_context(|| format!("open initramfs part {}", part.display()))?;
            std::io::copy(&mut input, &mut file)?;
        }
        Ok(())
    }
}

fn fetch_kernel(abi: &str, root: &Path) -> Result<()> {
    step(format!("fetching linux-image-{abi} (Debian package)"));
    let download = root.with_extension("download");
    let _ = fs::remove_dir_all(&download);
    let _ = fs::remove_dir_all(root);
    fs::create_dir_all(&download)?;
    util::run(
        Command::new("apt-get")
            .args(["download", "-q", &format!("linux-image-{abi}")])
            .current_dir(&download),
    )
    .context("download the kernel package (needs `apt-get update` and Debian's archive)")?;
    let deb = fs::read_dir(&download)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root))?;
    fs::remove_dir_all(&download)?;
    // The package ships no modules.dep (its postinst makes it).
    util::run(Command::new("depmod").arg("-b").arg(root).arg(abi)).context("depmod")?;
    fs::write(root.join("done"), abi)?;
    Ok(())
}

fn build_rnbd_modules(abi: &str, out: &Path) -> Result<()> {
    let headers = PathBuf::from(format!("/usr/src/linux-headers-{abi}"));
    util::require_path(&headers, &format!("linux-headers-{abi}"))?;
    let source = Path::new("/usr/src/linux-source-6.1.tar.xz");
    util::require_path(source, "linux-source-6.1")?;
    step("building rtrs/rnbd modules out of tree (~30 s)");
    let _ = fs::remove_dir_all(out);
    fs::create_dir_all(out)?;
    util::run(
        Command::new("tar")
            .arg("xf")
            .arg(source)
            .args([
                "linux-source-6.1/drivers/infiniband/ulp/rtrs",
                "linux-source-6.1/drivers/block/rnbd",
            ])
            .current_dir(out),
    )?;
    fs::rename(
        out.join("linux-source-6.1/drivers/infiniband/ulp/rtrs"),
        out.join("rtrs"),
    )?;
    fs::rename(
        out.join("linux-source-6.1/drivers/block/rnbd"),
        out.join("rnbd"),
    )?;
    fs::remove_dir_all(out.join("linux-source-6.1"))?;
    // One Kbuild over both folders: a single modpost pass, so rnbd links
    // against the symbols rtrs exports.
    fs::write(out.join("Kbuild"), "obj-y += rtrs/ rnbd/\n")?;
    let makefile = out.join("rnbd/Makefile");
    let text = fs::read_to_string(&makefile)?;
    let patched = text.replace(
        "-I$(srctree)/drivers/infiniband/ulp/rtrs",
        "-I$(src)/../rtrs",
    );
    if patched == text {
        bail!("rnbd/Makefile no longer has the rtrs include path this recipe rewrites");
    }
    fs::write(&makefile, patched)?;
    util::run(
        Command::new("make")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", out.display()))
            .args([
                "CONFIG_INFINIBAND_RTRS=m",
                "CONFIG_INFINIBAND_RTRS_CLIENT=m",
                "CONFIG_INFINIBAND_RTRS_SERVER=m",
                "CONFIG_BLK_DEV_RNBD=y",
                "CONFIG_BLK_DEV_RNBD_CLIENT=m",
                "CONFIG_BLK_DEV_RNBD_SERVER=m",
                "-j2",
                "modules",
            ]),
    )?;
    for module in RNBD_MODULES {
        util::require_path(&out.join(module), "the rtrs/rnbd module build")?;
    }
    fs::write(out.join("done"), abi)?;
    Ok(())
}

/// Module name -> path relative to lib/modules/<abi>, and its dependencies.
fn read_modules_dep(modules: &Path) -> Result<HashMap<String, (String, Vec<String>)>> {
    let text = fs::read_to_string(modules.join("modules.dep"))?;
    let mut map = HashMap::new();
    for line in text.lines() {
        let Some((path, deps)) = line.split_once(':') else {
            continue;
        };
        let name = module_name(path);
        let deps = deps.split_whitespace().map(str::to_string).collect();
        map.insert(name, (path.to_string(), deps));
    }
    Ok(map)
}

fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.trim_end_matches(".ko").replace('-', "_")
}

fn build_base(abi: &str, kernel_root: &Path, rnbd: &Path, out: &Path) -> Result<()> {
    step("building the base initramfs (busybox, modules, rdma tool)");
    util::require_path(Path::new("/bin/busybox"), "busybox-static")?;
    util::require_path(Path::new("/usr/bin/rdma"), "iproute2")?;
    let stage = out.with_extension("d");
    let _ = fs::remove_dir_all(&stage);
    for dir in [
        "bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "run", "root", "mnt",
    ] {
        fs::create_dir_all(stage.join(dir))?;
    }
    // busybox-static: no libraries needed.
    fs::copy("/bin/busybox", stage.join("bin/busybox")).context("copy busybox")?;
    copy_with_libraries(&stage, &["/usr/bin/rdma"], &[])?;

    let modules_src = kernel_root.join(format!("lib/modules/{abi}"));
    let modules_dst = stage.join(format!("lib/modules/{abi}"));
    let deps = read_modules_dep(&modules_src)?;
    let mut wanted = BTreeSet::new();
    let mut queue: Vec<String> = GUEST_MODULES.iter().map(|m| m.replace('-', "_")).collect();
    // rtrs/rnbd need rdma_cm and ib_core; those are in the closure above.
    queue.extend(["rdma_cm", "ib_cm", "iw_cm", "ib_core"].map(String::from));
    while let Some(name) = queue.pop() {
        let Some((path, module_deps)) = deps.get(&name) else {
            bail!(
                "module {name} is not in {}'s modules.dep",
                modules_src.display()
            );
        };
        if wanted.insert(path.clone()) {
            queue.extend(module_deps.iter().map(|d| module_name(d)));
        }
    }
    for path in &wanted {
        let target = modules_dst.join(path);
        fs::create_dir_all(target.parent().unwrap_or(&modules_dst))?;
        fs::copy(modules_src.join(path), &target).with_context(|| format!("copy module {path}"))?;
    }
    for module in RNBD_MODULES {
        let target = modules_dst.join("extra").join(module);
        fs::create_dir_all(target.parent().unwrap_or(&modules_dst))?;
        fs::copy(rnbd.join(module), target).with_context(|| format!("copy {module}"))?;
    }
    for file in [
        "modules.order",
        "modules.builtin",
        "modules.builtin.modinfo",
    ] {
        let source = modules_src.join(file);
        if source.exists() {
            fs::copy(&source, modules_dst.join(file))?;
        }
    }
    util::run(Command::new("depmod").arg("-b").arg(&stage).arg(abi)).context("depmod")?;
    make_cpio(&stage, out)?;
    fs::remove_dir_all(&stage)?;
    Ok(())
}

/// The ext4 overlay: `mkfs.ext4` with its libraries and configuration,
/// and the module closure of [`EXT4_MODULES`] with its load order in
/// [`EXT4_MODULES_LIST`].
fn build_ext4(abi: &str, kernel_root: &Path, out: &Path) -> Result<()> {
    step("building the ext4 initramfs overlay");
    let mkfs = Path::new("/usr/sbin/mkfs.ext4");
    util::require_path(mkfs, "e2fsprogs")?;
    let stage = out.with_extension("d");
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage)?;
    let conf = "/etc/mke2fs.conf";
    let files: &[&str] = if Path::new(conf).exists() {
        &[conf]
    } else {
        &[]
    };
    copy_with_libraries(&stage, &["/usr/sbin/mkfs.ext4"], files)?;
    let modules_src = kernel_root.join(format!("lib/modules/{abi}"));
    let deps = read_modules_dep(&modules_src)?;
    let mut order = Vec::new();
    for module in EXT4_MODULES {
        load_order(&deps, module, &modules_src, &mut order)?;
    }
    for path in &order {
        let target = stage.join(format!("lib/modules/{abi}")).join(path);
        fs::create_dir_all(target.parent().unwrap_or(&stage))?;
        fs::copy(modules_src.join(path), &target).with_context(|| format!("copy module {path}"))?;
    }
    let list = stage.join(EXT4_MODULES_LIST.trim_start_matches('/'));
    fs::create_dir_all(list.parent().unwrap_or(&stage))?;
    fs::write(&list, order.join("\n") + "\n")?;
    make_cpio(&stage, out)?;
    fs::remove_dir_all(&stage)?;
    Ok(())
}

/// Appends `module`'s dependencies and then `module` to `order` (each
/// once), as `modules.dep` paths.
fn load_order(
    deps: &HashMap<String, (String, Vec<String>)>,
    module: &str,
    modules: &Path,
    order: &mut Vec<String>,
) -> Result<()> {
    let Some((path, module_deps)) = deps.get(&module.replace('-', "_")) else {
        bail!(
            "module {module} is not in {}'s modules.dep",
            modules.display()
        );
    };
    for dep in module_deps {
        load_order(deps, &module_name(dep), modules, order)?;
    }
    if !order.contains(path) {
        order.push(path.clone());
    }
    Ok(())
}

/// An overlay: binaries with their shared-library closure plus plain files.
fn build_overlay(name: &str, binaries: &[&str], files: &[&str], out: &Path) -> Result<()> {
    step(format!("building the {name} initramfs overlay"));
    let stage = out.with_extension("d");
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage)?;
    copy_with_libraries(&stage, binaries, files)?;
    make_cpio(&stage, out)?;
    fs::remove_dir_all(&stage)?;
    Ok(())
}

fn build_scripts(out: &Path) -> Result<()> {
    let stage = out.with_extension("d");
    let _ = fs::remove_dir_all(&stage);
    let guest = paths::qemu_dir().join("guest");
    fs::create_dir_all(stage.join("lib/brick"))?;
    fs::copy(guest.join("init"), stage.join("init"))?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(&guest)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "sh") {
            let name = path.file_name().context("script name")?;
            fs::copy(&path, stage.join("lib/brick").join(name))?;
        }
    }
    make_cpio(&stage, out)?;
    fs::remove_dir_all(&stage)?;
    Ok(())
}

/// Copies `binaries` and their `ldd` closure (and `files`) into `stage` at
/// the same paths.
fn copy_with_libraries(stage: &Path, binaries: &[&str], files: &[&str]) -> Result<()> {
    let mut all: BTreeSet<String> = files.iter().map(|f| f.to_string()).collect();
    for binary in binaries {
        all.insert(binary.to_string());
        all.extend(libraries(Path::new(binary))?);
    }
    for path in all {
        let target = stage.join(path.trim_start_matches('/'));
        fs::create_dir_all(target.parent().unwrap_or(stage))?;
        fs::copy(&path, &target).with_context(|| format!("copy {path} into the initramfs"))?;
    }
    Ok(())
}

/// The shared libraries `binary` loads (its `ldd` closure, the dynamic
/// loader included), as absolute paths.
pub fn libraries(binary: &Path) -> Result<Vec<String>> {
    let listing = util::output(Command::new("ldd").arg(binary))?;
    let mut all = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            all.push(path.to_string());
        }
    }
    Ok(all)
}

/// An uncompressed newc archive of `stage` (root-owned), which the kernel
/// unpacks faster under TCG than a compressed one.
fn make_cpio(stage: &Path, out: &Path) -> Result<()> {
    let script = format!(
        "cd '{}' && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet > '{}'",
        stage.display(),
        out.display()
    );
    util::sh(&script)
}
