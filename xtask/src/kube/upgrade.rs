//! The chart through a cluster's life: `helm upgrade --reuse-values` from every earlier chart in
//! the git history, and a chart `version` that moves with every change under the chart.
//!
//! `--reuse-values` replaces the new chart's defaults by the old release's coalesced values
//! (Helm's `pkg/action/upgrade.go`, `Upgrade.reuseValues`: `chart.Values = oldVals`), so a key
//! that today's values.yaml adds is absent, not at its default: a template that reads it without
//! a fallback aborts the upgrade (`nil pointer evaluating interface {}.sources`). `helm.py`'s
//! `reuse` does what Helm does, with Helm's own code, for each earlier chart and each values file
//! an operator of that chart could have installed it with (its defaults, and its `ci/` files).

use super::chart::{self, CHART, KUBE_VERSIONS, NAMESPACE, RELEASE};
use crate::workspace::chart_field as field;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};

/// Files under the chart that are not part of it (`.helmignore`: the variants kube-test renders).
const NOT_PACKAGED: &str = "ci";

fn git(root: &Path, args: &[&str]) -> Result<String> {
    crate::image::git(root, args)
}

/// The commits whose chart an operator may have installed, oldest first: each commit that
/// changed values.yaml (the templates of the same commit come with it), except where its
/// values.yaml equals today's.
fn earlier_charts(root: &Path) -> Result<Vec<String>> {
    ensure!(
        git(root, &["rev-parse", "--is-shallow-repository"])? == "false",
        "a shallow clone has no earlier charts to upgrade from: clone the whole history"
    );
    let values = format!("{CHART}/values.yaml");
    let today = fs::read(root.join(&values))?;
    let mut commits = Vec::new();
    for commit in git(root, &["log", "--reverse", "--format=%H", "--", &values])?.lines() {
        let then = git(root, &["show", &format!("{commit}:{values}")])?;
        if then.trim_end().as_bytes() != today.trim_ascii_end() {
            commits.push(commit.to_owned());
        }
    }
    ensure!(!commits.is_empty(), "no earlier values.yaml in the history of {values}");
    Ok(commits)
}

/// The chart as it was at `commit`, unpacked under `dir`.
fn chart_at(root: &Path, commit: &str, dir: &Path) -> Result<PathBuf> {
    let out = std::process::Command::new("git")
        .args(["archive", "--format=tar", commit, CHART])
        .current_dir(root)
        .output()
        .context("cannot run git archive")?;
    ensure!(out.status.success(), "git archive {commit}: {}", String::from_utf8_lossy(&out.stderr));
    tar::Archive::new(out.stdout.as_slice()).unpack(dir)?;
    Ok(dir.join(CHART))
}

/// `helm upgrade --reuse-values` from every earlier chart, installed with its defaults and with
/// each of its `ci/` values files, to today's: the upgrade renders, its objects are valid against
/// the API schemas, and they equal what the operator meant: the old release's settings kept and
/// every key the old chart lacked at today's default.
pub fn check_reuse_values(python: &Path, root: &Path) -> Result<String> {
    let tmp = tempfile::tempdir()?;
    let mut upgrades = 0;
    let commits = earlier_charts(root)?;
    for commit in &commits {
        let short = &commit[..7];
        let old = chart_at(root, commit, &tmp.path().join(short))?;
        let mut configs = vec![("defaults".to_owned(), json!({}))];
        let mut files: Vec<PathBuf> = fs::read_dir(old.join(NOT_PACKAGED))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.sort();
        for file in files {
            let answer =
                chart::helm(python, root, &json!({"op": "values", "chart": old, "file": file}))?;
            let name = file.file_name().context("no name")?.to_string_lossy().into_owned();
            configs.push((name, answer["values"].clone()));
        }
        for (name, config) in configs {
            let answer = chart::helm(
                python,
                root,
                &json!({"op": "reuse", "chart": CHART, "old_chart": old, "config": config,
                        "name": RELEASE, "namespace": NAMESPACE, "versions": KUBE_VERSIONS}),
            )?;
            check_upgrade(&answer)
                .with_context(|| format!("helm upgrade --reuse-values from {short} with {name}"))?;
            upgrades += 1;
        }
    }
    Ok(format!(
        "{upgrades} upgrades from the {} earlier charts ({}) render what a fresh install with \
         their values renders, valid on Kubernetes {}",
        commits.len(),
        commits.iter().map(|c| &c[..7]).collect::<Vec<_>>().join(", "),
        KUBE_VERSIONS.join(" and ")
    ))
}

