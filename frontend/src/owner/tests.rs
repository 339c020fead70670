//! The rule of the core-owner collector on cgroup trees written to temporary directories, one
//! test per behaviour, and the reading of the hierarchy and its failures.

use super::*;
use std::fs;
use std::time::Duration;

/// A cgroup tree written to a temporary directory.
struct Tree(tempfile::TempDir);

impl Tree {
    /// A cgroup v2 root with the cpuset controller and `cpus` online.
    fn v2(cpus: &str) -> Tree {
        let tree = Tree(tempfile::tempdir().unwrap());
        tree.file("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
        tree.file("cgroup.subtree_control", "cpuset cpu io memory pids\n");
        tree.file("cpuset.cpus.effective", &format!("{cpus}\n"));
        tree
    }

    fn root(&self) -> &Path {
        self.0.path()
    }

    fn file(&self, path: &str, content: &str) -> &Tree {
        let path = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
        self
    }

    /// A cgroup of type `kind`, with `cpuset.cpus.effective` if `cpus` is given; its missing
    /// ancestors are domain cgroups without cpuset files.
    fn cgroup(&self, path: &str, kind: &str, cpus: Option<&str>) -> &Tree {
        let mut dir = self.root().to_path_buf();
        for part in path.trim_start_matches('/').split('/') {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap();
                fs::write(dir.join("cgroup.type"), "domain\n").unwrap();
            }
        }
        self.file(&format!("{path}/cgroup.type"), &format!("{kind}\n"));
        if let Some(cpus) = cpus {
            self.file(&format!("{path}/cpuset.cpus.effective"), &format!("{cpus}\n"));
        }
        self
    }

    /// A domain cgroup with its effective cpuset.
    fn domain(&self, path: &str, cpus: &str) -> &Tree {
        self.cgroup(path, "domain", Some(cpus))
    }

    fn owners(&self, cores: &[Core]) -> Vec<(u32, u32, String)> {
        read(self.root(), LIMITS)
            .unwrap()
            .hierarchy
            .owners(cores)
            .into_iter()
            .map(|(c, owner)| (c.socket, c.core, owner.path.clone()))
            .collect()
    }
}

/// The bounds of a walk before the broker's topology is known.
const LIMITS: Limits = Limits { cpus: MAX_CPUS, cgroups: MAX_CGROUPS, bytes: MAX_WALK_BYTES };

/// One socket of `n` cores with SMT: core `i` is CPUs `i` and `i + n`.
fn smt_cores(n: u32) -> Vec<Core> {
    (0..n)
        .map(|i| Core { socket: 0, core: i, cpu: i, apic_id: 2 * i, threads: vec![i, i + n] })
        .collect()
}

fn owned(core: u32, owner: &str) -> (u32, u32, String) {
    (0, core, owner.to_owned())
}

#[test]
fn a_cgroup_holding_every_thread_of_a_core_owns_it() {
    let tree = Tree::v2("0-7");
    tree.domain("/system.slice", "0-7").domain("/system.slice/db.service", "0-1,4-5");
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(0, "/system.slice/db.service"), owned(1, "/system.slice/db.service")]
    );
}

#[test]
fn a_core_only_half_inside_a_cgroup_is_unassigned() {
    let tree = Tree::v2("0-7");
    // Three threads: core 0 whole, and only the first thread of core 1.
    tree.domain("/job_1", "0-1,4");
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(0, "/job_1")]);
}

#[test]
fn the_deepest_restricting_cgroup_that_holds_the_core_owns_it() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0-1,4-5")
        .domain("/job_1/step_0", "0-1,4-5")
        .domain("/job_1/step_0/task_0", "0,4")
        .domain("/job_1/step_0/task_1", "1,5");
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(0, "/job_1/step_0/task_0"), owned(1, "/job_1/step_0/task_1")],
        "step_0 has its parent's set and does not restrict; each task holds a whole core"
    );
}

#[test]
fn a_descendant_holding_part_of_a_core_leaves_it_to_the_ancestor_that_holds_it_whole() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0-1,4-5").domain("/job_1/task_0", "0").domain("/job_1/task_1", "4");
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(0, "/job_1"), owned(1, "/job_1")]);
}

#[test]
fn a_core_in_two_overlapping_sibling_cpusets_is_unassigned() {
    let tree = Tree::v2("0-7");
    tree.domain("/a.service", "0-1,4-5").domain("/b.service", "1-2,5-6");
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(0, "/a.service"), owned(2, "/b.service")],
        "core 1 is in both"
    );
}

#[test]
fn a_sibling_that_touches_one_thread_of_a_core_makes_it_unassigned() {
    let tree = Tree::v2("0-7");
    tree.domain("/a.service", "0,4").domain("/b.service", "4");
    assert_eq!(tree.owners(&smt_cores(4)), vec![]);
}

