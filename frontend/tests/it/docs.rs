//! docs/metrics.md is the contract: its family table must match a real scrape exactly (names,
//! types, label names, HELP texts), in both directions.

use crate::support::*;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default, PartialEq, Eq)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
    help: String,
}

/// The rows of the "Families" table of docs/metrics.md.
fn documented() -> BTreeMap<String, Family> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let text = std::fs::read_to_string(path).unwrap();
    let table = text
        .split("## Families")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/metrics.md has a Families section");
    let mut families = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 6, "row with {} cells: {row}", cells.len());
        let since = cells[5].split('.').map(str::parse::<u32>).collect::<Result<Vec<_>, _>>();
        assert!(
            since.is_ok_and(|parts| parts.len() == 3),
            "the last cell says since which version the family exists, as MAJOR.MINOR.PATCH: {row}"
        );
        let name = cells[0].trim_matches('`').to_owned();
        let labels = cells[2]
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        let family = Family { kind: cells[1].to_owned(), labels, help: cells[3].to_owned() };
        assert!(families.insert(name.clone(), family).is_none(), "{name} listed twice");
    }
    families
}

/// The families of a text-format scrape with every family present.
fn scraped(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            families.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, _) = line.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = families.entry(name.to_owned()).or_default();
            for pair in labels.trim_end_matches('}').split("\",").filter(|p| !p.is_empty()) {
                family.labels.insert(pair.split_once('=').unwrap().0.to_owned());
            }
        }
    }
    families
}

/// A scrape with every family present: every broker family (the per-core frequency limit too,
/// which is off by default) and the core-owner collector on, with an owner of each layout
/// holding a core, so that every identity label is in the scrape.
async fn full_scrape() -> String {
    let dir = socket_dir();
    let behaviour = Behaviour { simulated: Some("turin-2p".into()), ..Behaviour::healthy() };
    let _broker = MockBroker::start(&dir.path, behaviour);
    let cgroups = cgroup_root();
    cgroup(cgroups.path(), "system.slice/slurmstepd.scope/job_1/step_0", "0");
    cgroup(cgroups.path(), "system.slice/slurmstepd.scope/sEKNKTV3WPV500", "1");
    let container = "4f3e2d1c0b9a88776655443322110099aabbccddeeff00112233445566778899";
    let pod = format!("kubepods/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/{container}");
    cgroup(cgroups.path(), &pod, "2");
    cgroup(cgroups.path(), r"machine.slice/machine-qemu\x2d1\x2dvm.scope", "3");
    cgroup(cgroups.path(), "system.slice/nginx.service", "4");
    // Behind a web configuration file, for the refusals counted by the web layer.
    let web_dir = tempfile::tempdir().unwrap();
    let web_config = web_dir.path().join("web.yml");
    std::fs::write(&web_config, "").unwrap();
    let web = amd_hsmp_web::config::WebState::load(&web_config).unwrap();
    let exporter =
        amd_hsmp_exporter::scrape::Exporter::new(owner_config(&dir.path, cgroups.path()));
    let router = amd_hsmp_exporter::http::service(exporter, web);
    let answer = get(&router, "/metrics", None, None).await;
    assert!(answer.body.contains("amd_hsmp_core_owner_info{"), "{}", answer.body);
    answer.body
}

/// The backticked words of `text`.
fn quoted(text: &str) -> BTreeSet<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[tokio::test]
async fn docs_metrics_table_matches_a_full_scrape() {
    let scraped = scraped(&full_scrape().await);
    let documented = documented();

    let only_scraped: Vec<_> = scraped.keys().filter(|k| !documented.contains_key(*k)).collect();
    let only_documented: Vec<_> = documented.keys().filter(|k| !scraped.contains_key(*k)).collect();
    assert!(only_scraped.is_empty(), "families missing from docs/metrics.md: {only_scraped:?}");
    assert!(only_documented.is_empty(), "documented but not exported: {only_documented:?}");
    for (name, family) in &scraped {
        assert_eq!(Some(family), documented.get(name), "docs/metrics.md row of {name}");
    }
}

/// The `collector` values docs/metrics.md lists, in its label table and as the rows of its
/// `amd_hsmp_scrape_errors_total{collector}` section, are those a scrape with every collector
/// on has: a new collector or error source is documented before this passes.
#[tokio::test]
async fn docs_metrics_lists_every_collector_value_a_full_scrape_has() {
    let body = full_scrape().await;
    let scraped: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("amd_hsmp_scrape_errors_total{collector=\""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    assert!(scraped.len() > 5, "{body}");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let text = std::fs::read_to_string(path).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with("| `collector` | `amd_hsmp_scrape_errors_total` |"))
        .expect("docs/metrics.md's label table has the collector row");
    let values = row.rsplit('|').nth(1).unwrap();
    assert_eq!(quoted(values), scraped, "docs/metrics.md's collector label row");
    let section = text
        .split("## `amd_hsmp_scrape_errors_total{collector}`")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/metrics.md has the error counter's section");
    let rows: BTreeSet<String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('`').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(rows, scraped, "docs/metrics.md's rows of amd_hsmp_scrape_errors_total");
}
