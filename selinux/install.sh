# Installs the amd_hsmp policy module: the steps of the amd-hsmp-exporter-selinux package's
# post-install scriptlet. The spec appends this file to that scriptlet (its -f option), and
# the VM system test (cargo xtask vm-test) runs it in an enforcing guest, so the package and
# the test take the same steps. RPM expands macros in it: it must hold no percent sign.
# POSIX sh; the caller sets:
#   policytype  the policy store (targeted on EL9, default on Debian)
#   module      the module file (amd_hsmp.pp or amd_hsmp.pp.bz2)
: "${policytype:?}" "${module:?}"
SELINUXTYPE=
if [ -e /etc/selinux/config ]; then
    . /etc/selinux/config
fi
# The module at priority 200, as the Fedora macro selinux_modules_install installs it, then
# the policy loaded if it is the running one.
/usr/sbin/semodule -n -s "$policytype" -X 200 -i "$module" || exit 1
if /usr/sbin/selinuxenabled && [ "$SELINUXTYPE" = "$policytype" ]; then
    /usr/sbin/load_policy || exit 1
fi
# Modules cannot label ports. The label is added, or modified where tcp/10054 has a local
# label already (an upgrade, or an earlier label by hand).
if /usr/sbin/semanage port -S "$policytype" -l -C \
    | grep -Eq '[[:space:]]tcp[[:space:]]+([0-9, -]*[ ,])?10054(,|$)'; then
    action=-m
else
    action=-a
fi
/usr/sbin/semanage port -S "$policytype" "$action" -t amd_hsmp_exporter_port_t -p tcp 10054 || exit 1
# What exists already keeps the label it had before the module: relabel the paths of
# amd_hsmp.fc (the binaries of a package installed first, a loaded driver's /dev/hsmp, a
# started socket's directory, an operator's web configuration).
if /usr/sbin/selinuxenabled && [ "$SELINUXTYPE" = "$policytype" ]; then
    for path in /usr/bin/amd-hsmp-broker /usr/bin/amd-hsmp-exporter /dev/hsmp /run/amd-hsmp \
        /etc/amd-hsmp-exporter; do
        if [ -e "$path" ]; then
            /usr/sbin/restorecon -RF "$path" || exit 1
        fi
    done
fi
