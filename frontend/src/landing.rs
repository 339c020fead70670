//! The landing page at `/`: the node at a glance, rendered on the server as HTML with inline
//! SVG (no script, no external asset, everything escaped). Per-core power, from the energy of
//! the last two samples the exporter took (its own or Prometheus' scrapes), and boost limit are
//! shown as a heatmap per socket; a family that was not read (`Telemetry::unread`) is said to
//! be so, with why, instead of a map; then PROCHOT, each socket's frequency limit and the
//! limiters imposing it in words, the device and the broker, and a banner when the broker
//! serves its simulator. Power is each value's energy over the time between its two reads, as
//! the broker stamps them (`Sample::read_at_us`), not between the two answers.
//!
//! A page view costs one sample, taken through the scrape path (`Exporter::scrape`, so it shares
//! a broker request in flight like any scrape), and reads nothing of the cgroup hierarchy: the
//! page shows no owners. The one exception is a view with no earlier
//! sample to take power from (the first after start, when Prometheus has not scraped yet): it
//! takes a second sample [`MIN_POWER_INTERVAL`] after the first, so that power shows from the
//! first view; never more than two. One such view at a time waits, holding its place in
//! `--web.max-requests`; the views that come meanwhile give their place back after their one
//! sample and wait for its answer, whose power they show too.

use crate::budget::Budget;
use crate::metrics;
use crate::owner::Owner;
use crate::scrape::{AnswerObserver, Exporter, Owners, ScrapeReport};
use crate::translate::{CoreLabel, Telemetry, Unread};
use crate::workload::{Workload, WorkloadReport};
use amd_hsmp_proto::{EnergySource, Family, LimitReason};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Two samples closer than this are not used for power: the sample itself takes milliseconds,
/// which would make the watts noisy.
pub(crate) const MIN_POWER_INTERVAL: Duration = Duration::from_secs(1);

/// Heatmap cells per row.
const COLUMNS: usize = 32;
/// Side of one heatmap cell, px.
const CELL: usize = 12;
/// Gap between cells, px.
const GAP: usize = 1;

/// A broker answer and when it landed.
#[derive(Debug, Clone)]
struct Stamped {
    at: Instant,
    telemetry: Arc<Telemetry>,
}

/// The last two broker answers at least [`MIN_POWER_INTERVAL`] apart, kept for the landing
/// page's power: the page's own state, told of every answer as an [`AnswerObserver`].
#[derive(Debug, Default)]
struct RecentSamples {
    pair: Mutex<(Option<Stamped>, Option<Stamped>)>,
    /// Held by the one view that waits for a second sample; the others wait for it to be let go.
    second: tokio::sync::Mutex<()>,
}

/// Per-core power between two samples.
#[derive(Debug, Clone, PartialEq, Default)]
struct Power {
    /// Watts of each core whose energy was read in both samples and did not go back.
    watts: Vec<(CoreLabel, f64)>,
    /// Watts of each socket's package, where its package energy was read in both samples.
    package_watts: Vec<(u32, f64)>,
    /// Time between the two samples.
    interval: Duration,
}

impl AnswerObserver for RecentSamples {
    fn answered(&self, telemetry: &Arc<Telemetry>, oldest: Duration) {
        self.record(telemetry, oldest);
    }
}

impl RecentSamples {
    /// Records a broker answer that landed now, if its values were all read after its request
    /// reached the broker (`oldest` zero): an answer that took reads made up to the broker's
    /// freshness bound before (another request's) has no read time good enough for power.
    fn record(&self, telemetry: &Arc<Telemetry>, oldest: Duration) {
        if oldest.is_zero() {
            self.record_at(Instant::now(), telemetry);
        }
    }

    /// Records a broker answer that landed `at`. The latest becomes the previous one only when
    /// the new one is at least [`MIN_POWER_INTERVAL`] later; otherwise the new one replaces the
    /// latest, so the two are always that far apart.
    fn record_at(&self, at: Instant, telemetry: &Arc<Telemetry>) {
        let new = Stamped { at, telemetry: Arc::clone(telemetry) };
        // Plain data, valid even if a holder panicked.
        let mut pair = self.pair.lock().unwrap_or_else(PoisonError::into_inner);
        let shift = pair
            .1
            .as_ref()
            .is_some_and(|last| at.saturating_duration_since(last.at) >= MIN_POWER_INTERVAL);
        if shift {
            pair.0 = pair.1.take();
        }
        pair.1 = Some(new);
    }

    /// The power between the last two samples; `None` until there are two.
    fn power(&self) -> Option<Power> {
        let pair = self.pair.lock().unwrap_or_else(PoisonError::into_inner);
        let (Some(prev), Some(last)) = (&pair.0, &pair.1) else { return None };
        Some(power_between(prev, last))
    }
}

/// Power between two samples: each value's energy over the time between its two reads, where
/// the broker says when it read them (since protocol 5), else over the time between the two
/// answers. The answers' times are not the reads': a sample takes tens of milliseconds, and
/// the first after start longer, so over a second's interval they put a core at its cap up to
/// 5 % above it.
fn power_between(prev: &Stamped, last: &Stamped) -> Power {
    let interval = last.at.saturating_duration_since(prev.at);
    let (p, l) = (&prev.telemetry, &last.telemetry);
    let core = |c: &CoreLabel| (c.socket, c.core);
    let watts = rates(
        (&p.energy_joules, &p.energy_read_at_us),
        (&l.energy_joules, &l.energy_read_at_us),
        core,
        interval,
    );
    let package_watts = rates(
        (&p.package_energy_joules, &p.package_energy_read_at_us),
        (&l.package_energy_joules, &l.package_energy_read_at_us),
        |&socket: &u32| socket,
        interval,
    );
    Power { watts, package_watts, interval }
}

