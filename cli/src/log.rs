//! Log records in the shape of Prometheus' own tools (`promslog`, Go's `log/slog`): one record
//! per line on standard error, as logfmt or JSON.
//!
//! ```text
//! time=2026-12-01T09:24:42.197Z level=INFO source=main.rs:98 msg=listening address=127.0.0.1:10054
//! {"time":"2026-12-01T09:24:42.197318Z","level":"INFO","source":"main.rs:98","msg":"listening","address":"127.0.0.1:10054"}
//! ```
//!
//! Keys come in that order: `time` (UTC; milliseconds in logfmt, up to nanoseconds with the
//! trailing zeros dropped in JSON, as slog writes them), `level` (`DEBUG`, `INFO`, `WARN`,
//! `ERROR`), `source` (the file's base name and line, as promslog truncates it), `msg`, then the
//! event's fields in the order they were written. A logfmt value is quoted (JSON string
//! escaping) when it is empty or holds a space, `=`, `"` or a control character, so no value can
//! start a line of its own. Neither format ever writes colour codes. Span fields are not written:
//! neither binary opens spans.

use std::fmt;
use std::io::Write as _;
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::subscriber::{Interest, SetGlobalDefaultError};
use tracing::{Event, Level, Metadata, Subscriber};

mod json;
mod time;

/// `--log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    /// Everything, including each reconnect attempt and each refused peer.
    Debug,
    /// Start-up, listening, peers and broker lost and found again.
    Info,
    /// Problems that cost telemetry.
    Warn,
    /// Only what stops the process.
    Error,
}

impl LogLevel {
    /// The matching `tracing` level.
    pub fn as_tracing(self) -> Level {
        match self {
            LogLevel::Debug => Level::DEBUG,
            LogLevel::Info => Level::INFO,
            LogLevel::Warn => Level::WARN,
            LogLevel::Error => Level::ERROR,
        }
    }
}

/// `--log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `key=value` pairs, as Prometheus and node_exporter log by default.
    #[value(alias = "text")]
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// Installs the process-wide subscriber: records at `level` and above, in `format`, on standard
/// error. Fails only when a subscriber is already installed.
pub fn init(level: LogLevel, format: LogFormat) -> Result<(), SetGlobalDefaultError> {
    tracing::subscriber::set_global_default(subscriber(level, format, std::io::stderr()))
}

/// The subscriber [`init`] installs, writing each record with one write to `writer` (tests pass
/// a buffer).
pub fn subscriber<W>(level: LogLevel, format: LogFormat, writer: W) -> Promslog<W>
where
    W: Send + Sync + 'static,
    for<'w> &'w W: std::io::Write,
{
    Promslog { level: level.as_tracing(), format, writer }
}

/// The subscriber: one promslog-shaped line per event at its level or above. Spans are not
/// recorded (neither binary opens any; a library's span gets an id and nothing else).
#[derive(Debug)]
pub struct Promslog<W> {
    level: Level,
    format: LogFormat,
    writer: W,
}

impl<W> Promslog<W> {
    fn line(&self, event: &Event<'_>) -> String {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let source = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => {
                let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
                format!("{base}:{line}")
            }
            (Some(file), None) => file.to_owned(),
            _ => meta.target().to_owned(),
        };
        let record = Record { time: SystemTime::now(), level: *meta.level(), source, fields };
        let mut line = match self.format {
            LogFormat::Logfmt => record.logfmt(),
            LogFormat::Json => record.json(),
        };
        line.push('\n');
        line
    }
}

impl<W> Subscriber for Promslog<W>
where
    W: Send + Sync + 'static,
    for<'w> &'w W: std::io::Write,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.enabled(meta) { Interest::always() } else { Interest::never() }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        *meta.level() <= self.level
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(self.level.into())
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &SpanRecord<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        // A record that cannot be written is lost, as with any logger writing to stderr.
        let _ = (&self.writer).write_all(self.line(event).as_bytes());
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// One value of an event field.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

