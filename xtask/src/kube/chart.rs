//! The chart's static checks: the mixin copies are current, the values schema is strict, and for
//! the default values and every variant in `ci/`: Helm's lint, the render, strict validation
//! against the Kubernetes API schemas of the oldest and newest Kubernetes the chart claims, and
//! Pod Security (the exporter container passes "restricted"; the pod's fields outside it are
//! exactly the table in docs/kubernetes.md).

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use crate::workspace::CHART;
/// The oldest and newest Kubernetes the chart claims (`kubeVersion` in Chart.yaml: from 1.25,
/// when Pod Security Admission became stable; kubernetes-validate's newest schemas).
pub const KUBE_VERSIONS: [&str; 2] = ["1.25.0", "1.37.0"];
/// Release name and namespace of every render.
pub const RELEASE: &str = "amd-hsmp-exporter";
pub const NAMESPACE: &str = "monitoring";
/// The kinds of custom resources (the Prometheus Operator's, Node Feature Discovery's): not in the
/// Kubernetes schemas.
const CRD_KINDS: [&str; 4] = ["NodeFeatureRule", "PodMonitor", "PrometheusRule", "ServiceMonitor"];
/// The Pod Security table in docs/kubernetes.md sits between these lines.
const TABLE_BEGIN: &str = "<!-- outside-restricted:begin -->";
const TABLE_END: &str = "<!-- outside-restricted:end -->";

/// The mixin with a placeholder (`@@NAME@@`) for each value the chart's templates fill in from
/// its values: the job selector (`jobSelector`, in the rules, alerts and dashboards), the runbook
/// base URL, and each alert's `for`, `severity` and `threshold` (templates/prometheusrule.yaml,
/// templates/dashboards.yaml).
const PLACEHOLDERS: &str = "(import 'mixin.libsonnet') + { _config+:: { \
     amdHsmpSelector: '@@selector@@', runbookBaseURL: '@@runbookBaseURL@@', \
     alerts: std.mapWithKey(function(name, alert) alert { 'for': '@@%s.for@@' % name, \
     severity: '@@%s.severity@@' % name, [if std.objectHas(alert, 'threshold') then 'threshold']: \
     '@@%s.threshold@@' % name }, super.alerts) } }";

/// The mixin's settings that the chart's values override (`jobSelector`, `prometheusRule.alerts`,
/// `.alertLabels`, `.runbookBaseURL`), at the mixin's defaults: the chart's one copy of them.
const MIXIN_CONFIG: &str = "local c = (import 'mixin.libsonnet')._config; { selector: \
     c.amdHsmpSelector, runbookBaseURL: c.runbookBaseURL, alertLabels: c.alertLabels, alerts: \
     c.alerts }";

/// What the chart's `files/` must hold, each file with its content: the mixin's rules and alerts
/// and dashboards with [`PLACEHOLDERS`], and its settings ([`MIXIN_CONFIG`]) (Helm reads files inside the chart
/// only).
pub fn mixin_copies(root: &Path) -> Result<Vec<(Vec<u8>, PathBuf)>> {
    let chart = root.join(CHART).join("files");
    let mut copies = Vec::new();
    let rules = format!("({PLACEHOLDERS}).prometheusRules");
    let alerts = format!("({PLACEHOLDERS}).prometheusAlerts");
    for (of, file) in [
        (rules.as_str(), "prometheus_rules.yaml"),
        (alerts.as_str(), "prometheus_alerts.yaml"),
        (MIXIN_CONFIG, "mixin_config.yaml"),
    ] {
        let expr = format!("std.manifestYamlDoc({of}, false, false)");
        let text = crate::workspace::stdout_of(
            Command::new("jsonnet").args(["-S", "-e", &expr]).current_dir(root.join("mixin")),
        )?;
        copies.push((text.into_bytes(), chart.join(file)));
    }
    // The dashboards as `jsonnet -m` writes dashboards_out/, with the placeholders.
    let made = tempfile::tempdir()?;
    crate::workspace::output(
        Command::new("jsonnet")
            .arg("-m")
            .arg(made.path())
            .args(["-e", &format!("({PLACEHOLDERS}).grafanaDashboards")])
            .current_dir(root.join("mixin")),
    )?;
    let mut dashboards: Vec<_> =
        fs::read_dir(made.path())?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    dashboards.sort();
    for d in dashboards {
        let name = d.file_name().context("dashboard without a name")?.to_owned();
        let content = fs::read(&d).with_context(|| format!("cannot read {}", d.display()))?;
        copies.push((content, chart.join("dashboards").join(name)));
    }
    Ok(copies)
}

/// The chart's copies equal what [`mixin_copies`] makes of the mixin, and it has no other
/// dashboard; with `UPDATE_GOLDEN=1`, writes them.
pub fn check_mixin_copies(root: &Path) -> Result<String> {
    let copies = mixin_copies(root)?;
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for (want, to) in &copies {
        if fs::read(to).ok().as_deref() != Some(want.as_slice()) {
            if update {
                fs::write(to, want)?;
            } else {
                stale.push(to.display().to_string());
            }
        }
    }
    let known: BTreeSet<_> = copies.iter().map(|(_, to)| to.clone()).collect();
    for entry in fs::read_dir(root.join(CHART).join("files/dashboards"))? {
        let path = entry?.path();
        ensure!(known.contains(&path), "{} is no dashboard of mixin/", path.display());
    }
    ensure!(
        stale.is_empty(),
        "the chart's copies of the mixin are stale: {} (UPDATE_GOLDEN=1 cargo xtask kube-test \
         copies them)",
        stale.join(", ")
    );
    Ok(format!("{} files equal mixin/'s", copies.len()))
}