#[test]
fn a_shared_pool_held_by_many_containers_is_unassigned() {
    let tree = Tree::v2("0-7");
    tree.domain("/kubepods", "0-7")
        .domain("/kubepods/pod-g/exclusive", "0,4")
        .domain("/kubepods/burstable/pod-b/app", "1-3,5-7")
        .domain("/kubepods/besteffort/pod-e/app", "1-3,5-7");
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(0, "/kubepods/pod-g/exclusive")]);
}

#[test]
fn a_single_cgroup_restricted_to_a_pool_is_reported_as_its_owner() {
    // The known limit: the rule cannot tell a pool from an assignment.
    let tree = Tree::v2("0-7");
    tree.domain("/kubepods", "0-7").domain("/kubepods/besteffort/pod-e/app", "1-3,5-7");
    let owners = tree.owners(&smt_cores(4));
    assert_eq!(owners.len(), 3);
    assert!(owners.iter().all(|(_, _, o)| o == "/kubepods/besteffort/pod-e/app"));
}

#[test]
fn the_root_never_restricts_and_an_unrestricted_host_has_no_owner() {
    // The root holds fewer CPUs than the cores have threads (CPUs 6-7 offline or isolated).
    let tree = Tree::v2("0-5");
    tree.domain("/system.slice", "0-5").domain("/user.slice", "0-5");
    assert_eq!(tree.owners(&smt_cores(4)), vec![]);
}

#[test]
fn a_cgroup_with_its_parents_set_does_not_restrict() {
    let tree = Tree::v2("0-7");
    tree.domain("/workload.slice", "0-1,4-5")
        .domain("/workload.slice/a.service", "0-1,4-5")
        .domain("/workload.slice/b.service", "0-1,4-5");
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(0, "/workload.slice"), owned(1, "/workload.slice")],
        "a.service and b.service overlap, but neither restricts"
    );
}

#[test]
fn a_cgroup_without_cpuset_files_has_its_parents_set() {
    let tree = Tree::v2("0-7");
    tree.domain("/workload.slice", "2,6").cgroup("/workload.slice/a.service", "domain", None);
    // Without cpuset enabled below the root, no cgroup restricts.
    tree.cgroup("/user.slice", "domain", None).cgroup("/user.slice/u.service", "domain", None);
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(2, "/workload.slice")]);
}

#[test]
fn a_threaded_cgroup_belongs_to_its_nearest_domain_ancestor() {
    let tree = Tree::v2("0-7");
    // libvirt: the VM's scope holds cores 1 and 2; its vCPU threads are pinned one CPU each.
    tree.domain("/machine.slice", "0-7")
        .domain("/machine.slice/vm1.scope", "1-2,5-6")
        .cgroup("/machine.slice/vm1.scope/libvirt", "domain threaded", Some("1-2,5-6"))
        .cgroup("/machine.slice/vm1.scope/libvirt/vcpu0", "threaded", Some("1,5"))
        .cgroup("/machine.slice/vm1.scope/libvirt/vcpu1", "threaded", Some("2"))
        .cgroup("/machine.slice/vm1.scope/libvirt/emulator", "threaded", Some("1-2,5-6"))
        // A threaded cgroup elsewhere pinned to core 2's threads takes nothing from the VM.
        .cgroup("/dpdk.service", "domain threaded", Some("0-7"))
        .cgroup("/dpdk.service/worker0", "threaded", Some("2,6"));
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(1, "/machine.slice/vm1.scope"), owned(2, "/machine.slice/vm1.scope")]
    );
}

#[test]
fn a_partition_root_restricts_and_owns_its_cpus() {
    // An isolated partition takes CPUs 3 and 7 out of its parent's (the root's) effective set.
    let tree = Tree::v2("0-2,4-6");
    tree.domain("/isolated.slice", "3,7")
        .file("/isolated.slice/cpuset.cpus.partition", "isolated\n")
        .domain("/system.slice", "0-2,4-6");
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(3, "/isolated.slice")]);
}

#[test]
fn a_cgroup_that_vanishes_while_it_is_read_is_skipped() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0,4").domain("/job_2", "1,5");
    // job_2 was removed between the listing of the root and the read of its files: its
    // directory is listed, its files are gone (ENOENT, as for a removed cgroup).
    fs::remove_file(tree.root().join("job_2/cgroup.type")).unwrap();
    assert_eq!(tree.owners(&smt_cores(4)), vec![owned(0, "/job_1")]);
    assert!(vanished(&io::Error::from_raw_os_error(rustix::io::Errno::NODEV.raw_os_error())));
    assert!(!vanished(&io::Error::from(io::ErrorKind::PermissionDenied)));
}

