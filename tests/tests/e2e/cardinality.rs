//! The series figures the documentation states, generated from a live scrape of each simulator
//! profile's fixture machine: docs/install.md's "Cardinality at fleet scale" (two generated
//! blocks) and the chart's `serviceMonitor.sampleLimit` comment in values.yaml.
//!
//! `UPDATE_GOLDEN=1 cargo test -p amd-hsmp-e2e cardinality -- --include-ignored` rewrites them
//! from the scrape (then `UPDATE_GOLDEN=1 cargo test -p xtask chart_readme` carries the comment
//! into the chart's README); otherwise the test fails with the stale lines. The words are
//! [`FAMILIES`]'s and the renderers'; every number comes from a scrape or from the mixin's
//! recording rules applied to one.

use amd_hsmp_e2e::golden;
use amd_hsmp_e2e::scenario::{self, Rig};
use amd_hsmp_sim::{MachineSpec, Profile};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// The series Prometheus adds to every target: `up`, `scrape_duration_seconds`,
/// `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`.
const PER_TARGET: usize = 5;

/// Those of [`PER_TARGET`] named `scrape_*`.
const PER_TARGET_SCRAPE: usize = 4;

/// The fleet the figures are given for.
const FLEET: usize = 10_000;

/// The scrape intervals the figures are given for, in seconds: the first in the table.
const INTERVALS: [usize; 2] = [30, 15];

/// The command that regenerates what this file checks.
const REFRESH: &str = "UPDATE_GOLDEN=1 cargo test -p amd-hsmp-e2e cardinality -- --include-ignored";

/// How the documentation speaks of a family a scrape may carry.
struct Family {
    /// The family's name; one ending in `*` is every family of that prefix.
    name: &'static str,
    /// Its name in the prose ("2 PROCHOT").
    word: &'static str,
    /// When a node exports it; empty: always.
    when: &'static str,
}

/// Every family a default, an MSR-fallback or a `--collector.core-frequency-limit` scrape of a
/// fixture carries, in the order the documentation lists them. A family scraped but missing
/// here fails the test: the documentation must say what it is.
const FAMILIES: &[Family] = &[
    Family {
        name: "amd_hsmp_core_boost_limit_hertz",
        word: "boost limits",
        when: "with a usable `/dev/hsmp`",
    },
    Family {
        name: "amd_hsmp_core_energy_joules_total",
        word: "core energy",
        when: "with HSMP RAPL, i.e. Turin, the perf source or the MSR fallback",
    },
    Family {
        name: "amd_hsmp_core_frequency_limit_hertz",
        word: "core frequency limits",
        when: "with `--collector.core-frequency-limit` and HSMP protocol 5 or later",
    },
    Family { name: "amd_hsmp_prochot_active", word: "PROCHOT", when: "with a usable `/dev/hsmp`" },
    Family {
        name: "amd_hsmp_socket_frequency_limit_hertz",
        word: "frequency limits",
        when: "firmware answering `GET_SOCKET_FREQ_LIMIT`: HSMP protocol 5 or later",
    },
    Family {
        name: "amd_hsmp_socket_frequency_limit_reason",
        word: "limiter reasons",
        when: "as the frequency limits, one per limiter",
    },
    Family {
        name: "amd_hsmp_package_energy_joules_total",
        word: "package energy",
        when: "firmware answering `GET_RAPL_PACKAGE_COUNTER`: Turin",
    },
    Family { name: "amd_hsmp_up", word: "", when: "" },
    Family { name: "amd_hsmp_protocol_version", word: "", when: "with HSMP" },
    Family { name: "amd_hsmp_broker_up", word: "", when: "" },
    Family { name: "amd_hsmp_scrape_duration_seconds", word: "", when: "" },
    Family { name: "amd_hsmp_scrape_errors_total", word: "", when: "" },
    Family { name: "amd_hsmp_build_info", word: "", when: "" },
    Family { name: "process_*", word: "", when: "" },
    Family { name: "amd_hsmp_core_energy_source_info", word: "", when: "when energy is exported" },
];

/// The entry of [`FAMILIES`] that describes `name`.
fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| match f.name.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => f.name == name,
    })
}

/// One scrape: every sample's family and labels, in the exposition's order.
#[derive(Debug, Clone)]
struct Samples(Vec<(String, BTreeMap<String, String>)>);

