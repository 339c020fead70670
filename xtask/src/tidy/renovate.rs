//! renovate.json against what it updates: its regex managers still find every pin of
//! xtask/src/deps.rs, its rule for the privileged broker names the broker's dependencies, and the
//! file is valid against the schema of the Renovate release pinned in deps.rs, unknown keys
//! refused.

use serde_json::Value;
use std::path::Path;

const CONFIG: &str = "renovate.json";

fn config(root: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root.join(CONFIG)).unwrap()).unwrap()
}

/// The strings of `value`, an array of strings.
fn strings(value: &Value) -> Vec<&str> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

/// The files under `root` (outside `target/` and hidden folders), relative to it, that match one
/// of `patterns`, Renovate's `managerFilePatterns` in their `/regex/` form.
fn files_matching(root: &Path, patterns: &[&str]) -> Vec<String> {
    let regexes: Vec<regex::Regex> = patterns
        .iter()
        .map(|p| {
            let inner = p.strip_prefix('/').and_then(|p| p.strip_suffix('/'));
            regex::Regex::new(inner.unwrap_or_else(|| panic!("{p} is not /regex/"))).unwrap()
        })
        .collect();
    super::files_with(root, |_| true)
        .iter()
        .filter_map(|f| Some(f.strip_prefix(root).ok()?.to_str()?.to_owned()))
        .filter(|f| regexes.iter().any(|r| r.is_match(f)))
        .collect()
}

/// What the regex managers of `config` extract from the files under `root`, as
/// `depName currentValue` (the name from the match, else the manager's `depNameTemplate`); each
/// manager must find its file and match it at least once.
fn extracted(root: &Path, config: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for manager in config["customManagers"].as_array().unwrap() {
        let files = files_matching(root, &strings(&manager["managerFilePatterns"]));
        assert!(!files.is_empty(), "no file matches {manager}");
        for pattern in strings(&manager["matchStrings"]) {
            let regex = regex::Regex::new(pattern).unwrap();
            let mut matched = 0;
            for file in &files {
                let text = std::fs::read_to_string(root.join(file)).unwrap();
                for captures in regex.captures_iter(&text) {
                    matched += 1;
                    let name = captures
                        .name("depName")
                        .map(|m| m.as_str())
                        .or(manager["depNameTemplate"].as_str())
                        .unwrap_or_else(|| panic!("{pattern} names no dependency"));
                    found.push(format!("{name} {}", &captures["currentValue"]));
                }
            }
            assert!(matched > 0, "{pattern} matches nothing in {files:?}: a renamed constant?");
        }
    }
    found
}

/// Every pin of deps.rs is one Renovate updates: each custom manager matches its file, and
/// together they extract each pinned crate, PyPI package and npm package with its version.
#[test]
fn every_custom_manager_finds_the_pins_it_updates() {
    use crate::deps;
    let root = crate::workspace::root();
    let found = extracted(&root, &config(&root));
    let mut pins: Vec<String> =
        deps::CARGO_TOOLS.iter().map(|(krate, version, _)| format!("{krate} {version}")).collect();
    pins.push(format!("rpmlint {}", deps::RPMLINT_VERSION));
    pins.push(format!("renovate {}", deps::RENOVATE_VERSION));
    for pin in
        [deps::KUBE_VENV_PACKAGES, deps::MIXIN_VENV_PACKAGES, deps::LINT_VENV_PACKAGES].concat()
    {
        pins.push(pin.replacen("==", " ", 1));
    }
    let missing: Vec<&String> = pins.iter().filter(|p| !found.contains(p)).collect();
    assert!(missing.is_empty(), "{CONFIG} updates none of {missing:?}; it finds {found:?}");
}

#[test]
fn a_custom_manager_that_matches_nothing_fails() {
    let root = crate::workspace::root();
    let config = serde_json::json!({"customManagers": [{
        "managerFilePatterns": ["/^xtask/src/deps\\.rs$/"],
        "matchStrings": ["pub const RENAMED_VERSION: &str = \"(?<currentValue>[^\"]+)\";"],
        "depNameTemplate": "x"
    }]});
    let failed = std::panic::catch_unwind(|| extracted(&root, &config));
    assert!(failed.is_err());
}

