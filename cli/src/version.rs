//! What `--version` prints and `amd_hsmp_build_info` exports, recorded by `build.rs`.
//!
//! The shape is node_exporter's (Prometheus' `common/version`), with the Rust compiler in place
//! of Go's:
//!
//! ```text
//! amd-hsmp-exporter, version 0.1.0 (branch: main, revision: 0123456789ab)
//!   build user:       root@builder
//!   build date:       20261201-09:24:42
//!   rustc version:    1.88.0
//!   platform:         x86_64-unknown-linux-gnu
//! ```

/// The workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Git revision, 12 hex digits: `AMD_HSMP_REVISION` at build time, else git, else `unknown`.
pub const REVISION: &str = env!("AMD_HSMP_REVISION");
/// Git branch: `AMD_HSMP_BRANCH` at build time, else git, else `unknown`.
pub const BRANCH: &str = env!("AMD_HSMP_BRANCH");
/// `user@host` of the build, or `AMD_HSMP_BUILD_USER`, or `unknown` in a reproducible build.
pub const BUILD_USER: &str = env!("AMD_HSMP_BUILD_USER");
/// Build date (UTC, `YYYYMMDD-HH:MM:SS`): `SOURCE_DATE_EPOCH` when set, else when built.
pub const BUILD_DATE: &str = env!("AMD_HSMP_BUILD_DATE");
/// The compiler's version number, e.g. `1.88.0`.
pub const RUSTVERSION: &str = env!("AMD_HSMP_RUSTVERSION");
/// The target triple built for.
pub const PLATFORM: &str = env!("AMD_HSMP_TARGET");

/// The `--version` text for `program`, ending in a newline.
pub fn report(program: &str) -> String {
    format!(
        "{program}, version {VERSION} (branch: {BRANCH}, revision: {REVISION})\n  \
         build user:       {BUILD_USER}\n  \
         build date:       {BUILD_DATE}\n  \
         rustc version:    {RUSTVERSION}\n  \
         platform:         {PLATFORM}\n"
    )
}

/// One line for a start-up log record: `0.1.0 (revision 0123456789ab, rustc 1.88.0)`.
pub fn summary() -> String {
    format!("{VERSION} (revision {REVISION}, rustc {RUSTVERSION})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_report_has_node_exporter_shape() {
        let report = report("amd-hsmp-broker");
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 5, "{report}");
        assert_eq!(
            lines[0],
            format!("amd-hsmp-broker, version {VERSION} (branch: {BRANCH}, revision: {REVISION})")
        );
        for (line, key) in
            lines[1..].iter().zip(["build user:", "build date:", "rustc version:", "platform:"])
        {
            let value = line
                .strip_prefix("  ")
                .and_then(|l| l.strip_prefix(key))
                .unwrap_or_else(|| panic!("{line:?} is not `  {key} ...`"));
            assert_eq!(value.len() - value.trim_start().len() + key.len(), 18, "{line:?}");
            assert!(!value.trim().is_empty(), "{line:?}");
        }
    }

    #[test]
    fn build_facts_are_recorded() {
        assert!(!REVISION.is_empty() && !REVISION.contains(char::is_whitespace), "{REVISION}");
        // `YYYYMMDD-HH:MM:SS`
        let (day, clock) = BUILD_DATE.split_once('-').unwrap();
        assert!(day.len() == 8 && day.bytes().all(|b| b.is_ascii_digit()), "{BUILD_DATE}");
        assert_eq!(clock.len(), 8, "{BUILD_DATE}");
        assert_eq!(RUSTVERSION.split('.').count(), 3, "{RUSTVERSION}");
        assert!(PLATFORM.contains("linux"), "{PLATFORM}");
    }
}
