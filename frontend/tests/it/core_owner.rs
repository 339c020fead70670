//! The core-owner collector against the mock broker and cgroup trees in temporary directories:
//! off by default, the owner series at scrape time, a failing hierarchy, and the hierarchy read
//! while the broker samples.

use crate::support::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

#[tokio::test]
async fn with_the_collector_off_nothing_of_it_is_in_the_scrape() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let m = scrape(&router(config(&dir.path))).await;
    assert!(!m.mentions("core_owner") && !m.mentions("core-owner"), "{}", m.text);
}

#[tokio::test]
async fn owner_series_follow_the_hierarchy_at_each_scrape() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let cgroups = cgroup_root();
    // The mock's socket 0 is CPUs 0-3 (cores 0, 2, 4, 6), one thread each.
    cgroup(cgroups.path(), "system.slice/slurmstepd.scope/job_1", "0-1");
    let router = router(owner_config(&dir.path, cgroups.path()));
    let m = scrape(&router).await;
    let job = "/system.slice/slurmstepd.scope/job_1";
    for core in ["0", "2"] {
        let series =
            format!(r#"amd_hsmp_core_owner_info{{core="{core}",owner="{job}",socket="0"}}"#);
        assert_eq!(m.value(&series), Some(1.0), "{}", m.text);
    }
    assert_eq!(m.count("amd_hsmp_core_owner_info"), 2);
    assert_eq!(m.errors("core-owner"), 0.0);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "the other families are kept");

    // The job ends and another starts: the next scrape shows it.
    std::fs::remove_dir_all(cgroups.path().join("system.slice/slurmstepd.scope/job_1")).unwrap();
    cgroup(cgroups.path(), "system.slice/slurmstepd.scope/job_2", "4-7");
    let m = scrape(&router).await;
    assert_eq!(m.count("amd_hsmp_core_owner_info"), 4, "{}", m.text);
    assert!(!m.mentions("job_1"));
    assert!(m.mentions(r#"amd_hsmp_core_owner_info{core="6",owner="/system.slice/slurmstepd.scope/job_2",socket="1"} 1"#));
}

#[tokio::test]
async fn a_failing_hierarchy_leaves_the_family_out_and_counts_one_error_per_scrape() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let cgroups = tempfile::tempdir().unwrap();
    // A cgroup v1 host: controller directories, no cgroup.controllers.
    std::fs::create_dir(cgroups.path().join("cpuset")).unwrap();
    let router = router(owner_config(&dir.path, cgroups.path()));
    for n in 1..=3 {
        let m = scrape(&router).await;
        assert_eq!(m.errors("core-owner"), f64::from(n));
        assert!(!m.mentions("amd_hsmp_core_owner_info"), "{}", m.text);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
        assert_eq!(m.errors("broker"), 0.0);
    }
}

/// The hierarchy is read while the broker samples: a cpuset file that is a FIFO holds the read
/// until the test writes it, and the broker receives the scrape's request meanwhile. Read
/// before the broker is asked, the request would never come while the FIFO is unwritten (two
/// worker threads, so that a read blocking one of them does not stop the test's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hierarchy_is_read_while_the_broker_samples() {
    let dir = socket_dir();
    let hold = Arc::new(Semaphore::new(0));
    let behaviour = Behaviour { hold: Some(hold.clone()), ..Behaviour::healthy() };
    let broker = MockBroker::start(&dir.path, behaviour);
    let cgroups = cgroup_root();
    cgroup(cgroups.path(), "job_1", "0-1");
    let fifo = cgroups.path().join("job_1/cpuset.cpus.effective");
    std::fs::remove_file(&fifo).unwrap();
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success(), "mkfifo failed");

    let router = router(owner_config(&dir.path, cgroups.path()));
    let scraping = tokio::spawn(async move { scrape(&router).await });
    let asked = tokio::time::timeout(Duration::from_secs(20), async {
        while broker.samples() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Unblock the read whatever happened, so that no thread is left waiting on the FIFO.
    let writer = tokio::task::spawn_blocking(move || std::fs::write(&fifo, "0-1\n"));
    assert!(asked.is_ok(), "the broker was not asked while the hierarchy was being read");
    writer.await.unwrap().unwrap();
    hold.add_permits(1);
    let m = scraping.await.unwrap();
    assert_eq!(m.count("amd_hsmp_core_owner_info"), 2, "{}", m.text);
    assert_eq!(m.errors("core-owner"), 0.0);
}