#[test]
fn a_cgroup_v1_host_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for controller in ["cpuset", "cpu,cpuacct", "memory", "systemd"] {
        fs::create_dir_all(dir.path().join(controller)).unwrap();
    }
    fs::write(dir.path().join("cpuset/cpuset.cpus"), "0-7\n").unwrap();
    let err = read(dir.path(), LIMITS).unwrap_err();
    assert!(matches!(err, OwnerError::NotV2 { .. }), "{err:?}");
    assert!(err.to_string().contains("not a cgroup v2 hierarchy"), "{err}");
}

#[test]
fn a_v2_hierarchy_without_the_cpuset_controller_is_an_error() {
    // A hybrid host's unified hierarchy: cpuset is bound to v1.
    let tree = Tree::v2("0-7");
    tree.file("cgroup.controllers", "cpu io memory pids\n");
    let err = read(tree.root(), LIMITS).unwrap_err();
    assert!(matches!(err, OwnerError::NoCpuset { .. }), "{err:?}");
}

#[test]
fn a_missing_hierarchy_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = read(&dir.path().join("nothing"), LIMITS).unwrap_err();
    assert!(matches!(err, OwnerError::NotV2 { .. }), "{err:?}");
}

#[test]
fn an_unreadable_cpuset_file_is_an_error_not_a_partial_answer() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0,4").cgroup("/job_2", "domain", None);
    // Unreadable even for root: the file is a directory (EISDIR).
    fs::create_dir(tree.root().join("job_2/cpuset.cpus.effective")).unwrap();
    let err = read(tree.root(), LIMITS).unwrap_err();
    match &err {
        OwnerError::Read { path, .. } => assert!(path.ends_with("job_2/cpuset.cpus.effective")),
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("job_2/cpuset.cpus.effective"), "{err}");
}

#[test]
fn an_unreadable_directory_is_an_error() {
    let tree = Tree::v2("0-7");
    // A regular file where a cgroup's subtree listing should be: ENOTDIR.
    tree.domain("/job_1", "0,4");
    let err = subdirectories(&tree.root().join("job_1/cgroup.type")).unwrap_err();
    assert!(matches!(err, OwnerError::Read { .. }), "{err:?}");
}

#[test]
fn a_malformed_cpu_list_is_an_error() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0-x");
    let err = read(tree.root(), LIMITS).unwrap_err();
    assert!(matches!(&err, OwnerError::CpuList { content, .. } if content == "0-x"), "{err:?}");
}

#[test]
fn cpu_lists_parse_as_the_kernel_prints_them() {
    let set = CpuSet::parse_all("0-2,5,64-65\n").unwrap();
    let members: Vec<u32> = (0..130).filter(|&c| set.contains(c)).collect();
    assert_eq!(members, vec![0, 1, 2, 5, 64, 65]);
    assert_eq!(CpuSet::parse_all("\n"), Some(CpuSet::default()));
    assert_eq!(CpuSet::parse_all("3-1"), None);
    assert_eq!(CpuSet::parse_all("0-4294967295"), None, "beyond MAX_CPUS");
    assert_eq!(CpuSet::parse_all("a"), None);
    // The same set however it is written: restriction compares sets, not text.
    assert_eq!(CpuSet::parse_all("0-1,3"), CpuSet::parse_all("0,1,3"));
    assert_eq!(CpuSet::parse_all("0-127"), CpuSet::parse_all("0-63,64-127"));
}

#[test]
fn owner_paths_keep_systemd_escapes_verbatim() {
    let tree = Tree::v2("0-7");
    tree.domain("/machine.slice/machine-qemu\\x2d1\\x2dvm.scope", "3,7");
    assert_eq!(
        tree.owners(&smt_cores(4)),
        vec![owned(3, "/machine.slice/machine-qemu\\x2d1\\x2dvm.scope")]
    );
}

#[test]
fn a_core_without_listed_threads_has_no_owner() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0-7");
    let mut cores = smt_cores(1);
    cores[0].threads.clear();
    assert_eq!(tree.owners(&cores), vec![]);
}