impl Samples {
    /// The samples of an exposition (either text format).
    fn parse(text: &str) -> Samples {
        Samples(text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(sample).collect())
    }

    fn total(&self) -> usize {
        self.0.len()
    }

    /// The samples of `family` (or, for a `*` name, of every family of the prefix).
    fn count(&self, name: &str) -> usize {
        self.0.iter().filter(|(n, _)| family(n).is_some_and(|f| f.name == name)).count()
    }

    /// The samples with a `core` label.
    fn per_core(&self) -> usize {
        self.0.iter().filter(|(_, l)| l.contains_key("core")).count()
    }

    /// The samples with a `socket` label and no `core` label.
    fn per_socket(&self) -> usize {
        self.0.iter().filter(|(_, l)| l.contains_key("socket") && !l.contains_key("core")).count()
    }

    /// The samples with neither a `core` nor a `socket` label.
    fn meta(&self) -> usize {
        self.total() - self.per_core() - self.per_socket()
    }

    fn has(&self, name: &str) -> bool {
        self.count(name) > 0
    }

    /// Whether the node has HSMP: it reports the protocol's version.
    fn up(&self) -> bool {
        self.has("amd_hsmp_up") && self.has("amd_hsmp_protocol_version")
    }

    fn has_energy(&self) -> bool {
        self.has("amd_hsmp_core_energy_joules_total")
    }

    /// The distinct values of `labels` among the samples that carry all of them.
    fn distinct(&self, labels: &[&str]) -> usize {
        let sets: BTreeSet<Vec<&String>> = self
            .0
            .iter()
            .filter_map(|(_, l)| labels.iter().map(|k| l.get(*k)).collect::<Option<Vec<_>>>())
            .collect();
        sets.len()
    }

    /// Every label name any sample carries.
    fn label_names(&self) -> BTreeSet<&str> {
        self.0.iter().flat_map(|(_, l)| l.keys().map(String::as_str)).collect()
    }
}

/// `name{a="x",b="y"} value` → (`name`, {a: x, b: y}).
fn sample(line: &str) -> (String, BTreeMap<String, String>) {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = line[..end].to_owned();
    let mut labels = BTreeMap::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        while let Some(eq) = rest.find("=\"") {
            let key = rest[..eq].trim_start_matches(',').to_owned();
            let mut value = String::new();
            let mut chars = rest[eq + 2..].char_indices();
            let mut close = rest.len() - eq - 2;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        close = i;
                        break;
                    }
                    c => value.push(c),
                }
            }
            labels.insert(key, value);
            rest = &rest[eq + 2 + close + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    (name, labels)
}

/// A profile's machine and its scrapes.
#[derive(Debug, Clone)]
struct Scraped {
    name: &'static str,
    spec: MachineSpec,
    /// The default flags.
    default: Samples,
    /// With the MSR fallback, for a part whose firmware lacks the HSMP RAPL messages.
    msr: Option<Samples>,
    /// With `--collector.core-frequency-limit`, for the largest part.
    core_frequency: Option<Samples>,
}

impl Scraped {
    fn cores(&self) -> usize {
        self.spec.sockets as usize * self.spec.core_ids.len()
    }

    fn series(&self) -> usize {
        self.default.total() + PER_TARGET
    }

    fn msr_series(&self) -> Option<usize> {
        self.msr.as_ref().map(|m| m.total() + PER_TARGET)
    }
}

/// `AMD EPYC 9965 192-Core Processor` on two sockets → `2 × EPYC 9965`.
fn part(spec: &MachineSpec) -> String {
    let name = spec.model_name.trim_start_matches("AMD ");
    let name = name.strip_suffix(" Processor").unwrap_or(name);
    let name = name.rsplit_once(' ').filter(|(_, n)| n.ends_with("-Core")).map_or(name, |(m, _)| m);
    if spec.sockets > 1 { format!("{} × {name}", spec.sockets) } else { name.to_owned() }
}

/// `x` to three significant figures: `51,700`, `1.55 M` (`unit` after millions).
fn approx(x: f64, unit: &str) -> String {
    if x < 1000.0 {
        return golden::thousands(x.round() as u64);
    }
    let digits = x.log10().floor() as i32 + 1;
    let step = 10f64.powi(digits - 3);
    let r = (x / step).round() * step;
    if r >= 1e6 {
        let m = r / 1e6;
        let decimals = (3 - (m.log10().floor() as i32 + 1)).max(0) as usize;
        format!("{m:.decimals$}{unit}")
    } else {
        golden::thousands(r as u64)
    }
}

