# Stand-in for EL9's sysusers.generate-pre.sh, used only by macros.check:
# turns the "u NAME - "GECOS"" lines of a sysusers.d file into the groupadd
# and useradd commands %sysusers_create_compat puts into %pre.
$1 == "u" && $3 == "-" {
    gecos = $0
    sub(/^[^"]*"/, "", gecos)
    sub(/".*$/, "", gecos)
    printf "getent group '%s' >/dev/null || groupadd -r '%s' || :\n", $2, $2
    printf "getent passwd '%s' >/dev/null || useradd -r -g '%s' -d '/' -s '/usr/sbin/nologin' -c '%s' '%s' || :\n", $2, $2, gecos, $2
    next
}
/^[ug] / { print "unsupported sysusers.d line: " $0 > "/dev/stderr"; exit 1 }
