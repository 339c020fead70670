//! What the privileged process links is a deliberate list. A crate that joins the broker's
//! normal dependency closure (a new dependency, or a new transitive one after an update) fails
//! CI until `broker/dependencies.txt` names it, and only `ACCEPT_BROKER_DEPENDENCIES`, naming
//! each crate it accepts, writes it there: refreshing goldens (`UPDATE_GOLDEN=1`) accepts
//! nothing. Every crate of the workspace that the broker links denies panics as the broker does.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The file that lists the broker's run-time closure, from the workspace root.
const REVIEWED: &str = "broker/dependencies.txt";
/// The switch that accepts crates into the closure: their names, separated by spaces or commas.
const ACCEPT: &str = "ACCEPT_BROKER_DEPENDENCIES";
/// Most packages the privileged process may link, itself and the workspace's crates included.
const MOST: usize = 36;
/// The lints every crate of the privileged process denies outside its tests.
const PANIC_LINTS: [&str; 4] =
    ["clippy::unwrap_used", "clippy::expect_used", "clippy::panic", "clippy::indexing_slicing"];

/// The package names of the broker's normal run-time closure on x86_64 Linux, sorted.
fn broker_closure_by_cargo_tree(root: &Path) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--locked", "-e", "normal", "-p", "amd-hsmp-broker", "--prefix", "none"])
        .args(["--target", "x86_64-unknown-linux-gnu", "--format", "{p}"])
        .current_dir(root)
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names.into_iter().collect()
}

