//! Unit tests of `--check`: each check on fixture trees and the simulator, and the verdicts an
//! operator reads.

use super::*;
use amd_hsmp_device::messages::{LimitReasons, SocketFreqLimit};
use amd_hsmp_sim::{FaultGroup, FirmwareConfig, Machine, Mode, Profile, Target};
use std::fs;
use std::sync::Arc;

fn static_machine(profile: Profile) -> Arc<Machine> {
    Machine::new(profile.spec(), FirmwareConfig::new(Mode::Static))
}

/// Runs every check against `machine` in `--simulate` mode (no node, driver or labels), with a
/// socket path where nothing listens; `wait` stands for the energy window, and the passes of
/// energy reads take no time.
fn run_simulated(
    machine: &Arc<Machine>,
    msr: bool,
    wait: &mut dyn FnMut() -> Duration,
) -> Vec<Line> {
    run_simulated_streaming(machine, msr, wait, &mut |_| {})
}

/// [`run_simulated`], handing each line to `emit` as it is decided.
fn run_simulated_streaming(
    machine: &Arc<Machine>,
    msr: bool,
    wait: &mut dyn FnMut() -> Duration,
    emit: &mut dyn FnMut(&Line),
) -> Vec<Line> {
    let dir = tempfile::tempdir().unwrap();
    let hsmp = machine.hsmp_opener();
    let msr_opener = machine.msr_opener();
    let accounts = Accounts::default();
    let no_labels = |_: &Path| None;
    let mut inputs = Inputs {
        procfs: &dir.path().join("proc"),
        sysfs: &dir.path().join("sys"),
        hsmp_device: &dir.path().join("hsmp"),
        hsmp: &hsmp,
        msr: if msr { Some(&msr_opener) } else { None },
        perf: None,
        msr_root: &dir.path().join("cpu"),
        etc: &dir.path().join("etc"),
        socket: &dir.path().join("broker.sock"),
        accounts: &accounts,
        labels: &no_labels,
        energy_wait: wait,
        energy_clock: &mut stopped_clock(),
        simulated: Some(machine.topology().clone()),
    };
    run_streaming(&mut inputs, emit)
}

fn line<'a>(lines: &'a [Line], name: &str) -> &'a Line {
    lines.iter().find(|l| l.name == name).unwrap_or_else(|| panic!("no {name} line in {lines:#?}"))
}

fn fix(line: &Line) -> &str {
    line.fix.as_deref().unwrap_or("")
}

/// A clock that does not move: a pass of energy reads takes no time on it.
fn stopped_clock() -> impl FnMut() -> Instant {
    let now = Instant::now();
    move || now
}

/// 2 J per core during a wait said to last one second: 2 W per core.
fn two_watts(machine: &Arc<Machine>) -> impl FnMut() -> Duration + '_ {
    move || {
        machine.firmware().advance_all_energy(2.0).unwrap();
        Duration::from_secs(1)
    }
}

#[test]
fn family_0x17_fails_and_says_dev_hsmp_can_never_exist() {
    let l = cpu("AuthenticAMD", 0x17, 0x31);
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(l.found.contains("/dev/hsmp can never exist"), "{l}");
    assert!(fix(&l).contains("--collector.core-energy.msr-fallback"), "{l}");
}

#[test]
fn milan_to_turin_pass_and_other_parts_fail() {
    assert_eq!(cpu("AuthenticAMD", 0x19, 0x01).verdict, Verdict::Pass);
    assert_eq!(cpu("AuthenticAMD", 0x1A, 0x11).verdict, Verdict::Pass);
    assert_eq!(cpu("AuthenticAMD", 0x15, 0x01).verdict, Verdict::Fail);
    assert_eq!(cpu("GenuineIntel", 0x06, 0x8f).verdict, Verdict::Fail);
}

#[test]
fn an_unloaded_driver_fails_naming_modprobe() {
    let sys = tempfile::tempdir().unwrap();
    let l = driver(sys.path(), false, false);
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(fix(&l).starts_with("modprobe amd_hsmp"), "{l}");

    fs::create_dir_all(sys.path().join("module/hsmp_acpi")).unwrap();
    let l = driver(sys.path(), false, true);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.contains("hsmp_acpi"), "{l}");
    // A built-in driver has no module directory, but its node exists.
    assert_eq!(driver(tempfile::tempdir().unwrap().path(), false, true).verdict, Verdict::Pass);
}

