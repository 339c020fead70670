//! The properties the fuzz targets check, one function per target, each taking the raw fuzz
//! input. They panic (or, past an allocation budget, abort) when a property fails. The
//! libFuzzer binaries in `cargo-fuzz/` call them; `tests/corpus.rs` replays the committed
//! corpora through them on every `cargo test`. See docs/testing.md.

#![forbid(unsafe_code)]

use amd_hsmp_exporter::budget::{Budget, MIN_SCRAPE_TIMEOUT, requested_timeout};
use amd_hsmp_exporter::http::negotiate;
use amd_hsmp_exporter::metrics::Format;
use amd_hsmp_proto::{FrameError, Message, Reply, Request, Topology};
use std::collections::BTreeSet;
use std::time::Duration;

/// The allocator the targets and the replay install: it counts live bytes and can refuse
/// allocations past a limit.
pub type Alloc = cap::Cap<std::alloc::System>;

/// Live bytes a request frame may cost to read and decode: its payload buffer (at most
/// [`Request::MAX_FRAME`]) and the decoded value, which holds no heap data.
const REQUEST_BUDGET: usize = 2 * Request::MAX_FRAME as usize + 4096;

/// Live bytes a reply frame may cost to read and decode: the payload buffer (at most
/// [`Reply::MAX_FRAME`]), the decoded value (a core is 4 varints on the wire and 16 bytes in
/// memory) and serde's bounded preallocation of a sequence (at most 1 MiB each) for the
/// sequences being decoded at once. A claimed length never costs more than that.
const REPLY_BUDGET: usize = 8 * Reply::MAX_FRAME as usize;

/// Runs `f` with at most `budget` more live bytes than now; an allocation past it fails,
/// which aborts the process with "memory allocation of N bytes failed".
fn within<T>(alloc: &Alloc, budget: usize, f: impl FnOnce() -> T) -> T {
    let limit = alloc.allocated().saturating_add(budget);
    let _ = alloc.set_limit(limit);
    let out = f();
    let _ = alloc.set_limit(usize::MAX);
    out
}

/// Reads one `M` frame from `data`; checks the framing properties: a length above the
/// maximum is refused after its 4-byte prefix, before any payload is read or allocated; what
/// decodes re-encodes to exactly the bytes it was read from; reading and decoding stay within
/// `budget` live bytes.
fn frame<M: Message + std::fmt::Debug>(data: &[u8], alloc: &Alloc, budget: usize) {
    let mut rest = data;
    let read = within(alloc, budget, || M::read(&mut rest));
    let consumed = data.len() - rest.len();
    match read {
        Ok(message) => {
            let frame = message.to_frame().expect("a decoded message encodes");
            assert_eq!(frame, data[..consumed], "{message:?} re-encodes differently");
        }
        Err(FrameError::TooLarge { len, max }) => {
            assert!(len > max, "{len} refused under the maximum {max}");
            assert_eq!(consumed, 4, "the payload of a too-large frame was read");
        }
        Err(_) => {}
    }
}

/// The exporter's `--web.config.file`: any bytes give a configuration or an error, never a
/// panic, and a refused value names its key and says what is wrong. The files it names are
/// looked up in a directory that does not exist, so none is read.
pub fn web_config(data: &[u8], _alloc: &Alloc) {
    use amd_hsmp_web::config::{WebConfigError, from_bytes};
    let path = std::path::Path::new("/nonexistent/amd-hsmp-fuzz/web.yml");
    if let Err(WebConfigError::Invalid { key, message, .. }) = from_bytes(data.to_vec(), path) {
        assert!(!key.is_empty() && !message.is_empty(), "a refusal without its key: {message:?}");
    }
}

/// The broker's side: one request frame.
pub fn frame_request(data: &[u8], alloc: &Alloc) {
    frame::<Request>(data, alloc, REQUEST_BUDGET);
}

/// The exporter's side: one reply frame.
pub fn frame_reply(data: &[u8], alloc: &Alloc) {
    frame::<Reply>(data, alloc, REPLY_BUDGET);
}

/// `X-Prometheus-Scrape-Timeout-Seconds`: never a panic; the timeout is within
/// `MIN_SCRAPE_TIMEOUT ..= max`; a plain number in that range is honoured; the budget's broker
/// deadline comes before its wait, which comes before the timeout.
pub fn timeout_header(data: &[u8], _alloc: &Alloc) {
    let number = std::str::from_utf8(data).ok().and_then(|s| s.trim().parse::<f64>().ok());
    for max in [
        Duration::ZERO,
        MIN_SCRAPE_TIMEOUT,
        Duration::from_secs(10),
        Duration::from_secs(3600),
        Duration::MAX,
    ] {
        let cap = max.max(MIN_SCRAPE_TIMEOUT);
        let timeout = requested_timeout(Some(data), max);
        assert!((MIN_SCRAPE_TIMEOUT..=cap).contains(&timeout), "{timeout:?} for max {max:?}");
        if let Some(s) = number
            && s > MIN_SCRAPE_TIMEOUT.as_secs_f64()
            && s < cap.as_secs_f64()
        {
            let error = (timeout.as_secs_f64() - s).abs();
            assert!(error <= s * 1e-9 + 1e-9, "{s} s became {timeout:?}");
        }
        let budget = Budget::new(Some(data), max);
        assert!(budget.broker_deadline <= budget.wait && budget.wait <= timeout, "{budget:?}");
        let request = Request::sample(amd_hsmp_proto::Families::ALL, budget.broker_deadline);
        assert!(request.deadline() >= Some(Duration::from_millis(1)), "{request:?}");
    }
}

