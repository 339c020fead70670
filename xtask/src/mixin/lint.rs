//! grafana/dashboard-linter's rules for Prometheus dashboards, each by its linter name and with
//! the linter's semantics (its `lint/rule_*.go`), run on the generated dashboards, with the
//! exclusions of `mixin/.lint` in the linter's format. A warning fails as an error does (the
//! linter's `--strict`); an exclusion without a reason, or one that excludes nothing, fails too.
//!
//! Not implemented: `target-logql-rule` and `target-logql-auto-rule`, which check Loki targets;
//! a dashboard with a Loki data source variable fails the check instead.

use anyhow::{Context, Result, bail, ensure};
use promql_parser::label::MatchOp;
use promql_parser::parser::{Expr, MatrixSelector, VectorSelector};
use serde_json::Value;
use std::time::Duration;

/// The exclusions file, in `mixin/` (not beside the dashboards, where the generated-files check
/// takes every file for a dashboard).
pub const LINT_FILE: &str = ".lint";

/// One rule: its linter name and the function that returns its findings on a dashboard.
type Rule = (&'static str, fn(&Dashboard<'_>, &mut Vec<Finding>));

/// The rules, in the linter's order (`NewRuleSet`).
pub const RULES: &[Rule] = &[
    ("template-datasource-rule", template_datasource),
    ("template-job-rule", template_job),
    ("template-instance-rule", template_instance),
    ("template-label-promql-rule", template_label_promql),
    ("template-on-time-change-reload-rule", template_on_time_change_reload),
    ("panel-datasource-rule", panel_datasource),
    ("panel-title-description-rule", panel_title_description),
    ("panel-units-rule", panel_units),
    ("panel-no-targets-rule", panel_no_targets),
    ("target-promql-rule", target_promql),
    ("target-rate-interval-rule", target_rate_interval),
    ("target-job-rule", target_job),
    ("target-instance-rule", target_instance),
    ("target-counter-agg-rule", target_counter_agg),
    ("uneditable-dashboard", uneditable_dashboard),
];

/// A rule's finding: where (the dashboard's title, the panel's, the target's index in its panel)
/// and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub rule: &'static str,
    pub dashboard: String,
    pub panel: Option<String>,
    pub target: Option<usize>,
    pub message: String,
}

/// A dashboard as the linter reads it: its title, its variables, its panels (those of rows
/// included, rows too), editable.
pub struct Dashboard<'a> {
    title: &'a str,
    variables: Vec<&'a Value>,
    panels: Vec<&'a Value>,
    editable: bool,
    rule: &'static str,
}

impl<'a> Dashboard<'a> {
    pub fn new(json: &'a Value) -> Self {
        fn flatten<'v>(panel: &'v Value, out: &mut Vec<&'v Value>) {
            out.push(panel);
            for p in panel["panels"].as_array().into_iter().flatten() {
                flatten(p, out);
            }
        }
        let mut panels = Vec::new();
        for row in json["rows"].as_array().into_iter().flatten() {
            for p in row["panels"].as_array().into_iter().flatten() {
                flatten(p, &mut panels);
            }
        }
        for p in json["panels"].as_array().into_iter().flatten() {
            flatten(p, &mut panels);
        }
        Dashboard {
            title: json["title"].as_str().unwrap_or_default(),
            variables: json["templating"]["list"].as_array().into_iter().flatten().collect(),
            panels,
            editable: json["editable"].as_bool().unwrap_or(false),
            rule: "",
        }
    }

    fn finding(&self, out: &mut Vec<Finding>, message: String) {
        out.push(Finding {
            rule: self.rule,
            dashboard: self.title.into(),
            panel: None,
            target: None,
            message,
        });
    }

    fn panel_finding(&self, out: &mut Vec<Finding>, panel: &Value, message: String) {
        out.push(Finding {
            rule: self.rule,
            dashboard: self.title.into(),
            panel: Some(str_of(&panel["title"]).into()),
            target: None,
            message,
        });
    }

    fn target_finding(&self, out: &mut Vec<Finding>, panel: &Value, idx: usize, message: String) {
        out.push(Finding {
            rule: self.rule,
            dashboard: self.title.into(),
            panel: Some(str_of(&panel["title"]).into()),
            target: Some(idx),
            message,
        });
    }

    /// The variables of a type (the linter compares types without case).
    fn variables_of_type(&self, ty: &str) -> impl Iterator<Item = &&'a Value> {
        self.variables.iter().filter(move |v| str_of(&v["type"]).eq_ignore_ascii_case(ty))
    }

    /// Whether the first data source variable is Prometheus's, the condition of the job,
    /// instance and PromQL rules.
    fn is_prometheus(&self) -> bool {
        self.variables
            .iter()
            .find(|v| v["type"] == "datasource")
            .is_some_and(|v| variable_query(v) == "prometheus")
    }

    /// Every target of every panel: (panel, index in its panel, target).
    fn targets(&self) -> impl Iterator<Item = (&'a Value, usize, &'a Value)> + '_ {
        self.panels.iter().flat_map(|p| {
            p["targets"].as_array().into_iter().flatten().enumerate().map(move |(i, t)| (*p, i, t))
        })
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// A variable's query: the string, or the `query` of an object; none for `adhoc` and `custom`.
fn variable_query(v: &Value) -> &str {
    if v["type"] == "adhoc" || v["type"] == "custom" {
        return "";
    }
    v["query"].as_str().or(v["query"]["query"].as_str()).unwrap_or_default()
}