#[test]
fn the_cause_is_logged_once_and_again_only_when_it_changes() {
    let log = CauseLog::default();
    let denied = || OwnerError::Read {
        path: PathBuf::from("/sys/fs/cgroup/a/cpuset.cpus.effective"),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    assert!(log.failed(&denied()), "first failure logged");
    assert!(!log.failed(&denied()), "same cause, not logged again");
    let elsewhere = OwnerError::Read {
        path: PathBuf::from("/sys/fs/cgroup/b/cpuset.cpus.effective"),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    assert!(!log.failed(&elsewhere), "another file, same cause");
    assert!(log.failed(&OwnerError::NotV2 { root: PathBuf::from("/x") }), "cause changed");
    log.succeeded();
    assert_eq!(log.current(), None);
    assert!(log.failed(&OwnerError::NotV2 { root: PathBuf::from("/x") }), "failing again");
}

#[test]
fn a_cgroup_with_two_links_has_no_children_and_one_with_more_is_listed() {
    let tree = Tree::v2("0-7");
    tree.domain("/a", "0-7").domain("/a/b", "0,4").domain("/a/c", "1,5");
    let mut reader = Reader { buf: Vec::new(), limits: LIMITS, bytes: 0 };
    let mut names = |dir: &str| children_of(&tree.root().join(dir), &mut reader).unwrap();
    assert_eq!(names("a"), Some(vec!["b".into(), "c".into()]));
    assert_eq!(names("a/b"), Some(Vec::new()));
    assert_eq!(names("gone"), None, "vanished");
}

impl CpuSet {
    /// [`CpuSet::parse`] without a topology: every CPU a list may name.
    fn parse_all(text: &str) -> Option<CpuSet> {
        CpuSet::parse(text, MAX_CPUS)
    }
}

/// Runs `f` on a thread that reads files as an ordinary user does: without the effective
/// `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` a root test run holds (capabilities are per
/// thread, and the thread ends with `f`).
fn without_file_capabilities<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut sets = capabilities(None).unwrap();
                sets.effective -= CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
                set_capabilities(None, sets).unwrap();
                f()
            })
            .join()
            .unwrap()
    })
}

/// `path` (a directory of `tree`) made unreadable to everyone but its owner, as a user's
/// `chmod 0700` of a cgroup in their delegated subtree makes it for the exporter.
fn chmod_0700(tree: &Tree, path: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    // 0700 of a directory the user owns; here the test owns it, so no bit is left for it.
    let dir = tree.root().join(path.trim_start_matches('/'));
    fs::set_permissions(dir, fs::Permissions::from_mode(0o000)).unwrap();
}

/// A host with a job owning core 0 and a user whose delegated subtree holds cores 2 and 3.
fn host_with_a_user(tree: &Tree, user_delegates_cpuset: bool) {
    tree.domain("/system.slice", "0-7").domain("/system.slice/job_1.scope", "0,4");
    tree.domain("/user.slice", "2-3,6-7")
        .domain("/user.slice/user-1000.slice", "2-3,6-7")
        .domain("/user.slice/user-1000.slice/user@1000.service", "2-3,6-7")
        .domain("/user.slice/user-1000.slice/user@1000.service/app.slice", "2-3,6-7");
    let subtree =
        if user_delegates_cpuset { "cpuset cpu memory pids\n" } else { "cpu memory pids\n" };
    tree.file("/user.slice/user-1000.slice/user@1000.service/cgroup.subtree_control", subtree);
}

#[test]
fn an_unreadable_cgroup_in_a_subtree_without_cpuset_costs_nothing() {
    let tree = Tree::v2("0-7");
    host_with_a_user(&tree, false);
    tree.file(
        "/user.slice/user-1000.slice/user@1000.service/app.slice/cpuset.cpus.effective",
        "2\n",
    );
    chmod_0700(&tree, "/user.slice/user-1000.slice/user@1000.service/app.slice");
    let walk = without_file_capabilities(|| read(tree.root(), LIMITS)).unwrap();
    // Its parent does not enable cpuset for its children: app.slice cannot restrict, and is
    // not read at all.
    assert_eq!(walk.skipped, 0);
    let owners: Vec<_> = walk
        .hierarchy
        .owners(&smt_cores(4))
        .into_iter()
        .map(|(c, o)| (c.core, o.path.clone()))
        .collect();
    assert_eq!(
        owners,
        vec![
            (0, "/system.slice/job_1.scope".to_owned()),
            (2, "/user.slice".to_owned()),
            (3, "/user.slice".to_owned())
        ]
    );
}

#[test]
fn an_unreadable_cgroup_is_skipped_and_unassigns_only_the_cores_its_parent_holds() {
    let tree = Tree::v2("0-7");
    host_with_a_user(&tree, true);
    chmod_0700(&tree, "/user.slice/user-1000.slice/user@1000.service/app.slice");
    let walk = without_file_capabilities(|| read(tree.root(), LIMITS)).unwrap();
    assert_eq!(walk.skipped, 1);
    let (path, kind) = walk.first_skipped.clone().unwrap();
    assert!(path.ends_with("app.slice/cpuset.cpus.effective"), "{}", path.display());
    assert_eq!(kind, io::ErrorKind::PermissionDenied);
    // Every other workload keeps its owner; the cores app.slice could hold (its parent's set)
    // are unassigned, not given to an ancestor that might not own them.
    let owners: Vec<_> = walk
        .hierarchy
        .owners(&smt_cores(4))
        .into_iter()
        .map(|(c, o)| (c.core, o.path.clone()))
        .collect();
    assert_eq!(owners, vec![(0, "/system.slice/job_1.scope".to_owned())]);
}