/// Runs the helper `helm.py` in the venv with `request`; returns its answer.
pub fn helm(python: &Path, root: &Path, request: &Value) -> Result<Value> {
    let mut child = Command::new(python)
        .arg(root.join("xtask/src/kube/helm.py"))
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Helm's Go code logs a template's `fail` to stderr; the answer carries it.
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", python.display()))?;
    serde_json::to_writer(child.stdin.take().context("no stdin")?, request)?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "helm.py failed on {request}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// A values file of `ci/` (or the defaults): its name, the values, and what it selects.
#[derive(Debug, Clone)]
pub struct Variant {
    pub name: String,
    pub values: Value,
    pub privileged: bool,
    pub msr: bool,
    /// `perf` among `broker.coreEnergy.sources`.
    pub perf: bool,
    /// `--collector.core-owner`: the host's cgroup hierarchy mounted into the exporter.
    pub core_owner: bool,
    /// `hostNetwork`: the pod in the node's network namespace.
    pub host_network: bool,
    /// The values merged with the chart's defaults.
    pub merged: Value,
}

/// The default values and every `ci/*-values.yaml`, each read through the helper as YAML.
pub fn variants(python: &Path, root: &Path) -> Result<Vec<Variant>> {
    let mut files: Vec<PathBuf> = fs::read_dir(root.join(CHART).join("ci"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let defaults = helm(python, root, &json!({"op": "values", "chart": CHART}))?;
    let mut variants = Vec::new();
    for file in files {
        let name = file.file_name().context("no name")?.to_string_lossy().into_owned();
        let answer = helm(python, root, &json!({"op": "values", "chart": CHART, "file": file}))?;
        let values = answer["values"].clone();
        let merged = &answer["merged"];
        variants.push(Variant {
            name,
            values,
            privileged: merged["broker"]["deviceAccess"] == "privileged",
            msr: merged["broker"]["msrFallback"] == true,
            perf: energy_sources(merged).contains(&"perf"),
            core_owner: merged["exporter"]["collectors"]["coreOwner"]["enabled"] == true,
            host_network: merged["hostNetwork"] == true,
            merged: merged.clone(),
        });
    }
    ensure!(defaults["merged"]["broker"]["deviceAccess"] == "privileged", "default mode");
    Ok(variants)
}

/// Values the chart must refuse when rendering, with a part of the message each gives.
pub const REFUSED: [(&str, &str); 3] = [
    (
        r#"{"service": {"enabled": false}, "serviceMonitor": {"enabled": true}}"#,
        "needs service.enabled",
    ),
    (r#"{"serviceMonitor": {"enabled": true}, "podMonitor": {"enabled": true}}"#, "choose one"),
    (
        r#"{"hostNetwork": true, "networkPolicy": {"enabled": true}}"#,
        "does not apply to a pod in the node's network",
    ),
];

/// Keys of prometheus-node-exporter's chart that have no meaning here: the schema refuses each,
/// naming it, so that a values file carried over fails where it would silently do nothing.
pub const NODE_EXPORTER_ONLY: [&str; 8] = [
    "hostPID",
    "hostRootFsMount",
    "prometheus",
    "rbac",
    "serviceAccount",
    "kubeRBACProxy",
    "sidecars",
    "extraHostVolumeMounts",
];

/// Renders `values`, which must be refused with a message containing `why`.
pub fn check_refused(python: &Path, root: &Path, values: &Value, why: &str) -> Result<()> {
    let answer = helm(
        python,
        root,
        &json!({"op": "render", "chart": CHART, "values": values, "name": RELEASE,
                "namespace": NAMESPACE, "versions": KUBE_VERSIONS}),
    )?;
    let error = answer["render_error"].as_str().unwrap_or("");
    ensure!(
        error.contains(why),
        "{values} rendered (or was refused for another reason): {error:?}"
    );
    Ok(())
}

/// What one variant renders to, once checked.
#[derive(Debug)]
pub struct Rendered {
    /// Every object, as rendered.
    pub objects: Vec<Value>,
}

impl Rendered {
    /// The DaemonSet.
    pub fn daemonset(&self) -> Result<&Value> {
        self.objects.iter().find(|o| o["kind"] == "DaemonSet").context("no DaemonSet rendered")
    }
}

/// Lint, render, validate and check Pod Security for one variant.
pub fn check_variant(
    python: &Path,
    root: &Path,
    variant: &Variant,
    documented: &[Outside],
) -> Result<(Rendered, String)> {
    let answer = helm(
        python,
        root,
        &json!({"op": "render", "chart": CHART, "values": variant.values, "name": RELEASE,
                "namespace": NAMESPACE, "versions": KUBE_VERSIONS}),
    )?;
    ensure!(
        answer["schema_error"].is_null(),
        "values.schema.json refuses it: {}",
        answer["schema_error"]
    );
    ensure!(answer["render_error"].is_null(), "the chart refuses it: {}", answer["render_error"]);
    let lint: Vec<&Value> = answer["lint"]
        .as_array()
        .context("lint")?
        .iter()
        .filter(|m| m[0].as_u64().unwrap_or(3) >= 2) // warnings and errors; info is advice
        .collect();
    ensure!(
        lint.is_empty() && answer["lint_errors"].as_array().is_some_and(Vec::is_empty),
        "helm lint --strict: {lint:?} {}",
        answer["lint_errors"]
    );
    let invalid = answer["invalid"].as_array().context("invalid")?;
    ensure!(invalid.is_empty(), "invalid against the Kubernetes API schemas: {invalid:?}");
    let objects: Vec<Value> = answer["objects"]
        .as_array()
        .context("objects")?
        .iter()
        .map(|o| o["object"].clone())
        .collect();
    for kind in answer["unknown_kinds"].as_array().context("unknown_kinds")? {
        let kind = kind.as_str().unwrap_or("");
        ensure!(CRD_KINDS.contains(&kind), "no Kubernetes schema for kind {kind}");
    }
    operator_objects(&objects, &variant.merged)?;
    rules_as_the_mixin_makes_them(root, &objects, variant)?;
    dashboards_select_the_job(root, &objects, &variant.merged)?;
    carried_over(&objects, &variant.merged)?;
    energy_sources_and_capabilities(&objects, variant)?;
    host_paths_every_node_has(&objects, variant)?;
    unselected_monitors_named(answer["notes"].as_str().context("notes")?, &variant.merged)?;
    let rendered = Rendered { objects };
    let template = &rendered.daemonset()?["spec"]["template"];
    let found: BTreeSet<String> = outside_restricted(template).into_iter().collect();
    let exporter: Vec<&String> = found.iter().filter(|f| f.contains("[exporter]")).collect();
    ensure!(exporter.is_empty(), "the exporter container is outside \"restricted\": {exporter:?}");
    for pod in rendered.objects.iter().filter(|o| o["kind"] == "Pod") {
        let outside = outside_restricted(pod);
        ensure!(outside.is_empty(), "the helm test pod is outside \"restricted\": {outside:?}");
    }
    let expected: BTreeSet<String> =
        documented.iter().filter(|o| o.applies(variant)).map(|o| o.field.clone()).collect();
    ensure!(
        found == expected,
        "the pod's fields outside \"restricted\" differ from docs/kubernetes.md: not documented \
         {:?}, documented but not found {:?}",
        found.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&found).collect::<Vec<_>>()
    );
    let kinds: Vec<String> =
        rendered.objects.iter().map(|o| o["kind"].as_str().unwrap_or("?").to_owned()).collect();
    Ok((
        rendered,
        format!(
            "{}: lint clean; {} (the custom resources by their references, the rest by the API \
             schemas of Kubernetes {}); exporter \"restricted\"; outside it: {}",
            variant.name,
            kinds.join(", "),
            KUBE_VERSIONS.join(" and "),
            if found.is_empty() {
                "nothing".to_owned()
            } else {
                found.into_iter().collect::<Vec<_>>().join(", ")
            }
        ),
    ))
}

/// The install's notes name each monitoring object that has no labels, which a Prometheus
/// Operator selecting by label (kube-prometheus-stack: `release`) would ignore, and no other.
fn unselected_monitors_named(notes: &str, merged: &Value) -> Result<()> {
    for key in ["serviceMonitor", "podMonitor", "prometheusRule"] {
        let o = &merged[key];
        let unlabelled =
            o["enabled"] == true && o["labels"].as_object().is_none_or(serde_json::Map::is_empty);
        let named = notes.contains(&format!("The {key} has no labels"));
        ensure!(
            named == unlabelled,
            "NOTES.txt on {key} without labels: {named}, want {unlabelled}"
        );
    }
    Ok(())
}

/// No hostPath can hold a pod on a node that lacks its path: each is of type `Directory` (a
/// `CharDevice` of a missing `/dev/hsmp` keeps the pod in ContainerCreating; an unchecked type
/// makes a directory in its place), and in `privileged` mode the broker reads `/dev/hsmp`, and
/// the MSR nodes, through the host's `/dev`.
fn host_paths_every_node_has(objects: &[Value], variant: &Variant) -> Result<()> {
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").context("no DaemonSet")?;
    let spec = &ds["spec"]["template"]["spec"];
    let mut dev = None;
    for v in spec["volumes"].as_array().context("volumes")? {
        let Some(host) = v.get("hostPath") else { continue };
        ensure!(
            host["type"] == "Directory",
            "volume {}: hostPath {} of type {}: a node without it would never run the pod",
            v["name"],
            host["path"],
            host["type"]
        );
        if host["path"] == "/dev" {
            dev = v["name"].as_str();
        }
    }
    let broker = spec["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .find(|c| c["name"] == "broker")
        .context("no broker container")?;
    let args: Vec<&str> =
        broker["args"].as_array().context("args")?.iter().filter_map(Value::as_str).collect();
    if !variant.privileged {
        ensure!(dev.is_none(), "devicePlugin mode mounts the host's /dev");
        return Ok(());
    }
    let dev = dev.context("privileged mode without the host's /dev")?;
    let mount = broker["volumeMounts"]
        .as_array()
        .context("volumeMounts")?
        .iter()
        .find(|m| m["name"] == dev && m["readOnly"] == true)
        .and_then(|m| m["mountPath"].as_str())
        .context("the broker does not mount the host's /dev read-only")?;
    let mut wanted = vec![format!("--hsmp.device={mount}/hsmp")];
    if variant.msr {
        wanted.push(format!("--msr.device-root={mount}/cpu"));
    }
    for flag in wanted {
        ensure!(args.contains(&flag.as_str()), "the broker's flags lack {flag}: {args:?}");
    }
    Ok(())
}

/// The custom resources, which no schema here covers, and the NetworkPolicy: their references
/// The PrometheusRule's groups are exactly what the mixin makes with the values' settings as its
/// config (`jobSelector`, `prometheusRule.alerts`, `.alertLabels`, `.runbookBaseURL`): the chart's
/// template fills in the mixin's placeholders as jsonnet would have made the text, so that the
/// chart and the mixin take the same keys and give the same rules.
fn rules_as_the_mixin_makes_them(root: &Path, objects: &[Value], variant: &Variant) -> Result<()> {
    let Some(rule) = objects.iter().find(|o| o["kind"] == "PrometheusRule") else {
        return Ok(());
    };
    let want = mixin_rules(root, &variant.merged)?;
    let have = &rule["spec"]["groups"];
    if *have == want {
        return match variant.name.as_str() {
            ALERTS_VARIANT => tuned_alerts_fire_as_tuned(root, have),
            _ => Ok(()),
        };
    }
    let diff = crate::golden::line_diff(
        &serde_json::to_string_pretty(&want)?,
        &serde_json::to_string_pretty(have)?,
    );
    bail!(
        "the PrometheusRule differs from the mixin's rules with its settings (- mixin, + chart):\n{diff}"
    )
}

/// Every query of the dashboards' ConfigMaps selects the job as the values say: each panel's
/// targets by the `job` variable (`job=~"$job"`), and each variable that reads a job by that
/// variable or (the `job` variable itself, the `cluster` one) by the job selector in effect
/// (`jobSelector`, else the mixin's);
/// no other `job` matcher but node_exporter's, in the join that reads its series.
fn dashboards_select_the_job(root: &Path, objects: &[Value], merged: &Value) -> Result<()> {
    const BY_VARIABLE: &str = "job=~\"$job\"";
    let mixin = crate::mixin::eval_json(&root.join("mixin"), MIXIN_CONFIG)?;
    let selector = match job_selector(merged) {
        "" => mixin["selector"].as_str().context("the mixin's selector")?.to_owned(),
        given => given.to_owned(),
    };
    let node_exporter = "job=\"node-exporter\"";
    for map in objects.iter().filter(|o| o["kind"] == "ConfigMap") {
        for (name, text) in map["data"].as_object().context("ConfigMap data")? {
            let dashboard: Value = serde_json::from_str(text.as_str().unwrap_or_default())
                .with_context(|| format!("{name} is not JSON"))?;
            let mut queries = Vec::new();
            for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
                let query = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or("");
                if v["type"] == "query" && query.contains("job") {
                    ensure!(
                        query.contains(&selector) || query.contains(BY_VARIABLE),
                        "{name}: variable {} reads {query:?}, by neither {selector} nor $job",
                        v["name"]
                    );
                    queries.push(query.replace(&selector, "").replace(BY_VARIABLE, ""));
                }
            }
            let mut panels: Vec<&Value> =
                dashboard["panels"].as_array().into_iter().flatten().collect();
            // A collapsed row holds its panels.
            let nested: Vec<&Value> =
                panels.iter().flat_map(|p| p["panels"].as_array().into_iter().flatten()).collect();
            panels.extend(nested);
            for panel in panels {
                for target in panel["targets"].as_array().into_iter().flatten() {
                    let expr = target["expr"].as_str().unwrap_or("");
                    ensure!(
                        expr.contains(BY_VARIABLE),
                        "{name}: panel {} selects no $job: {expr}",
                        panel["title"]
                    );
                    queries.push(expr.replace(BY_VARIABLE, "").replace(node_exporter, ""));
                }
            }
            ensure!(queries.len() > 10, "{name}: only {} queries", queries.len());
            let stray: Vec<&String> = queries.iter().filter(|q| q.contains("job=")).collect();
            ensure!(stray.is_empty(), "{name}: queries with another job matcher: {stray:?}");
        }
    }
    Ok(())
}

/// The job selector the values give: `jobSelector`, else its earlier name
/// `prometheusRule.selector`; empty for the mixin's own.
fn job_selector(merged: &Value) -> &str {
    [&merged["jobSelector"], &merged["prometheusRule"]["selector"]]
        .into_iter()
        .filter_map(Value::as_str)
        .find(|s| !s.is_empty())
        .unwrap_or("")
}

/// The values file whose alerts `alerts_test.yaml` tests.
const ALERTS_VARIANT: &str = "alerts-values.yaml";

/// With ci/alerts-values.yaml's settings, the rendered rules pass
/// `alerts_test.yaml`'s promtool tests: the threshold, `for`, job and label it sets, and the
/// alert it turns off, as Prometheus evaluates them.
fn tuned_alerts_fire_as_tuned(root: &Path, groups: &Value) -> Result<()> {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("rules.yaml"), json!({ "groups": groups }).to_string())?;
    let test = dir.path().join("alerts_test.yaml");
    fs::copy(root.join("xtask/src/kube/alerts_test.yaml"), &test)?;
    crate::mixin::promtool(dir.path(), "test", &["alerts_test.yaml"])
        .context("promtool test rules of the tuned alerts")?;
    Ok(())
}

/// The mixin's recording rules and alerts (as one list of groups, without empty ones) with the
/// chart's `jobSelector` and `prometheusRule` values over its config, key by key; an empty string is the mixin's
/// own setting, and `for: ""` jsonnet's `null`.
pub fn mixin_rules(root: &Path, merged: &Value) -> Result<Value> {
    let mut values = merged["prometheusRule"].clone();
    values["selector"] = job_selector(merged).into();
    let expr = format!(
        "local v = {values}; local m = (import 'mixin.libsonnet') + {{ _config+:: {{ \
         [if v.selector != '' then 'amdHsmpSelector']: v.selector, \
         [if v.runbookBaseURL != '' then 'runbookBaseURL']: v.runbookBaseURL, \
         alertLabels+: v.alertLabels, \
         alerts: std.mapWithKey(function(name, alert) alert + std.mapWithKey( \
           function(key, x) if key == 'for' && x == '' then null else x, \
           if std.objectHas(v.alerts, name) then v.alerts[name] else {{}}), super.alerts) }} }}; \
         [g for g in m.prometheusRules.groups + m.prometheusAlerts.groups if g.rules != []]"
    );
    crate::mixin::eval_json(&root.join("mixin"), &expr)
}

/// hold (the monitors select the pods' labels in the pods' namespace, name their port, set `job`
/// for the mixin and `instance` as `instanceLabel` says; the rules are the mixin's groups; the
/// NodeFeatureRule's label is in the nodeSelector; the NetworkPolicy selects the pods and opens
/// their port).
fn operator_objects(objects: &[Value], merged: &Value) -> Result<()> {
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").context("no DaemonSet")?;
    let namespace = &ds["metadata"]["namespace"];
    let pod = &ds["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    let selects_pods = |kind: &str, selector: &Value| -> Result<()> {
        let selector = selector.as_object().with_context(|| format!("{kind} selector"))?;
        for (k, v) in selector {
            ensure!(&pod_labels[k] == v, "{kind} selects {k}={v}, not on the pods");
        }
        Ok(())
    };
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or("");
        let (endpoints, monitor) = match kind {
            "ServiceMonitor" => (&o["spec"]["endpoints"], &merged["serviceMonitor"]),
            "PodMonitor" => (&o["spec"]["podMetricsEndpoints"], &merged["podMonitor"]),
            "PrometheusRule" => {
                let groups = o["spec"]["groups"].as_array().context("PrometheusRule groups")?;
                ensure!(groups.len() >= 2, "PrometheusRule: {} groups", groups.len());
                continue;
            }
            "NodeFeatureRule" => {
                let label = merged["nodeFeatureRule"]["label"].as_str().context("label")?;
                ensure!(
                    o["spec"]["rules"][0]["labels"][label] == "true",
                    "the NodeFeatureRule does not set {label}"
                );
                ensure!(
                    pod["spec"]["nodeSelector"][label] == "true",
                    "the nodeSelector does not select the NodeFeatureRule's {label}"
                );
                continue;
            }
            "NetworkPolicy" => {
                selects_pods(kind, &o["spec"]["podSelector"]["matchLabels"])?;
                let ports = &o["spec"]["ingress"][0]["ports"];
                ensure!(ports[0]["port"] == "http", "the NetworkPolicy opens {ports}, not http");
                continue;
            }
            _ => continue,
        };
        ensure!(o["apiVersion"] == "monitoring.coreos.com/v1", "{kind} apiVersion");
        selects_pods(kind, &o["spec"]["selector"]["matchLabels"])?;
        ensure!(
            o["spec"]["namespaceSelector"]["matchNames"] == json!([namespace]),
            "{kind} does not look in the pods' namespace {namespace}"
        );
        let endpoint = &endpoints[0];
        ensure!(endpoint["port"] == "http" && endpoint["path"] == "/metrics", "{kind} endpoint");
        let relabelings = endpoint["relabelings"].as_array().context("relabelings")?;
        let job =
            relabelings.iter().any(|r| r["targetLabel"] == "job" && r["replacement"] == "amd_hsmp");
        if monitor["jobLabel"] == "" {
            ensure!(job, "{kind} does not set job=amd_hsmp, which the mixin selects");
        } else {
            ensure!(!job, "{kind} overrides the job its jobLabel gives");
        }
        let source = match monitor["instanceLabel"].as_str() {
            Some("nodeName") => "__meta_kubernetes_pod_node_name",
            Some("nodeIP") => "__meta_kubernetes_pod_host_ip",
            other => bail!("instanceLabel {other:?}"),
        };
        ensure!(
            relabelings
                .iter()
                .any(|r| r["targetLabel"] == "instance" && r["sourceLabels"] == json!([source])),
            "{kind} does not set instance from {source}"
        );
    }
    Ok(())
}

/// The knobs carried over from node-exporter's chart took effect: every object in the namespace
/// of `namespaceOverride` (a monitor in its own `namespace` if set), named `fullnameOverride`,
/// labelled `commonLabels` (the pods too), and the DaemonSet carries `env`, `extraVolumes`,
/// `extraVolumeMounts`, `revisionHistoryLimit`, `terminationGracePeriodSeconds`, `hostNetwork`.
fn carried_over(objects: &[Value], merged: &Value) -> Result<()> {
    let namespace = merged["namespaceOverride"].as_str().filter(|n| !n.is_empty());
    let namespace = namespace.unwrap_or(NAMESPACE);
    let fullname = merged["fullnameOverride"].as_str().filter(|n| !n.is_empty());
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or("?");
        let meta = &o["metadata"];
        let own = match kind {
            "ServiceMonitor" => merged["serviceMonitor"]["namespace"].as_str(),
            "PodMonitor" => merged["podMonitor"]["namespace"].as_str(),
            _ => None,
        };
        let want = own.filter(|n| !n.is_empty()).unwrap_or(namespace);
        if kind != "NodeFeatureRule" {
            ensure!(
                meta["namespace"] == want,
                "{kind} in namespace {}, not {want}",
                meta["namespace"]
            );
        }
        if let Some(fullname) = fullname {
            let name = meta["name"].as_str().unwrap_or("");
            ensure!(name.starts_with(fullname), "{kind} {name} is not named {fullname}");
        }
        for (k, v) in merged["commonLabels"].as_object().into_iter().flatten() {
            ensure!(&meta["labels"][k] == v, "{kind} lacks the common label {k}={v}");
        }
    }
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").context("no DaemonSet")?;
    let spec = &ds["spec"]["template"]["spec"];
    for (k, v) in merged["commonLabels"].as_object().into_iter().flatten() {
        ensure!(&ds["spec"]["template"]["metadata"]["labels"][k] == v, "the pods lack {k}={v}");
    }
    ensure!(
        ds["spec"]["revisionHistoryLimit"] == merged["revisionHistoryLimit"],
        "revisionHistoryLimit"
    );
    ensure!(
        spec["terminationGracePeriodSeconds"] == merged["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds"
    );
    ensure!((spec["hostNetwork"] == true) == (merged["hostNetwork"] == true), "hostNetwork");
    let names = |list: &Value| -> Vec<Value> {
        list.as_array().into_iter().flatten().map(|v| v["name"].clone()).collect()
    };
    let volumes = names(&spec["volumes"]);
    for v in names(&merged["extraVolumes"]) {
        ensure!(volumes.contains(&v), "extraVolumes: no volume {v}");
    }
    let env: Vec<Value> = match &merged["env"] {
        Value::Object(map) => map.keys().map(|k| json!(k)).collect(),
        list => names(list),
    };
    for c in spec["containers"].as_array().context("containers")? {
        let has = names(&c["env"]);
        ensure!(env.iter().all(|e| has.contains(e)), "{} lacks env {env:?}", c["name"]);
        if c["name"] == "exporter" {
            let mounts = names(&c["volumeMounts"]);
            for m in names(&merged["extraVolumeMounts"]) {
                ensure!(mounts.contains(&m), "extraVolumeMounts: the exporter lacks {m}");
            }
        }
    }
    Ok(())
}

/// `broker.coreEnergy.sources` of the merged values.
fn energy_sources(merged: &Value) -> Vec<&str> {
    let sources = merged["broker"]["coreEnergy"]["sources"].as_array();
    sources.into_iter().flatten().filter_map(Value::as_str).collect()
}

/// The capabilities the broker container adds: in `devicePlugin` mode `SYS_RAWIO` with the MSR
/// fallback and `PERFMON` with the perf source; none in `privileged` mode, whose container holds
/// every capability already.
pub fn broker_capabilities(variant: &Variant) -> Vec<&'static str> {
    let wanted = [("SYS_RAWIO", variant.msr), ("PERFMON", variant.perf)];
    let added = wanted.into_iter().filter(|(_, on)| *on && !variant.privileged);
    added.map(|(cap, _)| cap).collect()
}

