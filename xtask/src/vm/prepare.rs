//! Prepares and caches what the VM test needs on a Debian 12 host: host tools, a Debian kernel
//! and the `amd_hsmp` driver built from Debian's kernel source, a small Debian guest root with
//! systemd, and the project's `.deb` built from the checkout.
//!
//! Every cached artefact lives in its own directory of the cache with a `stamp` file holding
//! the key it was built from (package versions, recipe files); a different key rebuilds it into
//! a temporary directory that replaces the old one only when complete. Package versions are
//! resolved from the archive on every run, through a private APT configuration
//! (`APT_CONFIG`), so the host's own APT setup is never touched.

use crate::workspace::stdout_of;
use anyhow::{Context, Result, bail, ensure};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian mirror every suite comes from.
const MIRROR: &str = "http://deb.debian.org/debian";
/// The keyring that signs bookworm and trixie (bookworm's `debian-archive-keyring` has both).
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// The suite whose chroot builds the modules: the kernel headers' tools need its glibc.
const BUILD_SUITE: &str = "trixie";
/// Where kernels with the `hsmp/` driver directory and matching headers and source are.
const KERNEL_SUITE: &str = "trixie-backports";
/// The guest's suite: the host's, so the `.deb` built here installs as on the host.
const GUEST_SUITE: &str = "bookworm";
/// Packages the guest needs beyond `minbase` and the `.deb`'s own dependencies: systemd as
/// PID 1 with udev and D-Bus (for `systemd-analyze security`), `curl` to scrape, `kmod` for
/// `modprobe`, `procps` for `ps -eZ`, `netbase` for `semanage port`; SELinux enforcing on Debian's reference policy, with
/// `semodule`, `semanage` (policycoreutils-python-utils), `restorecon`, `setsebool`.
const GUEST_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "curl",
    "kmod",
    "procps",
    // setfattr: /init restores the labels computed on the host.
    "attr",
    // /etc/protocols: semanage port looks the protocol up by name.
    "netbase",
    "selinux-policy-default",
    "selinux-utils",
    "policycoreutils",
    "policycoreutils-python-utils",
    "semodule-utils",
];
/// Bumped whenever [`rootfs`] changes what it puts into the image.
const ROOTFS_RECIPE: u32 = 3;

/// Host commands the test runs, with the Debian package of each.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("debootstrap", "debootstrap"),
    ("iasl", "acpica-tools"),
    ("cpio", "cpio"),
    ("dpkg-deb", "dpkg"),
    ("depmod", "kmod"),
    // The policy module (packaging::build_selinux_module) and the static confinement probe.
    ("/usr/share/selinux/devel/Makefile", "selinux-policy-dev"),
    ("bzip2", "bzip2"),
    ("cc", "gcc"),
    ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
];

/// The cache directory and where its logs go.
#[derive(Debug, Clone)]
pub struct Cache {
    /// The root (`~/.cache/amd-hsmp-exporter/vm` unless overridden).
    pub dir: PathBuf,
}

impl Cache {
    /// The log file of `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }
}

/// The external modules built from Debian's kernel source (`tests/vm/Kbuild`).
const MODULES: [&str; 3] = ["hsmp_common.ko", "hsmp_acpi.ko", "msr.ko"];

/// The kernel and driver versions chosen from the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelChoice {
    /// The kernel ABI, e.g. `7.3.4+deb13-amd64`.
    pub abi: String,
    /// The Debian package version of the headers, source and image.
    pub version: String,
    /// The `linux-source-X.Y` package.
    pub source_package: String,
}

/// The kernel, its module list files and the two driver modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The chosen version.
    pub choice: KernelChoice,
    /// The directory: `vmlinuz`, `hsmp_common.ko`, `hsmp_acpi.ko`, `msr.ko`, `modules.builtin*`,
    /// `modules.order`.
    pub dir: PathBuf,
}

