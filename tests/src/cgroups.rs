//! Cgroup hierarchies for the core-owner collector (`--collector.core-owner`), generated for a
//! fixture machine's CPU numbering rather than written by hand: the layouts Slurm's cgroup v2
//! plugin, the kubelet's static CPU manager and systemd's `AllowedCPUs=` make, a cgroup v1 host,
//! an unreadable hierarchy, and a node of any number of cgroups for the benchmark.
//!
//! Each cgroup is written as the kernel shows it: a directory with `cgroup.type`,
//! `cgroup.procs`, `cgroup.controllers`, `cgroup.subtree_control` and, when its parent enables
//! the cpuset controller, `cpuset.cpus` (what was asked for) and `cpuset.cpus.effective` (what
//! the kernel grants: the request within the parent's effective set, or the parent's set when
//! the request is empty or outside it).

use amd_hsmp_proto::Topology;
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A named hierarchy of a scenario (`cgroups = "slurm"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Slurm's cgroup v2 plugin with `ConstrainCores=yes`, SMT on, two jobs: job 4242 (eight
    /// whole cores on socket 0, its step's two tasks bound to four cores each) and job 4243
    /// (five threads on socket 1: two whole cores and one thread of a third).
    Slurm,
    /// [`Layout::Slurm`] after job 4242 has ended.
    SlurmOneJobEnded,
    /// slurmd run with `--enable-multiple-slurmd` (node `node7` of several on one host): the
    /// stepd scope is `system.slice/node7_slurmstepd.scope`. Every step kind: job 5001 a batch
    /// job whose steps hold its whole set (the job owns its cores), job 5002 two `srun` steps
    /// on half of its cores each (`step_0`, `step_1` own theirs), job 5003 an interactive step
    /// (`salloc`, `use_interactive_step`) on two of its four cores, each step with its
    /// `user/task_K`, and `step_extern` in every job.
    SlurmMultipleSlurmd,
    /// Slurm 26.05's cgroup v2 plugin without `CgroupJobIdPaths=yes` (its default): each job's
    /// directory is its SLUID (`print_sluid`: `s` and 13 Crockford base-32 digits), not
    /// `job_<id>`. Job `sEKNKTV3WPV500`, a batch job, owns cores 0-3 of socket 0; job
    /// `s0F2BKS0J1W800` runs `srun` step 0 on cores 4-7 of its eight (socket 0), the step's.
    SlurmSluid,
    /// Slurm 26.05.2 or later with `CgroupJobIdPaths=yes` (the job's directory `job_<id>`
    /// again) and, as 25.11 allows, `CgroupSlice=slurm.slice`: the stepd scope is
    /// `slurm.slice/slurmstepd.scope`. Job 7001's batch step holds its four cores of socket 1
    /// (the job owns them); job 7002's `srun` step 3 two of its four (the step owns those).
    SlurmJobIdPaths,
    /// A Kubernetes node, kubelet's static CPU manager and systemd cgroup driver: two
    /// Guaranteed pods with exclusive CPUs (one of two containers), the shared pool across
    /// burstable and best-effort pods.
    Kubelet,
    /// The kubelet's cgroupfs driver (containerd): a Guaranteed pod's container with exclusive
    /// cores 0-3 of socket 1, a burstable pod's CRI-O container (`crio-<id>`) with cores 4-5.
    KubeletCgroupfs,
    /// A Kubernetes node whose CPUs are given by the DRA CPU driver (kubernetes-sigs'
    /// `dra-driver-cpu`: the kubelet's CPU manager is `none`, the driver's NRI plugin pins a
    /// container that holds a CPU ResourceClaim to its CPUs and confines every other container
    /// to the shared pool of the rest). Pod A's container with a claim holds cores 8-11 of
    /// socket 0 and owns them; its second container, and Guaranteed pod B's container, which
    /// holds no claim, are in the shared pool, as is a burstable pod's.
    KubeletDra,
    /// systemd services and slices with `AllowedCPUs=`, two of them overlapping, a slice whose
    /// services inherit its CPUs, and a libvirt VM whose vCPU threads are pinned.
    Systemd,
    /// A libvirt host: guest `build-vm` (4 vCPUs pinned to cores 0-3 of socket 1, its emulator
    /// floating over them) owns those cores; guest `web-01-prod` (2 vCPUs on cores 4-5, the
    /// emulator pinned to core 8, a housekeeping core guest `db` also has for its emulator)
    /// owns cores 4-5, and core 8, in two guests' scopes, is unassigned. Two cgroups named like
    /// a guest's scope where libvirt never puts one own cores 9 and 10 (hostile test Q3): one in
    /// a user's own subtree, one inside a pod. A guest's scope whose name holds a raw byte 0xFF
    /// (which systemd would have escaped: a hand-made cgroup, hostile test Q8) owns core 11.
    Libvirt,
    /// A cgroup v1 (hybrid) host: controller hierarchies and no `cgroup.controllers`.
    V1Host,
    /// A cgroup v2 hierarchy in which one cgroup's cpuset file cannot be read.
    Unreadable,
}

/// One cgroup to write.
#[derive(Debug, Clone)]
pub struct Group {
    /// Path from the root, `/`-separated, without a leading `/`.
    pub path: String,
    /// `cgroup.type`: `domain`, `domain threaded` or `threaded`.
    pub kind: &'static str,
    /// `cpuset.cpus`, the CPUs asked for; empty asks for none (the parent's set is in effect).
    pub cpus: Vec<u32>,
    /// Whether the cgroup has cpuset files (its parent enables the controller for it).
    pub cpuset: bool,
}

/// A cgroup v2 hierarchy: groups listed parents first.
#[derive(Debug, Clone, Default)]
pub struct Hierarchy {
    /// The cgroups below the root.
    pub groups: Vec<Group>,
}

impl Hierarchy {
    fn add(&mut self, path: &str, cpus: Vec<u32>) -> &mut Self {
        self.add_kind(path, "domain", cpus)
    }

    fn add_kind(&mut self, path: &str, kind: &'static str, cpus: Vec<u32>) -> &mut Self {
        self.groups.push(Group { path: path.to_owned(), kind, cpus, cpuset: true });
        self
    }

    /// A cgroup without cpuset files (its parent does not enable the controller).
    fn add_plain(&mut self, path: &str) -> &mut Self {
        self.groups.push(Group {
            path: path.to_owned(),
            kind: "domain",
            cpus: vec![],
            cpuset: false,
        });
        self
    }

    /// Writes the hierarchy under `root` for a machine whose online CPUs are `online`.
    pub fn write(&self, root: &Path, online: &BTreeSet<u32>) -> Result<()> {
        std::fs::create_dir_all(root)?;
        let all = cpu_list(online.iter().copied());
        write(&root.join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n")?;
        write(&root.join("cgroup.subtree_control"), "cpuset cpu io memory pids\n")?;
        write(&root.join("cpuset.cpus.effective"), &format!("{all}\n"))?;
        write(&root.join("cpuset.mems.effective"), "0-1\n")?;
        write(&root.join("cgroup.procs"), "1\n")?;
        let mut effective: std::collections::BTreeMap<String, BTreeSet<u32>> =
            std::collections::BTreeMap::new();
        effective.insert(String::new(), online.clone());
        let children_with_cpuset: BTreeSet<String> = self
            .groups
            .iter()
            .filter(|g| g.cpuset)
            .map(|g| parent_of(&g.path).to_owned())
            .collect();
        for g in &self.groups {
            let parent = parent_of(&g.path);
            let Some(parent_set) = effective.get(parent).cloned() else {
                bail!("cgroup {} listed before its parent", g.path);
            };
            let dir = root.join(&g.path);
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            write(&dir.join("cgroup.type"), &format!("{}\n", g.kind))?;
            write(&dir.join("cgroup.procs"), "")?;
            let controllers =
                if g.cpuset { "cpuset cpu io memory pids\n" } else { "cpu io memory pids\n" };
            write(&dir.join("cgroup.controllers"), controllers)?;
            let subtree = if children_with_cpuset.contains(&g.path) {
                "cpuset cpu memory pids\n"
            } else {
                ""
            };
            write(&dir.join("cgroup.subtree_control"), subtree)?;
            let set = if g.cpuset {
                let granted: BTreeSet<u32> =
                    g.cpus.iter().copied().filter(|c| parent_set.contains(c)).collect();
                let set = if granted.is_empty() { parent_set } else { granted };
                write(
                    &dir.join("cpuset.cpus"),
                    &format!("{}\n", cpu_list(g.cpus.iter().copied())),
                )?;
                write(
                    &dir.join("cpuset.cpus.effective"),
                    &format!("{}\n", cpu_list(set.iter().copied())),
                )?;
                write(&dir.join("cpuset.cpus.partition"), "member\n")?;
                set
            } else {
                parent_set
            };
            effective.insert(g.path.clone(), set);
        }
        Ok(())
    }
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// A kernel CPU list (`0-3,5`) of ascending CPUs.
pub fn cpu_list(cpus: impl IntoIterator<Item = u32>) -> String {
    let mut out = String::new();
    let mut run: Option<(u32, u32)> = None;
    let flush = |out: &mut String, (a, b): (u32, u32)| {
        let sep = if out.is_empty() { "" } else { "," };
        let _ = if a == b { write!(out, "{sep}{a}") } else { write!(out, "{sep}{a}-{b}") };
    };
    for cpu in cpus {
        run = match run {
            Some((a, b)) if cpu == b + 1 => Some((a, cpu)),
            Some(r) => {
                flush(&mut out, r);
                Some((cpu, cpu))
            }
            None => Some((cpu, cpu)),
        };
    }
    if let Some(r) = run {
        flush(&mut out, r);
    }
    out
}

/// The CPUs (every thread) of cores `cores` (indices among the socket's cores, in `core`
/// order) of `socket`.
pub fn threads(topology: &Topology, socket: u32, cores: std::ops::Range<usize>) -> Vec<u32> {
    let mut cpus: Vec<u32> = topology
        .cores
        .iter()
        .filter(|c| c.socket == socket)
        .skip(cores.start)
        .take(cores.len())
        .flat_map(|c| c.threads.iter().copied())
        .collect();
    cpus.sort_unstable();
    cpus
}

/// The first thread of core `index` of `socket`.
fn first_thread(topology: &Topology, socket: u32, index: usize) -> u32 {
    threads(topology, socket, index..index + 1)[0]
}

fn joined(parts: &[&[u32]]) -> Vec<u32> {
    let set: BTreeSet<u32> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    set.into_iter().collect()
}

fn online(topology: &Topology) -> BTreeSet<u32> {
    topology.cores.iter().flat_map(|c| c.threads.iter().copied()).collect()
}

const SLURM: &str = "system.slice/slurmstepd.scope";

fn slurm(topology: &Topology, with_job_4242: bool) -> Hierarchy {
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![])
        .add("system.slice", vec![])
        .add("system.slice/slurmd.service", vec![])
        .add("system.slice/sshd.service", vec![])
        .add(SLURM, vec![])
        .add(&format!("{SLURM}/system"), vec![]);
    if with_job_4242 {
        let job = threads(topology, 0, 0..8);
        let job_dir = format!("{SLURM}/job_4242");
        h.add(&job_dir, job.clone());
        for step in ["step_extern", "step_batch", "step_0"] {
            let step_dir = format!("{job_dir}/{step}");
            h.add(&step_dir, job.clone())
                .add(&format!("{step_dir}/slurm"), job.clone())
                .add(&format!("{step_dir}/user"), job.clone());
        }
        // The step's tasks are bound to four cores each (TaskPlugin=task/cgroup,task/affinity).
        h.add(&format!("{job_dir}/step_0/user/task_0"), threads(topology, 0, 0..4))
            .add(&format!("{job_dir}/step_0/user/task_1"), threads(topology, 0, 4..8))
            .add(&format!("{job_dir}/step_extern/user/task_special"), job.clone());
    }
    // Five threads: cores 0 and 1 of socket 1 whole, and only the first thread of core 2.
    let job = joined(&[&threads(topology, 1, 0..2), &[first_thread(topology, 1, 2)]]);
    let job_dir = format!("{SLURM}/job_4243");
    h.add(&job_dir, job.clone());
    for step in ["step_extern", "step_batch"] {
        let step_dir = format!("{job_dir}/{step}");
        h.add(&step_dir, job.clone())
            .add(&format!("{step_dir}/slurm"), job.clone())
            .add(&format!("{step_dir}/user"), job.clone())
            .add(&format!("{step_dir}/user/task_0"), job.clone());
    }
    h.add("user.slice", vec![]).add_plain("user.slice/user-1000.slice");
    h
}

/// One Slurm step: `<job_dir>/<step>` with its `slurm` (the stepd) and `user/task_<K>` for each
/// of `tasks` (every cgroup asking for `cpus`, so only the step itself can restrict).
fn slurm_step(h: &mut Hierarchy, job_dir: &str, step: &str, cpus: &[u32], tasks: &[&str]) {
    let step_dir = format!("{job_dir}/{step}");
    h.add(&step_dir, cpus.to_vec())
        .add(&format!("{step_dir}/slurm"), cpus.to_vec())
        .add(&format!("{step_dir}/user"), cpus.to_vec());
    for task in tasks {
        h.add(&format!("{step_dir}/user/task_{task}"), cpus.to_vec());
    }
}

/// A Slurm node's hierarchy up to its stepd scope `stepd` (below `system.slice`, or below a
/// slice of its own as `CgroupSlice=` makes it), with slurmd's unit `slurmd`.
fn slurm_node(slurmd: &str, stepd: &str) -> Hierarchy {
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![]).add("system.slice", vec![]).add(slurmd, vec![]);
    let slice = parent_of(stepd);
    if slice != "system.slice" {
        h.add(slice, vec![]);
    }
    h.add(stepd, vec![]).add(&format!("{stepd}/system"), vec![]);
    h
}

/// Job directory `name` below `stepd` holding `cpus`, with its extern step; its path.
fn slurm_job(h: &mut Hierarchy, stepd: &str, name: &str, cpus: &[u32]) -> String {
    let dir = format!("{stepd}/{name}");
    h.add(&dir, cpus.to_vec());
    slurm_step(h, &dir, "step_extern", cpus, &["special"]);
    dir
}

/// A Slurm node's users, whose slice does not enable cpuset.
fn with_users(mut h: Hierarchy) -> Hierarchy {
    h.add("user.slice", vec![]).add_plain("user.slice/user-1000.slice");
    h
}

fn slurm_multiple(topology: &Topology) -> Hierarchy {
    let stepd = "system.slice/node7_slurmstepd.scope";
    let mut h = slurm_node("system.slice/slurmd-node7.service", stepd);
    // Job 5001, a batch job: its steps hold the whole set, so the job owns cores 0-3.
    let job = threads(topology, 0, 0..4);
    let dir = slurm_job(&mut h, stepd, "job_5001", &job);
    slurm_step(&mut h, &dir, "step_batch", &job, &["0"]);
    // Job 5002: two srun steps on four of its eight cores each own them.
    let job = threads(topology, 0, 4..12);
    let dir = slurm_job(&mut h, stepd, "job_5002", &job);
    slurm_step(&mut h, &dir, "step_batch", &job, &["0"]);
    slurm_step(&mut h, &dir, "step_0", &threads(topology, 0, 4..8), &["0", "1"]);
    slurm_step(&mut h, &dir, "step_1", &threads(topology, 0, 8..12), &["0"]);
    // Job 5003, salloc with an interactive step on two of its four cores: those are the
    // step's, the other two the job's.
    let dir = slurm_job(&mut h, stepd, "job_5003", &threads(topology, 1, 0..4));
    slurm_step(&mut h, &dir, "step_interactive", &threads(topology, 1, 0..2), &["0"]);
    with_users(h)
}

fn slurm_job_id_paths(topology: &Topology) -> Hierarchy {
    let stepd = "slurm.slice/slurmstepd.scope";
    let mut h = slurm_node("system.slice/slurmd.service", stepd);
    let job = threads(topology, 1, 0..4);
    let dir = slurm_job(&mut h, stepd, "job_7001", &job);
    slurm_step(&mut h, &dir, "step_batch", &job, &["0"]);
    let dir = slurm_job(&mut h, stepd, "job_7002", &threads(topology, 1, 4..8));
    slurm_step(&mut h, &dir, "step_3", &threads(topology, 1, 4..6), &["0"]);
    with_users(h)
}

fn slurm_sluid(topology: &Topology) -> Hierarchy {
    let mut h = slurm_node("system.slice/slurmd.service", SLURM);
    let job = threads(topology, 0, 0..4);
    let dir = slurm_job(&mut h, SLURM, "sEKNKTV3WPV500", &job);
    slurm_step(&mut h, &dir, "step_batch", &job, &["0"]);
    let job = threads(topology, 0, 4..12);
    let dir = slurm_job(&mut h, SLURM, "s0F2BKS0J1W800", &job);
    slurm_step(&mut h, &dir, "step_batch", &job, &["0"]);
    slurm_step(&mut h, &dir, "step_0", &threads(topology, 0, 4..8), &["0", "1"]);
    with_users(h)
}

/// Pod UIDs as the kubelet's systemd driver writes them (dashes become underscores).
const POD_A: &str = "0b7f4c3e_2a51_4d8e_9c1a_6f0e5d3b2a10";
const POD_B: &str = "5d2e9a41_7c3b_4f60_8e2d_1a9b0c4d7e33";
const POD_C: &str = "9a0c1e2f_3b4d_4e5f_a6b7_c8d9e0f1a2b3";
const POD_D: &str = "c3d4e5f6_0718_4293_a4b5_c6d7e8f9a0b1";
const POD_E: &str = "e1f2a3b4_c5d6_47e8_99a0_b1c2d3e4f5a6";

/// A Kubernetes node's hierarchy up to `kubepods.slice` (the kubelet's systemd driver).
fn kubelet_node() -> Hierarchy {
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![])
        .add("system.slice", vec![])
        .add("system.slice/containerd.service", vec![])
        .add("system.slice/kubelet.service", vec![])
        .add("kubepods.slice", vec![]);
    h
}

fn kubelet(topology: &Topology) -> Hierarchy {
    let all = online(topology);
    // Exclusive CPUs: pod A's app container cores 2-5 and its sidecar core 6 of socket 0, pod
    // B's container cores 0-7 of socket 1. The shared pool is the rest (with the reserved
    // CPUs: the kubelet's --reserved-cpus stay in the pool).
    let a_app = threads(topology, 0, 2..6);
    let a_sidecar = threads(topology, 0, 6..7);
    let b_app = threads(topology, 1, 0..8);
    let exclusive: BTreeSet<u32> = joined(&[&a_app, &a_sidecar, &b_app]).into_iter().collect();
    let shared: Vec<u32> = all.difference(&exclusive).copied().collect();
    let scope = |id: &str| format!("cri-containerd-{id}.scope");
    let mut h = kubelet_node();
    let pod_a = format!("kubepods.slice/kubepods-pod{POD_A}.slice");
    h.add(&pod_a, vec![])
        // The sandbox (pause) container is not managed by the CPU manager.
        .add(
            &format!(
                "{pod_a}/{}",
                scope("4f1d0c2b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170605f4")
            ),
            vec![],
        )
        .add(
            &format!(
                "{pod_a}/{}",
                scope("a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90")
            ),
            a_app,
        )
        .add(
            &format!(
                "{pod_a}/{}",
                scope("b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1")
            ),
            a_sidecar,
        );
    let pod_b = format!("kubepods.slice/kubepods-pod{POD_B}.slice");
    h.add(&pod_b, vec![])
        .add(
            &format!(
                "{pod_b}/{}",
                scope("1e2d3c4b5a69788796a5b4c3d2e1f0011e2d3c4b5a69788796a5b4c3d2e1f001")
            ),
            vec![],
        )
        .add(
            &format!(
                "{pod_b}/{}",
                scope("c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2")
            ),
            b_app,
        );
    h.add("kubepods.slice/kubepods-burstable.slice", vec![]);
    for (pod, containers) in [(POD_C, ["d4e5f6", "e5f607"]), (POD_D, ["f60718", "071829"])] {
        let dir =
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice");
        h.add(&dir, vec![]);
        for id in containers {
            h.add(&format!("{dir}/{}", scope(&id.repeat(11)[..64])), shared.clone());
        }
    }
    h.add("kubepods.slice/kubepods-besteffort.slice", vec![]);
    let dir =
        format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_E}.slice");
    h.add(&dir, vec![]).add(&format!("{dir}/{}", scope(&"18293a".repeat(11)[..64])), shared);
    h
}

fn kubelet_cgroupfs(topology: &Topology) -> Hierarchy {
    let pod_a = format!("kubepods/pod{}", POD_A.replace('_', "-"));
    let pod_c = format!("kubepods/burstable/pod{}", POD_C.replace('_', "-"));
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![])
        .add("system.slice", vec![])
        .add("kubepods", vec![])
        .add(&pod_a, vec![])
        .add(&format!("{pod_a}/{}", "4f1d0c2b".repeat(8)), vec![])
        .add(&format!("{pod_a}/{}", "a1b2c3d4".repeat(8)), threads(topology, 1, 0..4))
        .add("kubepods/burstable", vec![])
        .add(&pod_c, vec![])
        .add(&format!("{pod_c}/crio-{}", "d4e5f607".repeat(8)), threads(topology, 1, 4..6))
        .add("kubepods/besteffort", vec![]);
    h
}

fn kubelet_dra(topology: &Topology) -> Hierarchy {
    let all = online(topology);
    let claimed = threads(topology, 0, 8..12);
    let shared: Vec<u32> = all.iter().copied().filter(|c| !claimed.contains(c)).collect();
    let scope = |id: &str| format!("cri-containerd-{}.scope", &id.repeat(8)[..64]);
    let mut h = kubelet_node();
    // The CPU manager is off: pods and sandboxes keep the whole machine; NRI sets containers'.
    let pod_a = format!("kubepods.slice/kubepods-pod{POD_A}.slice");
    h.add(&pod_a, vec![])
        .add(&format!("{pod_a}/{}", scope("0a1b2c3d")), vec![])
        .add(&format!("{pod_a}/{}", scope("5e6f7a8b")), claimed)
        .add(&format!("{pod_a}/{}", scope("9c0d1e2f")), shared.clone());
    let pod_b = format!("kubepods.slice/kubepods-pod{POD_B}.slice");
    h.add(&pod_b, vec![])
        .add(&format!("{pod_b}/{}", scope("3a4b5c6d")), vec![])
        .add(&format!("{pod_b}/{}", scope("7e8f9a0b")), shared.clone());
    let burstable = "kubepods.slice/kubepods-burstable.slice";
    let pod_c = format!("{burstable}/kubepods-burstable-pod{POD_C}.slice");
    h.add(burstable, vec![])
        .add(&pod_c, vec![])
        .add(&format!("{pod_c}/{}", scope("c1d2e3f4")), vec![])
        .add(&format!("{pod_c}/{}", scope("a5b6c7d8")), shared);
    h
}

fn systemd(topology: &Topology) -> Hierarchy {
    let postgres = threads(topology, 0, 8..16);
    let nginx = threads(topology, 0, 16..18);
    // Overlaps postgresql's last two cores and nginx's two: those four are unassigned.
    let batch = threads(topology, 0, 14..20);
    let workload = threads(topology, 1, 0..16);
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![])
        .add("system.slice", vec![])
        .add("system.slice/postgresql.service", postgres)
        .add("system.slice/nginx.service", nginx)
        .add("system.slice/batch.service", batch)
        .add("system.slice/sshd.service", vec![])
        .add("workload.slice", workload)
        .add("workload.slice/api.service", vec![])
        .add("workload.slice/worker.service", vec![])
        .add("machine.slice", vec![]);
    // Each vCPU thread pinned to one core of the VM's; the emulator floats over all of them.
    libvirt_guest(&mut h, topology, 1, "build-vm", 32..36, &threads(topology, 1, 32..36));
    h.add("user.slice", vec![])
        .add_plain("user.slice/user-1000.slice")
        .add_plain("user.slice/user-1000.slice/session-3.scope");
    h
}

/// A libvirt guest's scope as systemd names it (`machine-qemu\x2d<id>\x2d<name>.scope`, every
/// `-` escaped) under `machine.slice`, its vCPU threads each pinned to one of `vcpus` (cores of
/// socket 1), its emulator on `emulator` CPUs; the scope holds both.
fn libvirt_guest(
    h: &mut Hierarchy,
    topology: &Topology,
    id: u32,
    name: &str,
    vcpus: std::ops::Range<usize>,
    emulator: &[u32],
) {
    let scope =
        format!("machine.slice/machine-qemu\\x2d{id}\\x2d{}.scope", name.replace('-', "\\x2d"));
    let pinned = threads(topology, 1, vcpus.clone());
    h.add(&scope, joined(&[&pinned, emulator])).add_kind(
        &format!("{scope}/libvirt"),
        "domain threaded",
        vec![],
    );
    for (i, core) in vcpus.enumerate() {
        h.add_kind(
            &format!("{scope}/libvirt/vcpu{i}"),
            "threaded",
            threads(topology, 1, core..core + 1),
        );
    }
    h.add_kind(&format!("{scope}/libvirt/emulator"), "threaded", emulator.to_vec());
}

fn libvirt(topology: &Topology) -> Hierarchy {
    let mut h = Hierarchy::default();
    h.add("init.scope", vec![])
        .add("system.slice", vec![])
        .add("system.slice/libvirtd.service", vec![])
        .add("system.slice/virtqemud.service", vec![])
        .add("machine.slice", vec![]);
    let housekeeping = threads(topology, 1, 8..9);
    libvirt_guest(&mut h, topology, 1, "build-vm", 0..4, &threads(topology, 1, 0..4));
    libvirt_guest(&mut h, topology, 2, "web-01-prod", 4..6, &housekeeping);
    libvirt_guest(&mut h, topology, 3, "db", 6..8, &housekeeping);
    // Hostile test Q3: a guest's name where libvirt never makes a scope: in a user's own
    // subtree (cpuset delegated to the user) and inside a pod.
    let user = "user.slice/user-1000.slice/user@1000.service/app.slice";
    h.add("user.slice", vec![])
        .add("user.slice/user-1000.slice", vec![])
        .add("user.slice/user-1000.slice/user@1000.service", vec![])
        .add(user, vec![])
        .add(
            &format!("{user}/machine-qemu\\x2d99\\x2dprod\\x2ddb.scope"),
            threads(topology, 1, 9..10),
        );
    let pod = format!("kubepods.slice/kubepods-pod{POD_A}.slice");
    h.add("kubepods.slice", vec![]).add(&pod, vec![]).add(
        &format!("{pod}/machine-qemu\\x2d98\\x2dprod\\x2ddb.scope"),
        threads(topology, 1, 10..11),
    );
    // Renamed to its raw byte once written (write_layout).
    let placeholder = raw_byte_scope(RAW_BYTE_PLACEHOLDER);
    let placeholder = std::str::from_utf8(&placeholder).expect("an ASCII placeholder");
    h.add(&format!("machine.slice/{placeholder}"), threads(topology, 1, 11..12));
    h
}

/// The byte the Q8 guest's scope name holds in place of 0xFF until it is renamed.
const RAW_BYTE_PLACEHOLDER: u8 = b'~';

/// The Q8 guest's scope name (hostile test Q8) with `byte` in it.
fn raw_byte_scope(byte: u8) -> Vec<u8> {
    [&br"machine-qemu\x2d8\x2draw"[..], &[byte], b"byte.scope"].concat()
}

/// A Kubernetes node of `pods` pods (two containers and a sandbox each, so about four cgroups
/// a pod): every tenth pod Guaranteed with one exclusive core per container while cores last,
/// the others in the shared pool. For the benchmark.
pub fn generated(topology: &Topology, pods: usize) -> Hierarchy {
    generated_with(topology, pods, 2 * pods.div_ceil(10))
}

/// The workloads [`generated_with`] gives `pods` pods on `topology`'s machine when asked for
/// `workloads`: two a pod at most, and one core left to the shared pool.
pub fn generated_workloads(topology: &Topology, pods: usize, workloads: usize) -> usize {
    workloads.min(2 * pods).min(topology.cores.len().saturating_sub(1))
}

/// [`generated`] with `workloads` containers that each own an exclusive core: half as many
/// Guaranteed pods (two such containers a pod, the last one's second in the shared pool when
/// `workloads` is odd), spread evenly among the others (every tenth pod for a fifth as many
/// workloads as pods), their cores taken in order from socket 0 on while at least one core is
/// left to the shared pool of all the other CPUs.
pub fn generated_with(topology: &Topology, pods: usize, workloads: usize) -> Hierarchy {
    let all = online(topology);
    let sockets: BTreeSet<u32> = topology.cores.iter().map(|c| c.socket).collect();
    let cores: Vec<Vec<u32>> = sockets
        .iter()
        .flat_map(|&s| {
            let n = topology.cores.iter().filter(|c| c.socket == s).count();
            (0..n).map(move |i| threads(topology, s, i..i + 1))
        })
        .collect();
    let workloads = generated_workloads(topology, pods, workloads);
    let guaranteed_pods = workloads.div_ceil(2);
    // Pod p is Guaranteed where p * g / pods steps up: g of them, evenly spaced.
    let guaranteed = |pod: usize| pod * guaranteed_pods % pods.max(1) < guaranteed_pods;
    let mut cores = cores.into_iter().take(workloads);
    let mut exclusive: Vec<(usize, Vec<u32>)> = Vec::new();
    for pod in (0..pods).filter(|&p| guaranteed(p)) {
        for _ in 0..2 {
            if let Some(core) = cores.next() {
                exclusive.push((pod, core));
            }
        }
    }
    let taken: BTreeSet<u32> = exclusive.iter().flat_map(|(_, c)| c.iter().copied()).collect();
    let shared: Vec<u32> = all.difference(&taken).copied().collect();
    let mut h = Hierarchy::default();
    h.add("system.slice", vec![]).add("kubepods.slice", vec![]);
    h.add("kubepods.slice/kubepods-besteffort.slice", vec![]);
    for pod in 0..pods {
        let guaranteed = guaranteed(pod);
        let dir = if guaranteed {
            format!("kubepods.slice/kubepods-pod{pod:08x}_0000_4000_8000_000000000000.slice")
        } else {
            format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod:08x}_0000_4000_8000_000000000000.slice"
            )
        };
        h.add(&dir, vec![]).add(&format!("{dir}/cri-containerd-{pod:064x}.scope"), vec![]);
        let mut own = exclusive.iter().filter(|(p, _)| *p == pod).map(|(_, c)| c.clone());
        for container in 1..=2u64 {
            let cpus = if guaranteed {
                own.next().unwrap_or_else(|| shared.clone())
            } else {
                shared.clone()
            };
            let id = (pod as u64) << 8 | container;
            h.add(&format!("{dir}/cri-containerd-{id:064x}.scope"), cpus);
        }
    }
    h
}

/// Writes `layout` for `topology`'s machine under `root`, which must not exist yet.
pub fn write_layout(layout: Layout, topology: &Topology, root: &Path) -> Result<()> {
    let online = online(topology);
    match layout {
        Layout::Slurm => slurm(topology, true).write(root, &online),
        Layout::SlurmOneJobEnded => slurm(topology, false).write(root, &online),
        Layout::SlurmMultipleSlurmd => slurm_multiple(topology).write(root, &online),
        Layout::SlurmSluid => slurm_sluid(topology).write(root, &online),
        Layout::SlurmJobIdPaths => slurm_job_id_paths(topology).write(root, &online),
        Layout::KubeletDra => kubelet_dra(topology).write(root, &online),
        Layout::Kubelet => kubelet(topology).write(root, &online),
        Layout::KubeletCgroupfs => kubelet_cgroupfs(topology).write(root, &online),
        Layout::Systemd => systemd(topology).write(root, &online),
        Layout::Libvirt => {
            libvirt(topology).write(root, &online)?;
            // Hostile test Q8: a raw 0xFF in a guest's scope name, which a `String` cannot hold.
            let dir = |byte| {
                root.join("machine.slice").join(std::ffi::OsStr::from_bytes(&raw_byte_scope(byte)))
            };
            std::fs::rename(dir(RAW_BYTE_PLACEHOLDER), dir(0xFF))?;
            Ok(())
        }
        Layout::V1Host => {
            // A hybrid host: v1 controller hierarchies, the unified one for systemd only.
            for controller in ["cpuset", "cpu,cpuacct", "memory", "pids", "systemd", "unified"] {
                std::fs::create_dir_all(root.join(controller))?;
            }
            write(
                &root.join("cpuset/cpuset.cpus"),
                &format!("{}\n", cpu_list(online.iter().copied())),
            )?;
            write(&root.join("cpuset/cgroup.procs"), "1\n")?;
            write(&root.join("unified/cgroup.controllers"), "\n")?;
            Ok(())
        }
        Layout::Unreadable => {
            slurm(topology, true).write(root, &online)?;
            // Unreadable even for root (EISDIR), as a file the exporter's user may not read.
            let file = root.join(format!("{SLURM}/job_4243/cpuset.cpus.effective"));
            std::fs::remove_file(&file)?;
            std::fs::create_dir(&file)?;
            Ok(())
        }
    }
}

/// A stepd of a layout: its PID, the leaf (`<job>/step_<s>/slurm`, from the hierarchy root)
/// whose `cgroup.procs` lists it, and its title.
struct Stepd {
    pid: u32,
    leaf: String,
    title: String,
}

/// The Slurm stepds a layout's node shows in its procfs: [`Layout::SlurmSluid`]'s job
/// `sEKNKTV3WPV500` is job 3385, its extern and batch stepds visible; job `s0F2BKS0J1W800`'s
/// stepds are listed in their leaves but hidden (`hidepid`, `ProtectProc=invisible`).
fn stepds(layout: Layout) -> (Vec<Stepd>, Vec<(String, u32)>) {
    let stepd = |pid, job: &str, step: &str, title: &str| Stepd {
        pid,
        leaf: format!("{SLURM}/{job}/step_{step}/slurm"),
        title: format!("slurmstepd: [{title}]"),
    };
    match layout {
        Layout::SlurmSluid => (
            vec![
                stepd(41_001, "sEKNKTV3WPV500", "extern", "3385.extern"),
                stepd(41_017, "sEKNKTV3WPV500", "batch", "3385.batch"),
            ],
            ["extern", "batch", "0"]
                .iter()
                .enumerate()
                .map(|(i, step)| {
                    (format!("{SLURM}/s0F2BKS0J1W800/step_{step}/slurm"), 52_000 + i as u32)
                })
                .collect(),
        ),
        _ => (Vec::new(), Vec::new()),
    }
}

/// Writes the processes `layout`'s node shows: each stepd in its leaf's `cgroup.procs` (under
/// `cgroup_root`, already written) and, where it is visible, in a procfs under `proc_root`
/// (its `cgroup` and its `cmdline` as Linux and Slurm's `setproctitle` show them, the title
/// padded with NULs). The procfs's `self` and `stat` are links to this machine's, for the
/// exporter's own `process_*` metrics. `false`, and nothing written, for a layout without
/// processes.
pub fn write_processes(layout: Layout, cgroup_root: &Path, proc_root: &Path) -> Result<bool> {
    let (visible, hidden) = stepds(layout);
    if visible.is_empty() && hidden.is_empty() {
        return Ok(false);
    }
    std::fs::create_dir_all(proc_root)?;
    std::os::unix::fs::symlink("/proc/self", proc_root.join("self"))?;
    std::os::unix::fs::symlink("/proc/stat", proc_root.join("stat"))?;
    for (leaf, pid) in
        visible.iter().map(|s| (&s.leaf, s.pid)).chain(hidden.iter().map(|(l, p)| (l, *p)))
    {
        write(&cgroup_root.join(leaf).join("cgroup.procs"), &format!("{pid}\n"))?;
    }
    for stepd in &visible {
        let dir = proc_root.join(stepd.pid.to_string());
        std::fs::create_dir(&dir)?;
        write(&dir.join("cgroup"), &format!("0::/{}\n", stepd.leaf))?;
        let mut cmdline = stepd.title.clone().into_bytes();
        cmdline.resize(cmdline.len() + 8, 0);
        std::fs::write(dir.join("cmdline"), cmdline)?;
    }
    Ok(true)
}

/// Replaces the hierarchy under `root` by `layout`'s.
pub fn replace_layout(layout: Layout, topology: &Topology, root: &Path) -> Result<()> {
    if root.exists() {
        std::fs::remove_dir_all(root)
            .with_context(|| format!("cannot remove {}", root.display()))?;
    }
    write_layout(layout, topology, root)
}

/// What a hostile or broken cgroupfs could show: `size` bytes of `cpuset.cpus.effective` for the
/// cgroup `group` (path from `root`, `/`-separated; empty for the root) of a written tree, a
/// valid-looking CPU list (`0-1,0-1,...,0-1\n`: `size` bytes rounded down to whole items, at
/// least one) however far a reader goes.
pub fn write_oversized_cpuset(root: &Path, group: &str, size: usize) -> Result<()> {
    // Whole items only: the list is `size` bytes rounded down to a multiple of 4.
    let mut text = "0-1,".repeat((size / 4).max(1));
    text.pop();
    text.push('\n');
    write(&root.join(group).join("cpuset.cpus.effective"), &text)
}

/// Closes the cgroup `group` (path from `root`) of a written tree to every uid but its owner
/// (root, for a tree a root test wrote): `chmod 0700`, as a cgroup delegated to one user is
/// closed to others. An exporter running as another uid (65534) can neither list it nor read
/// its files.
pub fn make_unreadable(root: &Path, group: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(group);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot chmod {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_written_as_the_kernel_writes_them() {
        assert_eq!(cpu_list([0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpu_list([3]), "3");
        assert_eq!(cpu_list([]), "");
    }

    #[test]
    fn the_generated_node_has_four_cgroups_a_pod_and_exclusive_cores_every_tenth_pod() {
        let topology = crate::fixtures::machine("turin-2p").unwrap().topology();
        let h = generated(&topology, 250);
        assert_eq!(h.groups.len() + 1, 1004, "the root, three slices, four cgroups a pod");
        let one_core: Vec<&Group> = h.groups.iter().filter(|g| g.cpus.len() == 2).collect();
        assert_eq!(one_core.len(), 50, "two containers of each of the 25 Guaranteed pods");
        let dir = tempfile::tempdir().unwrap();
        h.write(&dir.path().join("cgroup"), &online(&topology)).unwrap();
    }

    #[test]
    fn the_generated_node_has_the_workloads_asked_each_on_a_core_of_its_own() {
        let topology = crate::fixtures::machine("turin-2p").unwrap().topology();
        let one_core = |h: &Hierarchy| -> Vec<Vec<u32>> {
            h.groups.iter().filter(|g| g.cpus.len() == 2).map(|g| g.cpus.clone()).collect()
        };
        let h = generated_with(&topology, 250, 100);
        assert_eq!(h.groups.len() + 1, 1004, "as many cgroups as with fewer workloads");
        let owned = one_core(&h);
        assert_eq!(owned.len(), 100);
        let distinct: BTreeSet<&Vec<u32>> = owned.iter().collect();
        assert_eq!(distinct.len(), 100, "a core each");
        assert_eq!(one_core(&generated_with(&topology, 250, 101)).len(), 101, "an odd count");
        assert_eq!(one_core(&generated_with(&topology, 10, 100)).len(), 20, "two a pod at most");
        let most = generated_with(&topology, 1000, 1000);
        let sets: BTreeSet<Vec<u32>> = one_core(&most).into_iter().collect();
        assert_eq!(sets.len(), 384, "383 owned, one core left to the shared pool");
        assert_eq!(generated_workloads(&topology, 1000, 1000), 383);
        assert_eq!(generated_workloads(&topology, 10, 100), 20);
        assert_eq!(
            one_core(&generated(&topology, 250)),
            one_core(&generated_with(&topology, 250, 50))
        );
    }

    #[test]
    fn an_effective_set_is_the_request_within_the_parents() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::default();
        h.add("a", vec![0, 1, 2]).add("a/b", vec![2, 3]).add("a/c", vec![9]).add_plain("d");
        h.write(dir.path(), &(0..8).collect()).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("a/cpuset.cpus.effective"), "0-2\n");
        assert_eq!(read("a/b/cpuset.cpus.effective"), "2\n");
        assert_eq!(read("a/c/cpuset.cpus.effective"), "0-2\n", "outside the parent's");
        assert!(!dir.path().join("d/cpuset.cpus.effective").exists());
        assert_eq!(read("a/cgroup.subtree_control"), "cpuset cpu memory pids\n");
    }

    #[test]
    fn an_oversized_cpuset_is_a_valid_looking_list_of_the_size_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::default();
        h.add("a", vec![0, 1]);
        h.write(dir.path(), &(0..8).collect()).unwrap();
        for size in [1 << 20, (1 << 20) + 1, (1 << 20) + 2, (1 << 20) + 3] {
            write_oversized_cpuset(dir.path(), "a", size).unwrap();
            let text = std::fs::read_to_string(dir.path().join("a/cpuset.cpus.effective")).unwrap();
            assert!(text.len() <= size && text.len() + 4 > size, "{size}: {}", text.len());
            let list = text.strip_suffix('\n').unwrap();
            assert!(
                list.split(',').all(|item| item == "0-1"),
                "{size}: {}",
                &list[list.len() - 8..]
            );
        }
    }

    #[test]
    fn an_unreadable_cgroup_is_closed_to_all_but_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut h = Hierarchy::default();
        h.add("a", vec![]).add("a/b", vec![]);
        h.write(dir.path(), &(0..8).collect()).unwrap();
        make_unreadable(dir.path(), "a/b").unwrap();
        let mode = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().permissions().mode();
        assert_eq!(mode("a/b") & 0o777, 0o700);
        assert_ne!(mode("a") & 0o777, 0o700, "the parent is left as it was");
    }
}