#[test]
fn an_unreadable_root_is_an_error() {
    let tree = Tree::v2("0-7");
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(
        tree.root().join("cpuset.cpus.effective"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let err = without_file_capabilities(|| read(tree.root(), LIMITS)).unwrap_err();
    assert!(matches!(&err, OwnerError::Read { source, .. } if denied(source)), "{err:?}");
}

#[test]
fn a_hierarchy_past_the_cgroup_bound_is_an_error_not_a_partial_answer() {
    let tree = Tree::v2("0-7");
    for job in 0..4 {
        tree.domain(&format!("/job_{job}"), &format!("{job},{}", job + 4));
    }
    let limits = Limits { cgroups: 3, ..LIMITS };
    let err = read(tree.root(), limits).unwrap_err();
    assert!(matches!(err, OwnerError::TooLarge { what: "cgroups", limit: 3 }), "{err:?}");
    assert_eq!(read(tree.root(), Limits { cgroups: 4, ..LIMITS }).unwrap().skipped, 0);
}

#[test]
fn an_oversized_file_or_walk_is_an_error_and_costs_no_more_than_its_bound() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0,4");
    let huge = "0,".repeat(40 * 1024);
    tree.file("/job_1/cpuset.cpus.effective", &huge);
    let err = read(tree.root(), LIMITS).unwrap_err();
    assert!(
        matches!(&err, OwnerError::Read { source, .. } if source.kind() == io::ErrorKind::FileTooLarge),
        "{err:?}"
    );
    tree.file("/job_1/cpuset.cpus.effective", "0,4\n");
    let err = read(tree.root(), Limits { bytes: 16, ..LIMITS }).unwrap_err();
    assert!(matches!(err, OwnerError::TooLarge { what: "bytes", .. }), "{err:?}");
}

#[test]
fn a_fifo_in_the_hierarchy_is_refused_at_once() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0,4");
    let fifo = tree.root().join("job_1/cpuset.cpus.effective");
    fs::remove_file(&fifo).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let err = read(tree.root(), LIMITS).unwrap_err();
    assert!(err.to_string().contains("job_1/cpuset.cpus.effective"), "{err}");
    assert!(matches!(&err, OwnerError::Read { source, .. } if source.to_string().contains("FIFO")));
}

#[test]
fn cpu_lists_keep_only_the_topologys_cpus() {
    let set = CpuSet::parse("0-65535", 8).unwrap();
    assert_eq!(Some(set.clone()), CpuSet::parse_all("0-7"));
    assert_eq!(set.0.len(), 1, "one word, not 1,024");
    assert_eq!(CpuSet::parse("9-12,3", 8), CpuSet::parse_all("3"));
    assert_eq!(CpuSet::parse("65536", 8), None, "still malformed past MAX_CPUS");
    let limits = Limits::for_highest_cpu(Some(383));
    assert_eq!(limits.cpus, 384);
    assert_eq!(Limits::for_highest_cpu(None).cpus, MAX_CPUS);
}

#[test]
fn cgroups_that_do_not_restrict_share_their_parents_set() {
    let tree = Tree::v2("0-7");
    tree.domain("/a", "0-7").domain("/a/b", "0-7").domain("/a/b/c", "0,4").domain("/d", "0-7");
    let walk = read(tree.root(), LIMITS).unwrap();
    assert_eq!(walk.hierarchy.sets.len(), 2, "the root's set and c's, nothing per cgroup");
}

#[tokio::test]
async fn scrapes_share_one_walk_while_it_is_fresh_and_start_one_after() {
    let tree = Tree::v2("0-7");
    tree.domain("/job_1", "0,4");
    async fn scrape(walker: &Walker) -> Arc<Done> {
        let permit = crate::work::Permits::new(0).try_take().unwrap();
        let now = tokio::time::Instant::now();
        walker.walk(now, now + Duration::from_secs(10), &permit).await.unwrap()
    }
    let walker = Walker::with_max_age(tree.root().to_path_buf(), "/proc".into(), WALK_MAX_AGE);
    let first = scrape(&walker).await;
    let second = scrape(&walker).await;
    assert!(Arc::ptr_eq(&first, &second), "a walk that began after the scrape arrived is shared");
    assert_eq!(walker.walks(), 1);
    assert!(first.result.is_ok());
    // A scrape arriving after the walk's freshness has passed gets a walk of its own.
    let walker = Walker::with_max_age(tree.root().to_path_buf(), "/proc".into(), Duration::ZERO);
    let first = scrape(&walker).await;
    let second = scrape(&walker).await;
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(walker.walks(), 2);
}