/// Runs `cmd` with its output appended to `log`; a failure names the command and shows the
/// log's last lines.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<()> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir)?;
    }
    let file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let status = cmd
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("{cmd:?} failed ({status}); last lines of {}:\n{}", log.display(), tail.join("\n"));
    }
    Ok(())
}

/// Whether `dir/stamp` holds `key`.
fn is_current(dir: &Path, key: &str) -> bool {
    fs::read_to_string(dir.join("stamp")).is_ok_and(|s| s == key)
}

/// Builds `dir` with `build` into `dir.tmp` unless its stamp holds `key`, then moves it into
/// place with the stamp. Returns whether it was cached.
pub(super) fn cached(
    dir: &Path,
    key: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<bool> {
    if is_current(dir, key) {
        return Ok(true);
    }
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    fs::create_dir_all(&tmp)?;
    build(&tmp)?;
    fs::write(tmp.join("stamp"), key)?;
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    fs::rename(&tmp, dir)?;
    Ok(false)
}

/// A private APT configuration: its own sources, lists and archive cache, the host's dpkg
/// status. `apt-get` run with it never reads or writes the host's sources or lists.
fn apt_config(cache: &Cache, name: &str, sources: &[String]) -> Result<PathBuf> {
    let dir = cache.dir.join(format!("apt-{name}"));
    for sub in ["lists/partial", "archives/partial", "parts"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let list: String = sources
        .iter()
        .map(|suite| format!("deb [signed-by={KEYRING}] {MIRROR} {suite} main\n"))
        .collect();
    fs::write(dir.join("sources.list"), list)?;
    let d = dir.display();
    let conf = format!(
        "Dir::Etc::SourceList \"{d}/sources.list\";\n\
         Dir::Etc::SourceParts \"{d}/parts\";\n\
         Dir::State::Lists \"{d}/lists\";\n\
         Dir::Cache \"{d}\";\n\
         Dir::Cache::Archives \"{d}/archives\";\n\
         APT::Sandbox::User \"root\";\n"
    );
    let path = dir.join("apt.conf");
    fs::write(&path, conf)?;
    Ok(path)
}

fn apt(conf: &Path) -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("APT_CONFIG", conf).env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// Installs the missing host tools: `cargo-deb` with `cargo install`, the Debian packages with
/// `apt-get`. QEMU comes from the suite of an installed
/// `qemu-utils`: mixing a bookworm `qemu-system-x86` with a backports `qemu-utils` would remove
/// the latter.
pub fn host_tools(cache: &Cache) -> Result<String> {
    // cargo-deb builds the package, at the version the packaging check pins.
    let mut installed = Vec::new();
    for tool in crate::deps::missing_cargo_tools() {
        let Some((krate, version)) = tool.split_once(' ') else { continue };
        crate::workspace::cargo(&["install", "--locked", "--force", krate, "--version", version])?;
        installed.push(tool);
    }
    let missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(cmd, _)| !crate::deps::on_path(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(if installed.is_empty() {
            "all present (cached)".into()
        } else {
            format!("installed {}", installed.join(", "))
        });
    }
    ensure!(
        rustix::process::geteuid().is_root(),
        "missing host packages {} (run as root to install them)",
        missing.join(" ")
    );
    let codename = fs::read_to_string("/etc/os-release")?
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_string))
        .context("no VERSION_CODENAME in /etc/os-release")?;
    let backports = format!("{codename}-backports");
    let conf = apt_config(
        cache,
        "host",
        &[codename.clone(), format!("{codename}-updates"), backports.clone()],
    )?;
    let log = cache.log("host-tools");
    run_logged(apt(&conf).args(["update", "-q"]), &log)?;
    let qemu_utils = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "qemu-utils"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut install = apt(&conf);
    install.args(["install", "-y", "-q", "--no-install-recommends"]);
    if qemu_utils.contains("~bpo") {
        install.args(["-t", &backports]);
    }
    run_logged(install.args(&missing), &log)?;
    Ok(format!("installed {}", missing.join(" ")))
}

