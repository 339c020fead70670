//! Scrapes against the in-process mock broker: healthy answers and every fault the frontend
//! must turn into absent series and counted errors.

use crate::support::*;
use amd_hsmp_proto::{
    DeviceStatus, Families, Family, ItemError, Readings, RequestError, Topology, Unavailable,
};
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

#[tokio::test]
async fn healthy_broker_exports_one_series_per_core_and_socket() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let m = scrape(&router(config(&dir.path))).await;

    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
    assert_eq!(m.value("amd_hsmp_up"), Some(1.0));
    assert_eq!(m.value("amd_hsmp_protocol_version"), Some(7.0));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 8);
    assert_eq!(m.count("amd_hsmp_prochot_active"), 2);
    // Core ids are sysfs core_id (sparse), not CPU numbers or APIC ids.
    assert_eq!(m.value(r#"amd_hsmp_core_energy_joules_total{core="6",socket="1"}"#), Some(1007.0));
    assert_eq!(m.value(r#"amd_hsmp_core_boost_limit_hertz{core="2",socket="0"}"#), Some(3.7e9));
    assert_eq!(m.value(r#"amd_hsmp_prochot_active{socket="1"}"#), Some(1.0));
    assert_eq!(m.value(r#"amd_hsmp_prochot_active{socket="0"}"#), Some(0.0));
    assert_eq!(m.value(r#"amd_hsmp_core_energy_source_info{source="hsmp"}"#), Some(1.0));
    assert!(!m.mentions("amd_hsmp_simulated_info"), "real broker marked simulated");
    for collector in ["hsmp", "core-energy", "boost-limit", "prochot", "scrape", "broker"] {
        assert_eq!(m.errors(collector), 0.0, "{collector}");
    }
    assert_eq!(m.count("amd_hsmp_build_info"), 1);
    assert!(m.value("amd_hsmp_scrape_duration_seconds").is_some());
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(m.value(process).is_some(), "{process} missing:\n{}", m.text);
    }
}

#[tokio::test]
async fn simulated_broker_is_unmistakable_in_the_scrape() {
    let dir = socket_dir();
    let behaviour = Behaviour { simulated: Some("turin-2p".into()), ..Behaviour::healthy() };
    let _broker = MockBroker::start(&dir.path, behaviour);
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value(r#"amd_hsmp_simulated_info{profile="turin-2p"}"#), Some(1.0));
}

#[tokio::test]
async fn unsupported_family_is_absent_and_not_an_error() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| {
            s.readings[Family::BoostLimit] = Readings::Unavailable(Unavailable::Unsupported)
        }),
    );
    let m = scrape(&router(config(&dir.path))).await;
    assert!(!m.mentions("amd_hsmp_core_boost_limit_hertz"), "{}", m.text);
    assert_eq!(m.errors("boost-limit"), 0.0);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
}

#[tokio::test]
async fn one_failing_core_omits_only_its_series_and_counts_cumulatively() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| {
            fail_item(&mut s.readings[Family::CoreEnergy], 5, ItemError::Io { errno: 5 });
            fail_item(&mut s.readings[Family::Prochot], 0, ItemError::TimedOut);
        }),
    );
    let router = router(config(&dir.path));
    let m = scrape(&router).await;
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 7);
    // Core 5 of the topology is socket 1, core_id 2.
    assert_eq!(m.value(r#"amd_hsmp_core_energy_joules_total{core="2",socket="1"}"#), None);
    assert!(m.value(r#"amd_hsmp_core_energy_joules_total{core="0",socket="1"}"#).is_some());
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 8);
    assert_eq!(m.value(r#"amd_hsmp_prochot_active{socket="0"}"#), None);
    assert_eq!(m.value(r#"amd_hsmp_prochot_active{socket="1"}"#), Some(1.0));
    assert_eq!(m.errors("core-energy"), 1.0);
    assert_eq!(m.errors("prochot"), 1.0);
    assert_eq!(m.errors("boost-limit"), 0.0);

    let m = scrape(&router).await;
    assert_eq!(m.errors("core-energy"), 2.0, "errors are cumulative over the process life");
}

#[tokio::test]
async fn device_missing_reports_down_without_telemetry_or_error() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| {
            s.hsmp = DeviceStatus::Absent;
            s.readings[Family::CoreEnergy] = Readings::Unavailable(Unavailable::NoDevice);
            s.readings[Family::BoostLimit] = Readings::Unavailable(Unavailable::NoDevice);
            s.readings[Family::Prochot] = Readings::Unavailable(Unavailable::NoDevice);
        }),
    );
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    for absent in [
        "amd_hsmp_protocol_version",
        "amd_hsmp_core_energy",
        "amd_hsmp_core_boost_limit_hertz",
        "amd_hsmp_prochot_active",
    ] {
        assert!(!m.mentions(absent), "{absent} present:\n{}", m.text);
    }
    assert_eq!(m.errors("hsmp"), 0.0);
}

#[tokio::test]
async fn failed_device_counts_under_hsmp() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| s.hsmp = DeviceStatus::Failed(ItemError::TimedOut)),
    );
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    assert_eq!(m.errors("hsmp"), 1.0);
}

#[tokio::test]
async fn broker_down_answers_200_with_broker_up_0_then_reconnects() {
    let dir = socket_dir();
    let router = router(config(&dir.path));

    let m = scrape(&router).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0));
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    assert_eq!(m.errors("broker"), 1.0);
    assert!(!m.mentions("amd_hsmp_core_energy"), "{}", m.text);
    assert!(!m.mentions("amd_hsmp_protocol_version"));

    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let m = scrape(&router).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "no reconnect:\n{}", m.text);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!(m.errors("broker"), 1.0);
    assert_eq!(broker.hellos(), 1);
}