impl Value {
    fn logfmt(&self, out: &mut String) {
        match self {
            Value::Str(s) => quote_if_needed(s, out),
            Value::I64(n) => out.push_str(&n.to_string()),
            Value::U64(n) => out.push_str(&n.to_string()),
            Value::F64(n) => quote_if_needed(&n.to_string(), out),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }

    fn json(&self, out: &mut String) {
        match self {
            Value::Str(s) => json::string(s, out),
            Value::I64(n) => out.push_str(&n.to_string()),
            Value::U64(n) => out.push_str(&n.to_string()),
            // NaN and infinities have no JSON number; slog writes an error there, this the text.
            Value::F64(n) if n.is_finite() => json::number(*n, out),
            Value::F64(n) => json::string(&n.to_string(), out),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
}

/// The message and the other fields of an event, in the order written.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::Str(s) => s,
                other => format!("{other:?}"),
            };
        } else {
            self.pairs.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::Str(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
}

/// An event with what promslog adds to it.
#[derive(Debug)]
struct Record {
    time: SystemTime,
    level: Level,
    source: String,
    fields: Fields,
}

impl Record {
    fn logfmt(&self) -> String {
        let mut out = String::with_capacity(128);
        out.push_str("time=");
        out.push_str(&time::rfc3339_millis(self.time));
        out.push_str(" level=");
        out.push_str(level_name(self.level));
        out.push_str(" source=");
        quote_if_needed(&self.source, &mut out);
        out.push_str(" msg=");
        quote_if_needed(&self.fields.message, &mut out);
        for (key, value) in &self.fields.pairs {
            out.push(' ');
            out.push_str(key);
            out.push('=');
            value.logfmt(&mut out);
        }
        out
    }

    /// Written pair by pair, in the order promslog writes them.
    fn json(&self) -> String {
        let mut out = String::with_capacity(160);
        let head = [
            ("time", json_time(self.time)),
            ("level", level_name(self.level).to_owned()),
            ("source", self.source.clone()),
            ("msg", self.fields.message.clone()),
        ];
        for (key, value) in head {
            out.push(if out.is_empty() { '{' } else { ',' });
            json::string(key, &mut out);
            out.push(':');
            json::string(&value, &mut out);
        }
        for (key, value) in &self.fields.pairs {
            out.push(',');
            json::string(key, &mut out);
            out.push(':');
            value.json(&mut out);
        }
        out.push('}');
        out
    }
}

/// slog's level names; `TRACE` is slog's `DEBUG-4`.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "DEBUG-4",
    }
}

/// RFC 3339 with nanoseconds, trailing zeros dropped (Go's `time.RFC3339Nano`).
fn json_time(time: SystemTime) -> String {
    let nanos = time::rfc3339_nanos(time);
    let Some((head, fraction)) = nanos.trim_end_matches('Z').split_once('.') else {
        return nanos;
    };
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() { format!("{head}Z") } else { format!("{head}.{fraction}Z") }
}

/// Writes `value` bare, or quoted with JSON string escapes when slog would quote it.
fn quote_if_needed(value: &str, out: &mut String) {
    let needs = value.is_empty()
        || value.chars().any(|c| c == '=' || c == '"' || c.is_whitespace() || c.is_control());
    if needs {
        json::string(value, out);
    } else {
        out.push_str(value);
    }
}