/// Series per `FLEET` nodes.
fn fleet(series: usize) -> f64 {
    (series * FLEET) as f64
}

/// Samples a second of `FLEET` nodes scraped every `interval` seconds.
fn rate(series: usize, interval: usize) -> f64 {
    fleet(series) / interval as f64
}

/// `a`, `a and b`, `a, b and c`.
fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// `text` in lines of at most `width` columns, each after `prefix` (`first` on the first).
fn wrap(text: &str, first: &str, prefix: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line = prefix.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The profile with the most series: the one the prose and the chart speak of.
fn largest(profiles: &[Scraped]) -> &Scraped {
    profiles.iter().max_by_key(|p| p.series()).expect("at least one profile")
}

/// How many of a family a node has, in words: `cores`, `sockets`, a multiple (`k × sockets`), or
/// a count.
fn per(samples: &Samples, name: &str, p: &Scraped) -> String {
    let n = samples.count(name);
    let with = |label: &str| samples.0.iter().any(|(f, l)| f == name && l.contains_key(label));
    let (unit, of) = if with("core") {
        ("cores", p.cores())
    } else if with("socket") {
        ("sockets", p.spec.sockets as usize)
    } else {
        return n.to_string();
    };
    if !n.is_multiple_of(of) {
        return n.to_string();
    }
    match n / of {
        1 => unit.to_owned(),
        k => format!("{k} × {unit}"),
    }
}

/// docs/install.md's first generated block: what a node exports, the table of profiles, and
/// the figures of the largest in words.
fn render_install(profiles: &[Scraped]) -> String {
    let big = largest(profiles);
    let mut every: Vec<&Samples> = Vec::new();
    for p in profiles {
        every.push(&p.default);
        every.extend(p.msr.as_ref());
        every.extend(p.core_frequency.as_ref());
    }
    let mut out = String::from("| per node | series |\n|---|---|\n");
    let families = big.core_frequency.as_ref().unwrap_or(&big.default);
    for f in FAMILIES.iter().filter(|f| !f.word.is_empty()) {
        if families.has(f.name) {
            let _ = writeln!(out, "| `{}` | {} ({}) |", f.name, per(families, f.name, big), f.when);
        }
    }
    // The meta series: by whether the node has HSMP and energy.
    let mut meta: BTreeMap<(bool, bool), usize> = BTreeMap::new();
    for s in &every {
        meta.insert((s.up(), s.has_energy()), s.meta());
    }
    let names: Vec<String> = FAMILIES
        .iter()
        .filter(|f| f.word.is_empty())
        .map(|f| {
            let n = big.default.count(f.name);
            let mut s = format!("`{}`", f.name);
            if n > 1 {
                let _ = write!(s, " ({n})");
            }
            if !f.when.is_empty() {
                let _ = write!(s, " {}", f.when);
            }
            s
        })
        .collect();
    let counts = |hsmp: bool| {
        let with = meta.get(&(hsmp, true)).map(|n| format!("{n} with energy"));
        let without = meta.get(&(hsmp, false)).map(|n| format!("{n} without"));
        [with, without].into_iter().flatten().collect::<Vec<_>>().join(", ")
    };
    let _ = writeln!(
        out,
        "| meta: {} | {} (without HSMP: {}) |",
        list(&names),
        counts(true),
        counts(false)
    );
    let _ = writeln!(
        out,
        "| added by Prometheus per target: `up`, `scrape_duration_seconds`, \
         `scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, \
         `scrape_series_added` | {PER_TARGET} |"
    );
    out.push('\n');
    out.push_str(&wrap(
        "For the parts of the simulator's profiles, from a live scrape of each fixture machine by \
         the end-to-end suite (the real broker and exporter on the fake device; \"with MSR\" is \
         with the MSR fallback, for the parts without HSMP RAPL). A scrape's samples are what a \
         Prometheus `sample_limit` counts; the series per node add Prometheus' own five.",
        "",
        "",
        100,
    ));
    out.push('\n');
    let [slow, fast] = INTERVALS;
    let _ = writeln!(
        out,
        "| profile | part | sockets × cores | per-core series | samples a scrape | series per \
         node | per {} nodes | samples/s per {} nodes at {slow} s |",
        golden::thousands(FLEET as u64),
        golden::thousands(FLEET as u64)
    );
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    let mut rows: Vec<&Scraped> = profiles.iter().collect();
    rows.sort_by_key(|p| (p.series(), p.name));
    for p in rows {
        let msr = |s: String| match &p.msr {
            Some(_) => format!("{s} with MSR"),
            None => String::new(),
        };
        let both = |default: String, with: Option<String>| match with {
            Some(w) => format!("{default} ({w})"),
            None => default,
        };
        let per_core = both(
            p.default.per_core().to_string(),
            p.msr.as_ref().map(|m| msr(m.per_core().to_string())),
        );
        let samples = both(
            golden::thousands(p.default.total() as u64),
            p.msr.as_ref().map(|m| msr(golden::thousands(m.total() as u64))),
        );
        let series = both(
            golden::thousands(p.series() as u64),
            p.msr_series().map(|n| msr(golden::thousands(n as u64))),
        );
        let nodes =
            both(approx(fleet(p.series()), " M"), p.msr_series().map(|n| approx(fleet(n), " M")));
        let per_s = both(
            approx(rate(p.series(), slow), " M"),
            p.msr_series().map(|n| approx(rate(n, slow), " M")),
        );
        let _ = writeln!(
            out,
            "| `{}` | {} | {} × {} | {per_core} | {samples} | {series} | {nodes} | {per_s} |",
            p.name,
            part(&p.spec),
            p.spec.sockets,
            p.spec.core_ids.len(),
        );
    }
    out.push('\n');

    // The largest part in words.
    let d = &big.default;
    let name = golden::machine_name(big.name);
    let per_core_families = FAMILIES
        .iter()
        .filter(|f| !f.word.is_empty() && per(d, f.name, big) == "cores" && d.has(f.name));
    let per_core_words: Vec<String> = per_core_families.map(|f| f.word.to_owned()).collect();
    let mut terms = vec![format!(
        "{} × {} per-core series ({})",
        per_core_words.len(),
        big.cores(),
        list(&per_core_words)
    )];
    for f in FAMILIES.iter().filter(|f| !f.word.is_empty()) {
        if d.has(f.name) && per(d, f.name, big) != "cores" {
            terms.push(format!("{} {}", d.count(f.name), f.word));
        }
    }
    terms.push(format!("{} meta", d.meta()));
    let no_limit: Vec<String> = {
        let mut v: Vec<&Scraped> = profiles
            .iter()
            .filter(|p| !p.default.has("amd_hsmp_socket_frequency_limit_hertz"))
            .collect();
        v.sort_by_key(|p| (p.series(), p.name));
        v.into_iter().map(|p| golden::machine_name(p.name)).collect()
    };
    let mut words = format!(
        "In words: a {name} node is {} = {} samples a scrape from the exporter, {} series with \
         Prometheus' own; {} of them are {} active series and, scraped every {slow} s, {} samples \
         a second ({} at {fast} s). {} % of that is the per-core series.",
        terms.join(" + "),
        golden::thousands(d.total() as u64),
        golden::thousands(big.series() as u64),
        golden::thousands(FLEET as u64),
        approx(fleet(big.series()), " million"),
        approx(rate(big.series(), slow), " million"),
        approx(rate(big.series(), fast), " million"),
        (100.0 * d.per_core() as f64 / big.series() as f64).round(),
    );
    if !no_limit.is_empty() {
        let _ = write!(
            words,
            " {} {} no frequency-limit series (no HSMP, or firmware before protocol 5).",
            list(&no_limit),
            if no_limit.len() == 1 { "has" } else { "have" }
        );
    }
    if let Some(f) = &big.core_frequency {
        let added = f.total() - d.total();
        let each =
            if added == big.cores() { "one series per core: ".to_owned() } else { String::new() };
        let _ = write!(
            words,
            " `--collector.core-frequency-limit` adds {each}{} on a {name}, {} samples a scrape.",
            golden::thousands(added as u64),
            golden::thousands(f.total() as u64),
        );
    }
    out.push_str(&wrap(&words, "", "", 100));
    out
}

/// A recording rule of the mixin: its group and the series it records.
struct Rule {
    group: String,
    record: String,
}

/// The recording rules of `mixin/prometheus_rules.yaml` (generated, one `- name:` per group and
/// one `record:` per rule).
fn rules(yaml: &str) -> Vec<Rule> {
    let mut group = String::new();
    let mut out = Vec::new();
    for line in yaml.lines() {
        let line = line.trim_start();
        let unquote = |v: &str| v.trim().trim_matches('"').to_owned();
        if let Some(name) = line.strip_prefix("- name:") {
            group = unquote(name);
        } else if let Some(record) = line.strip_prefix("record:") {
            out.push(Rule { group: group.clone(), record: unquote(record) });
        }
    }
    out
}

/// The labels a rule's series carry besides `instance` and `job`, from its level
/// (`instance_socket_core:…` → socket, core), if the scrape has every one of them; `None` for a
/// level made of labels a default scrape has not (the owner rules, with
/// `--collector.core-owner`).
fn level<'a>(record: &str, labels: &BTreeSet<&'a str>) -> Option<Vec<&'a str>> {
    let mut rest = record.split(':').next()?.strip_prefix("instance")?;
    let mut out = Vec::new();
    while let Some(tail) = rest.strip_prefix('_') {
        let label = labels
            .iter()
            .filter(|l| {
                tail.starts_with(**l) && matches!(tail.as_bytes().get(l.len()), None | Some(b'_'))
            })
            .max_by_key(|l| l.len())?;
        out.push(*label);
        rest = &tail[label.len()..];
    }
    rest.is_empty().then_some(out)
}

