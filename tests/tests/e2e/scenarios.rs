//! The scenarios: the real `amd-hsmp-broker` and `amd-hsmp-exporter` against the FUSE
//! fake device and a fixture machine, scraped over HTTP and compared with golden files, plus
//! the wire-level assertions that a golden file cannot express.
//!
//! Refresh the golden files with `UPDATE_GOLDEN=1 cargo test -p amd-hsmp-e2e --
//! --include-ignored` and review the diff; see `tests/README.md`.

use amd_hsmp_device::Message;
use amd_hsmp_e2e::fake::{self, Node};
use amd_hsmp_e2e::scenario::{self, Outcome, Rig, Traffic, golden_names};
use amd_hsmp_e2e::{fixtures, golden};
use amd_hsmp_proto::Topology;
use std::path::Path;

/// Runs scenario `name` and compares every scrape (and, unless the scenario opts out, the
/// per-scrape message counts) with its golden files.
fn check(name: &str) -> Outcome {
    let outcome = scenario::run(name).unwrap_or_else(|e| panic!("scenario {name}: {e:?}"));
    let spec = scenario::load(name).unwrap();
    let mut failures = Vec::new();
    let files = golden_names(name, &spec.scrapes);
    for (((response, _), file), scrape) in outcome.scrapes.iter().zip(files).zip(&spec.scrapes) {
        let masked = if scrape.page {
            golden::mask_page(&response.body)
        } else {
            golden::mask(&response.body)
        };
        if let Err(e) = golden::check(&file, &masked) {
            failures.push(e);
        }
    }
    if outcome.wire_golden
        && let Err(e) = golden::check(&format!("{name}.wire"), &outcome.wire())
    {
        failures.push(e);
    }
    assert!(failures.is_empty(), "scenario {name}:\n{}", failures.join("\n\n"));
    outcome
}

/// One test per scenario file, so they run in parallel and fail one by one.
macro_rules! scenarios {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            #[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
            fn $test() {
                check($name);
            }
        )*
        const SCENARIOS: &[&str] = &[$($name),*];
    };
}

scenarios! {
    broker_absent => "broker-absent",
    genoa_2p_boost_collector_off => "genoa-2p-boost-collector-off",
    genoa_2p_device_absent => "genoa-2p-device-absent",
    genoa_2p_msr_absent => "genoa-2p-msr-absent",
    genoa_2p_msr_fallback => "genoa-2p-msr-fallback",
    genoa_2p_msr_wrap => "genoa-2p-msr-wrap",
    genoa_2p_no_rapl => "genoa-2p-no-rapl",
    genoa_2p_permission_denied => "genoa-2p-permission-denied",
    healthy_bergamo_1p => "healthy-bergamo-1p",
    healthy_genoa_2p => "healthy-genoa-2p",
    healthy_genoa_2p_cpu_offline => "healthy-genoa-2p-cpu-offline",
    healthy_genoa_2p_smt_off => "healthy-genoa-2p-smt-off",
    healthy_milan_1p => "healthy-milan-1p",
    healthy_milan_1p_text_format => "healthy-milan-1p-text-format",
    healthy_rome_1p => "healthy-rome-1p",
    healthy_siena_1p => "healthy-siena-1p",
    healthy_turin_2p => "healthy-turin-2p",
    healthy_venice_2p => "healthy-venice-2p",
    landing_genoa_2p => "landing-genoa-2p",
    landing_milan_1p_no_energy => "landing-milan-1p-no-energy",
    landing_rome_1p_msr_fallback => "landing-rome-1p-msr-fallback",
    landing_turin_2p => "landing-turin-2p",
    landing_turin_2p_thermal_event => "landing-turin-2p-thermal-event",
    milan_1p_late_device => "milan-1p-late-device",
    rome_1p_msr_fallback => "rome-1p-msr-fallback",
    turin_2p_core_errors => "turin-2p-core-errors",
    turin_2p_core_owner_kubelet => "turin-2p-core-owner-kubelet",
    turin_2p_core_owner_kubelet_cgroupfs => "turin-2p-core-owner-kubelet-cgroupfs",
    turin_2p_core_owner_kubelet_dra => "turin-2p-core-owner-kubelet-dra",
    turin_2p_core_owner_libvirt => "turin-2p-core-owner-libvirt",
    turin_2p_core_owner_slurm => "turin-2p-core-owner-slurm",
    turin_2p_core_owner_slurm_job_id_paths => "turin-2p-core-owner-slurm-job-id-paths",
    turin_2p_core_owner_slurm_multiple_slurmd => "turin-2p-core-owner-slurm-multiple-slurmd",
    turin_2p_core_owner_slurm_sluid => "turin-2p-core-owner-slurm-sluid",
    turin_2p_core_owner_systemd => "turin-2p-core-owner-systemd",
    turin_2p_core_owner_unreadable => "turin-2p-core-owner-unreadable",
    turin_2p_core_owner_v1_host => "turin-2p-core-owner-v1-host",
    turin_2p_prochot_and_boost => "turin-2p-prochot-and-boost",
    turin_2p_protocol_5 => "turin-2p-protocol-5",
    turin_2p_rapl_unsupported => "turin-2p-rapl-unsupported",
    turin_2p_wedged_socket => "turin-2p-wedged-socket",
}

