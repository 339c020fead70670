//! Repository-wide checks that run as ordinary tests: toolchain floor, file headers.

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
        let root = crate::root();
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

    /// What the privileged process links is a reviewed list: a crate that joins the broker's
    /// normal dependency closure (a new dependency, or a new transitive one after an update)
    /// fails this test until `broker/dependencies.txt` names it. Names only, so that a patch
    /// release is not a diff; `UPDATE_GOLDEN=1` rewrites the file.
    #[test]
    fn the_brokers_dependencies_are_the_reviewed_list() {
        let root = crate::root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["tree", "--locked", "-e", "normal", "-p", "amd-hsmp-broker", "--prefix", "none"])
            .args(["--target", "x86_64-unknown-linux-gnu", "--format", "{p}"])
            .current_dir(&root)
            .output()
            .expect("cargo tree runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8(out.stdout).unwrap();
        let mut names: Vec<&str> =
            tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        names.sort_unstable();
        names.dedup();
        let listed = names.join("\n") + "\n";
        let path = root.join("broker/dependencies.txt");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &listed).unwrap();
        }
        let reviewed = std::fs::read_to_string(&path).unwrap_or_default();
        let reviewed: Vec<&str> = reviewed.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            reviewed, names,
            "the broker's dependency closure changed; review it and refresh broker/dependencies.txt \
             with UPDATE_GOLDEN=1 cargo test -p xtask tidy"
        );
        assert!(names.len() <= 48, "{} packages in the privileged process", names.len());
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
        let root = crate::root();
        let mut missing = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if path.is_dir() {
                    if !name.starts_with('.') && name != "target" && name != "fixtures" {
                        stack.push(path);
                    }
                } else if name.ends_with(".rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !text.starts_with("//!") {
                        missing.push(path.strip_prefix(&root).unwrap().display().to_string());
                    }
                }
            }
        }
        missing.sort();
        assert!(missing.is_empty(), "files without a leading //! line: {missing:?}");
    }
}
