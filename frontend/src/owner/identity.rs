//! Who a core's owner is, derived once from its cgroup path: the one table of the layouts that
//! the Slurm, kubelet, libvirt and systemd managers give their workloads' cgroups, each with a
//! fixture in this file's tests. A path that matches no layout, or whose names do not parse,
//! gets no identity label, never a guessed one; every label value is checked on the path's raw
//! bytes (UTF-8, no control character, no longer than a cgroup name).
//!
//! | manager | layout (from the hierarchy's root) | labels |
//! |---|---|---|
//! | Slurm's cgroup/v2 plugin, 22.05 to 26.05 | `/<slices>/[<node>_]slurmstepd.scope/<job>/step_<step>[/...]`; `<job>` is `job_<id>`, or from 26.05 the job's SLUID (`s` and 13 Crockford base-32 digits) unless `cgroup.conf` sets `CgroupJobIdPaths=yes` (26.05.2 and later) | `hpc_job` or `slurm_sluid`, `step` |
//! | kubelet, systemd driver | `/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid, _ for ->.slice[/<runtime>-<id>.scope]` | `pod_uid`, `container_id` |
//! | kubelet, cgroupfs driver | `/kubepods[/<qos>]/pod<uid>[/<id>]` | `pod_uid`, `container_id` |
//! | libvirt (systemd) | `/machine.slice[/<partition>.slice]/machine-qemu\x2d<n>\x2d<name>.scope[/...]` | `vm` |
//! | systemd | `/system.slice[/<slice>.slice...]/<unit>.service` or `.scope` | `unit` |
//!
//! Where each layout comes from:
//! - Slurm: `src/plugins/cgroup/v2/cgroup_v2.c` (`_set_int_cg_ns`, `cgroup_p_step_create`) of
//!   slurm-22-05-11-1 to slurm-26-05-3-1: the scope `<CgroupSlice>/slurmstepd.scope` (the slice
//!   `system.slice` before 25.11 and by default after), `<node>_slurmstepd.scope` where several
//!   slurmd run on one host, `"/job_%u"`, from 26.05.0 the bare SLUID unless
//!   `CgroupJobIdPaths` (26.05.2), `"%s/step_%s"` of `log_build_step_id_str` (`batch`, `extern`,
//!   `interactive`, `<N>`, `<N>+<M>` for a heterogeneous step before 26.05); the SLUID as
//!   `src/common/sluid.c`'s `print_sluid` writes it (`s`, then 13 of `0-9A-Z` less `I L O U`).
//! - kubelet: `pkg/kubelet/cm/cgroup_manager_linux.go` (the systemd driver's `.slice` names, `-`
//!   of a pod uid written `_`) and the runtimes' scope prefixes (`cri-containerd-`, `crio-`,
//!   `docker-`); a CPU-manager or DRA-driver cpuset is set on the same cgroups.
//! - libvirt: `src/util/vircgroup.c` via systemd-machined: `machine-qemu\x2d<id>\x2d<name>.scope`
//!   under `machine.slice` (a custom partition is a slice below it).
//!
//! Claims are placed, not named: each layout is recognised only where its manager puts it (a
//! scope named like a guest's under `user.slice` or inside a pod is no `vm`, hostile test Q3).

/// The longest cgroup name Linux allows (`NAME_MAX`).
const MAX_NAME: usize = 255;

/// What a core owner's cgroup path says of the workload, each label absent unless its layout
/// matched and its value parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    /// A Slurm job's numeric id.
    pub(crate) hpc_job: Option<String>,
    /// A Slurm job's SLUID, where its cgroup is keyed by it (26.05).
    pub(crate) slurm_sluid: Option<String>,
    /// A Slurm step: `batch`, `extern`, `interactive`, `<N>` or `<N>+<M>`.
    pub(crate) step: Option<String>,
    /// A Kubernetes pod's uid, with `-`.
    pub(crate) pod_uid: Option<String>,
    /// A container's id (64 hex digits), below its pod.
    pub(crate) container_id: Option<String>,
    /// A libvirt domain's name.
    pub(crate) vm: Option<String>,
    /// A systemd service or scope below `system.slice`.
    pub(crate) unit: Option<String>,
}