#[test]
fn every_scenario_file_has_a_test() {
    let mut listed: Vec<&str> = SCENARIOS.to_vec();
    listed.sort_unstable();
    assert_eq!(listed, scenario::names().unwrap(), "add the scenario to `scenarios!` in e2e.rs");
}

/// Golden files of scenarios that no longer exist are removed by a refresh, and fail the suite
/// otherwise.
#[test]
fn every_golden_file_belongs_to_a_scenario() {
    let mut expected = Vec::new();
    for name in SCENARIOS {
        let spec = scenario::load(name).unwrap();
        expected.extend(golden_names(name, &spec.scrapes));
        if spec.wire_golden {
            expected.push(format!("{name}.wire"));
        }
    }
    expected.sort();
    let mut present: Vec<String> = std::fs::read_dir(golden::golden_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    if golden::updating() {
        // Files of renamed or removed scenarios go with the refresh.
        for stale in present.iter().filter(|p| !expected.contains(p)) {
            std::fs::remove_file(golden::golden_dir().join(stale)).unwrap();
        }
    } else {
        assert_eq!(present, expected, "stale or missing files in tests/golden");
    }
}

/// Starts a rig for an inline scenario.
pub(crate) fn rig(toml: &str) -> Rig {
    let scenario = scenario::parse(toml).unwrap();
    Rig::start(&scenario).unwrap()
}

/// Scrapes `n` times with default headers and returns each scrape's traffic (after the
/// start-up traffic, which is dropped).
pub(crate) fn scrape_traffic(rig: &mut Rig, n: usize) -> Vec<Traffic> {
    rig.take_traffic();
    (0..n)
        .map(|_| {
            let response = rig.scrape(&scenario::Scrape::default()).unwrap();
            assert_eq!(response.status, 200, "{}", response.body);
            rig.take_traffic()
        })
        .collect()
}

/// The (socket, argument) of every message `msg_id`, sorted.
fn addressed(traffic: &Traffic, msg: Message) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = traffic
        .messages
        .iter()
        .filter(|m| m.msg_id == msg.id())
        .map(|m| (u32::from(m.sock_ind), m.arg0))
        .collect();
    v.sort_unstable();
    v
}

