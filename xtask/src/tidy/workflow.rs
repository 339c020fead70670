//! The GitHub workflows against the release they publish: the release is built by
//! `cargo xtask release` alone, what it pushes and uploads carries the names that command writes
//! (the versions read from Cargo.toml and Chart.yaml), the image goes where the chart's default
//! points, and every action is pinned by commit.

use serde_norway::Value;
use std::path::Path;

const WORKFLOWS: &str = ".github/workflows";
const RELEASE: &str = ".github/workflows/release.yml";
/// The build step's command: the one CI runs as `--dry-run`, writing into the folder the workflow
/// uploads.
const BUILD: &str = "cargo xtask release --out target/dist";
const OUT: &str = "target/dist";
/// The only cargo commands a workflow runs.
const CARGO_ALLOWED: [&str; 3] =
    ["cargo xtask release ", "cargo xtask deps", "cargo xtask changelog --notes "];
/// Commands that build (first words): the release builds nothing outside `cargo xtask release`.
const BUILDERS: [&str; 14] = [
    "cargo build",
    "cargo install",
    "cargo deb",
    "cargo auditable",
    "cargo rustc",
    "docker build",
    "docker buildx",
    "podman build",
    "buildah",
    "helm package",
    "helm push",
    "oras push",
    "rpmbuild",
    "make",
];

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every step of every job, with its job's name.
fn steps(workflow: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for (job, spec) in workflow["jobs"].as_mapping().into_iter().flatten() {
        for step in spec["steps"].as_sequence().into_iter().flatten() {
            out.push((job.as_str().unwrap_or_default().to_owned(), step));
        }
    }
    out
}

/// The commands of a `run:` script: continuation lines joined, comments and blank lines left
/// out, leading `NAME=value` assignments removed.
fn commands(script: &str) -> Vec<String> {
    let joined = script.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words: Vec<&str> = l.split_whitespace().filter(|w| *w != "\\").collect();
            while words.first().is_some_and(|w| {
                w.split_once('=').is_some_and(|(name, _)| {
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                })
            }) {
                words.remove(0);
            }
            words.join(" ")
        })
        .collect()
}

/// The commands of every step of `workflow`.
fn all_commands(workflow: &Value) -> Vec<String> {
    steps(workflow).iter().filter_map(|(_, s)| s["run"].as_str()).flat_map(commands).collect()
}

/// What is wrong with how `workflow` builds: its step `release` must run [`BUILD`] and no other
/// cargo command; no step may run another build, or a cargo command outside [`CARGO_ALLOWED`].
fn build_problems(workflow: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let release: Vec<&Value> =
        steps(workflow).into_iter().map(|(_, s)| s).filter(|s| s["id"] == "release").collect();
    match release[..] {
        [step] => {
            let cargo: Vec<String> = commands(step["run"].as_str().unwrap_or_default())
                .into_iter()
                .filter(|c| c.starts_with("cargo "))
                .collect();
            if cargo != [BUILD] {
                problems.push(format!("the step `release` runs {cargo:?}, not [{BUILD:?}]"));
            }
        }
        _ => problems.push(format!("{} steps of id `release`, not one", release.len())),
    }
    for command in all_commands(workflow) {
        if command.starts_with("cargo ") && !CARGO_ALLOWED.iter().any(|a| command.starts_with(a)) {
            problems.push(format!("a cargo command other than xtask's: {command}"));
        }
        let words: Vec<&str> = command.split_whitespace().collect();
        for builder in BUILDERS {
            let b: Vec<&str> = builder.split(' ').collect();
            if words.windows(b.len()).any(|w| *w == b[..]) {
                problems.push(format!("builds outside `cargo xtask release`: {command}"));
            }
        }
    }
    if all_commands(workflow).iter().filter(|c| c.contains("cargo xtask release")).count() != 1 {
        problems.push("`cargo xtask release` runs other than once".into());
    }
    problems
}