/// Issue 28: a Venice (family 0x1A, model 0x50) or a family after 0x1A failed `cpu` ("no HSMP
/// on this family") though nothing is gated on it; now it is a warning naming what is tried.
#[test]
fn an_unknown_model_or_newer_family_warns_naming_what_the_broker_tries() {
    for (family, model) in [(0x1A, 0x50), (0x1A, 0x5F), (0x1B, 0x00), (0x19, 0x90)] {
        let l = cpu("AuthenticAMD", family, model);
        assert_eq!(l.verdict, Verdict::Warn, "{l}");
        assert!(l.found.contains("GET_PROTO_VER") && l.found.contains("ENOMSG"), "{l}");
    }
    assert!(cpu("AuthenticAMD", 0x1A, 0x02).found.contains("Turin"));
    assert!(cpu("AuthenticAMD", 0x19, 0xA0).found.contains("Bergamo"));
}

/// Issue 28: where the firmware describes HSMP in ACPI (Venice binds only that way) and
/// `hsmp_acpi` is not loaded, the line quotes the kernel's own hint and names the module.
#[test]
fn an_acpi_device_without_hsmp_acpi_fails_quoting_the_kernels_hint() {
    let sys = tempfile::tempdir().unwrap();
    fs::create_dir_all(sys.path().join("bus/acpi/devices/AMDI0097:00")).unwrap();
    fs::create_dir_all(sys.path().join("module/amd_hsmp")).unwrap();
    let l = driver(sys.path(), false, false);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.contains("\"HSMP is supported through ACPI on this platform"), "{l}");
    assert!(l.found.contains("only amd_hsmp is loaded"), "{l}");
    assert!(fix(&l).starts_with("modprobe hsmp_acpi"), "{l}");

    fs::create_dir_all(sys.path().join("module/hsmp_acpi")).unwrap();
    let l = driver(sys.path(), false, true);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.contains("(ACPI device AMDI0097)"), "{l}");
}

const BROKER_GID: u32 = 990;

fn accounts() -> Accounts {
    Accounts { broker_gid: Some(BROKER_GID), exporter: Some(Account { uid: 991, gids: vec![991] }) }
}

fn char_node(gid: u32, mode: u32) -> Node {
    Node { char_device: true, socket: false, fuse: false, uid: 0, gid, mode }
}

