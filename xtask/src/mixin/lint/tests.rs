//! Each rule on a dashboard that passes every rule, and on the same dashboard changed to break
//! it; the exclusions file.

use super::*;
use serde_json::json;

/// A dashboard that passes every rule.
fn base() -> Value {
    json!({
        "title": "T",
        "editable": false,
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
            {"name": "job", "label": "Job", "type": "query", "datasource": {"uid": "${datasource}"},
             "query": {"query": "label_values(up, job)"}, "multi": true, "allValue": ".+", "refresh": 2},
            {"name": "instance", "label": "Instance", "type": "query", "datasource": {"uid": "$datasource"},
             "query": "label_values(up{job=~\"$job\"}, instance)", "multi": true, "allValue": ".+", "refresh": 2}
        ]},
        "panels": [
            {"type": "row", "title": "R", "panels": []},
            {"type": "timeseries", "title": "P", "description": "D", "datasource": {"uid": "${datasource}"},
             "fieldConfig": {"defaults": {"unit": "watt"}, "overrides": []},
             "targets": [{"expr": "rate(x_total{job=~\"$job\",instance=~\"$instance\"}[$__rate_interval])"}]}
        ]
    })
}

/// `base()` with the value at a JSON pointer replaced.
fn with(pointer: &str, value: Value) -> Value {
    let mut d = base();
    *d.pointer_mut(pointer).unwrap_or_else(|| panic!("no {pointer}")) = value;
    d
}

fn expr(e: &str) -> Value {
    with("/panels/1/targets/0/expr", json!(e))
}

/// The messages of one rule on a dashboard.
fn run(rule: &str, d: &Value) -> Vec<String> {
    let found = findings(&[("d.json".into(), d.clone())]).expect("lints");
    found.into_iter().filter(|f| f.rule == rule).map(|f| f.message).collect()
}

fn passes(rule: &str, d: Value) {
    assert_eq!(run(rule, &d), Vec::<String>::new(), "{rule} on {d:#}");
}

fn fails(rule: &str, d: Value, wanted: &str) {
    let got = run(rule, &d);
    assert!(got.iter().any(|m| m.contains(wanted)), "{rule} did not say {wanted:?}: {got:?}");
}

#[test]
fn the_base_dashboard_passes_every_rule() {
    assert_eq!(findings(&[("d.json".into(), base())]).unwrap(), Vec::new());
}

#[test]
fn template_datasource_rule() {
    passes(
        "template-datasource-rule",
        with("/templating/list/0/name", json!("prometheus_datasource")),
    );
    fails(
        "template-datasource-rule",
        with("/templating/list/0/name", json!("ds")),
        "should be named",
    );
    fails("template-datasource-rule", with("/templating/list/0/label", json!("DS")), "(warning)");
    fails("template-datasource-rule", with("/templating/list", json!([])), "does not have");
}

#[test]
fn template_job_rule() {
    passes("template-job-rule", base());
    fails("template-job-rule", with("/templating/list/1/multi", json!(false)), "multi select");
    fails("template-job-rule", with("/templating/list/1/allValue", json!("")), "allValue");
    fails(
        "template-job-rule",
        with("/templating/list/1/datasource", json!({"uid": "prom"})),
        "'$datasource'",
    );
    fails(
        "template-job-rule",
        with("/templating/list/1/name", json!("jobs")),
        "missing the job template",
    );
    // Not a Prometheus dashboard: not checked.
    passes("template-job-rule", with("/templating/list/0/query", json!("influxdb")));
}

#[test]
fn template_instance_rule() {
    passes("template-instance-rule", base());
    fails(
        "template-instance-rule",
        with("/templating/list/2/type", json!("custom")),
        "Prometheus query",
    );
    fails("template-instance-rule", with("/templating/list/2/label", json!("Node")), "(warning)");
}