/// Energy counters and when each was read (aligned; `None` where the broker did not say).
type Counts<'a, L> = (&'a [(L, f64)], &'a [Option<u64>]);

/// Watts of each counter of `last` that `prev` has too (matched by `key`): its joules over the
/// time between its two reads, or over `answers` (the time between the two answers) where
/// either read has no time. None for a counter that went back (a broker restart with the MSR
/// source) or reads not in order.
fn rates<L: Copy, K: Ord>(
    prev: Counts<'_, L>,
    last: Counts<'_, L>,
    key: impl Fn(&L) -> K,
    answers: Duration,
) -> Vec<(L, f64)> {
    let at = |times: &[Option<u64>], i: usize| times.get(i).copied().flatten();
    let before: BTreeMap<K, (f64, Option<u64>)> =
        prev.0.iter().enumerate().map(|(i, (l, j))| (key(l), (*j, at(prev.1, i)))).collect();
    last.0
        .iter()
        .enumerate()
        .filter_map(|(i, (label, joules))| {
            let &(earlier, read_before) = before.get(&key(label))?;
            let seconds = match (read_before, at(last.1, i)) {
                (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
                (Some(_), Some(_)) => return None,
                _ => answers.as_secs_f64(),
            };
            (*joules >= earlier && seconds > 0.0).then(|| (*label, (joules - earlier) / seconds))
        })
        .collect()
}

/// `GET /`, with the page's own state: the recent answers `exporter` tells it of from now on.
pub(crate) fn route(exporter: &Exporter) -> MethodRouter<Arc<Exporter>> {
    let recent = Arc::new(RecentSamples::default());
    exporter.observe(Arc::clone(&recent) as Arc<dyn AnswerObserver>);
    get(move |State(exporter): State<Arc<Exporter>>| page(exporter, Arc::clone(&recent)))
}

/// `GET /`: one sample through the scrape path, rendered; two on a view with nothing to take
/// power from yet.
async fn page(exporter: Arc<Exporter>, recent: Arc<RecentSamples>) -> Response {
    let Some(permit) = exporter.admit_scrape() else {
        let body = "Limit of concurrent requests reached, try again later.\n";
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    };
    let config = exporter.config();
    let started = Instant::now();
    // The page shows no owners, so it reads nothing of the cgroup hierarchy.
    let sample = || {
        let budget = Budget::new(None, config.max_scrape_timeout);
        exporter.scrape(budget, &permit, Owners::Skipped)
    };
    let mut report = sample().await;
    let mut samples = 1;
    // Power needs two samples at least MIN_POWER_INTERVAL apart. When the one just taken has
    // no partner (no scrape came before it, or the last one was too recent and it replaced
    // that), wait the interval and take the second: the recorder pairs them, since this
    // one landed before the wait started. One retry only, so a view costs at most two
    // samples and one interval; an answer that could not be paired (read for an earlier
    // request) leaves the page without power, as it says. One view at a time waits so; the
    // others give their place back and wait for its answer.
    if recent.power().is_none() && reads_energy(&report) {
        match recent.second.try_lock() {
            // Another view's second sample may have landed since.
            Ok(_waiting) if recent.power().is_none() => {
                tokio::time::sleep(MIN_POWER_INTERVAL).await;
                report = sample().await;
                samples = 2;
            }
            Ok(_) => {}
            Err(_) => {
                drop(permit);
                let patience = MIN_POWER_INTERVAL + config.max_scrape_timeout;
                // Shows what there is by then, with or without power.
                let _ = tokio::time::timeout(patience, recent.second.lock()).await;
            }
        }
    }
    let power = recent.power();
    let view = View { samples, took: started.elapsed() };
    Html(render(&report, power.as_ref(), &config.telemetry_path, view)).into_response()
}

/// Whether `report` has energy to take power from.
fn reads_energy(report: &ScrapeReport) -> bool {
    report.telemetry.as_deref().is_some_and(|t| !t.energy_joules.is_empty())
}

/// What a page view cost, for its footer.
#[derive(Debug, Clone, Copy)]
struct View {
    /// Samples taken (one, or two on a view with nothing to take power from).
    samples: u32,
    /// From the first sample's start to the last one's end.
    took: Duration,
}

/// `text` safe inside HTML text and double- or single-quoted attributes.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page for one scrape's `report` and the `power` of the last two samples.
fn render(
    report: &ScrapeReport,
    power: Option<&Power>,
    telemetry_path: &str,
    view: View,
) -> String {
    let mut html = String::with_capacity(64 * 1024);
    let t = report.telemetry.as_deref();
    let simulated = t.and_then(|t| t.simulated.as_deref());
    let title = match simulated {
        Some(profile) => format!("AMD HSMP Exporter: simulated {}", escape_html(profile)),
        None => "AMD HSMP Exporter".to_owned(),
    };
    // `write!` to a String cannot fail.
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title}</title>\n<style>{STYLE}</style></head>\n<body>\n\
         <h1>AMD HSMP Exporter</h1>\n"
    );
    if let Some(profile) = simulated {
        let _ = writeln!(
            html,
            "<p id=\"simulated\" class=\"banner\">SIMULATED: the broker serves its built-in \
             simulator (profile <b>{}</b>), not this machine's devices.</p>",
            escape_html(profile)
        );
    }
    status(&mut html, report);
    if let Some(t) = t {
        sockets(&mut html, t, power);
    }
    if let Some(w) = &report.workloads {
        workloads(&mut html, w);
    }
    let _ = write!(
        html,
        "<p class=\"foot\"><a href=\"{path}\">Metrics</a> · version {version} (revision \
         {revision}) · this page took {samples} in {ms:.0} ms; reload for fresh values</p>\n\
         </body>\n</html>\n",
        path = escape_html(telemetry_path),
        version = escape_html(metrics::VERSION),
        revision = escape_html(metrics::REVISION),
        samples = if view.samples == 1 { "one sample" } else { "two samples" },
        ms = view.took.as_secs_f64() * 1000.0,
    );
    html
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:70em}\
h1{font-size:1.4em;margin:0 0 .5em}h2{font-size:1.1em;margin:1.2em 0 .4em}\
.banner{background:#fde68a;border:2px solid #b45309;padding:.5em .8em;font-weight:600}\
table.status{border-collapse:collapse}table.status td{padding:.15em .8em .15em 0}\
.ok{color:#15803d;font-weight:600}.bad{color:#b91c1c;font-weight:600}\
.maps{display:flex;flex-wrap:wrap;gap:1.5em}figure{margin:0}figcaption{font-size:.9em;margin:.2em 0}\
.foot{margin-top:1.5em;font-size:.85em;color:#555}";

fn status(html: &mut String, report: &ScrapeReport) {
    let t = report.telemetry.as_deref();
    let broker = if report.broker_up {
        "<span class=\"ok\">answering</span>".to_owned()
    } else {
        "<span class=\"bad\">not answering</span> (is amd-hsmp-broker running, and may this user \
         connect?)"
            .to_owned()
    };
    let device = match t.map(|t| t.hsmp_protocol_version) {
        Some(Some(v)) => format!("<span class=\"ok\">ready</span>, HSMP protocol {v}"),
        Some(None) => "<span class=\"bad\">unavailable</span> (no usable /dev/hsmp)".to_owned(),
        None => "unknown (no answer from the broker)".to_owned(),
    };
    let energy = match t.and_then(|t| t.energy_source) {
        Some(EnergySource::Hsmp) => "HSMP RAPL",
        Some(EnergySource::Msr) => "MSR fallback",
        Some(EnergySource::Perf) => "kernel perf counter (power_core)",
        None => "none",
    };
    let errors: Vec<String> = report
        .errors
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(source, n)| format!("{} {n}", escape_html(source.label())))
        .collect();
    let errors = if errors.is_empty() { "none".to_owned() } else { errors.join(", ") };
    let _ = write!(
        html,
        "<table class=\"status\">\n\
         <tr><td>Broker</td><td id=\"broker\">{broker}</td></tr>\n\
         <tr><td>Device</td><td id=\"device\">{device}</td></tr>\n\
         <tr><td>Energy source</td><td>{energy}</td></tr>\n\
         <tr><td>PROCHOT</td><td>{prochot}</td></tr>\n\
         <tr><td>Frequency limit</td><td>{limit}</td></tr>\n\
         <tr><td>Failed reads since start</td><td>{errors}</td></tr>\n</table>\n",
        prochot = prochot_summary(t),
        limit = frequency_limit_summary(t),
    );
}

/// The workloads holding cores at the latest sample, with their power and their energy so far
/// (`--collector.core-owner` with core energy).
fn workloads(html: &mut String, report: &WorkloadReport) {
    let _ = writeln!(html, "<h2>Workloads holding cores</h2>");
    let Some(age) = report.latest_sample_age else {
        let _ = writeln!(
            html,
            "<p id=\"workloads\">No sample with the cores' owners yet: the first scrape of \
             the metrics takes one.</p>"
        );
        return;
    };
    let holding: Vec<&Workload> = report.workloads.iter().filter(|w| w.cores > 0).collect();
    let ended = report.workloads.len() - holding.len();
    let _ = writeln!(
        html,
        "<p id=\"workloads\">As of the last sample, {age:.0} s ago: {} holding cores; {ended} \
         ended within the linger, their counters still exported. Energy counts from each \
         workload's first sample (or the exporter's start).</p>",
        holding.len(),
        age = age.as_secs_f64(),
    );
    if holding.is_empty() {
        return;
    }
    let _ = writeln!(
        html,
        "<table class=\"status\"><tr><th>Workload</th><th>Cores</th><th>Power</th>\
         <th>Energy so far</th></tr>"
    );
    for w in holding {
        let power = w.watts.map_or_else(|| "not yet".to_owned(), |watts| format!("{watts:.1} W"));
        let _ = writeln!(
            html,
            "<tr><td title=\"{path}\">{name}</td><td>{cores}</td><td>{power}</td>\
             <td>{kj:.1} kJ ({kwh:.4} kWh)</td></tr>",
            path = escape_html(&w.owner.path),
            name = escape_html(&workload_name(&w.owner)),
            cores = w.cores,
            kj = w.joules / 1e3,
            kwh = w.joules / 3.6e6,
        );
    }
    let _ = writeln!(html, "</table>");
}

/// A workload in words, from its identity labels; its cgroup path where they say nothing.
fn workload_name(owner: &Owner) -> String {
    let id = &owner.identity;
    let job = id.hpc_job.as_deref().or(id.slurm_sluid.as_deref());
    match (job, &id.pod_uid, &id.vm, &id.unit) {
        (Some(job), ..) => match &id.step {
            Some(step) => format!("Slurm job {job}, step {step}"),
            None => format!("Slurm job {job}"),
        },
        (None, Some(pod), ..) => match &id.container_id {
            Some(c) => format!("pod {pod}, container {}", c.get(..12).unwrap_or(c)),
            None => format!("pod {pod}"),
        },
        (None, None, Some(vm), _) => format!("VM {vm}"),
        (None, None, None, Some(unit)) => unit.clone(),
        (None, None, None, None) => owner.path.clone(),
    }
}

/// Each socket's frequency limit and, in words, what imposes it.
fn frequency_limit_summary(t: Option<&Telemetry>) -> String {
    let Some(t) = t.filter(|t| !t.frequency_limit.is_empty()) else {
        return "not read".to_owned();
    };
    t.frequency_limit
        .iter()
        .map(|&(socket, limit)| {
            let by: Vec<&str> = limit.limiters().map(limiter_in_words).collect();
            let held = limit.limiters().any(|r| r != LimitReason::OpnMax);
            let class = if held { "bad" } else { "ok" };
            let by = if by.is_empty() { "no limiter reported".to_owned() } else { by.join(", ") };
            format!(
                "socket {socket}: <span class=\"{class} frequency-limit\" data-socket=\"{socket}\" \
                 data-mhz=\"{mhz}\">{mhz} MHz, set by {by}</span>",
                mhz = limit.mhz,
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a limiter is, for an operator.
fn limiter_in_words(reason: LimitReason) -> &'static str {
    match reason {
        LimitReason::Chtc => "thermal control (cHTC)",
        LimitReason::Prochot => "PROCHOT",
        LimitReason::Tdc => "a current limit (TDC)",
        LimitReason::Ppt => "the package power limit (PPT)",
        LimitReason::OpnMax => "the part's own maximum",
        LimitReason::Reliability => "the reliability limit",
        LimitReason::Apml => "a cap set by the BMC (APML)",
        LimitReason::Hsmp => "a cap set by host software (HSMP)",
        LimitReason::Other => "a limiter the specification does not name",
    }
}

fn prochot_summary(t: Option<&Telemetry>) -> String {
    let Some(t) = t.filter(|t| !t.prochot.is_empty()) else { return "not read".to_owned() };
    t.prochot
        .iter()
        .map(|&(socket, asserted)| {
            let (class, word) = if asserted { ("bad", "ASSERTED") } else { ("ok", "clear") };
            format!(
                "socket {socket}: <span class=\"{class} prochot\" data-socket=\"{socket}\" \
                 data-asserted=\"{asserted}\">{word}</span>"
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One core's cell values.
#[derive(Debug, Clone, Copy, Default)]
struct CoreCell {
    watts: Option<f64>,
    mhz: Option<f64>,
}

fn sockets(html: &mut String, t: &Telemetry, power: Option<&Power>) {
    let mut by_socket: BTreeMap<u32, BTreeMap<u32, CoreCell>> = BTreeMap::new();
    for (label, hz) in &t.boost_limit_hertz {
        by_socket.entry(label.socket).or_default().entry(label.core).or_default().mhz =
            Some(hz / 1e6);
    }
    for (label, _) in &t.energy_joules {
        by_socket.entry(label.socket).or_default().entry(label.core).or_default();
    }
    for (label, watts) in power.map(|p| p.watts.as_slice()).unwrap_or_default() {
        if let Some(cell) = by_socket.get_mut(&label.socket).and_then(|s| s.get_mut(&label.core)) {
            cell.watts = Some(*watts);
        }
    }
    if by_socket.is_empty() {
        html.push_str("<p>No per-core values were read.</p>\n");
        return;
    }
    // One colour scale for every socket, so that sockets compare at a glance; a map only for a
    // family that was read, else why not.
    let all = || by_socket.values().flat_map(|cores| cores.values());
    let power_map = if t.energy_joules.is_empty() {
        Err(format!("Power per core: {}", energy_not_read(t)))
    } else {
        match (power, range(all().filter_map(|c| c.watts))) {
            (Some(p), Some((min_w, max_w))) => Ok((
                Map::Power { min_w, max_w },
                format!(
                    "Power per core ({min_w:.2} to {max_w:.2} W over the last {:.1} s)",
                    p.interval.as_secs_f64()
                ),
            )),
            // Energy was read, but not twice far enough apart, or every counter went back.
            _ => Err("Power per core: not known yet (it needs two samples a second apart): \
                 reload the page"
                .to_owned()),
        }
    };
    let boost_map = match range(all().filter_map(|c| c.mhz)) {
        Some((min_mhz, max_mhz)) => Ok((
            Map::Boost { min_mhz, max_mhz },
            format!("Boost limit per core ({min_mhz:.0} to {max_mhz:.0} MHz)"),
        )),
        None => Err(format!("Boost limit per core: {}", boost_not_read(t))),
    };
    for (socket, cores) in &by_socket {
        let prochot = t.prochot.iter().find(|(s, _)| s == socket).map(|&(_, a)| a);
        let watts: Vec<f64> = cores.values().filter_map(|c| c.watts).collect();
        let package =
            power.and_then(|p| p.package_watts.iter().find(|(s, _)| s == socket)).map(|&(_, w)| w);
        let boosts: Vec<f64> = cores.values().filter_map(|c| c.mhz).collect();
        let _ = write!(
            html,
            "<section class=\"socket\" data-socket=\"{socket}\">\n<h2>Socket {socket}: {n} cores\
             {power}{boost}{hot}</h2>\n<div class=\"maps\">\n",
            n = cores.len(),
            power = match (watts.is_empty(), package) {
                (true, None) => String::new(),
                (true, Some(package)) => format!(", package {package:.0} W"),
                (false, None) => format!(", {:.0} W", watts.iter().sum::<f64>()),
                (false, Some(package)) => {
                    let cores = watts.iter().sum::<f64>();
                    let package_span = format!(
                        "<span class=\"package-power\" data-socket=\"{socket}\">{package:.0} W\
                         </span>"
                    );
                    // The firmware's two counters, as they are: its package below its own
                    // cores is said so, never made into a part larger than its whole.
                    if cores > package {
                        format!(
                            ", {cores:.0} W; the firmware reports the package at {package_span}, \
                             below its cores"
                        )
                    } else {
                        format!(", {cores:.0} W of the package's {package_span}")
                    }
                }
            },
            boost = if boosts.is_empty() {
                String::new()
            } else {
                let avg = boosts.iter().sum::<f64>() / boosts.len() as f64;
                format!(", boost limit {avg:.0} MHz on average")
            },
            hot = match prochot {
                Some(true) => ", <span class=\"bad\">PROCHOT asserted</span>",
                _ => "",
            },
        );
        for map in [&power_map, &boost_map] {
            match map {
                Ok((map, caption)) => heatmap(html, *socket, cores, *map, caption),
                Err(why) => {
                    let _ = writeln!(html, "<p class=\"unread\">{}</p>", escape_html(why));
                }
            }
        }
        html.push_str("</div>\n</section>\n");
    }
}

/// The lowest and highest of `values`; `None` when there is none.
fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// Why no core's energy was read, and what would read it.
fn energy_not_read(t: &Telemetry) -> &'static str {
    match t.unread(Family::CoreEnergy) {
        Some(Unread::NotRequested) => "not read: not requested (--no-collector.core-energy)",
        Some(Unread::NoDevice) => {
            "not read (no usable /dev/hsmp): enable the MSR fallback (amd-hsmp-broker \
             --collector.core-energy.msr-fallback)"
        }
        Some(Unread::Unsupported) => {
            "not read (the firmware has no RAPL core counter): enable the MSR fallback \
             (amd-hsmp-broker --collector.core-energy.msr-fallback)"
        }
        None => "not read: every read failed (see the failed reads above)",
    }
}

/// Why no core's boost limit was read.
fn boost_not_read(t: &Telemetry) -> &'static str {
    match t.unread(Family::BoostLimit) {
        Some(Unread::NotRequested) => "not read: not requested (--no-collector.boost-limit)",
        Some(Unread::NoDevice) => "not read: no usable /dev/hsmp",
        Some(Unread::Unsupported) => "not read: the firmware does not implement it",
        None => "not read: every read failed (see the failed reads above)",
    }
}

/// Which value a heatmap shows, with its colour scale.
#[derive(Debug, Clone, Copy)]
enum Map {
    /// Watts from `min_w` (pale) to `max_w` (dark red).
    Power { min_w: f64, max_w: f64 },
    /// MHz: `max_mhz` green, `min_mhz` (when lower) red.
    Boost { min_mhz: f64, max_mhz: f64 },
}

fn heatmap(
    html: &mut String,
    socket: u32,
    cores: &BTreeMap<u32, CoreCell>,
    map: Map,
    caption: &str,
) {
    let rows = cores.len().div_ceil(COLUMNS).max(1);
    let width = COLUMNS * (CELL + GAP);
    let height = rows * (CELL + GAP);
    let kind = match map {
        Map::Power { .. } => "power",
        Map::Boost { .. } => "boost",
    };
    let _ = write!(
        html,
        "<figure><figcaption>{caption}</figcaption>\n<svg class=\"heatmap {kind}\" \
         data-socket=\"{socket}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" \
         height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\" \
         aria-label=\"{kind} of socket {socket}\">\n",
        caption = escape_html(caption),
    );
    for (n, (core, cell)) in cores.iter().enumerate() {
        let x = (n % COLUMNS) * (CELL + GAP);
        let y = (n / COLUMNS) * (CELL + GAP);
        let (value, text, fill) = match map {
            Map::Power { min_w, max_w } => match cell.watts {
                Some(w) => (format!("{w:.3}"), format!("{w:.2} W"), power_colour(w, min_w, max_w)),
                None => (String::new(), "not known".to_owned(), NO_VALUE.to_owned()),
            },
            Map::Boost { min_mhz, max_mhz } => match cell.mhz {
                Some(m) => {
                    (format!("{m:.0}"), format!("{m:.0} MHz"), boost_colour(m, min_mhz, max_mhz))
                }
                None => (String::new(), "not read".to_owned(), NO_VALUE.to_owned()),
            },
        };
        let _ = writeln!(
            html,
            "<rect class=\"cell {kind}\" data-core=\"{core}\" data-value=\"{value}\" x=\"{x}\" \
             y=\"{y}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"{fill}\"><title>socket {socket} \
             core {core}: {text}</title></rect>"
        );
    }
    html.push_str("</svg></figure>\n");
}

/// The fill of a cell without a value.
const NO_VALUE: &str = "#d4d4d4";

/// Pale yellow at `min_w` to dark red at `max_w`.
fn power_colour(watts: f64, min_w: f64, max_w: f64) -> String {
    let f = if max_w > min_w { ((watts - min_w) / (max_w - min_w)).clamp(0.0, 1.0) } else { 0.0 };
    blend((255, 247, 188), (153, 27, 30), f)
}

/// Green at the highest boost limit, through yellow to red at the lowest.
fn boost_colour(mhz: f64, min_mhz: f64, max_mhz: f64) -> String {
    let below = if max_mhz > min_mhz {
        ((max_mhz - mhz) / (max_mhz - min_mhz)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    if below < 0.5 {
        blend((22, 163, 74), (250, 204, 21), below * 2.0)
    } else {
        blend((250, 204, 21), (220, 38, 38), below * 2.0 - 1.0)
    }
}

fn blend(a: (u8, u8, u8), b: (u8, u8, u8), f: f64) -> String {
    let mix = |x: u8, y: u8| (f64::from(x) + (f64::from(y) - f64::from(x)) * f).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcessStats;
    use crate::translate::ErrorSource;
    use amd_hsmp_proto::Family;

    fn label(socket: u32, core: u32) -> CoreLabel {
        CoreLabel { socket, core }
    }

    /// Telemetry without read times (power over the answers' times), unless a test says.
    fn telemetry(joules: f64, simulated: Option<&str>) -> Arc<Telemetry> {
        Arc::new(Telemetry {
            simulated: simulated.map(str::to_owned),
            energy_read_at_us: Vec::new(),
            package_energy_read_at_us: Vec::new(),
            energy_joules: vec![
                (label(0, 0), joules),
                (label(0, 1), 2.0 * joules),
                (label(1, 0), 5.0),
            ],
            boost_limit_hertz: vec![
                (label(0, 0), 3.7e9),
                (label(0, 1), 2.2e9),
                (label(1, 0), 3.7e9),
            ],
            ..Telemetry::example()
        })
    }

    const VIEW: View = View { samples: 1, took: Duration::from_millis(42) };

    fn report(t: Arc<Telemetry>) -> ScrapeReport {
        ScrapeReport {
            telemetry: Some(t),
            broker_up: true,
            errors: ErrorSource::all()
                .map(|s| (s, u64::from(s == ErrorSource::Family(Family::Prochot))))
                .collect(),
            core_owners: Vec::new(),
            core_owner_skipped: None,
            core_owner_unresolved: None,
            workloads: None,
            duration: Duration::from_millis(42),
            process: ProcessStats::default(),
            web_refused: Vec::new(),
        }
    }

    #[test]
    fn power_comes_from_the_last_two_samples_at_least_a_second_apart() {
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        recent.record_at(t0, &telemetry(100.0, None));
        assert_eq!(recent.power(), None);
        // Too soon: replaces the latest, no pair yet.
        recent.record_at(t0 + Duration::from_millis(300), &telemetry(100.5, None));
        assert_eq!(recent.power(), None);
        recent.record_at(t0 + Duration::from_millis(2300), &telemetry(104.5, None));
        let power = recent.power().unwrap();
        assert_eq!(power.interval, Duration::from_secs(2));
        assert_eq!(power.watts, vec![(label(0, 0), 2.0), (label(0, 1), 4.0), (label(1, 0), 0.0)]);
    }

    /// Regression (issue 42): the page divided by the time between the answers, so a core
    /// at its cap read up to 5 % above it when one sample took longer than the other; power is
    /// now energy over the time between the core's two reads, as the broker stamps them.
    #[test]
    fn power_is_taken_over_the_time_between_the_reads_not_the_answers() {
        let read_at = |joules: f64, first_us: u64| {
            Arc::new(Telemetry {
                energy_read_at_us: vec![Some(first_us), Some(first_us + 10), None],
                package_energy_joules: vec![(0, 10.0 * joules)],
                package_energy_read_at_us: vec![Some(first_us)],
                ..(*telemetry(joules, None)).clone()
            })
        };
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        // The first answer landed 50 ms after its reads, the second at once: 1.0 s between
        // the answers, 1.05 s between the reads.
        recent.record_at(t0, &read_at(100.0, 5_000_000));
        recent.record_at(t0 + Duration::from_secs(1), &read_at(102.1, 6_050_000));
        let power = recent.power().unwrap();
        let w = |l: CoreLabel| power.watts.iter().find(|(c, _)| *c == l).map(|&(_, w)| w);
        assert!((w(label(0, 0)).unwrap() - 2.0).abs() < 1e-9, "{:?}", power.watts);
        assert!((w(label(0, 1)).unwrap() - 4.0).abs() < 1e-9, "{:?}", power.watts);
        // A core the broker gave no time for: the answers' interval.
        assert_eq!(w(label(1, 0)), Some(0.0));
        assert!((power.package_watts[0].1 - 20.0).abs() < 1e-9, "{:?}", power.package_watts);
        // Reads out of order (another machine's clock) give no power rather than a wrong one.
        recent.record_at(t0 + Duration::from_secs(2), &read_at(104.0, 1_000));
        let power = recent.power().unwrap();
        assert_eq!(power.watts, vec![(label(1, 0), 0.0)]);
        assert!(power.package_watts.is_empty());
    }

    #[test]
    fn an_answer_taken_from_earlier_reads_is_not_kept_for_power() {
        let recent = RecentSamples::default();
        recent.record(&telemetry(100.0, None), Duration::ZERO);
        recent.record(&telemetry(100.5, None), Duration::from_millis(300));
        let pair = recent.pair.lock().unwrap();
        assert_eq!(
            pair.1.as_ref().map(|s| s.telemetry.energy_joules.clone()),
            Some(telemetry(100.0, None).energy_joules.clone())
        );
    }

    #[test]
    fn a_counter_that_went_back_has_no_power() {
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        recent.record_at(t0, &telemetry(100.0, None));
        recent.record_at(t0 + Duration::from_secs(1), &telemetry(1.0, None));
        let watts = recent.power().unwrap().watts;
        assert_eq!(watts, vec![(label(1, 0), 0.0)]);
    }

    #[test]
    fn page_has_a_cell_per_core_and_map_prochot_and_the_simulation_banner() {
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        recent.record_at(t0, &telemetry(100.0, Some("turin-2p")));
        let last = telemetry(110.0, Some("turin-2p"));
        recent.record_at(t0 + Duration::from_secs(10), &last);
        let html = render(&report(last), recent.power().as_ref(), "/metrics", VIEW);
        assert!(html.contains("id=\"simulated\""), "{html}");
        assert!(html.contains("profile <b>turin-2p</b>"));
        assert_eq!(html.matches("<rect class=\"cell power\"").count(), 3);
        assert_eq!(html.matches("<rect class=\"cell boost\"").count(), 3);
        assert!(html.contains("data-core=\"1\" data-value=\"2.000\""), "{html}");
        assert!(html.contains("data-core=\"1\" data-value=\"2200\""));
        assert!(html.contains("data-socket=\"1\" data-asserted=\"true\">ASSERTED"));
        assert!(html.contains("data-socket=\"0\" data-asserted=\"false\">clear"));
        assert!(html.contains("Socket 0: 2 cores, 3 W"), "{html}");
        assert!(html.contains("HSMP protocol 7") && html.contains("prochot 1"));
        assert!(html.contains("data-mhz=\"1500\">1500 MHz, set by PROCHOT</span>"), "{html}");
        assert!(html.contains("data-mhz=\"3700\">3700 MHz, set by the part's own maximum"));
        assert!(!html.contains("<script"), "no script");
        assert!(!html.contains("src=") && !html.contains("href=\"http"), "no external asset");
    }

    /// Issue 28: where the package counter is read, each socket's heading gives its cores'
    /// power as a part of the package's.
    #[test]
    fn a_socket_heading_gives_its_cores_power_as_part_of_the_package_or_says_it_is_above() {
        let with_package = |joules: f64, package: f64| {
            let t = telemetry(joules, None);
            Arc::new(Telemetry {
                package_energy_joules: vec![(0, package), (1, 2.0 * package)],
                ..(*t).clone()
            })
        };
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        recent.record_at(t0, &with_package(100.0, 1000.0));
        let last = with_package(110.0, 1100.0);
        recent.record_at(t0 + Duration::from_secs(10), &last);
        let power = recent.power().unwrap();
        assert_eq!(power.package_watts, vec![(0, 10.0), (1, 20.0)]);
        let html = render(&report(Arc::clone(&last)), Some(&power), "/metrics", VIEW);
        let heading = "Socket 0: 2 cores, 3 W of the package's <span class=\"package-power\" \
                       data-socket=\"0\">10 W</span>";
        assert!(html.contains(heading), "{html}");
        // I2: a package the firmware reports below its cores is said so, not as their whole.
        let below = render(
            &report(last),
            Some(&Power { package_watts: vec![(0, 2.0)], ..power.clone() }),
            "/metrics",
            VIEW,
        );
        let heading = "Socket 0: 2 cores, 3 W; the firmware reports the package at <span \
                       class=\"package-power\" data-socket=\"0\">2 W</span>, below its cores";
        assert!(below.contains(heading), "{below}");
        assert!(!below.contains("of the package's"), "{below}");
        // Without the package counter the heading is the cores' alone.
        let bare = |joules| {
            Arc::new(Telemetry {
                package_energy_joules: Vec::new(),
                ..(*telemetry(joules, None)).clone()
            })
        };
        let recent = RecentSamples::default();
        recent.record_at(t0, &bare(100.0));
        let last = bare(110.0);
        recent.record_at(t0 + Duration::from_secs(10), &last);
        let html = render(&report(last), recent.power().as_ref(), "/metrics", VIEW);
        assert!(html.contains("Socket 0: 2 cores, 3 W, boost limit"), "{html}");
    }

    #[test]
    fn a_family_not_read_has_no_map_and_says_why() {
        // Rome with the MSR fallback: energy, no boost limit (and no frequency limit, which
        // takes protocol 5).
        let t = Telemetry {
            boost_limit_hertz: Vec::new(),
            frequency_limit: Vec::new(),
            unread: vec![
                (Family::BoostLimit, Unread::NoDevice),
                (Family::FrequencyLimit, Unread::NoDevice),
            ],
            ..(*telemetry(100.0, None)).clone()
        };
        let recent = RecentSamples::default();
        let t0 = Instant::now();
        recent.record_at(t0, &Arc::new(t.clone()));
        let last = Arc::new(Telemetry {
            energy_joules: telemetry(101.0, None).energy_joules.clone(),
            ..t
        });
        recent.record_at(t0 + Duration::from_secs(1), &last);
        let html = render(&report(last), recent.power().as_ref(), "/metrics", VIEW);
        assert!(!html.contains("MHz"), "{html}");
        assert!(!html.contains("<rect class=\"cell boost\""));
        assert!(html.contains("Boost limit per core: not read: no usable /dev/hsmp"), "{html}");
        assert!(html.contains("Power per core (0.00 to 2.00 W over the last 1.0 s)"), "{html}");

        // Milan without the fallback: boost limit, no energy (nor the package's).
        let t = Telemetry {
            energy_source: None,
            energy_joules: Vec::new(),
            package_energy_joules: Vec::new(),
            unread: vec![(Family::CoreEnergy, Unread::Unsupported)],
            ..(*telemetry(100.0, None)).clone()
        };
        let t = Arc::new(t);
        let recent = RecentSamples::default();
        recent.record_at(t0, &t);
        recent.record_at(t0 + Duration::from_secs(1), &t);
        let html = render(&report(t), recent.power().as_ref(), "/metrics", VIEW);
        assert!(!html.contains(" W"), "no watts where no energy was read: {html}");
        assert!(!html.contains("<rect class=\"cell power\""));
        assert!(
            html.contains(
                "Power per core: not read (the firmware has no RAPL core counter): enable the MSR \
                 fallback"
            ),
            "{html}"
        );
    }

    #[test]
    fn a_range_of_nothing_is_none() {
        assert_eq!(range(std::iter::empty()), None);
        assert_eq!(range([2.0, -1.0, 3.0].into_iter()), Some((-1.0, 3.0)));
    }

    #[test]
    fn page_without_broker_says_so_and_has_no_maps() {
        let mut r = report(telemetry(1.0, None));
        r.telemetry = None;
        r.broker_up = false;
        let html = render(&r, None, "/metrics", VIEW);
        assert!(html.contains("not answering") && !html.contains("<svg"));
        assert!(!html.contains("SIMULATED"));
    }

    #[test]
    fn everything_from_outside_is_escaped() {
        let mut t = (*telemetry(1.0, Some("<script>x</script>"))).clone();
        t.simulated = Some("<script>\"x\"&</script>".into());
        let html = render(&report(Arc::new(t)), None, "/m\"><script>", VIEW);
        assert!(!html.contains("<script"), "{html}");
        assert!(html.contains("&lt;script&gt;&quot;x&quot;&amp;&lt;/script&gt;"));
        assert!(html.contains("href=\"/m&quot;&gt;&lt;script&gt;\""));
    }

    #[test]
    fn the_workloads_holding_cores_are_listed_by_name_with_power_and_energy_the_ended_counted() {
        let workload = |path: &str, joules, cores, watts| Workload {
            owner: Arc::new(Owner::from_raw(path.as_bytes())),
            joules,
            cores,
            watts,
        };
        let w = WorkloadReport {
            workloads: vec![
                workload("/machine.slice/machine-qemu\\x2d1\\x2d<vm>.scope", 3.6e6, 4, Some(80.0)),
                workload("/system.slice/slurmstepd.scope/job_4242/step_0", 1234.0, 2, None),
                workload("/system.slice/slurmstepd.scope/job_7", 50.0, 0, None),
                workload("/odd/<b>", 1.0, 1, Some(1.0)),
            ],
            unattributed: Vec::new(),
            evicted: 0,
            latest_sample_age: Some(Duration::from_secs(3)),
        };
        let on = ScrapeReport { workloads: Some(w), ..report(telemetry(1.0, None)) };
        let html = render(&on, None, "/metrics", VIEW);
        assert!(html.contains("3 s ago: 3 holding cores; 1 ended within the linger"), "{html}");
        assert!(
            html.contains(">VM &lt;vm&gt;</td><td>4</td><td>80.0 W</td><td>3600.0 kJ (1.0000 kWh)"),
            "{html}"
        );
        assert!(html.contains(">Slurm job 4242, step 0</td><td>2</td><td>not yet</td><td>1.2 kJ"));
        assert!(html.contains(">/odd/&lt;b&gt;</td>"), "a workload without identity by its path");
        assert!(!html.contains("job_7</td>"), "an ended workload is not listed");
        assert!(!html.contains("<b>"), "{html}");

        let none_yet = WorkloadReport::default();
        let html = render(&ScrapeReport { workloads: Some(none_yet), ..on }, None, "/m", VIEW);
        assert!(html.contains("No sample with the cores' owners yet"), "{html}");
        let off = render(&report(telemetry(1.0, None)), None, "/m", VIEW);
        assert!(!off.contains("Workloads holding cores"), "none while the collector is off");
    }

    #[test]
    fn landing_page_escapes_the_path() {
        assert_eq!(escape_html("/a\"<b>&'"), "/a&quot;&lt;b&gt;&amp;&#39;");
    }

    #[test]
    fn colours_run_from_cool_to_hot() {
        assert_eq!(power_colour(0.5, 0.5, 2.0), "#fff7bc");
        assert_eq!(power_colour(2.0, 0.5, 2.0), "#991b1e");
        assert_eq!(power_colour(1.0, 1.0, 1.0), "#fff7bc");
        assert_eq!(boost_colour(3700.0, 2200.0, 3700.0), "#16a34a");
        assert_eq!(boost_colour(2200.0, 2200.0, 3700.0), "#dc2626");
        assert_eq!(boost_colour(3700.0, 3700.0, 3700.0), "#16a34a");
    }
}