#[test]
fn the_packaged_device_node_passes() {
    let l =
        device_node(Path::new("/dev/hsmp"), Some(char_node(BROKER_GID, 0o640)), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
}

/// Issue 28: a file a FUSE filesystem serves (the test suite's fake device) is not the driver's
/// node: with the packaged ownership it is a warning saying so, never a pass; without it, the
/// same failure as a character device's. A plain file stays a failure.
#[test]
fn a_fuse_node_with_the_packaged_ownership_warns_that_it_is_no_driver_node() {
    let fuse =
        |gid, mode| Node { char_device: false, socket: false, fuse: true, uid: 0, gid, mode };
    let l = device_node(Path::new("/dev/hsmp"), Some(fuse(BROKER_GID, 0o640)), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(l.found.contains("served by a FUSE filesystem, not the driver's character device"));
    let l = device_node(Path::new("/dev/hsmp"), Some(fuse(0, 0o600)), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    let plain = Node { fuse: false, ..fuse(BROKER_GID, 0o640) };
    let l = device_node(Path::new("/dev/hsmp"), Some(plain), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.ends_with("is not a character device"), "{l}");
}

#[test]
fn a_node_the_broker_group_cannot_read_fails_naming_udevadm() {
    let l = device_node(Path::new("/dev/hsmp"), Some(char_node(0, 0o600)), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(fix(&l).starts_with("udevadm trigger"), "{l}");
}

#[test]
fn the_drivers_own_0644_only_warns() {
    let l = device_node(Path::new("/dev/hsmp"), Some(char_node(0, 0o644)), &accounts(), false);
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(fix(&l).starts_with("udevadm trigger"), "{l}");
}

#[test]
fn a_missing_node_names_the_bios_and_is_skipped_on_rome() {
    let l = device_node(Path::new("/dev/hsmp"), None, &accounts(), false);
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(fix(&l).contains("BIOS"), "{l}");
    assert_eq!(device_node(Path::new("/dev/hsmp"), None, &accounts(), true).verdict, Verdict::Skip);
}

/// A selinuxfs fixture: `enforce`, and the module's boolean when `boolean` is given.
fn selinuxfs(enforce: &str, boolean: Option<&str>) -> tempfile::TempDir {
    let sys = tempfile::tempdir().unwrap();
    let fs_dir = sys.path().join("fs/selinux");
    fs::create_dir_all(fs_dir.join("booleans")).unwrap();
    fs::write(fs_dir.join("enforce"), enforce).unwrap();
    if let Some(value) = boolean {
        fs::write(fs_dir.join("booleans").join(MSR_BOOLEAN), value).unwrap();
    }
    sys
}

#[test]
fn selinux_is_read_from_selinuxfs() {
    assert_eq!(Selinux::read(tempfile::tempdir().unwrap().path()), Selinux::Disabled);
    let sys = selinuxfs("1", Some("0 0"));
    assert_eq!(
        Selinux::read(sys.path()),
        Selinux::Enabled { enforcing: true, msr_boolean: Some(false) }
    );
    let sys = selinuxfs("0", None);
    assert_eq!(Selinux::read(sys.path()), Selinux::Enabled { enforcing: false, msr_boolean: None });
}

#[test]
fn selinux_lines_name_the_package_and_the_boolean() {
    assert_eq!(selinux_state(&Selinux::Disabled, true).verdict, Verdict::Pass);
    let no_module = Selinux::Enabled { enforcing: true, msr_boolean: None };
    let l = selinux_state(&no_module, false);
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(fix(&l).contains("amd-hsmp-exporter-selinux"), "{l}");

    let off = Selinux::Enabled { enforcing: true, msr_boolean: Some(false) };
    let l = selinux_state(&off, false);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert_eq!(l.found, "enforcing, module amd_hsmp loaded, amd_hsmp_broker_use_msr off");
    let l = selinux_state(&off, true);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert_eq!(fix(&l), "setsebool -P amd_hsmp_broker_use_msr on");

    let permissive = Selinux::Enabled { enforcing: false, msr_boolean: Some(true) };
    assert_eq!(selinux_state(&permissive, true).verdict, Verdict::Warn);
}

#[test]
fn a_device_with_the_generic_label_fails_naming_restorecon() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("hsmp");
    fs::write(&node, "").unwrap();
    let wanted = [(node.clone(), "amd_hsmp_device_t")];
    let generic = |_: &Path| Some("system_u:object_r:device_t:s0".to_string());
    let l = label_line(&wanted, &generic);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.contains("is system_u:object_r:device_t:s0, not amd_hsmp_device_t"), "{l}");
    assert_eq!(fix(&l), format!("restorecon -RFv {}", node.display()));

    let ours = |_: &Path| Some("system_u:object_r:amd_hsmp_device_t:s0".to_string());
    assert_eq!(label_line(&wanted, &ours).verdict, Verdict::Pass);
}

/// Regression (VM tier, check K): `amd-hsmp-check` failed its `labels` line on a healthy
/// node because it looked for the broker's label on its own executable, which the policy leaves
/// `bin_t`. The executable it checks is the broker beside it.
#[test]
fn the_labels_line_checks_the_broker_beside_the_check_not_the_check_itself() {
    let procfs = tempfile::tempdir().unwrap();
    fs::create_dir(procfs.path().join("self")).unwrap();
    std::os::unix::fs::symlink("/usr/bin/amd-hsmp-check", procfs.path().join("self/exe")).unwrap();
    assert_eq!(broker_executable(procfs.path()), Path::new("/usr/bin/amd-hsmp-broker"));
}

#[test]
fn a_socket_the_exporters_group_cannot_write_fails_naming_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.sock");
    let root_only =
        Node { char_device: false, socket: true, fuse: false, uid: 0, gid: 0, mode: 0o660 };
    let l = socket(&path, Some(root_only), &accounts());
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.contains("through group amd-hsmp-exporter"), "{l}");
    assert!(fix(&l).contains("SocketGroup=amd-hsmp-exporter"), "{l}");

    let missing = socket(&path, None, &accounts());
    assert_eq!(missing.verdict, Verdict::Fail);
    assert!(fix(&missing).contains("amd-hsmp-broker.socket"), "{missing}");
}

#[test]
fn a_simulated_broker_s_missing_socket_is_fixed_by_starting_the_simulator_not_systemctl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.sock");
    let l = simulated_socket(&path, None);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(!fix(&l).contains("systemctl"), "{l}");
    assert!(fix(&l).contains("amd-hsmp-sim-broker --simulate PROFILE --listen"), "{l}");
}