/// Chooses the kernel from the headers `linux-headers-amd64` depends on in trixie-backports
/// (never from the newest image: the suite lists images without headers or source), checks
/// that the matching source package exists, and downloads nothing yet. The package lists are
/// refreshed when older than [`LISTS_MAX_AGE`].
pub fn choose_kernel(cache: &Cache) -> Result<KernelChoice> {
    let conf = apt_config(cache, "kernel", &[BUILD_SUITE.into(), KERNEL_SUITE.into()])?;
    let log = cache.log("kernel-choice");
    let lists = cache.dir.join("apt-kernel/lists");
    if lists_age(&lists).is_none_or(|age| age > LISTS_MAX_AGE) {
        match run_logged(apt(&conf).args(["update", "-q"]), &log) {
            Ok(()) => fs::write(lists.join(UPDATED_MARKER), "")?,
            // Offline with a warm cache: the lists from the last run still say what was chosen.
            Err(e) => {
                eprintln!("vm-test: cannot refresh the package lists, using the cached ones: {e:#}")
            }
        }
    }
    let show = |pkg: &str| {
        stdout_of(Command::new("apt-cache").env("APT_CONFIG", &conf).args([
            "show",
            "--no-all-versions",
            &format!("{pkg}/{KERNEL_SUITE}"),
        ]))
    };
    let meta = show("linux-headers-amd64")?;
    let field = |text: &str, name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let version = field(&meta, "Version:").context("linux-headers-amd64 has no Version")?;
    let depends = field(&meta, "Depends:").context("linux-headers-amd64 has no Depends")?;
    let abi = depends
        .split(',')
        .map(str::trim)
        .find_map(|d| d.strip_prefix("linux-headers-"))
        .and_then(|d| d.split_whitespace().next())
        .with_context(|| format!("no linux-headers-<abi> in {depends:?}"))?
        .to_string();
    let mut parts = abi.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("unexpected kernel ABI {abi:?}");
    };
    let source_package = format!("linux-source-{major}.{minor}");
    let source = show(&source_package)
        .with_context(|| format!("{KERNEL_SUITE} has headers {abi} but no {source_package}"))?;
    let source_version = field(&source, "Version:").unwrap_or_default();
    ensure!(
        source_version == version,
        "{KERNEL_SUITE}: headers {version} but {source_package} {source_version}"
    );
    Ok(KernelChoice { abi, version, source_package })
}

