//! The broker's `--check` mode and its permission-denied log lines, on the real binary.

use amd_hsmp_device::Message;
use amd_hsmp_e2e::fake::{self, FakeDevice};
use amd_hsmp_e2e::scenario::{self, Rig};
use amd_hsmp_e2e::{fixtures, harness};
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a `--check` that should end at once may take before the test calls it hung.
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn the_check_prints_one_line_per_precondition_and_fails_without_the_socket() {
    let bins = harness::binaries().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    // Off the power peak, whatever the hour this runs at.
    let out = Command::new(&bins.sim_broker)
        .args(["--check", "--simulate", "turin-2p", "--simulate.time", OFF_PEAK, "--listen"])
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (checks, verdict) = text.trim_end().rsplit_once('\n').unwrap();
    let names: Vec<&str> = checks
        .lines()
        .filter_map(|l| l.get(6..).and_then(|r| r.split_whitespace().next()))
        .collect();
    assert_eq!(
        names,
        [
            "cpu",
            "driver",
            "protocol",
            "cores",
            "boost",
            "frequency-limit",
            "perf",
            "energy",
            "socket"
        ],
        "{text}"
    );
    assert!(text.contains("skip  perf      not needed: energy comes from HSMP RAPL"), "{text}");
    assert!(text.contains("ok    protocol  HSMP protocol 7 on 2 socket(s)"), "{text}");
    assert!(text.contains("GET_SOCKET_FREQ_LIMIT answered: socket 0 3700 MHz (opn_max)"), "{text}");
    let socket_line =
        text.lines().find(|l| l.get(6..).is_some_and(|r| r.starts_with("socket"))).unwrap();
    assert!(socket_line.starts_with("FAIL  socket"), "{text}");
    // A simulator has no unit: the fix is to start it, never systemctl.
    assert!(
        socket_line.contains("fix: start the simulator on it: amd-hsmp-sim-broker --simulate"),
        "{text}"
    );
    assert!(!text.contains("systemctl"), "{text}");
    assert_eq!(
        verdict, "amd-hsmp-sim-broker: a scrape cannot work as it should; see FAIL above",
        "{text}"
    );

    // At the peak of the simulated day, the same line names the package power limit.
    let peak = simulated_day(&[model(0.0).daily_peak_s(0)]).pop().unwrap();
    assert!(
        peak.answered.contains("socket 0 ") && peak.answered.contains(" MHz (ppt)"),
        "{peak:?}"
    );
}

/// 03:00 UTC, when the simulated Turin 2P of seed 0 is far from its power peak.
const OFF_PEAK: &str = "2026-01-01T03:00:00Z";

/// What `amd-hsmp-sim-broker --check --simulate turin-2p --simulate.time T` serves from, `at`
/// seconds after midnight of 2026-01-01: the model (seed 0, the normal scenario) started then.
fn model(at: f64) -> amd_hsmp_sim::live::Live {
    let spec = amd_hsmp_sim::Profile::Turin2p.spec();
    amd_hsmp_sim::live::Live::new(&spec, 0, amd_hsmp_sim::Scenario::Normal)
        .since_epoch(amd_hsmp_sim::live::DAY_2026_01_01 + at)
}

/// One `--check` at an instant of the simulated day, and what the model holds around it.
#[derive(Debug)]
struct CheckAt {
    /// Seconds after midnight.
    at: f64,
    /// The frequency-limit line's text after "GET_SOCKET_FREQ_LIMIT answered: ".
    answered: String,
    /// The boost line's lowest and highest MHz.
    boost: (u32, u32),
    /// The energy line's total W.
    watts: f64,
    /// The whole output, for messages.
    text: String,
}

