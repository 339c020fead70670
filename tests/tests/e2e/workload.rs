//! The energy per workload end to end: `amd-hsmp-sim-broker --simulate turin-2p` and
//! `amd-hsmp-exporter --collector.core-owner` on a cgroup tree in a temporary directory, where
//! a Slurm job comes and goes between scrapes. The workload's counter is checked against the
//! simulator's own core counters, scraped in the same answers.

use amd_hsmp_e2e::cgroups::{Hierarchy, cpu_list};
use amd_hsmp_e2e::harness::{self, BrokerClient, Exposition, Proc};
use amd_hsmp_proto::{Energy, Family, Topology};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

/// The broker's flags: every read fresh, so that each scrape is a sample of its own.
const FRESH: &[&str] = &["--sample.max-age", "0"];

/// The job's cgroup, as Slurm's cgroup v2 plugin lays it out.
const JOB: &str = "system.slice/slurmstepd.scope/job_77";

struct Node {
    dir: tempfile::TempDir,
    broker: Proc,
    exporter: Proc,
    addr: SocketAddr,
    topology: Topology,
}

impl Node {
    /// The simulator (every read fresh) and an exporter with the core-owner collector on a tree
    /// of the topology's CPUs, walked afresh at every scrape, with `extra` flags.
    fn start(extra: &[&str]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("broker.sock");
        let log = dir.path().join("broker.log");
        let broker = harness::start_simulated_broker("turin-2p", &socket, FRESH, log).unwrap();
        let topology = BrokerClient::connect(&socket, TIMEOUT).topology();
        let online: BTreeSet<u32> =
            topology.cores.iter().flat_map(|c| c.threads.iter().copied()).collect();
        let root = dir.path().join("cgroup");
        Hierarchy::default().write(&root, &online).unwrap();
        let mut flags: Vec<String> = vec![
            "--collector.core-owner".into(),
            "--path.cgroupfs".into(),
            root.display().to_string(),
            "--collector.core-owner.max-age".into(),
            "0".into(),
        ];
        flags.extend(extra.iter().map(|f| f.to_string()));
        let (exporter, addr) = harness::start_exporter(&socket, &flags, None, dir.path()).unwrap();
        Node { dir, broker, exporter, addr, topology }
    }

    /// The broker stopped and another started whose simulated clock starts at `time`.
    fn restart_broker(&mut self, time: &str) {
        self.broker.kill();
        let socket = self.dir.path().join("broker.sock");
        let log = self.dir.path().join("broker.2.log");
        let flags = [FRESH, &["--simulate.time", time]].concat();
        self.broker = harness::start_simulated_broker("turin-2p", &socket, &flags, log).unwrap();
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("cgroup")
    }

    /// The job on the first `cores` cores of socket 0: their labels.
    fn start_job(&self, cores: usize) -> Vec<(u32, u32)> {
        let held: Vec<_> =
            self.topology.cores.iter().filter(|c| c.socket == 0).take(cores).collect();
        let cpus = cpu_list(held.iter().flat_map(|c| c.threads.iter().copied()));
        self.make_job(JOB, &cpus);
        held.iter().map(|c| (c.socket, c.core)).collect()
    }

    /// Writes cgroup `path` restricted to `cpus`, and its parents with every CPU where they do
    /// not exist yet. A leaf is two files: its type and its effective set (a directory without
    /// subdirectories has no children to read).
    fn make_job(&self, path: &str, cpus: &str) {
        let mut dir = self.root();
        let parts: Vec<&str> = path.split('/').collect();
        for (n, part) in parts.iter().enumerate() {
            dir.push(part);
            let leaf = n + 1 == parts.len();
            if !leaf && dir.exists() {
                continue;
            }
            std::fs::create_dir(&dir).unwrap();
            let set = if leaf { cpus.to_owned() } else { self.all_cpus() };
            std::fs::write(dir.join("cgroup.type"), "domain\n").unwrap();
            std::fs::write(dir.join("cpuset.cpus.effective"), format!("{set}\n")).unwrap();
            if !leaf {
                std::fs::write(dir.join("cgroup.subtree_control"), "cpuset cpu memory pids\n")
                    .unwrap();
            }
        }
    }

