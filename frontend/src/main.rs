//! `amd-hsmp-exporter`: parses the flags, sets up logging, loads the web configuration file,
//! binds the listen addresses (or takes systemd's sockets) and serves until SIGTERM or SIGINT.
//! SIGHUP re-reads the web configuration file (on a thread of its own, so a file that blocks
//! never delays SIGTERM); SIGUSR1 and SIGUSR2 are logged and ignored.
//!
//! Exit codes: 0 after a clean shutdown, 1 when start-up fails (e.g. an address cannot be
//! bound, the web configuration file is invalid), 2 for invalid flags. A missing broker or
//! device is never a reason to exit.
#![forbid(unsafe_code)]

use amd_hsmp_exporter::cli::Args;
use amd_hsmp_exporter::scrape::{Config, Exporter};
use amd_hsmp_web::config::WebState;
use amd_hsmp_web::server::{self, Admission};
use anyhow::Context as _;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

fn main() -> ExitCode {
    let args = Args::from_env();
    if args.common.version {
        print!("{}", amd_hsmp_cli::version::report("amd-hsmp-exporter"));
        return ExitCode::SUCCESS;
    }
    if let Err(e) = amd_hsmp_cli::log::init(args.common.log_level, args.common.log_format) {
        eprintln!("amd-hsmp-exporter: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // Once, as a log record on standard error like every other line of the exporter, its
        // chain in the `error` field as every other line that reports an error.
        Err(e) => {
            tracing::error!(error = %amd_hsmp_cli::chain(e.as_ref()), "exiting");
            ExitCode::FAILURE
        }
    }
}

/// How long work still running when the servers have stopped may take before the process exits
/// without it: a broker request that outlived its scrape, a cgroup read stuck in a file system
/// that does not answer. SIGTERM ends the exporter within the servers' drain
/// ([`server::SHUTDOWN_GRACE`]) plus this, whatever I/O is stuck.
const RUNTIME_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs [`serve`] on a runtime of its own, and leaves behind whatever work is still stuck when
/// it returns: dropping a runtime waits for every blocking task for ever, this waits
/// [`RUNTIME_SHUTDOWN_GRACE`].
///
/// The runtime is the main thread alone (`current_thread`): the exporter waits on sockets and
/// its CPU work a scrape is well under a millisecond, so worker threads would buy no latency,
/// while each one costs its stack and, under glibc, a malloc arena of its own (a worker per
/// CPU by default: 768 threads on a 2 × 192-core machine). What may block (a cgroup walk, the
/// web configuration file, bcrypt) runs on threads of its own.
fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(serve(args));
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_GRACE);
    result
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // First, so that a SIGHUP during start-up does not end the process either.
    let signals = Signals::install()?;
    let families = args.families();
    let fd_limit = server::fd_limit();
    let (limits, lowered) = args.server.limits(fd_limit).map_err(anyhow::Error::msg)?;
    if let Some(lowered) = lowered {
        tracing::info!("{lowered}");
    }
    let exporter = Exporter::new(Config {
        broker_socket: args.broker_socket.clone(),
        families,
        max_scrape_timeout: args.max_scrape_timeout,
        max_requests: args.max_requests,
        telemetry_path: args.telemetry_path.clone(),
        procfs: args.procfs.clone(),
        core_owner: args.core_owner(),
        core_owner_max_age: args.core_owner_max_age,
        core_owner_linger: args.core_owner_linger,
        exporter_metrics: !args.disable_exporter_metrics,
    });
    let web = match &args.web.web_config_file {
        Some(path) => WebState::load(path)?,
        None => WebState::open(),
    };
    let sampler = Arc::clone(&exporter);
    let router = amd_hsmp_exporter::http::service(exporter, Arc::clone(&web));

    let listeners = amd_hsmp_web::listen::listen(&args.web).await?;
    let config = web.current();
    tracing::info!(
        version = %amd_hsmp_cli::version::summary(),
        broker_socket = %args.broker_socket.display(),
        telemetry_path = %args.telemetry_path,
        collectors = %families.iter().map(amd_hsmp_proto::Family::name).collect::<Vec<_>>().join(","),
        core_owner = args.core_owner().map_or_else(|| "off".to_owned(), |p| p.display().to_string()),
        core_owner_sample_interval = ?args.core_owner_sample_interval,
        fd_limit = fd_limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
        max_connections = limits.max_connections,
        max_connections_per_client = limits.max_per_client,
        max_requests = args.max_requests,
        web_config_file = web.path().map_or_else(|| "none".to_owned(), |p| p.display().to_string()),
        tls = config.tls.is_some(),
        basic_auth = config.users.is_some(),
        "amd-hsmp-exporter started"
    );
    drop(config);

    let (stop_tx, stop_rx) = watch::channel(false);
    // One admission over all listeners: the caps are about this process's descriptors.
    let admission = Admission::new(limits);
    let mut servers = tokio::task::JoinSet::new();
    if !args.core_owner_sample_interval.is_zero() {
        let stop = stop_rx.clone();
        let interval = args.core_owner_sample_interval;
        tokio::spawn(async move { sampler.sample_workloads_every(interval, stop).await });
    }
    for listener in listeners {
        let local = listener.local_addr().context("cannot read a bound address")?;
        tracing::info!(address = %local, "listening");
        servers.spawn(server::serve(
            listener,
            router.clone(),
            admission.clone(),
            Arc::clone(&web),
            stop_rx.clone(),
        ));
    }

    signals.until_shutdown(&web).await;
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    while let Some(result) = servers.join_next().await {
        result.context("server task failed")?;
    }
    Ok(())
}

/// The signals the exporter handles. SIGTERM and SIGINT shut it down; SIGHUP re-reads the web
/// configuration file; SIGUSR1 and SIGUSR2, whose default action would end it (and which
/// systemd counts as a clean exit), are ignored, as is SIGHUP without a configuration file.
/// Each ignored kind is logged the first time.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("cannot install the {name} handler"))
        };
        Ok(Signals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
            usr1: install(SignalKind::user_defined1(), "SIGUSR1")?,
            usr2: install(SignalKind::user_defined2(), "SIGUSR2")?,
        })
    }

    /// Resolves on the first SIGTERM or SIGINT.
    async fn until_shutdown(mut self, web: &WebState) {
        let mut logged = [false; 3];
        loop {
            let (index, name) = tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                // Never waits for the file: the file thread reads it and logs the outcome.
                _ = self.hup.recv() => {
                    if web.request_reload() {
                        continue;
                    }
                    (0, "SIGHUP")
                }
                _ = self.usr1.recv() => (1, "SIGUSR1"),
                _ = self.usr2.recv() => (2, "SIGUSR2"),
            };
            if std::mem::replace(&mut logged[index], true) {
                tracing::debug!(signal = name, "signal ignored");
            } else {
                tracing::info!(
                    signal = name,
                    "signal ignored: amd-hsmp-exporter has no configuration file to re-read \
                     (further ones are logged at debug level)"
                );
            }
        }
    }
}