/// The uid of a `datasource` field: the string itself, or an object's `uid`.
fn datasource_uid(v: &Value) -> Result<&str> {
    match v {
        Value::Null => Ok(""),
        Value::String(s) => Ok(s),
        Value::Object(o) => o
            .get("uid")
            .context("missing uid field")?
            .as_str()
            .context("invalid uid field type, should be string"),
        other => bail!("invalid type for field 'datasource': {other}"),
    }
}

/// Panel types the panel rules look at (the linter's constants).
const STAT_LIKE: &[&str] = &["stat", "singlestat", "graph", "table", "timeseries", "gauge"];
/// Panel types whose targets target-promql-rule and target-rate-interval-rule parse
/// (`panelHasQueries`).
const WITH_QUERIES: &[&str] =
    &["singlestat", "gauge", "table", "stat", "state-timeline", "timeseries"];

fn panel_type_in(panel: &Value, types: &[&str]) -> bool {
    types.contains(&str_of(&panel["type"]))
}

/// Title case as `cases.Title(language.English)` makes it of one word.
fn title_case(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect())
        .unwrap_or_default()
}

fn template_datasource(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    let sources: Vec<_> = d.variables_of_type("datasource").collect();
    if sources.is_empty() {
        d.finding(out, "does not have a templated data source".into());
    }
    for ds in &sources {
        let query = variable_query(ds);
        let mut uids = vec![format!("{}_datasource", query.to_lowercase())];
        let mut labels = vec![format!("{} data source", title_case(query))];
        if sources.len() == 1 {
            uids.push("datasource".into());
            labels.push("Data source".into());
        }
        let (name, label) = (str_of(&ds["name"]), str_of(&ds["label"]));
        if !uids.iter().any(|u| u == name) {
            d.finding(
                out,
                format!(
                    "templated data source variable named '{name}', should be named one of {uids:?}"
                ),
            );
        }
        if !labels.iter().any(|l| l == label) {
            d.finding(out, format!("(warning) templated data source variable labeled '{label}', should be labeled one of {labels:?}"));
        }
    }
}

/// template-job-rule and template-instance-rule (`checkTemplate`).
fn check_template(d: &Dashboard<'_>, out: &mut Vec<Finding>, name: &str) {
    if !d.is_prometheus() {
        return;
    }
    let Some(t) = d.variables.iter().find(|v| v["name"] == name) else {
        return d.finding(out, format!("is missing the {name} template"));
    };
    let uid = datasource_uid(&t["datasource"]).unwrap_or_else(|e| {
        d.finding(out, format!("{name} template has invalid datasource {e}"));
        ""
    });
    if !["$datasource", "${datasource}", "$prometheus_datasource", "${prometheus_datasource}"]
        .contains(&uid)
    {
        d.finding(
            out,
            format!("{name} template should use datasource '$datasource', is currently '{uid}'"),
        );
    }
    if t["type"] != "query" {
        d.finding(
            out,
            format!("{name} template should be a Prometheus query, is currently '{}'", t["type"]),
        );
    }
    let label = title_case(name);
    if t["label"] != label.as_str() {
        d.finding(
            out,
            format!(
                "(warning) {name} template should be labeled '{label}', is currently {}",
                t["label"]
            ),
        );
    }
    if t["multi"] != true {
        d.finding(out, format!("{name} template should be a multi select"));
    }
    if t["allValue"] != ".+" {
        d.finding(
            out,
            format!("{name} template allValue should be '.+', is currently {}", t["allValue"]),
        );
    }
}

