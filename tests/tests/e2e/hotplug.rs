//! CPU hotplug end to end: the real broker on this machine's CPUs (the software PMU standing in
//! for `power_core`), run as systemd's socket unit runs it, and the real exporter scraped
//! throughout while a CPU goes offline and comes back. What the kernel does to a per-CPU event
//! and device across hotplug is pinned by `device/tests/hotplug.rs`; how the broker answers it,
//! by `broker/src/hotplug.rs`.

use amd_hsmp_e2e::harness::{self, ActivatedBroker, Exposition, OfflineCpu, one_at_a_time};
use std::time::{Duration, Instant};

/// How long any awaited condition may take.
const PATIENCE: Duration = Duration::from_secs(30);

const ENERGY: &str = "amd_hsmp_core_energy_joules_total";

fn scrape(addr: std::net::SocketAddr) -> Exposition {
    let response = harness::http_get(addr, "/metrics", &[], Duration::from_secs(15)).unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    Exposition::parse(&response.body).unwrap()
}

/// The energy series of each core, by its `core` label.
fn energy(scrape: &Exposition) -> std::collections::BTreeMap<String, f64> {
    scrape
        .samples
        .iter()
        .filter(|(series, _)| series.starts_with(&format!("{ENERGY}{{")))
        .map(|(series, value)| (series.clone(), *value))
        .collect()
}

#[test]
#[ignore = "needs root (takes a CPU offline and back): cargo xtask test runs it"]
fn a_perf_core_lost_to_hotplug_returns_under_socket_activation_with_every_scrape_whole() {
    let _alone = one_at_a_time();
    let cpu = match OfflineCpu::candidate() {
        Ok(cpu) => cpu,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let pmu = harness::software_pmu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--path.procfs",
        "/proc",
        "--path.sysfs",
        "/sys",
        "--hsmp.device",
        &dir.path().join("no-hsmp").display().to_string(),
        "--perf.pmu-root",
        &pmu.path().display().to_string(),
        "--sample.max-age",
        "0",
        "--log.format",
        "json",
    ]
    .map(String::from)
    .to_vec();
    let broker = ActivatedBroker::start(&args, dir.path()).unwrap();
    let (_exporter, addr) =
        harness::start_exporter(broker.socket(), &[], None, dir.path()).unwrap();
    let before = scrape(addr);
    let all = energy(&before);
    assert!(all.len() >= 2, "one series a core: {}\n{}", before.text, broker.log());
    let gone = all.keys().find(|s| s.contains(&format!("core=\"{cpu}\""))).cloned();
    let Some(gone) = gone else {
        return eprintln!("skipped: CPU {cpu} is not its core's only thread here");
    };
    let errors_before = before.errors("core-energy");
    let offline = OfflineCpu::take(cpu).unwrap();
    // While offline: the core's series absent, every other one there, the broker up.
    let deadline = Instant::now() + PATIENCE;
    let mut last = before;
    while energy(&last).contains_key(&gone) {
        assert!(Instant::now() < deadline, "{gone} still there\n{}", broker.log());
        last = scrape(addr);
        assert_eq!(last.value("amd_hsmp_broker_up"), Some(1.0), "{}", last.text);
    }
    assert_eq!(energy(&last).len(), all.len() - 1, "{}", last.text);
    let lost_at = last.value(&gone);
    assert_eq!(lost_at, None);
    offline.online();
    // Back: every scrape whole and answered by a broker, across the fresh start, until the
    // core is there again.
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "{gone} not back\n{}", broker.log());
        last = scrape(addr);
        assert_eq!(last.value("amd_hsmp_broker_up"), Some(1.0), "{}", last.text);
        assert!(energy(&last).len() >= all.len() - 1, "{}", last.text);
        if energy(&last).contains_key(&gone) {
            break;
        }
    }
    assert_eq!(broker.exits(), [Some(75)], "one fresh start: {}", broker.log());
    assert_eq!(broker.starts(), 2);
    // The loss was counted, and once the core is back nothing more is: it counts again.
    let errors = last.errors("core-energy");
    assert!(errors > errors_before, "the loss is counted: {}", last.text);
    let after = scrape(addr);
    assert_eq!(after.errors("core-energy"), errors, "{}", after.text);
    assert_eq!(energy(&after).len(), all.len());
    assert!(after.value(&gone).unwrap() > last.value(&gone).unwrap(), "{}", after.text);
}
