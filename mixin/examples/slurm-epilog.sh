#!/bin/sh
# Prints the energy of a Slurm job's CPU cores on this node, as this node's amd-hsmp-exporter
# counts it (amd_hsmp_workload_core_energy_joules_total, with --collector.core-owner):
#
#   Energy: 1234.5 J (0.000343 kWh), the CPU cores of job 4242 on node01
#
# What the number covers: the physical cores the job's cgroups held on this node, summed over
# every series whose hpc_job label is the job (the job's and its steps'). Not the package's
# uncore (I/O die, memory controllers), not GPUs, not other nodes: for a job on several nodes,
# run it on each, or sum in Prometheus:
#   sum(last_over_time(amd_hsmp_workload_core_energy_joules_total{hpc_job="4242"}[1h]))
# The exporter counts a core's energy for a sample interval when the job held the core at both
# ends: the last interval before the job's end is not counted. The series stays for
# --collector.core-owner.linger (default 5m) after the job ends; read it within that time.
#
# Install, either:
# - as Epilog= in slurm.conf (a full path; slurmd runs it as root on each node of the job when
#   the job ends; its output goes to slurmd, at most to slurmd's log, not to the job's output).
#   A failing Epilog drains the node: as slurmd's Epilog (SLURM_SCRIPT_CONTEXT=epilog_slurmd)
#   this script reports a failure on stderr and exits 0.
# - as the last line of a batch script, for the job's own output (the energy so far, on the
#   batch script's node):  sh /path/to/slurm-epilog.sh
#
# Usage: slurm-epilog.sh [JOB_ID]   (default $SLURM_JOB_ID)
# Environment:
#   AMD_HSMP_EXPORTER_URL  the exporter's metrics (default http://localhost:10054/metrics)
#   AMD_HSMP_CURL_OPTS     more curl options, split at spaces, e.g. "--cacert /etc/ca.pem -u
#                          user:pass"; for values with spaces use a curl config file: "-K FILE"
# Needs curl and a POSIX awk. Exits non-zero when the job has no series or the exporter cannot
# be read (it never prints 0 J for a job it did not measure).

PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}
LC_ALL=C
export PATH LC_ALL

url=${AMD_HSMP_EXPORTER_URL:-http://localhost:10054/metrics}
job=${1:-${SLURM_JOB_ID:-}}
node=${SLURMD_NODENAME:-$(uname -n)}

# Exits after a failure, reported on stderr: 1, but 0 as slurmd's Epilog, which a failure drains.
failed() {
    [ "${SLURM_SCRIPT_CONTEXT:-}" = epilog_slurmd ] && exit 0
    exit 1
}
fail() {
    echo "slurm-epilog: $*" >&2
    failed
}

[ -n "$job" ] || fail "no job id: give it as the argument or in SLURM_JOB_ID"

set -f # AMD_HSMP_CURL_OPTS is split at spaces, never globbed
# shellcheck disable=SC2086
scrape=$(curl -fsS --max-time 10 $AMD_HSMP_CURL_OPTS -- "$url") ||
    fail "cannot read $url (curl's error above)"
set +f

printf '%s\n' "$scrape" | awk -v job="$job" -v node="$node" '
    # The value of label `name` in the braces of a sample line, unescaped; "\001" when the
    # series has no such label. Label values may hold \\, \" and \n; labels come in any order.
    function label(line, name,    i, c, key, val, n) {
        i = index(line, "{") + 1
        n = length(line)
        while (i <= n) {
            while (substr(line, i, 1) ~ /[ ,]/) i++
            if (substr(line, i, 1) == "}") break
            key = ""
            while (i <= n && (c = substr(line, i, 1)) != "=" && c != " ") { key = key c; i++ }
            while (substr(line, i, 1) ~ /[ =]/) i++
            if (substr(line, i, 1) != "\"") return "\001"
            i++
            val = ""
            while (i <= n && (c = substr(line, i, 1)) != "\"") {
                if (c == "\\") {
                    i++
                    c = substr(line, i, 1)
                    if (c == "n") c = "\n"
                }
                val = val c
                i++
            }
            i++
            if (key == name) return val
        }
        return "\001"
    }
    # The sample value: the first field after the closing brace (a timestamp or an
    # OpenMetrics exemplar may follow it).
    function value(line,    rest, i, q, c, n) {
        # The closing brace is the first one outside a quoted label value.
        n = length(line); q = 0
        for (i = index(line, "{") + 1; i <= n; i++) {
            c = substr(line, i, 1)
            if (q && c == "\\") { i++; continue }
            if (c == "\"") q = !q
            else if (!q && c == "}") break
        }
        rest = substr(line, i + 1)
        sub(/^[ \t]+/, "", rest)
        sub(/[ \t].*/, "", rest)
        return rest
    }
    /^#/ { next }
    index($0, "amd_hsmp_workload_core_energy_joules_total{") == 1 {
        if (label($0, "hpc_job") != job) next
        v = value($0)
        if (v !~ /^[+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$/) {
            printf "slurm-epilog: job %s: a series has no readable value: %s\n", job, $0 > "/dev/stderr"
            bad = 1
            exit
        }
        sum += v
        series++
    }
    END {
        if (bad) exit 1
        if (!series) {
            printf "slurm-epilog: no amd_hsmp_workload_core_energy_joules_total series with hpc_job=\"%s\" on %s: the exporter saw the job hold no core here, the job ended more than --collector.core-owner.linger ago, or the exporter runs without --collector.core-owner\n", job, node > "/dev/stderr"
            exit 1
        }
        printf "Energy: %.1f J (%.6f kWh), the CPU cores of job %s on %s\n", sum, sum / 3600000, job, node
    }
' || failed