/// The broker is given the energy sources of the values (`--collector.core-energy.sources`, and
/// `--collector.core-energy.msr-fallback` with `msrFallback`) and adds exactly
/// [`broker_capabilities`]; the exporter container drops every capability and adds none,
/// whatever the values.
fn energy_sources_and_capabilities(objects: &[Value], variant: &Variant) -> Result<()> {
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").context("no DaemonSet")?;
    let containers =
        ds["spec"]["template"]["spec"]["containers"].as_array().context("containers")?;
    let container = |name: &str| {
        containers
            .iter()
            .find(|c| c["name"] == name)
            .with_context(|| format!("no {name} container"))
    };
    let broker = container("broker")?;
    let args: Vec<&str> =
        broker["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let sources =
        format!("--collector.core-energy.sources={}", energy_sources(&variant.merged).join(","));
    ensure!(args.contains(&sources.as_str()), "the broker's flags lack {sources}: {args:?}");
    let fallback = args.contains(&"--collector.core-energy.msr-fallback");
    ensure!(
        fallback == variant.msr,
        "--collector.core-energy.msr-fallback given: {fallback}, msrFallback: {}",
        variant.msr
    );
    let added = |c: &Value| -> Vec<String> {
        let add = c["securityContext"]["capabilities"]["add"].as_array();
        add.into_iter().flatten().map(|c| c.as_str().unwrap_or("?").to_owned()).collect()
    };
    let want = broker_capabilities(variant);
    ensure!(added(broker) == want, "the broker container adds {:?}, not {want:?}", added(broker));
    let exporter = container("exporter")?;
    ensure!(added(exporter).is_empty(), "the exporter container adds {:?}", added(exporter));
    let drop = &exporter["securityContext"]["capabilities"]["drop"];
    ensure!(drop == &json!(["ALL"]), "the exporter container drops {drop}, not ALL");
    Ok(())
}

/// A documented field outside "restricted": the field as [`outside_restricted`] names it, and
/// when it appears (`always`, `coreOwner`, `hostNetwork`, or `privileged`/`devicePlugin`,
/// optionally `+ msrFallback` or `+ perf`).
#[derive(Debug, Clone)]
pub struct Outside {
    pub field: String,
    pub when: String,
}

impl Outside {
    fn applies(&self, v: &Variant) -> bool {
        self.when.split('+').map(str::trim).all(|c| match c {
            "always" => true,
            "privileged" => v.privileged,
            "devicePlugin" => !v.privileged,
            "msrFallback" => v.msr,
            "perf" => v.perf,
            "coreOwner" => v.core_owner,
            "hostNetwork" => v.host_network,
            _ => false,
        })
    }
}

/// The conditions of the table's `when` column, joined by `+`.
const CONDITIONS: [&str; 7] =
    ["always", "privileged", "devicePlugin", "msrFallback", "perf", "coreOwner", "hostNetwork"];

/// The table of docs/kubernetes.md between the markers: `| \`field\` | when | why |` rows.
pub fn documented_outside(root: &Path) -> Result<Vec<Outside>> {
    let doc = fs::read_to_string(root.join("docs/kubernetes.md"))?;
    let (_, rest) = doc.split_once(TABLE_BEGIN).context("no outside-restricted table")?;
    let (table, _) = rest.split_once(TABLE_END).context("unterminated table")?;
    let mut rows = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let field = cells.first().map(|c| c.trim_start_matches("| ").trim_matches('`'));
        let (Some(field), Some(when)) = (field, cells.get(1)) else { bail!("bad row {line}") };
        for c in when.split('+').map(str::trim) {
            ensure!(CONDITIONS.contains(&c), "unknown condition {c:?} in {line}");
        }
        ensure!(cells.get(2).is_some_and(|why| why.len() > 10), "no reason in {line}");
        rows.push(Outside { field: field.to_owned(), when: when.trim().to_owned() });
    }
    ensure!(!rows.is_empty(), "the outside-restricted table is empty");
    Ok(rows)
}