#[test]
fn a_reachable_socket_passes_once_the_broker_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        assert!(matches!(Request::read(&mut conn).unwrap(), Request::Hello { .. }));
        let hello = Reply::Hello {
            protocol_version: PROTOCOL_VERSION,
            broker_version: "9.9.9".into(),
            instance: 1,
            simulated: None,
        };
        hello.write(&mut conn).unwrap();
        assert_eq!(Request::read(&mut conn).unwrap(), Request::Topology);
        let topology = static_machine(Profile::Milan1p).topology().clone();
        Reply::Topology(topology).write(&mut conn).unwrap();
    });
    let group_rw =
        Node { char_device: false, socket: true, fuse: false, uid: 0, gid: 991, mode: 0o660 };
    let l = socket(&path, Some(group_rw), &accounts());
    server.join().unwrap();
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.ends_with("broker 9.9.9 answers, 64 cores"), "{l}");
}

#[test]
fn a_healthy_turin_passes_every_device_check() {
    let machine = static_machine(Profile::Turin2p);
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    for name in ["cpu", "protocol", "cores", "boost", "frequency-limit", "energy"] {
        assert_eq!(line(&lines, name).verdict, Verdict::Pass, "{lines:#?}");
    }
    let protocol = line(&lines, "protocol");
    assert!(protocol.found.starts_with("HSMP protocol 7 on 2 socket(s)"), "{protocol}");
    assert!(
        protocol.found.contains("boost limit, PROCHOT, RAPL energy, package energy"),
        "{protocol}"
    );
    assert!(line(&lines, "energy").found.contains("384 of 384 cores advancing"), "{lines:#?}");
    assert!(line(&lines, "energy").found.contains("(2.00 W per core on average)"));
    // Nothing listens on the socket: the one failure, and the run fails.
    assert_eq!(line(&lines, "socket").verdict, Verdict::Fail);
    assert!(!passed(&lines));
    assert!(passed(&lines.iter().filter(|l| l.name != "socket").cloned().collect::<Vec<_>>()));
}

#[test]
fn a_core_that_does_not_answer_fails_naming_it() {
    let machine = static_machine(Profile::Turin2p);
    let core = machine.topology().cores[5].clone();
    machine.update_faults(|f| {
        f.errno.insert((FaultGroup::BoostLimit, Target::Apic(core.apic_id)), libc::EIO);
    });
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let l = line(&lines, "cores");
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(
        l.found.starts_with(&format!(
            "1 of 384 cores do not answer: socket 0 core {} (APIC id {})",
            core.core, core.apic_id
        )),
        "{l}"
    );
}

#[test]
fn energy_that_does_not_advance_fails() {
    let machine = static_machine(Profile::Turin2p);
    let lines = run_simulated(&machine, false, &mut || Duration::from_secs(2));
    let l = line(&lines, "energy");
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.contains("0 of 384 cores advancing"), "{l}");
}

/// Regression: each core's energy delta was divided by the wait alone, though a core's two
/// reads are also a pass of reads (one mailbox message per core) apart, so `--check`
/// overstated power by about a pass over the wait, more under load. Here each pass takes 1 s
/// and the wait 2 s on the test's clock: the old division reported 3 W of the cores' 2 W.
#[test]
fn the_energy_check_divides_by_the_time_between_a_cores_two_reads_not_the_wait_alone() {
    let line = |steps: [u64; 8]| {
        // Four cores at 2 W each, counted in 2^-10 J: a core's counter at `t` ms is
        // 2 J/s × t × 1024 / 1000, whole at every multiple of 125 ms. Read `k` (of both passes)
        // samples the counter, then takes `steps[k]` ms.
        let origin = Instant::now();
        let now = std::cell::Cell::new(Duration::ZERO);
        let reads = std::cell::Cell::new(0);
        let read = |_core: usize| {
            let (t, k) = (now.get(), reads.get());
            reads.set(k + 1);
            now.set(t + Duration::from_millis(steps[k]));
            let counter = u64::try_from(t.as_millis() * 2048 / 1000).unwrap();
            Ok(amd_hsmp_proto::Energy { counter, esu: 10 })
        };
        let mut wait = || {
            now.set(now.get() + Duration::from_secs(2));
            Duration::from_secs(2)
        };
        let mut clock = || origin + now.get();
        let l = energy_over("HSMP RAPL", 4, read, &mut wait, &mut clock);
        assert_eq!(l.verdict, Verdict::Pass, "{l}");
        l.found
    };
    assert_eq!(
        line([250; 8]),
        "HSMP RAPL: 4 of 4 cores advancing over 3.0 s, 8.0 W in total (2.00 W per core on \
         average)"
    );
    // A slow first read (a pass that starts cold) puts the first core 3.25 s from its second
    // read and the others 3 s: each core's rate is over its own interval, not the first
    // pass's length and the wait (7.5 W) nor the wait alone (12.25 W).
    assert_eq!(
        line([500, 250, 250, 250, 250, 250, 250, 250]),
        "HSMP RAPL: 4 of 4 cores advancing over 3.1 s, 8.0 W in total (2.00 W per core on \
         average)"
    );
}

