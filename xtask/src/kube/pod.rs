//! The DaemonSet's pod template, rendered from the chart with the default values, run for real
//! with `podman kube play` (podman 4.3 plays a `Pod`, not a `DaemonSet`: the template is wrapped),
//! three times, one for each kind of node ([`Node`]): the broker on the simulator
//! (`amd-hsmp-sim-broker --simulate turin-2p`, a static build next to the image's, mounted into the
//! pod: the image holds only what a node runs); on the end-to-end suite's FUSE fake device, whose
//! directory is passed in as the hostPath of the host's `/dev`; and, as the chart renders it, on
//! this machine, which has no `/dev/hsmp`: a node of a mixed cluster without the device. Each run
//! is scraped from the host and checked with its evidence printed: on the first two the full
//! contract (384 energy, 384 boost limit, 2 PROCHOT series), on the third a Ready pod with
//! `amd_hsmp_up 0`, no hardware series and the broker's reason; on each the exporter's uid 65534,
//! empty capability sets and no-new-privs, the broker's empty capability sets after start-up, no
//! container restarted, and a third container under another uid refused by the broker.
//!
//! What the test changes in the rendered pod, and why, is printed with each run: the exporter's
//! port published on 127.0.0.1 (to scrape it from the host), the third container, and, for the
//! fake device, the hostPath of `/dev` (the fake's FUSE directory, with its `hsmp` file) and the
//! fixture's procfs/sysfs tree.
//!
//! Facts of this machine the set-up answers: podman needs runc (crun refuses the hybrid cgroup
//! layout) and ulimits within the hard limits, since root lacks CAP_SYS_RESOURCE here
//! (`containers.conf`); the socket's emptyDir is mounted at `/amd-hsmp`, not under `/run`, where
//! podman's own tmpfs would hide it.

use crate::http::free_port;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pod's name; podman names its containers `POD-CONTAINER`.
const POD: &str = "amd-hsmp-kube-test";
/// The uid of the third container, which the broker must refuse.
const INTRUDER_UID: u32 = 1000;
/// The fixture and simulator profile of both runs.
const PROFILE: &str = "turin-2p";
/// The contract on it: series per family.
const CONTRACT: [(&str, usize); 3] = [
    ("amd_hsmp_core_energy_joules_total", 384),
    ("amd_hsmp_core_boost_limit_hertz", 384),
    ("amd_hsmp_prochot_active", 2),
];
/// What the containers.conf sets: runc, and ulimits within this machine's hard limits.
const CONTAINERS_CONF: &str = "[containers]\n\
    default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
    [engine]\n\
    runtime = \"runc\"\n";

/// podman with the test's containers.conf.
struct Podman {
    conf: PathBuf,
}

impl Podman {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    /// Runs podman with `args`; its stdout, or an error with its stderr.
    fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.cmd().args(args).output().context("cannot run podman")?;
        ensure!(
            out.status.success(),
            "podman {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Takes the pod down when dropped, so that a failed check leaves nothing running.
struct Played<'a> {
    podman: &'a Podman,
    yaml: PathBuf,
    volumes: Vec<String>,
}

impl Drop for Played<'_> {
    fn drop(&mut self) {
        let _ = self.podman.cmd().arg("kube").arg("down").arg(&self.yaml).output();
        for name in &self.volumes {
            let _ = self.podman.cmd().args(["volume", "rm", "--force", name]).output();
        }
    }
}

/// The names of the pod's emptyDir volumes.
fn empty_dirs(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("emptyDir").is_some())
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect()
}

/// The node a pod runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    /// The broker serves its simulator: `amd_hsmp_simulated_info`, the full contract.
    Simulator,
    /// The broker reads the FUSE fake device: the full contract.
    FakeDevice,
    /// The chart's pod as it is, on this machine, which has no `/dev/hsmp`.
    NoDevice,
}

/// The fake device program, ended (by closing its stdin) when dropped.
struct Fake {
    child: Child,
    out: std::io::Lines<BufReader<std::process::ChildStdout>>,
    hsmp: PathBuf,
    tree: PathBuf,
}