/// The chart's README: its values table is generated from values.yaml.
pub const README: &str = "README.md";
/// The generated table sits between these lines of the README.
const VALUES_BEGIN: &str = "<!-- values:begin: generated from values.yaml; UPDATE_GOLDEN=1 cargo test -p xtask chart_readme -->";
const VALUES_END: &str = "<!-- values:end -->";

/// One value of values.yaml, as its `# --` comment documents it (helm-docs' convention).
#[derive(Debug, PartialEq, Eq)]
pub struct ValueDoc {
    /// The dotted path, e.g. `serviceMonitor.instanceLabel`.
    pub key: String,
    /// The default as written (flow style for maps and lists).
    pub default: String,
    pub description: String,
}

/// Every value of `yaml` (values.yaml), in order. A key with a value on its line must have a
/// `# -- text` comment above it (continued by the `#` lines after it); a key without one opens a
/// section of keys. Maps and lists are written in flow style (`{a: 1}`, `[x]`), so that each
/// value is one line.
pub fn documented_values(yaml: &str) -> Result<Vec<ValueDoc>> {
    let mut out = Vec::new();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut doc: Option<String> = None;
    for (n, line) in yaml.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(text) = trimmed.strip_prefix("# --") {
            doc = Some(text.trim().to_owned());
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            if let Some(d) = doc.as_mut() {
                d.push(' ');
                d.push_str(text.trim());
            }
            continue;
        }
        if trimmed.is_empty() {
            ensure!(doc.is_none(), "line {}: a `# --` comment followed by a blank line", n + 1);
            continue;
        }
        let (key, rest) = trimmed
            .split_once(':')
            .filter(|(k, _)| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .with_context(|| format!("line {}: not `key: value` in flow style: {line}", n + 1))?;
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        let rest = rest.trim();
        let dotted: Vec<&str> =
            path.iter().map(|(_, k)| k.as_str()).chain(std::iter::once(key)).collect();
        let dotted = dotted.join(".");
        match (rest.is_empty(), doc.take()) {
            (true, None) => path.push((indent, key.to_owned())),
            (true, Some(_)) => bail!("line {}: {dotted} has a `# --` comment but no value", n + 1),
            (false, None) => bail!("line {}: {dotted} has no `# --` comment", n + 1),
            (false, Some(description)) => {
                out.push(ValueDoc { key: dotted, default: rest.to_owned(), description })
            }
        }
    }
    Ok(out)
}

