//! The next steps the broker gives an operator, said once for the serving path's log and for
//! `--check`'s lines, so that the sampler needs nothing of the check module.

/// What to do when the broker is refused `/dev/hsmp` (`EACCES`/`EPERM`): the udev rule, and
/// under SELinux the audit log and the device's label.
pub(crate) const DEVICE_DENIED: &str = "ls -l /dev/hsmp must show group amd-hsmp-broker readable \
     (udevadm trigger --action=change --subsystem-match=misc --sysname-match=hsmp_cdev); under \
     SELinux: ausearch -m avc -c amd-hsmp-broker, and ls -Z /dev/hsmp must show \
     amd_hsmp_device_t (restorecon -v /dev/hsmp); run amd-hsmp-check";

/// The SELinux boolean that lets the broker's domain read `/dev/cpu/N/msr` (the MSR fallback);
/// its file under selinuxfs exists only while the `amd_hsmp` policy module is loaded.
pub(crate) const MSR_BOOLEAN: &str = "amd_hsmp_broker_use_msr";

/// What to do when the MSR devices are refused (`EACCES`) although the MSR fallback is on.
pub(crate) const MSR_DENIED: &str = "under SELinux: setsebool -P amd_hsmp_broker_use_msr on \
     (ausearch -m avc -c amd-hsmp-broker shows the denial); run amd-hsmp-check \
     --collector.core-energy.msr-fallback";

/// What to do when the MSR fallback cannot open its devices.
pub(crate) const MSR_UNOPENED: &str = "modprobe msr; the broker needs CAP_SYS_RAWIO when it opens \
     the devices (the MSR drop-in); under SELinux setsebool -P amd_hsmp_broker_use_msr on";

/// Where the packages put the perf drop-in, inactive until copied.
#[cfg(test)]
pub(crate) const PERF_DROP_IN: &str = "/usr/share/amd-hsmp-exporter/perf-energy.conf";

/// What to do when the `power_core` events are refused (`EACCES`/`EPERM`): the drop-in that
/// grants the broker `CAP_PERFMON`, and under SELinux the audit log.
pub(crate) const PERF_DENIED: &str = "install -D -m 0644 \
     /usr/share/amd-hsmp-exporter/perf-energy.conf \
     /etc/systemd/system/amd-hsmp-broker.service.d/perf-energy.conf && systemctl daemon-reload \
     && systemctl restart amd-hsmp-broker (grants CAP_PERFMON at start-up only); under SELinux: \
     ausearch -m avc -c amd-hsmp-broker";

/// Where `kernel.perf_event_paranoid` is 3 or more (Debian's default), kernels that carry Debian's patch refuse
/// every `perf_event_open` without `CAP_SYS_ADMIN`: `CAP_PERFMON` is not enough. Upstream
/// treats any value above 2 as 2, so setting 2 changes nothing there and fixes the others.
pub(crate) const PERF_PARANOID: &str = "kernel.perf_event_paranoid is 3 or more: kernels with \
     Debian's patch (Debian, Ubuntu) then refuse perf_event_open to every process without \
     CAP_SYS_ADMIN, CAP_PERFMON included; set upstream's default 2: echo \
     kernel.perf_event_paranoid=2 > /etc/sysctl.d/60-amd-hsmp-perf.conf && sysctl --system, \
     then systemctl restart amd-hsmp-broker; or use the MSR fallback";

/// Whether `paranoid` (the text of `perf_event_paranoid`) is the level at which Debian's patch
/// refuses perf events to all but `CAP_SYS_ADMIN`.
pub(crate) fn paranoid_beyond_perfmon(paranoid: &str) -> bool {
    paranoid.trim().parse::<i32>().is_ok_and(|p| p >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_msr_hints_name_the_boolean_the_policy_defines() {
        for hint in [MSR_DENIED, MSR_UNOPENED] {
            assert!(hint.contains(&format!("setsebool -P {MSR_BOOLEAN} on")), "{hint}");
        }
        let policy = include_str!("../../selinux/amd_hsmp.te");
        assert!(policy.contains(&format!("gen_tunable({MSR_BOOLEAN}")), "the policy lost it");
    }

    #[test]
    fn the_perf_hint_installs_the_drop_in_the_packages_ship() {
        assert!(PERF_DENIED.contains(PERF_DROP_IN), "{PERF_DENIED}");
        let spec = include_str!("../../packaging/rpm/amd-hsmp-exporter.spec");
        assert!(spec.contains("%{_datadir}/%{name}/perf-energy.conf"), "the RPM lost it");
    }

    #[test]
    fn the_default_socket_is_where_the_packaged_socket_unit_listens() {
        let unit = include_str!("../../packaging/systemd/amd-hsmp-broker.socket");
        let listen = format!("ListenStream={}", amd_hsmp_proto::DEFAULT_SOCKET);
        assert!(unit.lines().any(|line| line == listen), "{listen} not in the unit");
    }
}