#[tokio::test]
async fn restarted_broker_is_reconnected_and_its_new_topology_used() {
    let dir = socket_dir();
    let router = router(config(&dir.path));
    let first = MockBroker::start(&dir.path, Behaviour::healthy());
    assert_eq!(scrape(&router).await.count("amd_hsmp_core_energy_joules_total"), 8);
    drop(first);
    std::fs::remove_file(&dir.path).unwrap();

    let second = Behaviour { topology: topology(1, 3), instance: 2, ..Behaviour::healthy() };
    let second = MockBroker::start(&dir.path, second);
    let m = scrape(&router).await;
    // The stale connection is replaced within the same scrape: no gap, no error.
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", m.text);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 3);
    assert_eq!(m.count("amd_hsmp_prochot_active"), 1);
    assert_eq!(m.errors("broker"), 0.0);
    assert_eq!(second.hellos(), 1);
}

#[tokio::test]
async fn connection_is_reused_across_scrapes() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let router = router(config(&dir.path));
    for _ in 0..3 {
        scrape(&router).await;
    }
    assert_eq!(broker.samples(), 3);
    assert_eq!(broker.hellos(), 1);
    assert_eq!(broker.seen.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn timeout_header_is_capped_by_the_max_scrape_timeout_flag() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let mut config = config(&dir.path);
    config.max_scrape_timeout = Duration::from_secs(2);
    let answer = get(&router(config), "/metrics", None, Some("60")).await;
    assert_eq!(answer.status, StatusCode::OK);
    broker.assert_deadlines(1800, 1);
}

#[tokio::test]
async fn items_left_unread_at_the_deadline_are_absent_and_count_scrape_once() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| {
            for i in 4..8 {
                fail_item(&mut s.readings[Family::CoreEnergy], i, ItemError::DeadlineExceeded);
                fail_item(&mut s.readings[Family::BoostLimit], i, ItemError::DeadlineExceeded);
            }
        }),
    );
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 4);
    assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 4);
    assert_eq!(m.errors("scrape"), 1.0);
    assert_eq!(m.errors("core-energy"), 0.0);
    assert_eq!(m.errors("boost-limit"), 0.0);
}