fn template_job(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    check_template(d, out, "job");
}

fn template_instance(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    check_template(d, out, "instance");
}

/// The linter's `([a-z_]+)\((.+)\)`, unanchored: the first lower-case word followed by `(`, and
/// everything from there to the last `)`.
fn templated_label(query: &str) -> Option<(&str, &str)> {
    let close = query.rfind(')')?;
    let bytes = query.as_bytes();
    let mut start = None;
    for (i, &b) in bytes.iter().enumerate().take(close) {
        let word = b.is_ascii_lowercase() || b == b'_';
        match (word, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) if b == b'(' && i + 1 < close => {
                return Some((&query[s..i], &query[i + 1..close]));
            }
            (false, _) => start = None,
            _ => {}
        }
    }
    None
}

fn template_label_promql(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    if !d.is_prometheus() {
        return;
    }
    for t in d.variables.iter().filter(|v| v["type"] == "query") {
        let query = variable_query(t);
        let problem = match templated_label(query) {
            None => Some(format!("invalid 'query': {query}")),
            Some((f, _))
                if !["label_names", "label_values", "metrics", "query_result"].contains(&f) =>
            {
                Some(format!("invalid 'function': {f}"))
            }
            // The linter accepts what Prometheus's parser makes an expression of, even with an
            // error after it: label_values' `, LABEL`, here split off.
            Some((f, args)) => {
                let expr = match (f, args.rsplit_once(',')) {
                    ("label_values", Some((selector, label))) if is_label_name(label.trim()) => {
                        selector
                    }
                    _ => args,
                };
                parse_promql(expr, &d.variables).err().map(|e| format!("{e:#}"))
            }
        };
        if let Some(problem) = problem {
            d.finding(
                out,
                format!(
                    "template '{}' invalid templated label '{query}': {problem}",
                    str_of(&t["name"])
                ),
            );
        }
    }
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn template_on_time_change_reload(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    for t in d.variables.iter().filter(|v| v["type"] == "query") {
        if t["refresh"] != 2 {
            d.finding(
                out,
                format!(
                    "template variable '{}' should be refreshed 'On Time Range Change' (2), is {}",
                    str_of(&t["name"]),
                    t["refresh"]
                ),
            );
        }
    }
}

fn panel_datasource(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    let templated: Vec<String> = d
        .variables_of_type("datasource")
        .flat_map(|v| {
            let name = str_of(&v["name"]);
            [format!("${name}"), format!("${{{name}}}")]
        })
        .collect();
    for p in d
        .panels
        .iter()
        .filter(|p| panel_type_in(p, &["singlestat", "graph", "table", "timeseries"]))
    {
        let uid = datasource_uid(&p["datasource"]).unwrap_or_else(|e| {
            d.panel_finding(out, p, format!("has invalid datasource: {e}"));
            ""
        });
        if !templated.iter().any(|t| t == uid) {
            d.panel_finding(out, p, format!("does not use a templated datasource, uses '{uid}'"));
        }
    }
}

fn panel_title_description(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    for p in d.panels.iter().filter(|p| panel_type_in(p, STAT_LIKE)) {
        if str_of(&p["title"]).is_empty() || str_of(&p["description"]).is_empty() {
            d.panel_finding(out, p, "has missing title or description".into());
        }
    }
}

/// Grafana's unit ids the linter accepts (`validUnits` of `rule_panel_units.go`).
const VALID_UNITS: &[&str] = &[
    "none",
    "string",
    "short",
    "percent",
    "percentunit",
    "humidity",
    "dB",
    "hex0x",
    "hex",
    "sci",
    "locale",
    "pixel",
    "accMS2",
    "accFS2",
    "accG",
    "degree",
    "radian",
    "grad",
    "arcmin",
    "arcsec",
    "areaM2",
    "areaF2",
    "areaMI2",
    "flops",
    "mflops",
    "gflops",
    "tflops",
    "pflops",
    "eflops",
    "zflops",
    "yflops",
    "ppm",
    "conppb",
    "conngm3",
    "conngNm3",
    "conμgm3",
    "conμgNm3",
    "conmgm3",
    "conmgNm3",
    "congm3",
    "congNm3",
    "conmgdL",
    "conmmolL",
    "currencyUSD",
    "currencyGBP",
    "currencyEUR",
    "currencyJPY",
    "currencyRUB",
    "currencyUAH",
    "currencyBRL",
    "currencyDKK",
    "currencyISK",
    "currencyNOK",
    "currencySEK",
    "currencyCZK",
    "currencyCHF",
    "currencyPLN",
    "currencyBTC",
    "currencymBTC",
    "currencyμBTC",
    "currencyZAR",
    "currencyINR",
    "currencyKRW",
    "currencyIDR",
    "currencyPHP",
    "currencyVND",
    "bytes",
    "decbytes",
    "bits",
    "decbits",
    "kbytes",
    "deckbytes",
    "mbytes",
    "decmbytes",
    "gbytes",
    "decgbytes",
    "tbytes",
    "dectbytes",
    "pbytes",
    "decpbytes",
    "pps",
    "binBps",
    "Bps",
    "binbps",
    "bps",
    "KiBs",
    "Kibits",
    "KBs",
    "Kbits",
    "MiBs",
    "Mibits",
    "MBs",
    "Mbits",
    "GiBs",
    "Gibits",
    "GBs",
    "Gbits",
    "TiBs",
    "Tibits",
    "TBs",
    "Tbits",
    "PiBs",
    "Pibits",
    "PBs",
    "Pbits",
    "dateTimeAsIso",
    "dateTimeAsIsoNoDateIfToday",
    "dateTimeAsUS",
    "dateTimeAsUSNoDateIfToday",
    "dateTimeAsLocal",
    "dateTimeAsLocalNoDateIfToday",
    "dateTimeAsSystem",
    "dateTimeFromNow",
    "watt",
    "kwatt",
    "megwatt",
    "gwatt",
    "mwatt",
    "Wm2",
    "voltamp",
    "kvoltamp",
    "voltampreact",
    "kvoltampreact",
    "watth",
    "watthperkg",
    "kwatth",
    "kwattm",
    "amph",
    "kamph",
    "mamph",
    "joule",
    "ev",
    "amp",
    "kamp",
    "mamp",
    "volt",
    "kvolt",
    "mvolt",
    "dBm",
    "ohm",
    "kohm",
    "Mohm",
    "farad",
    "µfarad",
    "nfarad",
    "pfarad",
    "ffarad",
    "henry",
    "mhenry",
    "µhenry",
    "lumens",
    "flowgpm",
    "flowcms",
    "flowcfs",
    "flowcfm",
    "litreh",
    "flowlpm",
    "flowmlpm",
    "lux",
    "forceNm",
    "forcekNm",
    "forceN",
    "forcekN",
    "Hs",
    "KHs",
    "MHs",
    "GHs",
    "THs",
    "PHs",
    "EHs",
    "massmg",
    "massg",
    "masslb",
    "masskg",
    "masst",
    "lengthmm",
    "lengthin",
    "lengthft",
    "lengthm",
    "lengthkm",
    "lengthmi",
    "pressurembar",
    "pressurebar",
    "pressurekbar",
    "pressurepa",
    "pressurehpa",
    "pressurekpa",
    "pressurehg",
    "pressurepsi",
    "radbq",
    "radci",
    "radgy",
    "radrad",
    "radsv",
    "radmsv",
    "radusv",
    "radrem",
    "radexpckg",
    "radr",
    "radsvh",
    "radmsvh",
    "radusvh",
    "rotrpm",
    "rothz",
    "rotrads",
    "rotdegs",
    "celsius",
    "fahrenheit",
    "kelvin",
    "hertz",
    "ns",
    "µs",
    "ms",
    "s",
    "m",
    "h",
    "d",
    "dtdurationms",
    "dtdurations",
    "dthms",
    "dtdhms",
    "timeticks",
    "clockms",
    "clocks",
    "cps",
    "ops",
    "reqps",
    "rps",
    "wps",
    "iops",
    "cpm",
    "opm",
    "rpm",
    "wpm",
    "mps",
    "mpm",
    "velocityms",
    "velocitykmh",
    "velocitymph",
    "velocityknot",
    "mlitre",
    "litre",
    "m3",
    "Nm3",
    "dm3",
    "gallons",
    "bool",
    "bool_yes_no",
    "bool_on_off",
];

/// A stat whose reduceOptions pick non-numeric fields, or a panel with value mappings (in an
/// override or in the defaults, even empty), passes; otherwise the unit (the last override's,
/// else the default's) must be one Grafana knows.
fn panel_units(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    for p in d.panels.iter().filter(|p| panel_type_in(p, STAT_LIKE)) {
        if p["type"] == "stat"
            && p["options"]["reduceOptions"]["fields"].as_str().is_some_and(|f| !f.is_empty())
        {
            continue;
        }
        let properties: Vec<&Value> = p["fieldConfig"]["overrides"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|o| o["properties"].as_array().into_iter().flatten())
            .collect();
        let mappings = properties.iter().any(|o| o["id"] == "mappings" && !o["value"].is_null())
            || !p["fieldConfig"]["defaults"]["mappings"].is_null();
        if mappings {
            continue;
        }
        let overridden = properties
            .iter()
            .filter(|o| o["id"] == "unit")
            .filter_map(|o| o["value"].as_str())
            .next_back();
        let unit = overridden
            .filter(|u| !u.is_empty())
            .unwrap_or(str_of(&p["fieldConfig"]["defaults"]["unit"]));
        if !VALID_UNITS.contains(&unit) {
            d.panel_finding(out, p, format!("has no or invalid units defined: '{unit}'"));
        }
    }
}

fn panel_no_targets(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    for p in d.panels.iter().filter(|p| panel_type_in(p, STAT_LIKE)) {
        if p["targets"].is_null() {
            d.panel_finding(out, p, "has no targets".into());
        }
    }
}

fn target_promql(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    if !d.is_prometheus() {
        return;
    }
    for (p, i, t) in d.targets().filter(|(p, _, _)| panel_type_in(p, WITH_QUERIES)) {
        let expr = str_of(&t["expr"]);
        // An empty query may reuse another panel's (the Dashboard data source).
        if let Some(id) = t["panelId"].as_u64().filter(|&id| expr.is_empty() && id > 0) {
            if d.panels.iter().any(|p| p["id"] == id) {
                continue;
            }
            d.target_finding(out, p, i, "Invalid panel reference in target".into());
        }
        if let Err(e) = parse_promql(expr, &d.variables) {
            d.target_finding(out, p, i, format!("invalid PromQL query '{expr}': {e:#}"));
        }
    }
}

/// What the linter puts for `$__rate_interval`: a range no one writes.
const RATE_INTERVAL_STAND_IN: &str = "102d15h53m10s787ms";
const RATE_INTERVAL: Duration = Duration::from_millis(8_869_990_787);

/// A matrix selector inside `rate` or `irate` must have `$__rate_interval` for its range; one
/// whose parent is not a function call fails too (the linter's message says so).
fn target_rate_interval(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    if !d.is_prometheus() {
        return;
    }
    for (p, i, t) in d.targets().filter(|(p, _, _)| panel_type_in(p, WITH_QUERIES)) {
        let expr = str_of(&t["expr"]);
        let Ok(tree) = parse_promql(expr, &d.variables) else { continue };
        let mut problem = None;
        walk(&tree, None, &mut |node, parent| {
            let Node::Matrix(ms) = node else { return };
            if problem.is_some() || ms.range == RATE_INTERVAL {
                return;
            }
            problem = match parent {
                None => None,
                Some(Expr::Call(call)) if ["rate", "irate"].contains(&call.func.name) => {
                    Some(format!("invalid PromQL query '{expr}': should use $__rate_interval"))
                }
                Some(Expr::Call(_)) => None,
                Some(_) => Some(format!(
                    "invalid PromQL query '{expr}': $__rate_interval used in non-rate function"
                )),
            };
        });
        if let Some(problem) = problem {
            d.target_finding(out, p, i, problem);
        }
    }
}

/// target-job-rule and target-instance-rule: every selector has `LABEL=~"$LABEL"`.
fn target_required_matcher(d: &Dashboard<'_>, out: &mut Vec<Finding>, label: &str) {
    if !d.is_prometheus() {
        return;
    }
    let wanted = format!("${label}");
    for (p, i, t) in d.targets() {
        let expr = str_of(&t["expr"]);
        let Ok(tree) = parse_promql(expr, &d.variables) else { continue };
        walk(&tree, None, &mut |node, _| {
            let vs = match node {
                Node::Vector(vs) => vs,
                Node::Matrix(ms) => &ms.vs,
            };
            let mut problem = Some(format!("{label} selector not found"));
            for m in vs.matchers.matchers.iter().filter(|m| m.name == label) {
                if matches!(m.op, MatchOp::Re(_)) && m.value == wanted {
                    problem = None;
                    break;
                }
                problem = Some(if m.value != wanted {
                    format!("{label} selector is {}, not {wanted}", m.value)
                } else {
                    format!("{label} selector is {}, not =~", m.op)
                });
            }
            if let Some(problem) = problem {
                d.target_finding(out, p, i, format!("invalid PromQL query '{expr}': {problem}"));
            }
        });
    }
}

fn target_job(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    target_required_matcher(d, out, "job");
}

fn target_instance(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    target_required_matcher(d, out, "instance");
}

/// A selector that Prometheus prints as a bare name ending in `_total` (no other matcher, no
/// offset, no @) must be the range of a `rate`, `irate` or `increase`. A selector with matchers
/// prints with `}` last, so the linter never looks at it.
fn target_counter_agg(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    for (p, i, t) in d.targets() {
        let expr = str_of(&t["expr"]);
        let Ok(tree) = parse_promql(expr, &d.variables) else { continue };
        let mut problem = None;
        walk(&tree, None, &mut |node, parent| {
            let (vs, aggregated) = match node {
                Node::Vector(vs) => (vs, false),
                Node::Matrix(ms) => (
                    &ms.vs,
                    matches!(parent, Some(Expr::Call(c)) if ["rate", "irate", "increase"].contains(&c.func.name)),
                ),
            };
            let name = vs.name.as_deref().unwrap_or_default();
            let bare = vs.offset.is_none()
                && vs.at.is_none()
                && vs.matchers.or_matchers.is_empty()
                && vs
                    .matchers
                    .matchers
                    .iter()
                    .all(|m| m.name == "__name__" && m.op == MatchOp::Equal && m.value == name);
            if problem.is_none() && bare && name.ends_with("_total") && !aggregated {
                problem = Some(format!(
                    "counter metric '{vs}' is not aggregated with rate, irate, or increase"
                ));
            }
        });
        if let Some(problem) = problem {
            d.target_finding(out, p, i, problem);
        }
    }
}

fn uneditable_dashboard(d: &Dashboard<'_>, out: &mut Vec<Finding>) {
    if d.editable {
        d.finding(out, "is editable, it should be set to 'editable: false'".into());
    }
}

/// A selector of the expression tree: a vector selector, or a matrix selector (whose vector
/// selector the linter's walk visits below it).
enum Node<'e> {
    Vector(&'e VectorSelector),
    Matrix(&'e MatrixSelector),
}

/// Calls `f` with every selector of `expr` and the expression it is a direct child of.
fn walk<'e>(
    expr: &'e Expr,
    parent: Option<&'e Expr>,
    f: &mut impl FnMut(Node<'e>, Option<&'e Expr>),
) {
    let mut child = |e: &'e Expr| walk(e, Some(expr), f);
    match expr {
        Expr::VectorSelector(vs) => f(Node::Vector(vs), parent),
        Expr::MatrixSelector(ms) => f(Node::Matrix(ms), parent),
        Expr::Aggregate(agg) => {
            child(&agg.expr);
            if let Some(param) = &agg.param {
                child(param);
            }
        }
        Expr::Unary(unary) => child(&unary.expr),
        Expr::Binary(binary) => {
            child(&binary.lhs);
            child(&binary.rhs);
        }
        Expr::Paren(paren) => child(&paren.expr),
        Expr::Subquery(subquery) => child(&subquery.expr),
        Expr::Call(call) => call.args.args.iter().for_each(|a| child(a)),
        Expr::Extension(extension) => extension.expr.children().iter().for_each(child),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Variables

/// Parses a query after the linter's variable expansion (`parsePromQL`).
fn parse_promql(expr: &str, variables: &[&Value]) -> Result<Expr> {
    let expanded = expand_variables(expr, variables, &[]).context("could not expand variables")?;
    promql_parser::parser::parse(&expanded).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The linter's `expandVariables`: outside double-quoted strings, `$name`, `${name[:format]}` and
/// `[[name]]` become a sample value; inside them they stay as written (so that `job=~"$job"` is
/// seen as such).
fn expand_variables(expr: &str, variables: &[&Value], skip: &[&str]) -> Result<String> {
    let mut parts = Vec::new();
    for (n, part) in expr.split('"').enumerate() {
        if n % 2 == 1 {
            parts.push(part.to_owned());
            continue;
        }
        let mut out = String::new();
        let mut rest = part;
        while !rest.is_empty() {
            let (name, len) = match variable_at(rest) {
                Some(found) => found,
                None => {
                    let c = rest.chars().next().unwrap_or_default();
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                    continue;
                }
            };
            out.push_str(&sample_value(name, variables, skip)?);
            rest = &rest[len..];
        }
        parts.push(out);
    }
    Ok(parts.join("\""))
}

/// The variable reference at the start of `s`, if any: (the name with its format, its length).
fn variable_at(s: &str) -> Option<(&str, usize)> {
    let word =
        |t: &str| t.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(t.len());
    if let Some(after) = s.strip_prefix('$') {
        let n = word(after);
        if n > 0 {
            return Some((&after[..n], n + 1));
        }
        let braced = after.strip_prefix('{')?;
        let end = braced.find('}').filter(|&e| e > 0)?;
        return Some((&braced[..end], end + 3));
    }
    let inner = s.strip_prefix("[[")?;
    let end = inner.find(['[', ']']).filter(|&e| e > 0)?;
    inner[end..].starts_with("]]").then(|| (&inner[..end], end + 4))
}

/// The linter's stand-ins for Grafana's built-in variables (those a PromQL query may hold); its
/// durations in milliseconds (`8869990787ms`) written in days to milliseconds, the same
/// durations, which promql-parser reads (it rejects so many milliseconds).
const GLOBALS: &[(&str, &str)] = &[
    ("__rate_interval", RATE_INTERVAL_STAND_IN),
    ("__interval", "56d8h10m56s611ms"),
    ("__interval_ms", "7781188786"),
    ("__range_ms", "6737667980"),
    ("__range_s", "9397795485"),
    ("__range", "70d6h2m50s749ms"),
    ("__dashboard", "AwREbnft"),
    ("__from", "1594671549254"),
    ("__to", "1594671549254"),
    ("__name", "name"),
    ("__org", "42"),
    ("__user.id", "42"),
    ("__auto", "12345ms"),
];

/// The linter's `variableSampleValue`: a built-in's stand-in, else the variable's current value
/// (or first option), expanded in turn, else the variable's name in the requested format.
fn sample_value(reference: &str, variables: &[&Value], skip: &[&str]) -> Result<String> {
    let parts: Vec<&str> = reference.split(':').collect();
    let (name, format) = match parts[..] {
        [name] => (name, ""),
        [name, format] | [name, _, format] => (name, format),
        _ => bail!("unknown variable format: {reference}"),
    };
    if let Some((_, value)) = GLOBALS.iter().find(|(n, _)| *n == name) {
        return Ok((*value).to_owned());
    }
    if name.starts_with("__auto_interval") {
        return Ok("10s".into());
    }
    let first = |v: &Value| -> String {
        match v {
            Value::Array(a) => a.first().map(|x| str_of(x).to_owned()).unwrap_or_default(),
            other => str_of(other).to_owned(),
        }
    };
    for v in variables.iter().filter(|v| v["name"] == name && !skip.contains(&name)) {
        let mut skip = skip.to_vec();
        skip.push(name);
        let current = first(&v["current"]["value"]);
        if !current.is_empty() {
            return expand_variables(&current, variables, &skip);
        }
        if let Some(option) = v["options"].as_array().and_then(|o| o.first()) {
            return expand_variables(&first(&option["value"]), variables, &skip);
        }
    }
    let three = [name; 3];
    Ok(match format {
        "csv" | "raw" => three.join(","),
        "doublequote" => format!("\"{}\"", three.join("\",\"")),
        "glob" => format!("{{{}}}", three.join(",")),
        "pipe" | "regex" => three.join("|"),
        "singlequote" | "sqlstring" => format!("'{}'", three.join("','")),
        "text" => three.join(" + "),
        _ => name.to_owned(),
    })
}

// ---------------------------------------------------------------------------------------------
// Exclusions

/// One exclusion of `.lint`: the rule, and the dashboard, panel and target index it is limited
/// to (none: the whole rule), with its reason.
#[derive(Debug)]
pub struct Exclusion {
    rule: String,
    dashboard: Option<String>,
    panel: Option<String>,
    target: Option<usize>,
    reason: String,
}

impl Exclusion {
    /// The linter's `IsMatch`: an unset field, or one the finding has not, matches.
    fn matches(&self, f: &Finding) -> bool {
        f.rule == self.rule
            && self.dashboard.as_ref().is_none_or(|d| *d == f.dashboard)
            && self.panel.as_ref().is_none_or(|p| f.panel.as_ref().is_none_or(|fp| fp == p))
            && self.target.is_none_or(|t| f.target.is_none_or(|ft| ft == t))
    }

    fn describe(&self) -> String {
        let mut s = self.rule.clone();
        for (what, value) in [("dashboard", &self.dashboard), ("panel", &self.panel)] {
            if let Some(v) = value {
                s.push_str(&format!(" {what} {v:?}"));
            }
        }
        if let Some(t) = self.target {
            s.push_str(&format!(" target {t}"));
        }
        s
    }
}

/// Reads `.lint` (YAML, the linter's format: `exclusions:` rule name to an optional `reason` and
/// optional `entries` of `dashboard`, `panel`, `targetIdx` and `reason`). Every exclusion needs a
/// reason, its own or its rule's; only known rules; no `warnings:` (a warning fails anyway).
pub fn parse_exclusions(text: &str) -> Result<Vec<Exclusion>> {
    let doc: Value = serde_norway::from_str(text).context("not YAML")?;
    let Some(top) = doc.as_object() else {
        ensure!(doc.is_null(), "not a mapping");
        return Ok(Vec::new());
    };
    if let Some(key) = top.keys().find(|k| *k != "exclusions") {
        bail!("unsupported key {key:?}: only `exclusions` (every finding fails the check)");
    }
    let mut out = Vec::new();
    for (rule, body) in top.get("exclusions").and_then(Value::as_object).into_iter().flatten() {
        ensure!(RULES.iter().any(|(name, _)| name == rule), "exclusion of unknown rule {rule:?}");
        let rule_reason = str_of(&body["reason"]);
        let entries = body["entries"].as_array().filter(|e| !e.is_empty());
        let Some(entries) = entries else {
            ensure!(!rule_reason.is_empty(), "the exclusion of {rule} has no reason");
            out.push(Exclusion {
                rule: rule.clone(),
                dashboard: None,
                panel: None,
                target: None,
                reason: rule_reason.into(),
            });
            continue;
        };
        for e in entries {
            let field = |k: &str| e[k].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
            let target = match &e["targetIdx"] {
                Value::Null => None,
                Value::Number(n) => Some(n.as_u64().context("targetIdx not an index")? as usize),
                Value::String(s) => s.parse().ok(),
                other => bail!("{rule}: targetIdx {other} not an index"),
            };
            let reason = field("reason").unwrap_or_else(|| rule_reason.to_owned());
            let exclusion = Exclusion {
                rule: rule.clone(),
                dashboard: field("dashboard"),
                panel: field("panel"),
                target,
                reason,
            };
            ensure!(
                !exclusion.reason.is_empty(),
                "the exclusion {} has no reason",
                exclusion.describe()
            );
            out.push(exclusion);
        }
    }
    Ok(out)
}

/// Every rule's findings on the dashboards, in rule order.
pub fn findings(dashboards: &[(String, Value)]) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    for (file, json) in dashboards {
        let mut d = Dashboard::new(json);
        ensure!(
            !d.variables_of_type("datasource").any(|v| variable_query(v) == "loki"),
            "{file}: a Loki data source; target-logql-rule and target-logql-auto-rule are not implemented"
        );
        for (name, rule) in RULES {
            d.rule = name;
            rule(&d, &mut out);
        }
    }
    Ok(out)
}

/// The findings no exclusion covers, and the exclusions that cover none (stale), as a report.
pub fn check(dashboards: &[(String, Value)], exclusions: &[Exclusion]) -> Result<String> {
    let found = findings(dashboards)?;
    let mut problems: Vec<String> = found
        .iter()
        .filter(|f| !exclusions.iter().any(|e| e.matches(f)))
        .map(|f| {
            let place = [
                f.panel.as_ref().map(|p| format!(" panel {p:?}")),
                f.target.map(|t| format!(" target {t}")),
            ];
            format!(
                "{}: dashboard {:?}{}: {}",
                f.rule,
                f.dashboard,
                place.into_iter().flatten().collect::<String>(),
                f.message
            )
        })
        .collect();
    for e in exclusions.iter().filter(|e| !found.iter().any(|f| e.matches(f))) {
        problems.push(format!(
            "stale exclusion in {LINT_FILE}, it excludes nothing: {} ({})",
            e.describe(),
            e.reason
        ));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    let excluded = found.len();
    Ok(format!(
        "{} dashboards pass {} dashboard-linter rules ({}), {excluded} findings excluded by {} entries of {LINT_FILE}",
        dashboards.len(),
        RULES.len(),
        RULES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        exclusions.len()
    ))
}

#[cfg(test)]
mod tests;
