//! `cargo xtask vm-test`: the real `amd_hsmp` driver in a QEMU (TCG) guest whose SMU mailbox
//! is answered on the host by the project's simulator, with the project's `.deb` installed in
//! the guest and run by real systemd; then the checks of [`checks`].
//!
//! Usage: `cargo xtask vm-test [--cache-dir DIR]`; the cache defaults to
//! `$AMD_HSMP_VM_CACHE`, else `$XDG_CACHE_HOME/amd-hsmp-exporter/vm`, else
//! `~/.cache/amd-hsmp-exporter/vm` (`/var/cache/amd-hsmp-exporter/vm` without `HOME`). Needs
//! root (debootstrap, chroot, mount) on Debian 12.

mod checks;
mod guest;
mod mailbox;
mod pmu;
mod prepare;
mod previous;
mod responder;
mod sim;

use anyhow::{Context, Result, bail};
use checks::Guest;
use prepare::Cache;
use responder::{GuestTopology, Responder};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sockets of the guest: two ACPI devices, one `/dev/hsmp`.
const SOCKETS: u32 = 2;
/// Cores per socket: enough that a wedged socket's timeouts (one of 100 ms per message of a sample)
/// outlast a scrape timeout the guest can meet under TCG.
const CORES: u32 = 6;
/// Cores per socket the Venice-like guest's package has room for, `CORES` of them present: more
/// than 256 threads a socket, as a Venice, so that socket 1's APIC ids start at 512.
const VENICE_APIC_CORES: u32 = 384;
/// How long the guest may take from QEMU's start to its agent's `READY`.
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// A file of the checkout, as text.
pub fn repo_file(rel: &str) -> Result<String> {
    let path = crate::workspace::root().join(rel);
    fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
}

/// The cache directory from the flag, the environment or the default.
fn cache_dir(args: &[String]) -> Result<PathBuf> {
    match args {
        [] => {}
        [flag, dir] if flag == "--cache-dir" => return Ok(PathBuf::from(dir)),
        [flag] if flag.starts_with("--cache-dir=") => {
            return Ok(PathBuf::from(&flag["--cache-dir=".len()..]));
        }
        other => bail!("unknown vm-test arguments {other:?} (usage: vm-test [--cache-dir DIR])"),
    }
    if let Some(dir) = std::env::var_os("AMD_HSMP_VM_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) => PathBuf::from(xdg),
        (None, Some(home)) => PathBuf::from(home).join(".cache"),
        // A service environment without HOME: the system's cache directory.
        (None, None) => PathBuf::from("/var/cache"),
    };
    Ok(base.join("amd-hsmp-exporter/vm"))
}

/// Steps with their timings, printed as they run and summed up at the end.
#[derive(Debug, Default)]
struct Steps {
    done: Vec<(String, Duration, String)>,
}

impl Steps {
    fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<(T, String)>) -> Result<T> {
        eprintln!("vm-test: {name} ...");
        let started = Instant::now();
        let (value, detail) = f().with_context(|| format!("step \"{name}\" failed"))?;
        let took = started.elapsed();
        eprintln!("vm-test: {name}: {detail} ({:.1} s)", took.as_secs_f64());
        self.done.push((name.to_string(), took, detail));
        Ok(value)
    }

    fn summary(&self) -> String {
        let mut out = String::from("step timings:\n");
        for (name, took, detail) in &self.done {
            let state = if detail.contains("cached") { "cached" } else { "ran" };
            out.push_str(&format!("  {:>7.1} s  {state:<6}  {name}\n", took.as_secs_f64()));
        }
        let total: Duration = self.done.iter().map(|(_, t, _)| *t).sum();
        out.push_str(&format!("  {:>7.1} s  total\n", total.as_secs_f64()));
        out
    }
}

fn cached_word(cached: bool) -> &'static str {
    if cached { "cached" } else { "built" }
}

/// Runs the whole VM test.
pub fn run(args: &[String]) -> Result<()> {
    let cache = Cache { dir: cache_dir(args)? };
    fs::create_dir_all(&cache.dir)
        .with_context(|| format!("cannot create the cache {}", cache.dir.display()))?;
    let _lock = lock(&cache.dir)?;
    remove_stale_ram();
    let run_dir = fresh_run_dir(&cache)?;
    let mut steps = Steps::default();

    let (kernel, power_core) = build_kernel(&mut steps, &cache)?;
    let (deb, releases) = build_debs(&mut steps, &cache)?;
    let guest_files = (&kernel, power_core.as_path(), deb.as_path(), &releases);
    let (initrd, ssdts) = build_guest(&mut steps, &cache, &run_dir, guest_files)?;
    let verdicts = check_guests(&mut steps, &run_dir, &kernel, (&initrd, &ssdts), &releases)?;
    report(&steps, &verdicts, &run_dir)
}