#[test]
fn template_label_promql_rule() {
    passes(
        "template-label-promql-rule",
        with("/templating/list/2/query", json!("query_result(count by (socket) (up))")),
    );
    fails(
        "template-label-promql-rule",
        with("/templating/list/2/query", json!("label_values(up{, instance)")),
        "invalid templated label",
    );
    fails(
        "template-label-promql-rule",
        with("/templating/list/2/query", json!("foo(up, instance)")),
        "invalid 'function': foo",
    );
    fails(
        "template-label-promql-rule",
        with("/templating/list/2/query", json!("up")),
        "invalid 'query'",
    );
}

#[test]
fn template_on_time_change_reload_rule() {
    passes("template-on-time-change-reload-rule", base());
    fails(
        "template-on-time-change-reload-rule",
        with("/templating/list/1/refresh", json!(1)),
        "On Time Range Change",
    );
}

#[test]
fn panel_datasource_rule() {
    passes("panel-datasource-rule", with("/panels/1/datasource", json!("$datasource")));
    fails(
        "panel-datasource-rule",
        with("/panels/1/datasource", json!({"uid": "abc"})),
        "uses 'abc'",
    );
    fails("panel-datasource-rule", with("/panels/1/datasource", Value::Null), "uses ''");
}

#[test]
fn panel_title_description_rule() {
    passes("panel-title-description-rule", base());
    fails(
        "panel-title-description-rule",
        with("/panels/1/description", json!("")),
        "missing title or description",
    );
}

#[test]
fn panel_units_rule() {
    passes("panel-units-rule", base());
    fails(
        "panel-units-rule",
        with("/panels/1/fieldConfig/defaults", json!({})),
        "no or invalid units",
    );
    fails(
        "panel-units-rule",
        with("/panels/1/fieldConfig/defaults/unit", json!("watts")),
        "'watts'",
    );
    // An override's unit, value mappings, a stat of non-numeric fields: all pass.
    let overridden = json!([{"matcher": {}, "properties": [{"id": "unit", "value": "joule"}]}]);
    let mut d = with("/panels/1/fieldConfig/overrides", overridden);
    *d.pointer_mut("/panels/1/fieldConfig/defaults").unwrap() = json!({});
    passes("panel-units-rule", d);
    passes("panel-units-rule", with("/panels/1/fieldConfig/defaults", json!({"mappings": []})));
    let mut stat = with("/panels/1/type", json!("stat"));
    *stat.pointer_mut("/panels/1/fieldConfig/defaults").unwrap() = json!({});
    stat["panels"][1]["options"] = json!({"reduceOptions": {"fields": "/^version$/"}});
    passes("panel-units-rule", stat);
}

#[test]
fn panel_no_targets_rule() {
    passes("panel-no-targets-rule", with("/panels/1/targets", json!([])));
    let mut d = base();
    d["panels"][1].as_object_mut().unwrap().remove("targets");
    fails("panel-no-targets-rule", d, "has no targets");
}

#[test]
fn target_promql_rule() {
    passes("target-promql-rule", base());
    fails("target-promql-rule", expr("sum(up{job=~\"$job\"}"), "invalid PromQL query");
    // Heatmaps are not parsed by this rule.
    let mut heatmap = expr("sum(");
    heatmap["panels"][1]["type"] = json!("heatmap");
    passes("target-promql-rule", heatmap);
}

#[test]
fn target_rate_interval_rule() {
    passes("target-rate-interval-rule", expr("increase(x_total[5m]) + avg_over_time(y[1h])"));
    passes("target-rate-interval-rule", expr("sum(increase(x_total[$__range]))"));
    fails("target-rate-interval-rule", expr("rate(x_total[5m])"), "should use $__rate_interval");
    fails(
        "target-rate-interval-rule",
        expr("irate(x_total[$__interval])"),
        "should use $__rate_interval",
    );
}

#[test]
fn target_job_rule() {
    passes("target-job-rule", base());
    fails(
        "target-job-rule",
        expr("up{job=\"amd_hsmp\",instance=~\"$instance\"}"),
        "job selector is amd_hsmp",
    );
    fails(
        "target-job-rule",
        expr("up{job=~\"$job\"} * on (instance) node_uname_info"),
        "job selector not found",
    );
}