/// The `uses:` of `text` that are not an action pinned by a full commit SHA with its version in a
/// comment (`owner/repo@<40 hex> # vX.Y.Z`).
fn unpinned(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().trim_start_matches("- ").strip_prefix("uses:"))
        .map(str::trim)
        .filter(|uses| {
            let (action, comment) = uses.split_once(" # ").unwrap_or((uses, ""));
            let sha = action.rsplit_once('@').map(|(_, r)| r).unwrap_or_default();
            let pinned = sha.len() == 40 && sha.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
            !(pinned && comment.starts_with('v'))
        })
        .map(str::to_owned)
        .collect()
}

/// The file names `cargo xtask release` writes (the workflow names some one by one; the rest go
/// up with the folder).
fn artifacts(version: &str, chart: &str) -> Vec<String> {
    crate::release::artifacts(version, chart)
}

/// The files of `dist/` the commands of `workflow` name, with `${VERSION}` and `${CHART_VERSION}`
/// replaced.
fn named_in_dist(workflow: &Value, version: &str, chart: &str) -> Vec<String> {
    let mut names = Vec::new();
    for command in all_commands(workflow) {
        let command = command.replace("${VERSION}", version).replace("${CHART_VERSION}", chart);
        for word in command.split_whitespace() {
            let word = word.trim_matches(|c| c == '"' || c == '\'');
            if let Some((_, name)) = word.split_once("dist/") {
                names.push(name.trim_matches(|c| c == '"' || c == '\'').to_owned());
            }
        }
    }
    names
}

fn workflow(root: &Path) -> Value {
    serde_norway::from_str(&read(root, RELEASE)).unwrap()
}

/// The versions the release is of: the workspace's (Cargo.toml, as xtask is built with it) and
/// the chart's (Chart.yaml, as its version check reads it).
fn versions(root: &Path) -> (String, String) {
    let chart_yaml = read(root, &format!("{}/Chart.yaml", crate::workspace::CHART));
    let chart = crate::workspace::chart_field(&chart_yaml, "version").unwrap().to_owned();
    (env!("CARGO_PKG_VERSION").to_owned(), chart)
}

#[test]
fn the_release_is_built_by_cargo_xtask_release_alone() {
    let root = crate::workspace::root();
    let workflow = workflow(&root);
    let problems = build_problems(&workflow);
    assert!(problems.is_empty(), "{RELEASE}: {problems:?}");
    // The folder it writes is the one uploaded.
    let uploads: Vec<&Value> = steps(&workflow)
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact@")))
        .collect();
    assert_eq!(uploads.len(), 1);
    let paths = uploads[0]["with"]["path"].as_str().unwrap();
    assert!(paths.lines().any(|l| l.trim() == OUT), "uploads {paths:?}, not {OUT}");
}

#[test]
fn a_workflow_that_builds_otherwise_is_refused() {
    let workflow = |steps: &str| -> Value {
        serde_norway::from_str(&format!("jobs:\n  b:\n    steps:\n{steps}")).unwrap()
    };
    let good = workflow(&format!("      - id: release\n        run: KEY=k {BUILD}\n"));
    assert!(build_problems(&good).is_empty(), "{:?}", build_problems(&good));
    for bad in [
        "      - id: release\n        run: cargo xtask release --dry-run\n".to_owned(),
        format!(
            "      - id: release\n        run: |\n          cargo build --release\n          {BUILD}\n"
        ),
        format!(
            "      - id: release\n        run: {BUILD}\n      - run: helm package deploy/helm/x\n"
        ),
        format!(
            "      - id: release\n        run: {BUILD}\n      - run: docker \\\n          build .\n"
        ),
        format!("      - run: {BUILD}\n"),
    ] {
        assert!(!build_problems(&workflow(&bad)).is_empty(), "accepted: {bad}");
    }
}

