//! The next steps the broker gives an operator, said once for the serving path's log and for
//! `--check`'s lines, so that the sampler needs nothing of the check module.

/// What to do when the broker is refused `/dev/hsmp` (`EACCES`/`EPERM`): the udev rule, and
/// under SELinux the audit log and the device's label.
pub(crate) const DEVICE_DENIED: &str = "ls -l /dev/hsmp must show group amd-hsmp-broker readable \
     (udevadm trigger --action=change --subsystem-match=misc --sysname-match=hsmp_cdev); under \
     SELinux: ausearch -m avc -c amd-hsmp-broker, and ls -Z /dev/hsmp must show \
     amd_hsmp_device_t (restorecon -v /dev/hsmp); run amd-hsmp-broker --check";
