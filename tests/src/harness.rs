//! Runs the real `amd-hsmp-broker` (or `amd-hsmp-sim-broker`) and `amd-hsmp-exporter` binaries
//! for a test: locating (and
//! if needed building) them, starting them with kill-on-drop guards (optionally under a lower
//! file-descriptor limit), waiting until they serve, scraping over plain HTTP/1.1 from any
//! loopback address, parsing what they export, and reading their fds and memory from `/proc`.
//!
//! Every child is killed and reaped when its guard drops, including while a failed test
//! unwinds; children also get `PR_SET_PDEATHSIG` (through `setpriv`) so that not even a test
//! process killed outright leaves one behind.

use amd_hsmp_proto::{
    Families, ItemError, Message, PROTOCOL_VERSION, Readings, Reply, Request, Sample, Topology,
};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a process may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `amd-hsmp-broker`.
    pub broker: PathBuf,
    /// `amd-hsmp-sim-broker`: the broker on the simulator (`--simulate PROFILE`).
    pub sim_broker: PathBuf,
    /// `amd-hsmp-exporter`.
    pub exporter: PathBuf,
    /// `amd-hsmp-check`: the checks of a scrape's preconditions, with the broker's flags.
    pub check: PathBuf,
}

impl Binaries {
    /// The broker that takes `args`: `amd-hsmp-sim-broker` if they name a `--simulate` profile,
    /// `amd-hsmp-broker` otherwise.
    pub fn broker_for<S: AsRef<str>>(&self, args: &[S]) -> &Path {
        if args.iter().any(|a| a.as_ref() == "--simulate") {
            &self.sim_broker
        } else {
            &self.broker
        }
    }
}

/// The binaries of the profile this test was built with (`target/<profile>/`), brought up to
/// date once per test process with `$CARGO build`, so a test never runs a stale broker.
pub fn binaries() -> Result<&'static Binaries> {
    static BINARIES: OnceLock<std::result::Result<Binaries, String>> = OnceLock::new();
    BINARIES
        .get_or_init(|| build_binaries().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("cannot build the brokers and amd-hsmp-exporter: {e}"))
}

/// The broker crate's example `name` (in `target/<profile>/examples/`), built once per test
/// process like [`binaries`].
pub fn broker_example(name: &'static str) -> Result<PathBuf> {
    static EXAMPLES: OnceLock<std::sync::Mutex<Vec<(&'static str, PathBuf)>>> = OnceLock::new();
    let examples = EXAMPLES.get_or_init(Default::default);
    let mut built = examples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = built.iter().find(|(n, _)| *n == name) {
        return Ok(path.clone());
    }
    let dir = profile_dir()?;
    cargo_build(&dir, &["-p", "amd-hsmp-broker", "--example", name])?;
    let path = dir.join("examples").join(name);
    if !path.is_file() {
        bail!("{} does not exist after the build", path.display());
    }
    built.push((name, path.clone()));
    Ok(path)
}

/// `target/<profile>/`, where the test executable's `deps/` is.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the test executable")?;
    // target/<profile>/deps/e2e-<hash>
    Ok(exe
        .parent()
        .and_then(Path::parent)
        .context("test executable is not in target/<profile>/deps")?
        .to_path_buf())
}

fn build_binaries() -> Result<Binaries> {
    let dir = profile_dir()?;
    let bins = Binaries {
        broker: dir.join("amd-hsmp-broker"),
        sim_broker: dir.join("amd-hsmp-sim-broker"),
        exporter: dir.join("amd-hsmp-exporter"),
        check: dir.join("amd-hsmp-check"),
    };
    let packages = ["amd-hsmp-broker", "amd-hsmp-sim-broker", "amd-hsmp-exporter"];
    let mut what: Vec<&str> = packages.iter().flat_map(|p| ["-p", p]).collect();
    what.push("--bins");
    cargo_build(&dir, &what)?;
    for bin in [&bins.broker, &bins.sim_broker, &bins.exporter, &bins.check] {
        if !bin.is_file() {
            bail!("{} does not exist after the build", bin.display());
        }
    }
    Ok(bins)
}

