//! Check U: the previous release's `.deb` upgraded to this checkout's while a scraper runs.
//!
//! The guest runs the previous package (purged and installed afresh, as a host of the previous
//! release has it); a scraper in the guest fetches `/metrics` every [`SCRAPE_PERIOD`] and logs
//! each answer's times, HTTP status and counters while `dpkg -i` installs this checkout's package
//! over it. The log is judged on the host ([`judge`]): how long no scrape was complete, and
//! whether a counter went back without a counted reset.
//!
//! A counted reset is what Prometheus' `rate()` may take a decrease for, made visible: the
//! exporter's `process_start_time_seconds` differs from the one of the scrape where the series
//! was last seen. Every series the exporter counts itself starts anew with a new process; the
//! energy counters are the firmware's (HSMP source) and must not move back at all, which the
//! same rule checks (a decrease with a restart would pass it, and is reported).

use super::exporter::{Sample, parse_metrics, wait_for_exporter};
use super::package::while_energy_advances;
use super::{Ctx, Evidence, Verdict, sh};
use crate::vm::guest::{Output, Vm};
use crate::vm::previous::{Release, Releases};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::time::Duration;

/// The most time from one complete scrape to the next that the upgrade may cause. The package's
/// `postinst` try-restarts the broker with its socket, which restarts the exporter too (its
/// unit `Requires=` the socket), then restarts the exporter once more. The longest outage is the
/// first: the old exporter's stop lets a scrape in flight finish, and that scrape waits for the
/// stopped broker until its deadline (10 s without a timeout header); then the broker's start,
/// the exporter's and the first sample of the new pair (every mailbox read), plus the scraper's
/// period and one scrape. Measured under TCG on a host at load average 6 to 10: 9.7 and 23.1 s
/// in two runs. The
/// bound is generous against a slow host, not a figure of the upgrade on hardware.
pub(crate) const UPGRADE_GAP: Duration = Duration::from_secs(45);

/// The scraper's pause between two scrapes (plus the scrape itself and curl's start-up).
const SCRAPE_PERIOD: &str = "0.15";

/// Most the guest may take for the upgrade under scrapes, the purge or the old package's
/// installation: a bound against a hung guest, not a figure the check asserts.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);

/// One scrape of the log.
#[derive(Debug, Clone)]
pub(super) struct Logged {
    /// When curl started and ended (the guest's clock, seconds).
    pub(super) start: f64,
    pub(super) end: f64,
    /// The HTTP status; 0 when there was no answer (connection refused, timeout).
    pub(super) status: u16,
    /// The counters, `amd_hsmp_up`, `amd_hsmp_build_info` and `process_start_time_seconds`.
    pub(super) samples: Vec<Sample>,
}

impl Logged {
    fn value(&self, name: &str) -> Option<f64> {
        self.samples.iter().find(|s| s.name == name).map(|s| s.value)
    }

    /// Why the scrape is not complete, if it is not: an HTTP answer other than 200, the device
    /// not up, an energy series missing, no start time.
    fn incomplete(&self, cores: usize) -> Option<String> {
        if self.status == 0 {
            return Some("no answer".into());
        }
        if self.status != 200 {
            return Some(format!("HTTP {}", self.status));
        }
        if self.value("amd_hsmp_up") != Some(1.0) {
            return Some(format!("amd_hsmp_up {:?}", self.value("amd_hsmp_up")));
        }
        let energy =
            self.samples.iter().filter(|s| s.name == "amd_hsmp_core_energy_joules_total").count();
        if energy != cores {
            return Some(format!("{energy} of {cores} energy series"));
        }
        if self.value("process_start_time_seconds").is_none() {
            return Some("no process_start_time_seconds".into());
        }
        None
    }

    /// `amd_hsmp_build_info`'s revision.
    pub(super) fn revision(&self) -> Option<&str> {
        self.samples
            .iter()
            .find(|s| s.name == "amd_hsmp_build_info")
            .and_then(|s| s.labels.get("revision"))
            .map(String::as_str)
    }
}