#[test]
fn implausible_power_fails() {
    let before = [Ok(0.0), Ok(0.0)];
    let after = [Ok(1.0), Ok(500.0)];
    let l = energy_rates("HSMP RAPL", &before, &after, &[Duration::from_secs(1); 2]);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(l.found.contains("core index 1: 500.0 W"), "{l}");
}

/// The check and the MSR fallback's restart rule share one bound on a core's power: a rate the
/// broker would count as energy is plausible here, one it would take for a restart is not.
#[test]
fn implausible_means_beyond_the_most_a_core_can_draw() {
    let just_under = [Ok(crate::counters::MAX_CORE_WATTS - 1.0)];
    let l = energy_rates("MSR", &[Ok(0.0)], &just_under, &[Duration::from_secs(1)]);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    let just_over = [Ok(crate::counters::MAX_CORE_WATTS + 1.0)];
    let l = energy_rates("MSR", &[Ok(0.0)], &just_over, &[Duration::from_secs(1)]);
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
}

#[test]
fn a_part_without_rapl_messages_only_warns_about_energy() {
    let machine = static_machine(Profile::Milan1p);
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let l = line(&lines, "energy");
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(fix(l).contains("MSR fallback"), "{l}");
    assert!(line(&lines, "protocol").found.starts_with("HSMP protocol 4"), "{lines:#?}");
}

#[test]
fn the_frequency_limit_line_says_what_holds_each_socket_down() {
    let machine = static_machine(Profile::Turin2p);
    let ppt = SocketFreqLimit { mhz: 3100, reasons: LimitReasons::PPT | LimitReasons::TDC };
    machine.firmware().set_freq_limit(1, ppt).unwrap();
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let l = line(&lines, "frequency-limit");
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.ends_with("socket 0 3700 MHz (opn_max); socket 1 3100 MHz (tdc, ppt)"), "{l}");
}

#[test]
fn firmware_without_the_frequency_limit_message_only_warns() {
    let machine = static_machine(Profile::Milan1p);
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let l = line(&lines, "frequency-limit");
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(l.found.starts_with("GET_SOCKET_FREQ_LIMIT is not answered"), "{l}");
}

#[test]
fn the_msr_fallback_reads_energy_and_names_its_missing_setup() {
    let machine = static_machine(Profile::Milan1p);
    let lines = run_simulated(&machine, true, &mut two_watts(&machine));
    let l = line(&lines, "energy");
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.starts_with("MSR: 64 of 64 cores advancing"), "{l}");
    // The fixture has no msr driver and no drop-in.
    let msr = line(&lines, "msr");
    assert_eq!(msr.verdict, Verdict::Fail, "{msr}");
    assert!(fix(msr).starts_with("modprobe msr"), "{msr}");
    assert!(fix(msr).contains("msr-fallback.conf"), "{msr}");
}

#[test]
fn msr_setup_passes_with_the_driver_and_the_drop_in() {
    let root = tempfile::tempdir().unwrap();
    let sys = root.path().join("sys");
    fs::create_dir_all(sys.join("module/msr")).unwrap();
    fs::create_dir_all(sys.join("kernel/security")).unwrap();
    fs::write(sys.join("kernel/security/lockdown"), "none [integrity] confidentiality\n").unwrap();
    let etc = root.path().join("etc");
    let drop_in = etc.join("systemd/system/amd-hsmp-broker.service.d");
    fs::create_dir_all(&drop_in).unwrap();
    fs::write(drop_in.join("msr-fallback.conf"), "").unwrap();
    let l = msr_setup(&sys, &root.path().join("cpu"), &etc);
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(l.found.contains("lockdown integrity (reads allowed)"), "{l}");
}