/// `Accept`: never a panic, the same answer every time, and OpenMetrics only when the header
/// names it. The same bytes as `Accept-Encoding` (one value, or two split at the first newline):
/// never a panic, the same answer every time, and gzip only when a value names `gzip` or `*`.
pub fn accept(data: &[u8], _alloc: &Alloc) {
    let values: Vec<&[u8]> = data.splitn(2, |b| *b == b'\n').collect();
    let gzip = amd_hsmp_exporter::gzip::accepts_gzip(values.iter().copied());
    assert_eq!(amd_hsmp_exporter::gzip::accepts_gzip(values.iter().copied()), gzip);
    if gzip {
        let text = String::from_utf8_lossy(data).to_ascii_lowercase();
        assert!(text.contains("gzip") || text.contains('*'), "{text}");
    }
    let Ok(header) = std::str::from_utf8(data) else { return };
    let format = negotiate(Some(header));
    assert_eq!(negotiate(Some(header)), format);
    if format == Format::OpenMetrics {
        assert!(header.to_ascii_lowercase().contains("application/openmetrics-text"), "{header}");
    }
}

/// Most CPUs a topology input describes, to keep one run short.
const MAX_CPUS: usize = 16;

/// The topology parsers, `/proc/cpuinfo` and the sysfs tree, through `discover` on a tree
/// written from the input: NUL-separated, the `cpuinfo` text, then the `online` list (empty:
/// no such file), then `core_id` and `physical_package_id` of `cpu0`, `cpu1`, ... A
/// discovered topology must be consistent: every core on a listed socket and every listed
/// socket with a core, sockets ascending, cores sorted by (socket, core) and unique, APIC ids
/// and CPU numbers unique, each core's threads ascending from its CPU and in no other core.
pub fn topology(data: &[u8], _alloc: &Alloc) {
    if let Some(topology) = discover_from(data) {
        check_topology(&topology);
    }
}

/// The topology `discover` finds in the tree written from a [`topology`] input, if any.
pub fn discover_from(data: &[u8]) -> Option<Topology> {
    let mut parts = data.split(|b| *b == 0);
    let cpuinfo = parts.next().unwrap_or_default();
    let online = parts.next().unwrap_or_default();
    let ids: Vec<&[u8]> = parts.take(2 * MAX_CPUS).collect();
    // In memory where there is a tmpfs: a run writes a whole tree.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.ok()?;
    let (procfs, sysfs) = (dir.path().join("proc"), dir.path().join("sys"));
    let cpus = sysfs.join("devices/system/cpu");
    let write = |path: &std::path::Path, bytes: &[u8]| {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    };
    write(&procfs.join("cpuinfo"), cpuinfo);
    if !online.is_empty() {
        write(&cpus.join("online"), online);
    }
    for (cpu, pair) in ids.chunks(2).enumerate() {
        let topo = cpus.join(format!("cpu{cpu}/topology"));
        write(&topo.join("core_id"), pair[0]);
        if let Some(package) = pair.get(1) {
            write(&topo.join("physical_package_id"), package);
        }
    }
    amd_hsmp_broker::discover_topology(&procfs, &sysfs).ok()
}

/// The consistency of a discovered topology (see [`topology`]).
pub fn check_topology(t: &Topology) {
    assert!(t.sockets.windows(2).all(|w| w[0] < w[1]), "sockets not ascending: {t:?}");
    let with_cores: BTreeSet<u32> = t.cores.iter().map(|c| c.socket).collect();
    assert_eq!(with_cores, t.sockets.iter().copied().collect(), "sockets vs cores: {t:?}");
    let keys: Vec<(u32, u32)> = t.cores.iter().map(|c| (c.socket, c.core)).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "cores not sorted and unique: {t:?}");
    let apic: BTreeSet<u32> = t.cores.iter().map(|c| c.apic_id).collect();
    assert_eq!(apic.len(), t.cores.len(), "APIC ids not unique: {t:?}");
    let cpus: BTreeSet<u32> = t.cores.iter().map(|c| c.cpu).collect();
    assert_eq!(cpus.len(), t.cores.len(), "CPU numbers not unique: {t:?}");
    for c in &t.cores {
        assert_eq!(c.threads.first(), Some(&c.cpu), "a core's first thread is its CPU: {t:?}");
        assert!(c.threads.windows(2).all(|w| w[0] < w[1]), "threads not ascending: {t:?}");
    }
    let threads: BTreeSet<u32> = t.cores.iter().flat_map(|c| c.threads.iter().copied()).collect();
    let listed: usize = t.cores.iter().map(|c| c.threads.len()).sum();
    assert_eq!(threads.len(), listed, "a thread in two cores: {t:?}");
}