#[tokio::test]
async fn a_walk_holds_the_permit_of_the_scrape_that_asked_for_it_until_it_ends() {
    let tree = Tree::v2("0-7");
    let walker = Walker::with_max_age(tree.root().to_path_buf(), "/proc".into(), WALK_MAX_AGE);
    let permits = crate::work::Permits::new(1);
    let permit = permits.try_take().unwrap();
    let now = tokio::time::Instant::now();
    let done = walker.walk(now, now + Duration::from_secs(10), &permit).await.unwrap();
    drop(permit);
    assert!(done.result.is_ok());
    // The walk ended and the scrape dropped its clone: the place is free again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while permits.available() != 1 {
        assert!(std::time::Instant::now() < deadline, "the walk kept its permit");
        std::thread::yield_now();
    }
}

/// Issue 28: the `vm` label of a libvirt guest's scope is its domain name, systemd's escapes
/// undone in the exporter (any number of dashes, any escaped byte), with the `<id>-` prefix
/// gone; nothing else is a VM.
#[test]
fn a_libvirt_scope_names_its_domain_with_every_escape_undone() {
    let vm = |owner: &str| Identity::of(owner.as_bytes()).vm;
    assert_eq!(
        vm(r"/machine.slice/machine-qemu\x2d1\x2dbuild\x2dvm.scope").as_deref(),
        Some("build-vm")
    );
    let dashes = r"/machine.slice/machine-qemu\x2d42\x2da\x2db\x2dc\x2dd\x2de\x2df\x2dg\x2dh\x2di\x2dj.scope";
    assert_eq!(
        vm(dashes).as_deref(),
        Some("a-b-c-d-e-f-g-h-i-j"),
        "more dashes than the rule undid"
    );
    assert_eq!(
        vm(r"/machine.slice/machine-qemu\x2d3\x2dcaf\xc3\xa9\x20vm.scope").as_deref(),
        Some("café vm")
    );
    // A custom partition, and the vCPU threads' cgroups below the scope.
    let nested =
        r"/machine.slice/machine-tenant.slice/machine-qemu\x2d5\x2dweb.scope/libvirt/vcpu0";
    assert_eq!(vm(nested).as_deref(), Some("web"));
    for not_a_vm in [
        "/system.slice/postgresql.service",
        r"/machine.slice/machine-qemu\x2d1.scope",
        r"/machine.slice/machine-qemu\x2dx\x2dname.scope",
        r"/machine.slice/machine-qemu\x2d1\x2d.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dname.slice",
        r"/machine.slice/machine-lxc\x2d1\x2dname.scope",
    ] {
        assert_eq!(vm(not_a_vm), None, "{not_a_vm}");
    }
}

/// The hostile-table discipline: a name a user could give a cgroup in a delegated subtree never
/// becomes a label that is oversized, not UTF-8, or breaks a line, and a deep path costs one
/// pass.
#[test]
fn a_hostile_libvirt_like_name_gives_no_vm_label() {
    let vm = |owner: &str| Identity::of(owner.as_bytes()).vm;
    for hostile in [
        r"/machine.slice/machine-qemu\x2d1\x2dbad\x0aname.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dbad\x00.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dnot\xffutf8.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dcut\x2.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dbad\xzz.scope",
        r"/machine.slice/machine-qemu\x2d1\x2dtrailing\.scope",
    ] {
        assert_eq!(vm(hostile), None, "{hostile}");
    }
    let long = format!(r"/machine.slice/machine-qemu\x2d1\x2d{}.scope", "a".repeat(250));
    assert_eq!(vm(&long), None, "longer than a cgroup name");
    let fits = format!(r"/machine.slice/machine-qemu\x2d1\x2d{}.scope", "a".repeat(200));
    assert_eq!(vm(&fits).map(|n| n.len()), Some(200));
    let deep = format!(
        "/machine.slice{}{}",
        "/d.slice".repeat(100_000),
        r"/machine-qemu\x2d1\x2ddeep.scope"
    );
    assert_eq!(vm(&deep).as_deref(), Some("deep"));
    // A name holding U+FFFD itself is UTF-8 and passes; a raw byte that is not UTF-8 (0xFF) gives
    // no label (identity.rs), where a lossy path turned it into U+FFFD (hostile test Q8).
    assert_eq!(
        vm("/machine.slice/machine-qemu\\x2d1\\x2da\u{FFFD}b.scope").as_deref(),
        Some("a\u{FFFD}b")
    );
}