impl Identity {
    /// The identity of the cgroup at `path` (from the hierarchy's root, `/`-separated, raw bytes).
    pub(crate) fn of(path: &[u8]) -> Identity {
        let elements: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|e| !e.is_empty()).collect();
        if elements.iter().any(|e| e.len() > MAX_NAME) {
            return Identity::default();
        }
        slurm(&elements)
            .or_else(|| kubelet(&elements))
            .or_else(|| libvirt(&elements))
            .or_else(|| unit(&elements))
            .unwrap_or_default()
    }

    /// The labels present, by name, in the order they are written.
    pub(crate) fn labels(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("container_id", &self.container_id),
            ("hpc_job", &self.hpc_job),
            ("pod_uid", &self.pod_uid),
            ("slurm_sluid", &self.slurm_sluid),
            ("step", &self.step),
            ("unit", &self.unit),
            ("vm", &self.vm),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value.as_deref()?)))
    }
}

/// `bytes` as a label value: UTF-8 without a control character.
fn text(bytes: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(bytes).ok()?;
    (!s.is_empty() && !s.chars().any(char::is_control)).then(|| s.to_owned())
}

fn digits(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit)
}

/// A Slurm job id: decimal, no leading zero, within `u32` (`"/job_%u"`).
fn job_id(bytes: &[u8]) -> Option<String> {
    let id = text(bytes)?;
    (digits(bytes) && (bytes == b"0" || bytes[0] != b'0') && id.parse::<u32>().is_ok())
        .then_some(id)
}

/// A SLUID as `print_sluid` writes it: `s` and 13 Crockford base-32 digits, upper case, the
/// first of them at most `F` (it holds the top 4 of 64 bits).
fn sluid(bytes: &[u8]) -> Option<String> {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let [b's', first, rest @ ..] = bytes else { return None };
    (rest.len() == 12
        && first.is_ascii_hexdigit()
        && !first.is_ascii_lowercase()
        && rest.iter().all(|b| CROCKFORD.contains(b)))
    .then(|| text(bytes))?
}

/// A Slurm step name after `step_`: `batch`, `extern`, `interactive`, `<N>` or `<N>+<M>`.
fn step(bytes: &[u8]) -> Option<String> {
    let ok = match bytes {
        b"batch" | b"extern" | b"interactive" => true,
        _ => match bytes.iter().position(|&b| b == b'+') {
            Some(plus) => digits(&bytes[..plus]) && digits(&bytes[plus + 1..]),
            None => digits(bytes),
        },
    };
    ok.then(|| text(bytes))?
}

/// Where the first `[<node>_]slurmstepd.scope` is among `elements`.
fn stepd_scope(elements: &[&[u8]]) -> Option<usize> {
    elements.iter().position(|e| *e == b"slurmstepd.scope" || e.ends_with(b"_slurmstepd.scope"))
}

/// Slurm's cgroup/v2 plugin: a `[<node>_]slurmstepd.scope` whose ancestors are all slices,
/// none of them a user's, then the job, then its step.
fn slurm(elements: &[&[u8]]) -> Option<Identity> {
    let at = stepd_scope(elements)?;
    let slices = &elements[..at];
    if slices.is_empty()
        || !slices.iter().all(|e| e.ends_with(b".slice"))
        || slices[0] == b"user.slice"
    {
        return None;
    }
    let job = elements.get(at + 1)?;
    let mut id = Identity::default();
    match job.strip_prefix(b"job_") {
        Some(n) => id.hpc_job = Some(job_id(n)?),
        None => id.slurm_sluid = Some(sluid(job)?),
    }
    if let Some(s) = elements.get(at + 2) {
        id.step = step(s.strip_prefix(b"step_")?);
        id.step.as_ref()?;
    }
    Some(id)
}

/// Where the cgroup at `path` is a SLUID-keyed Slurm job's or one below it: the job
/// directory's path (a prefix of `path`) and the SLUID, by the same rule as [`Identity::of`].
pub(crate) fn sluid_job(path: &[u8]) -> Option<(&[u8], &[u8])> {
    // Most paths are no Slurm job's: this costs one scan of the bytes and no allocation.
    if !path.windows(17).any(|w| w == b"slurmstepd.scope/") {
        return None;
    }
    let elements: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|e| !e.is_empty()).collect();
    if elements.iter().any(|e| e.len() > MAX_NAME) {
        return None;
    }
    slurm(&elements)?.slurm_sluid?;
    let job = elements[stepd_scope(&elements)? + 1];
    // The job directory ends where its name does: `job` is a subslice of `path`.
    let end = job.as_ptr() as usize - path.as_ptr() as usize + job.len();
    Some((&path[..end], job))
}