/// The run's first step: the cache's `run` and `logs` folders emptied and created afresh; the
/// `run` folder.
fn fresh_run_dir(cache: &Cache) -> Result<PathBuf> {
    let run_dir = cache.dir.join("run");
    if run_dir.exists() {
        fs::remove_dir_all(&run_dir)
            .with_context(|| format!("cannot empty {}", run_dir.display()))?;
    }
    let logs = cache.dir.join("logs");
    if logs.exists() {
        fs::remove_dir_all(&logs)?;
    }
    fs::create_dir_all(&logs)?;
    fs::create_dir_all(&run_dir)?;
    eprintln!("vm-test: cache {} (logs in {})", cache.dir.display(), logs.display());
    Ok(run_dir)
}

/// The host tools, then the kernel chosen and built with its modules in the build chroot, and
/// the `power_core` PMU module built against it: the kernel and the module's path.
fn build_kernel(steps: &mut Steps, cache: &Cache) -> Result<(prepare::Kernel, PathBuf)> {
    steps.run("host tools", || Ok(((), prepare::host_tools(cache)?)))?;
    let choice = steps.run("kernel version", || {
        let c = prepare::choose_kernel(cache)?;
        let detail = format!("linux {} ({}) from trixie-backports", c.abi, c.version);
        Ok((c, detail))
    })?;
    let chroot = steps.run("build chroot (trixie buildd)", || {
        let (root, cached) = prepare::build_chroot(cache)?;
        Ok((
            root,
            format!("{} {}", root_display(&cache.dir.join("build-chroot")), cached_word(cached)),
        ))
    })?;
    let kernel = steps.run("kernel and amd_hsmp modules", || {
        let (k, cached) = prepare::kernel(cache, &chroot, &choice)?;
        Ok((
            k,
            format!(
                "hsmp_common.ko, hsmp_acpi.ko, msr.ko for {} {}",
                choice.abi,
                cached_word(cached)
            ),
        ))
    })?;
    let power_core = steps.run("power_core PMU module", || {
        let (ko, cached) = prepare::power_core_module(cache, &chroot, &kernel)?;
        Ok((ko, format!("{} {}", prepare::POWER_CORE_MODULE, cached_word(cached))))
    })?;
    Ok((kernel, power_core))
}

/// This checkout's `.deb`, and the previous release's: the former's path and both releases.
fn build_debs(steps: &mut Steps, cache: &Cache) -> Result<(PathBuf, previous::Releases)> {
    let root = crate::workspace::root();
    let current = previous::current_revision(&root)?;
    let deb = steps.run("project .deb", || {
        let deb = prepare::deb(cache, &current)?;
        let detail = format!("{} built, revision {current}", root_display(&deb));
        Ok((deb, detail))
    })?;
    let releases = steps.run("previous release's .deb", || {
        let version = crate::packaging::workspace_version(&root)?;
        let release = previous::previous(&root, &version)?;
        let target = crate::workspace::target_dir(&root);
        let (previous_deb, cached) = previous::deb(cache, &root, &target, &release)?;
        let detail = format!(
            "{} ({}, revision {}) {}",
            release.name,
            release.commit,
            release.revision,
            cached_word(cached)
        );
        Ok((
            previous::Releases { previous: (release, previous_deb), current: current.clone() },
            detail,
        ))
    })?;
    Ok((deb, releases))
}

/// The guest's root, its SELinux files, the initramfs over it with the kernel's `power_core`
/// module and both packages, and the SSDTs: the initramfs and the SSDTs.
fn build_guest(
    steps: &mut Steps,
    cache: &Cache,
    run_dir: &Path,
    (kernel, power_core, deb, releases): (&prepare::Kernel, &Path, &Path, &previous::Releases),
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let rootfs = steps.run("guest root (bookworm, systemd)", || {
        let depends = prepare::deb_depends(deb)?;
        let (cpio, cached) = prepare::rootfs(cache, kernel, &depends)?;
        let size = fs::metadata(&cpio)?.len() >> 20;
        Ok((cpio, format!("{size} MiB initramfs {}", cached_word(cached))))
    })?;
    let selinux = steps.run("SELinux module and confinement probe", || {
        let files = prepare::selinux_files(cache, run_dir)?;
        Ok((files, "amd_hsmp.pp.bz2 (Debian's reference policy), confine-probe built".into()))
    })?;
    let initrd = steps.run("initramfs with the package and the agent", || {
        let power_core = (power_core, kernel.choice.abi.as_str());
        let debs = (deb, releases.previous.1.as_path());
        let initrd = overlay(cache, run_dir, &rootfs, debs, &selinux, power_core)?;
        Ok((initrd, "built".to_string()))
    })?;
    let ssdts = steps.run("SSDT (one AMDI0097 device per socket)", || {
        let ssdts = guest::ssdts(run_dir, SOCKETS, &cache.log("iasl"))?;
        Ok((ssdts, format!("{SOCKETS} tables compiled")))
    })?;
    Ok((initrd, ssdts))
}