/// Whether `schema` (values.schema.json) has a property at `key`'s dotted path.
fn in_schema(schema: &Value, key: &str) -> bool {
    let mut at = schema;
    for part in key.split('.') {
        at = &at["properties"][part];
        if at.is_null() {
            return false;
        }
    }
    true
}

/// The README's values table: one row per value of values.yaml, each checked against the schema.
pub fn values_table(root: &Path) -> Result<String> {
    let chart = root.join(CHART);
    let values = documented_values(&fs::read_to_string(chart.join("values.yaml"))?)?;
    let schema: Value =
        serde_json::from_str(&fs::read_to_string(chart.join("values.schema.json"))?)?;
    let cell = |s: &str| s.replace('|', "\\|");
    let mut table = String::from("| key | default | description |\n|---|---|---|\n");
    for v in &values {
        ensure!(in_schema(&schema, &v.key), "{} is not in values.schema.json", v.key);
        table.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            v.key,
            cell(&v.default),
            cell(&v.description)
        ));
    }
    Ok(table)
}

/// The README with its values table regenerated; with `UPDATE_GOLDEN=1` it is written, otherwise
/// it must equal the file.
pub fn check_readme(root: &Path) -> Result<String> {
    let path = root.join(CHART).join(README);
    let readme = fs::read_to_string(&path)?;
    let (head, rest) = readme.split_once(VALUES_BEGIN).context("no values:begin line")?;
    let (_, tail) = rest.split_once(VALUES_END).context("no values:end line")?;
    let table = values_table(root)?;
    let want = format!("{head}{VALUES_BEGIN}\n\n{table}\n{VALUES_END}{tail}");
    if want != readme {
        ensure!(
            std::env::var_os("UPDATE_GOLDEN").is_some(),
            "{} is stale: UPDATE_GOLDEN=1 cargo test -p xtask chart_readme",
            path.display()
        );
        fs::write(&path, want)?;
    }
    Ok(format!("{} values documented", table.lines().count() - 2))
}