/// A Slurm 26.05 node: the stepd scope, job `sEKNKTV3WPV500` on cores 0-1 (CPUs 0-1, 4-5 of
/// [`smt_cores`]`(4)`) with its `step_extern` and `step_0`, each with its `slurm` leaf holding
/// the PIDs `procs` gives for the step, and a procfs beside it.
struct SlurmNode {
    tree: Tree,
    proc: tempfile::TempDir,
}

const SCOPE: &str = "/system.slice/slurmstepd.scope";
const SLUID: &str = "sEKNKTV3WPV500";

impl SlurmNode {
    fn new(procs: impl Fn(&str) -> String) -> SlurmNode {
        let tree = Tree::v2("0-7");
        tree.domain(SCOPE, "0-7").domain(&format!("{SCOPE}/system"), "0-7");
        let job = format!("{SCOPE}/{SLUID}");
        tree.domain(&job, "0-1,4-5");
        for step in ["step_extern", "step_0"] {
            for leaf in ["slurm", "user"] {
                let dir = format!("{job}/{step}/{leaf}");
                tree.domain(&dir, "0-1,4-5");
                let pids = if leaf == "slurm" { procs(step) } else { "9999\n".to_owned() };
                tree.file(&format!("{dir}/cgroup.procs"), &pids);
            }
        }
        SlurmNode { tree, proc: tempfile::tempdir().unwrap() }
    }

    /// Process `pid` in the procfs: its `cgroup` and its `cmdline`.
    fn process(&self, pid: u32, cgroup: &str, cmdline: &[u8]) -> &SlurmNode {
        let dir = self.proc.path().join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        fs::write(dir.join("cmdline"), cmdline).unwrap();
        self
    }

    fn leaf(step: &str) -> String {
        format!("{SCOPE}/{SLUID}/{step}/slurm")
    }

    /// The owner of core 0 after a walk and the stepds read with `stepds`.
    fn owner_with(&self, stepds: &mut stepd::Stepds) -> Arc<Owner> {
        let mut walk = read(self.tree.root(), LIMITS).unwrap();
        stepds.resolve(self.tree.root(), &mut walk.hierarchy);
        let owners = walk.hierarchy.owners(&smt_cores(4));
        assert_eq!(owners.len(), 2, "{owners:?}");
        Arc::clone(&owners[0].1)
    }

    fn owner(&self) -> Arc<Owner> {
        self.owner_with(&mut stepd::Stepds::new(self.proc.path().to_path_buf()))
    }
}

fn step_pids(step: &str) -> String {
    match step {
        "step_extern" => "101\n".to_owned(),
        _ => "102\n103\n".to_owned(),
    }
}

#[test]
fn a_sluid_job_gets_its_numeric_id_from_its_stepds_title() {
    let node = SlurmNode::new(step_pids);
    node.process(101, &SlurmNode::leaf("step_extern"), b"slurmstepd: [3385.extern]\0\0\0\0");
    let owner = node.owner();
    assert_eq!(owner.path, format!("{SCOPE}/{SLUID}"));
    assert_eq!(owner.identity.hpc_job.as_deref(), Some("3385"));
    assert_eq!(owner.identity.slurm_sluid.as_deref(), Some(SLUID), "the SLUID stays");
    // Any step's stepd will do: the extern one is gone, step 0's second PID is the stepd.
    let node = SlurmNode::new(step_pids);
    node.process(102, "/system.slice/slurmstepd.scope/system", b"/usr/sbin/slurmstepd\0").process(
        103,
        &SlurmNode::leaf("step_0"),
        b"slurmstepd: [3385.0]\0",
    );
    assert_eq!(node.owner().identity.hpc_job.as_deref(), Some("3385"));
}

#[test]
fn a_sluid_job_whose_stepd_cannot_be_seen_keeps_its_sluid_and_no_job() {
    // hidepid or ProtectProc=invisible: the PIDs are listed, their /proc entries absent.
    let node = SlurmNode::new(step_pids);
    let owner = node.owner();
    assert_eq!(owner.identity.hpc_job, None);
    assert_eq!(owner.identity.slurm_sluid.as_deref(), Some(SLUID));
    // No stepd at all (the leaves are empty).
    let node = SlurmNode::new(|_| String::new());
    assert_eq!(node.owner().identity.hpc_job, None);
}