#[test]
fn a_refused_device_open_names_the_udev_rule_and_the_audit_log() {
    let (found, fix) = open_failure(Path::new("/dev/hsmp"), libc::EACCES);
    assert!(found.contains("Permission denied"), "{found}");
    assert!(fix.contains("ausearch -m avc -c amd-hsmp-broker"), "{fix}");
    assert!(fix.contains("udevadm trigger"), "{fix}");
}

#[test]
fn a_fixture_machine_is_read_like_the_real_one() {
    // Not simulated: the topology comes from the tree, the device is the simulator's.
    let machine = static_machine(Profile::Genoa2p);
    let root = tempfile::tempdir().unwrap();
    machine.spec().write_fixture(root.path()).unwrap();
    fs::create_dir_all(root.path().join("sys/module/amd_hsmp")).unwrap();
    let hsmp = machine.hsmp_opener();
    let accounts = accounts();
    let no_labels = |_: &Path| None;
    let mut wait = two_watts(&machine);
    let mut inputs = Inputs {
        procfs: &root.path().join("proc"),
        sysfs: &root.path().join("sys"),
        hsmp_device: &root.path().join("dev/hsmp"),
        hsmp: &hsmp,
        msr: None,
        perf: None,
        msr_root: &root.path().join("dev/cpu"),
        etc: &root.path().join("etc"),
        socket: &root.path().join("broker.sock"),
        accounts: &accounts,
        labels: &no_labels,
        energy_wait: &mut wait,
        energy_clock: &mut stopped_clock(),
        simulated: None,
    };
    let lines = run(&mut inputs);
    let shown: Vec<String> = lines.iter().map(ToString::to_string).collect();
    assert!(
        shown[0].starts_with("ok    cpu       AuthenticAMD family 0x19 model 0x11"),
        "{shown:#?}"
    );
    assert!(shown[1].starts_with("ok    driver    amd_hsmp loaded"), "{shown:#?}");
    assert!(shown[2].starts_with("FAIL  device"), "{shown:#?}");
    assert!(shown[3].starts_with("ok    selinux   disabled"), "{shown:#?}");
    assert_eq!(line(&lines, "cores").verdict, Verdict::Pass, "{shown:#?}");
}

/// Regression (I2): with one socket silent, the energy line said "no source: HSMP without the
/// RAPL messages (protocol below 7, or no device)", though the other socket has RAPL. It names
/// the socket now.
#[test]
fn with_one_socket_silent_the_energy_line_names_it() {
    let machine = static_machine(Profile::Turin2p);
    machine.update_faults(|f| {
        f.wedged_sockets.insert(1);
    });
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let protocol = line(&lines, "protocol");
    assert!(protocol.found.starts_with("socket 1 does not answer GET_PROTO_VER"), "{protocol}");
    let energy = line(&lines, "energy");
    assert_eq!(energy.verdict, Verdict::Skip, "{energy}");
    assert!(energy.found.contains("socket 1 does not answer"), "{energy}");
    assert!(!energy.found.contains("no source"), "{energy}");
}

/// Regression (P6): the `cores` line sent one message per core whatever the mailbox's pace: on
/// a mailbox answering in 3 s, minutes of nothing. Now a first core slower than
/// [`SLOW_MESSAGE`] ends it, and energy is not read through the mailbox either.
#[test]
fn a_slow_mailbox_costs_the_cores_line_one_message_not_one_per_core() {
    let mut spec = Profile::Turin2p.spec();
    spec.core_ids.truncate(4);
    let machine = Machine::new(spec, FirmwareConfig::new(Mode::Static));
    machine.update_faults(|f| {
        f.latency = SLOW_MESSAGE + Duration::from_millis(100);
        f.driver_timeout = Duration::from_secs(10);
    });
    let sent = || machine.mailbox(0).entered + machine.mailbox(1).entered;
    let before = sent();
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let cores = line(&lines, "cores");
    assert_eq!(cores.verdict, Verdict::Fail, "{cores}");
    assert!(cores.found.contains("the other 7 cores were not asked"), "{cores}");
    assert!(fix(cores).contains("SMU mailbox answers slowly"), "{cores}");
    let energy = line(&lines, "energy");
    assert_eq!(energy.verdict, Verdict::Skip, "{energy}");
    // GET_PROTO_VER of both sockets, the four family probes of the first, one boost limit.
    assert_eq!(sent() - before, 2 + 4 + 1, "{lines:#?}");
}

