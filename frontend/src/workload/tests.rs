//! The ledger's rules, sample by sample: a workload's energy, each reason's, the linger and the bound
//! under churn; every joule read goes to one workload or one reason.

use super::*;

fn core(n: u32) -> CoreLabel {
    CoreLabel { socket: 0, core: n }
}

fn owner(path: &str) -> Arc<Owner> {
    Arc::new(Owner::from_raw(path.as_bytes()))
}

/// A sample read at `at_us` with each core's counter in joules.
fn energy(at_us: u64, joules: &[(u32, f64)]) -> Telemetry {
    Telemetry {
        energy_joules: joules.iter().map(|&(c, j)| (core(c), j)).collect(),
        energy_read_at_us: joules.iter().map(|_| Some(at_us)).collect(),
        ..Telemetry::default()
    }
}

fn held(pairs: &[(u32, &Arc<Owner>)]) -> Vec<(CoreLabel, Arc<Owner>)> {
    pairs.iter().map(|&(c, o)| (core(c), Arc::clone(o))).collect()
}

fn joules_of(report: &WorkloadReport, owner: &Arc<Owner>) -> Option<f64> {
    report.workloads.iter().find(|w| &w.owner == owner).map(|w| w.joules)
}

fn unattributed(report: &WorkloadReport, reason: Reason) -> f64 {
    report.unattributed.iter().find(|(r, _)| *r == reason).map_or(f64::NAN, |&(_, j)| j)
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn a_workload_that_holds_its_cores_gets_their_energy_since_its_first_sample() {
    let t0 = Instant::now();
    let job = owner("/system.slice/slurmstepd.scope/job_4242");
    let owners = held(&[(0, &job), (1, &job)]);
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    ledger.sample(t0, &energy(1_000_000, &[(0, 100.0), (1, 200.0)]), Owners::Known(&owners));
    assert_eq!(joules_of(&ledger.report(t0), &job), Some(0.0), "a series from the first sample");
    ledger.sample(
        t0 + SECOND,
        &energy(2_000_000, &[(0, 110.0), (1, 215.0)]),
        Owners::Known(&owners),
    );
    ledger.sample(
        t0 + 2 * SECOND,
        &energy(3_000_000, &[(0, 125.0), (1, 220.0)]),
        Owners::Known(&owners),
    );
    let report = ledger.report(t0 + 2 * SECOND);
    assert_eq!(joules_of(&report, &job), Some(45.0));
    for reason in Reason::ALL {
        assert_eq!(unattributed(&report, reason), 0.0, "{reason:?}");
    }
}

#[test]
fn a_core_that_changes_hands_is_given_to_nobody_and_its_new_owner_counts_from_the_next_sample() {
    let t0 = Instant::now();
    let (a, b) = (owner("/a.slice/a.service"), owner("/b.slice/b.service"));
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    ledger.sample(t0, &energy(1, &[(0, 0.0)]), Owners::Known(&held(&[(0, &a)])));
    ledger.sample(t0 + SECOND, &energy(2, &[(0, 7.0)]), Owners::Known(&held(&[(0, &b)])));
    ledger.sample(t0 + 2 * SECOND, &energy(3, &[(0, 10.0)]), Owners::Known(&held(&[(0, &b)])));
    let report = ledger.report(t0 + 2 * SECOND);
    assert_eq!(joules_of(&report, &a), Some(0.0));
    assert_eq!(joules_of(&report, &b), Some(3.0));
    assert_eq!(unattributed(&report, Reason::ChangedHands), 7.0);
}

#[test]
fn a_core_that_changes_hands_at_every_sample_gives_every_joule_to_changed_hands() {
    let t0 = Instant::now();
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    let owners: Vec<Arc<Owner>> = (0..50).map(|n| owner(&format!("/w.slice/w{n}.scope"))).collect();
    for (n, o) in owners.iter().enumerate() {
        let at = t0 + SECOND * n as u32;
        ledger.sample(
            at,
            &energy(n as u64 + 1, &[(0, 2.0 * n as f64)]),
            Owners::Known(&held(&[(0, o)])),
        );
    }
    let report = ledger.report(t0 + SECOND * 49);
    assert!(report.workloads.iter().all(|w| w.joules == 0.0), "{:?}", report.workloads);
    assert_eq!(unattributed(&report, Reason::ChangedHands), 98.0);
}

#[test]
fn unowned_cores_and_samples_without_owners_are_counted_by_their_reason() {
    let t0 = Instant::now();
    let a = owner("/a.slice/a.service");
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    assert_eq!(ledger.report(t0).unattributed, [], "no counter before the first sample");
    ledger.sample(t0, &energy(1, &[(0, 0.0), (1, 0.0)]), Owners::Known(&held(&[(1, &a)])));
    ledger.sample(t0 + SECOND, &energy(2, &[(0, 4.0), (1, 5.0)]), Owners::Unknown);
    ledger.sample(
        t0 + 2 * SECOND,
        &energy(3, &[(0, 6.0), (1, 8.0)]),
        Owners::Known(&held(&[(1, &a)])),
    );
    ledger.sample(
        t0 + 3 * SECOND,
        &energy(4, &[(0, 7.0), (1, 10.0)]),
        Owners::Known(&held(&[(1, &a)])),
    );
    let report = ledger.report(t0 + 3 * SECOND);
    assert_eq!(unattributed(&report, Reason::OwnerUnknown), 4.0 + 5.0 + 2.0 + 3.0);
    assert_eq!(unattributed(&report, Reason::Unowned), 1.0);
    assert_eq!(joules_of(&report, &a), Some(2.0));
}

#[test]
fn a_counter_that_goes_back_or_restarts_with_its_broker_is_a_reset_counted_with_the_energy_since() {
    let t0 = Instant::now();
    let a = owner("/a.slice/a.service");
    let owners = held(&[(0, &a), (1, &a)]);
    let perf = |instance, at, joules: &[(u32, f64)]| Telemetry {
        energy_epoch: Some((instance, 0)),
        ..energy(at, joules)
    };
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    ledger.sample(t0, &perf(1, 1, &[(0, 50.0), (1, 1.0)]), Owners::Known(&owners));
    // The broker restarted: its counters count from 0 again, one of them already past the old
    // value.
    ledger.sample(t0 + SECOND, &perf(2, 2, &[(0, 3.0), (1, 4.0)]), Owners::Known(&owners));
    ledger.sample(t0 + 2 * SECOND, &perf(2, 3, &[(0, 5.0), (1, 9.0)]), Owners::Known(&owners));
    let report = ledger.report(t0 + 2 * SECOND);
    assert_eq!(unattributed(&report, Reason::Reset), 3.0 + 3.0);
    assert_eq!(joules_of(&report, &a), Some(2.0 + 5.0), "the job keeps counting after a reset");

    // HSMP's firmware counter went back: a reset the exporter sees only as that.
    let mut hsmp = Ledger::new(DEFAULT_LINGER);
    hsmp.sample(t0, &energy(1, &[(0, 50.0)]), Owners::Known(&owners));
    hsmp.sample(t0 + SECOND, &energy(2, &[(0, 20.0)]), Owners::Known(&owners));
    let report = hsmp.report(t0 + SECOND);
    assert_eq!(unattributed(&report, Reason::Reset), 20.0);
    assert_eq!(joules_of(&report, &a), Some(0.0));
}

#[test]
fn a_sample_read_no_later_than_the_last_adds_nothing() {
    let t0 = Instant::now();
    let a = owner("/a.slice/a.service");
    let owners = held(&[(0, &a)]);
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    ledger.sample(t0, &energy(10, &[(0, 0.0)]), Owners::Known(&owners));
    let later = energy(20, &[(0, 5.0)]);
    ledger.sample(t0 + SECOND, &later, Owners::Known(&owners));
    // Two scrapes served the same answer, and one served an older one after it.
    ledger.sample(t0 + SECOND, &later, Owners::Known(&owners));
    ledger.sample(t0 + SECOND, &energy(15, &[(0, 3.0)]), Owners::Known(&owners));
    let report = ledger.report(t0 + SECOND);
    assert_eq!(joules_of(&report, &a), Some(5.0));
    assert!(Reason::ALL.iter().all(|&r| unattributed(&report, r) == 0.0), "{report:?}");
}

#[test]
fn a_workload_lingers_after_its_last_core_then_goes() {
    let t0 = Instant::now();
    let linger = 5 * SECOND;
    let a = owner("/a.slice/a.service");
    let mut ledger = Ledger::new(linger);
    ledger.sample(t0, &energy(1, &[(0, 0.0)]), Owners::Known(&held(&[(0, &a)])));
    ledger.sample(t0 + SECOND, &energy(2, &[(0, 9.0)]), Owners::Known(&held(&[(0, &a)])));
    ledger.sample(t0 + 2 * SECOND, &energy(3, &[(0, 10.0)]), Owners::Known(&[]));
    assert_eq!(joules_of(&ledger.report(t0 + 6 * SECOND), &a), Some(9.0), "within the linger");
    assert_eq!(joules_of(&ledger.report(t0 + 6 * SECOND + Duration::from_millis(1)), &a), None);
}

#[test]
fn a_workload_that_still_holds_a_core_outlives_the_linger_between_samples() {
    let t0 = Instant::now();
    let a = owner("/a.slice/a.service");
    let owners = held(&[(0, &a)]);
    let mut ledger = Ledger::new(Duration::ZERO);
    ledger.sample(t0, &energy(1, &[(0, 0.0)]), Owners::Known(&owners));
    assert_eq!(joules_of(&ledger.report(t0 + 60 * SECOND), &a), Some(0.0));
    ledger.sample(t0 + 60 * SECOND, &energy(2, &[(0, 9.0)]), Owners::Known(&owners));
    assert_eq!(joules_of(&ledger.report(t0 + 60 * SECOND), &a), Some(9.0));
}

#[test]
fn under_a_churn_of_ten_thousand_workloads_the_series_stay_within_the_live_and_lingering_ones() {
    let t0 = Instant::now();
    let linger = 10 * SECOND;
    let cores = 8u32;
    // A new workload on every core at sample `n`.
    let newcomers = |n: u32| -> Vec<(CoreLabel, Arc<Owner>)> {
        (0..cores)
            .map(|c| (core(c), owner(&format!("/w.slice/w{}.scope", n * cores + c))))
            .collect()
    };
    let mut ledger = Ledger::new(linger);
    let mut seen = 0;
    // Every sample, a new workload on every core: 10,000 workloads over 1,250 samples, 100 ms
    // apart; 100 samples within the linger.
    for sample in 0..1_250u32 {
        let at = t0 + Duration::from_millis(100) * sample;
        let owners = newcomers(sample);
        seen += owners.len();
        let joules: Vec<(u32, f64)> = (0..cores).map(|c| (c, f64::from(sample))).collect();
        ledger.sample(at, &energy(u64::from(sample) + 1, &joules), Owners::Known(&owners));
        let series = ledger.report(at).workloads.len();
        // Live: this sample's; lingering: those of the samples within the linger before it.
        let bound = cores as usize * (1 + 100);
        assert!(series <= bound, "sample {sample}: {series} series, bound {bound}");
    }
    assert_eq!(seen, 10_000);
    let report = ledger.report(t0 + Duration::from_millis(100) * 1_249);
    assert_eq!(unattributed(&report, Reason::ChangedHands), 8.0 * 1_249.0);
    assert_eq!(report.evicted, 0);

    let mut full = Ledger::with_capacity(linger, 64);
    for sample in 0..100u32 {
        let at = t0 + Duration::from_millis(100) * sample;
        let owners = newcomers(sample);
        full.sample(at, &energy(u64::from(sample) + 1, &[(0, 0.0)]), Owners::Known(&owners));
        let report = full.report(at);
        assert!(report.workloads.len() <= 64, "{}", report.workloads.len());
        assert!(
            owners.iter().all(|(_, o)| joules_of(&report, o).is_some()),
            "the live workloads are never the ones dropped"
        );
    }
    assert_eq!(full.report(t0 + 10 * SECOND).evicted, 100 * 8 - 64);
}

#[test]
fn every_joule_read_is_given_to_one_workload_or_one_reason() {
    let t0 = Instant::now();
    let owners: Vec<Arc<Owner>> = (0..3).map(|n| owner(&format!("/w.slice/w{n}.scope"))).collect();
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    let mut counters = [0.0f64; 4];
    let mut first = [None::<f64>; 4];
    let mut last = [0.0f64; 4];
    // A fixed pseudo-random walk of owners, energy and missing reads.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for sample in 0..500u32 {
        let mut holders = Vec::new();
        let mut joules = Vec::new();
        for c in 0..4u32 {
            let r = next();
            // The core draws power whether or not this sample reads it.
            counters[c as usize] += (r % 1000) as f64 / 10.0;
            if r % 7 == 0 {
                continue;
            }
            first[c as usize].get_or_insert(counters[c as usize]);
            last[c as usize] = counters[c as usize];
            joules.push((c, counters[c as usize]));
            if r % 5 != 0 {
                holders.push((core(c), Arc::clone(&owners[(r % 3) as usize])));
            }
        }
        let at = t0 + SECOND * sample;
        let known = next() % 11 != 0;
        let owners = if known { Owners::Known(&holders) } else { Owners::Unknown };
        ledger.sample(at, &energy(u64::from(sample) + 1, &joules), owners);
    }
    let report = ledger.report(t0 + SECOND * 499);
    let given: f64 = report.workloads.iter().map(|w| w.joules).sum::<f64>()
        + report.unattributed.iter().map(|(_, j)| j).sum::<f64>();
    let read: f64 = (0..4).map(|c| last[c] - first[c].unwrap_or(0.0)).sum();
    assert!((given - read).abs() < 1e-6, "given {given}, read {read}");
    assert!(report.workloads.iter().all(|w| w.joules > 0.0), "{:?}", report.workloads);
}