#[tokio::test]
async fn disabled_collector_is_never_asked_of_the_broker() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let mut config = config(&dir.path);
    config.families = Families::of(&[Family::CoreEnergy]);
    let m = scrape(&router(config)).await;
    assert_eq!(*broker.seen.families.lock().unwrap(), vec![Families::of(&[Family::CoreEnergy])]);
    assert!(!m.mentions("amd_hsmp_core_boost_limit_hertz"));
    assert!(!m.mentions("amd_hsmp_prochot_active"));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
}

#[tokio::test]
async fn energy_source_info_follows_the_energy_family() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let mut config = config(&dir.path);
    config.families = Families::ALL.without(Family::CoreEnergy);
    let m = scrape(&router(config)).await;
    assert!(!m.mentions("amd_hsmp_core_energy"), "{}", m.text);
    assert_eq!(broker.samples(), 1);
}

/// Regression (P4): a broker that turned the exporter away (its uid at the per-uid limit while
/// its old connections were still held) closed without a word, and the scrape exported
/// `amd_hsmp_broker_up 0`. Now it says why, and the exporter tries once more.
#[tokio::test]
async fn a_connection_turned_away_once_is_retried_and_the_scrape_is_complete() {
    let dir = socket_dir();
    let behaviour = Behaviour::healthy();
    behaviour.turn_away.store(1, std::sync::atomic::Ordering::SeqCst);
    let broker = MockBroker::start(&dir.path, behaviour);
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", m.text);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!((m.errors("broker"), m.errors("scrape")), (0.0, 0.0));
    assert_eq!((broker.connections(), broker.hellos()), (2, 1));
}

/// A broker that keeps turning the exporter away is up: the scrape has no telemetry and counts
/// the failed request, but `amd_hsmp_broker_up` keeps its last value rather than reading as an
/// outage.
#[tokio::test]
async fn a_broker_that_keeps_turning_the_exporter_away_is_not_an_outage() {
    let dir = socket_dir();
    let first = MockBroker::start(&dir.path, Behaviour::healthy());
    let router = router(config(&dir.path));
    let m = scrape(&router).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
    // The broker closes the pooled connection, and turns every new one away.
    drop(first);
    std::fs::remove_file(&dir.path).unwrap();
    let behaviour = Behaviour::healthy();
    behaviour.turn_away.store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    let broker = MockBroker::start(&dir.path, behaviour);
    let m = scrape(&router).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", m.text);
    assert!(!m.mentions("amd_hsmp_core_energy"), "{}", m.text);
    assert_eq!(m.errors("broker"), 1.0);
    assert_eq!(broker.connections(), 2, "turned away, then once more after the pause");
    assert_eq!(broker.hellos(), 0);
}

#[tokio::test]
async fn refused_handshake_counts_as_broker_down() {
    let dir = socket_dir();
    let behaviour = Behaviour {
        refuse_hello: Some(RequestError::VersionMismatch { broker: 99, peer: 1 }),
        ..Behaviour::healthy()
    };
    let broker = MockBroker::start(&dir.path, behaviour);
    let m = scrape(&router(config(&dir.path))).await;
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(0.0));
    assert_eq!(m.errors("broker"), 1.0);
    assert_eq!(broker.samples(), 0);
}

#[tokio::test]
async fn reply_not_aligned_with_the_topology_drops_that_family() {
    let dir = socket_dir();
    let _broker = MockBroker::start(
        &dir.path,
        Behaviour::edited(|s| {
            if let Readings::Values(values) = &mut s.readings[Family::BoostLimit] {
                values.pop();
            }
        }),
    );
    let m = scrape(&router(config(&dir.path))).await;
    assert!(!m.mentions("amd_hsmp_core_boost_limit_hertz"));
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!(m.errors("broker"), 1.0);
}