/// Capabilities "baseline" allows to add; "restricted" allows only NET_BIND_SERVICE.
const RESTRICTED_ADD: [&str; 1] = ["NET_BIND_SERVICE"];
/// Volume types "restricted" allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
/// Sysctls "baseline" allows.
const SAFE_SYSCTLS: [&str; 8] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
];
/// SELinux types "baseline" allows.
const SELINUX_TYPES: [&str; 4] = ["", "container_t", "container_init_t", "container_kvm_t"];

/// Every field of pod template `template` (metadata and spec) outside the Pod Security Standards' "restricted" profile (which
/// includes "baseline"), as `spec.containers[NAME].securityContext.FIELD: VALUE`,
/// `spec.volumes[NAME].TYPE` or `spec.FIELD: VALUE`. The rules of
/// kubernetes.io/docs/concepts/security/pod-security-standards, version 1.25 and later.
pub fn outside_restricted(template: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &template["spec"];
    let pod_sc = &spec["securityContext"];
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            out.push(format!("spec.{field}: true"));
        }
    }
    if pod_sc["windowsOptions"]["hostProcess"] == true {
        out.push("spec.securityContext.windowsOptions.hostProcess: true".into());
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("?");
        for (kind, _) in v.as_object().into_iter().flatten().filter(|(k, _)| *k != "name") {
            if !RESTRICTED_VOLUMES.contains(&kind.as_str()) {
                out.push(format!("spec.volumes[{name}].{kind}"));
            }
        }
    }
    for s in pod_sc["sysctls"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        if !SAFE_SYSCTLS.contains(&name) {
            out.push(format!("spec.securityContext.sysctls: {name}"));
        }
    }
    for (k, v) in template["metadata"]["annotations"].as_object().into_iter().flatten() {
        let v = v.as_str().unwrap_or("");
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && v != "runtime/default"
            && !v.starts_with("localhost/")
        {
            out.push(format!("metadata.annotations[{k}]: {v}"));
        }
    }
    selinux("spec.securityContext", &pod_sc["seLinuxOptions"], &mut out);
    if pod_sc["appArmorProfile"]["type"] == "Unconfined" {
        out.push("spec.securityContext.appArmorProfile.type: Unconfined".into());
    }
    if pod_sc["runAsUser"] == 0 {
        out.push("spec.securityContext.runAsUser: 0".into());
    }
    if pod_sc["runAsNonRoot"] == false {
        out.push("spec.securityContext.runAsNonRoot: false".into());
    }
    if pod_sc["seccompProfile"]["type"] == "Unconfined" {
        out.push("spec.securityContext.seccompProfile.type: Unconfined".into());
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let at = format!("spec.{list}[{}]", c["name"].as_str().unwrap_or("?"));
            container(&at, c, pod_sc, &mut out);
        }
    }
    out
}