impl Fake {
    fn start(root: &Path) -> Result<Fake> {
        crate::workspace::cargo(&[
            "build",
            "--quiet",
            "-p",
            "amd-hsmp-e2e",
            "--bin",
            "fake-device",
        ])?;
        let bin = crate::workspace::target_dir(root).join("debug/fake-device");
        let mut child = Command::new(bin)
            .arg(PROFILE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start fake-device")?;
        let mut out = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let mut next = || -> Result<PathBuf> {
            Ok(PathBuf::from(out.next().context("fake-device printed nothing")??))
        };
        let (hsmp, tree) = (next()?, next()?);
        Ok(Fake { child, out, hsmp, tree })
    }

    /// Ends the fake; returns the message counts it printed.
    fn finish(mut self) -> Result<String> {
        drop(self.child.stdin.take());
        let mut counts = String::new();
        for line in self.out.by_ref() {
            counts.push_str(&line?);
            counts.push('\n');
        }
        ensure!(self.child.wait()?.success(), "fake-device failed");
        Ok(counts)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The pod runs need root.
pub fn require_root() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!(
            "the pod runs need root: rootful podman, and the FUSE fake device (--no-pods skips them)"
        );
    }
    Ok(())
}

/// The three runs.
pub fn run(root: &Path, archive: &crate::image::Archive, daemonset: &Value) -> Result<()> {
    let work = tempfile::Builder::new().prefix("amd-hsmp-kube-").tempdir()?;
    let conf = work.path().join("containers.conf");
    std::fs::write(&conf, CONTAINERS_CONF)?;
    let podman = Podman { conf };
    let version = podman.run(&["--version"])?;
    println!("kube-test: {} with runc, ulimits nofile=1024 nproc=1024", version.trim());

    let loaded = podman.run(&["load", "--quiet", "-i", &archive.path.to_string_lossy()])?;
    let reference = crate::image::reference();
    let id = podman.run(&["image", "inspect", "--format", "{{.Id}}", &reference])?;
    ensure!(
        archive.config_digest.ends_with(id.trim()),
        "podman's image id {} is not the config digest {}",
        id.trim(),
        archive.config_digest
    );
    println!("kube-test: {} → {reference}, image id {}", loaded.trim(), id.trim());
    let version = podman.run(&["run", "--rm", &reference, "amd-hsmp-exporter", "--version"])?;
    ensure!(version.contains(env!("CARGO_PKG_VERSION")), "--version says {version}");
    println!(
        "kube-test: podman run {reference} amd-hsmp-exporter --version:\n{}",
        version.trim_end()
    );
    let shell = podman.cmd().args(["run", "--rm", &reference, "sh", "-c", "true"]).output()?;
    ensure!(!shell.status.success(), "the image has a shell");
    println!(
        "kube-test: no shell in the image: {}",
        String::from_utf8_lossy(&shell.stderr).lines().next().unwrap_or("").trim()
    );

    let template = &daemonset["spec"]["template"];
    for c in template["spec"]["containers"].as_array().context("containers")? {
        ensure!(
            c["image"] == reference.as_str(),
            "the pod would pull {}, not {reference}",
            c["image"]
        );
    }
    ensure!(
        !Path::new("/dev/hsmp").exists(),
        "this machine has /dev/hsmp: the run on a node without the device cannot be made here"
    );
    let ports = (free_port()?, free_port()?);
    println!("kube-test: pod on the simulator");
    let sim_broker = crate::image::sim_broker(root);
    ensure!(sim_broker.is_file(), "{} was not built with the image", sim_broker.display());
    let pod = wrap(template, ports, |spec, changes| {
        run_sim_broker(spec, &sim_broker);
        push_arg(spec, "broker", &format!("--simulate={PROFILE}"));
        changes.push(format!(
            "broker: {} mounted at {SIM_BROKER_AT} and run instead of amd-hsmp-broker, \
             --simulate={PROFILE}",
            sim_broker.display()
        ));
    })?;
    play(&podman, work.path(), "simulator", &pod, ports, Node::Simulator)?;

    let fake = Fake::start(root)?;
    println!("kube-test: pod on the fake device");
    let pod = wrap(template, ports, |spec, changes| {
        let dir = fake.hsmp.parent().unwrap_or(Path::new("/"));
        set_host_path(spec, "dev", dir, "Directory");
        changes.push(format!(
            "hostPath /dev → {} (the FUSE fake's directory, its hsmp a regular file)",
            dir.display()
        ));
        add_fixture(spec, &fake.tree);
        changes.push(format!(
            "broker: the fixture's tree {} at /fixture, --path.procfs/--path.sysfs into it",
            fake.tree.display()
        ));
    })?;
    play(&podman, work.path(), "fake device", &pod, ports, Node::FakeDevice)?;
    let counts = fake.finish()?;
    println!("kube-test: fake device: the broker's messages, by id:\n{}", counts.trim_end());
    // Every scrape asked each of the 384 cores once for energy and once for its boost limit.
    for id in ["0x31", "0x0a"] {
        let n: usize = counts
            .lines()
            .find_map(|l| l.strip_prefix(&format!("message {id}: ")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        ensure!(
            n > 0 && n.is_multiple_of(384),
            "message {id} answered {n} times by the fake, not 384 a scrape"
        );
    }

    println!("kube-test: pod on a node without /dev/hsmp (this machine), as the chart renders it");
    let pod = wrap(template, ports, |_, _| {})?;
    play(&podman, work.path(), "no device", &pod, ports, Node::NoDevice)
}

/// The pod: the template wrapped as a `Pod`, with the changes every run makes (the exporter's
/// port on 127.0.0.1, the third container) and those of `run`; prints every change.
fn wrap(
    template: &Value,
    (port, intruder_port): (u16, u16),
    run: impl FnOnce(&mut Value, &mut Vec<String>),
) -> Result<Value> {
    let mut spec = template["spec"].clone();
    let mut changes = Vec::new();
    let exporter = container(&mut spec, "exporter")?.clone();
    let mut intruder = exporter.clone();
    intruder["name"] = json!("intruder");
    let sc = &mut intruder["securityContext"];
    sc["runAsUser"] = json!(INTRUDER_UID);
    sc["runAsGroup"] = json!(INTRUDER_UID);
    for probe in ["livenessProbe", "readinessProbe"] {
        intruder.as_object_mut().context("container")?.remove(probe);
    }
    let args = intruder["args"].as_array_mut().context("args")?;
    for a in args.iter_mut() {
        if a.as_str().is_some_and(|a| a.starts_with("--web.listen-address=")) {
            *a = json!("--web.listen-address=:10055");
        }
    }
    intruder["ports"] = json!([{"name": "intruder", "containerPort": 10055}]);
    spec["containers"].as_array_mut().context("containers")?.push(intruder);
    changes.push(format!(
        "a third container, \"intruder\": the exporter as uid {INTRUDER_UID} on :10055"
    ));
    run(&mut spec, &mut changes);
    for (name, host_port) in [("exporter", port), ("intruder", intruder_port)] {
        let c = container(&mut spec, name)?;
        c["ports"][0]["hostPort"] = json!(host_port);
        c["ports"][0]["hostIP"] = json!("127.0.0.1");
    }
    changes.push(format!(
        "ports published on 127.0.0.1:{port} and :{intruder_port} to scrape from the host"
    ));
    for c in &changes {
        println!("kube-test:   pod change: {c}");
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "labels": template["metadata"]["labels"]},
        "spec": spec,
    }))
}

