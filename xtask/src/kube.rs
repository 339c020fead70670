//! `cargo xtask kube-test [--no-pods]`: the Helm chart (`deploy/helm/amd-hsmp-exporter/`) and the
//! image, checked as Kubernetes would take them, then the DaemonSet's pod run for real in podman.
//!
//! 1. The chart's copies of the mixin's rules and dashboards equal `mixin/`'s generated files;
//!    the chart's README lists every value as values.yaml documents it.
//! 2. `values.schema.json` rejects unknown keys.
//! 3. For the default values and every `ci/*-values.yaml`: Helm's lint (strict), the render, every
//!    object valid against the Kubernetes API schemas of 1.25 and 1.37 (strict: unknown fields
//!    rejected), the exporter container "restricted", the pod's fields outside "restricted"
//!    exactly the table in docs/kubernetes.md (`chart.rs`).
//! 4. `helm upgrade --reuse-values` from every earlier chart renders what the operator meant, and
//!    Chart.yaml's `version` moved with every change under the chart (`upgrade.rs`).
//! 5. The chart as the release packages it (`release::package_chart`) loads in Helm and renders
//!    what the directory renders.
//! 6. The image: built (its reproducibility is `cargo xtask release --dry-run`'s to prove).
//! 7. The pod in podman, on the simulator and on the FUSE fake device (`pod.rs`).
//!
//! Helm and the schemas come from a venv in `~/.cache/amd-hsmp-exporter/kube-venv` that
//! `cargo xtask deps` makes (the `helm-python-sdk` wheel embeds the Helm SDK; `kubernetes-validate`
//! bundles the schemas); both work offline.

mod chart;
mod pod;
mod upgrade;

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The venv's Python, made by `cargo xtask deps`.
pub fn venv_python() -> Result<PathBuf> {
    let python = crate::deps::kube_venv()?.join("bin/python");
    ensure!(python.is_file(), "no {}: run `cargo xtask deps`", python.display());
    Ok(python)
}

