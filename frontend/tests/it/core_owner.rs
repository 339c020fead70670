//! The core-owner collector against the mock broker and cgroup trees in temporary directories:
//! off by default, the owner series at scrape time, a failing hierarchy, and the hierarchy read
//! while the broker samples.

use crate::support::*;
use amd_hsmp_exporter::scrape::Config;
use axum::http::StatusCode;
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
        let series = format!(
            r#"amd_hsmp_core_owner_info{{core="{core}",owner="{job}",socket="0",hpc_job="1"}}"#
        );
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
    assert!(!m.mentions(
        r#"amd_hsmp_core_owner_info{core="0",owner="/system.slice/slurmstepd.scope/job_1""#
    ));
    // Its energy counter stays for the linger, so that its last value is scraped.
    let ended =
        format!(r#"amd_hsmp_workload_core_energy_joules_total{{owner="{job}",hpc_job="1"}}"#);
    assert!(m.value(&ended).is_some(), "{}", m.text);
    assert!(m.mentions(r#"amd_hsmp_core_owner_info{core="6",owner="/system.slice/slurmstepd.scope/job_2",socket="1",hpc_job="2"} 1"#));
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

/// A mock broker whose replies wait for `hold`, and a hierarchy where job_1 owns cores 0 and 2.
struct Held {
    dir: SocketDir,
    hold: Arc<Semaphore>,
    broker: MockBroker,
    cgroups: tempfile::TempDir,
}

fn held_broker_and_one_job() -> Held {
    let dir = socket_dir();
    let hold = Arc::new(Semaphore::new(0));
    let behaviour = Behaviour { hold: Some(hold.clone()), ..Behaviour::healthy() };
    let broker = MockBroker::start(&dir.path, behaviour);
    let cgroups = cgroup_root();
    cgroup(cgroups.path(), "job_1", "0-1");
    Held { dir, hold, broker, cgroups }
}

/// Once the broker has told the topology, the hierarchy is walked while the broker samples:
/// with the broker's reply held, the walk has happened before the broker answers.
#[tokio::test]
async fn the_hierarchy_is_walked_while_the_broker_samples() {
    let Held { dir, hold, broker, cgroups } = held_broker_and_one_job();
    let config =
        Config { core_owner_max_age: Duration::ZERO, ..owner_config(&dir.path, cgroups.path()) };
    let (exporter, router) = exporter_and_router(config);
    hold.add_permits(1);
    let first = scrape(&router).await;
    assert_eq!(first.count("amd_hsmp_core_owner_info"), 2, "{}", first.text);
    let scraping = tokio::spawn(async move { scrape(&router).await });
    until("the broker is asked and the hierarchy walked", || {
        broker.samples() == 2 && exporter.owner_walks() == 2
    })
    .await;
    hold.add_permits(1);
    let m = scraping.await.unwrap();
    assert_eq!(m.count("amd_hsmp_core_owner_info"), 2, "{}", m.text);
    assert_eq!(m.value("amd_hsmp_core_owner_skipped_cgroups"), Some(0.0), "{}", m.text);
    assert_eq!(m.errors("core-owner"), 0.0);
}

/// Regression (Q4): the walks before the broker's first answer bounded CPU sets by 65,536
/// CPUs, not the machine's: 8 KiB for each cgroup listing `0-65535` on a hostile hierarchy
/// (168 MB for 20,000, and more with every scrape while the broker was down). The walk now
/// waits for the answer that tells the topology, and none runs without one.
#[tokio::test]
async fn no_walk_runs_before_the_broker_has_told_the_topology() {
    let Held { dir, hold, broker, cgroups } = held_broker_and_one_job();
    let (exporter, router) = exporter_and_router(owner_config(&dir.path, cgroups.path()));
    let scraping = tokio::spawn(async move { scrape(&router).await });
    until("the broker is asked", || broker.samples() == 1).await;
    // Time for a walk to begin, were it to run beside the held request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(exporter.owner_walks(), 0, "a walk began before the topology was known");
    hold.add_permits(1);
    let m = scraping.await.unwrap();
    assert_eq!(exporter.owner_walks(), 1);
    assert_eq!(
        m.count("amd_hsmp_core_owner_info"),
        2,
        "the first scrape has its owners: {}",
        m.text
    );

    // With no broker at all, scrapes walk nothing.
    let down = socket_dir();
    let (exporter, router) = exporter_and_router(owner_config(&down.path, cgroups.path()));
    for _ in 0..3 {
        let m = scrape(&router).await;
        assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0), "{}", m.text);
    }
    assert_eq!(exporter.owner_walks(), 0, "walks without a topology");
}

/// P2: concurrent scrapes share one walk, and scrapes that hang up leave the work they
/// started holding their place in `--web.max-requests` until it ends, so a flood of hang-ups
/// is bounded by that flag, not by the threads a runtime will start.
#[tokio::test]
async fn scrapes_that_hang_up_free_their_place_only_when_their_work_ends() {
    let Held { dir, hold, broker, cgroups } = held_broker_and_one_job();
    let config = Config {
        max_requests: 3,
        core_owner_max_age: Duration::from_secs(60),
        ..owner_config(&dir.path, cgroups.path())
    };
    let (exporter, router) = exporter_and_router(config);
    // A first answer tells the topology; its walk serves the scrapes below (60 s).
    hold.add_permits(1);
    scrape(&router).await;
    // Three scrapes start and hang up while the broker holds its reply: their request
    // futures are dropped, the flight they share keeps flying.
    let hung: Vec<_> = (0..3).map(|_| spawn_scrape(&router, "5")).collect();
    until("the broker is asked", || broker.samples() >= 2).await;
    until("the walk", || exporter.owner_walks() == 1).await;
    for scrape in &hung {
        scrape.abort();
    }
    for scrape in hung {
        let _ = scrape.await;
    }
    // The flight still holds the place of the scrape that started it: a flood of hang-ups
    // meets 503s, not a new broker request or walk each.
    let crowd: Vec<_> = (0..5).map(|_| spawn_scrape(&router, "0.5")).collect();
    let mut refused = 0;
    let mut answered = Vec::new();
    for scrape in crowd {
        let answer = scrape.await.unwrap();
        if answer.status == StatusCode::SERVICE_UNAVAILABLE {
            refused += 1;
        } else {
            answered.push(answer);
        }
    }
    assert!(refused >= 3, "only {refused} of 5 refused while the flight held its place");
    assert_eq!(exporter.owner_walks(), 1, "every scrape shared the one walk");
    hold.add_permits(100);
    until("the held flight lands", || exporter.flying() == 0).await;
    let m = scrape(&router).await;
    assert_eq!(m.count("amd_hsmp_core_owner_info"), 2, "{}", m.text);
    assert_eq!(exporter.owner_walks(), 1, "a walk is shared while it is fresh");
}

/// P8: the landing page shows no owners and reads nothing of the hierarchy.
#[tokio::test]
async fn a_page_view_reads_nothing_of_the_hierarchy() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let cgroups = cgroup_root();
    cgroup(cgroups.path(), "job_1", "0-1");
    let (exporter, router) = exporter_and_router(owner_config(&dir.path, cgroups.path()));
    let page = get(&router, "/", None, None).await;
    assert_eq!(page.status, StatusCode::OK);
    // The first view has nothing to take power from: it takes a second sample a second later.
    assert_eq!(broker.samples(), 2, "the first view costs two samples");
    let page = get(&router, "/", None, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(broker.samples(), 3, "a later view costs one sample");
    assert_eq!(exporter.owner_walks(), 0, "and no walk of the hierarchy");
    scrape(&router).await;
    assert_eq!(exporter.owner_walks(), 1);
}