/// The rule of the privileged broker's dependencies names exactly the crates broker/Cargo.toml
/// depends on (outside the workspace), and never automerges.
#[test]
fn the_brokers_renovate_rule_names_its_dependencies() {
    let root = crate::workspace::root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--no-deps"])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let broker = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "amd-hsmp-broker")
        .unwrap();
    let mut direct: Vec<&str> = broker["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null() && d["path"].is_null())
        .filter_map(|d| d["name"].as_str())
        .collect();
    direct.sort_unstable();
    let config = config(&root);
    let rules: Vec<&Value> = config["packageRules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["labels"]).contains(&"privileged-broker"))
        .collect();
    assert_eq!(rules.len(), 1, "one rule labelled privileged-broker");
    let mut named = strings(&rules[0]["matchPackageNames"]);
    named.sort_unstable();
    assert_eq!(named, direct, "{CONFIG}'s broker rule against broker/Cargo.toml");
    assert_eq!(rules[0]["automerge"], false);
    // A later rule would override it: it is the last.
    assert_eq!(config["packageRules"].as_array().unwrap().last(), Some(rules[0]));
}

/// The keys of `config` that `schema` (Renovate's) does not know: at the top, and in each object
/// or array of objects it has a definition of. Renovate's schema leaves additional properties
/// open, so a misspelt option would pass it and be ignored; `renovate-config-validator --strict`
/// refuses them, as this does.
fn unknown_keys(config: &Value, schema: &Value) -> Vec<String> {
    let top = &schema["properties"];
    let own = |key: &str| -> Option<&Value> {
        let definition = &schema["definitions"][key];
        let item = &definition["items"]["allOf"][0]["properties"];
        let properties =
            if item.is_object() { item } else { &definition["allOf"][0]["properties"] };
        properties.is_object().then_some(properties)
    };
    let mut unknown = Vec::new();
    for (key, value) in config.as_object().into_iter().flatten() {
        if key != "$schema" && top.get(key).is_none() {
            unknown.push(key.clone());
            continue;
        }
        let Some(properties) = own(key) else { continue };
        let objects: Vec<&Value> = match value {
            Value::Array(items) => items.iter().collect(),
            Value::Object(_) => vec![value],
            _ => continue,
        };
        for object in objects {
            for inner in object.as_object().into_iter().flatten().map(|(k, _)| k) {
                if properties.get(inner).is_none() && top.get(inner).is_none() {
                    unknown.push(format!("{key}.{inner}"));
                }
            }
        }
    }
    unknown
}

#[test]
fn misspelt_renovate_options_are_unknown_keys() {
    let schema = serde_json::json!({
        "properties": {"packageRules": {}, "automerge": {}, "extends": {}},
        "definitions": {"packageRules": {"items": {"allOf": [{"properties": {"matchPackageNames": {}}}]}}}
    });
    let config = serde_json::json!({
        "$schema": "x", "extends": [], "automerg": true,
        "packageRules": [{"matchPackageNames": [], "automerge": false, "matchPackageName": []}]
    });
    assert_eq!(unknown_keys(&config, &schema), ["automerg", "packageRules.matchPackageName"]);
}

/// renovate.json against `renovate-schema.json` of the pinned Renovate release: valid (types,
/// enums) by check-jsonschema, and no key the schema does not know.
#[test]
#[ignore = "needs the lint venv and Renovate's schema: cargo xtask test runs it"]
fn renovate_json_is_valid_against_renovates_schema() {
    let root = crate::workspace::root();
    let schema_path = crate::deps::renovate_schema().unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    assert_eq!(schema["x-renovate-version"], crate::deps::RENOVATE_VERSION);
    let unknown = unknown_keys(&config(&root), &schema);
    assert!(unknown.is_empty(), "{CONFIG}: options Renovate does not know: {unknown:?}");
    let schema_file = schema_path.as_os_str();
    super::check_jsonschema([
        std::ffi::OsStr::new("--schemafile"),
        schema_file,
        root.join(CONFIG).as_os_str(),
    ]);
}