/// Pairs of recording rules of which a series' labels have exactly one, with when the second
/// records instead of the first: the package's remainder beside its cores where it is not below
/// zero, else by how much the cores exceed the package (`mixin/rules/workloads.libsonnet`). The
/// second is counted with the first.
const EITHER_OR: [(&str, &str, &str); 1] = [(
    "instance_socket:amd_hsmp_package_minus_cores_power_watts:rate5m",
    "instance_socket:amd_hsmp_cores_above_package_power_watts:rate5m",
    "where the firmware reports the package below its cores",
)];

/// docs/install.md's second generated block: what the recording-rule cut keeps of the largest
/// part, and what the rules add.
fn render_cut(profiles: &[Scraped], rules: &[Rule]) -> String {
    let big = largest(profiles);
    let d = &big.default;
    let name = golden::machine_name(big.name);
    let labels = d.label_names();
    // Each rule's series per node, by level; the per-core level stays local.
    let mut by_level: BTreeMap<Vec<&str>, (Vec<String>, usize)> = BTreeMap::new();
    let mut recorded = 0;
    let mut owner_groups = BTreeSet::new();
    let recorded_names: BTreeSet<&str> = rules.iter().map(|r| r.record.as_str()).collect();
    for rule in rules {
        match level(&rule.record, &labels) {
            Some(level) => {
                let entry = by_level.entry(level.clone()).or_default();
                let pair = EITHER_OR
                    .iter()
                    .find(|(either, or, _)| *or == rule.record && recorded_names.contains(either));
                if let Some((either, or, when)) = pair {
                    // Named beside its pair, counted with it.
                    entry.0.push(format!("`{or}` ({when}, instead of `{either}`)"));
                    continue;
                }
                let n = d.distinct(&level);
                recorded += n;
                entry.0.push(format!("`{}`", rule.record));
                entry.1 += n;
            }
            None => {
                owner_groups.insert(rule.group.as_str());
            }
        }
    }
    let core_level = vec!["socket", "core"];
    let per_core_recorded = by_level.get(&core_level).map_or(0, |(_, n)| *n);
    let mut out = format!("| series | per node ({name}) |\n|---|---|\n");
    let mut kept = 0;
    // By level: the node's, then the socket's, then finer ones.
    let levels = by_level.iter().filter(|(l, _)| **l != core_level);
    for (level, (records, n)) in levels {
        let what = if level.is_empty() {
            "per node".to_owned()
        } else {
            format!("per {}", level.join(" and "))
        };
        let _ = writeln!(out, "| the recording rules {what}: {} | {n} |", records.join(", "));
        kept += n;
    }
    let socket_families: Vec<String> = FAMILIES
        .iter()
        .filter(|f| {
            d.0.iter()
                .any(|(n, l)| n == f.name && l.contains_key("socket") && !l.contains_key("core"))
        })
        .map(|f| format!("`{}`", f.name))
        .collect();
    let _ = writeln!(
        out,
        "| the per-socket families: {} | {} |",
        list(&socket_families),
        d.per_socket()
    );
    kept += d.per_socket();
    let _ = writeln!(
        out,
        "| meta and per-target series | {} + {PER_TARGET} = {} |",
        d.meta(),
        d.meta() + PER_TARGET
    );
    kept += d.meta() + PER_TARGET;
    let local = big.series() + recorded;
    let _ = writeln!(
        out,
        "| **total** | **{}**, instead of {} ({} scraped, {} recorded) |",
        golden::thousands(kept as u64),
        golden::thousands(local as u64),
        golden::thousands(big.series() as u64),
        golden::thousands(recorded as u64)
    );
    out.push('\n');
    let [slow, _] = INTERVALS;
    let lean = kept - d.count("process_*") - PER_TARGET_SCRAPE;
    out.push_str(&wrap(
        &format!(
            "For {} {name} nodes that is {} series instead of {} ({} times fewer), and {} samples \
             a second at {slow} s. Drop the `process_*` series and Prometheus' `scrape_*` series \
             too and it is {lean} per node.",
            golden::thousands(FLEET as u64),
            approx(fleet(kept), " million"),
            approx(fleet(local), " million"),
            (local as f64 / kept as f64).round(),
            approx(rate(kept, slow), " million"),
        ),
        "",
        "",
        100,
    ));
    out.push('\n');
    let owner = if owner_groups.is_empty() {
        String::new()
    } else {
        let groups: Vec<String> = owner_groups.iter().map(|g| format!("`{g}`")).collect();
        format!("; the groups {} add theirs with `--collector.core-owner`", list(&groups))
    };
    out.push_str(&wrap(
        &format!(
            "The Prometheus that evaluates the rules stores their output besides what it scrapes: \
             {} series per node on a {name}, {} of them the per-core power that the node \
             dashboard's heatmap reads{owner}.",
            golden::thousands(recorded as u64),
            golden::thousands(per_core_recorded as u64),
        ),
        "",
        "",
        100,
    ));
    out
}