/// `cargo xtask kube-test [--no-pods]`.
pub fn run(args: &[String]) -> Result<()> {
    let pods = match args {
        [] => true,
        [flag] if flag == "--no-pods" => false,
        _ => bail!("usage: cargo xtask kube-test [--no-pods]"),
    };
    crate::deps::install()?;
    let root = crate::workspace::root();
    let python = venv_python()?;
    let started = Instant::now();
    step("mixin copies", || chart::check_mixin_copies(&root))?;
    step("chart README", || chart::check_readme(&root))?;
    step("values schema", || values_schema(&python, &root))?;
    step("the release's chart package", || release_chart_package(&python, &root))?;
    step("chart version", || upgrade::check_version(&root))?;
    step("helm upgrade --reuse-values", || upgrade::check_reuse_values(&python, &root))?;
    step("refused combinations", || {
        for (values, why) in chart::REFUSED {
            chart::check_refused(&python, &root, &serde_json::from_str(values)?, why)?;
        }
        Ok(format!("{} refused with their reason", chart::REFUSED.len()))
    })?;
    let documented = chart::documented_outside(&root)?;
    let variants = chart::variants(&python, &root)?;
    for variant in &variants {
        let (_, summary) = chart::check_variant(&python, &root, variant, &documented)?;
        println!("kube-test: chart {summary}");
    }
    let default = variants
        .iter()
        .find(|v| v.name == "default-values.yaml")
        .context("no ci/default-values.yaml")?;
    if pods {
        pod::require_root()?;
        // Reproducible? `cargo xtask release --dry-run` (CI) builds the image twice, in two
        // trees, as two users, and compares; `cargo xtask image --reproducible` does it here.
        let archive = crate::image::build(&root)?;
        // The chart names the published image; the pod runs the one just built and loaded into
        // podman, set as an operator sets a mirror.
        let mut local = default.clone();
        local.values["image"] = json!({"repository": crate::image::local_repository()});
        let (rendered, _) = chart::check_variant(&python, &root, &local, &documented)?;
        pod::run(&root, &archive, rendered.daemonset()?)?;
    }
    println!("kube-test: passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The "values schema" step: `values.schema.json` refuses each misspelt key, and each of
/// node-exporter's, naming it; the API schemas refuse an unknown field.
fn values_schema(python: &Path, root: &Path) -> Result<String> {
    for (values, key) in [
        (json!({"brokr": {}}), "brokr"),
        (json!({"broker": {"deviceAcess": "privileged"}}), "deviceAcess"),
        (json!({"broker": {"deviceAccess": "hostPath"}}), "deviceAccess"),
        (json!({"serviceMonitor": {"enabled": true, "intervall": "1m"}}), "intervall"),
        (json!({"namespaceOveride": "x"}), "namespaceOveride"),
        (json!({"serviceMonitor": {"metricRelabeling": []}}), "metricRelabeling"),
        (json!({"serviceMonitor": {"instanceLabel": "hostname"}}), "instanceLabel"),
        (json!({"podMonitor": {"targetLabels": ["a"]}}), "targetLabels"),
        (json!({"broker": {"coreEnergy": {"source": ["perf"]}}}), "source"),
        (json!({"broker": {"coreEnergy": {"sources": ["msr"]}}}), "sources"),
    ]
    .into_iter()
    .chain(chart::NODE_EXPORTER_ONLY.map(|key| (json!({key: {}}), key)))
    {
        let answer = chart::helm(
            python,
            root,
            &json!({"op": "schema", "chart": chart::CHART, "values": values}),
        )?;
        let error = answer["schema_error"].as_str().unwrap_or("");
        ensure!(
            error.contains(key),
            "values {values} accepted (or refused without naming {key}): {error:?}"
        );
    }
    // The validator itself is strict: an unknown field in a Service is refused.
    let answer = chart::helm(
        python,
        root,
        &json!({"op": "validate", "versions": chart::KUBE_VERSIONS, "objects": [{
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 1}], "clusterIPs": [], "bogus": 1}}]}),
    )?;
    ensure!(
        answer["invalid"].as_array().is_some_and(|a| a.len() == chart::KUBE_VERSIONS.len()),
        "kubernetes-validate accepted an unknown field: {answer}"
    );
    Ok(format!(
        "unknown keys refused, by name (and node-exporter's {}); the API schemas refuse \
         unknown fields",
        chart::NODE_EXPORTER_ONLY.join(", ")
    ))
}

/// The "the release's chart package" step: the `.tgz` `cargo xtask release` ships loads, lints
/// clean and renders what the chart's directory renders.
fn release_chart_package(python: &Path, root: &Path) -> Result<String> {
    // What `cargo xtask release` ships: Helm loads the .tgz, lints it clean and renders
    // exactly what the chart's directory renders.
    let dir = tempfile::tempdir()?;
    crate::release::package_chart(root, dir.path())?;
    let chart_yaml = std::fs::read_to_string(root.join(chart::CHART).join("Chart.yaml"))?;
    let version = crate::workspace::chart_field(&chart_yaml, "version")?;
    let tgz = dir.path().join(crate::release::names::chart_tgz(version));
    let render = |chart: &std::path::Path| {
        chart::helm(
            python,
            root,
            &json!({"op": "render", "chart": chart, "values": {}, "name": chart::RELEASE,
                    "namespace": chart::NAMESPACE, "versions": chart::KUBE_VERSIONS}),
        )
    };
    let (packaged, tree) = (render(&tgz)?, render(&root.join(chart::CHART))?);
    ensure!(
        packaged["lint_errors"].as_array().is_some_and(Vec::is_empty),
        "Helm's lint of {}: {}",
        tgz.display(),
        packaged["lint"]
    );
    ensure!(
        packaged["objects"] == tree["objects"] && packaged["notes"] == tree["notes"],
        "{} renders other objects than {}",
        tgz.display(),
        chart::CHART
    );
    Ok(format!(
        "{} loads, lints clean and renders the directory's {} objects",
        tgz.file_name().unwrap_or_default().to_string_lossy(),
        tree["objects"].as_array().map_or(0, Vec::len)
    ))
}

fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    let started = Instant::now();
    let what = f().with_context(|| format!("kube-test: {name}"))?;
    println!("kube-test: {name}: {what} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}