/// A pod uid as the kubelet writes it (8-4-4-4-12 lower-case hex), `sep` between the groups.
fn pod_uid(bytes: &[u8], sep: u8) -> Option<String> {
    let groups: Vec<&[u8]> = bytes.split(|&b| b == sep).collect();
    let shape = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    let hex = |g: &&[u8]| g.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    (shape && groups.iter().all(hex)).then(|| {
        let parts: Vec<&str> = groups.iter().filter_map(|g| std::str::from_utf8(g).ok()).collect();
        parts.join("-")
    })
}

/// A container id: 64 lower-case hex digits.
fn container_id(bytes: &[u8]) -> Option<String> {
    (bytes.len() == 64 && bytes.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)))
        .then(|| text(bytes))?
}

/// The kubelet's pod cgroups, under either cgroup driver, every QoS class.
fn kubelet(elements: &[&[u8]]) -> Option<Identity> {
    let (systemd, rest) = match elements.split_first()? {
        (&b"kubepods.slice", rest) => (true, rest),
        (&b"kubepods", rest) => (false, rest),
        _ => return None,
    };
    // The QoS class's cgroup, where the pod is not Guaranteed.
    let rest = match rest.first() {
        Some(&(b"kubepods-burstable.slice" | b"kubepods-besteffort.slice")) if systemd => {
            &rest[1..]
        }
        Some(&(b"burstable" | b"besteffort")) if !systemd => &rest[1..],
        _ => rest,
    };
    let (pod, rest) = rest.split_first()?;
    let uid = if systemd {
        let name = pod.strip_suffix(b".slice")?;
        let at = name.windows(4).position(|w| w == b"-pod")?;
        let prefix = &name[..at];
        if !matches!(prefix, b"kubepods" | b"kubepods-burstable" | b"kubepods-besteffort") {
            return None;
        }
        pod_uid(&name[at + 4..], b'_')?
    } else {
        pod_uid(pod.strip_prefix(b"pod")?, b'-')?
    };
    let mut id = Identity { pod_uid: Some(uid), ..Identity::default() };
    if let Some(container) = rest.first() {
        let raw = if systemd {
            let scope = container.strip_suffix(b".scope")?;
            ["cri-containerd-", "crio-", "docker-"]
                .iter()
                .find_map(|p| scope.strip_prefix(p.as_bytes()))?
        } else {
            container.strip_prefix(b"crio-").unwrap_or(container)
        };
        id.container_id = Some(container_id(raw)?);
    }
    Some(id)
}