#[test]
fn target_instance_rule() {
    passes("target-instance-rule", base());
    fails("target-instance-rule", expr("up{job=~\"$job\",instance=\"$instance\"}"), "not =~");
    fails("target-instance-rule", expr("up{job=~\"$job\"}"), "instance selector not found");
}

#[test]
fn target_counter_agg_rule() {
    passes("target-counter-agg-rule", expr("increase(x_total[5m])"));
    // A selector with matchers prints with `}` last: the linter does not look at it.
    passes("target-counter-agg-rule", expr("sum(x_total{job=~\"$job\"})"));
    fails("target-counter-agg-rule", expr("sum(x_total)"), "counter metric 'x_total'");
    fails("target-counter-agg-rule", expr("resets(x_total[5m])"), "not aggregated");
    // The linter's own cases: a range alone, and one side of a division.
    fails("target-counter-agg-rule", expr("x_total[$__rate_interval]"), "'x_total'");
    let division = expr("rate(x_total[$__rate_interval]) / y_total");
    fails("target-counter-agg-rule", division, "counter metric 'y_total'");
}

#[test]
fn uneditable_dashboard() {
    passes("uneditable-dashboard", base());
    fails("uneditable-dashboard", with("/editable", json!(true)), "is editable");
}

#[test]
fn variables_expand_outside_quotes_only() {
    let vars = base();
    let vars: Vec<&Value> = vars["templating"]["list"].as_array().unwrap().iter().collect();
    let got = expand_variables(
        "rate(x{job=~\"$job\"}[$__rate_interval]) ${instance:pipe} [[job]]",
        &vars,
        &[],
    )
    .unwrap();
    assert_eq!(got, "rate(x{job=~\"$job\"}[102d15h53m10s787ms]) instance|instance|instance job");
}

#[test]
fn exclusions_cover_findings_and_stale_ones_fail() {
    let d = [("d.json".to_owned(), expr("up{job=\"x\",instance=~\"$instance\"}"))];
    let lint = "exclusions:\n  target-job-rule:\n    reason: a fixed job\n    entries:\n    - dashboard: T\n      panel: P\n      targetIdx: 0\n";
    let exclusions = parse_exclusions(lint).unwrap();
    assert!(check(&d, &exclusions).is_ok());
    // Another panel: the finding is not covered, and the exclusion is stale.
    let other = parse_exclusions(&lint.replace("panel: P", "panel: Q")).unwrap();
    let err = format!("{:#}", check(&d, &other).unwrap_err());
    assert!(err.contains("target-job-rule: dashboard \"T\" panel \"P\" target 0"), "{err}");
    assert!(err.contains("stale exclusion"), "{err}");
    // Nothing to exclude at all.
    let clean = [("d.json".to_owned(), base())];
    assert!(format!("{:#}", check(&clean, &exclusions).unwrap_err()).contains("stale exclusion"));
}

#[test]
fn exclusions_need_a_reason_and_a_known_rule() {
    assert!(parse_exclusions("exclusions:\n  target-job-rule:\n").is_err());
    assert!(
        parse_exclusions("exclusions:\n  target-job-rule:\n    entries:\n    - panel: P\n")
            .is_err()
    );
    assert!(parse_exclusions("exclusions:\n  no-such-rule:\n    reason: r\n").is_err());
    assert!(parse_exclusions("warnings:\n  target-job-rule:\n    reason: r\n").is_err());
    let e = parse_exclusions("exclusions:\n  target-job-rule:\n    entries:\n    - panel: P\n      reason: r\n      targetIdx: \"1\"\n").unwrap();
    assert_eq!(
        (e[0].panel.as_deref(), e[0].target, e[0].reason.as_str()),
        (Some("P"), Some(1), "r")
    );
}