/// The hostile table's rows for the stepd's inputs: a process that is not in the leaf it is
/// listed in, a title of another step or job shape, a huge `cgroup.procs` or `cmdline`, a FIFO,
/// a link; each gives no `hpc_job` or the right one, never a wrong one, and reads no more than
/// its bound.
#[test]
fn a_stepd_input_that_lies_is_huge_or_blocks_names_no_wrong_job() {
    let leaf = SlurmNode::leaf("step_extern");
    let job = |node: &SlurmNode| node.owner().identity.hpc_job.clone();
    // A process of the user's tasks, or one moved out, with a stepd's title.
    let node = SlurmNode::new(step_pids);
    node.process(101, &format!("{SCOPE}/{SLUID}/step_extern/user"), b"slurmstepd: [1.extern]\0");
    assert_eq!(job(&node), None);
    // The title of another step, another program, a leading zero, or not a number.
    for title in [
        &b"slurmstepd: [3385.0]\0"[..],
        b"bash\0-c\0slurmstepd: [3385.extern]\0",
        b"slurmstepd: [03385.extern]\0",
        b"slurmstepd: [x.extern]\0",
        b"slurmstepd: [3385.extern]\n",
    ] {
        let node = SlurmNode::new(step_pids);
        node.process(101, &leaf, title);
        assert_eq!(job(&node), None, "{}", String::from_utf8_lossy(title));
    }
    // A huge cgroup.procs: its first PID is read, and no more than the bound.
    let mut huge = String::from("101\n");
    while huge.len() < 1 << 20 {
        huge.push_str("4000000\n");
    }
    let node =
        SlurmNode::new(|step| if step == "step_extern" { huge.clone() } else { String::new() });
    node.process(101, &leaf, b"slurmstepd: [3385.extern]\0");
    assert_eq!(job(&node).as_deref(), Some("3385"));
    // A huge command line: its title is its beginning.
    let node = SlurmNode::new(step_pids);
    let mut cmdline = b"slurmstepd: [3385.extern]\0".to_vec();
    cmdline.resize(1 << 20, b'a');
    node.process(101, &leaf, &cmdline);
    assert_eq!(job(&node).as_deref(), Some("3385"));
    // A title past the bound is no title.
    let node = SlurmNode::new(step_pids);
    let mut long = b"slurmstepd: [3385.extern".to_vec();
    long.resize(stepd::MAX_READ as usize + 10, b' ');
    node.process(101, &leaf, &long);
    assert_eq!(job(&node), None);
    // A FIFO for a cmdline or a cgroup.procs is refused at the open: the walk does not block.
    let node = SlurmNode::new(step_pids);
    node.process(101, &leaf, b"");
    let fifo = node.proc.path().join("101/cmdline");
    fs::remove_file(&fifo).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR).unwrap();
    let procs = node.tree.root().join(format!("{}/cgroup.procs", &SlurmNode::leaf("step_0")[1..]));
    fs::remove_file(&procs).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, &procs, rustix::fs::Mode::RUSR).unwrap();
    assert_eq!(job(&node), None);
    // A /proc/<pid> that is a link (to another process's entry) is not followed.
    let node = SlurmNode::new(step_pids);
    node.process(7, &leaf, b"slurmstepd: [3385.extern]\0");
    std::os::unix::fs::symlink("7", node.proc.path().join("101")).unwrap();
    assert_eq!(job(&node), None);
}

#[test]
fn a_sluid_read_once_is_kept_while_walks_see_it_and_forgotten_after() {
    let node = SlurmNode::new(step_pids);
    node.process(101, &SlurmNode::leaf("step_extern"), b"slurmstepd: [3385.extern]\0");
    let mut stepds = stepd::Stepds::new(node.proc.path().to_path_buf());
    assert_eq!(node.owner_with(&mut stepds).identity.hpc_job.as_deref(), Some("3385"));
    // The stepd's entry is gone (the stepd of the extern step ended, the job runs on): the id
    // read stays, no process is read again.
    fs::remove_dir_all(node.proc.path().join("101")).unwrap();
    assert_eq!(node.owner_with(&mut stepds).identity.hpc_job.as_deref(), Some("3385"));
    // The job ends and a walk no longer sees it: its id is forgotten. Written again with the
    // same SLUID (which Slurm never does: a requeue makes a new one), the job is read afresh
    // and, its stepd unseen, has no id.
    fs::remove_dir_all(node.tree.root().join(&format!("{SCOPE}/{SLUID}")[1..])).unwrap();
    let mut walk = read(node.tree.root(), LIMITS).unwrap();
    stepds.resolve(node.tree.root(), &mut walk.hierarchy);
    assert!(walk.hierarchy.owners(&smt_cores(4)).is_empty());
    let rebuilt = SlurmNode::new(step_pids);
    assert_eq!(rebuilt.owner_with(&mut stepds).identity.hpc_job, None);
}
