//! Where per-core energy comes from, chosen once at start-up in a fixed order:
//!
//! 1. **hsmp**: HSMP `GET_RAPL_CORE_COUNTER`, when the firmware answers `GET_RAPL_UNITS` (a
//!    probe, never a gate on protocol version, family or model);
//! 2. **perf**: the kernel's `power_core` PMU ([`crate::perf`]), one event per core, when it
//!    exists and opens (`CAP_PERFMON`);
//! 3. **msr**: the MSR driver ([`crate::msr`]), every core's `/dev/cpu/<N>/msr`, only when
//!    enabled (`CAP_SYS_RAWIO`).
//!
//! `--collector.core-energy.sources` lists the sources the broker may use (`hsmp,perf` by
//! default; `--collector.core-energy.msr-fallback` adds `msr`): to choose one, list only it; to
//! refuse one, leave it out. A fallback (perf or MSR) is opened only when the sources before it
//! were passed over, and only at start-up, before the capabilities are dropped: these opens are
//! the only steps of the broker's start-up that need `CAP_PERFMON` or `CAP_SYS_RAWIO`. The
//! sampler still prefers HSMP whenever a device that answers RAPL appears later.
//!
//! One log line, `core energy source chosen`, names the source and why each other one was
//! passed over (with no source at all, a warning says the same).

use crate::counters::{self, CoreCounters};
use crate::msr::{self, MsrEnergy};
use crate::perf::{self, PerfEnergy};
use amd_hsmp_device::{MsrOpener, PmuLocator};
use amd_hsmp_proto::Topology;
use std::sync::Arc;

/// A source of per-core energy, as `--collector.core-energy.sources` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum SourceName {
    /// HSMP `GET_RAPL_CORE_COUNTER`.
    Hsmp,
    /// The kernel's `power_core` PMU (`perf_event_open`, `CAP_PERFMON`).
    Perf,
    /// The MSR driver (`/dev/cpu/N/msr`, `CAP_SYS_RAWIO`).
    Msr,
}

/// The default of `--collector.core-energy.sources`.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "the flag's default is its text; a test ties the two")
)]
pub(crate) const DEFAULT_SOURCES: &[SourceName] = &[SourceName::Hsmp, SourceName::Perf];

/// What the fallback sources are opened through.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Openers<'a> {
    pub perf: &'a dyn PmuLocator,
    pub msr: &'a dyn MsrOpener,
}

/// The start-up choice: the fallback opened, if any, and whether HSMP may be read.
#[derive(Debug)]
pub(crate) struct Choice {
    pub hsmp_allowed: bool,
    pub fallback: Option<Arc<dyn CoreCounters>>,
    /// Set when the MSR fallback is the one chosen: it needs its poller.
    pub msr: Option<Arc<MsrEnergy>>,
    /// Why the perf source was passed over, if it was.
    pub perf_passed_over: Option<String>,
}

/// Chooses the source: `hsmp` is `Ok` when the device at start-up answered RAPL on every
/// socket, else says why not. Logs `core energy source chosen` with why each other source was
/// passed over.
pub(crate) fn choose(
    allowed: &[SourceName],
    hsmp: Result<(), String>,
    topology: &Topology,
    openers: &Openers<'_>,
) -> Choice {
    let not_listed = || "not in --collector.core-energy.sources".to_owned();
    let allows = |s| allowed.contains(&s);
    let mut passed = [None, None, None];
    let mut choice = Choice {
        hsmp_allowed: allows(SourceName::Hsmp),
        fallback: None,
        msr: None,
        perf_passed_over: None,
    };
    let mut chosen = None;
    match hsmp {
        _ if !allows(SourceName::Hsmp) => passed[0] = Some(not_listed()),
        Ok(()) => chosen = Some(SourceName::Hsmp),
        Err(why) => passed[0] = Some(why),
    }
    if chosen.is_none() {
        match open_perf(allows(SourceName::Perf), topology, openers) {
            Ok(energy) => {
                chosen = Some(SourceName::Perf);
                choice.fallback = Some(energy);
            }
            Err(why) => passed[1] = Some(why),
        }
    } else {
        passed[1] = Some("HSMP RAPL answers".to_owned());
    }
    if chosen.is_none() {
        if !allows(SourceName::Msr) {
            passed[2] =
                Some("not enabled (--collector.core-energy.msr-fallback, or msr in --collector.core-energy.sources)".to_owned());
        } else {
            match MsrEnergy::open(topology, openers.msr) {
                Ok(energy) => {
                    let energy = Arc::new(energy);
                    chosen = Some(SourceName::Msr);
                    choice.msr = Some(Arc::clone(&energy));
                    choice.fallback = Some(energy);
                }
                Err(e) => {
                    let mut why = amd_hsmp_cli::chain(&e);
                    if let msr::MsrOpenError::Unreadable { errno: libc::EACCES, .. } = e {
                        why = format!("{why}; {}", crate::hints::MSR_DENIED);
                    }
                    passed[2] = Some(why);
                }
            }
        }
    } else if passed[2].is_none() {
        passed[2] = Some(format!("{} chosen first", name(chosen)));
    }
    choice.perf_passed_over = passed[1].clone();
    let [hsmp, perf, msr] = passed.each_ref().map(Option::as_deref);
    match chosen {
        Some(source) => tracing::info!(
            source = name(Some(source)),
            hsmp_passed_over = hsmp,
            perf_passed_over = perf,
            msr_passed_over = msr,
            "core energy source chosen",
        ),
        None => tracing::warn!(
            hsmp_passed_over = hsmp,
            perf_passed_over = perf,
            msr_passed_over = msr,
            "no core energy source at start-up; core energy comes from HSMP if a device that \
             answers RAPL appears, else it is not exported",
        ),
    }
    choice
}

fn name(source: Option<SourceName>) -> &'static str {
    match source {
        Some(SourceName::Hsmp) => "hsmp",
        Some(SourceName::Perf) => "perf",
        Some(SourceName::Msr) => "msr",
        None => "none",
    }
}

/// Opens the perf source, or says why not.
fn open_perf(
    allowed: bool,
    topology: &Topology,
    openers: &Openers<'_>,
) -> Result<Arc<dyn CoreCounters>, String> {
    if !allowed {
        return Err("not in --collector.core-energy.sources".to_owned());
    }
    let opened =
        openers.perf.locate().map_err(perf::PerfOpenError::from).and_then(|(pmu, opener)| {
            PerfEnergy::open(topology, &pmu, opener.as_ref(), Box::new(counters::Running))
        });
    match opened {
        Ok(energy) => Ok(Arc::new(energy)),
        Err(e @ perf::PerfOpenError::Unopened { errno: libc::EACCES | libc::EPERM, .. }) => {
            // EPERM: a system call filter (the unit without the drop-in). EACCES: the kernel,
            // which at Debian's perf_event_paranoid 3 refuses CAP_PERFMON too.
            let hint = match e {
                perf::PerfOpenError::Unopened { errno: libc::EACCES, .. } => format!(
                    "{}; with the drop-in installed: {}",
                    crate::hints::PERF_DENIED,
                    crate::hints::PERF_PARANOID
                ),
                _ => crate::hints::PERF_DENIED.to_owned(),
            };
            Err(format!("{}; {hint}", amd_hsmp_cli::chain(&e)))
        }
        Err(e) => Err(amd_hsmp_cli::chain(&e)),
    }
}
