//! What the two binaries' command lines share: `--log.level` and `--log.format` with the log
//! lines Prometheus' own tools write, and `--version` in node_exporter's shape.
//!
//! It also renders an error with its causes ([`chain`]) the one way both binaries log it, and
//! parses the durations of both binaries' flags in Prometheus' grammar ([`duration::parse`]).
//!
//! A crate of its own so that the broker and the exporter say each of these once without either
//! depending on the other, and without putting command-line policy into `proto`, the IPC
//! contract. It depends only on what both binaries already link (clap, tracing): its JSON and
//! RFC 3339 writers are its own, so that the privileged process links no more for its log (no
//! tracing-subscriber, serde_json or humantime).
#![forbid(unsafe_code)]
// Linked into the privileged process: no panics, as the broker.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

pub mod duration;
pub mod error;
pub mod log;
pub mod version;

pub use error::{ErrorChain, chain};
pub use log::{LogFormat, LogLevel};

/// The flags both binaries take besides their own: logging and `--version`. Flattened into each
/// binary's `clap` definition (which sets `disable_version_flag`, since clap's own `--version`
/// cannot print node_exporter's shape).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CommonArgs {
    /// Only log messages with the given severity or above.
    #[arg(long = "log.level", value_name = "LEVEL", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,

    /// Output format of log messages: `logfmt` (`text` is accepted for it) or `json`, one
    /// record per line on standard error.
    #[arg(long = "log.format", value_name = "FORMAT", value_enum, default_value_t = LogFormat::Logfmt)]
    pub log_format: LogFormat,

    /// Print the version, revision, build date and toolchain, then exit.
    #[arg(short = 'V', long = "version")]
    pub version: bool,
}