#[tokio::test]
async fn accept_header_selects_openmetrics_or_the_text_format() {
    let dir = socket_dir();
    let _broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let router = router(config(&dir.path));

    let om = get(&router, "/metrics", Some(PROMETHEUS_ACCEPT), None).await;
    assert_eq!(om.content_type, OPENMETRICS);
    assert!(om.body.ends_with("# EOF\n"));
    assert!(om.body.contains("# TYPE amd_hsmp_core_energy_joules counter\n"));
    assert!(om.body.contains("# UNIT amd_hsmp_core_energy_joules joules\n"));

    for accept in [None, Some("*/*"), Some("text/plain")] {
        let text = get(&router, "/metrics", accept, None).await;
        assert_eq!(text.content_type, TEXT_004, "{accept:?}");
        assert!(!text.body.contains("# EOF"));
        assert!(text.body.contains("# TYPE amd_hsmp_core_energy_joules_total counter\n"));
    }
}

#[tokio::test]
async fn landing_page_links_the_telemetry_path_and_other_paths_are_404() {
    let dir = socket_dir();
    let mut config = config(&dir.path);
    config.telemetry_path = "/hsmp/metrics".into();
    let router = router(config);

    let page = get(&router, "/", None, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.content_type.starts_with("text/html"), "{}", page.content_type);
    assert!(page.body.contains("<a href=\"/hsmp/metrics\">"), "{}", page.body);
    assert!(page.body.contains(env!("CARGO_PKG_VERSION")));

    assert_eq!(get(&router, "/metrics", None, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&router, "/favicon.ico", None, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&router, "/hsmp/metrics", None, None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn timeout_header_of_1e300_gets_a_full_answer_not_a_dropped_connection() {
    // Regression: `1e300` panicked the request task, which dropped the connection unanswered.
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let router = router(config(&dir.path));
    for header in ["1e300", "inf", "NaN", "-1", "0", "garbage"] {
        let answer = get(&router, "/metrics", None, Some(header)).await;
        assert_eq!(answer.status, StatusCode::OK, "{header}");
        let m = Exposition::parse(&answer.body);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "{header}");
    }
    // Each of them fell back to the cap: 10 s minus the 250 ms margin.
    broker.assert_deadlines(9750, 6);
}

#[tokio::test]
async fn timeout_header_below_the_minimum_is_raised_to_it() {
    let dir = socket_dir();
    let broker = MockBroker::start(&dir.path, Behaviour::healthy());
    let router = router(config(&dir.path));
    let answer = get(&router, "/metrics", None, Some("0.001")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(Exposition::parse(&answer.body).count("amd_hsmp_core_energy_joules_total"), 8);
    // 0.1 s minus a 10 % margin.
    broker.assert_deadlines(90, 1);
}

/// A broker that cannot finish in a short deadline: below `ms` milliseconds, every second
/// core's energy and boost limit are left unread.
fn partial_below(ms: u32) -> Responder {
    Arc::new(move |t, what, deadline_ms| {
        let mut s = healthy(t, what, deadline_ms);
        if deadline_ms < ms {
            for i in (1..t.cores.len()).step_by(2) {
                fail_item(&mut s.readings[Family::CoreEnergy], i, ItemError::DeadlineExceeded);
                fail_item(&mut s.readings[Family::BoostLimit], i, ItemError::DeadlineExceeded);
            }
        }
        s
    })
}

/// A broker whose `n`th answer leaves the energy and boost limit of its first `unread[n]` cores
/// unread (the last count for every later answer).
fn unread_by_answer(unread: &'static [usize]) -> Responder {
    let answers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Arc::new(move |t, what, deadline_ms| {
        let mut s = healthy(t, what, deadline_ms);
        let n = answers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for i in 0..unread[n.min(unread.len() - 1)] {
            fail_item(&mut s.readings[Family::CoreEnergy], i, ItemError::DeadlineExceeded);
            fail_item(&mut s.readings[Family::BoostLimit], i, ItemError::DeadlineExceeded);
        }
        s
    })
}

fn held(respond: Responder) -> (Behaviour, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    (Behaviour { respond, hold: Some(gate.clone()), ..Behaviour::healthy() }, gate)
}

/// One scrape let through `gate`: the broker's first answer states its freshness bound, without
/// which no scrape joins another's flight.
async fn first_answer(router: &axum::Router, gate: &Semaphore) {
    gate.add_permits(1);
    scrape(router).await;
}

#[tokio::test]
async fn concurrent_scrapes_with_the_same_timeout_share_one_broker_request() {
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    first_answer(&router, &gate).await;

    let first = spawn_scrape(&router, "10");
    until("the first scrape's Sample reached the broker", || broker.samples() == 2).await;
    let second = spawn_scrape(&router, "10");
    // Hold the reply until the second scrape has joined the first one's flight.
    until("the second scrape joined", || exporter.joins() == 1).await;
    gate.add_permits(1);
    for answer in [first.await.unwrap(), second.await.unwrap()] {
        let m = Exposition::parse(&answer.body);
        assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0));
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    }
    assert_eq!(broker.samples(), 2, "two concurrent scrapes must share one Sample request");

    // Once the flight has landed, the next scrape asks again.
    gate.add_permits(1);
    scrape(&router).await;
    assert_eq!(broker.samples(), 3);
}

/// Regression (P5): a scrape 0.7 s after another with the same 10 s timeout joined its flight
/// (their deadlines are within a tenth of the budget), although with the broker's bound of
/// 0.5 s nothing that flight read could be served to it; it waited for the whole flight,
/// discarded the answer and asked again with the time left, getting less. It starts its own
/// flight (the broker shares the reads) and gets the whole sample.
#[tokio::test(start_paused = true)]
async fn a_scrape_past_the_bound_after_a_flight_started_flies_its_own_and_gets_everything() {
    let dir = socket_dir();
    // The broker's default bound (0.5 s); a request with less than 8 s leaves half the cores
    // unread, as a socket that takes about 7 s to read would.
    let (behaviour, gate) = held(partial_below(8_000));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    first_answer(&router, &gate).await;

    let first = spawn_scrape(&router, "10");
    until("the first scrape's Sample reached the broker", || broker.samples() == 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = spawn_scrape(&router, "10");
    until("the second scrape flew or joined", || broker.samples() == 3 || exporter.joins() == 1)
        .await;
    // The first flight lands after a slow read, 7 s in.
    tokio::time::sleep(Duration::from_millis(6_300)).await;
    gate.add_permits(3);
    for answer in [first.await.unwrap(), second.await.unwrap()] {
        let m = Exposition::parse(&answer.body);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "{}", m.text);
        assert_eq!(m.count("amd_hsmp_core_boost_limit_hertz"), 8);
    }
    assert_eq!(exporter.joins(), 0);
    assert_eq!(broker.samples(), 3);
}

/// A scrape that joins a flight gets its answer only if every value in it was read no earlier
/// than the broker's freshness bound before the scrape itself arrived; otherwise it asks again.
/// The join rule lets it join only within the bound after the flight started, but the broker
/// may answer with values it read for an earlier request.
#[tokio::test(start_paused = true)]
async fn a_joined_answer_older_than_the_bound_for_the_joiner_is_never_served_to_it() {
    let dir = socket_dir();
    // The broker's bound is 50 ms, and its oldest value was read 40 ms before the request came.
    let (behaviour, gate) = held(Arc::new(|t: &Topology, what, deadline| {
        let mut sample = healthy(t, what, deadline);
        sample.max_age_ms = 50;
        sample.oldest_read_us = 40_000;
        sample
    }));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    first_answer(&router, &gate).await;

    let first = spawn_scrape(&router, "10");
    until("the first scrape's Sample reached the broker", || broker.samples() == 2).await;
    // Within the bound after the first request was sent, more than the 10 ms it leaves for a
    // value read 40 ms before.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = spawn_scrape(&router, "10");
    until("the second scrape joined", || exporter.joins() == 1).await;
    gate.add_permits(1);
    until("the joiner asked again", || broker.samples() == 3).await;
    gate.add_permits(1);
    for answer in [first.await.unwrap(), second.await.unwrap()] {
        let m = Exposition::parse(&answer.body);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "{}", m.text);
        assert_eq!(m.errors("scrape"), 0.0);
    }
    assert_eq!(broker.samples(), 3);
}

