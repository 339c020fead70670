//! The files installed beside the units: users, udev rule, modules, sysconfig.

use super::helpers::read;
use anyhow::{Result, ensure};
use std::path::Path;

/// The MSR lines shipped commented out; the README's MSR section uncomments exactly these.
const MSR_MODULE_LINE: &str = "#msr";
const MSR_UDEV_LINE: &str = "#SUBSYSTEM==\"msr\", KERNEL==\"msr[0-9]*\", OWNER=\"root\", GROUP=\"amd-hsmp-broker\", MODE=\"0640\"";

/// The files around the units agree with them: the users exist, the udev rule hands /dev/hsmp
/// to the broker's group, the MSR lines are present but commented out.
pub(super) fn install_tree(root: &Path) -> Result<String> {
    let p = root.join("packaging");
    let sysusers = read(&p.join("sysusers.d/amd-hsmp-exporter.conf"))?;
    for user in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        ensure!(
            sysusers.lines().any(|l| l.split_whitespace().take(2).eq(["u", user])),
            "sysusers.d/amd-hsmp-exporter.conf does not create user {user}"
        );
    }
    let udev = read(&p.join("udev/60-amd-hsmp.rules"))?;
    ensure!(
        udev.lines().any(|l| !l.starts_with('#')
            && l.contains("KERNEL==\"hsmp_cdev\"")
            && l.contains("GROUP=\"amd-hsmp-broker\"")
            && l.contains("MODE=\"0640\"")),
        "60-amd-hsmp.rules does not give /dev/hsmp (hsmp_cdev) to group amd-hsmp-broker, 0640"
    );
    ensure!(
        udev.lines().any(|l| l == MSR_UDEV_LINE),
        "60-amd-hsmp.rules lacks the commented MSR line {MSR_UDEV_LINE}"
    );
    let modules = read(&p.join("modules-load.d/amd-hsmp.conf"))?;
    ensure!(modules.lines().any(|l| l == "amd_hsmp"), "modules-load.d does not load amd_hsmp");
    ensure!(
        modules.lines().any(|l| l == MSR_MODULE_LINE),
        "modules-load.d lacks the commented line {MSR_MODULE_LINE}"
    );
    for name in ["amd-hsmp-broker", "amd-hsmp-exporter"] {
        let sysconfig = read(&p.join("sysconfig").join(name))?;
        ensure!(
            sysconfig.lines().any(|l| l.starts_with("OPTIONS=")),
            "sysconfig/{name} does not set OPTIONS"
        );
    }
    Ok("users, udev rule, modules-load and sysconfig consistent with the units".into())
}