    fn all_cpus(&self) -> String {
        cpu_list(
            self.topology
                .cores
                .iter()
                .flat_map(|c| c.threads.iter().copied())
                .collect::<BTreeSet<_>>(),
        )
    }

    fn end_job(&self) {
        std::fs::remove_dir_all(self.root().join(JOB)).unwrap();
    }

    fn scrape(&self) -> Exposition {
        let response = harness::http_get(self.addr, "/metrics", &[], TIMEOUT).unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        Exposition::parse(&response.body).unwrap()
    }
}

fn core_energy(m: &Exposition, (socket, core): (u32, u32)) -> f64 {
    let series = format!(r#"amd_hsmp_core_energy_joules_total{{core="{core}",socket="{socket}"}}"#);
    m.value(&series).unwrap_or_else(|| panic!("no {series}:\n{}", m.text))
}

fn job_energy(m: &Exposition) -> Option<f64> {
    let series =
        format!(r#"amd_hsmp_workload_core_energy_joules_total{{owner="/{JOB}",hpc_job="77"}}"#);
    m.value(&series)
}

/// What every core drew from one scrape to a later one, summed: each core's difference
/// first, so that no rounding of the large counters' sum hides a joule.
fn all_cores_drew(from: &Exposition, to: &Exposition) -> f64 {
    let (from, to) = (core_counters(from), core_counters(to));
    assert_eq!(from.len(), to.len(), "every core read in both scrapes");
    from.iter()
        .zip(&to)
        .map(|((a, ja), (b, jb))| {
            assert_eq!(a, b);
            jb - ja
        })
        .sum()
}

/// Every joule the workload counters and the unattributed counter hold.
fn given(m: &Exposition) -> f64 {
    m.samples
        .iter()
        .filter(|(series, _)| {
            series.starts_with("amd_hsmp_workload_core_energy_joules_total{")
                || series.starts_with("amd_hsmp_workload_unattributed_joules_total{")
        })
        .map(|(_, j)| j)
        .sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn a_jobs_counter_is_its_cores_energy_between_its_first_and_last_samples_and_every_joule_is_given()
{
    let node = Node::start(&[]);
    let before = node.scrape();
    assert_eq!(job_energy(&before), None, "{}", before.text);
    let cores = node.start_job(8);
    let first = node.scrape();
    assert_eq!(job_energy(&first), Some(0.0), "a series from the job's first sample");
    let _middle = node.scrape();
    let last = node.scrape();
    node.end_job();
    let after = node.scrape();

    let expected: f64 = cores.iter().map(|&c| core_energy(&last, c) - core_energy(&first, c)).sum();
    assert!(expected > 0.0, "the simulator's cores drew no energy");
    let got = job_energy(&after).unwrap_or_else(|| panic!("no job series:\n{}", after.text));
    assert!(close(got, expected), "job counter {got} J, its cores {expected} J");
    assert_eq!(job_energy(&last), Some(got), "the job's last interval ends at its last sample");
    let info = r#"amd_hsmp_core_owner_info{core="0",owner="/system.slice/slurmstepd.scope/job_77""#;
    assert!(!after.text.contains(info), "the job's owner series went with it");

    // The job's epilog on the node reads the same number from the exporter, after the job.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mixin/examples/slurm-epilog.sh");
    let url = format!("http://{}/metrics", node.addr);
    let out = std::process::Command::new("sh")
        .arg(&script)
        .env("SLURM_JOB_ID", "77")
        .env("AMD_HSMP_EXPORTER_URL", &url)
        .output()
        .expect("sh runs the epilog (it needs curl and awk: cargo xtask deps installs them)");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.starts_with(&format!("Energy: {got:.1} J (")), "{printed} for {got} J");
    assert!(printed.contains("the CPU cores of job 77 on "), "{printed}");

    // Every joule the cores drew from the first sample on went to the job or to a reason.
    let read = all_cores_drew(&before, &after);
    assert!(close(given(&after), read), "given {} J, read {read} J", given(&after));
    let reason = |r: &str| {
        after.value(&format!(r#"amd_hsmp_workload_unattributed_joules_total{{reason="{r}"}}"#))
    };
    assert!(reason("changed-hands").unwrap() > 0.0, "the job's start and end");
    assert!(reason("unowned").unwrap() > 0.0, "the other cores");
    assert_eq!(reason("reset"), Some(0.0));
    assert_eq!(reason("owner-unknown"), Some(0.0));
}

#[test]
fn a_job_shorter_than_the_scrape_interval_is_counted_by_the_samples_between_scrapes() {
    let node = Node::start(&["--collector.core-owner.sample-interval", "1s"]);
    let mut broker = BrokerClient::connect(&node.dir.path().join("broker.sock"), TIMEOUT);
    let before = node.scrape();
    assert_eq!(job_energy(&before), None);
    let cores = node.start_job(4);
    // What the job's cores drew over its life, read by the broker itself (every read fresh)
    // right after its cgroup appeared and right after it went.
    let started = (Instant::now(), cores_energy(&node, &mut broker, &cores));
    // The landing page takes no sample: it shows what the exporter's own samples found.
    let page = || harness::http_get(node.addr, "/", &[], TIMEOUT).unwrap().body;
    let counted = |page: &str| {
        page.contains(">Slurm job 77</td><td>4</td><td>")
            && !page.contains(">Slurm job 77</td><td>4</td><td>not yet")
    };
    wait_for(&node, "the job counted by two samples", || counted(&page()));
    node.end_job();
    let ended = (Instant::now(), cores_energy(&node, &mut broker, &cores));
    wait_for(&node, "the job ended", || !page().contains(">Slurm job 77</td>"));
    let after = node.scrape();
    let got = job_energy(&after).unwrap_or_else(|| panic!("no job series:\n{}", after.text));
    let drew = ended.1 - started.1;
    assert!(got > 0.0, "{}", after.text);
    assert!(got <= drew, "the counter {got} J holds more than the job's cores drew, {drew} J");
    // The measurement docs/metrics.md states: what the counter missed at the job's two ends.
    let life = ended.0 - started.0;
    let missed = drew - got;
    eprintln!(
        "workload: a job of {life:.1?} on 4 cores drew {drew:.2} J ({:.2} W), its counter {got:.2} J, \
         missed {missed:.2} J = {:.2} s of its cores' power at a 1 s sample interval",
        drew / life.as_secs_f64(),
        missed / (drew / life.as_secs_f64()),
    );
}

/// The energy counters of `cores` summed, from a fresh broker sample.
fn cores_energy(node: &Node, broker: &mut BrokerClient, cores: &[(u32, u32)]) -> f64 {
    let sample = broker.sample(amd_hsmp_proto::Families::ALL, 5_000);
    let values = harness::values(&sample.of::<Energy>(Family::CoreEnergy));
    node.topology
        .cores
        .iter()
        .zip(values)
        .filter(|(c, _)| cores.contains(&(c.socket, c.core)))
        .map(|(_, e)| e.expect("a core's energy").joules())
        .sum()
}

/// Polls `done` until it holds, at most a minute.
fn wait_for(node: &Node, what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < until,
            "{what}: not within a minute; log:\n{}",
            node.exporter.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_counter_that_restarts_mid_job_is_a_counted_reset_and_the_job_counts_on() {
    let mut node = Node::start(&[]);
    let cores = node.start_job(8);
    let first = node.scrape();
    let second = node.scrape();
    // Another broker whose simulated clock starts an hour earlier: every counter goes back, as
    // after a firmware or broker reset.
    node.restart_broker("2026-01-01T02:00:00Z");
    let third = scrape_answered(&node);
    let fourth = node.scrape();
    let drew = |a: &Exposition, b: &Exposition| -> f64 {
        cores.iter().map(|&c| core_energy(b, c) - core_energy(a, c)).sum()
    };
    assert!(core_energy(&third, cores[0]) < core_energy(&second, cores[0]), "no reset");
    let expected = drew(&first, &second) + drew(&third, &fourth);
    let got = job_energy(&fourth).unwrap();
    assert!(close(got, expected), "job counter {got} J, its cores {expected} J");
    let reset = fourth.value(r#"amd_hsmp_workload_unattributed_joules_total{reason="reset"}"#);
    let after: f64 = core_counters(&third).iter().map(|(_, j)| j).sum();
    assert!(close(reset.unwrap(), after), "the reset counts what the counters hold after it");
}

/// The first scrape the broker answers (the exporter reconnects after a restart).
fn scrape_answered(node: &Node) -> Exposition {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let m = node.scrape();
        if m.value("amd_hsmp_broker_up") == Some(1.0) {
            return m;
        }
        assert!(Instant::now() < until, "the broker did not answer again:\n{}", m.text);
    }
}

/// Every core's energy counter in a scrape, by series, in the series' order.
fn core_counters(m: &Exposition) -> Vec<(&str, f64)> {
    let name = "amd_hsmp_core_energy_joules_total{";
    m.samples.iter().filter(|(s, _)| s.starts_with(name)).map(|(s, j)| (s.as_str(), *j)).collect()
}

#[test]
fn ten_thousand_workloads_between_two_scrapes_leave_only_the_series_samples_saw() {
    let node = Node::start(&["--collector.core-owner.sample-interval", "1s"]);
    let cores: Vec<String> = node
        .topology
        .cores
        .iter()
        .filter(|c| c.socket == 0)
        .take(8)
        .map(|c| cpu_list(c.threads.iter().copied()))
        .collect();
    let before = node.scrape();
    let began = Instant::now();
    // Each workload holds one of eight cores, replacing the one there before it: 10,000
    // start and end between the two scrapes, eight at most at a time.
    let parent = "system.slice/slurmstepd.scope";
    for n in 0..10_000usize {
        if n >= cores.len() {
            let old = node.root().join(format!("{parent}/job_{}", n - cores.len()));
            std::fs::remove_dir_all(old).unwrap();
        }
        node.make_job(&format!("{parent}/job_{n}"), &cores[n % cores.len()]);
    }
    let after = node.scrape();
    // A workload gets a series only at a sample: the two scrapes' and one a second between.
    let samples = began.elapsed().as_secs() as usize + 2 + 2;
    let series = after.count("amd_hsmp_workload_core_energy_joules_total");
    assert!(
        series <= cores.len() * samples,
        "{series} workload series after {:?}, at most {} cores × {samples} samples",
        began.elapsed(),
        cores.len()
    );
    assert!(series >= 1, "the workloads holding cores at the second scrape");
    // Every joule the cores drew between the two scrapes is given once.
    let read = all_cores_drew(&before, &after);
    let given = given(&after) - given(&before);
    assert!(close(given, read), "given {given}, read {read}");
}

#[test]
fn a_core_that_changes_hands_at_every_sample_gives_its_energy_to_changed_hands_alone() {
    let node = Node::start(&[]);
    let core = &node.topology.cores[0];
    let cpus = cpu_list(core.threads.iter().copied());
    let label = (core.socket, core.core);
    let parent = "system.slice/slurmstepd.scope";
    let mut scrapes = Vec::new();
    // Every scrape is a sample (every read fresh, every walk fresh), and at each the core has
    // another owner than at the one before.
    for n in 0..6 {
        if n > 0 {
            std::fs::remove_dir_all(node.root().join(format!("{parent}/job_{}", n - 1))).unwrap();
        }
        node.make_job(&format!("{parent}/job_{n}"), &cpus);
        scrapes.push(node.scrape());
    }
    let last = scrapes.last().unwrap();
    for n in 0..6 {
        let series = format!(
            r#"amd_hsmp_workload_core_energy_joules_total{{owner="/{parent}/job_{n}",hpc_job="{n}"}}"#
        );
        assert_eq!(last.value(&series), Some(0.0), "{}", last.text);
    }
    let drew = core_energy(last, label) - core_energy(&scrapes[0], label);
    assert!(drew > 0.0);
    let changed =
        last.value(r#"amd_hsmp_workload_unattributed_joules_total{reason="changed-hands"}"#);
    assert!(close(changed.unwrap(), drew), "changed-hands {changed:?} J, the core drew {drew} J");
}