fn container<'a>(spec: &'a mut Value, name: &str) -> Result<&'a mut Value> {
    spec["containers"]
        .as_array_mut()
        .context("containers")?
        .iter_mut()
        .find(|c| c["name"] == name)
        .with_context(|| format!("no container {name}"))
}

fn push_arg(spec: &mut Value, name: &str, arg: &str) {
    if let Ok(c) = container(spec, name)
        && let Some(args) = c["args"].as_array_mut()
    {
        args.push(json!(arg));
    }
}

fn set_host_path(spec: &mut Value, volume: &str, path: &Path, kind: &str) {
    for v in spec["volumes"].as_array_mut().into_iter().flatten() {
        if v["name"] == volume {
            v["hostPath"] = json!({"path": path, "type": kind});
        }
    }
}

/// Where the simulator pod's broker container finds the mounted `amd-hsmp-sim-broker`.
const SIM_BROKER_AT: &str = "/sim/amd-hsmp-sim-broker";

/// The broker container runs `host` (the static `amd-hsmp-sim-broker`), mounted read-only at
/// [`SIM_BROKER_AT`], instead of the image's `amd-hsmp-broker`; the flags stay the chart's.
fn run_sim_broker(spec: &mut Value, host: &Path) {
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.push(json!({"name": "sim-broker", "hostPath": {"path": host, "type": "File"}}));
    }
    if let Ok(c) = container(spec, "broker") {
        c["command"] = json!([SIM_BROKER_AT]);
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts
                .push(json!({"name": "sim-broker", "mountPath": SIM_BROKER_AT, "readOnly": true}));
        }
    }
}

fn add_fixture(spec: &mut Value, tree: &Path) {
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.push(json!({"name": "fixture", "hostPath": {"path": tree, "type": "Directory"}}));
    }
    if let Ok(c) = container(spec, "broker") {
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            mounts.push(json!({"name": "fixture", "mountPath": "/fixture", "readOnly": true}));
        }
        if let Some(args) = c["args"].as_array_mut() {
            args.push(json!("--path.procfs=/fixture/proc"));
            args.push(json!("--path.sysfs=/fixture/sys"));
        }
    }
}