/// Boots each guest, Milan's then Venice's, on `kernel` with the `initrd` and `ssdts` built, and
/// runs its checks: the verdicts of both.
fn check_guests(
    steps: &mut Steps,
    run_dir: &Path,
    kernel: &prepare::Kernel,
    (initrd, ssdts): (&Path, &[PathBuf]),
    releases: &previous::Releases,
) -> Result<Vec<checks::Verdict>> {
    let mut verdicts = Vec::new();
    for guest in [Guest::Milan, Guest::Venice] {
        let run = match guest {
            Guest::Milan => run_dir.to_path_buf(),
            Guest::Venice => run_dir.join("venice"),
        };
        fs::create_dir_all(&run)?;
        let apic_cores = match guest {
            Guest::Milan => CORES,
            Guest::Venice => VENICE_APIC_CORES,
        };
        let spec = guest::BootSpec {
            kernel: kernel.dir.join("vmlinuz"),
            initrd: initrd.to_path_buf(),
            ssdts: ssdts.to_vec(),
            sockets: SOCKETS,
            cores: CORES,
            apic_cores,
            cpu: guest.cpu(),
            ram: PathBuf::from(format!("/dev/shm/amd-hsmp-vm-{}", std::process::id())),
            run,
        };
        verdicts.extend(boot_and_check(steps, guest, &spec, releases)?);
    }
    Ok(verdicts)
}

