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
    let args = harness::this_machine_broker_args(pmu.path(), &dir.path().join("no-hsmp"));
    let broker = ActivatedBroker::start(&args, dir.path()).unwrap();
    let (_exporter, addr) =
        harness::start_exporter(broker.socket(), &[], None, dir.path()).unwrap();
    let before = scrape(addr);
    let all = energy(&before);
    assert!(all.len() >= 2, "one series a core: {}\n{}", before.text, broker.log());
    let all_len = all.len();
    let gone = all.keys().find(|s| s.contains(&format!("core=\"{cpu}\""))).cloned();
    let Some(gone) = gone else {
        return eprintln!("skipped: CPU {cpu} is not its core's only thread here");
    };
    let errors_before = before.errors("core-energy");
    // Scrapes back to back from another client throughout, so that the CPU goes offline and
    // comes back during scrapes too: each must be whole.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut answered = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let got = scrape(addr);
                assert_eq!(got.value("amd_hsmp_broker_up"), Some(1.0), "{}", got.text);
                assert!(energy(&got).len() + 1 >= all_len, "{}", got.text);
                answered += 1;
            }
            answered
        })
    };
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = background.join().expect("a scrape during the hotplug was not whole");
    assert!(answered > 0);
}

/// The MSR source on the FUSE fake device of a Rome 1P, one core's first thread taken offline
/// in the simulator (every read of it `ENXIO`, as the MSR driver's cross-CPU call answers) and
/// brought back: no fresh start is needed, the same descriptor reads again.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn an_msr_core_whose_cpu_goes_offline_is_absent_then_back_from_zero_with_one_counted_reset() {
    let _alone = one_at_a_time();
    let scenario = amd_hsmp_e2e::scenario::parse(
        "description = \"\"\nmachine = \"rome-1p\"\n\
         broker-flags = [\"--collector.core-energy.msr-fallback\"]\n[[scrapes]]\n",
    )
    .unwrap();
    let rig = amd_hsmp_e2e::scenario::Rig::start(&scenario).unwrap();
    let machine = rig.machine();
    let core = machine.topology().cores[3].clone();
    let series = format!("{ENERGY}{{core=\"{}\",socket=\"{}\"}}", core.core, core.socket);
    let set_offline = |offline: &[u32]| {
        let mut faults = machine.faults();
        faults.offline = offline.iter().copied().collect();
        machine.set_faults(faults);
    };
    machine.firmware().advance_all_energy(10.0).unwrap();
    let before = scrape(rig.addr());
    assert_eq!(before.value(&series), Some(10.0), "{}", before.text);
    let cores = energy(&before).len();
    set_offline(&[core.cpu]);
    machine.firmware().advance_all_energy(5.0).unwrap();
    let gone = scrape(rig.addr());
    assert_eq!(gone.value(&series), None, "absent while offline: {}", gone.text);
    assert_eq!(energy(&gone).len(), cores - 1);
    assert!(gone.errors("core-energy") > before.errors("core-energy"));
    set_offline(&[]);
    machine.firmware().advance_all_energy(1.0).unwrap();
    // What the counter did while it could not be read is unknown: the count restarts from 0
    // at the first reading after the return, counted once, and follows the hardware again.
    let back = scrape(rig.addr());
    assert_eq!(back.value(&series), Some(0.0), "{}", back.text);
    let other = format!("{ENERGY}{{core=\"{}\",socket=\"{}\"}}", 0, core.socket);
    assert_eq!(back.value(&other), Some(16.0), "the other cores never stopped");
    let errors = back.errors("core-energy");
    assert!(errors > gone.errors("core-energy"), "the reset is counted: {}", back.text);
    machine.firmware().advance_all_energy(2.0).unwrap();
    let after = scrape(rig.addr());
    assert_eq!(after.value(&series), Some(2.0), "{}", after.text);
    assert_eq!(after.errors("core-energy"), errors, "nothing more is counted");
}

/// Where no socket is held while the broker is down (a container runtime restarting the
/// broker's container after its fresh start), a scrape whose connection the broker closed
/// waits for the broker to listen again instead of reporting it down.
#[test]
fn a_broker_restarted_without_a_held_socket_costs_no_scrape_within_the_patience() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    let log = |n: u32| dir.path().join(format!("broker.{n}.log"));
    let mut broker = harness::start_simulated_broker("milan-1p", &socket, &[], log(0)).unwrap();
    let (_exporter, addr) = harness::start_exporter(&socket, &[], None, dir.path()).unwrap();
    assert_eq!(scrape(addr).value("amd_hsmp_broker_up"), Some(1.0));
    // The broker goes away with the exporter's connection pooled, and its successor listens
    // half a second later (its socket file replaced meanwhile: refused, then absent). The
    // successor is started on this thread: a child dies with the thread that started it.
    broker.kill();
    let during = std::thread::spawn(move || scrape(addr));
    std::thread::sleep(Duration::from_millis(500));
    let _next = harness::start_simulated_broker("milan-1p", &socket, &[], log(1)).unwrap();
    let during = during.join().unwrap();
    assert_eq!(during.value("amd_hsmp_broker_up"), Some(1.0), "{}", during.text);
    assert_eq!(during.errors("broker"), 0.0, "{}", during.text);
}