/// The comment of `serviceMonitor.sampleLimit` in values.yaml, `# -- ` lines at two spaces.
fn render_sample_limit(profiles: &[Scraped]) -> String {
    let big = largest(profiles);
    let mut text = format!(
        "The most samples a scrape may carry before it fails (0: no limit): a {} node exports {} \
         a scrape by default",
        golden::machine_name(big.name),
        golden::thousands(big.default.total() as u64)
    );
    if let Some(f) = &big.core_frequency {
        let _ = write!(
            text,
            " ({} with `--collector.core-frequency-limit`)",
            golden::thousands(f.total() as u64)
        );
    }
    text.push_str(", Prometheus' own five series not counted; set the limit above it.");
    wrap(&text, "  # -- ", "  # ", 100)
}

/// The begin and end markers of generated block `name` of docs/install.md.
fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:begin: generated from a live scrape of each fixture; {REFRESH} -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// `doc` with the text between block `name`'s markers replaced by `content`.
fn replace_block(doc: &str, name: &str, content: &str) -> Result<String, String> {
    let (begin, end) = markers(name);
    golden::replace_block(doc, &begin, &end, content)
}

/// values.yaml with the comment above `serviceMonitor`'s `sampleLimit:` replaced by `comment`.
fn replace_sample_limit(values: &str, comment: &str) -> Result<String, String> {
    let monitor = values.find("\nserviceMonitor:\n").ok_or("no serviceMonitor in values.yaml")?;
    let key = values[monitor..].find("\n  sampleLimit:").ok_or("no serviceMonitor.sampleLimit")?
        + monitor
        + 1;
    let from = values[..key].rfind("\n  # -- ").ok_or("no `# --` comment above sampleLimit")? + 1;
    Ok(format!("{}{comment}{}", &values[..from], &values[key..]))
}