/// (socket, APIC id) of every core, sorted.
fn apic_ids(topology: &Topology) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = topology.cores.iter().map(|c| (c.socket, c.apic_id)).collect();
    v.sort_unstable();
    v
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn every_core_is_addressed_by_its_apic_id_exactly_once_per_scrape() {
    for machine in ["turin-2p", "venice-2p", "genoa-2p-cpu-offline", "genoa-2p-smt-off"] {
        let mut rig = rig(&format!("description = \"\"\nmachine = \"{machine}\"\n[[scrapes]]\n"));
        let topology = rig.machine().topology().clone();
        // The machine must tell APIC ids from CPU numbers, or this test proves nothing.
        assert!(topology.cores.iter().any(|c| c.apic_id != c.cpu), "{machine}");
        let want = apic_ids(&topology);
        for traffic in scrape_traffic(&mut rig, 2) {
            assert_eq!(addressed(&traffic, Message::GetBoostLimit), want, "{machine}");
            if rig.machine().spec().rapl_messages {
                assert_eq!(addressed(&traffic, Message::GetRaplCoreCounter), want, "{machine}");
            }
        }
    }
}

/// The value of the one line of `body` that starts with `series` and a space.
fn value_of(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.parse().unwrap())
}

/// Socket 0's limiter series of one scrape: each reason with its value.
fn reasons_of_socket_0(body: &str) -> Vec<(&'static str, f64)> {
    let reasons =
        ["chtc", "prochot", "tdc", "ppt", "opn_max", "reliability", "apml", "hsmp", "other"];
    reasons
        .iter()
        .map(|r| {
            let series =
                format!("amd_hsmp_socket_frequency_limit_reason{{reason=\"{r}\",socket=\"0\"}}");
            (*r, value_of(body, &series).unwrap_or_else(|| panic!("no {series}:\n{body}")))
        })
        .collect()
}