/// Set (to `1`) by `cargo xtask test-as-user`, which built this profile's binaries and the
/// broker's examples from this tree before it ran the tests as an ordinary user, who cannot run
/// root's toolchain: the tests use them as they are instead of building.
pub const PREBUILT_VARIABLE: &str = "AMD_HSMP_E2E_PREBUILT";

/// `$CARGO build --quiet <what>` for the profile and target directory of `dir`, unless the
/// caller built them already ([`PREBUILT_VARIABLE`]).
fn cargo_build(dir: &Path, what: &[&str]) -> Result<()> {
    if std::env::var_os(PREBUILT_VARIABLE).is_some_and(|v| v == "1") {
        return Ok(());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]).args(what);
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    // The target directory the test was built in, wherever CARGO_TARGET_DIR points.
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    // The variables cargo sets for this test (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...) would
    // reach build scripts that declare rerun-if-env-changed on them (ring does), so every
    // build from here and every plain cargo build after it would rebuild those crates.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let per_crate = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_"];
        if per_crate.iter().any(|p| name.starts_with(p))
            || name == "CARGO_PRIMARY_PACKAGE"
            || name == "CARGO_TARGET_TMPDIR"
        {
            cmd.env_remove(&*name);
        }
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// A child process that is killed and reaped when dropped. Its standard error goes to a log
/// file, shown when a test fails.
#[derive(Debug)]
pub struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `program args`, logging to `log`.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Proc> {
        Proc::spawn_with_fd_limit(name, program, args, log, None)
    }

    /// Starts `program args` with `RLIMIT_NOFILE` set to `nofile` (soft and hard) if given,
    /// through util-linux `prlimit`, logging to `log`.
    pub fn spawn_with_fd_limit(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        nofile: Option<u64>,
    ) -> Result<Proc> {
        Proc::spawn_full(name, program, args, log, nofile, Stdio::null())
    }

    /// Starts `program args` with `stdin` as its standard input, logging to `log`.
    pub fn spawn_with_stdin(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        stdin: Stdio,
    ) -> Result<Proc> {
        Proc::spawn_full(name, program, args, log, None, stdin)
    }

    fn spawn_full(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        nofile: Option<u64>,
        stdin: Stdio,
    ) -> Result<Proc> {
        let err = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut line: Vec<std::ffi::OsString> = Vec::new();
        if let Some(n) = nofile {
            line.extend(["prlimit".into(), format!("--nofile={n}:{n}").into(), "--".into()]);
        }
        // The death signal survives the exec: if this process dies, so does the child.
        if let Some(setpriv) = setpriv() {
            line.extend([setpriv.into(), "--pdeathsig".into(), "KILL".into(), "--".into()]);
        }
        line.push(program.into());
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]);
        cmd.args(args).stdin(stdin).stdout(err.try_clone()?).stderr(err);
        let child = cmd.spawn().with_context(|| format!("cannot start {}", program.display()))?;
        Ok(Proc { name, child, log })
    }

    /// The process id (wrappers exec the program, so it is the program's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `libc::SIGHUP`) to the process.
    pub fn signal(&self, signal: i32) -> Result<()> {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).context("no pid")?;
        let signal = rustix::process::Signal::from_named_raw(signal).context("unknown signal")?;
        rustix::process::kill_process(pid, signal).context("kill")?;
        Ok(())
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if Instant::now() > until {
                bail!("{} still running {limit:?} later; its log:\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Open file descriptors, from `/proc/PID/fd`.
    pub fn open_fds(&self) -> Result<usize> {
        Ok(std::fs::read_dir(format!("/proc/{}/fd", self.pid()))?.count())
    }

    /// Resident set size in KiB, from `/proc/PID/status`.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS in /proc/PID/status")
    }

    /// What the process wrote to standard error (and output) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `None` while running, else how it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Fails with the process's log if it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exited() {
            None => Ok(()),
            Some(status) => bail!("{} exited ({status}); its log:\n{}", self.name, self.log()),
        }
    }

    /// Kills and reaps the process now; also done on drop.
    pub fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `setpriv` from util-linux, if installed.
fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV.get_or_init(|| which("setpriv")).as_deref()
}