/// Compares the closure with the reviewed list (`listed`, the file's text). `Ok(None)` when they
/// agree; `Ok(Some(text))`, the file to write, when `var(ACCEPT)` names exactly the crates that
/// joined (a crate that left needs the switch too, set empty); an error naming the difference
/// otherwise. `var` reads the environment.
fn review(
    closure: &[String],
    listed: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, String> {
    let listed: BTreeSet<&str> =
        listed.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let now: BTreeSet<&str> = closure.iter().map(String::as_str).collect();
    let joined: Vec<&str> = now.difference(&listed).copied().collect();
    let left: Vec<&str> = listed.difference(&now).copied().collect();
    if joined.is_empty() && left.is_empty() {
        return Ok(None);
    }
    let Some(accepted) = var(ACCEPT) else {
        return Err(format!(
            "the broker's dependency closure changed: joined {joined:?}, left {left:?}. Review \
             what joined, then accept it by name: {ACCEPT}='{}' cargo test -p xtask privileged",
            joined.join(" ")
        ));
    };
    let accepted: BTreeSet<&str> = accepted.split([' ', ',']).filter(|n| !n.is_empty()).collect();
    let unnamed: Vec<&str> = joined.iter().filter(|n| !accepted.contains(*n)).copied().collect();
    let stale: Vec<&&str> = accepted.iter().filter(|n| !joined.contains(n)).collect();
    if !unnamed.is_empty() || !stale.is_empty() {
        return Err(format!(
            "{ACCEPT} must name exactly the crates that joined the broker's closure: \
             joined but not named {unnamed:?}, named but not joined {stale:?}"
        ));
    }
    Ok(Some(now.into_iter().map(|n| format!("{n}\n")).collect()))
}

/// The inner `#![deny(...)]` attributes of a crate root, as one string of their lint lists.
fn denied(lib_rs: &str) -> String {
    let mut lints = String::new();
    let mut rest = lib_rs;
    while let Some(at) = rest.find("#![deny(") {
        let from = at + "#![deny(".len();
        let end = rest[from..].find(")]").map_or(rest.len(), |e| from + e);
        lints.push_str(&rest[from..end]);
        lints.push(',');
        rest = &rest[end..];
    }
    lints
}

/// What the privileged process links is the reviewed list, and no longer than [`MOST`].
#[test]
fn the_brokers_dependencies_are_the_reviewed_list() {
    let root = crate::workspace::root();
    let names = broker_closure_by_cargo_tree(&root);
    let path = root.join(REVIEWED);
    let listed = std::fs::read_to_string(&path).unwrap_or_default();
    match review(&names, &listed, |name| std::env::var(name).ok()) {
        Ok(None) => {}
        Ok(Some(text)) => std::fs::write(&path, text).unwrap(),
        Err(e) => panic!("{e}"),
    }
    assert!(names.len() <= MOST, "{} packages in the privileged process", names.len());
}

fn crates(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn the_golden_switch_does_not_accept_a_new_privileged_dependency() {
    let listed = "anyhow\nlibc\n";
    let golden = |name: &str| (name == "UPDATE_GOLDEN").then(|| "1".to_owned());
    let error = review(&crates(&["anyhow", "libc", "openssl"]), listed, golden).unwrap_err();
    assert!(error.contains("joined [\"openssl\"]"), "{error}");
    assert!(error.contains("ACCEPT_BROKER_DEPENDENCIES='openssl'"), "{error}");
}

#[test]
fn a_joining_crate_is_accepted_only_by_its_name() {
    let listed = "# reviewed\nanyhow\nlibc\n";
    let now = crates(&["anyhow", "libc", "openssl", "openssl-sys"]);
    let accept = |value: &'static str| move |_: &str| Some(value.to_owned());
    let partly = review(&now, listed, accept("openssl")).unwrap_err();
    assert!(partly.contains("joined but not named [\"openssl-sys\"]"), "{partly}");
    let stale = review(&now, listed, accept("openssl,openssl-sys,ring")).unwrap_err();
    assert!(stale.contains("named but not joined [\"ring\"]"), "{stale}");
    let written = review(&now, listed, accept("openssl openssl-sys")).unwrap();
    assert_eq!(written.as_deref(), Some("anyhow\nlibc\nopenssl\nopenssl-sys\n"));
    assert_eq!(review(&now, &written.unwrap(), |_| None), Ok(None));
}

#[test]
fn a_crate_that_leaves_the_closure_is_also_a_reviewed_change() {
    let now = crates(&["anyhow"]);
    let error = review(&now, "anyhow\nlibc\n", |_| None).unwrap_err();
    assert!(error.contains("left [\"libc\"]"), "{error}");
    let empty = |_: &str| Some(String::new());
    assert_eq!(review(&now, "anyhow\nlibc\n", empty), Ok(Some("anyhow\n".to_owned())));
}

/// `unwrap`, `expect`, `panic!` and indexing are denied in each crate of this workspace that the
/// broker links, outside its tests: a panic there is a panic of the privileged process.
#[test]
fn every_workspace_crate_the_broker_links_denies_panics() {
    let root = crate::workspace::root();
    let ours: Vec<String> = broker_closure_by_cargo_tree(&root)
        .into_iter()
        .filter(|n| n.starts_with("amd-hsmp-"))
        .collect();
    assert!(ours.len() >= 4, "the broker links {ours:?}");
    let mut lax = Vec::new();
    for name in &ours {
        let folder = name.trim_start_matches("amd-hsmp-");
        let lib = root.join(folder).join("src/lib.rs");
        let text = std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{lib:?}: {e}"));
        let lints = denied(&text);
        let missing: Vec<&str> = PANIC_LINTS.into_iter().filter(|l| !lints.contains(l)).collect();
        if !missing.is_empty() {
            lax.push(format!("{folder}/src/lib.rs does not deny {missing:?}"));
        }
    }
    assert!(lax.is_empty(), "{lax:#?}");
}

#[test]
fn denied_lints_are_read_from_every_deny_attribute() {
    let text =
        "#![forbid(unsafe_code)]\n#![deny(clippy::panic)]\n#![deny(\n    clippy::unwrap_used\n)]\n";
    let lints = denied(text);
    assert!(lints.contains("clippy::panic") && lints.contains("clippy::unwrap_used"), "{lints}");
    assert!(!lints.contains("unsafe_code"), "{lints}");
}

/// The broker's library exposes its entry points only: at most two public modules (`daemon` and
/// `check`, the two programs'); what other programs take besides is re-exported item by item at
/// its root.
#[test]
fn the_broker_library_exposes_at_most_two_public_modules() {
    let lib = std::fs::read_to_string(crate::workspace::root().join("broker/src/lib.rs")).unwrap();
    let public: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';'))
        .collect();
    assert!(public.len() <= 2, "broker/src/lib.rs exposes {public:?}");
    assert!(public.contains(&"daemon"), "{public:?}");
}