/// Regression (Q7): only the first core of socket 0 was timed, so a slow socket 1 had every one
/// of its cores asked, and `--check` ended at its deadline blaming the input files. Now the
/// first message to each socket is timed, and a slow socket 1 ends the `cores` line by name.
#[test]
fn a_slow_second_socket_costs_the_cores_line_one_message_and_is_named() {
    let mut spec = Profile::Turin2p.spec();
    spec.core_ids.truncate(4);
    let machine = Machine::new(spec, FirmwareConfig::new(Mode::Static));
    machine.update_faults(|f| {
        f.socket_latency.insert(1, SLOW_MESSAGE + Duration::from_millis(100));
        f.driver_timeout = Duration::from_secs(10);
    });
    let boost =
        || machine.counters().mailbox(amd_hsmp_device::messages::Message::GetBoostLimit as u32);
    let before = boost();
    let lines = run_simulated(&machine, false, &mut two_watts(&machine));
    let cores = line(&lines, "cores");
    assert_eq!(cores.verdict, Verdict::Fail, "{cores}");
    assert!(cores.found.starts_with("socket 1's first GET_BOOST_LIMIT (core "), "{cores}");
    assert!(cores.found.contains("the other 3 cores were not asked"), "{cores}");
    assert!(fix(cores).contains("SMU mailbox answers slowly"), "{cores}");
    assert_eq!(line(&lines, "energy").verdict, Verdict::Skip, "{lines:#?}");
    // The `protocol` line's probe of the family, socket 0's four cores, then socket 1's first.
    assert_eq!(boost() - before, 1 + 4 + 1, "{lines:#?}");
}

/// Each line reaches the caller as soon as it is decided: while the mailbox holds the first
/// message, the lines before it have been handed out.
#[test]
fn lines_are_handed_out_as_they_are_decided() {
    let machine = static_machine(Profile::Turin2p);
    machine.hold_socket(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let m = Arc::clone(&machine);
    let run = std::thread::spawn(move || {
        run_simulated_streaming(&m, false, &mut two_watts(&m), &mut |l| tx.send(l.name).unwrap())
    });
    machine.wait_mailbox(0, Duration::from_secs(20), |b| b.pending == 1).unwrap();
    let early: Vec<&str> = rx.try_iter().collect();
    assert_eq!(early, ["cpu", "driver"]);
    machine.release_socket(0);
    let lines = run.join().unwrap();
    assert_eq!(rx.try_iter().count() + early.len(), lines.len());
}

/// A root with `etc` and, if `unit`, the packaged broker unit in `usr/lib/systemd/system`.
fn system_root(unit: bool) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("etc/systemd/system")).unwrap();
    fs::create_dir_all(root.path().join("proc/sys/kernel")).unwrap();
    fs::write(root.path().join("proc/sys/kernel/osrelease"), "7.3.4+deb13-amd64\n").unwrap();
    fs::write(root.path().join("proc/sys/kernel/perf_event_paranoid"), "2\n").unwrap();
    if unit {
        let lib = root.path().join("usr/lib/systemd/system");
        fs::create_dir_all(&lib).unwrap();
        fs::write(lib.join("amd-hsmp-broker.service"), "[Service]\n").unwrap();
    }
    root
}

fn perf_line(machine: &Arc<Machine>, root: &Path) -> (Line, bool) {
    let etc = root.join("etc");
    let (line, energy) =
        perf(&machine.perf_locator(), machine.topology(), &root.join("proc"), Some(&etc));
    (line, energy.is_some())
}

#[test]
fn the_perf_line_fails_where_the_packaged_unit_does_not_grant_cap_perfmon() {
    let machine = static_machine(Profile::Genoa2p);
    let root = system_root(true);
    let (l, energy) = perf_line(&machine, root.path());
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(!energy, "the broker will not have it: no energy line from it");
    assert!(l.found.contains("kernel 7.3.4+deb13-amd64, perf_event_paranoid 2"), "{l}");
    assert!(fix(&l).contains("perf-energy.conf") && fix(&l).contains("daemon-reload"), "{l}");

    let drop_in = root.path().join("etc/systemd/system/amd-hsmp-broker.service.d");
    fs::create_dir_all(&drop_in).unwrap();
    fs::write(drop_in.join("perf-energy.conf"), "[Service]\n").unwrap();
    let (l, energy) = perf_line(&machine, root.path());
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(energy && l.found.contains("the perf drop-in grants CAP_PERFMON"), "{l}");
}

