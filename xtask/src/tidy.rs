//! Repository-wide checks that run as ordinary tests: toolchain floor, file headers, what the
//! privileged process links, ARCHITECTURE.md against the code, module graphs without cycles,
//! xtask's functions no longer than a hundred lines, and the release workflow and renovate.json
//! against what they publish and update.

/// The Rust source files under `root` (the workspace, or one crate's `src/`), outside `target/`,
/// hidden folders and the fixture trees, sorted; none for a folder that does not exist.
#[cfg(test)]
fn rust_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    files_with(root, |ext| ext == "rs")
}

/// The files under `root` whose extension `wanted` accepts, outside `target/`, hidden folders
/// and the fixture trees, sorted.
#[cfg(test)]
fn files_with(root: &std::path::Path, wanted: impl Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "fixtures" {
                    stack.push(path);
                }
            } else if path.extension().and_then(|e| e.to_str()).is_some_and(&wanted) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Runs the lint venv's check-jsonschema with `args`; fails with its report when it refuses.
#[cfg(test)]
fn check_jsonschema<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(args: I) {
    let tool = crate::deps::lint_venv().unwrap().join("bin/check-jsonschema");
    let out = std::process::Command::new(&tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod architecture;
#[cfg(test)]
mod figures;
#[cfg(test)]
mod lengths;
#[cfg(test)]
mod modules;
#[cfg(test)]
mod privileged;
#[cfg(test)]
mod renovate;
#[cfg(test)]
mod workflow;

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    /// Parses "1.88" or "1.88.0" into comparable numbers.
    /// `1.88`, `1.88.0` → `[1, 88]`: trailing zero parts do not make a version newer.
    fn version(s: &str) -> Vec<u64> {
        let mut parts: Vec<u64> = s.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        while parts.len() > 1 && parts.last() == Some(&0) {
            parts.pop();
        }
        parts
    }

    fn workspace_rust_version(root: &Path) -> String {
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let line = manifest
            .lines()
            .find(|l| l.trim_start().starts_with("rust-version"))
            .expect("workspace declares rust-version");
        line.split('"').nth(1).expect("quoted rust-version").to_string()
    }

    /// The RPM is built with EL9's rust-toolset (rustc 1.88); no dependency may need more.
    #[test]
    fn no_package_needs_a_newer_rustc_than_the_workspace() {
        let root = crate::workspace::root();
        let floor = workspace_rust_version(&root);
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked"])
            .current_dir(&root)
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let packages = meta["packages"].as_array().expect("packages array");
        let mut offenders = Vec::new();
        let mut checked = 0;
        for package in packages {
            let name = package["name"].as_str().unwrap_or_default();
            if let Some(v) = package["rust_version"].as_str() {
                checked += 1;
                if version(v) > version(&floor) {
                    offenders.push(format!("{name} needs rustc {v}"));
                }
            }
        }
        assert!(checked > 10, "parsed only {checked} packages from cargo metadata");
        assert!(offenders.is_empty(), "above rust-version {floor}: {offenders:?}");
    }

    fn metadata(root: &Path) -> serde_json::Value {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--no-deps"])
            .current_dir(root)
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// ARCHITECTURE.md's crate graph is the workspace's: every member has a line
    /// `folder ──▶ deps` (or a line of its own without an arrow) naming exactly its normal
    /// dependencies inside the workspace, by folder.
    #[test]
    fn architecture_crate_graph_is_the_workspace_graph() {
        use std::collections::BTreeMap;
        let root = crate::workspace::root();
        let meta = metadata(&root);
        let folder_of = |manifest: &str| -> String {
            let dir = Path::new(manifest).parent().unwrap();
            dir.strip_prefix(&root).unwrap().display().to_string()
        };
        let mut actual: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for package in meta["packages"].as_array().unwrap() {
            let folder = folder_of(package["manifest_path"].as_str().unwrap());
            let mut deps: Vec<String> = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["path"].as_str())
                .map(|p| Path::new(p).strip_prefix(&root).unwrap().display().to_string())
                .collect();
            deps.sort();
            actual.insert(folder, deps);
        }
        let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        let section = text.split("\n## Crates\n").nth(1).expect("a Crates section");
        let graph = section.split("```").nth(1).expect("the graph in a code block");
        let mut documented: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in graph.lines().filter(|l| !l.trim().is_empty()) {
            let crate_name = line.split_whitespace().next().unwrap().to_string();
            let deps = match line.split_once("──▶") {
                Some((_, rest)) => {
                    let list = rest.trim_start().split("  ").next().unwrap_or_default();
                    let mut deps: Vec<String> =
                        list.split(',').map(|d| d.trim().to_string()).collect();
                    deps.sort();
                    deps
                }
                None => Vec::new(),
            };
            documented.insert(crate_name, deps);
        }
        assert_eq!(documented, actual, "ARCHITECTURE.md's crate graph against cargo metadata");
    }

    /// Every file ARCHITECTURE.md names exists, and in "A scrape, end to end" every function
    /// or type named before a file, `name (path.rs)`, is a word of that file.
    #[test]
    fn architecture_names_files_that_exist_and_symbols_they_define() {
        let root = crate::workspace::root();
        let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        let mut missing = Vec::new();
        for word in text.split(|c: char| c == '`' || c == '(' || c == ')' || c.is_whitespace()) {
            let word = word.trim_end_matches([',', '.', ';', ':']);
            let is_path = word.contains('/') && word.ends_with(".rs") && !word.starts_with('/');
            if is_path && !word.contains('<') && !root.join(word).exists() {
                missing.push(word.to_string());
            }
        }
        let walk = text.split("## A scrape, end to end").nth(1).expect("the end-to-end walk");
        let walk = walk.split("```").nth(1).expect("the walk in a code block");
        let mut checked = 0;
        for line in walk.lines() {
            let mut rest = line;
            while let Some(open) = rest.find(" (") {
                let Some(close) = rest[open..].find(')') else { break };
                let file = &rest[open + 2..open + close];
                let before = rest[..open].rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
                rest = &rest[open + close + 1..];
                if !file.ends_with(".rs") {
                    continue;
                }
                let name = before.rsplit("::").next().unwrap_or_default();
                let ident =
                    !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
                let source = std::fs::read_to_string(root.join(file)).unwrap_or_default();
                let defined = ident
                    && source
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|w| w == name);
                checked += 1;
                if !defined {
                    missing.push(format!("{before} in {file}"));
                }
            }
        }
        assert!(checked > 20, "read only {checked} references from the walk");
        assert!(missing.is_empty(), "ARCHITECTURE.md names what is not there: {missing:?}");
    }

    #[test]
    fn version_comparison() {
        assert!(version("1.89") > version("1.88"));
        assert!(version("1.88.1") > version("1.88"));
        assert!(version("1.85.0") < version("1.88"));
        // Regression: time 0.3.55 declares 1.88.0, which is not above 1.88.
        assert_eq!(version("1.88.0"), version("1.88"));
        assert!(version("1.88.0") <= version("1.88"));
    }

    /// Every Rust source file says what it is for in its first line.
    #[test]
    fn every_rust_file_starts_with_a_module_doc() {
        let root = crate::workspace::root();
        let mut missing = Vec::new();
        for path in super::rust_files(&root) {
            let text = std::fs::read_to_string(&path).unwrap();
            if !text.starts_with("//!") {
                missing.push(path.strip_prefix(&root).unwrap().display().to_string());
            }
        }
        assert!(missing.is_empty(), "files without a leading //! line: {missing:?}");
    }

    /// The names of the test functions in `source`: each `fn` after a `#[test]` or
    /// `#[tokio::test]` attribute (other attributes and comments may come between).
    fn test_names(source: &str) -> Vec<&str> {
        let mut names = Vec::new();
        let mut attributed = false;
        for line in source.lines().map(str::trim_start) {
            if line.starts_with("#[test]") || line.starts_with("#[tokio::test") {
                attributed = true;
            } else if attributed && let Some(at) = line.find("fn ") {
                let rest = &line[at + 3..];
                let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'));
                names.push(&rest[..end.unwrap_or(rest.len())]);
                attributed = false;
            }
        }
        names
    }

    #[test]
    fn test_names_are_read_past_other_attributes_and_async() {
        let source = "#[test]\nfn plain() {}\nfn helper() {}\n#[tokio::test(start_paused = true)]\n\
                      #[ignore = \"needs root\"]\n// why\npub async fn held() {}\n";
        assert_eq!(test_names(source), ["plain", "held"]);
    }

    /// The documents quote tests by name as the proof of a claim: each name a document quotes
    /// (in backticks, five words or more in snake case, not a metric) is a test of the
    /// workspace, so that a renamed or removed test cannot leave a claim with no proof.
    #[test]
    fn the_documents_quote_only_tests_that_exist() {
        use std::collections::BTreeSet;
        let root = crate::workspace::root();
        let tests: BTreeSet<String> = super::rust_files(&root)
            .iter()
            .flat_map(|path| {
                let text = std::fs::read_to_string(path).unwrap();
                test_names(&text).into_iter().map(str::to_owned).collect::<Vec<_>>()
            })
            .collect();
        let mut documents =
            vec![root.join("ARCHITECTURE.md"), root.join("README.md"), root.join("SECURITY.md")];
        let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        documents.extend(docs);
        let mut quoted = 0;
        let mut missing = Vec::new();
        for document in &documents {
            let text = std::fs::read_to_string(document).unwrap();
            for name in quoted_test_names(&text) {
                quoted += 1;
                if !tests.contains(name) {
                    let file = document.strip_prefix(&root).unwrap().display().to_string();
                    missing.push(format!("{file}: {name}"));
                }
            }
        }
        assert!(quoted > 20, "read only {quoted} quoted test names");
        assert!(missing.is_empty(), "documents quote tests that do not exist: {missing:?}");
    }

    /// The names in `text` quoted in backticks that read as a test's: lower-case snake case of
    /// five words or more, not a metric or a Prometheus label (`amd_hsmp_…`, `process_…`,
    /// `node_…`, `scrape_…`, `__meta_…`).
    fn quoted_test_names(text: &str) -> Vec<&str> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .filter(|w| w.split('_').filter(|part| !part.is_empty()).count() >= 5)
            .filter(|w| {
                !["amd_hsmp_", "process_", "node_", "dcgm_", "scrape_", "_"]
                    .iter()
                    .any(|p| w.starts_with(p))
            })
            .collect()
    }

    #[test]
    fn quoted_test_names_are_long_snake_case_and_not_metrics() {
        let text = "`a_full_scrape_costs_two_messages` `join_or_start` `amd_hsmp_core_energy_joules_total` \
                    `Some_Thing_With_Many_Parts_Here` `cargo test -p x` `a_b_c_d_e` \
                    `scrape_samples_post_metric_relabeling` `__meta_kubernetes_pod_node_name`";
        assert_eq!(quoted_test_names(text), ["a_full_scrape_costs_two_messages", "a_b_c_d_e"]);
    }

    /// No two tests in the workspace share a name, whatever their tier: a name found in a
    /// failure report points at one test, and a unit test and its end-to-end counterpart say in
    /// their names what each adds.
    #[test]
    fn no_two_tests_share_a_name() {
        use std::collections::BTreeMap;
        let root = crate::workspace::root();
        let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in super::rust_files(&root) {
            let text = std::fs::read_to_string(&path).unwrap();
            let file = path.strip_prefix(&root).unwrap().display().to_string();
            for name in test_names(&text) {
                files.entry(name.to_string()).or_default().push(file.clone());
            }
        }
        assert!(files.len() > 500, "found only {} tests", files.len());
        let shared: Vec<_> = files.iter().filter(|(_, in_files)| in_files.len() > 1).collect();
        assert!(shared.is_empty(), "tests of the same name: {shared:?}");
    }
}