/// The scrape log the guest printed: `scrape START END STATUS` lines, each followed by that
/// answer's sample lines; what comes before the first is not the log's.
pub(super) fn parse_log(text: &str) -> Result<Vec<Logged>> {
    let mut log: Vec<Logged> = Vec::new();
    let mut body = String::new();
    let flush = |log: &mut Vec<Logged>, body: &mut String| -> Result<()> {
        if let Some(last) = log.last_mut() {
            last.samples = parse_metrics(body)?;
        }
        body.clear();
        Ok(())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("scrape ") {
            flush(&mut log, &mut body)?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let [start, end, status] = fields[..] else { bail!("bad scrape line {line:?}") };
            log.push(Logged {
                start: start.parse().with_context(|| format!("bad time in {line:?}"))?,
                end: end.parse().with_context(|| format!("bad time in {line:?}"))?,
                status: status.parse().with_context(|| format!("bad status in {line:?}"))?,
                samples: Vec::new(),
            });
        } else if !log.is_empty() {
            body.push_str(line);
            body.push('\n');
        }
    }
    flush(&mut log, &mut body)?;
    Ok(log)
}

/// What the log says about the upgrade.
#[derive(Debug, Clone, Default)]
pub(super) struct Judgement {
    /// Scrapes, and how many were complete.
    pub(super) scrapes: usize,
    pub(super) complete: usize,
    /// Why the others were not, with how many of each.
    pub(super) incomplete: BTreeMap<String, usize>,
    /// The longest time from one complete scrape's end to the next one's, seconds, and when it
    /// began (seconds after the upgrade started).
    pub(super) gap: f64,
    pub(super) gap_at: f64,
    /// The distinct exporter start times, in order.
    pub(super) starts: Vec<f64>,
    /// Counter decreases a changed start time explains.
    pub(super) resets: Vec<String>,
    /// Counter decreases nothing explains.
    pub(super) decreases: Vec<String>,
    /// What else makes the log unfit: not complete before the upgrade or after it.
    pub(super) problems: Vec<String>,
}

impl Judgement {
    /// The verdict's items: each condition with its evidence.
    pub(super) fn items(&self, bound: Duration) -> Vec<(bool, String)> {
        let mut items = vec![
            (
                self.problems.is_empty(),
                format!(
                    "{} scrapes, {} complete; the others: {:?}{}",
                    self.scrapes,
                    self.complete,
                    self.incomplete,
                    self.problems.iter().map(|p| format!("; {p}")).collect::<String>()
                ),
            ),
            (
                self.gap <= bound.as_secs_f64(),
                format!(
                    "longest time between complete scrapes {:.2} s (from {:+.2} s of the \
                     upgrade), bound {} s (UPGRADE_GAP)",
                    self.gap,
                    self.gap_at,
                    bound.as_secs()
                ),
            ),
            (
                self.decreases.is_empty(),
                format!(
                    "{} counter decreases without a reset, {} with a changed start time \
                     (exporter start times {:?})",
                    self.decreases.len(),
                    self.resets.len(),
                    self.starts
                ),
            ),
        ];
        items.extend(self.decreases.iter().take(10).map(|d| (false, format!("  back: {d}"))));
        items.extend(self.resets.iter().take(5).map(|r| (true, format!("  reset: {r}"))));
        items
    }

    /// Whether the upgrade kept to the bound and no counter went back unexplained.
    #[cfg(test)]
    fn pass(&self, bound: Duration) -> bool {
        self.items(bound).iter().all(|(ok, _)| *ok)
    }
}