/// How old the kernel suites' package lists may be before a run refreshes them.
const LISTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The marker a successful `apt-get update` leaves in a lists directory (apt gives the lists
/// the archive's modification times, not the time they were fetched).
const UPDATED_MARKER: &str = "vm-test-updated";

/// How long ago the lists in `lists` were last refreshed, if ever.
fn lists_age(lists: &Path) -> Option<std::time::Duration> {
    fs::metadata(lists.join(UPDATED_MARKER)).ok()?.modified().ok()?.elapsed().ok()
}

/// Unmounts a chroot's `/proc` when dropped.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(root: &Path) -> Result<ProcMount> {
        let proc = root.join("proc");
        stdout_of(Command::new("mount").args(["-t", "proc", "proc"]).arg(&proc))?;
        Ok(ProcMount(proc))
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The trixie `buildd` chroot the modules are built in, with trixie-backports enabled.
pub fn build_chroot(cache: &Cache) -> Result<(PathBuf, bool)> {
    let dir = cache.dir.join("build-chroot");
    let key = format!("{BUILD_SUITE} buildd + {KERNEL_SUITE}\n");
    let was_cached = cached(&dir, &key, |tmp| {
        let root = tmp.join("root");
        let debs = cache.dir.join("debs").join(BUILD_SUITE);
        fs::create_dir_all(&debs)?;
        run_logged(
            Command::new("debootstrap")
                .args(["--variant=buildd", &format!("--keyring={KEYRING}")])
                .arg(format!("--cache-dir={}", debs.display()))
                .args([BUILD_SUITE])
                .arg(&root)
                .arg(MIRROR),
            &cache.log("build-chroot"),
        )?;
        fs::write(
            root.join("etc/apt/sources.list.d/backports.list"),
            format!("deb {MIRROR} {KERNEL_SUITE} main\n"),
        )?;
        Ok(())
    })?;
    Ok((dir.join("root"), was_cached))
}

/// The kernel image and the two driver modules for `choice`, built in the chroot `root`.
pub fn kernel(cache: &Cache, root: &Path, choice: &KernelChoice) -> Result<(Kernel, bool)> {
    let kbuild = super::repo_file("tests/vm/Kbuild")?;
    let dir = cache.dir.join("kernel");
    let key = format!("{choice:?}\n{kbuild}");
    let log = cache.log("kernel");
    let was_cached = cached(&dir, &key, |tmp| {
        let KernelChoice { abi, version, source_package } = choice;
        let chroot = |args: &[&str]| chroot_run(root, args, &log);
        install_headers(root, choice, &log)?;
        // The driver files, unmodified, from the source tarball.
        let build = root.join("build/hsmp");
        if build.exists() {
            fs::remove_dir_all(&build)?;
        }
        fs::create_dir_all(&build)?;
        let inner = format!("{source_package}/drivers/platform/x86/amd/hsmp");
        chroot(&[
            "tar",
            "-C",
            "/build/hsmp",
            "--strip-components=6",
            "-xf",
            &format!("/usr/src/{source_package}.tar.xz"),
            &format!("{inner}/hsmp.c"),
            &format!("{inner}/hsmp.h"),
            &format!("{inner}/hwmon.c"),
            &format!("{inner}/acpi.c"),
        ])?;
        chroot(&[
            "tar",
            "-C",
            "/build/hsmp",
            "--strip-components=4",
            "-xf",
            &format!("/usr/src/{source_package}.tar.xz"),
            &format!("{source_package}/arch/x86/kernel/msr.c"),
        ])?;
        fs::write(build.join("Kbuild"), &kbuild)?;
        {
            let _proc = ProcMount::new(root)?;
            chroot(&[
                "make",
                "-C",
                &format!("/usr/src/linux-headers-{abi}"),
                "M=/build/hsmp",
                "modules",
            ])?;
        }
        for ko in MODULES {
            fs::copy(build.join(ko), tmp.join(ko))
                .with_context(|| format!("the module build wrote no {ko}"))?;
        }

        // The kernel image, from its binary package; the module lists come with the headers'
        // linux-base package.
        let debs = root.join("build/debs");
        if debs.exists() {
            fs::remove_dir_all(&debs)?;
        }
        fs::create_dir_all(&debs)?;
        chroot(&[
            "sh",
            "-c",
            &format!("cd /build/debs && apt-get download linux-binary-{abi}={version}"),
        ])?;
        let unpacked = tmp.join("unpacked");
        for entry in fs::read_dir(&debs)? {
            run_logged(Command::new("dpkg-deb").arg("-x").arg(entry?.path()).arg(&unpacked), &log)?;
        }
        let modules = unpacked.join("usr/lib/modules").join(abi);
        let vmlinuz = [modules.join("vmlinuz"), unpacked.join(format!("boot/vmlinuz-{abi}"))]
            .into_iter()
            .find(|p| p.is_file())
            .with_context(|| format!("no vmlinuz in linux-binary-{abi}"))?;
        fs::copy(&vmlinuz, tmp.join("vmlinuz"))?;
        let lists = root.join("usr/lib/modules").join(abi);
        for name in ["modules.builtin", "modules.builtin.modinfo", "modules.order"] {
            fs::copy(lists.join(name), tmp.join(name))
                .with_context(|| format!("no {name} in {}", lists.display()))?;
        }
        let config = root.join(format!("usr/lib/modules/{abi}/config"));
        let config =
            if config.is_file() { config } else { root.join(format!("boot/config-{abi}")) };
        fs::copy(&config, tmp.join("config")).context("no kernel config in the headers")?;
        fs::remove_dir_all(&unpacked)?;
        fs::remove_dir_all(&debs)?;
        Ok(())
    })?;
    Ok((Kernel { choice: choice.clone(), dir }, was_cached))
}

/// Runs `args` in the chroot `root`, logged to `log`.
fn chroot_run(root: &Path, args: &[&str], log: &Path) -> Result<()> {
    let mut cmd = Command::new("chroot");
    cmd.arg(root).args(args).env("DEBIAN_FRONTEND", "noninteractive");
    run_logged(&mut cmd, log)
}

/// Installs the headers and the source of `choice` in the chroot `root` (a no-op for apt when
/// they are there already).
fn install_headers(root: &Path, choice: &KernelChoice, log: &Path) -> Result<()> {
    let KernelChoice { abi, version, source_package } = choice;
    chroot_run(root, &["apt-get", "update", "-q"], log)?;
    let headers = format!("linux-headers-{abi}={version}");
    let source = format!("{source_package}={version}");
    chroot_run(
        root,
        &[
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "-t",
            KERNEL_SUITE,
            &headers,
            &source,
        ],
        log,
    )
}

/// The VM test's `power_core` PMU module (`tests/vm/power-core/`), built in the chroot `root`
/// against the headers of `kernel`, as the driver modules are; cached beside them with their
/// stamp and its own sources as the key. Returns the `.ko` and whether it was cached.
pub fn power_core_module(cache: &Cache, root: &Path, kernel: &Kernel) -> Result<(PathBuf, bool)> {
    let kbuild = super::repo_file("tests/vm/power-core/Kbuild")?;
    let source = super::repo_file(&format!("tests/vm/power-core/{POWER_CORE_SOURCE}"))?;
    let kernel_key = fs::read_to_string(kernel.dir.join("stamp"))?;
    let dir = cache.dir.join("power-core");
    let key = format!("{kernel_key}\n{kbuild}\n{source}");
    let log = cache.log("power-core");
    let was_cached = cached(&dir, &key, |tmp| {
        let abi = &kernel.choice.abi;
        // The headers are there unless the chroot was rebuilt after the kernel step was cached.
        if !root.join(format!("usr/src/linux-headers-{abi}")).is_dir() {
            install_headers(root, &kernel.choice, &log)?;
        }
        let build = root.join("build/power-core");
        if build.exists() {
            fs::remove_dir_all(&build)?;
        }
        fs::create_dir_all(&build)?;
        fs::write(build.join("Kbuild"), &kbuild)?;
        fs::write(build.join(POWER_CORE_SOURCE), &source)?;
        {
            let _proc = ProcMount::new(root)?;
            chroot_run(
                root,
                &[
                    "make",
                    "-C",
                    &format!("/usr/src/linux-headers-{abi}"),
                    "M=/build/power-core",
                    "modules",
                ],
                &log,
            )?;
        }
        fs::copy(build.join(POWER_CORE_MODULE), tmp.join(POWER_CORE_MODULE))
            .with_context(|| format!("the module build wrote no {POWER_CORE_MODULE}"))?;
        Ok(())
    })?;
    Ok((dir.join(POWER_CORE_MODULE), was_cached))
}

/// The `power_core` PMU module's source file and module, in `tests/vm/power-core/`.
const POWER_CORE_SOURCE: &str = "power_core_sim.c";
/// See [`POWER_CORE_SOURCE`].
pub const POWER_CORE_MODULE: &str = "power_core_sim.ko";

/// Builds the project's `.deb` from the checkout, as the packaging check does: release
/// binaries, then `cargo deb --no-build`; its binaries must report `revision`, the checkout's.
/// Returns its path.
pub fn deb(cache: &Cache, revision: &str) -> Result<PathBuf> {
    crate::workspace::build_release_daemons()?;
    let out = cache.dir.join("run/deb");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(&out)?;
    crate::packaging::helpers::cargo_deb(&out)?;
    let deb = only_deb(&out)?;
    let built = deb_revision(&deb, &cache.dir.join("run/deb-binaries"))?;
    ensure!(
        built == revision,
        "the .deb's binaries report revision {built}, the checkout is at {revision}"
    );
    Ok(deb)
}

/// The one `.deb` in `dir`.
pub fn only_deb(dir: &Path) -> Result<PathBuf> {
    let debs: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    let [deb] = &debs[..] else {
        bail!("{} holds {} packages, expected one", dir.display(), debs.len())
    };
    Ok(deb.clone())
}

/// The revision both binaries of the `.deb` at `deb` report with `--version`, unpacked into
/// `scratch`; an error when they differ.
pub fn deb_revision(deb: &Path, scratch: &Path) -> Result<String> {
    if scratch.exists() {
        fs::remove_dir_all(scratch)?;
    }
    fs::create_dir_all(scratch)?;
    crate::workspace::output(Command::new("dpkg-deb").arg("-x").arg(deb).arg(scratch))?;
    let mut revisions = Vec::new();
    for binary in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        let text = crate::workspace::stdout_of(
            Command::new(scratch.join("usr/bin").join(binary)).arg("--version"),
        )?;
        revisions.push(
            version_revision(&text)
                .with_context(|| format!("{binary} --version names no revision: {text}"))?,
        );
    }
    fs::remove_dir_all(scratch)?;
    ensure!(
        revisions[0] == revisions[1],
        "{} has binaries of two revisions {revisions:?}",
        deb.display()
    );
    Ok(revisions.remove(0))
}