/// Every bit of the fake's `GET_SOCKET_FREQ_LIMIT` word: bits 31:16 the limit, in hertz; each
/// of bits 7:0 its reason's series at 1 and every other reason at 0; any of bits 15:8 `other`.
#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn each_limiter_bit_sets_exactly_its_reason_series_and_the_limit_is_bits_31_16_in_hertz() {
    let mut rig = rig("description = \"\"\nmachine = \"genoa-2p\"\n[[scrapes]]\n");
    let names = ["chtc", "prochot", "tdc", "ppt", "opn_max", "reliability", "apml", "hsmp"];
    for bit in 0..16u16 {
        let mhz = 2000 + bit;
        let limit = scenario::SocketLimit { socket: 0, mhz, reasons: 1 << bit };
        let before = scenario::Actions { frequency_limit: vec![limit], ..Default::default() };
        before.apply(rig.machine(), Some(rig.device())).unwrap();
        let response = rig.scrape(&scenario::Scrape::default()).unwrap();
        let body = &response.body;
        let hertz = value_of(body, "amd_hsmp_socket_frequency_limit_hertz{socket=\"0\"}");
        assert_eq!(hertz, Some(f64::from(mhz) * 1e6), "bit {bit}");
        let want = names.get(usize::from(bit)).copied().unwrap_or("other");
        let set: Vec<&str> = reasons_of_socket_0(body)
            .into_iter()
            .filter(|(_, v)| *v == 1.0)
            .map(|(r, _)| r)
            .collect();
        assert_eq!(set, [want], "bit {bit}");
        assert!(reasons_of_socket_0(body).iter().all(|(_, v)| *v == 0.0 || *v == 1.0));
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_socket_whose_frequency_limit_read_fails_has_no_series_and_one_counted_error() {
    let mut rig = rig("description = \"\"\nmachine = \"genoa-2p\"\n\
         [faults]\nerrors = [{ family = \"frequency-limit\", socket = 1, errno = \"EIO\" }]\n\
         [[scrapes]]\n");
    let body = rig.scrape(&scenario::Scrape::default()).unwrap().body;
    assert!(!body.contains("amd_hsmp_socket_frequency_limit_hertz{socket=\"1\"}"), "{body}");
    assert!(
        !body.lines().any(|l| l.starts_with("amd_hsmp_socket_frequency_limit_reason")
            && l.contains("socket=\"1\"")),
        "{body}"
    );
    assert!(value_of(&body, "amd_hsmp_socket_frequency_limit_hertz{socket=\"0\"}").is_some());
    let errors = "amd_hsmp_scrape_errors_total{collector=\"frequency-limit\"}";
    assert_eq!(value_of(&body, errors), Some(1.0), "{body}");
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn frequency_limits_unsupported_on_every_socket_are_omitted_and_asked_no_more() {
    let mut rig = rig("description = \"\"\nmachine = \"genoa-2p\"\n\
         [faults]\nunsupported = [\"frequency-limit\"]\n[[scrapes]]\n");
    rig.take_traffic();
    let mut asked = Vec::new();
    for _ in 0..3 {
        let response = rig.scrape(&scenario::Scrape::default()).unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        let body = &response.body;
        assert!(!body.contains("amd_hsmp_socket_frequency_limit"), "{body}");
        let errors = "amd_hsmp_scrape_errors_total{collector=\"frequency-limit\"}";
        assert_eq!(value_of(body, errors), Some(0.0), "{body}");
        asked.push(rig.take_traffic().count(Message::GetSocketFreqLimit.id()));
    }
    assert_eq!(asked, [2, 0, 0], "asked once per socket, then remembered");
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn msr_fallback_opens_each_cores_first_online_thread_read_only() {
    let mut rig = rig("description = \"\"\nmachine = \"genoa-2p-cpu-offline\"\n\
         broker-flags = [\"--collector.core-energy.msr-fallback\"]\n[[scrapes]]\n");
    let broker = rig.broker_pid().unwrap();
    let topology = rig.machine().topology().clone();
    let start = rig.take_traffic();
    let mut opened: Vec<u32> = start
        .opens
        .iter()
        .filter_map(|o| match o.node {
            Node::Msr(cpu) => Some(cpu),
            Node::Hsmp => None,
        })
        .collect();
    opened.sort_unstable();
    let mut want: Vec<u32> = topology.cores.iter().map(|c| c.cpu).collect();
    want.sort_unstable();
    assert_eq!(opened, want);
    assert!(opened.contains(&65) && !opened.contains(&1), "CPU 1 is offline; 65 reads its core");
    for open in &start.opens {
        assert!(open.read_only(), "{open:?}");
        assert_eq!(open.pid, broker, "{open:?}");
    }
    // A scrape reads every core's energy MSR once and opens nothing.
    let scrape = scrape_traffic(&mut rig, 1).remove(0);
    assert!(scrape.opens.is_empty());
    let mut read: Vec<u32> = scrape.msr_reads.iter().map(|r| r.cpu).collect();
    read.sort_unstable();
    assert_eq!(read, want);
    assert!(scrape.msr_reads.iter().all(|r| r.msr == 0xC001_029A));
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn a_failing_test_leaves_no_process_or_mount_behind() {
    let (pids, mount) = {
        let rig = rig("description = \"\"\nmachine = \"milan-1p\"\n[[scrapes]]\n");
        let pids = [rig.broker_pid().unwrap(), rig.exporter_pid()];
        let mount = rig.mount_point().to_owned();
        assert!(fake::is_mount_point(&mount));
        // A test failing while the rig is alive: the panic unwinds through its drop.
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _rig = rig;
            panic!("deliberate panic to check that the rig cleans up after a failed test");
        }));
        assert!(failed.is_err());
        (pids, mount)
    };
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} survived");
    }
    assert!(!fake::is_mount_point(&mount), "{} still mounted", mount.display());
    assert!(!mount.exists());
}

#[test]
fn scenarios_cover_every_fixture_machine_healthy() {
    for machine in fixtures::machines().keys() {
        let name = format!("healthy-{machine}");
        assert!(SCENARIOS.contains(&name.as_str()), "no {name} scenario");
    }
}