/// Compares `file` (relative to the root) with `want`, or writes it when updating.
fn check_file(file: &str, want: &str) -> Result<(), String> {
    let refresh = format!("{REFRESH} (then UPDATE_GOLDEN=1 cargo test -p xtask chart_readme)");
    golden::check_document(file, want, &refresh)
}

/// Every generated figure checked against (or, updating, written into) the files that state
/// them.
fn check_docs(profiles: &[Scraped]) -> Vec<String> {
    let mut failures = Vec::new();
    let install = "docs/install.md";
    let values = "deploy/helm/amd-hsmp-exporter/values.yaml";
    let rules_yaml =
        std::fs::read_to_string(golden::workspace_root().join("mixin/prometheus_rules.yaml"))
            .unwrap();
    let doc = std::fs::read_to_string(golden::workspace_root().join(install)).unwrap();
    let want = replace_block(&doc, "cardinality", &render_install(profiles)).and_then(|d| {
        replace_block(&d, "cardinality-cut", &render_cut(profiles, &rules(&rules_yaml)))
    });
    match want {
        Ok(want) => failures.extend(check_file(install, &want).err()),
        Err(e) => failures.push(format!("{install}: {e}")),
    }
    let yaml = std::fs::read_to_string(golden::workspace_root().join(values)).unwrap();
    match replace_sample_limit(&yaml, &render_sample_limit(profiles)) {
        Ok(want) => failures.extend(check_file(values, &want).err()),
        Err(e) => failures.push(format!("{values}: {e}")),
    }
    failures
}