/// The file `name` names in a directory of `PATH`, if there is one.
pub fn which(name: impl AsRef<Path>) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name.as_ref())).find(|p| p.is_file())
}

/// Waits until `ready` holds, polling; fails if `proc` exits first or time runs out.
pub fn wait_until(proc: &mut Proc, what: &str, mut ready: impl FnMut() -> bool) -> Result<()> {
    let until = Instant::now() + START_TIMEOUT;
    loop {
        if ready() {
            return Ok(());
        }
        proc.check_running()?;
        if Instant::now() > until {
            bail!("{what} not ready after {START_TIMEOUT:?}; log:\n{}", proc.log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `amd-hsmp-sim-broker --simulate PROFILE --listen SOCKET` (with `extra` flags), started and
/// waited for until it listens on its socket ([`listening`]). A stale socket file is removed
/// first.
pub fn start_simulated_broker(
    profile: &str,
    socket: &Path,
    extra: &[&str],
    log: PathBuf,
) -> Result<Proc> {
    let _ = std::fs::remove_file(socket);
    let mut args: Vec<String> =
        vec!["--simulate".into(), profile.into(), "--listen".into(), socket.display().to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut broker = Proc::spawn("amd-hsmp-sim-broker", &binaries()?.sim_broker, &args, log)?;
    wait_listening(&mut broker, socket)?;
    Ok(broker)
}

/// Waits until `broker` listens on `socket` ([`listening`]), failing if it exits first or
/// takes longer than a start-up may.
pub fn wait_listening(broker: &mut Proc, socket: &Path) -> Result<()> {
    wait_until(broker, "broker socket", || listening(socket))
}

/// Whether a Unix stream socket bound to `path` listens: connections to it are queued, not
/// refused. The file's existence is not enough: `bind(2)` makes it, and until `listen(2)` a
/// connection is refused (`unix_stream_connect` in the kernel's `net/unix/af_unix.c`: a peer
/// not in `TCP_LISTEN` is `ECONNREFUSED`), so a client sent in that window by a test reads
/// "broker unreachable". `/proc/net/unix` shows the state without connecting: `unix_seq_show`
/// prints `__SO_ACCEPTCON` (`0x10000`) in the Flags column of a listening socket, and the
/// bound path last. Connecting to find out would instead cost the broker a peer that hangs up.
pub fn listening(path: &Path) -> bool {
    const SO_ACCEPTCON: u32 = 0x1_0000;
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else { return false };
    let Some(path) = path.to_str() else { return false };
    let suffix = format!(" {path}");
    table.lines().skip(1).filter(|line| line.ends_with(&suffix)).any(|line| {
        let flags = line.split_whitespace().nth(3);
        flags.and_then(|f| u32::from_str_radix(f, 16).ok()).is_some_and(|f| f & SO_ACCEPTCON != 0)
    })
}

/// `amd-hsmp-exporter` for the broker on `socket`, on a free 127.0.0.1 port, with `extra`
/// flags and (if given) `RLIMIT_NOFILE` set to `nofile`; waits until it answers HTTP. A port
/// taken between picking and binding is retried with another. Logs go to
/// `dir/exporter.<attempt>.log`.
pub fn start_exporter(
    socket: &Path,
    extra: &[String],
    nofile: Option<u64>,
    dir: &Path,
) -> Result<(Proc, SocketAddr)> {
    let mut flags: Vec<String> = vec!["--log.level".into(), "debug".into()];
    flags.extend(extra.iter().cloned());
    start_exporter_from(&binaries()?.exporter, socket, &flags, nofile, dir, "exporter")
}

/// [`start_exporter`] for the exporter binary `exe`, with exactly `flags` besides the address
/// and the socket; logs go to `dir/<name>.<attempt>.log`.
pub fn start_exporter_from(
    exe: &Path,
    socket: &Path,
    flags: &[String],
    nofile: Option<u64>,
    dir: &Path,
    name: &str,
) -> Result<(Proc, SocketAddr)> {
    let mut last = None;
    for attempt in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut args: Vec<String> = vec![
            "--web.listen-address".into(),
            addr.to_string(),
            "--broker.socket".into(),
            socket.display().to_string(),
        ];
        args.extend(flags.iter().cloned());
        let log = dir.join(format!("{name}.{attempt}.log"));
        let mut exporter = Proc::spawn_with_fd_limit("amd-hsmp-exporter", exe, &args, log, nofile)?;
        let up = wait_until(&mut exporter, "exporter", || {
            // Any answer will do; a path that is not served costs no sample (`/` takes one).
            http_get(addr, NOT_SERVED, &[], Duration::from_secs(2)).is_ok()
        });
        match up {
            Ok(()) => return Ok((exporter, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("exporter did not start")))
}

/// Threads of process `pid` now (0 once it is gone), from `/proc/PID/task`.
pub fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// User and system CPU time of process `pid` so far, from `/proc/PID/stat` (in USER_HZ, 100 a
/// second on Linux).
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Held by a test whose claim is a wall-clock bound (a scrape answered in time, a counter read
/// within its wrap window) or that loads the machine (connect loops, floods, many scrapers),
/// so that such tests of one test binary run one at a time: on a loaded 2-core machine they
/// would otherwise slow each other past the bounds they assert. The suite is one test binary
/// (`tests/tests/e2e/`), so this one lock orders all of them; cargo runs the test binaries one
/// after another.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A failed test poisons the lock; the next one still runs alone.
    TIMED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A protocol client of the broker, past the handshake. Tests speak to the broker directly
/// through it; any I/O or protocol error panics, naming what was expected.
#[derive(Debug)]
pub struct BrokerClient(UnixStream);

impl BrokerClient {
    /// Connects to `socket` and shakes hands; each reply is awaited up to `patience`.
    pub fn connect(socket: &Path, patience: Duration) -> BrokerClient {
        let stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(patience)).unwrap();
        let mut client = BrokerClient(stream);
        match client.call(&Request::Hello { protocol_version: PROTOCOL_VERSION }) {
            Reply::Hello { .. } => client,
            other => panic!("expected Hello, got {other:?}"),
        }
    }

    /// One request and its reply.
    pub fn call(&mut self, request: &Request) -> Reply {
        request.write(&mut self.0).unwrap();
        Reply::read(&mut self.0).unwrap()
    }

    /// The broker's topology.
    pub fn topology(&mut self) -> Topology {
        match self.call(&Request::Topology) {
            Reply::Topology(t) => t,
            other => panic!("expected Topology, got {other:?}"),
        }
    }

    /// A sample of `what` with a deadline `deadline_ms` from now.
    pub fn sample(&mut self, what: Families, deadline_ms: u32) -> Sample {
        match self.call(&Request::Sample { what, deadline_ms }) {
            Reply::Sample(sample) => sample,
            other => panic!("expected Sample, got {other:?}"),
        }
    }
}

/// The items of `readings`; panics if the family was not read at all.
pub fn values<T: Clone + std::fmt::Debug>(readings: &Readings<T>) -> Vec<Result<T, ItemError>> {
    match readings {
        Readings::Values(values) => values.clone(),
        other => panic!("expected values, got {other:?}"),
    }
}

/// A path the exporter answers 404 at once, without asking the broker.
pub const NOT_SERVED: &str = "/not-served";

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body, decoded from chunked transfer encoding if needed.
    pub body: String,
    /// From sending the request to the end of the body.
    pub elapsed: Duration,
}

impl Response {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET path` from `addr` with extra `headers`, over HTTP/1.1 with `Connection: close`.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Response> {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    http_exchange(None, addr, request.as_bytes(), timeout)
}

/// A TCP connection to `to` from the local address `from` (e.g. `127.0.0.2`, to act as a
/// distinct client on loopback), or from the default address.
pub fn connect_from(from: Option<IpAddr>, to: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let Some(from) = from else { return Ok(TcpStream::connect_timeout(&to, timeout)?) };
    use rustix::net::{AddressFamily, SocketType, ipproto};
    let family = if from.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let socket = rustix::net::socket(family, SocketType::STREAM, Some(ipproto::TCP))?;
    rustix::net::bind(&socket, &SocketAddr::new(from, 0))
        .with_context(|| format!("cannot bind {from}"))?;
    rustix::net::connect(&socket, &to).with_context(|| format!("cannot connect to {to}"))?;
    let stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Sends the raw `request` bytes (which should ask for `Connection: close`) from `from` to
/// `addr` and reads the response to the end.
pub fn http_exchange(
    from: Option<IpAddr>,
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<Response> {
    let (raw, elapsed) = http_exchange_raw(from, addr, request, timeout)?;
    parse_response(&raw, elapsed)
}

/// As [`http_exchange`], but the response as read, whatever its body (gzip, say), with the
/// time from sending the request to its end.
pub fn http_exchange_raw(
    from: Option<IpAddr>,
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Duration)> {
    let started = Instant::now();
    let mut stream = connect_from(from, addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).context("reading the HTTP response")?;
    Ok((raw, started.elapsed()))
}

/// The samples of an exposition (either format): `name{labels}` exactly as printed → value.
#[derive(Debug, Clone)]
pub struct Exposition {
    /// The text as served.
    pub text: String,
    /// Every sample.
    pub samples: BTreeMap<String, f64>,
}

impl Exposition {
    /// Parses `text`; fails on a line that is not `series value` or a repeated series.
    pub fn parse(text: &str) -> Result<Exposition> {
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').with_context(|| format!("{line:?}"))?;
            let value = value.parse().with_context(|| format!("bad value in {line:?}"))?;
            if samples.insert(series.to_owned(), value).is_some() {
                bail!("duplicate series {series}");
            }
        }
        Ok(Exposition { text: text.to_owned(), samples })
    }

    /// The value of one series, e.g. `amd_hsmp_up` or `amd_hsmp_prochot_active{socket="1"}`.
    pub fn value(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// Number of series of metric `name`.
    pub fn count(&self, name: &str) -> usize {
        self.samples.keys().filter(|k| k.split('{').next() == Some(name)).count()
    }

    /// `amd_hsmp_scrape_errors_total{collector="..."}`, 0 if absent.
    pub fn errors(&self, collector: &str) -> f64 {
        self.value(&format!("amd_hsmp_scrape_errors_total{{collector=\"{collector}\"}}"))
            .unwrap_or(0.0)
    }
}

fn parse_response(raw: &[u8], elapsed: Duration) -> Result<Response> {
    let (status, headers, body) = parse_raw_response(raw)?;
    let body = String::from_utf8(body).context("body is not UTF-8")?;
    Ok(Response { status, headers, body, elapsed })
}

/// Response headers: names lower-cased, in the order received.
pub type Headers = Vec<(String, String)>;

/// A raw HTTP/1.1 response read to the end: status, headers (names lower-cased) and the body
/// bytes, decoded from chunked transfer encoding if needed (not from a content encoding).
pub fn parse_raw_response(raw: &[u8]) -> Result<(u16, Headers, Vec<u8>)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").context("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).context("headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked =
        headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok((status, headers, body))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").context("truncated chunk")?;
        let size_text = std::str::from_utf8(&data[..line_end])?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_bound_but_not_yet_listening_is_not_ready_and_is_once_it_listens() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        use rustix::net::{bind, listen, socket_with};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("with a space.sock");
        // Close-on-exec, as std's sockets are: a child another test spawns meanwhile must not
        // keep it open.
        let fd = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .unwrap();
        bind(&fd, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        // What a broker start-up gate looked at before: the file is there already.
        assert!(path.exists());
        assert!(!listening(&path));
        assert!(UnixStream::connect(&path).is_err(), "connecting before listen(2) is refused");
        listen(&fd, 1).unwrap();
        assert!(listening(&path));
        assert!(UnixStream::connect(&path).is_ok());
        assert!(!listening(&dir.path().join("with a space")), "a path is matched whole");
    }

    #[test]
    fn responses_are_parsed_with_and_without_chunking() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc";
        let r = parse_response(raw, Duration::ZERO).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "abc"));
        assert_eq!(r.header("content-type"), Some("text/plain"));

        let raw = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n\
                    4\r\nwiki\r\n6;x=y\r\npedia \r\n0\r\n\r\n";
        let r = parse_response(raw, Duration::ZERO).unwrap();
        assert_eq!((r.status, r.body.as_str()), (503, "wikipedia "));
    }

    #[test]
    fn truncated_chunks_are_an_error() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort\r\n";
        assert!(parse_response(raw, Duration::ZERO).is_err());
    }

    #[test]
    fn a_dropped_proc_is_killed_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let proc = Proc::spawn(
            "sleep",
            Path::new("/bin/sleep"),
            &["600".into()],
            dir.path().join("sleep.log"),
        )
        .unwrap();
        let pid = proc.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(proc);
        // Reaped, so the pid is gone (not a zombie).
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}

/// A CPU of this machine taken offline through `/sys/devices/system/cpu/cpuN/online`, put back
/// online when dropped (a failing test included). Root only.
#[derive(Debug)]
pub struct OfflineCpu {
    cpu: u32,
}

impl OfflineCpu {
    /// The highest-numbered CPU that can go offline (never CPU 0), or why there is none: not
    /// root, one CPU, or no writable `online` file (a container's read-only sysfs). A CPU left
    /// offline by an earlier run is put back first.
    pub fn candidate() -> std::result::Result<u32, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root: taking a CPU offline needs root".into());
        }
        let present = std::fs::read_to_string("/sys/devices/system/cpu/present")
            .map_err(|e| format!("cannot read the present CPUs: {e}"))?;
        let last = present
            .trim()
            .rsplit([',', '-'])
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| format!("cannot parse the present CPUs {present:?}"))?;
        for cpu in (1..=last).rev() {
            let file = online_file(cpu);
            let Ok(state) = std::fs::read_to_string(&file) else { continue };
            if state.trim() == "0" {
                std::fs::write(&file, "1")
                    .map_err(|e| format!("cannot put CPU {cpu} back: {e}"))?;
            }
            let writable = std::fs::OpenOptions::new().write(true).open(&file).is_ok();
            if writable {
                return Ok(cpu);
            }
        }
        Err("no CPU of this machine can go offline (one CPU, or sysfs read-only)".into())
    }

    /// Takes `cpu` offline.
    pub fn take(cpu: u32) -> Result<OfflineCpu> {
        std::fs::write(online_file(cpu), "0")
            .with_context(|| format!("cannot offline CPU {cpu}"))?;
        Ok(OfflineCpu { cpu })
    }

    /// Puts the CPU back online now (also done on drop).
    pub fn online(self) {}
}

impl Drop for OfflineCpu {
    fn drop(&mut self) {
        // Retried: a CPU that is still going down may refuse for a moment (EBUSY).
        for _ in 0..100 {
            if std::fs::write(online_file(self.cpu), "1").is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "CPU {} could not be put back online: write 1 to {}",
            self.cpu,
            online_file(self.cpu).display()
        );
    }
}

fn online_file(cpu: u32) -> PathBuf {
    PathBuf::from(format!("/sys/devices/system/cpu/cpu{cpu}/online"))
}

/// A broker run as systemd's socket unit runs it (`packaging/systemd/amd-hsmp-broker.socket`):
/// the harness holds the listening socket and passes it (`LISTEN_FDS`) to each broker it starts;
/// a broker that stops for a fresh start (exit status 75, `SuccessExitStatus=` of the unit) is
/// started again on the same socket, so that connections wait in its queue meanwhile instead of
/// being refused. Any other exit ends the supervision.
#[derive(Debug)]
pub struct ActivatedBroker {
    socket: PathBuf,
    state: Arc<Mutex<Activation>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    supervisor: Option<std::thread::JoinHandle<()>>,
}

/// The running broker and what came before it.
#[derive(Debug, Default)]
struct Activation {
    current: Option<Proc>,
    /// Brokers started so far.
    starts: usize,
    /// Exit statuses of the brokers that ended, in order.
    exits: Vec<Option<i32>>,
    /// The logs of the brokers that ended.
    logs: String,
}

impl ActivatedBroker {
    /// Binds `dir/broker.sock` and starts the broker with `args` (no `--listen`) on it.
    pub fn start(args: &[String], dir: &Path) -> Result<ActivatedBroker> {
        let socket = dir.join("broker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .with_context(|| format!("cannot bind {}", socket.display()))?;
        let state = Arc::new(Mutex::new(Activation::default()));
        let spawn = {
            let (args, dir) = (args.to_vec(), dir.to_owned());
            move |n: usize| -> Result<Proc> {
                // The socket becomes descriptor 3 of the broker through its standard input, and
                // LISTEN_PID names the broker itself, as systemd passes it.
                let script = r#"exec 3<&0 </dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#;
                let mut argv = vec!["-c".to_owned(), script.to_owned()];
                argv.push(binaries()?.broker.display().to_string());
                argv.extend(args.iter().cloned());
                let fd = std::os::fd::OwnedFd::from(listener.try_clone()?);
                let log = dir.join(format!("broker.{n}.log"));
                Proc::spawn_with_stdin(
                    "amd-hsmp-broker",
                    Path::new("/bin/sh"),
                    &argv,
                    log,
                    fd.into(),
                )
            }
        };
        let first = spawn(0)?;
        {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.current = Some(first);
            state.starts = 1;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let supervisor = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(proc) = state.current.as_mut() else { return };
                    let Some(status) = proc.exited() else { continue };
                    let log = proc.log();
                    state.logs.push_str(&log);
                    state.exits.push(status.code());
                    state.current = None;
                    if status.code() != Some(75) {
                        return;
                    }
                    let n = state.starts;
                    match spawn(n) {
                        Ok(next) => {
                            state.current = Some(next);
                            state.starts += 1;
                        }
                        Err(e) => {
                            state.logs.push_str(&format!("cannot start the broker again: {e:#}\n"));
                            return;
                        }
                    }
                }
            })
        };
        Ok(ActivatedBroker { socket, state, stop, supervisor: Some(supervisor) })
    }

    /// The socket the exporter connects to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Brokers started so far.
    pub fn starts(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).starts
    }

    /// Exit statuses of the brokers that ended.
    pub fn exits(&self) -> Vec<Option<i32>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).exits.clone()
    }

    /// Every broker's log, the running one's last.
    pub fn log(&self) -> String {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let current = state.current.as_ref().map(Proc::log).unwrap_or_default();
        format!("{}{current}", state.logs)
    }
}

impl Drop for ActivatedBroker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(supervisor) = self.supervisor.take() {
            let _ = supervisor.join();
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut proc) = state.current.take() {
            proc.kill();
        }
    }
}

/// The flags of a real broker on this machine's topology (`/proc`, `/sys`) with no `/dev/hsmp`
/// (`no_hsmp` names a path that does not exist), its PMU described under `pmu`
/// ([`software_pmu`]), reading afresh for every sample, logging JSON.
pub fn this_machine_broker_args(pmu: &Path, no_hsmp: &Path) -> Vec<String> {
    let (pmu, no_hsmp) = (pmu.display().to_string(), no_hsmp.display().to_string());
    [
        "--path.procfs",
        "/proc",
        "--path.sysfs",
        "/sys",
        "--hsmp.device",
        &no_hsmp,
        "--perf.pmu-root",
        &pmu,
        "--sample.max-age",
        "0",
        "--log.format",
        "json",
    ]
    .map(String::from)
    .to_vec()
}

/// A PMU description in `power_core`'s shape under a temporary root, for the real broker on
/// this machine's own CPUs: the software PMU's `cpu-clock` stands in for `energy-core` (every
/// kernel has it; it counts nanoseconds, here read as 2^-32 J, about 0.23 W a CPU). The real
/// `perf_event_open` and `read(2)` then run under the broker's real lockdown.
pub fn software_pmu() -> Result<tempfile::TempDir> {
    let root = tempfile::tempdir()?;
    let pmu = root.path().join("power_core");
    std::fs::create_dir_all(pmu.join("events"))?;
    std::fs::create_dir_all(pmu.join("format"))?;
    let software = std::fs::read_to_string("/sys/bus/event_source/devices/software/type")?;
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    for (file, text) in [
        ("type", software.as_str()),
        ("cpumask", online.as_str()),
        ("events/energy-core", "event=0x00\n"),
        ("events/energy-core.scale", "2.3283064365386962890625e-10\n"),
        ("events/energy-core.unit", "Joules\n"),
        ("format/event", "config:0-63\n"),
    ] {
        std::fs::write(pmu.join(file), text)?;
    }
    Ok(root)
}