fn selinux(at: &str, opts: &Value, out: &mut Vec<String>) {
    if !SELINUX_TYPES.contains(&opts["type"].as_str().unwrap_or("")) {
        out.push(format!("{at}.seLinuxOptions.type: {}", opts["type"]));
    }
    for field in ["user", "role"] {
        if !opts[field].is_null() {
            out.push(format!("{at}.seLinuxOptions.{field}: {}", opts[field]));
        }
    }
}

fn container(at: &str, c: &Value, pod_sc: &Value, out: &mut Vec<String>) {
    let sc = &c["securityContext"];
    let at_sc = format!("{at}.securityContext");
    if sc["privileged"] == true {
        out.push(format!("{at_sc}.privileged: true"));
    }
    if sc["windowsOptions"]["hostProcess"] == true {
        out.push(format!("{at_sc}.windowsOptions.hostProcess: true"));
    }
    if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
        out.push(format!("{at_sc}.procMount: {}", sc["procMount"]));
    }
    selinux(&at_sc, &sc["seLinuxOptions"], out);
    if sc["appArmorProfile"]["type"] == "Unconfined" {
        out.push(format!("{at_sc}.appArmorProfile.type: Unconfined"));
    }
    for p in c["ports"].as_array().into_iter().flatten() {
        if p["hostPort"].as_u64().is_some_and(|h| h != 0) {
            out.push(format!(
                "{at}.ports[{}].hostPort: {}",
                p["name"].as_str().unwrap_or("?"),
                p["hostPort"]
            ));
        }
    }
    // restricted
    if sc["allowPrivilegeEscalation"] != false {
        out.push(format!(
            "{at_sc}.allowPrivilegeEscalation: {}",
            shown(&sc["allowPrivilegeEscalation"])
        ));
    }
    let non_root =
        if sc["runAsNonRoot"].is_null() { &pod_sc["runAsNonRoot"] } else { &sc["runAsNonRoot"] };
    if non_root != true {
        out.push(format!("{at_sc}.runAsNonRoot: {}", shown(non_root)));
    }
    if sc["runAsUser"] == 0 {
        out.push(format!("{at_sc}.runAsUser: 0"));
    }
    let seccomp = if sc["seccompProfile"].is_null() {
        &pod_sc["seccompProfile"]
    } else {
        &sc["seccompProfile"]
    };
    if !matches!(seccomp["type"].as_str(), Some("RuntimeDefault" | "Localhost")) {
        out.push(format!("{at_sc}.seccompProfile.type: {}", shown(&seccomp["type"])));
    }
    let caps = &sc["capabilities"];
    if !caps["drop"].as_array().is_some_and(|d| d.iter().any(|c| c == "ALL")) {
        out.push(format!("{at_sc}.capabilities.drop: no ALL"));
    }
    for cap in caps["add"].as_array().into_iter().flatten() {
        let cap = cap.as_str().unwrap_or("?");
        if !RESTRICTED_ADD.contains(&cap) {
            out.push(format!("{at_sc}.capabilities.add: {cap}"));
        }
    }
}