/// The lines `emit` logs on this thread through the [`subscriber`] for `format` at `level`:
/// what a test asserts about a program's log (the `testing` feature; dev-dependencies only).
#[cfg(any(test, feature = "testing"))]
pub fn capture(level: LogLevel, format: LogFormat, emit: impl FnOnce()) -> Vec<String> {
    use std::sync::{Arc, Mutex, PoisonError};

    /// Appends to a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for &Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let buffer = Buffer::default();
    tracing::subscriber::with_default(subscriber(level, format, buffer.clone()), emit);
    let bytes = buffer.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
    String::from_utf8_lossy(&bytes).lines().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A logfmt parser independent of the writer: bare values end at a space; quoted values end
    /// at an unescaped quote and are unescaped as Go's strconv.Unquote would (for what JSON
    /// string escapes produce).
    fn parse_logfmt(line: &str) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        let mut rest = line;
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=').unwrap_or_else(|| panic!("no = in {rest:?}"));
            assert!(!key.is_empty() && !key.contains([' ', '"']), "bad key {key:?} in {line:?}");
            let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
                let mut end = None;
                let mut escaped = false;
                for (i, c) in quoted.char_indices() {
                    match c {
                        _ if escaped => escaped = false,
                        '\\' => escaped = true,
                        '"' => {
                            end = Some(i);
                            break;
                        }
                        _ => {}
                    }
                }
                let end = end.unwrap_or_else(|| panic!("unterminated quote in {line:?}"));
                let raw = &quoted[..end];
                let value: String = serde_json::from_str(&format!("\"{raw}\"")).unwrap();
                (value, &quoted[end + 1..])
            } else {
                let end = after.find(' ').unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            };
            pairs.push((key.to_owned(), value));
            assert!(after.is_empty() || after.starts_with(' '), "no space after a pair: {line:?}");
            rest = after.strip_prefix(' ').unwrap_or(after);
        }
        pairs
    }

    fn keys(pairs: &[(String, String)]) -> Vec<&str> {
        pairs.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn logfmt_line_has_time_level_source_msg_then_the_fields_in_order() {
        let lines = capture(LogLevel::Info, LogFormat::Logfmt, || {
            tracing::info!(
                address = "127.0.0.1:19054",
                sockets = 2_u64,
                simulated = true,
                "listening"
            );
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let pairs = parse_logfmt(&lines[0]);
        assert_eq!(
            keys(&pairs),
            ["time", "level", "source", "msg", "address", "sockets", "simulated"]
        );
        let value = |k: &str| pairs.iter().find(|(key, _)| key == k).unwrap().1.clone();
        let time = value("time");
        assert_eq!(time.len(), "2026-12-01T09:24:42.197Z".len(), "{time}");
        assert!(time.ends_with('Z') && time.as_bytes()[19] == b'.', "{time}");
        humantime::parse_rfc3339(&time).unwrap();
        assert_eq!(value("level"), "INFO");
        assert!(value("source").starts_with("log.rs:"), "{}", value("source"));
        assert_eq!(value("msg"), "listening");
        assert_eq!(value("address"), "127.0.0.1:19054");
        assert_eq!(value("sockets"), "2");
        assert_eq!(value("simulated"), "true");
        assert!(lines[0].contains(" msg=listening address=127.0.0.1:19054 "), "{}", lines[0]);
    }

    #[test]
    fn logfmt_quotes_what_would_break_a_pair_and_a_newline_cannot_start_a_line() {
        let tricky = "a b=c \"d\"\nlevel=ERROR msg=forged";
        let lines = capture(LogLevel::Info, LogFormat::Logfmt, || {
            tracing::warn!(peer = tricky, empty = "", path = %"/run/amd-hsmp/broker.sock", "peer refused");
        });
        assert_eq!(lines.len(), 1, "a field's newline split the record: {lines:?}");
        let pairs = parse_logfmt(&lines[0]);
        assert_eq!(keys(&pairs), ["time", "level", "source", "msg", "peer", "empty", "path"]);
        assert_eq!(pairs[1].1, "WARN");
        assert_eq!(pairs[3].1, "peer refused");
        assert_eq!(pairs[4].1, tricky);
        assert_eq!(pairs[5].1, "");
        assert!(lines[0].contains(" empty=\"\" path=/run/amd-hsmp/broker.sock"), "{}", lines[0]);
    }

    #[test]
    fn json_line_parses_with_promslog_keys_in_order() {
        let lines = capture(LogLevel::Debug, LogFormat::Json, || {
            tracing::debug!(
                uid = 1000_u64,
                delta = -3_i64,
                ratio = 0.5,
                error = "EIO\nsecond",
                "reconnecting"
            );
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&lines[0]).unwrap();
        let order = ["time", "level", "source", "msg", "uid", "delta", "ratio", "error"];
        assert_eq!(object.len(), order.len(), "{}", lines[0]);
        let at: Vec<usize> =
            order.iter().map(|k| lines[0].find(&format!("\"{k}\":")).unwrap()).collect();
        assert!(at.is_sorted(), "keys out of order: {}", lines[0]);
        assert_eq!(object["level"], "DEBUG");
        assert_eq!(object["msg"], "reconnecting");
        assert_eq!(object["uid"], 1000);
        assert_eq!(object["delta"], -3);
        assert_eq!(object["ratio"], 0.5);
        assert_eq!(object["error"], "EIO\nsecond");
        assert!(object["source"].as_str().unwrap().starts_with("log.rs:"));
        let time = object["time"].as_str().unwrap();
        humantime::parse_rfc3339(time).unwrap();
        assert!(time.ends_with('Z') && !time.contains("0Z"), "{time}");
    }

    #[test]
    fn records_below_the_level_are_dropped_and_no_colour_is_written() {
        for format in [LogFormat::Logfmt, LogFormat::Json] {
            let lines = capture(LogLevel::Warn, format, || {
                tracing::info!("hidden");
                tracing::error!(code = 7_u64, "shown");
            });
            assert_eq!(lines.len(), 1, "{format:?}: {lines:?}");
            assert!(lines[0].contains("ERROR") && lines[0].contains("shown"), "{}", lines[0]);
            assert!(!lines[0].contains('\u{1b}'), "colour codes in {format:?}: {:?}", lines[0]);
        }
    }

    #[test]
    fn json_time_drops_trailing_zeros_like_rfc3339nano() {
        let at = |nanos| SystemTime::UNIX_EPOCH + std::time::Duration::new(1_795_000_000, nanos);
        assert_eq!(json_time(at(197_000_000)), "2026-11-18T11:06:40.197Z");
        assert_eq!(json_time(at(0)), "2026-11-18T11:06:40Z");
        assert_eq!(json_time(at(1)), "2026-11-18T11:06:40.000000001Z");
    }

    #[test]
    fn text_is_accepted_as_an_alias_of_logfmt() {
        use clap::ValueEnum as _;
        assert_eq!(LogFormat::from_str("text", false), Ok(LogFormat::Logfmt));
        assert_eq!(LogFormat::from_str("logfmt", false), Ok(LogFormat::Logfmt));
        assert_eq!(LogFormat::from_str("json", false), Ok(LogFormat::Json));
        assert!(LogFormat::from_str("yaml", false).is_err());
    }
}