#[test]
fn a_workload_shows_the_cores_it_holds_and_their_power_over_the_last_interval() {
    let t0 = Instant::now();
    let (a, b) = (owner("/a.slice/a.service"), owner("/b.slice/b.service"));
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    let both = held(&[(0, &a), (1, &a), (2, &b)]);
    ledger.sample(t0, &energy(1_000_000, &[(0, 0.0), (1, 0.0), (2, 0.0)]), Owners::Known(&both));
    let report = ledger.report(t0);
    let a_now = report.workloads.iter().find(|w| w.owner == a).unwrap();
    assert_eq!((a_now.cores, a_now.watts), (2, None), "no power before a second sample");
    // 2 s later: 10 W and 20 W on a's cores.
    let t2 = t0 + 2 * SECOND;
    let only_a = held(&[(0, &a), (1, &a)]);
    ledger.sample(
        t2,
        &energy(3_000_000, &[(0, 20.0), (1, 40.0), (2, 2.0)]),
        Owners::Known(&only_a),
    );
    let report = ledger.report(t2);
    let a_now = report.workloads.iter().find(|w| w.owner == a).unwrap();
    assert_eq!((a_now.cores, a_now.watts, a_now.joules), (2, Some(30.0), 60.0));
    let b_now = report.workloads.iter().find(|w| w.owner == b).unwrap();
    assert_eq!((b_now.cores, b_now.watts), (0, None), "b lingers, holding nothing");
    assert_eq!(report.latest_sample_age, Some(Duration::ZERO));
}

#[test]
fn a_scrape_that_began_earlier_but_ends_later_leaves_the_cores_held_as_the_later_sample_saw() {
    let t0 = Instant::now();
    let a = owner("/a.slice/a.service");
    let mut ledger = Ledger::new(DEFAULT_LINGER);
    let two = held(&[(0, &a), (1, &a)]);
    ledger.sample(t0 + SECOND, &energy(2, &[(0, 1.0), (1, 1.0)]), Owners::Known(&two));
    // The scrape that began first lands last, its walk older: one core then.
    ledger.sample(t0, &energy(1, &[(0, 0.0), (1, 0.0)]), Owners::Known(&held(&[(0, &a)])));
    let report = ledger.report(t0 + SECOND);
    let a_now = report.workloads.iter().find(|w| w.owner == a).unwrap();
    assert_eq!(a_now.cores, 2, "{report:?}");
}