/// A QEMU guest's scope below `machine.slice` (the last such element: the deepest scope), its
/// libvirt domain name with systemd's `\xNN` escapes undone.
fn libvirt(elements: &[&[u8]]) -> Option<Identity> {
    if elements.first() != Some(&&b"machine.slice"[..]) {
        return None;
    }
    let scope = elements.iter().rev().find(|e| e.starts_with(br"machine-qemu\x2d"))?;
    let rest = scope.strip_prefix(br"machine-qemu\x2d")?.strip_suffix(b".scope")?;
    let at = rest.windows(4).position(|w| w == br"\x2d")?;
    let (n, escaped) = (&rest[..at], &rest[at + 4..]);
    if !digits(n) || escaped.is_empty() {
        return None;
    }
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'\\' {
            let (hex, tail) = tail.split_first_chunk::<3>()?;
            let [b'x', hi, lo] = *hex else { return None };
            let digit = |c: u8| char::from(c).to_digit(16);
            bytes.push(u8::try_from(digit(hi)? * 16 + digit(lo)?).ok()?);
            rest = tail;
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    Some(Identity { vm: Some(text(&bytes)?), ..Identity::default() })
}

/// A systemd service or scope below `system.slice`, through slices only.
fn unit(elements: &[&[u8]]) -> Option<Identity> {
    let (last, slices) = elements.split_last()?;
    if slices.first() != Some(&&b"system.slice"[..])
        || !slices.iter().all(|e| e.ends_with(b".slice"))
        || !(last.ends_with(b".service") || last.ends_with(b".scope"))
    {
        return None;
    }
    Some(Identity { unit: Some(text(last)?), ..Identity::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(path: &str) -> Identity {
        Identity::of(path.as_bytes())
    }

    fn labels(path: &[u8]) -> Vec<(&'static str, String)> {
        Identity::of(path).labels().map(|(k, v)| (k, v.to_owned())).collect()
    }

    const POD: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    const CTR: &str = "4f3e2d1c0b9a88776655443322110099aabbccddeeff00112233445566778899";

    #[test]
    fn slurm_jobs_and_steps_as_every_release_lays_them_out() {
        let job = |j: &str, s: Option<&str>| Identity {
            hpc_job: Some(j.into()),
            step: s.map(Into::into),
            ..Identity::default()
        };
        for (path, want) in [
            ("/system.slice/slurmstepd.scope/job_4242", job("4242", None)),
            ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", job("4242", Some("0"))),
            (
                "/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0",
                job("7", Some("batch")),
            ),
            ("/system.slice/slurmstepd.scope/job_7/step_extern/user", job("7", Some("extern"))),
            (
                "/system.slice/slurmstepd.scope/job_7/step_interactive",
                job("7", Some("interactive")),
            ),
            // A heterogeneous step before 26.05.
            ("/system.slice/slurmstepd.scope/job_7/step_3+1/user/task_0", job("7", Some("3+1"))),
            // Several slurmd on one host.
            ("/system.slice/node17_slurmstepd.scope/job_9/step_2/slurm", job("9", Some("2"))),
            // 25.11's CgroupSlice.
            ("/slurm.slice/slurmstepd.scope/job_9/step_2", job("9", Some("2"))),
        ] {
            assert_eq!(id(path), want, "{path}");
        }
    }

    #[test]
    fn a_slurm_26_05_job_keyed_by_its_sluid() {
        let got = id("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0");
        assert_eq!(got.slurm_sluid.as_deref(), Some("sEKNKTV3WPV500"));
        assert_eq!((got.hpc_job, got.step.as_deref()), (None, Some("0")));
        for not in [
            "sEKNKTV3WPV50",   // 12 digits
            "sEKNKTV3WPV5000", // 14
            "SEKNKTV3WPV500",  // print_sluid writes a lower-case s
            "sekNKTV3WPV500",  // and upper-case digits
            "sEKNKTV3WPVU00",  // U is not Crockford's
            "sGKNKTV3WPV500",  // the first digit holds 4 bits
        ] {
            let path = format!("/system.slice/slurmstepd.scope/{not}/step_0");
            assert_eq!(id(&path), Identity::default(), "{path}");
        }
    }

    #[test]
    fn a_sluid_jobs_directory_is_found_from_any_cgroup_below_it() {
        let job = b"/system.slice/node7_slurmstepd.scope/sEKNKTV3WPV500";
        for below in ["", "/step_0", "/step_batch/user/task_0", "/step_extern/slurm"] {
            let path = [&job[..], below.as_bytes()].concat();
            assert_eq!(sluid_job(&path), Some((&job[..], &b"sEKNKTV3WPV500"[..])), "{below}");
        }
        for path in [
            "/system.slice/slurmstepd.scope/job_4242/step_0",
            "/system.slice/slurmstepd.scope/system",
            "/user.slice/slurmstepd.scope/sEKNKTV3WPV500",
            "/system.slice/slurmstepd.scope/sEKNKTV3WPV500/user",
        ] {
            assert_eq!(sluid_job(path.as_bytes()), None, "{path}");
        }
    }

    #[test]
    fn a_slurm_name_that_does_not_parse_gets_no_label() {
        // The scope itself is a systemd unit, and only that.
        assert_eq!(id("/system.slice/slurmstepd.scope").unit.as_deref(), Some("slurmstepd.scope"));
        for path in [
            "/system.slice/slurmstepd.scope/system",
            "/system.slice/slurmstepd.scope/slurmd",
            "/system.slice/slurmstepd.scope/job_",
            "/system.slice/slurmstepd.scope/job_042",
            "/system.slice/slurmstepd.scope/job_4294967296",
            "/system.slice/slurmstepd.scope/job_12/step_x",
            "/system.slice/slurmstepd.scope/job_12/stepbatch",
            // Not where slurmd puts it: a user's own cgroups, or below a service.
            "/user.slice/user-1000.slice/slurmstepd.scope/job_12",
            "/system.slice/foo.service/slurmstepd.scope/job_12",
            "/slurmstepd.scope/job_12",
        ] {
            assert_eq!(id(path), Identity::default(), "{path}");
        }
    }

    #[test]
    fn kubelet_pods_and_containers_under_both_drivers_and_every_qos_class() {
        let underscored = POD.replace('-', "_");
        let pod = |c: Option<&str>| Identity {
            pod_uid: Some(POD.into()),
            container_id: c.map(Into::into),
            ..Identity::default()
        };
        for (path, want) in [
            (format!("/kubepods.slice/kubepods-pod{underscored}.slice"), pod(None)),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/cri-containerd-{CTR}.scope"
                ),
                pod(Some(CTR)),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice/crio-{CTR}.scope"
                ),
                pod(Some(CTR)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{underscored}.slice/docker-{CTR}.scope"),
                pod(Some(CTR)),
            ),
            (format!("/kubepods/pod{POD}/{CTR}"), pod(Some(CTR))),
            (format!("/kubepods/burstable/pod{POD}/{CTR}"), pod(Some(CTR))),
            (format!("/kubepods/besteffort/pod{POD}/crio-{CTR}"), pod(Some(CTR))),
            (format!("/kubepods/besteffort/pod{POD}"), pod(None)),
        ] {
            assert_eq!(id(&path), want, "{path}");
        }
        for path in [
            // CRI-O's conmon is no container.
            format!("/kubepods.slice/kubepods-pod{underscored}.slice/crio-conmon-{CTR}.scope"),
            // A pod uid written the other driver's way.
            format!("/kubepods.slice/kubepods-pod{POD}.slice"),
            format!("/kubepods/pod{underscored}"),
            format!("/kubepods/pod{}", POD.to_uppercase()),
            // Not at the hierarchy's root: somebody's own cgroups.
            format!("/user.slice/kubepods.slice/kubepods-pod{underscored}.slice"),
        ] {
            assert_eq!(id(&path), Identity::default(), "{path}");
        }
    }

    #[test]
    fn a_vm_only_below_machine_slice() {
        assert_eq!(
            id(r"/machine.slice/machine-qemu\x2d7\x2dbuild\x2dvm.scope/libvirt/vcpu0")
                .vm
                .as_deref(),
            Some("build-vm")
        );
        assert_eq!(
            id(r"/machine.slice/machine-tenant.slice/machine-qemu\x2d3\x2dcaf\xc3\xa9.scope")
                .vm
                .as_deref(),
            Some("café")
        );
        // Hostile test Q3: a guest-like scope under user.slice or inside a pod.
        for path in [
            r"/user.slice/user-1000.slice/user@1000.service/app.slice/machine-qemu\x2d99\x2dprod\x2ddb.scope",
            r"/kubepods.slice/kubepods-podx.slice/machine-qemu\x2d98\x2dprod\x2ddb.scope",
            r"/machine.slice/machine-qemu\x2d1\x2dbad\x01.scope",
            r"/machine.slice/machine-qemu\x2d1\x2dbad\xff.scope",
            r"/machine.slice/machine-qemu\x2d1\x2dbad\xzz.scope",
            r"/machine.slice/machine-qemu\x2d\x2dname.scope",
        ] {
            assert_eq!(id(path).vm, None, "{path}");
        }
    }

    #[test]
    fn a_raw_byte_that_is_not_utf8_gives_no_label_not_a_replacement_character() {
        // Hostile test Q8: byte 0xFF itself in the scope's name, not its escape.
        let mut path = br"/machine.slice/machine-qemu\x2d8\x2draw".to_vec();
        path.push(0xFF);
        path.extend_from_slice(b"byte.scope");
        assert_eq!(labels(&path), []);
        let mut unit = b"/system.slice/bad".to_vec();
        unit.push(0xFF);
        unit.extend_from_slice(b".service");
        assert_eq!(labels(&unit), []);
        let long = format!("/system.slice/{}.service", "a".repeat(MAX_NAME));
        assert_eq!(labels(long.as_bytes()), []);
    }

    #[test]
    fn systemd_units_below_system_slice_only() {
        for (path, want) in [
            ("/system.slice/nginx.service", Some("nginx.service")),
            ("/system.slice/system-getty.slice/getty@tty1.service", Some("getty@tty1.service")),
            ("/system.slice/run-r1234.scope", Some("run-r1234.scope")),
            ("/system.slice", None),
            ("/system.slice/nginx.service/worker", None),
            ("/user.slice/user-1000.slice/user@1000.service/app.slice/nginx.service", None),
            ("/init.scope", None),
        ] {
            assert_eq!(id(path).unit.as_deref(), want, "{path}");
        }
    }

    #[test]
    fn labels_are_written_in_name_order() {
        let got = labels(format!("/kubepods/pod{POD}/{CTR}").as_bytes());
        assert_eq!(got, [("container_id", CTR.to_owned()), ("pod_uid", POD.to_owned())]);
    }
}