fn shown(v: &Value) -> String {
    if v.is_null() { "unset".into() } else { v.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restricted_container_passes_and_each_breach_is_named() {
        let ok = json!({"spec": {
            "volumes": [{"name": "s", "emptyDir": {}}],
            "containers": [{"name": "c", "securityContext": {
                "runAsUser": 65534, "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]
        }});
        assert_eq!(outside_restricted(&ok), Vec::<String>::new());
        let mut bad = ok.clone();
        bad["metadata"]["annotations"] =
            json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined"});
        let spec = &mut bad["spec"];
        spec["hostNetwork"] = json!(true);
        spec["volumes"][0] = json!({"name": "d", "hostPath": {"path": "/dev/hsmp"}});
        spec["containers"][0]["ports"] = json!([{"name": "h", "hostPort": 1}]);
        let sc = &mut spec["containers"][0]["securityContext"];
        sc["privileged"] = json!(true);
        sc["capabilities"]["add"] = json!(["SYS_RAWIO", "NET_BIND_SERVICE"]);
        sc["runAsUser"] = json!(0);
        sc.as_object_mut().unwrap().remove("allowPrivilegeEscalation");
        sc.as_object_mut().unwrap().remove("seccompProfile");
        let found: BTreeSet<String> = outside_restricted(&bad).into_iter().collect();
        let want: BTreeSet<String> = [
            "spec.hostNetwork: true",
            "spec.volumes[d].hostPath",
            "spec.containers[c].securityContext.privileged: true",
            "spec.containers[c].securityContext.capabilities.add: SYS_RAWIO",
            "spec.containers[c].securityContext.runAsUser: 0",
            "spec.containers[c].securityContext.allowPrivilegeEscalation: unset",
            "spec.containers[c].securityContext.seccompProfile.type: unset",
            "spec.containers[c].ports[h].hostPort: 1",
            "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]: unconfined",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn the_documented_fields_outside_restricted_are_the_brokers_its_volumes_and_host_network() {
        let rows = documented_outside(&crate::workspace::root()).unwrap();
        for row in &rows {
            assert!(
                row.field.starts_with("spec.containers[broker].")
                    || row.field.starts_with("spec.volumes[")
                    || (row.field == "spec.hostNetwork: true" && row.when == "hostNetwork"),
                "{row:?}"
            );
        }
        let default = Variant {
            name: "d".into(),
            values: json!({}),
            privileged: true,
            msr: false,
            perf: false,
            core_owner: false,
            host_network: false,
            merged: json!({}),
        };
        let plugin = Variant { privileged: false, ..default.clone() };
        let applying = |v: &Variant| rows.iter().filter(|r| r.applies(v)).count();
        assert_eq!(applying(&default), 5);
        assert_eq!(applying(&plugin), 2);
        // The perf source adds one field (CAP_PERFMON) in devicePlugin mode, none in privileged.
        assert_eq!(applying(&Variant { perf: true, ..default.clone() }), 5);
        assert_eq!(applying(&Variant { perf: true, ..plugin.clone() }), 3);
        assert_eq!(applying(&Variant { perf: true, msr: true, ..plugin }), 4);
    }

    /// A variant of `sources` and the rendered DaemonSet's two containers: the broker's flags
    /// and added capabilities, the exporter's added capabilities.
    fn rendered(
        privileged: bool,
        msr: bool,
        sources: &[&str],
        broker_add: &[&str],
        exporter_add: &[&str],
    ) -> (Variant, Vec<Value>) {
        let merged = json!({"broker": {"coreEnergy": {"sources": sources}, "msrFallback": msr}});
        let variant = Variant {
            name: "v".into(),
            values: json!({}),
            privileged,
            msr,
            perf: sources.contains(&"perf"),
            core_owner: false,
            host_network: false,
            merged,
        };
        let mut args = vec![format!("--collector.core-energy.sources={}", sources.join(","))];
        if msr {
            args.push("--collector.core-energy.msr-fallback".into());
        }
        let container = |name: &str, args: &[String], add: &[&str]| {
            let mut caps = json!({"drop": ["ALL"]});
            if !add.is_empty() {
                caps["add"] = json!(add);
            }
            json!({"name": name, "args": args, "securityContext": {"capabilities": caps}})
        };
        let ds = json!({"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
            container("broker", &args, broker_add),
            container("exporter", &[], exporter_add),
        ]}}}});
        (variant, vec![ds])
    }

    #[test]
    fn the_perf_source_adds_perfmon_to_the_broker_alone_and_only_in_device_plugin_mode() {
        for (privileged, msr, perf, want) in [
            (true, false, false, vec![]),
            (true, true, true, vec![]),
            (false, false, false, vec![]),
            (false, false, true, vec!["PERFMON"]),
            (false, true, false, vec!["SYS_RAWIO"]),
            (false, true, true, vec!["SYS_RAWIO", "PERFMON"]),
        ] {
            let sources: &[&str] = if perf { &["hsmp", "perf"] } else { &["hsmp"] };
            let (variant, _) = rendered(privileged, msr, sources, &[], &[]);
            assert_eq!(broker_capabilities(&variant), want, "{privileged} {msr} {perf}");
        }
        let (variant, objects) = rendered(false, false, &["hsmp", "perf"], &["PERFMON"], &[]);
        energy_sources_and_capabilities(&objects, &variant).unwrap();
        let (variant, objects) = rendered(true, false, &["perf"], &[], &[]);
        energy_sources_and_capabilities(&objects, &variant).unwrap();
    }

    #[test]
    fn a_capability_on_the_exporter_or_one_the_sources_do_not_ask_for_is_refused() {
        let perf: &[&str] = &["hsmp", "perf"];
        for (privileged, sources, broker_add, exporter_add, why) in [
            (false, perf, &["PERFMON"][..], &["PERFMON"][..], "the exporter container adds"),
            (false, perf, &[], &[], "the broker container adds []"),
            (false, &["hsmp"][..], &["PERFMON"], &[], "the broker container adds [\"PERFMON\"]"),
            (true, perf, &["PERFMON"], &[], "the broker container adds [\"PERFMON\"]"),
        ] {
            let (variant, objects) = rendered(privileged, false, sources, broker_add, exporter_add);
            let e = energy_sources_and_capabilities(&objects, &variant).unwrap_err().to_string();
            assert!(e.contains(why), "{sources:?} {broker_add:?} {exporter_add:?}: {e}");
        }
        // The flag must name the values' sources.
        let (mut variant, objects) = rendered(false, false, &["hsmp"], &[], &[]);
        variant.merged["broker"]["coreEnergy"]["sources"] = json!(["hsmp", "perf"]);
        let e = energy_sources_and_capabilities(&objects, &variant).unwrap_err().to_string();
        assert!(e.contains("lack --collector.core-energy.sources=hsmp,perf"), "{e}");
    }

    #[test]
    fn chart_readme_lists_every_value_as_values_yaml_documents_it() {
        check_readme(&crate::workspace::root()).unwrap();
    }

    #[test]
    fn a_value_without_its_description_or_in_block_style_is_refused() {
        let ok =
            "# -- The a.\n# More.\na: 1\ns:\n  # -- The b.\n  b: {x: 1}\nc:\n  # -- d\n  d: []\n";
        let docs = documented_values(ok).unwrap();
        let got: Vec<(&str, &str, &str)> = docs
            .iter()
            .map(|v| (v.key.as_str(), v.default.as_str(), v.description.as_str()))
            .collect();
        assert_eq!(
            got,
            [("a", "1", "The a. More."), ("s.b", "{x: 1}", "The b."), ("c.d", "[]", "d")]
        );
        for (bad, why) in [
            ("a: 1\n", "a has no `# --` comment"),
            ("# -- A.\na:\n  b: 1\n", "a has a `# --` comment but no value"),
            ("s:\n  - 1\n", "not `key: value`"),
            ("# -- A.\n\na: 1\n", "followed by a blank line"),
        ] {
            let e = documented_values(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    #[ignore = "needs jsonnet: cargo xtask test runs it"]
    fn the_charts_copies_of_the_mixin_are_current() {
        check_mixin_copies(&crate::workspace::root()).unwrap();
    }
}