/// One complete scrape of a rig for `machine` with `broker` and `exporter` flags.
fn scrape(machine: &str, broker: &[&str], exporter: &[&str]) -> Samples {
    let quote =
        |flags: &[&str]| flags.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", ");
    let toml = format!(
        "description = \"\"\nmachine = \"{machine}\"\nbroker-flags = [{}]\nexporter-flags = [{}]\n[[scrapes]]\n",
        quote(broker),
        quote(exporter)
    );
    let mut rig = Rig::start(&scenario::parse(&toml).unwrap()).unwrap();
    let response = rig.scrape(&scenario::Scrape::default()).unwrap();
    assert_eq!(response.status, 200, "{machine}: {}\n{}", response.body, rig.logs());
    let samples = Samples::parse(&response.body);
    // A scrape that missed anything (a deadline passed, a read failed) would under-count.
    for (name, labels) in &samples.0 {
        if name == "amd_hsmp_scrape_errors_total" {
            let line = response.body.lines().find(|l| {
                l.starts_with("amd_hsmp_scrape_errors_total{")
                    && l.contains(&format!("collector=\"{}\"", labels["collector"]))
            });
            assert!(
                line.is_some_and(|l| l.ends_with(" 0")),
                "{machine} {broker:?} {exporter:?}: {line:?}"
            );
        }
        assert!(
            family(name).is_some(),
            "{machine}: family {name} is not in FAMILIES: say what it is"
        );
    }
    samples
}

/// Scrapes every simulator profile's fixture as the figures need: default flags; the MSR
/// fallback where the firmware lacks the HSMP RAPL messages; the largest part with
/// `--collector.core-frequency-limit`.
fn scrape_profiles() -> Vec<Scraped> {
    let mut profiles: Vec<Scraped> = Profile::ALL
        .into_iter()
        .map(|p| {
            let spec = p.spec();
            let msr = (!spec.rapl_messages)
                .then(|| scrape(p.name(), &["--collector.core-energy.msr-fallback"], &[]));
            Scraped {
                name: p.name(),
                default: scrape(p.name(), &[], &[]),
                msr,
                spec,
                core_frequency: None,
            }
        })
        .collect();
    let big = largest(&profiles).name;
    let p = profiles.iter_mut().find(|p| p.name == big).unwrap();
    p.core_frequency = Some(scrape(big, &[], &["--collector.core-frequency-limit"]));
    profiles
}