#[tokio::test]
async fn a_scrape_never_joins_a_flight_with_a_shorter_timeout() {
    // D2: a client sending a 1 ms timeout header must not cost Prometheus' scrape any data.
    let dir = socket_dir();
    let (behaviour, gate) = held(partial_below(500));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));

    let hasty = spawn_scrape(&router, "0.001");
    until("the hasty Sample reached the broker", || broker.samples() == 1).await;
    let patient = spawn_scrape(&router, "10");
    until("the patient scrape sent its own Sample", || broker.samples() == 2).await;
    gate.add_permits(2);
    let patient = Exposition::parse(&patient.await.unwrap().body);
    assert_eq!(patient.count("amd_hsmp_core_energy_joules_total"), 8, "{}", patient.text);
    assert_eq!(patient.count("amd_hsmp_core_boost_limit_hertz"), 8);
    assert_eq!(patient.value("amd_hsmp_broker_up"), Some(1.0));
    assert_eq!(hasty.await.unwrap().status, StatusCode::OK);
    assert_eq!(exporter.joins(), 0);
    let deadlines = broker.seen.deadlines_ms.lock().unwrap().clone();
    assert!(deadlines[0] <= 90 && deadlines[1] > 9000, "{deadlines:?}");
}

#[tokio::test]
async fn a_short_scrape_never_joins_a_longer_flight_and_is_answered_in_time() {
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));

    let patient = spawn_scrape(&router, "10");
    until("the patient Sample reached the broker", || broker.samples() == 1).await;
    let hasty = spawn_scrape(&router, "2");
    until("the hasty scrape sent its own Sample", || broker.samples() == 2).await;
    gate.add_permits(2);
    let hasty = Exposition::parse(&hasty.await.unwrap().body);
    assert_eq!(hasty.count("amd_hsmp_core_energy_joules_total"), 8, "{}", hasty.text);
    let patient = Exposition::parse(&patient.await.unwrap().body);
    assert_eq!(patient.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!(exporter.joins(), 0);
}