/// `--check` at each of `instants` (seconds after midnight of 2026-01-01 on the simulated
/// clock), a few at a time.
fn simulated_day(instants: &[f64]) -> Vec<CheckAt> {
    let bins = harness::binaries().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |at: f64| {
        let epoch = std::time::UNIX_EPOCH
            + Duration::from_secs_f64(amd_hsmp_sim::live::DAY_2026_01_01 + at);
        let time = humantime::format_rfc3339_seconds(epoch).to_string();
        let out = Command::new(&bins.sim_broker)
            .args(["--check", "--simulate", "turin-2p", "--simulate.time", &time, "--listen"])
            .arg(dir.path().join(format!("{at}.sock")))
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let line = |name: &str| {
            let line = text.lines().find(|l| l.get(6..).is_some_and(|r| r.starts_with(name)));
            line.unwrap_or_else(|| panic!("no {name} line at {time}:\n{text}")).to_owned()
        };
        let answered = line("frequency-limit");
        let answered = answered.split_once("answered: ").map(|(_, a)| a.to_owned());
        let boost = line("boost");
        let mhz: Vec<u32> = boost
            .split_whitespace()
            .skip_while(|w| *w != "limits")
            .filter_map(|w| w.parse().ok())
            .take(2)
            .collect();
        let energy = line("energy");
        let watts = energy.split(", ").nth(1).and_then(|w| w.split(" W").next());
        CheckAt {
            at,
            answered: answered.unwrap_or_else(|| panic!("{text}")),
            boost: (mhz[0], mhz[1]),
            watts: watts.and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{text}")),
            text,
        }
    };
    let mut out = Vec::new();
    for chunk in instants.chunks(5) {
        std::thread::scope(|scope| {
            let runs: Vec<_> = chunk.iter().map(|&at| scope.spawn(move || run(at))).collect();
            out.extend(runs.into_iter().map(|r| r.join().unwrap()));
        });
    }
    out
}

