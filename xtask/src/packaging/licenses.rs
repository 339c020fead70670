//! The licenses of the linked crates, as SPDX terms, against what the packages declare.

use crate::workspace::{output, stdout};
use anyhow::{Context, Result, bail, ensure};
use spdx::expression::{ExprNode, Operator};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The license expressions of every crate linked into the two binaries (normal dependencies on
/// x86_64 Linux, proc-macro subtrees excluded, as `%cargo_license` counts them), our own included.
pub(super) fn dependency_licenses(root: &Path) -> Result<BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = output(
        Command::new(cargo)
            .args(["tree", "--locked", "--quiet", "--edges", "normal,no-proc-macro"])
            .args(["--target", "x86_64-unknown-linux-gnu", "--prefix", "none", "--format", "{l}"])
            .args(["--package", "amd-hsmp-broker", "--package", "amd-hsmp-exporter"])
            .current_dir(root),
    )?;
    let mut terms = BTreeSet::new();
    for line in stdout(&out).lines() {
        let expr = line.trim().trim_end_matches("(*)").trim();
        if expr.is_empty() {
            continue;
        }
        terms.extend(license_terms(expr)?);
    }
    ensure!(!terms.is_empty(), "cargo tree listed no license");
    Ok(terms)
}

/// Splits an SPDX expression (as cargo reports it: `/` for OR allowed) into its top-level AND
/// terms, each written one way: the alternatives of an OR sorted and in parentheses, a `WITH`
/// exception after its licence, operators upper-case. An expression that is not SPDX is an error.
pub(super) fn license_terms(expr: &str) -> Result<BTreeSet<String>> {
    let parsed = spdx::Expression::parse_mode(expr, spdx::ParseMode::LAX)
        .with_context(|| format!("not an SPDX license expression: {expr}"))?;
    // Each subexpression as the AND of its terms, each term the set of its OR alternatives.
    let mut stack: Vec<Vec<BTreeSet<String>>> = Vec::new();
    for node in parsed.iter() {
        let value = match node {
            ExprNode::Req(req) => vec![BTreeSet::from([req.req.to_string()])],
            ExprNode::Op(op) => {
                let (Some(rhs), Some(mut lhs)) = (stack.pop(), stack.pop()) else {
                    bail!("{expr}: an operator without two operands");
                };
                match op {
                    Operator::And => {
                        lhs.extend(rhs);
                        lhs
                    }
                    Operator::Or => {
                        vec![alternatives(lhs).into_iter().chain(alternatives(rhs)).collect()]
                    }
                }
            }
        };
        stack.push(value);
    }
    let terms = stack.pop().filter(|_| stack.is_empty());
    let terms = terms.with_context(|| format!("{expr}: not one expression"))?;
    Ok(terms.into_iter().map(|alternatives| written(&alternatives, " OR ")).collect())
}

/// The alternatives of one side of an OR: its own alternatives, or the whole side when it is an
/// AND (written in parentheses).
fn alternatives(side: Vec<BTreeSet<String>>) -> BTreeSet<String> {
    match <[_; 1]>::try_from(side) {
        Ok([one]) => one,
        Err(terms) => {
            let terms: BTreeSet<String> = terms.iter().map(|t| written(t, " OR ")).collect();
            BTreeSet::from([written(&terms, " AND ")])
        }
    }
}

/// Items joined by an operator, in parentheses when there is more than one.
fn written(items: &BTreeSet<String>, op: &str) -> String {
    let joined = items.iter().map(String::as_str).collect::<Vec<_>>().join(op);
    if items.len() > 1 { format!("({joined})") } else { joined }
}

/// The license ids of a set of terms (`LLVM-exception` and the like included).
pub(super) fn license_ids(terms: &BTreeSet<String>) -> BTreeSet<String> {
    terms
        .iter()
        .flat_map(|t| t.split(|c: char| c.is_whitespace() || c == '(' || c == ')'))
        .filter(|w| !w.is_empty() && !["AND", "OR", "WITH"].contains(w))
        .map(String::from)
        .collect()
}

pub(super) fn same_licenses(
    what: &str,
    declared: &BTreeSet<String>,
    linked: &BTreeSet<String>,
) -> Result<()> {
    let missing: Vec<&String> = linked.difference(declared).collect();
    let extra: Vec<&String> = declared.difference(linked).collect();
    ensure!(
        missing.is_empty() && extra.is_empty(),
        "{what} does not match the licenses of the linked crates (cargo tree): missing {missing:?}, \
         not used {extra:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn license_expressions_that_mean_the_same_compare_equal() {
        assert_eq!(
            license_terms("MIT/Apache-2.0").unwrap(),
            license_terms("Apache-2.0 OR MIT").unwrap()
        );
        assert_eq!(license_terms("MIT/Apache-2.0").unwrap(), set(&["(Apache-2.0 OR MIT)"]));
        assert_eq!(
            license_terms("(MIT OR Apache-2.0) AND Unicode-3.0").unwrap(),
            set(&["(Apache-2.0 OR MIT)", "Unicode-3.0"])
        );
        assert_eq!(license_terms("MIT AND BSD-3-Clause").unwrap(), set(&["BSD-3-Clause", "MIT"]));
        assert_eq!(
            license_terms("Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT").unwrap(),
            set(&["(Apache-2.0 OR Apache-2.0 WITH LLVM-exception OR MIT)"])
        );
        assert_eq!(
            license_terms("Apache-2.0 and (MIT or Unlicense)").unwrap(),
            set(&["Apache-2.0", "(MIT OR Unlicense)"])
        );
        assert_eq!(
            license_terms("(MIT AND ISC) OR Apache-2.0").unwrap(),
            set(&["((ISC AND MIT) OR Apache-2.0)"])
        );
    }

    /// SPDX's AND binds tighter than OR: a crate under "Apache-2.0 OR MIT AND ISC" may be taken
    /// under Apache-2.0 alone, so ISC is not a license the package must name on its own.
    #[test]
    fn and_binds_tighter_than_or_in_a_license_expression() {
        assert_eq!(
            license_terms("Apache-2.0 OR MIT AND ISC").unwrap(),
            set(&["((ISC AND MIT) OR Apache-2.0)"])
        );
    }

    #[test]
    fn a_license_string_that_is_not_spdx_is_an_error() {
        for bad in ["MIT OR", "Apache 2 OR MIT", "MIT AND (ISC", "Not-A-License"] {
            let err = license_terms(bad).unwrap_err();
            assert!(err.to_string().contains("not an SPDX license expression"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_license_missing_from_the_declared_set_is_reported() {
        let linked = set(&["MIT", "(Apache-2.0 OR MIT)"]);
        assert!(same_licenses("tag", &set(&["MIT", "(Apache-2.0 OR MIT)"]), &linked).is_ok());
        let err = same_licenses("tag", &set(&["MIT"]), &linked).unwrap_err().to_string();
        assert!(err.contains("missing [\"(Apache-2.0 OR MIT)\"]"), "{err}");
    }

    #[test]
    fn license_ids_include_exceptions() {
        let ids = license_ids(&set(&["(Apache-2.0 OR Apache-2.0 WITH LLVM-exception OR MIT)"]));
        assert_eq!(ids, set(&["Apache-2.0", "LLVM-exception", "MIT"]));
    }
}