/// A scrape that starts a flight and one that joins it, against a broker whose answers leave
/// cores unread as [`unread_by_answer`] says (the first answer, before theirs, states the
/// bound): their expositions and how many Samples the broker was asked.
async fn a_starter_and_a_joiner(unread: &'static [usize]) -> (Exposition, Exposition, usize) {
    let dir = socket_dir();
    let (behaviour, gate) = held(unread_by_answer(unread));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    first_answer(&router, &gate).await;

    let starter = spawn_scrape(&router, "10");
    until("the starter's Sample reached the broker", || broker.samples() == 2).await;
    let joiner = spawn_scrape(&router, "10");
    until("the second scrape joined", || exporter.joins() == 1).await;
    gate.add_permits(2);
    let starter = Exposition::parse(&starter.await.unwrap().body);
    let joiner = Exposition::parse(&joiner.await.unwrap().body);
    (starter, joiner, broker.samples())
}

#[tokio::test]
async fn a_joiner_whose_flight_came_back_partial_asks_again_with_its_own_deadline() {
    // The starter's Sample comes back with half its cores unread; the others are complete.
    let (starter, joiner, samples) = a_starter_and_a_joiner(&[0, 4, 0]).await;
    // The starter had its own full deadline: what it got is what there was.
    assert_eq!(starter.count("amd_hsmp_core_energy_joules_total"), 4);
    // The joiner had time left and asked again.
    assert_eq!(joiner.count("amd_hsmp_core_energy_joules_total"), 8, "{}", joiner.text);
    assert_eq!(samples, 3);
}

/// The retry after a partial joined answer has only the time the joined flight's shorter
/// deadline left, and the broker measures its freshness from its own arrival: on a slow socket
/// it brings back less than the partial answer it follows. The scrape keeps the fuller one.
#[tokio::test]
async fn a_joiner_keeps_its_partial_answer_when_asking_again_brings_back_less() {
    // The starter's Sample has half its cores unread, the joiner's retry all of them.
    let (starter, joiner, samples) = a_starter_and_a_joiner(&[0, 4, 8]).await;
    assert_eq!(starter.count("amd_hsmp_core_energy_joules_total"), 4);
    assert_eq!(samples, 3, "the joiner asked again");
    assert_eq!(joiner.count("amd_hsmp_core_energy_joules_total"), 4, "{}", joiner.text);
    assert_eq!(joiner.count("amd_hsmp_core_boost_limit_hertz"), 4);
}