/// The revision in a `--version` text: `..., version 0.1.0 (branch: main, revision: X)`.
pub fn version_revision(text: &str) -> Option<String> {
    let rest = text.split_once("revision: ")?.1;
    let revision = rest.split(')').next()?.trim();
    (!revision.is_empty()).then(|| revision.to_string())
}

/// The package names of the `.deb`'s `Depends` (first alternative of each).
pub fn deb_depends(deb: &Path) -> Result<Vec<String>> {
    let field = stdout_of(Command::new("dpkg-deb").arg("--field").arg(deb).arg("Depends"))?;
    Ok(field
        .split(',')
        .filter_map(|d| d.split('|').next())
        .filter_map(|d| d.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The guest root as an uncompressed initramfs (`rootfs.cpio`) whose `/init` is systemd:
/// bookworm `minbase` with [`GUEST_PACKAGES`] and `depends`, the kernel's module lists and the
/// two driver modules. Documentation, locales and APT lists are left out.
pub fn rootfs(cache: &Cache, kernel: &Kernel, depends: &[String]) -> Result<(PathBuf, bool)> {
    let mut include: Vec<String> = GUEST_PACKAGES.iter().map(|s| s.to_string()).collect();
    include.extend(depends.iter().cloned());
    include.sort();
    include.dedup();
    let kernel_key = fs::read_to_string(kernel.dir.join("stamp"))?;
    let dir = cache.dir.join("rootfs");
    let key = format!("recipe {ROOTFS_RECIPE}\n{GUEST_SUITE} {}\n{kernel_key}", include.join(","));
    let log = cache.log("rootfs");
    let was_cached = cached(&dir, &key, |tmp| {
        let root = tmp.join("root");
        let debs = cache.dir.join("debs").join(GUEST_SUITE);
        fs::create_dir_all(&debs)?;
        run_logged(
            Command::new("debootstrap")
                .args(["--variant=minbase", &format!("--keyring={KEYRING}")])
                .arg(format!("--include={}", include.join(",")))
                .arg(format!("--cache-dir={}", debs.display()))
                .arg(GUEST_SUITE)
                .arg(&root)
                .arg(MIRROR),
            &log,
        )?;
        for strip in ["usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info"] {
            let p = root.join(strip);
            if p.exists() {
                fs::remove_dir_all(&p)?;
                fs::create_dir_all(&p)?;
            }
        }
        for empty in ["var/lib/apt/lists", "var/cache/apt"] {
            let p = root.join(empty);
            if p.exists() {
                fs::remove_dir_all(&p)?;
            }
            fs::create_dir_all(p.join("partial"))?;
        }
        let abi = &kernel.choice.abi;
        let modules = root.join("usr/lib/modules").join(abi);
        fs::create_dir_all(modules.join("extra"))?;
        for name in ["modules.builtin", "modules.builtin.modinfo", "modules.order"] {
            fs::copy(kernel.dir.join(name), modules.join(name))?;
        }
        for ko in MODULES {
            fs::copy(kernel.dir.join(ko), modules.join("extra").join(ko))?;
        }
        run_logged(Command::new("depmod").arg("-b").arg(&root).arg(abi), &log)?;
        let etc = root.join("etc");
        fs::write(etc.join("hostname"), "hsmp-vm\n")?;
        // A fixed id: not a first boot, so no presets are applied behind the package's back.
        fs::write(etc.join("machine-id"), "4d1a5b6c7d8e4f90a1b2c3d4e5f60718\n")?;
        fs::write(etc.join("fstab"), "")?;
        // The driver is loaded by the test once the package (and its udev rule) is installed,
        // as on a machine where the package was installed before the driver appeared.
        fs::write(
            etc.join("modprobe.d/vm-test-hold-hsmp.conf"),
            "# Removed by the VM test after installing the package.\nblacklist hsmp_acpi\n",
        )?;
        // SELinux enforcing with Debian's reference policy. The kernel command line selects
        // SELinux (guest::cmdline); the per-run /init loads the policy and labels the root.
        fs::write(etc.join("selinux/config"), "SELINUX=enforcing\nSELINUXTYPE=default\n")?;
        std::os::unix::fs::symlink("/lib/systemd/systemd", root.join("init"))?;
        // The labels of every file, computed here from the guest's own file contexts (setfiles
        // under TCG takes over a minute), restored by /init with setfattr; the per-run overlay
        // gets its own list from the same file contexts (kept beside the image).
        let contexts = root.join(FILE_CONTEXTS);
        fs::copy(&contexts, tmp.join("file_contexts"))?;
        let labels = selinux_labels(&root, &contexts)?;
        fs::create_dir_all(root.join("etc/vm-test"))?;
        fs::write(root.join("etc/vm-test/selinux-labels"), labels)?;
        let cpio = tmp.join("rootfs.cpio");
        cpio_dir(&root, &cpio, &log)?;
        fs::remove_dir_all(&root)?;
        Ok(())
    })?;
    Ok((dir.join("rootfs.cpio"), was_cached))
}

/// The guest's file contexts, relative to its root.
const FILE_CONTEXTS: &str = "etc/selinux/default/contexts/files/file_contexts";

/// The SELinux label of every file under `root` by the file contexts `contexts`, as a
/// `setfattr --restore` file with paths relative to `root` (`setfiles -n -v`, which works on a
/// host without SELinux). Paths that need escaping in that format are left out.
pub fn selinux_labels(root: &Path, contexts: &Path) -> Result<String> {
    let out = stdout_of(
        Command::new("setfiles").args(["-n", "-v", "-r"]).arg(root).arg(contexts).arg(root),
    )?;
    let prefix = root.to_string_lossy().into_owned();
    Ok(restore_file(&out, &prefix))
}

/// `setfiles -n -v` lines ("Would relabel PATH from OLD to NEW") as `setfattr --restore` input.
fn restore_file(setfiles: &str, root: &str) -> String {
    let mut out = String::new();
    for line in setfiles.lines() {
        let Some(rest) = line.strip_prefix("Would relabel ") else { continue };
        let (Some((path, _)), Some((_, label))) =
            (rest.rsplit_once(" from "), rest.rsplit_once(" to "))
        else {
            continue;
        };
        let Some(rel) = path.strip_prefix(root) else { continue };
        let rel = rel.trim_start_matches('/');
        let rel = if rel.is_empty() { "." } else { rel };
        if rel.contains('\\') || rel.contains('"') {
            continue;
        }
        out.push_str(&format!("# file: {rel}\nsecurity.selinux=\"{label}\"\n\n"));
    }
    out
}

/// The policy module compiled on the host against Debian's reference policy headers
/// (bookworm's, as the guest's policy), bzip2-compressed as the RPM ships it, and the static
/// confinement probe.
#[derive(Debug, Clone)]
pub struct SelinuxFiles {
    /// `amd_hsmp.pp.bz2`.
    pub module: PathBuf,
    /// `confine-probe`, from `tests/vm/confine-probe.c`.
    pub probe: PathBuf,
}

/// Builds [`SelinuxFiles`] into `run`.
pub fn selinux_files(cache: &Cache, run: &Path) -> Result<SelinuxFiles> {
    let log = cache.log("selinux");
    let build = run.join("selinux");
    fs::create_dir_all(&build)?;
    let module = crate::packaging::selinux::build_selinux_module(
        &crate::workspace::root().join("selinux"),
        &build,
    )?;
    run_logged(Command::new("bzip2").args(["-9", "-f"]).arg(&module), &log)?;
    let probe = run.join("confine-probe");
    run_logged(
        Command::new("cc")
            .args(["-static", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&probe)
            .arg(crate::workspace::root().join("tests/vm/confine-probe.c")),
        &log,
    )?;
    Ok(SelinuxFiles { module: module.with_extension("pp.bz2"), probe })
}

/// Writes the tree `dir` as a `newc` cpio archive `out`.
pub fn cpio_dir(dir: &Path, out: &Path, log: &Path) -> Result<()> {
    let file = fs::File::create(out)?;
    let find = Command::new("find")
        .arg(".")
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run find")?;
    let Some(list) = find.stdout else { bail!("find has no output") };
    let mut cmd = Command::new("cpio");
    cmd.args(["-o", "-H", "newc", "--quiet"]).current_dir(dir).stdin(list).stdout(file);
    let errors = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let status = cmd.stderr(errors).status().context("cannot run cpio")?;
    ensure!(status.success(), "cpio failed ({status}), see {}", log.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_read_from_version_output() {
        let text = "amd-hsmp-exporter, version 0.1.0 (branch: main, revision: 0123456789ab)\n  \
                    build user: x";
        assert_eq!(version_revision(text).as_deref(), Some("0123456789ab"));
        assert_eq!(version_revision("amd-hsmp-exporter 0.1.0"), None);
    }

    #[test]
    fn setfiles_output_becomes_a_setfattr_restore_file_relative_to_the_root() {
        let out = "Would relabel /r from (null) to system_u:object_r:root_t:s0\n\
                   Would relabel /r/usr/bin/a b from (null) to system_u:object_r:bin_t:s0\n\
                   Would relabel /r/odd\\012name from (null) to system_u:object_r:etc_t:s0\n\
                   setfiles: something else\n";
        assert_eq!(
            restore_file(out, "/r"),
            "# file: .\nsecurity.selinux=\"system_u:object_r:root_t:s0\"\n\n\
             # file: usr/bin/a b\nsecurity.selinux=\"system_u:object_r:bin_t:s0\"\n\n"
        );
    }
}