#[test]
fn without_the_packaged_unit_the_perf_line_is_this_process_s_own_open() {
    // A container: the check runs with the broker container's capabilities.
    let machine = static_machine(Profile::Genoa2p);
    let (l, energy) = perf_line(&machine, system_root(false).path());
    assert_eq!(l.verdict, Verdict::Pass, "{l}");
    assert!(energy);
    machine
        .set_faults(amd_hsmp_sim::Faults { perf_open: Some(libc::EACCES), ..Default::default() });
    let (l, energy) = perf_line(&machine, system_root(false).path());
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(!energy && l.found.contains("CAP_PERFMON"), "{l}");
}

#[test]
fn a_kernel_without_the_pmu_warns_and_names_the_msr_fallback() {
    let machine = static_machine(Profile::Genoa2p);
    let mut faults = amd_hsmp_sim::Faults::default();
    faults.unsupported.insert(FaultGroup::Perf);
    machine.set_faults(faults);
    let (l, energy) = perf_line(&machine, system_root(true).path());
    assert_eq!(l.verdict, Verdict::Warn, "{l}");
    assert!(!energy && l.found.contains("has no power_core PMU"), "{l}");
    assert!(l.found.contains("6.14") && fix(&l).contains("MSR fallback"), "{l}");
}

#[test]
fn on_a_part_without_hsmp_rapl_the_energy_line_reads_the_perf_counter() {
    let machine = static_machine(Profile::Genoa2p);
    let dir = tempfile::tempdir().unwrap();
    let (hsmp, perf) = (machine.hsmp_opener(), machine.perf_locator());
    let accounts = Accounts::default();
    let no_labels = |_: &Path| None;
    let mut wait = two_watts(&machine);
    let mut inputs = Inputs {
        procfs: &dir.path().join("proc"),
        sysfs: &dir.path().join("sys"),
        hsmp_device: &dir.path().join("hsmp"),
        hsmp: &hsmp,
        msr: None,
        perf: Some(&perf),
        msr_root: &dir.path().join("cpu"),
        etc: &dir.path().join("etc"),
        socket: &dir.path().join("broker.sock"),
        accounts: &accounts,
        labels: &no_labels,
        energy_wait: &mut wait,
        energy_clock: &mut stopped_clock(),
        simulated: Some(machine.topology().clone()),
    };
    let lines = run(&mut inputs);
    assert_eq!(line(&lines, "perf").verdict, Verdict::Pass, "{lines:#?}");
    let energy = line(&lines, "energy");
    assert_eq!(energy.verdict, Verdict::Pass, "{energy}");
    assert!(energy.found.starts_with("perf power_core: 64 of 64 cores advancing"), "{energy}");
}

/// The VM tier showed it: at Debian's default perf_event_paranoid 3, --check (as root, which
/// holds CAP_SYS_ADMIN) passed the perf line with the drop-in installed, while the broker,
/// holding CAP_PERFMON alone, was refused by Debian's patch.
#[test]
fn at_paranoid_3_the_drop_in_is_not_enough_and_the_fix_is_upstream_s_2() {
    let machine = static_machine(Profile::Genoa2p);
    let root = system_root(true);
    let drop_in = root.path().join("etc/systemd/system/amd-hsmp-broker.service.d");
    fs::create_dir_all(&drop_in).unwrap();
    fs::write(drop_in.join("perf-energy.conf"), "[Service]\n").unwrap();
    fs::write(root.path().join("proc/sys/kernel/perf_event_paranoid"), "3\n").unwrap();
    let (l, energy) = perf_line(&machine, root.path());
    assert_eq!(l.verdict, Verdict::Fail, "{l}");
    assert!(!energy, "the broker will not have it");
    assert!(fix(&l).contains("kernel.perf_event_paranoid=2") && fix(&l).contains("MSR"), "{l}");
    // Refused outright (not root): the same fix.
    machine
        .set_faults(amd_hsmp_sim::Faults { perf_open: Some(libc::EACCES), ..Default::default() });
    let (l, _) = perf_line(&machine, root.path());
    assert!(fix(&l).contains("kernel.perf_event_paranoid=2"), "{l}");
}
