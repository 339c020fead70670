//! Writes the fixture machines' procfs/sysfs trees to `tests/fixtures/<machine>/{proc,sys}`.
//!
//! Run after changing a machine spec or adding a machine, then review and commit the result:
//! `cargo run -p amd-hsmp-e2e --bin gen-fixtures`. An optional argument writes elsewhere.

use anyhow::{Context, Result};
use std::path::PathBuf;

fn main() -> Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(amd_hsmp_e2e::fixtures::fixtures_dir);
    amd_hsmp_e2e::fixtures::write_all(&dir)
        .with_context(|| format!("cannot write the fixture trees under {}", dir.display()))?;
    for name in amd_hsmp_e2e::fixtures::machines().keys() {
        println!("{}", amd_hsmp_e2e::fixtures::tree(&dir, name).display());
    }
    Ok(())
}