#[tokio::test]
async fn scrape_that_times_out_answers_in_time_and_keeps_broker_up() {
    // D13: running out of time is not the broker being down.
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let router = router(config(&dir.path));

    let answer = get(&router, "/metrics", None, Some("0.5")).await;
    assert_eq!(answer.status, StatusCode::OK);
    let m = Exposition::parse(&answer.body);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", m.text);
    assert_eq!(m.value("amd_hsmp_up"), Some(0.0));
    assert!(!m.mentions("amd_hsmp_core_energy"), "{}", m.text);
    assert_eq!(m.errors("scrape"), 1.0);
    assert_eq!(m.errors("broker"), 0.0);
    // 0.5 s minus a 10 % margin.
    broker.assert_deadlines(450, 1);
    gate.add_permits(1);
}

#[tokio::test]
async fn flight_that_runs_out_of_time_keeps_its_broker_connection() {
    // The broker answers at its deadline; a late reply within the grace is read and the
    // connection goes back to the pool instead of being dropped (D2).
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let router = router(config(&dir.path));
    let m = Exposition::parse(&get(&router, "/metrics", None, Some("0.3")).await.body);
    assert_eq!(m.errors("scrape"), 1.0);
    // The reply comes after the scrape gave up, within the grace.
    gate.add_permits(1);
    until("the late reply was written", || broker.replies() == 1).await;

    gate.add_permits(1);
    let m = Exposition::parse(&get(&router, "/metrics", None, Some("5")).await.body);
    assert_eq!(m.value("amd_hsmp_broker_up"), Some(1.0), "{}", m.text);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8);
    assert_eq!(m.errors("broker"), 0.0);
    assert_eq!(broker.hellos(), 1, "the connection was dropped");
}

#[tokio::test]
async fn connection_without_a_reply_past_the_grace_is_dropped_and_replaced() {
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    let m = Exposition::parse(&get(&router, "/metrics", None, Some("0.2")).await.body);
    assert_eq!(m.errors("scrape"), 1.0);
    // Never answered: after deadline + grace the flight gives the connection up.
    until("the stuck flight was given up", || exporter.flying() == 0).await;
    gate.add_permits(2);
    let m = Exposition::parse(&get(&router, "/metrics", None, Some("5")).await.body);
    assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "{}", m.text);
    assert_eq!(broker.hellos(), 2, "a new connection was expected");
    // The stuck request's late reply went to the dropped connection, not to this scrape.
    assert!(m.errors("broker") >= 1.0);
}

#[tokio::test]
async fn at_most_two_broker_connections_whatever_the_number_of_distinct_deadlines() {
    let dir = socket_dir();
    let (behaviour, gate) = held(Arc::new(healthy));
    let broker = MockBroker::start(&dir.path, behaviour);
    let (exporter, router) = exporter_and_router(config(&dir.path));
    // Deadlines far enough apart that none suits another.
    let scrapes: Vec<_> =
        ["1", "3", "9"].into_iter().map(|timeout| spawn_scrape(&router, timeout)).collect();
    until("two Samples in flight", || broker.samples() == 2).await;
    until("three flights in the air", || exporter.flying() == 3).await;
    gate.add_permits(3);
    for scrape in scrapes {
        let m = Exposition::parse(&scrape.await.unwrap().body);
        assert_eq!(m.count("amd_hsmp_core_energy_joules_total"), 8, "{}", m.text);
    }
    assert_eq!(broker.samples(), 3);
    assert_eq!(broker.connections(), 2, "the third scrape waited for a pooled connection");
    assert_eq!(exporter.joins(), 0);
}