/// The run's last step: the step timings and the checks' table, printed and written to the run
/// folder's `summary.txt`; an error naming the checks that failed.
fn report(steps: &Steps, verdicts: &[checks::Verdict], run_dir: &Path) -> Result<()> {
    let summary = steps.summary();
    eprint!("vm-test: {summary}");
    let mut table = String::from("checks:\n");
    for v in verdicts {
        table.push_str(&format!(
            "  {:<3} {}  {:>5.1} s  {}\n",
            v.id,
            if v.pass { "PASS" } else { "FAIL" },
            v.seconds,
            v.name
        ));
    }
    eprint!("vm-test: {table}");
    fs::write(run_dir.join("summary.txt"), format!("{summary}{table}"))?;
    let failed: Vec<&str> = verdicts.iter().filter(|v| !v.pass).map(|v| v.id.as_str()).collect();
    let passed = verdicts.len() - failed.len();
    if let Some(selinux) = verdicts.iter().find(|v| v.id == "A") {
        println!("{}", selinux.name);
    }
    println!("vm-test: {passed} passed, {} failed", failed.len());
    if !failed.is_empty() {
        bail!("VM checks failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Boots `guest` as `spec` says, with a responder at protocol 7 on its mailboxes, runs its
/// checks and powers it off.
fn boot_and_check(
    steps: &mut Steps,
    guest: Guest,
    spec: &guest::BootSpec,
    releases: &previous::Releases,
) -> Result<Vec<checks::Verdict>> {
    let ram = guest::RamFile(spec.ram.clone());
    let topology =
        GuestTopology { sockets: spec.sockets, cores: spec.cores, apic_cores: spec.apic_cores };
    let responder = steps.run(&format!("SMU responder ({guest:?})"), || {
        ram.create()?;
        let responder = Responder::start(&ram.0, topology, 7)?;
        let fw = responder.machine();
        // Values the checks recognise: a distinct boost limit per core, PROCHOT on socket 1.
        for socket in 0..SOCKETS {
            for core in 0..CORES {
                fw.firmware().set_boost_limit(socket, core, 3000 + 200 * socket + 25 * core)?;
            }
        }
        fw.firmware().set_prochot(1, true)?;
        Ok((
            responder,
            format!(
                "{SOCKETS} mailboxes in {}, protocol 7, {CORES} cores per socket",
                ram.0.display()
            ),
        ))
    })?;
    let mut vm = steps.run(&format!("boot (TCG, -cpu {}) to the agent", spec.cpu), || {
        let vm = guest::Vm::boot(spec, BOOT_TIMEOUT)?;
        Ok((vm, format!("console in {}", spec.run.join("console.log").display())))
    })?;
    let verdicts = steps.run(&format!("checks ({guest:?})"), || {
        let verdicts = checks::run_all(guest, &mut vm, &responder, releases, &mut |v| {
            eprintln!(
                "vm-test: check {} {}: {}",
                v.id,
                if v.pass { "PASS" } else { "FAIL" },
                v.name
            );
            for line in v.detail.lines() {
                eprintln!("vm-test:     {line}");
            }
        });
        match verdicts {
            Ok(v) => {
                let passed = v.iter().filter(|v| v.pass).count();
                let detail = format!("{passed} of {} passed", v.len());
                Ok((v, detail))
            }
            Err(e) => Err(e.context(format!("guest console:\n{}", vm.console_tail(30)))),
        }
    })?;
    steps.run(&format!("power off ({guest:?})"), || {
        vm.power_off(Duration::from_secs(60))?;
        Ok(((), "guest stopped".to_string()))
    })?;
    drop(responder);
    drop(ram);
    Ok(verdicts)
}

/// Holds an exclusive lock on the cache for the whole run: two runs would share `run/`.
fn lock(dir: &Path) -> Result<fs::File> {
    let file = fs::File::create(dir.join("lock"))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |e| anyhow::anyhow!("another vm-test is using the cache {} ({e})", dir.display()),
    )?;
    Ok(file)
}

/// Removes the guest RAM files of runs whose process is gone (killed before cleaning up).
fn remove_stale_ram() {
    let Ok(entries) = fs::read_dir("/dev/shm") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("amd-hsmp-vm-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn root_display(p: &Path) -> String {
    p.display().to_string()
}

/// The per-run initramfs: the cached root, then a second archive with the package and the
/// previous release's (check U), the timing
/// loop, the `power_core` PMU module for kernel `abi` (loaded by check P, from the modules
/// directory: SELinux lets `insmod` load only files labelled as modules) and the agent with its
/// unit enabled.
fn overlay(
    cache: &Cache,
    run: &Path,
    rootfs: &Path,
    (deb, previous_deb): (&Path, &Path),
    selinux: &prepare::SelinuxFiles,
    (power_core, abi): (&Path, &str),
) -> Result<PathBuf> {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let stage = run.join("overlay");
    let set_mode = |p: &Path, mode: u32| fs::set_permissions(p, fs::Permissions::from_mode(mode));
    for dir in ["root/vm", "usr/local/sbin", "etc/systemd/system/multi-user.target.wants"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    set_mode(&stage.join("root"), 0o700)?;
    fs::copy(deb, stage.join("root/vm/amd-hsmp-exporter.deb"))?;
    fs::copy(previous_deb, stage.join("root/vm/amd-hsmp-exporter-previous.deb"))?;
    fs::write(stage.join("root/vm/hsmp-time.pl"), repo_file("tests/vm/hsmp-time.pl")?)?;
    let extra = stage.join("usr/lib/modules").join(abi).join("extra");
    fs::create_dir_all(&extra)?;
    fs::copy(power_core, extra.join(prepare::POWER_CORE_MODULE))?;
    // SELinux: the first process, the policy module and its install script, the probe.
    let init = stage.join("init");
    fs::write(&init, repo_file("tests/vm/init-selinux")?)?;
    set_mode(&init, 0o755)?;
    fs::write(stage.join("root/vm/install.sh"), repo_file("selinux/install.sh")?)?;
    fs::copy(&selinux.module, stage.join("root/vm/amd_hsmp.pp.bz2"))?;
    let probe = stage.join("root/vm/confine-probe");
    fs::copy(&selinux.probe, &probe)?;
    set_mode(&probe, 0o755)?;
    let agent = stage.join("usr/local/sbin/vm-agent");
    fs::write(&agent, repo_file("tests/vm/vm-agent")?)?;
    set_mode(&agent, 0o755)?;
    fs::write(
        stage.join("etc/systemd/system/vm-agent.service"),
        repo_file("tests/vm/vm-agent.service")?,
    )?;
    symlink(
        "/etc/systemd/system/vm-agent.service",
        stage.join("etc/systemd/system/multi-user.target.wants/vm-agent.service"),
    )?;
    // The overlay's labels, from the guest's file contexts, restored by /init after the root's.
    fs::create_dir_all(stage.join("etc/vm-test"))?;
    let contexts = rootfs.with_file_name("file_contexts");
    let labels = prepare::selinux_labels(&stage, &contexts)?;
    fs::write(stage.join("etc/vm-test/selinux-labels-overlay"), labels)?;
    let overlay = run.join("overlay.cpio");
    prepare::cpio_dir(&stage, &overlay, &cache.log("overlay"))?;
    let initrd = run.join("initrd.cpio");
    fs::copy(rootfs, &initrd)?;
    let mut out = fs::OpenOptions::new().append(true).open(&initrd)?;
    std::io::copy(&mut fs::File::open(&overlay)?, &mut out)?;
    Ok(initrd)
}