/// Judges `log`, scraped from a guest of `cores` cores while the upgrade ran from `upgrade.0` to
/// `upgrade.1` (the guest's clock): the longest time between complete scrapes, and every counter
/// decrease, each explained by a changed start time or not.
pub(super) fn judge(log: &[Logged], cores: usize, upgrade: (f64, f64)) -> Judgement {
    let mut j = Judgement { scrapes: log.len(), ..Judgement::default() };
    let complete: Vec<&Logged> = log.iter().filter(|s| s.incomplete(cores).is_none()).collect();
    j.complete = complete.len();
    for s in log {
        if let Some(why) = s.incomplete(cores) {
            *j.incomplete.entry(why).or_default() += 1;
        }
    }
    match (complete.first(), complete.last()) {
        (Some(first), Some(last)) => {
            if first.end >= upgrade.0 {
                j.problems.push("no complete scrape before the upgrade".into());
            }
            if last.start <= upgrade.1 {
                j.problems.push("no complete scrape after the upgrade".into());
            }
        }
        _ => j.problems.push("no complete scrape".into()),
    }
    for pair in complete.windows(2) {
        let gap = pair[1].end - pair[0].end;
        if gap > j.gap {
            j.gap = gap;
            j.gap_at = pair[0].end - upgrade.0;
        }
    }
    // Each counter series against its last value, in every answer that has a start time.
    let mut last: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for s in log.iter().filter(|s| s.status == 200) {
        let Some(start) = s.value("process_start_time_seconds") else { continue };
        if j.starts.last() != Some(&start) {
            j.starts.push(start);
        }
        for sample in s.samples.iter().filter(|x| x.name.ends_with("_total")) {
            let labels: Vec<String> =
                sample.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let series = format!("{}{{{}}}", sample.name, labels.join(","));
            if let Some(&(value, seen_start, at)) = last.get(&series)
                && sample.value < value
            {
                let what = format!(
                    "{series} {value} -> {} ({:+.2} s to {:+.2} s of the upgrade)",
                    sample.value,
                    at - upgrade.0,
                    s.end - upgrade.0
                );
                if seen_start == start {
                    j.decreases.push(format!("{what}, same start time {start}"));
                } else {
                    j.resets.push(format!("{what}, start time {seen_start} -> {start}"));
                }
            }
            last.insert(series, (sample.value, start, s.end));
        }
    }
    j
}

/// A unit's state as systemd shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UnitState {
    active: String,
    invocation: String,
    pid: String,
    entered: String,
}

impl std::fmt::Display for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, pid {}, invocation {}, active since {} µs",
            self.active,
            self.pid,
            self.invocation.get(..8).unwrap_or(&self.invocation),
            self.entered
        )
    }
}

/// The states of `units`.
fn unit_states(vm: &mut Vm, units: &[&str]) -> Result<Vec<UnitState>> {
    let mut out = Vec::new();
    for unit in units {
        let text = sh(
            vm,
            &format!(
                "systemctl show -p ActiveState -p InvocationID -p MainPID \
                 -p ActiveEnterTimestampMonotonic {unit}"
            ),
        )?
        .text;
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key).and_then(|l| l.strip_prefix('=')))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        out.push(UnitState {
            active: get("ActiveState"),
            invocation: get("InvocationID"),
            pid: get("MainPID"),
            entered: get("ActiveEnterTimestampMonotonic"),
        });
    }
    Ok(out)
}

/// The services check U watches restart.
const SERVICES: [&str; 2] = ["amd-hsmp-broker.service", "amd-hsmp-exporter.service"];

