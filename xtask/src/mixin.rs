//! `cargo xtask mixin`: checks of the monitoring mixin in `mixin/`. The generated rule files and
//! dashboards equal what jsonnet makes of the source; `promtool check rules` and `promtool test
//! rules` pass; every alert has a test in which it fires and one in which it stays quiet, and a
//! runbook section; every recording rule is tested; the dashboards have the fields Grafana needs,
//! unique panel ids, and queries that parse (checked by promtool) and use only metrics that
//! `docs/metrics.md` documents, that the recording rules make, that Prometheus adds itself, or
//! node_exporter's that a join reads; no query variable reads a single family a target may lack;
//! the fleet dashboard made with `showMultiCluster` filters every query by its `cluster`; both
//! dashboards load into grafana-foundation-sdk's typed model ([`GRAFANA_MODEL`]) and pass
//! grafana/dashboard-linter's rules, with the exclusions of `mixin/.lint` ([`lint`]).
//!
//! With `--live` (and in `cargo xtask test`) it also runs the mixin against a real Prometheus
//! scraping the simulated Turin 2P ([`live`]).
//!
//! The generated files are rewritten with `UPDATE_GOLDEN=1 cargo xtask mixin`, to be reviewed as
//! a diff.

#[cfg(test)]
mod epilog;
mod lint;
mod live;

use crate::workspace::stdout_of;
use anyhow::{Context, Result, bail, ensure};
use promql_parser::label::{METRIC_NAME, MatchOp};
use promql_parser::parser::{Expr, VectorSelector};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The rule files: the jsonnet file that renders one, the file it generates.
const RULE_FILES: [(&str, &str); 2] =
    [("rules.jsonnet", "prometheus_rules.yaml"), ("alerts.jsonnet", "prometheus_alerts.yaml")];
/// Jsonnet source of the dashboards (an object: file name to dashboard) and their directory.
const DASHBOARDS_SOURCE: &str = "dashboards.jsonnet";
const DASHBOARDS_OUT: &str = "dashboards_out";
/// The promtool unit tests, in `mixin/`.
const RULES_TEST: &str = "tests/rules_test.yaml";
const ALERTS_TEST: &str = "tests/alerts_test.yaml";
const RUNBOOK: &str = "runbook.md";

/// Series Prometheus makes itself: per target (`up`, `scrape_*`) and for alerts (`ALERTS`).
const PROMETHEUS_SERIES: &[&str] = &[
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "ALERTS",
    "ALERTS_FOR_STATE",
];

/// Series of other exporters that recording rules join, each named in `docs/metrics.md`
/// ("Energy per workload"): kube-state-metrics' pod and container names, node_exporter's
/// package energy.
const JOINED_SERIES: &[&str] =
    &["kube_pod_info", "kube_pod_container_info", "node_rapl_package_joules_total"];
/// node_exporter's series the dashboards join (on `nodeExporterJoinLabel`).
const NODE_EXPORTER_SERIES: &[&str] = &["node_uname_info"];

/// Values of the Grafana variables: (name, value).
type Values<'a> = &'a [(&'a str, &'a str)];

/// Values that stand in for the Grafana variables when a dashboard's queries are parsed.
const VARIABLE_VALUES: Values<'static> = &[
    ("__rate_interval", "5m"),
    ("__interval", "1m"),
    ("__range", "1h"),
    ("job", "amd_hsmp"),
    ("instance", "node-1:10054"),
    ("socket", "0"),
    ("cluster", "cluster-1"),
];