/// Plays `pod`, checks it as a pod on `node`, takes it down.
fn play(
    podman: &Podman,
    work: &Path,
    what: &str,
    pod: &Value,
    ports: (u16, u16),
    node: Node,
) -> Result<()> {
    let yaml = work.join(format!("pod-{}.json", what.replace(' ', "-")));
    std::fs::write(&yaml, serde_json::to_vec_pretty(pod)?)?;
    // A pod left by an earlier, interrupted run.
    let _ = podman.cmd().args(["pod", "rm", "--force", POD]).output();
    // podman 4.3 makes an emptyDir a named volume, on disk, chowned to the first non-root
    // container's user with mode 0755, where Kubernetes makes it 0777 (tmpfs with medium Memory):
    // the broker, root without CAP_DAC_OVERRIDE once it has dropped its capabilities, could not
    // create its socket. The volume is made first as Kubernetes would, and podman uses it.
    let volumes = empty_dirs(pod);
    for name in &volumes {
        let _ = podman.cmd().args(["volume", "rm", "--force", name]).output();
        podman.run(&[
            "volume",
            "create",
            "--opt",
            "type=tmpfs",
            "--opt",
            "device=tmpfs",
            "--opt",
            "o=mode=0777",
            name,
        ])?;
        println!("kube-test:   emptyDir {name}: a tmpfs volume, mode 0777, as Kubernetes makes it");
    }
    let started = Instant::now();
    podman.run(&["kube", "play", &yaml.to_string_lossy()])?;
    let played = Played { podman, yaml, volumes };
    let result = check(podman, started, ports, node);
    if result.is_err() {
        for c in ["broker", "exporter", "intruder"] {
            let logs = podman.cmd().args(["logs", &format!("{POD}-{c}")]).output();
            if let Ok(out) = logs {
                eprintln!(
                    "--- {c}:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    drop(played);
    result
}

fn check(
    podman: &Podman,
    started: Instant,
    (port, intruder_port): (u16, u16),
    node: Node,
) -> Result<()> {
    let ready = wait(Duration::from_secs(60), || {
        Ok(http_get(port, "/-/ready").ok().filter(|(status, _)| *status == 200).map(|(_, b)| b))
    })
    .context("the exporter never answered /-/ready")?;
    println!(
        "kube-test:   /-/ready after {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        ready.trim()
    );
    let metrics = wait(Duration::from_secs(30), || {
        let (_, body) = http_get(port, "/metrics")?;
        Ok(body.lines().any(|l| l == "amd_hsmp_broker_up 1").then_some(body))
    })
    .context("amd_hsmp_broker_up never became 1")?;
    let device = node != Node::NoDevice;
    for (family, want) in CONTRACT {
        let want = if device { want } else { 0 };
        let series: Vec<&str> =
            metrics.lines().filter(|l| l.starts_with(&format!("{family}{{"))).collect();
        println!(
            "kube-test:   {family}: {} series, e.g. {}",
            series.len(),
            series.first().unwrap_or(&"none")
        );
        ensure!(series.len() == want, "{family}: {} series, want {want}", series.len());
    }
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("amd_hsmp_up ") || l.starts_with("amd_hsmp_simulated_info"))
    {
        println!("kube-test:   {line}");
    }
    let up = if device { "amd_hsmp_up 1" } else { "amd_hsmp_up 0" };
    ensure!(metrics.lines().any(|l| l == up), "no {up}");
    let marked = metrics.lines().any(|l| l.starts_with("amd_hsmp_simulated_info{"));
    let simulated = node == Node::Simulator;
    ensure!(marked == simulated, "amd_hsmp_simulated_info present: {marked}, want {simulated}");
    if !device {
        let logs = logs(podman, "broker")?;
        let reason = logs
            .lines()
            .find(|l| l.contains("HSMP device not usable") && l.contains("Absent"))
            .context("the broker logged no reason for amd_hsmp_up 0")?;
        println!("kube-test:   broker log: {reason}");
    }
    let exporter = status(podman, "exporter")?;
    println!("kube-test:   exporter /proc/PID/status: {}", exporter.join(", "));
    ensure!(field(&exporter, "Uid") == "65534 65534 65534 65534", "exporter uid: {exporter:?}");
    ensure!(no_capabilities(&exporter), "the exporter holds a capability: {exporter:?}");
    ensure!(field(&exporter, "NoNewPrivs") == "1", "exporter NoNewPrivs: {exporter:?}");
    let broker = status(podman, "broker")?;
    println!("kube-test:   broker /proc/PID/status: {}", broker.join(", "));
    ensure!(no_capabilities(&broker), "the broker holds a capability after start-up: {broker:?}");
    ensure!(field(&broker, "NoNewPrivs") == "1", "broker NoNewPrivs: {broker:?}");

    let intruder = wait(Duration::from_secs(10), || Ok(http_get(intruder_port, "/metrics").ok()))
        .map(|(_, body)| body)?;
    let up = intruder.lines().find(|l| l.starts_with("amd_hsmp_broker_up ")).unwrap_or("none");
    println!("kube-test:   intruder (uid {INTRUDER_UID}) scrape: {up}");
    ensure!(up == "amd_hsmp_broker_up 0", "the broker served uid {INTRUDER_UID}: {up}");
    let broker_log = logs(podman, "broker")?;
    let refusal = broker_log
        .lines()
        .find(|l| l.contains("peer not allowed") && l.contains(&format!("uid={INTRUDER_UID}")))
        .context("the broker logged no refusal of the intruder's uid")?;
    println!("kube-test:   broker log: {refusal}");

    // Every check above took its time: neither container restarted, both still run.
    for c in ["broker", "exporter"] {
        let state = podman.run(&[
            "inspect",
            "--format",
            "{{.State.Status}} restarts={{.RestartCount}}",
            &format!("{POD}-{c}"),
        ])?;
        println!("kube-test:   {c}: {}", state.trim());
        ensure!(state.trim() == "running restarts=0", "{c}: {}", state.trim());
    }
    // The kubelet's probes, as the chart declares them (podman 4.3 would run an httpGet probe
    // with curl inside the container, which the image does not have): both 200 at the end.
    for path in ["/-/healthy", "/-/ready"] {
        let (status, _) = http_get(port, path)?;
        println!("kube-test:   {path} at the end: {status}");
        ensure!(status == 200, "{path} answers {status} at the end");
    }

    memory(podman)?;
    Ok(())
}

/// A container's log, stdout and stderr.
fn logs(podman: &Podman, container: &str) -> Result<String> {
    let out = podman.cmd().args(["logs", &format!("{POD}-{container}")]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Calls `f` every 200 ms until it returns something or `limit` passes.
fn wait<T>(limit: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let started = Instant::now();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) | Err(_) if started.elapsed() < limit => {}
            Ok(None) => bail!("not within {limit:?}"),
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET path` over HTTP/1.0 on 127.0.0.1:`port`: status and body.
fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    crate::http::get(port, path, Duration::from_secs(15))
}

/// The host pid of container `name` of the pod.
fn pid(podman: &Podman, name: &str) -> Result<u32> {
    let pid = podman.run(&["inspect", "--format", "{{.State.Pid}}", &format!("{POD}-{name}")])?;
    pid.trim().parse().with_context(|| format!("pid of {name}: {pid:?}"))
}

/// The identity and privilege lines of the container's process (the same process the host
/// sees: no user namespace).
fn status(podman: &Podman, name: &str) -> Result<Vec<String>> {
    let pid = pid(podman, name)?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(text
        .lines()
        .filter(|l| {
            [
                "Uid:",
                "Gid:",
                "CapInh:",
                "CapPrm:",
                "CapEff:",
                "CapBnd:",
                "CapAmb:",
                "NoNewPrivs:",
                "Seccomp:",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect())
}

fn field<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines.iter().find_map(|l| l.strip_prefix(&format!("{name}: "))).unwrap_or("")
}

fn no_capabilities(lines: &[String]) -> bool {
    ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .all(|c| field(lines, c) == "0000000000000000")
}

/// Prints each process's peak resident set and the pod cgroup's peak usage.
fn memory(podman: &Podman) -> Result<()> {
    let mut total = 0;
    let mut cgroup = None;
    for name in ["broker", "exporter"] {
        let pid = pid(podman, name)?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let hwm: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmHWM")?;
        total += hwm;
        println!("kube-test:   {name} peak resident (VmHWM): {hwm} KiB");
        let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        cgroup = groups
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
            .or(cgroup);
    }
    println!("kube-test:   broker + exporter peak resident: {total} KiB");
    // cgroup v1: the container's memory cgroup sits in the pod's.
    if let Some(path) = cgroup {
        let pod = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        if let Some(dir) = pod.parent()
            && let Ok(peak) = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
        {
            let peak: u64 = peak.trim().parse().unwrap_or(0);
            println!(
                "kube-test:   pod cgroup {} peak usage: {} KiB (page cache included)",
                dir.display(),
                peak / 1024
            );
        }
    }
    Ok(())
}