#[test]
fn the_release_publishes_what_cargo_xtask_release_names() {
    let root = crate::workspace::root();
    let (version, chart) = versions(&root);
    let workflow = workflow(&root);
    let expected = artifacts(&version, &chart);
    let named = named_in_dist(&workflow, &version, &chart);
    let unknown: Vec<&String> =
        named.iter().filter(|n| !n.contains('*') && !expected.contains(n)).collect();
    assert!(unknown.is_empty(), "{RELEASE} names files the release does not write: {unknown:?}");
    // What is pushed, signed and indexed, by name; the rest goes up as `dist/*`.
    use crate::release::names;
    let published = [
        names::image(&version),
        names::chart_tgz(&chart),
        names::chart_oci(&chart),
        "SHA256SUMS".into(),
    ];
    for name in &published {
        assert!(named.contains(name), "{RELEASE} does not publish {name}: {named:?}");
    }
    assert!(named.iter().any(|n| n == "*"), "{RELEASE} does not attach dist/* to the release");
    // The image goes where the chart's default points; the chart beside it, under charts/.
    let values: Value =
        serde_norway::from_str(&read(&root, &format!("{}/values.yaml", crate::workspace::CHART)))
            .unwrap();
    let repository = values["image"]["repository"].as_str().unwrap();
    let env = &workflow["jobs"]["publish"]["env"];
    assert_eq!(env["IMAGE"].as_str(), Some(repository));
    let (registry, _) = repository.rsplit_once('/').unwrap();
    let chart_yaml = read(&root, &format!("{}/Chart.yaml", crate::workspace::CHART));
    let name = crate::workspace::chart_field(&chart_yaml, "name").unwrap();
    assert_eq!(env["CHART"].as_str(), Some(format!("{registry}/charts/{name}").as_str()));
}

/// The build job's step `versions` gives the publish job the versions the release is of.
#[test]
fn the_release_reads_the_versions_as_xtask_does() {
    let root = crate::workspace::root();
    let (version, chart) = versions(&root);
    let workflow = workflow(&root);
    let step = steps(&workflow).into_iter().map(|(_, s)| s).find(|s| s["id"] == "versions");
    let script = step.expect("a step `versions`")["run"].as_str().unwrap().to_owned();
    let output = tempfile::NamedTempFile::new().unwrap();
    let status = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("GITHUB_REF_NAME", format!("v{version}"))
        .env("GITHUB_OUTPUT", output.path())
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(status.success());
    let written = std::fs::read_to_string(output.path()).unwrap();
    assert_eq!(written, format!("version={version}\nchart-version={chart}\n"));
}

#[test]
fn every_action_is_pinned_by_a_commit() {
    let root = crate::workspace::root();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join(WORKFLOWS)).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        checked += text.matches("uses:").count();
        let unpinned = unpinned(&text);
        assert!(unpinned.is_empty(), "{}: not pinned by commit: {unpinned:?}", path.display());
    }
    assert!(checked >= 5, "read only {checked} uses:");
    let text = "    - uses: actions/checkout@v4\n      uses: a/b@0123456789abcdef0123456789abcdef01234567\n\
                - uses: a/b@0123456789abcdef0123456789abcdef01234567 # v1.2.3\n\
                - uses: a/b@0123456789ABCDEF0123456789abcdef01234567 # v1\n";
    assert_eq!(
        unpinned(text),
        [
            "actions/checkout@v4",
            "a/b@0123456789abcdef0123456789abcdef01234567",
            "a/b@0123456789ABCDEF0123456789abcdef01234567 # v1"
        ]
    );
}

/// The workflows against SchemaStore's schema of GitHub workflows (check-jsonschema's copy).
#[test]
#[ignore = "needs the lint venv: cargo xtask test runs it"]
fn the_workflows_are_valid_github_workflows() {
    let root = crate::workspace::root();
    let mut files: Vec<_> = std::fs::read_dir(root.join(WORKFLOWS))
        .unwrap()
        .map(|e| e.unwrap().path().into_os_string())
        .collect();
    files.sort();
    files.insert(0, "--builtin-schema".into());
    files.insert(1, "vendor.github-workflows".into());
    super::check_jsonschema(files);
}