#[test]
fn the_check_agrees_with_the_simulated_machine_at_every_hour_of_its_day_and_its_peak() {
    let spec = amd_hsmp_sim::Profile::Turin2p.spec();
    let cores = 2 * spec.core_ids.len();
    let instants: Vec<f64> =
        (0..24).map(|h| f64::from(h) * 3600.0).chain([model(0.0).daily_peak_s(0)]).collect();
    let (mut ppt, mut opn_max) = (0, 0);
    for check in simulated_day(&instants) {
        let (at, text) = (check.at, &check.text);
        let live = model(at);
        // The model around the check's reads: it starts at `at` and reads within a few seconds.
        let moments: Vec<f64> = (0..60).map(|k| f64::from(k) * 0.05).collect();
        let limits: Vec<String> = moments
            .iter()
            .map(|&t| {
                (0..2)
                    .map(|s| {
                        let limit =
                            amd_hsmp_proto::FrequencyLimit::from(live.socket_freq_limit(s, t));
                        let by: Vec<&str> = limit.limiters().map(|r| r.name()).collect();
                        format!("socket {s} {} MHz ({})", limit.mhz, by.join(", "))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .collect();
        assert!(
            limits.contains(&check.answered),
            "at {at} s: {:?} not in {limits:?}\n{text}",
            check.answered
        );
        ppt += usize::from(check.answered.contains("(ppt)"));
        opn_max += usize::from(check.answered.contains("(opn_max)"));
        let boost = |t: f64| {
            let all = (0..cores).map(|i| live.boost_mhz(i, t));
            (all.clone().min().unwrap(), all.max().unwrap())
        };
        assert!(
            moments.iter().any(|&t| boost(t) == check.boost),
            "at {at} s: {:?}\n{text}",
            check.boost
        );
        // Every core within its cap, so the machine within its cores' share of the TDP.
        let cap_w = amd_hsmp_sim::live::CORE_SHARE_OF_TDP * f64::from(spec.tdp_w) * 2.0;
        assert!(check.watts <= cap_w, "at {at} s: {} W of {cap_w} W\n{text}", check.watts);
        // And what the model counted over the check's 2 s window, to the check's rounding and
        // the few milliseconds its reads take.
        let counted = |t: f64| {
            (0..cores).map(|i| live.energy_j(i, t + 2.0) - live.energy_j(i, t)).sum::<f64>() / 2.0
        };
        let (lo, hi) = (counted(0.0).min(counted(1.0)), counted(0.0).max(counted(1.0)));
        assert!(
            check.watts >= 0.99 * lo && check.watts <= 1.01 * hi,
            "at {at} s: {} W, the model {lo} to {hi} W\n{text}",
            check.watts
        );
    }
    // Both of the limiters the day goes through, every run.
    assert!(ppt >= 2 && opn_max >= 12, "{ppt} at ppt, {opn_max} at opn_max");
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_refused_device_is_logged_with_the_udev_rule_and_the_audit_log() {
    let toml = "description = \"\"\nmachine = \"genoa-2p\"\nhsmp = \"denied\"\n[[scrapes]]\n";
    let mut rig = Rig::start(&scenario::parse(toml).unwrap()).unwrap();
    let response = rig.scrape(&scenario::Scrape::default()).unwrap();
    assert!(response.body.contains("amd_hsmp_up 0"), "{}", response.body);
    let log = rig.broker_log();
    let line = log
        .lines()
        .find(|l| l.contains("HSMP device refused"))
        .unwrap_or_else(|| panic!("{}", rig.logs()));
    assert!(line.contains("ausearch -m avc -c amd-hsmp-broker"), "{line}");
    assert!(line.contains("udevadm trigger"), "{line}");
    assert!(line.contains("run amd-hsmp-check"), "{line}");
}

/// A Milan 1P's procfs and sysfs under `root` (`proc/`, `sys/`), as the fixtures are written.
fn milan_tree(root: &Path) {
    fixtures::machine("milan-1p").unwrap().write_fixture(root).unwrap();
}

/// Replaces `path` with a FIFO nobody writes to.
fn fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0).unwrap();
}

/// A running `amd-hsmp-check`, its stdout read line by line as it comes.
struct Check {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Check {
    /// `amd-hsmp-check` on the tree at `root`, with the device at `device` and `extra` flags;
    /// nothing listens on its socket.
    fn start(root: &Path, device: &Path, extra: &[&str]) -> Check {
        let bins = harness::binaries().unwrap();
        let mut command = Command::new(&bins.check);
        command
            .arg("--path.procfs")
            .arg(root.join("proc"))
            .arg("--path.sysfs")
            .arg(root.join("sys"))
            .arg("--hsmp.device")
            .arg(device)
            .arg("--msr.device-root")
            .arg(root.join("dev/cpu"))
            .arg("--listen")
            .arg(root.join("broker.sock"))
            .args(extra);
        Check::spawn(command)
    }

    /// Runs `command` (a `--check`), reading its stdout.
    fn spawn(mut command: Command) -> Check {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Check { child, lines }
    }

    /// Waits up to `limit` for the exit; the exit code and everything printed. A check still
    /// running then is killed and the test fails.
    fn finish(mut self, limit: Duration) -> (i32, String) {
        let until = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let text: Vec<String> = self.lines.try_iter().collect();
                panic!("--check still running after {limit:?}; printed:\n{}", text.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut text = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(PATIENCE) {
            text.push(line);
        }
        (status.code().unwrap_or(-1), text.join("\n"))
    }
}

/// The line of check `name` in `text`.
fn line_of<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.get(6..).and_then(|r| r.split_whitespace().next()) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in\n{text}"))
}

/// Regression (P6): `--check` hung for ever, printing nothing, when one of its inputs was a FIFO
/// (cpuinfo, a sysfs `core_id`, the device, `kernel/security/lockdown`, `fs/selinux/enforce`):
/// it opened them with a blocking `open`. Each is now refused at once, on a line naming the file.
#[test]
fn a_fifo_in_place_of_any_input_of_the_check_is_named_at_once() {
    let cases: [(&str, &str, &[&str], &str, &str); 5] = [
        ("proc/cpuinfo", "dev/hsmp", &[], "cpu", "proc/cpuinfo: not a regular file but a FIFO"),
        (
            "sys/devices/system/cpu/cpu0/topology/core_id",
            "dev/hsmp",
            &[],
            "cpu",
            "core_id: not a regular file but a FIFO",
        ),
        ("dev/hsmp", "dev/hsmp", &[], "device", "dev/hsmp is not a character device"),
        (
            "sys/kernel/security/lockdown",
            "dev/hsmp",
            &["--collector.core-energy.msr-fallback"],
            "msr",
            "lockdown: not a regular file but a FIFO",
        ),
        (
            "sys/fs/selinux/enforce",
            "dev/hsmp",
            &[],
            "selinux",
            "fs/selinux/enforce: not a regular file but a FIFO",
        ),
    ];
    for (file, device, flags, name, says) in cases {
        let root = tempfile::tempdir().unwrap();
        milan_tree(root.path());
        fifo(&root.path().join(file));
        let check = Check::start(root.path(), &root.path().join(device), flags);
        let (code, text) = check.finish(PATIENCE);
        assert_eq!(code, 1, "{file}:\n{text}");
        let line = line_of(&text, name);
        assert!(line.contains(says), "{file}: {line}\n{text}");
    }
}

/// Fixture machine `name` behind the FUSE fake device, and its tree.
fn fake_machine(name: &str) -> (Arc<amd_hsmp_sim::Machine>, FakeDevice, tempfile::TempDir) {
    let spec = fixtures::machine(name).unwrap();
    let root = tempfile::tempdir().unwrap();
    spec.write_fixture(root.path()).unwrap();
    let (machine, device) = fake::mount_static(spec).unwrap();
    (machine, device, root)
}

/// The accounts the package creates, in files to bind over `/etc/passwd` and `/etc/group`.
const PACKAGE_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
    amd-hsmp-broker:x:990:990::/:/usr/sbin/nologin\n\
    amd-hsmp-exporter:x:991:991::/:/usr/sbin/nologin\n";
const PACKAGE_GROUP: &str = "root:x:0:\namd-hsmp-broker:x:990:\namd-hsmp-exporter:x:991:\n";
const BROKER_GID: u32 = 990;
const EXPORTER_GID: u32 = 991;

/// Issue 28: a Venice-like machine (family 0x1A model 0x50, APIC ids above 255, HSMP through
/// the ACPI device and `hsmp_acpi`) failed `cpu` as a family without HSMP; then it passed every
/// line about the machine but still failed `device` and `socket`, the check being run beside
/// no broker on a host without the package's accounts. Now it runs as an operator runs it on
/// such a machine: the broker serving, its socket as systemd makes it, the device node as the
/// udev rule leaves it, the package's accounts (bound over `/etc/passwd` and `/etc/group` in a
/// mount namespace of the check's own). It passes, with the model a warning naming what the
/// broker tries, and the device a warning that the fake is a FUSE file, not the driver's node.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn the_check_on_a_venice_like_machine_passes_with_a_warning_for_the_model() {
    use std::os::unix::fs::PermissionsExt as _;
    let toml = "description = \"\"\nmachine = \"venice-2p\"\n[[scrapes]]\n";
    let rig = Rig::start(&scenario::parse(toml).unwrap()).unwrap();
    let (machine, device) = (rig.machine(), rig.device());
    device.set_hsmp_owner(BROKER_GID, 0o640);
    let socket = rig.broker_socket();
    std::os::unix::fs::chown(&socket, Some(0), Some(EXPORTER_GID)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).unwrap();
    let run_dir = socket.parent().unwrap();
    std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let etc = tempfile::tempdir().unwrap();
    std::fs::write(etc.path().join("passwd"), PACKAGE_PASSWD).unwrap();
    std::fs::write(etc.path().join("group"), PACKAGE_GROUP).unwrap();
    let tree = fixtures::tree(&fixtures::fixtures_dir(), "venice-2p");

    let cores = machine.topology().cores.len();
    let counter = Message::GetRaplCoreCounter.id();
    let before = device.message_counts().get(&counter).copied().unwrap_or(0);
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@""#)
        .arg("sh")
        .arg(etc.path().join("passwd"))
        .arg(etc.path().join("group"))
        .arg(&harness::binaries().unwrap().broker)
        .arg("--check")
        .arg("--listen")
        .arg(&socket)
        .args(device.broker_args(&tree));
    let check = Check::spawn(command);
    // The static firmware's counters move only when told: once the energy line's first read of
    // every core is in, 2 J more each, read again after its window.
    let until = Instant::now() + PATIENCE;
    while device.message_counts().get(&counter).copied().unwrap_or(0) < before + cores {
        assert!(Instant::now() < until, "the energy line never read every core");
        std::thread::sleep(Duration::from_millis(5));
    }
    machine.firmware().advance_all_energy(2.0).unwrap();
    let (code, text) = check.finish(PATIENCE);
    assert_eq!(code, 0, "{text}");
    // `amd-hsmp-broker --check`, kept for one release, ran amd-hsmp-check in its place.
    assert!(text.ends_with("\namd-hsmp-check: every check a scrape needs passed"), "{text}");
    let cpu = line_of(&text, "cpu");
    assert!(cpu.starts_with("WARN  cpu       AuthenticAMD family 0x1a model 0x50"), "{text}");
    assert!(cpu.contains("omits what the firmware answers ENOMSG"), "{text}");
    let device_line = line_of(&text, "device");
    assert!(device_line.starts_with("WARN  device"), "{text}");
    assert!(device_line.contains("uid 0 gid 990 mode 0640: readable by group amd-hsmp-broker"));
    assert!(device_line.contains("not the driver's character device"), "{text}");
    for (name, says) in [
        ("driver", "hsmp_acpi loaded (ACPI device AMDI0097)"),
        (
            "protocol",
            "HSMP protocol 7 on 2 socket(s); answering: boost limit, PROCHOT, RAPL energy, package energy",
        ),
        ("cores", "all 256 cores answer by APIC id on their socket (2 socket(s))"),
        ("energy", "256 cores"),
        ("socket", "amd-hsmp-exporter may connect; broker"),
    ] {
        let line = line_of(&text, name);
        assert!(line.starts_with("ok ") && line.contains(says), "{name}: {text}");
    }
    assert!(line_of(&text, "socket").ends_with("answers, 256 cores"), "{text}");
    let warned: Vec<&str> = text.lines().filter(|l| l.starts_with("WARN")).collect();
    assert_eq!(warned.len(), 2, "{text}");
}

/// Regression (P6): `--check` printed nothing until every check was done, and had no overall
/// deadline: a mailbox that took seconds a message kept it silent for minutes. Now each line
/// is printed as it is decided, and past `--check.timeout` a `deadline` line names the step
/// after the last line printed, while that step still waits.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn the_check_streams_its_lines_and_names_the_step_a_slow_mailbox_holds_at_its_deadline() {
    let _alone = harness::one_at_a_time();
    let (machine, device, root) = fake_machine("turin-2p");
    // Longer than the deadline, and unlike a held mailbox it ends, so the process can exit (a
    // process inside a FUSE request the fake has taken cannot die until it is answered).
    machine.update_faults(|f| {
        f.latency = Duration::from_secs(6);
        f.driver_timeout = Duration::from_secs(60);
    });
    let check = Check::start(root.path(), &device.hsmp_path(), &["--check.timeout", "2s"]);
    let mut printed = Vec::new();
    let deadline = loop {
        let line = check.lines.recv_timeout(PATIENCE).expect("no deadline line");
        if line.get(6..).is_some_and(|l| l.starts_with("deadline")) {
            break line;
        }
        printed.push(line);
    };
    // The deadline came while the first message was still in the mailbox, and the lines before
    // it had been printed as they were decided.
    assert_eq!(machine.mailbox(0).pending, 1, "the message had returned");
    assert!(printed.first().is_some_and(|l| l.starts_with("ok    cpu ")), "{printed:#?}");
    assert!(
        deadline.starts_with("FAIL  deadline  the checks did not finish within 2 s"),
        "{deadline}"
    );
    assert!(deadline.contains("the check after `labels` is still waiting"), "{deadline}");
    let (code, rest) = check.finish(PATIENCE);
    assert_eq!(code, 1, "{printed:#?}\n{deadline}\n{rest}");
    assert!(rest.ends_with("a scrape cannot work as it should; see FAIL above"), "{rest}");
    drop(device);
}

/// Regression (Q7): the slow-mailbox probe timed only socket 0's first core, so with socket 1
/// at 3 s a message `--check` asked each of socket 1's cores and ended at its deadline, its fix
/// pointing at the input files. Now it ends well within the deadline with a `cores` line that
/// names socket 1 and the slow mailbox.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn with_socket_1_slow_the_check_names_it_before_its_deadline() {
    let _alone = harness::one_at_a_time();
    let (machine, device, root) = fake_machine("turin-2p");
    machine.update_faults(|f| {
        f.socket_latency.insert(1, Duration::from_secs(3));
        f.driver_timeout = Duration::from_secs(60);
    });
    let started = Instant::now();
    let check = Check::start(root.path(), &device.hsmp_path(), &["--check.timeout", "30s"]);
    let (code, text) = check.finish(Duration::from_secs(45));
    let took = started.elapsed();
    assert_eq!(code, 1, "{text}");
    assert!(!text.contains("deadline"), "{text}");
    let cores = line_of(&text, "cores");
    assert!(cores.starts_with("FAIL  cores     socket 1's first GET_BOOST_LIMIT"), "{text}");
    assert!(cores.contains("the other 191 cores were not asked"), "{text}");
    assert!(text.contains("SMU mailbox answers slowly"), "{text}");
    eprintln!("--check with socket 1 at 3 s a message: {:.1} s", took.as_secs_f64());
    drop(device);
}