#[test]
#[ignore = "needs root and /dev/fuse: cargo xtask test runs it"]
fn cardinality_figures_in_the_docs_equal_a_live_scrape_of_each_fixture() {
    let profiles = scrape_profiles();
    let failures = check_docs(&profiles);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The renderers on the committed golden scrape of the Turin 2P, without a rig: every count is
/// in what they write, so a family with one series more changes a figure.
mod render {
    use super::*;

    fn turin(text: &str) -> Vec<Scraped> {
        vec![Scraped {
            name: "turin-2p",
            spec: Profile::Turin2p.spec(),
            default: Samples::parse(text),
            msr: None,
            core_frequency: None,
        }]
    }

    fn golden_turin() -> String {
        std::fs::read_to_string(golden::golden_dir().join("healthy-turin-2p.metrics")).unwrap()
    }

    /// The Turin row's samples a scrape and series per node in the install table `table`.
    fn turin_figures(table: &str) -> (usize, usize) {
        let row = table.lines().find(|l| l.starts_with("| `turin-2p` |")).unwrap();
        let cells: Vec<usize> =
            row.split('|').filter_map(|c| c.trim().replace(',', "").parse().ok()).collect();
        (cells[1], cells[2])
    }

    #[test]
    fn a_family_with_one_series_more_changes_the_figures_that_count_it() {
        let text = golden_turin();
        let extra = "amd_hsmp_prochot_active{socket=\"2\"} 0\n";
        let more = text.replacen(
            "amd_hsmp_prochot_active{socket=\"0\"}",
            &format!("{extra}amd_hsmp_prochot_active{{socket=\"0\"}}"),
            1,
        );
        let (before, after) = (turin(&text), turin(&more));
        assert_eq!(after[0].default.total(), before[0].default.total() + 1);
        let (a, b) = (render_install(&before), render_install(&after));
        // The Turin row's samples a scrape and series per node, each one more.
        let figures = turin_figures;
        let (samples, series) = figures(&a);
        assert_eq!(samples, before[0].default.total(), "{a}");
        assert_eq!(figures(&b), (samples + 1, series + 1), "{a}\n{b}");
        assert!(a.contains("+ 2 PROCHOT +") && b.contains("+ 3 PROCHOT +"), "{b}");
        assert_ne!(render_sample_limit(&before), render_sample_limit(&after));
        let rules =
            rules("groups:\n- name: \"g\"\n  rules:\n  - record: \"instance_socket:x:y\"\n");
        assert_ne!(render_cut(&before, &rules), render_cut(&after, &rules));
    }

    #[test]
    fn a_figure_edited_by_hand_is_named_in_the_failure() {
        let profiles = turin(&golden_turin());
        let block = render_install(&profiles);
        let (begin, end) = markers("cardinality");
        let doc = format!("# x\n{begin}\n{block}{end}\n");
        assert_eq!(replace_block(&doc, "cardinality", &block).unwrap(), doc);
        let series = turin_figures(&block).1;
        let by_hand = format!("| {} |", series - 1);
        let edited = doc.replace(&format!("| {series} |"), &by_hand);
        let diff = golden::diff(&edited, &replace_block(&edited, "cardinality", &block).unwrap());
        assert!(diff.contains("-| `turin-2p` |") && diff.contains(&by_hand), "{diff}");
    }

    #[test]
    fn figures_round_to_three_significant_figures() {
        assert_eq!(approx(8_180_000.0, " M"), "8.18 M");
        assert_eq!(approx(1_000_000.0, " M"), "1.00 M");
        assert_eq!(approx(12_360_000.0, " million"), "12.4 million");
        assert_eq!(approx(51_666.7, " M"), "51,700");
        assert_eq!(approx(8_000.0, " M"), "8,000");
        assert_eq!(approx(545_333.3, " M"), "545,000");
        assert_eq!(golden::thousands(1_197), "1,197");
        assert_eq!(part(&Profile::Turin2p.spec()), "2 × EPYC 9965");
        assert_eq!(golden::machine_name("turin-2p"), "Turin 2P");
    }

    #[test]
    fn labels_with_escapes_and_levels_of_rules() {
        let (name, labels) = sample(r#"amd_hsmp_build_info{version="a\"b,c",x="y"} 1"#);
        assert_eq!(name, "amd_hsmp_build_info");
        assert_eq!(labels["version"], "a\"b,c");
        assert_eq!(labels["x"], "y");
        let known: BTreeSet<&str> = ["socket", "core", "reason"].into();
        assert_eq!(level("instance_socket_core:a:b", &known), Some(vec!["socket", "core"]));
        assert_eq!(level("instance:a:b", &known), Some(vec![]));
        assert_eq!(level("instance_slurm_job:a:b", &known), None);
    }

    #[test]
    fn the_sample_limit_comment_replaces_only_its_own() {
        let values = "podMonitor:\n  # -- other\n  sampleLimit: 0\nserviceMonitor:\n  x: 1\n  # -- old\n  # text\n  sampleLimit: 0\n";
        let out = replace_sample_limit(values, "  # -- new\n").unwrap();
        assert_eq!(
            out,
            "podMonitor:\n  # -- other\n  sampleLimit: 0\nserviceMonitor:\n  x: 1\n  # -- new\n  sampleLimit: 0\n"
        );
    }
}