/// Runs every mixin check, printing what each found; with `live`, also the live check on the
/// binaries `cargo xtask demo` builds.
pub fn check(root: &Path, live: bool) -> Result<()> {
    let missing: Vec<&str> = ["jsonnet", "promtool", "prometheus"]
        .into_iter()
        .filter(|c| Command::new(c).arg("--version").output().is_err())
        .collect();
    ensure!(
        missing.is_empty(),
        "missing for the mixin checks: {} (run `cargo xtask deps`, as root)",
        missing.join(" ")
    );
    let dir = root.join("mixin");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let work = target.join("mixin-check");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("cannot empty {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let started = Instant::now();

    step("generated files", || generated_files(&dir, &work))?;
    step("promtool check rules", || {
        let files: Vec<&str> = RULE_FILES.iter().map(|(_, out)| *out).collect();
        promtool(&dir, "check", &files).map(|_| format!("{} files", files.len()))
    })?;
    step("promtool test rules", || {
        promtool(&dir, "test", &[RULES_TEST, ALERTS_TEST]).map(|_| "2 test files pass".into())
    })?;

    let alerts = rules_of(&eval_json(&dir, "(import 'mixin.libsonnet').prometheusAlerts")?)?;
    let records = rules_of(&eval_json(&dir, "(import 'mixin.libsonnet').prometheusRules")?)?;
    let mut known = documented_metrics(&read(&root.join("docs/metrics.md"))?)?;
    known.extend(records.iter().filter_map(|r| r["record"].as_str().map(str::to_owned)));
    known.extend(PROMETHEUS_SERIES.iter().map(|s| s.to_string()));
    known.extend(NODE_EXPORTER_SERIES.iter().map(|s| s.to_string()));

    step("alerts", || {
        let tests = alert_tests(&read(&dir.join(ALERTS_TEST))?);
        let runbook = read(&dir.join(RUNBOOK))?;
        check_alerts(&alerts, &tests, &runbook)?;
        Ok(format!("{} alerts, each tested firing and quiet, each with a runbook", alerts.len()))
    })?;
    step("recording rules", || {
        check_records(&records, &read(&dir.join(RULES_TEST))?)?;
        Ok(format!("{} rules, each tested", records.len()))
    })?;
    step("rule metrics", || {
        let exprs: Vec<String> = alerts
            .iter()
            .chain(&records)
            .filter_map(|r| r["expr"].as_str().map(str::to_owned))
            .collect();
        let mut known = known.clone();
        known.extend(JOINED_SERIES.iter().map(|s| s.to_string()));
        unknown_metrics("the rules", &exprs, &known)?;
        Ok(format!("{} expressions use only known metrics", exprs.len()))
    })?;
    step("dashboards", || dashboards(&dir, &work, &known))?;
    step("template variables", || {
        let always = always_present(&read(&root.join("docs/metrics.md"))?)?;
        variables_need_no_single_option(&load_dashboards(&dir)?, &records, &always)
    })?;
    step("fleet dashboard with showMultiCluster", || fleet_filters_by_cluster(&dir))?;
    step("dashboard-linter rules", || {
        let exclusions = lint::parse_exclusions(&read(&dir.join(lint::LINT_FILE))?)
            .with_context(|| format!("in mixin/{}", lint::LINT_FILE))?;
        lint::check(&load_dashboards(&dir)?, &exclusions)
    })?;
    step("dashboards in Grafana's typed model", || typed_model(&dir, &work))?;
    step("Prometheus configuration in the docs", || {
        let mut checked = 0;
        for doc in ["docs/install.md", "mixin/README.md"] {
            for (n, snippet) in config_snippets(&read(&root.join(doc))?).into_iter().enumerate() {
                let file = work.join(format!("{}-{n}.yml", doc.replace('/', "-")));
                fs::write(&file, snippet)?;
                stdout_of(Command::new("promtool").arg("check").arg("config").arg(&file))
                    .with_context(|| format!("a Prometheus configuration in {doc}"))?;
                checked += 1;
            }
        }
        Ok(format!("{checked} snippets pass promtool check config"))
    })?;
    if live {
        let bin = crate::demo::build()?;
        step("live, against the simulated Turin 2P", || live::check(&dir, &work, &bin))?;
    }
    println!("mixin: all checks passed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs one named check and prints its summary and duration.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    let started = Instant::now();
    let summary = f().with_context(|| format!("mixin check failed: {name}"))?;
    println!("mixin: {name}: {summary} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Generated files

/// Compares (or, with `UPDATE_GOLDEN=1`, rewrites) every generated file with what jsonnet makes of
/// the source now; a dashboard file without a source is an error too (removed when rewriting). The rule files are what
/// `jsonnet -S` writes of their sources, byte for byte; the three jsonnet runs go in parallel (its
/// `std.manifestYamlDoc` takes jsonnet 0.18 seconds).
fn generated_files(dir: &Path, work: &Path) -> Result<String> {
    let rendered = work.join(DASHBOARDS_OUT);
    fs::create_dir_all(&rendered)?;
    let mut jobs = Vec::new();
    for (source, out) in RULE_FILES {
        let mut rules = Command::new("jsonnet");
        rules.arg("-S").arg(source).current_dir(dir);
        jobs.push((Some(out), rules));
    }
    let mut dashboards = Command::new("jsonnet");
    dashboards.arg("-m").arg(&rendered).arg(DASHBOARDS_SOURCE).current_dir(dir);
    jobs.push((None, dashboards));
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for (out, stdout) in run_parallel(jobs)? {
        if let Some(out) = out {
            files.insert(out.to_owned(), stdout);
        }
    }
    for entry in fs::read_dir(&rendered)? {
        let entry = entry?;
        let name = format!("{DASHBOARDS_OUT}/{}", entry.file_name().to_string_lossy());
        files.insert(name, read(&entry.path())?);
    }
    let removed = crate::golden::expect_files(dir, &files, &[DASHBOARDS_OUT]).context(
        "mixin/ files out of date with their jsonnet source; regenerate with UPDATE_GOLDEN=1 \
         cargo xtask mixin and review the diff",
    )?;
    if crate::golden::updating() {
        return Ok(format!("rewrote {} files, removed {removed}", files.len()));
    }
    Ok(format!("{} files equal their jsonnet source", files.len()))
}

/// Evaluates a jsonnet expression in `dir` and parses the JSON it prints.
pub(crate) fn eval_json(dir: &Path, expr: &str) -> Result<Value> {
    let out = stdout_of(Command::new("jsonnet").arg("-e").arg(expr).current_dir(dir))?;
    serde_json::from_str(&out).with_context(|| format!("jsonnet output of {expr} is not JSON"))
}

/// The rules of every group of a rule file's JSON form.
fn rules_of(file: &Value) -> Result<Vec<Value>> {
    let groups = file["groups"].as_array().context("no groups in the rule file")?;
    let mut rules = Vec::new();
    for group in groups {
        rules.extend(group["rules"].as_array().context("a group without rules")?.iter().cloned());
    }
    Ok(rules)
}

// ---------------------------------------------------------------------------------------------
// Alerts and recording rules

/// For each alert named in a promtool test file: whether a case expects it to fire and whether
/// one expects it quiet (`exp_alerts: []`). Reads the file's lines: each `alertname:` is followed
/// by its `exp_alerts:`.
fn alert_tests(test_file: &str) -> BTreeMap<String, (bool, bool)> {
    let mut tests: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in test_file.lines().map(yaml_line) {
        if let Some(name) = line.strip_prefix("alertname:") {
            current = Some(name.trim().to_owned());
        } else if let Some(expected) = line.strip_prefix("exp_alerts:")
            && let Some(name) = current.take()
        {
            let entry = tests.entry(name).or_default();
            if expected.trim() == "[]" {
                entry.1 = true;
            } else {
                entry.0 = true;
            }
        }
    }
    tests
}

/// Every alert has a severity, a summary, a description and a runbook_url whose anchor is a
/// section of the runbook, and tests in which it fires and stays quiet; no test names an alert
/// that does not exist.
fn check_alerts(
    alerts: &[Value],
    tests: &BTreeMap<String, (bool, bool)>,
    runbook: &str,
) -> Result<()> {
    let headings: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for alert in alerts {
        let name = alert["alert"].as_str().context("an alert rule without a name")?;
        names.insert(name.to_owned());
        if alert["labels"]["severity"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("{name}: no severity label"));
        }
        for key in ["summary", "description", "runbook_url"] {
            if alert["annotations"][key].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{name}: no {key} annotation"));
            }
        }
        let anchor = alert["annotations"]["runbook_url"].as_str().and_then(|u| u.rsplit_once('#'));
        match anchor {
            Some((_, a)) if a == name.to_ascii_lowercase() && headings.contains(a) => {}
            _ => problems.push(format!(
                "{name}: runbook_url is not {RUNBOOK}#{} with a `## {name}` section",
                name.to_ascii_lowercase()
            )),
        }
        match tests.get(name) {
            Some((true, true)) => {}
            Some((fires, _)) => problems.push(format!(
                "{name}: no test in which it {}",
                if *fires { "stays quiet (exp_alerts: [])" } else { "fires" }
            )),
            None => problems.push(format!("{name}: not tested in {ALERTS_TEST}")),
        }
    }
    for name in tests.keys().filter(|t| !names.contains(*t)) {
        problems.push(format!("{ALERTS_TEST} tests {name}, which is not an alert"));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Every recording rule is the `expr:` of a case in the recording rules' test file.
fn check_records(records: &[Value], test_file: &str) -> Result<()> {
    let tested: BTreeSet<&str> = test_file
        .lines()
        .map(yaml_line)
        .filter_map(|l| l.strip_prefix("expr:"))
        .map(str::trim)
        .collect();
    let untested: Vec<&str> = records
        .iter()
        .filter_map(|r| r["record"].as_str())
        .filter(|name| !tested.contains(name))
        .collect();
    ensure!(
        untested.is_empty(),
        "recording rules not tested in {RULES_TEST}: {}",
        untested.join(", ")
    );
    Ok(())
}

/// A line of a YAML block without its indentation and list marker: `key: value`.
fn yaml_line(line: &str) -> &str {
    let line = line.trim();
    line.strip_prefix("- ").map_or(line, str::trim_start)
}

/// The family names of the table under "## Families" in `docs/metrics.md`.
fn documented_metrics(doc: &str) -> Result<BTreeSet<String>> {
    let section =
        doc.split("\n## Families").nth(1).context("docs/metrics.md has no Families section")?;
    let section = section.split("\n## ").next().unwrap_or_default();
    let names: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    ensure!(!names.is_empty(), "no families found in docs/metrics.md");
    Ok(names)
}

/// The ```yaml blocks of a document that are Prometheus configurations of their own: those that
/// start (after comments) with `scrape_configs:` or `remote_write:`. Blocks that name rule files
/// are left out: the files they name are the reader's.
fn config_snippets(doc: &str) -> Vec<String> {
    doc.split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .filter(|block| {
            let first = block.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
            first.is_some_and(|l| l == "scrape_configs:" || l == "remote_write:")
                && !block.contains("rule_files:")
        })
        .map(|block| format!("{block}\n"))
        .collect()
}

/// Fails naming every metric that an expression uses and `known` lacks.
fn unknown_metrics(what: &str, exprs: &[String], known: &BTreeSet<String>) -> Result<()> {
    let mut unknown = BTreeSet::new();
    for expr in exprs {
        unknown.extend(metric_names(expr)?.into_iter().filter(|m| !known.contains(m)));
    }
    ensure!(
        unknown.is_empty(),
        "{what} use metrics that are neither in docs/metrics.md, nor recorded by the mixin, nor \
         made by Prometheus: {}",
        unknown.into_iter().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// The metric names a PromQL expression selects, from its syntax tree: the name of every vector
/// and matrix selector, written before the braces or as a `__name__="..."` matcher, wherever it
/// sits (function and aggregation arguments, binary operands, subqueries). A selector that names
/// its metrics by a regular expression names none here. An expression that does not parse is an
/// error.
fn metric_names(expr: &str) -> Result<BTreeSet<String>> {
    let tree = promql_parser::parser::parse(expr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("PromQL does not parse: {expr}"))?;
    let mut names = BTreeSet::new();
    selected_names(&tree, &mut names);
    Ok(names)
}

/// Adds the metric names the selectors of `expr` and of its subexpressions name.
fn selected_names(expr: &Expr, names: &mut BTreeSet<String>) {
    for_each_selector(expr, &mut |selector| {
        names.extend(selector.name.iter().cloned());
        let matchers = &selector.matchers;
        for matcher in matchers.matchers.iter().chain(matchers.or_matchers.iter().flatten()) {
            if matcher.name == METRIC_NAME && matcher.op == MatchOp::Equal {
                names.insert(matcher.value.clone());
            }
        }
    });
}

/// Calls `f` with every vector selector of `expr` (those of matrix selectors included), wherever
/// it sits.
fn for_each_selector(expr: &Expr, f: &mut impl FnMut(&VectorSelector)) {
    match expr {
        Expr::VectorSelector(vs) => f(vs),
        Expr::MatrixSelector(ms) => f(&ms.vs),
        Expr::Aggregate(agg) => {
            for_each_selector(&agg.expr, f);
            if let Some(param) = &agg.param {
                for_each_selector(param, f);
            }
        }
        Expr::Unary(unary) => for_each_selector(&unary.expr, f),
        Expr::Binary(binary) => {
            for_each_selector(&binary.lhs, f);
            for_each_selector(&binary.rhs, f);
        }
        Expr::Paren(paren) => for_each_selector(&paren.expr, f),
        Expr::Subquery(subquery) => for_each_selector(&subquery.expr, f),
        Expr::Call(call) => {
            for arg in &call.args.args {
                for_each_selector(arg, f);
            }
        }
        Expr::Extension(extension) => {
            for child in extension.expr.children() {
                for_each_selector(child, f);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Dashboards

/// One query of a dashboard: where it is, and its expression with the variables replaced.
#[derive(Debug)]
struct Query {
    place: String,
    expr: String,
}

/// Structure of every generated dashboard, then all their queries parsed by promtool (as the
/// expressions of a scratch rule file) and checked for unknown metrics.
fn dashboards(dir: &Path, work: &Path, known: &BTreeSet<String>) -> Result<String> {
    let dashboards = load_dashboards(dir)?;
    let mut queries = Vec::new();
    let mut uids = BTreeSet::new();
    for (file, dashboard) in &dashboards {
        let found = dashboard_queries(file, dashboard, VARIABLE_VALUES)
            .with_context(|| format!("in {file}"))?;
        ensure!(uids.insert(dashboard["uid"].to_string()), "{file}: uid used by another dashboard");
        queries.extend(found);
    }
    // Every query as a recording rule, so that promtool parses it.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(n, q)| json!({"record": format!("dashboard_query_{n}"), "expr": q.expr}))
        .collect();
    let file = work.join("dashboard_queries.yaml");
    let text =
        serde_json::to_string_pretty(&json!({"groups": [{"name": "dashboards", "rules": rules}]}))?;
    fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    if let Err(e) = promtool(work, "check", &["dashboard_queries.yaml"]) {
        let legend: Vec<String> = queries
            .iter()
            .enumerate()
            .map(|(n, q)| format!("dashboard_query_{n}: {}: {}", q.place, q.expr))
            .collect();
        return Err(e.context(format!(
            "a dashboard query does not parse; the queries:\n{}",
            legend.join("\n")
        )));
    }
    let exprs: Vec<String> = queries.iter().map(|q| q.expr.clone()).collect();
    unknown_metrics("the dashboards", &exprs, known)?;
    Ok(format!(
        "{} dashboards, {} queries parse and use only known metrics",
        dashboards.len(),
        queries.len()
    ))
}

/// The script that loads dashboards into grafana-foundation-sdk's model.
const GRAFANA_MODEL: &str = include_str!("mixin/grafana_model.py");

/// Every generated dashboard loaded into grafana-foundation-sdk's typed model (Grafana's own
/// schema, generated) by [`GRAFANA_MODEL`], in the venv of [`crate::deps::mixin_venv`], made or
/// completed here. Skipped, saying so, only when pip cannot reach the package index to install
/// the pinned SDK; any failure to parse fails.
fn typed_model(dir: &Path, work: &Path) -> Result<String> {
    let venv = crate::deps::mixin_venv()?;
    let packages = crate::deps::MIXIN_VENV_PACKAGES;
    if let Err(e) = crate::deps::install_venv(&venv, packages, "the mixin check's venv") {
        let probe = Command::new(venv.join("bin/pip"))
            .args(["download", "--quiet", "--disable-pip-version-check", "--no-deps"])
            .args(["--retries", "1", "--timeout", "15", "-d"])
            .arg(work.join("pip-probe"))
            .args(packages)
            .output();
        if probe.is_ok_and(|o| !o.status.success()) {
            let skipped = format!(
                "SKIPPED: pip cannot reach the package index to install {} ({e:#})",
                packages.join(" ")
            );
            eprintln!("mixin: {skipped}");
            return Ok(skipped);
        }
        return Err(e);
    }
    let out_dir = dir.join(DASHBOARDS_OUT);
    let files: Vec<_> = load_dashboards(dir)?.into_iter().map(|(f, _)| out_dir.join(f)).collect();
    stdout_of(Command::new(venv.join("bin/python")).arg("-c").arg(GRAFANA_MODEL).args(&files))
        .context("a dashboard does not fit grafana-foundation-sdk's model")?;
    Ok(format!("{} dashboards parse into {}", files.len(), packages.join(" ")))
}

/// The generated dashboards: (file name, parsed JSON), sorted by name.
fn load_dashboards(dir: &Path) -> Result<Vec<(String, Value)>> {
    let out_dir = dir.join(DASHBOARDS_OUT);
    let mut paths: Vec<_> = fs::read_dir(&out_dir)
        .with_context(|| format!("cannot list {}", out_dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    paths.sort();
    ensure!(!paths.is_empty(), "no dashboards in {}", out_dir.display());
    let mut dashboards = Vec::new();
    for path in paths {
        let file = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let dashboard: Value =
            serde_json::from_str(&read(&path)?).with_context(|| format!("{file} is not JSON"))?;
        dashboards.push((file, dashboard));
    }
    Ok(dashboards)
}

/// Checks one dashboard's structure and returns its queries (panel targets and query variables)
/// with the variables replaced by `values`.
fn dashboard_queries(file: &str, dashboard: &Value, values: Values<'_>) -> Result<Vec<Query>> {
    for key in ["uid", "title"] {
        ensure!(dashboard[key].as_str().is_some_and(|s| !s.is_empty()), "no {key}");
    }
    ensure!(dashboard["schemaVersion"].is_u64(), "no numeric schemaVersion");
    let variables = dashboard["templating"]["list"].as_array().context("no templating.list")?;
    let defined: BTreeSet<&str> = variables.iter().filter_map(|v| v["name"].as_str()).collect();
    let mut queries = Vec::new();
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let name = variable["name"].as_str().unwrap_or_default();
        let query =
            variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap_or_default();
        let inner = variable_expr(query).with_context(|| {
            format!(
                "variable {name}: not label_values(SELECTOR, LABEL) nor query_result(EXPR): {query}"
            )
        })?;
        let expr =
            substitute(inner, &defined, values).with_context(|| format!("variable {name}"))?;
        queries.push(Query { place: format!("{file} variable {name}"), expr });
    }
    let panels = dashboard["panels"].as_array().context("no panels")?;
    ensure!(!panels.is_empty(), "no panels");
    let mut ids = BTreeSet::new();
    let mut all: Vec<&Value> = Vec::new();
    for panel in panels {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    for panel in all {
        let title = panel["title"].as_str().unwrap_or_default();
        let id =
            panel["id"].as_u64().with_context(|| format!("panel {title:?} has no numeric id"))?;
        ensure!(ids.insert(id), "panel id {id} ({title:?}) is used twice");
        ensure!(!title.is_empty(), "panel {id} has no title");
        ensure!(panel["gridPos"].is_object(), "panel {id} ({title:?}) has no gridPos");
        if panel["type"] == "row" {
            continue;
        }
        ensure!(panel["type"].is_string(), "panel {id} ({title:?}) has no type");
        ensure!(panel["datasource"].is_object(), "panel {id} ({title:?}) has no datasource");
        let targets = panel["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.with_context(|| format!("panel {id} ({title:?}) has no targets"))?;
        let mut ref_ids = BTreeSet::new();
        for target in targets {
            let ref_id = target["refId"].as_str().unwrap_or_default();
            ensure!(
                ref_ids.insert(ref_id) && !ref_id.is_empty(),
                "panel {id} ({title:?}): refId {ref_id:?} missing or repeated"
            );
            let expr = target["expr"].as_str().filter(|e| !e.trim().is_empty());
            let expr =
                expr.with_context(|| format!("panel {id} ({title:?}) target {ref_id}: no expr"))?;
            let expr = substitute(expr, &defined, values)
                .with_context(|| format!("panel {id} ({title:?})"))?;
            queries.push(Query { place: format!("{file} panel {id} {title:?} {ref_id}"), expr });
        }
    }
    Ok(queries)
}

/// The PromQL of a query variable: the selector of `label_values(SELECTOR, LABEL)` or the
/// expression of `query_result(EXPR)`.
fn variable_expr(query: &str) -> Option<&str> {
    if let Some(expr) = query.strip_prefix("query_result(") {
        return expr.strip_suffix(')');
    }
    query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .and_then(|q| q.rsplit_once(','))
        .map(|(selector, _label)| selector)
}

/// The families every target exports whatever its machine and flags: those `docs/metrics.md`
/// says are never absent, and Prometheus's own `up`.
fn always_present(doc: &str) -> Result<BTreeSet<String>> {
    let documented = documented_metrics(doc)?;
    let mut always: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (name, rest) = l.split_once('`')?;
            let absent = rest.split('|').nth(4)?.trim();
            (documented.contains(name) && absent.starts_with("never")).then(|| name.to_owned())
        })
        .collect();
    ensure!(!always.is_empty(), "docs/metrics.md names no family that is never absent");
    always.insert("up".into());
    Ok(always)
}

/// The exporter's families an expression reads, through the recording rules it uses.
fn source_families(expr: &str, records: &BTreeMap<&str, &str>) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for name in metric_names(expr)? {
        match records.get(name.as_str()) {
            Some(rule) => out.extend(source_families(rule, records)?),
            None => {
                out.insert(name);
            }
        }
    }
    Ok(out)
}

/// Fails naming each query variable whose values come from a single family that a target may
/// lack (a collector that is off, or a family the machine does not have): such a variable is
/// empty there and hides every panel that repeats over it. A variable passes when it reads a
/// family every target has ([`always_present`]) or a union of several optional ones.
fn variables_need_no_single_option(
    dashboards: &[(String, Value)],
    records: &[Value],
    always: &BTreeSet<String>,
) -> Result<String> {
    let records: BTreeMap<&str, &str> =
        records.iter().filter_map(|r| Some((r["record"].as_str()?, r["expr"].as_str()?))).collect();
    let mut checked = 0;
    let mut problems = Vec::new();
    for (file, dashboard) in dashboards {
        let variables = dashboard["templating"]["list"].as_array().into_iter().flatten();
        for variable in variables.filter(|v| v["type"] == "query") {
            let name = variable["name"].as_str().unwrap_or_default();
            let query = variable["query"]["query"].as_str().unwrap_or_default();
            let expr = variable_expr(query)
                .with_context(|| format!("{file} variable {name}: not a known query: {query}"))?;
            let families = source_families(expr, &records)?;
            if !families.iter().any(|f| always.contains(f)) && families.len() < 2 {
                problems.push(format!(
                    "{file} variable {name} reads only {}, which a target may not export",
                    families.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
            checked += 1;
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(format!("{checked} query variables read a family every target has, or several"))
}

/// The fleet dashboard generated with `showMultiCluster`: a shown `cluster` variable over
/// `clusterLabel`, and every query filtered by it.
fn fleet_filters_by_cluster(dir: &Path) -> Result<String> {
    let fleet = eval_json(
        dir,
        "((import 'mixin.libsonnet') + { _config+:: { showMultiCluster: true, clusterLabel: 'site' } })\
         .grafanaDashboards['amd-hsmp-fleet.json']",
    )?;
    let variables = fleet["templating"]["list"].as_array().context("no templating.list")?;
    let cluster =
        variables.iter().find(|v| v["name"] == "cluster").context("no cluster variable")?;
    ensure!(cluster["hide"] == 0, "the cluster variable is hidden with showMultiCluster");
    ensure!(
        cluster["query"]["query"].as_str().is_some_and(|q| q.ends_with(", site)")),
        "the cluster variable does not list clusterLabel's values: {}",
        cluster["query"]
    );
    // The variables' stand-ins, the cluster's a value of its own to look for.
    const CLUSTER: &str = "the-selected-cluster";
    let values: Vec<(&str, &str)> = VARIABLE_VALUES
        .iter()
        .map(|&(name, value)| (name, if name == "cluster" { CLUSTER } else { value }))
        .collect();
    let queries = dashboard_queries("amd-hsmp-fleet.json", &fleet, &values)?;
    // All but the cluster variable's own, which lists the clusters.
    let queries: Vec<Query> =
        queries.into_iter().filter(|q| !q.place.ends_with(" variable cluster")).collect();
    let mut unfiltered = Vec::new();
    for query in &queries {
        let tree = promql_parser::parser::parse(&query.expr)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("PromQL does not parse: {}", query.expr))?;
        for_each_selector(&tree, &mut |selector| {
            let by_cluster = selector
                .matchers
                .matchers
                .iter()
                .any(|m| m.name == "site" && m.op == MatchOp::Equal && m.value == CLUSTER);
            if !by_cluster {
                unfiltered.push(format!("{}: {selector}", query.place));
            }
        });
    }
    let count = queries.len();
    ensure!(
        unfiltered.is_empty(),
        "fleet queries not filtered by cluster:\n{}",
        unfiltered.join("\n")
    );
    Ok(format!("{count} fleet queries filtered by the cluster variable"))
}

/// Replaces `$name` and `${name}` with the stand-in values; a variable that is neither a Grafana
/// built-in nor defined by the dashboard, or has no stand-in, is an error.
fn substitute(expr: &str, defined: &BTreeSet<&str>, values: Values<'_>) -> Result<String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').context("unclosed ${")?;
                (&braced[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        ensure!(
            name.starts_with("__") || defined.contains(name),
            "variable ${name} is not defined by the dashboard"
        );
        let value =
            values.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).with_context(|| {
                format!("no stand-in value for ${name} (add one to VARIABLE_VALUES)")
            })?;
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// `promtool check rules FILES` or `promtool test rules FILES` in `dir`.
pub(crate) fn promtool(dir: &Path, verb: &str, files: &[&str]) -> Result<String> {
    stdout_of(Command::new("promtool").args([verb, "rules"]).args(files).current_dir(dir))
}

/// Starts every command, then waits for each; returns each tag with the command's standard output.
/// A failure shows everything the failing command printed.
fn run_parallel<T>(jobs: Vec<(T, Command)>) -> Result<Vec<(T, String)>> {
    let mut started = Vec::new();
    for (tag, mut cmd) in jobs {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
        started.push((tag, format!("{cmd:?}"), child));
    }
    let mut outputs = Vec::new();
    for (tag, cmd, child) in started {
        let out = child.wait_with_output().with_context(|| format!("waiting for {cmd}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "{cmd} failed ({}):\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        outputs.push((tag, stdout));
    }
    Ok(outputs)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_thresholds_print_as_written() {
        // jsonnet's `%s` of 0.9 is 0.90000000000000002: thresholds are formatted with `%g`.
        for file in ["prometheus_alerts.yaml", "prometheus_rules.yaml"] {
            let text = read(&crate::workspace::root().join("mixin").join(file)).unwrap();
            let long = text
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .find(|w| w.split_once('.').is_some_and(|(_, decimals)| decimals.len() > 6));
            assert_eq!(long, None, "{file}");
        }
    }

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).unwrap().into_iter().collect()
    }

    #[test]
    fn metric_names_skip_functions_matchers_ranges_and_grouping_labels() {
        assert_eq!(
            names(
                r#"sum without (core) (rate(amd_hsmp_core_energy_joules_total{job="a",core=~"1|2"}[5m]))"#
            ),
            ["amd_hsmp_core_energy_joules_total"]
        );
        assert_eq!(
            names("count by (version, revision) (amd_hsmp_build_info) or vector(0)"),
            ["amd_hsmp_build_info"]
        );
        assert_eq!(
            names(
                "topk(20, instance:amd_hsmp_power_watts:sum_rate5m) > 1e+9 and on (instance) amd_hsmp_up offset 5m"
            ),
            ["amd_hsmp_up", "instance:amd_hsmp_power_watts:sum_rate5m"]
        );
    }

    #[test]
    fn metric_names_ignore_braces_and_words_inside_strings() {
        assert_eq!(names(r#"ALERTS{alertname=~"AmdHsmp.*}", alertstate="firing"}"#), ["ALERTS"]);
        assert_eq!(names(r#"up{job="a\"b"} == bool 0"#), ["up"]);
    }

    /// A metric named only by a `__name__` matcher is still a metric the expression uses, and a
    /// query that is not PromQL is reported rather than read for words.
    #[test]
    fn metric_names_include_name_matchers_and_reject_what_does_not_parse() {
        assert_eq!(
            names(r#"rate({__name__="amd_hsmp_core_energy_joules_total", core="1"}[5m]) or up"#),
            ["amd_hsmp_core_energy_joules_total", "up"]
        );
        assert_eq!(names(r#"{__name__=~"amd_hsmp_.*"}"#), Vec::<String>::new());
        let err = metric_names("sum(rate(amd_hsmp_up[5m])").unwrap_err();
        assert!(format!("{err:#}").contains("does not parse"), "{err:#}");
    }

    #[test]
    fn a_metric_missing_from_the_docs_is_reported() {
        let known: BTreeSet<String> = ["amd_hsmp_up".to_owned()].into();
        let err =
            unknown_metrics("x", &["amd_hsmp_up + amd_hsmp_power".into()], &known).unwrap_err();
        assert!(err.to_string().contains("amd_hsmp_power"), "{err}");
    }

    #[test]
    fn every_family_of_the_metrics_doc_is_found() {
        let doc = read(&crate::workspace::root().join("docs/metrics.md")).unwrap();
        let names = documented_metrics(&doc).unwrap();
        for family in
            ["amd_hsmp_core_energy_joules_total", "amd_hsmp_prochot_active", "process_open_fds"]
        {
            assert!(names.contains(family), "{family} not in {names:?}");
        }
        // The labels table below the families is not read as families.
        assert!(!names.contains("core"), "{names:?}");
    }

    #[test]
    fn alert_tests_tell_firing_cases_from_quiet_ones() {
        let file = "
      - eval_time: 5m
        alertname: A
        exp_alerts: []
      - eval_time: 8m
        alertname: A
        exp_alerts:
          - exp_labels: {}
      - alertname: B
        exp_alerts: []
";
        let tests = alert_tests(file);
        assert_eq!(tests.get("A"), Some(&(true, true)));
        assert_eq!(tests.get("B"), Some(&(false, true)));
    }

    fn alert(name: &str) -> Value {
        json!({
            "alert": name,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "s", "description": "d",
                "runbook_url": format!("https://example.org/runbook.md#{}", name.to_ascii_lowercase()),
            },
        })
    }

    #[test]
    fn an_alert_without_a_quiet_test_or_a_runbook_section_is_rejected() {
        let tests: BTreeMap<String, (bool, bool)> =
            [("Good".to_owned(), (true, true)), ("Loud".to_owned(), (true, false))].into();
        let runbook = "# Runbook\n## Good\n## Loud\n";
        check_alerts(&[alert("Good")], &[("Good".to_owned(), (true, true))].into(), runbook)
            .unwrap();
        let err = check_alerts(&[alert("Good"), alert("Loud")], &tests, runbook).unwrap_err();
        assert!(err.to_string().contains("Loud: no test in which it stays quiet"), "{err}");
        let err = check_alerts(&[alert("Good")], &tests, "## Good\n").unwrap_err();
        assert!(err.to_string().contains("tests Loud, which is not an alert"), "{err}");
        let err = check_alerts(
            &[alert("Good")],
            &[("Good".to_owned(), (true, true))].into(),
            "## Other\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("Good: runbook_url"), "{err}");
    }

    #[test]
    fn config_snippets_are_the_yaml_blocks_that_configure_prometheus() {
        let doc = "text\n```yaml\n# comment\nscrape_configs:\n  - job_name: a\n```\n\
                   ```yaml\nrule_files:\n  - x\n```\n```yaml\napiVersion: 1\n```\n\
                   ```yaml\nremote_write:\n  - url: http://x\n```\n";
        let snippets = config_snippets(doc);
        assert_eq!(
            snippets,
            ["# comment\nscrape_configs:\n  - job_name: a\n", "remote_write:\n  - url: http://x\n"]
        );
    }

    #[test]
    fn an_untested_recording_rule_is_rejected() {
        let records = [json!({"record": "a:b:c"}), json!({"record": "d:e:f"})];
        check_records(&records, "  - expr: a:b:c\n  - expr: d:e:f\n").unwrap();
        let err = check_records(&records, "  - expr: a:b:c\n").unwrap_err();
        assert!(err.to_string().contains("d:e:f"), "{err}");
    }

    /// A dashboard whose one query variable runs `query`.
    fn with_variable(query: &str) -> Vec<(String, Value)> {
        let variable = json!({"name": "socket", "type": "query", "query": {"query": query}});
        vec![("d.json".into(), json!({"templating": {"list": [variable]}}))]
    }

    #[test]
    fn a_variable_over_a_single_optional_family_is_rejected() {
        let doc = "# Metrics\n\n## Families\n\n| name | type | labels | help | absent when | since |\n|---|---|---|---|---|---|\n\
                   | `amd_hsmp_up` | gauge | | up | never (0 when down) | 0.1.0 |\n\
                   | `amd_hsmp_prochot_active` | gauge | socket | p | collector disabled | 0.1.0 |\n\
                   | `amd_hsmp_core_boost_limit_hertz` | gauge | core, socket | b | collector disabled | 0.1.0 |\n";
        let always = always_present(doc).unwrap();
        assert_eq!(always, ["amd_hsmp_up", "up"].map(String::from).into());
        let records = [
            json!({"record": "socket:boost:min", "expr": "min without (core) (amd_hsmp_core_boost_limit_hertz)"}),
        ];
        let check = |q: &str| variables_need_no_single_option(&with_variable(q), &records, &always);
        let err = check("label_values(amd_hsmp_prochot_active{job=\"x\"}, socket)").unwrap_err();
        assert!(err.to_string().contains("reads only amd_hsmp_prochot_active"), "{err}");
        // Through a recording rule, its source family counts.
        let err = check("label_values(socket:boost:min, socket)").unwrap_err();
        assert!(err.to_string().contains("reads only amd_hsmp_core_boost_limit_hertz"), "{err}");
        check("query_result(count by (socket) (socket:boost:min or amd_hsmp_prochot_active))")
            .unwrap();
        check("label_values(amd_hsmp_up, instance)").unwrap();
    }

    #[test]
    fn with_show_multi_cluster_every_fleet_query_is_filtered_by_cluster() {
        fleet_filters_by_cluster(&crate::workspace::root().join("mixin")).unwrap();
    }

    #[test]
    fn the_generated_variables_read_families_every_target_has() {
        let root = crate::workspace::root();
        let records = rules_of(
            &eval_json(&root.join("mixin"), "(import 'mixin.libsonnet').prometheusRules").unwrap(),
        )
        .unwrap();
        let always = always_present(&read(&root.join("docs/metrics.md")).unwrap()).unwrap();
        variables_need_no_single_option(
            &load_dashboards(&root.join("mixin")).unwrap(),
            &records,
            &always,
        )
        .unwrap();
    }

    #[test]
    fn variables_are_replaced_and_undefined_ones_rejected() {
        let defined: BTreeSet<&str> = ["instance"].into();
        assert_eq!(
            substitute(
                r#"rate(x{instance="$instance"}[$__rate_interval])"#,
                &defined,
                VARIABLE_VALUES
            )
            .unwrap(),
            r#"rate(x{instance="node-1:10054"}[5m])"#
        );
        assert_eq!(
            substitute("x{i=\"${instance}\"}", &defined, VARIABLE_VALUES).unwrap(),
            "x{i=\"node-1:10054\"}"
        );
        assert!(substitute("x{socket=\"$socket\"}", &defined, VARIABLE_VALUES).is_err());
    }

    fn dashboard(panels: Value) -> Value {
        json!({"uid": "u", "title": "t", "schemaVersion": 39, "templating": {"list": []}, "panels": panels})
    }

    fn panel(id: u64, expr: &str) -> Value {
        json!({"id": id, "title": format!("p{id}"), "type": "timeseries", "gridPos": {},
               "datasource": {"uid": "x"}, "targets": [{"refId": "A", "expr": expr}]})
    }

    #[test]
    fn dashboards_with_repeated_ids_or_panels_without_targets_are_rejected() {
        let good = dashboard(
            json!([{"id": 1, "title": "r", "type": "row", "gridPos": {}}, panel(2, "up")]),
        );
        assert_eq!(dashboard_queries("d", &good, VARIABLE_VALUES).unwrap().len(), 1);
        let twice = dashboard(json!([panel(1, "up"), panel(1, "up")]));
        assert!(
            dashboard_queries("d", &twice, VARIABLE_VALUES)
                .unwrap_err()
                .to_string()
                .contains("used twice")
        );
        let mut empty = panel(1, "up");
        empty["targets"] = json!([]);
        let err = dashboard_queries("d", &dashboard(json!([empty])), VARIABLE_VALUES).unwrap_err();
        assert!(err.to_string().contains("no targets"), "{err}");
        let mut no_uid = dashboard(json!([panel(1, "up")]));
        no_uid["uid"] = json!("");
        assert!(
            dashboard_queries("d", &no_uid, VARIABLE_VALUES)
                .unwrap_err()
                .to_string()
                .contains("no uid")
        );
    }

    /// docs/install.md's cardinality table gives, per simulator profile, the series of the
    /// healthy golden scrape plus the 5 Prometheus adds per target. (The table is generated
    /// from a live scrape by the e2e suite's `cardinality` test, which needs FUSE; this check
    /// holds it to the golden scrapes where that test does not run.)
    #[test]
    fn the_cardinality_table_matches_the_golden_scrapes() {
        let root = crate::workspace::root();
        let doc = read(&root.join("docs/install.md")).unwrap();
        let header = doc
            .lines()
            .find(|l| l.starts_with("| profile |"))
            .expect("the table of profiles in docs/install.md");
        let column = header
            .split('|')
            .map(str::trim)
            .position(|c| c == "series per node")
            .expect("a `series per node` column");
        let mut checked = 0;
        for row in doc
            .lines()
            .filter(|l| l.starts_with("| `") && (l.contains("-1p`") || l.contains("-2p`")))
        {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let profile = cells[1].trim_matches('`');
            let golden = root.join(format!("tests/golden/healthy-{profile}.metrics"));
            let scrape = read(&golden).unwrap();
            let series =
                scrape.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count();
            let documented: usize = cells[column]
                .split_whitespace()
                .next()
                .and_then(|n| n.replace(',', "").parse().ok())
                .unwrap_or_else(|| panic!("{row}"));
            assert_eq!(documented, series + 5, "{profile}: {row}");
            checked += 1;
        }
        assert_eq!(checked, amd_hsmp_sim::Profile::ALL.len(), "one row per simulator profile");
    }
}