/// The scraper and the upgrade, one guest script: scrapes until the upgrade is done and three
/// answers came after it, then prints `dpkg START END EXIT`, dpkg's output (`dpkg: ` lines)
/// and the log, which [`parse_log`] reads from its first `scrape` line to the end.
fn upgrade_script() -> String {
    format!(
        r#"set -u
log=/run/upgrade-scrapes.log; body=/run/upgrade-scrape.body; stop=/run/upgrade-stop
rm -f "$log" "$stop"; : >"$log"
scraper() {{
	until [ -e "$stop" ]; do
		t0=$EPOCHREALTIME
		rm -f "$body"
		code=$(curl -s -m 10 -o "$body" -w '%{{http_code}}' http://127.0.0.1:10054/metrics)
		t1=$EPOCHREALTIME
		{{
			echo "scrape $t0 $t1 ${{code:-000}}"
			[ -f "$body" ] && grep -E '^(amd_hsmp_up|amd_hsmp_build_info|process_start_time_seconds|[a-z_:]+_total)[ {{]' "$body"
		}} >>"$log"
		sleep {SCRAPE_PERIOD}
	done
}}
scraper &
pid=$!
sleep 3
t0=$EPOCHREALTIME
dpkg -i /root/vm/amd-hsmp-exporter.deb >/run/upgrade-dpkg.out 2>&1
rc=$?
t1=$EPOCHREALTIME
for i in $(seq 600); do
	n=$(awk -v t="$t1" '$1 == "scrape" && $2 > t && $4 == "200"' "$log" | wc -l)
	[ "$n" -ge 3 ] && break
	sleep 0.1
done
touch "$stop"
wait "$pid"
echo "dpkg $t0 $t1 $rc"
sed 's/^/dpkg: /' /run/upgrade-dpkg.out
cat "$log"
"#
    )
}

/// Lists the new package's files, requires each in dpkg's list and on disk with the package's
/// contents, counts the previous package's files that differ from what is installed, and
/// prints both binaries' `--version`.
const FILES_SCRIPT: &str = r#"set -e
rm -rf /run/new-deb /run/old-deb
dpkg-deb -x /root/vm/amd-hsmp-exporter.deb /run/new-deb
dpkg-deb -x /root/vm/amd-hsmp-exporter-previous.deb /run/old-deb
sums() { (cd "$1" && find . -type f -exec md5sum {} + | sed 's|  \./|  /|'); }
(cd /run/new-deb && find . -type f | sed 's|^\.||' | sort) >/run/new-files
dpkg -L amd-hsmp-exporter | sort | grep -Fxf /run/new-files | cmp - /run/new-files
sums /run/new-deb | md5sum --quiet -c
echo "$(wc -l </run/new-files) files of the new package listed by dpkg and installed;" \
	"$(sums /run/old-deb | md5sum --quiet -c 2>/dev/null | grep -c FAILED || true) of the" \
	"previous package's $(sums /run/old-deb | wc -l) replaced"
amd-hsmp-broker --version | head -n 1
amd-hsmp-exporter --version | head -n 1
rm -rf /run/new-deb /run/old-deb
"#;

/// Check U: the previous release's package, installed afresh and serving, upgraded to this
/// checkout's with `dpkg -i` while the guest scrapes: both services restarted and active, the
/// new package's files installed, scrapes incomplete for at most [`UPGRADE_GAP`], no counter
/// back without a counted reset.
pub(super) fn upgrade(ctx: &mut Ctx<'_>) -> Result<Verdict> {
    let (vm, responder) = (&mut *ctx.vm, ctx.responder);
    let releases = ctx.releases;
    let (previous, _) = &releases.previous;
    let topo = responder.topology();
    let cores = (topo.sockets * topo.cores) as usize;
    let mut ev = Evidence::default();
    install_previous(vm, &mut ev, previous)?;
    wait_for_exporter(vm)?;
    // The first scrape starts the broker through its socket.
    sh(vm, "curl -fsS -o /dev/null -m 30 http://127.0.0.1:10054/metrics")?;
    let before = unit_states(vm, &SERVICES)?;
    let out = while_energy_advances(responder, || vm.run(&upgrade_script(), UPGRADE_TIMEOUT))?;
    let after = unit_states(vm, &SERVICES)?;
    let socket = sh(vm, "systemctl is-active amd-hsmp-broker.socket")?;

    let dpkg_line = out.text.lines().find_map(|l| l.strip_prefix("dpkg ")).unwrap_or_default();
    let fields: Vec<&str> = dpkg_line.split_whitespace().collect();
    let (started, ended, rc) = match fields[..] {
        [a, b, rc] => (a.parse::<f64>()?, b.parse::<f64>()?, rc.to_string()),
        _ => bail!("the upgrade script printed no dpkg line:\n{}", out.text),
    };
    let dpkg: Vec<&str> = out.text.lines().filter_map(|l| l.strip_prefix("dpkg: ")).collect();
    let unpacked = dpkg.iter().find(|l| l.starts_with("Unpacking amd-hsmp-exporter"));
    ev.check(
        out.ok() && rc == "0" && unpacked.is_some_and(|l| l.contains(") over (")),
        format!(
            "dpkg -i of this checkout's package: exit {rc} in {:.1} s; {}",
            ended - started,
            unpacked.map_or("no Unpacking line", |l| l.trim())
        ),
    );
    services_restarted(&mut ev, &before, &after, &socket);
    new_files_installed(vm, &mut ev, releases)?;

    let log = parse_log(&out.text)?;
    let complete: Vec<&Logged> = log.iter().filter(|s| s.incomplete(cores).is_none()).collect();
    let first = complete.first().and_then(|s| s.revision()).unwrap_or("none");
    let last = complete.last().and_then(|s| s.revision()).unwrap_or("none");
    ev.check(
        first == previous.revision && last == releases.current,
        format!("amd_hsmp_build_info's revision {first} before, {last} after"),
    );
    let j = judge(&log, cores, (started, ended));
    for (ok, what) in j.items(UPGRADE_GAP) {
        ev.check(ok, what);
    }
    ev.check(
        j.starts.len() >= 2,
        format!("exporter start times {:?}: the upgrade restarted it", j.starts),
    );
    if ev.failed() {
        for line in dpkg.iter().rev().take(20).rev() {
            ev.check(true, format!("  dpkg: {line}"));
        }
        ev.journal(vm)?;
    }
    Ok(ev.verdict(&format!(
        "upgrade from the previous release ({}) under scrapes: gap {:.1} s",
        previous.name, j.gap
    )))
}

/// Check U's first step: the previous release's package installed afresh, purging what was
/// there, at `previous`'s revision.
fn install_previous(vm: &mut Vm, ev: &mut Evidence, previous: &Release) -> Result<()> {
    let old = vm.run(
        "apt-get purge -y amd-hsmp-exporter >/dev/null && \
         apt-get install -y /root/vm/amd-hsmp-exporter-previous.deb >/dev/null && \
         dpkg-query -W -f='${Status} ${Version}\\n' amd-hsmp-exporter && \
         amd-hsmp-exporter --version | head -n 1",
        UPGRADE_TIMEOUT,
    )?;
    let installed = crate::vm::prepare::version_revision(&old.text);
    ev.check(
        old.ok() && installed.as_deref() == Some(previous.revision.as_str()),
        format!(
            "the previous release ({}, {}) installed afresh: {}",
            previous.name,
            previous.revision,
            old.text.trim().replace('\n', "; ")
        ),
    );
    Ok(())
}

/// Check U: both services, `before` and `after` the upgrade, active and restarted by it (another
/// invocation, process and start time); the broker's socket still active.
fn services_restarted(
    ev: &mut Evidence,
    before: &[UnitState],
    after: &[UnitState],
    socket: &Output,
) {
    for ((unit, b), a) in SERVICES.iter().zip(before).zip(after) {
        ev.check(
            b.active == "active"
                && a.active == "active"
                && a.invocation != b.invocation
                && a.pid != b.pid
                && a.entered != b.entered,
            format!("{unit} restarted by the upgrade: before {b}; after {a}"),
        );
    }
    ev.check(
        socket.text.trim() == "active",
        format!("amd-hsmp-broker.socket {}", socket.text.trim()),
    );
}

/// Check U: dpkg lists every file of the new package, each installed as the package has it; both
/// binaries at this checkout's revision.
fn new_files_installed(vm: &mut Vm, ev: &mut Evidence, releases: &Releases) -> Result<()> {
    // dpkg lists every file of the new package, each on disk as the package has it (cargo-deb
    // writes no md5sums for dpkg -V), and some of the previous package's are replaced.
    let files = vm.run(FILES_SCRIPT, UPGRADE_TIMEOUT)?;
    let revisions: Vec<String> =
        files.text.lines().filter_map(crate::vm::prepare::version_revision).collect();
    ev.check(
        files.ok() && revisions.len() == 2 && revisions.iter().all(|r| *r == releases.current),
        format!(
            "the new package's files installed, binaries at revision {}: {}",
            releases.current,
            files.text.trim().replace('\n', "; ")
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape at `t` (seconds after the log's start, 0.2 s long) with `status`, and if 200,
    /// `up`, `cores` energy series at `energy`, the exporter's `start` time and its error
    /// counter at `errors`.
    fn scrape(t: f64, status: u16, cores: usize, energy: f64, start: f64, errors: f64) -> String {
        let mut s = format!("scrape {:.6} {:.6} {status}\n", 1000.0 + t, 1000.2 + t);
        if status == 200 {
            s.push_str("amd_hsmp_up 1\nprocess_start_time_seconds ");
            s.push_str(&format!("{start}\n"));
            s.push_str(&format!(
                "amd_hsmp_build_info{{revision=\"{}\",version=\"0.1.0\"}} 1\n",
                if start < 600.0 { "aaaaaaaaaaaa" } else { "bbbbbbbbbbbb" }
            ));
            s.push_str(&format!("amd_hsmp_scrape_errors_total{{collector=\"broker\"}} {errors}\n"));
            for core in 0..cores {
                s.push_str(&format!(
                    "amd_hsmp_core_energy_joules_total{{core=\"{core}\",socket=\"0\"}} {energy}\n"
                ));
            }
        }
        s
    }

    /// The upgrade from 3 s to 8 s of the log, scrapes every 0.4 s: no answer from 5 s to 6 s,
    /// then the new exporter (start time 700) with its error counter anew.
    fn upgrade_log(no_answer: (f64, f64), new_start: f64) -> String {
        let mut text = String::new();
        for i in 0..30 {
            let t = f64::from(i) * 0.4;
            let energy = 10.0 + f64::from(i);
            text.push_str(&if t >= no_answer.0 && t < no_answer.1 {
                scrape(t, 0, 2, 0.0, 0.0, 0.0)
            } else if t < no_answer.0 {
                scrape(t, 200, 2, energy, 500.0, 7.0)
            } else {
                scrape(t, 200, 2, energy, new_start, 1.0)
            });
        }
        text
    }

    const UPGRADE: (f64, f64) = (1003.0, 1008.0);

    #[test]
    fn an_upgrade_with_a_short_gap_and_a_counted_reset_passes() {
        // As the guest prints it: the dpkg lines first.
        let text = format!(
            "dpkg 1003.0 1008.0 0\ndpkg: Unpacking amd-hsmp-exporter (0.1.0-1) over (0.1.0-1) ...\n{}",
            upgrade_log((5.0, 6.0), 700.0)
        );
        let log = parse_log(&text).unwrap();
        assert_eq!(log.len(), 30);
        assert_eq!(log[0].revision(), Some("aaaaaaaaaaaa"));
        let j = judge(&log, 2, UPGRADE);
        assert!(j.pass(UPGRADE_GAP), "{j:?}");
        assert_eq!((j.scrapes, j.complete), (30, 28));
        assert_eq!(j.incomplete.get("no answer"), Some(&2));
        // From the scrape at 4.8 s (2 s into the upgrade) to the one at 6.0 s.
        assert!((j.gap - 1.2).abs() < 1e-6, "{}", j.gap);
        assert!((j.gap_at - 2.0).abs() < 1e-6, "{}", j.gap_at);
        assert_eq!(j.starts, [500.0, 700.0]);
        assert_eq!(j.resets.len(), 1, "{:?}", j.resets);
        assert!(j.resets[0].contains("collector=\"broker\""), "{:?}", j.resets);
    }

    #[test]
    fn a_decrease_without_a_changed_start_time_fails() {
        // The "new" exporter has the old start time: its counter went back unexplained.
        let log = parse_log(&upgrade_log((5.0, 6.0), 500.0)).unwrap();
        let j = judge(&log, 2, UPGRADE);
        assert!(!j.pass(UPGRADE_GAP));
        assert_eq!(j.decreases.len(), 1, "{j:?}");
        assert!(j.resets.is_empty());
        // An energy counter that goes back (both cores' at 3.6 s, 18 J to 12 J) fails even when
        // the rest is fine.
        let text = upgrade_log((5.0, 6.0), 700.0).replace("} 19\n", "} 12\n");
        let j = judge(&parse_log(&text).unwrap(), 2, UPGRADE);
        assert_eq!(j.decreases.len(), 2, "{j:?}");
        assert!(!j.pass(UPGRADE_GAP));
    }

    #[test]
    fn a_gap_over_the_bound_fails() {
        let bound = UPGRADE_GAP.as_secs_f64();
        let mut text = String::new();
        text.push_str(&scrape(0.0, 200, 2, 1.0, 500.0, 0.0));
        text.push_str(&scrape(2.0, 0, 2, 0.0, 0.0, 0.0));
        text.push_str(&scrape(bound + 0.5, 200, 2, 2.0, 700.0, 0.0));
        let j = judge(&parse_log(&text).unwrap(), 2, (1001.0, 1002.5));
        assert!(j.problems.is_empty() && j.decreases.is_empty(), "{j:?}");
        assert!((j.gap - (bound + 0.5)).abs() < 1e-6);
        assert!(!j.pass(UPGRADE_GAP));
    }

    #[test]
    fn answers_without_telemetry_are_not_complete() {
        // HTTP 200 while the broker restarts: no energy; a 503; a missing core.
        let mut text = String::new();
        text.push_str(&scrape(0.0, 200, 2, 1.0, 500.0, 0.0));
        text.push_str(&scrape(1.0, 200, 0, 0.0, 500.0, 1.0));
        text.push_str(&scrape(2.0, 503, 2, 0.0, 0.0, 0.0));
        text.push_str(&scrape(3.0, 200, 1, 2.0, 500.0, 2.0));
        text.push_str(&scrape(4.0, 200, 2, 2.0, 500.0, 2.0));
        let j = judge(&parse_log(&text).unwrap(), 2, (1000.5, 1003.5));
        assert_eq!(j.complete, 2, "{j:?}");
        assert_eq!(j.incomplete.get("0 of 2 energy series"), Some(&1));
        assert_eq!(j.incomplete.get("1 of 2 energy series"), Some(&1));
        assert_eq!(j.incomplete.get("HTTP 503"), Some(&1));
        assert!((j.gap - 4.0).abs() < 1e-6);
        assert!(j.pass(UPGRADE_GAP), "{j:?}");
        // The same answers where the broker's status says it is down.
        let j = judge(
            &parse_log(&text.replace("amd_hsmp_up 1", "amd_hsmp_up 0")).unwrap(),
            2,
            (1000.5, 1003.5),
        );
        assert_eq!(j.complete, 0);
        assert!(!j.pass(UPGRADE_GAP));
    }

    #[test]
    fn a_log_that_does_not_span_the_upgrade_fails() {
        // Never complete again after the upgrade.
        let text = upgrade_log((5.0, 100.0), 700.0);
        let j = judge(&parse_log(&text).unwrap(), 2, UPGRADE);
        assert!(j.problems.iter().any(|p| p.contains("after the upgrade")), "{j:?}");
        assert!(!j.pass(UPGRADE_GAP));
        // The scraper started after the upgrade.
        let j = judge(&parse_log(&upgrade_log((5.0, 6.0), 700.0)).unwrap(), 2, (990.0, 991.0));
        assert!(j.problems.iter().any(|p| p.contains("before the upgrade")), "{j:?}");
    }

    /// A counter that is absent for a while is compared with its last value when it returns,
    /// against the start time of that scrape.
    #[test]
    fn a_counter_back_after_an_absence_is_judged_against_its_last_value() {
        let log = |start_after: f64| {
            let mut text = String::new();
            text.push_str(&scrape(0.0, 200, 2, 5.0, 500.0, 0.0));
            text.push_str(&scrape(1.0, 200, 0, 0.0, 500.0, 0.0));
            text.push_str(&scrape(2.0, 200, 2, 4.0, start_after, 0.0));
            judge(&parse_log(&text).unwrap(), 2, (1000.5, 1001.5))
        };
        let j = log(500.0);
        assert_eq!((j.decreases.len(), j.resets.len()), (2, 0), "{j:?}");
        let j = log(501.0);
        assert_eq!((j.decreases.len(), j.resets.len()), (0, 2), "{j:?}");
    }

    /// The documents state the bound and the scraper's period as the code has them.
    #[test]
    fn the_documents_state_the_bound_of_the_code() {
        let stated = format!("(`UPGRADE_GAP`, {} s", UPGRADE_GAP.as_secs());
        for doc in ["docs/testing.md", "docs/install.md"] {
            let text = crate::vm::repo_file(doc).unwrap();
            let mentions = text.matches("`UPGRADE_GAP`").count();
            assert!(
                mentions > 0 && text.matches(&stated).count() == mentions,
                "{doc} names `UPGRADE_GAP` {mentions} times, as {stated:?} {} times",
                text.matches(&stated).count()
            );
        }
        let testing = crate::vm::repo_file("docs/testing.md").unwrap();
        assert!(testing.contains(&format!("every {SCRAPE_PERIOD} s plus")));
    }
}