/// One `reuse` answer of helm.py: the upgrade renders valid objects, equal to the expected ones.
fn check_upgrade(answer: &Value) -> Result<()> {
    ensure!(
        answer["old_schema_error"].is_null(),
        "the old chart refuses its own values: {}",
        answer["old_schema_error"]
    );
    let objects = |which: &str| -> Result<Vec<Value>> {
        let render = &answer[which];
        ensure!(render["schema_error"].is_null(), "values.schema.json: {}", render["schema_error"]);
        ensure!(render["render_error"].is_null(), "the templates: {}", render["render_error"]);
        let invalid = render["invalid"].as_array().context("invalid")?;
        ensure!(invalid.is_empty(), "invalid against the Kubernetes API schemas: {invalid:?}");
        Ok(render["objects"].as_array().context("objects")?.clone())
    };
    let expected = objects("expected").context("today's chart with the old values")?;
    let upgrade = objects("upgrade")?;
    if upgrade != expected {
        let differ: Vec<String> = upgrade
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("{}\n  upgrade:  {}\n  expected: {}", a["template"], a, b))
            .collect();
        bail!(
            "the upgrade renders other objects than today's chart with the old values ({} \
             against {}): a template's fallback differs from values.yaml's default:\n{}",
            upgrade.len(),
            expected.len(),
            differ.join("\n")
        );
    }
    Ok(())
}

/// The field `key` (`version`, `appVersion`, `name`) of Chart.yaml's text.
fn semver(v: &str) -> Result<(u64, u64, u64)> {
    let parts: Vec<u64> = v.split('.').map(str::parse).collect::<Result<_, _>>()?;
    match parts[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => bail!("version {v:?} is not MAJOR.MINOR.PATCH"),
    }
}

/// Chart.yaml's `version` moves with every change under the chart: no commit after the one that
/// last set it, and no uncommitted change, touches a packaged file unless the version changes
/// too, and upward; `appVersion` is the exporter's version (the image's tag).
pub fn check_version(root: &Path) -> Result<String> {
    let chart_yaml = format!("{CHART}/Chart.yaml");
    let today = fs::read_to_string(root.join(&chart_yaml))?;
    let version = field(&today, "version")?;
    let app = field(&today, "appVersion")?;
    let exporter = env!("CARGO_PKG_VERSION");
    ensure!(app == exporter, "Chart.yaml's appVersion is {app}, the exporter's version {exporter}");
    ensure!(
        git(root, &["rev-parse", "--is-shallow-repository"])? == "false",
        "a shallow clone cannot tell when the chart's version last moved: clone the whole history"
    );
    let committed = git(root, &["show", &format!("HEAD:{chart_yaml}")])?;
    let at_head = field(&committed, "version")?;
    if version != at_head {
        ensure!(
            semver(version)? > semver(at_head)?,
            "Chart.yaml's version goes from {at_head} to {version}: down"
        );
        return Ok(format!("version {version}, raised from {at_head} (not yet committed)"));
    }
    // The commit that last changed the version line.
    let set = git(root, &["log", "-1", "--format=%H", "-G", "^version:", "--", &chart_yaml])?;
    ensure!(!set.is_empty(), "no commit sets {chart_yaml}'s version");
    let packaged = ["--".to_owned(), CHART.to_owned(), format!(":(exclude){CHART}/{NOT_PACKAGED}")];
    let mut args = vec!["log", "--format=%h %s"];
    let range = format!("{set}..HEAD");
    args.push(&range);
    args.extend(packaged.iter().map(String::as_str));
    let since = git(root, &args)?;
    let mut status = vec!["status", "--porcelain"];
    status.extend(packaged.iter().map(String::as_str));
    let uncommitted = git(root, &status)?;
    ensure!(
        since.is_empty() && uncommitted.is_empty(),
        "the chart changed since {} set version {version}; raise `version` in {chart_yaml}:\n{}{}",
        &set[..7],
        since,
        if uncommitted.is_empty() {
            String::new()
        } else {
            format!("\nuncommitted:\n{uncommitted}")
        }
    );
    Ok(format!(
        "version {version}, set by {}, nothing under the chart changed since; appVersion \
         {app} is the exporter's",
        &set[..7]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_versions_compare_as_semver() {
        assert!(semver("0.10.0").unwrap() > semver("0.9.1").unwrap());
        assert!(semver("1.0").is_err());
    }
}
