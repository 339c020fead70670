complete -c amd-hsmp-check -l listen -d 'Create and listen on this Unix socket (mode --listen.mode). Without it, the socket passed by systemd socket activation (LISTEN_FDS) is used' -r -F
complete -c amd-hsmp-check -l listen.mode -d 'Mode of the --listen socket, octal, 0600 to 0666: connecting needs write permission. Created by the broker\'s user and group; 0666 lets any local user reach the allow-list (the exporter by hand as `nobody`), which then alone decides who is served' -r
complete -c amd-hsmp-check -l allow-uid -d 'Serve peers with this uid (repeatable). Root is always allowed, within the same --connections.per-uid limit as any uid' -r
complete -c amd-hsmp-check -l allow-gid -d 'Serve peers whose effective gid is this (repeatable)' -r
complete -c amd-hsmp-check -l allow-user -d 'Serve peers running as this user (repeatable); resolved once at start-up' -r
complete -c amd-hsmp-check -l allow-group -d 'Serve peers whose effective group is this (repeatable); resolved once at start-up' -r
complete -c amd-hsmp-check -l hsmp.device -d 'The HSMP device node' -r -F
complete -c amd-hsmp-check -l collector.core-energy.sources -d 'Where per-core energy may come from, tried in this order whatever the order given: hsmp (the firmware\'s RAPL messages, where it answers them), perf (the kernel\'s power_core PMU, Linux 6.14+; needs CAP_PERFMON at start-up), msr (the MSR devices; needs CAP_SYS_RAWIO at start-up). List one to choose it, leave one out to refuse it' -r -f -a "hsmp\t'HSMP `GET_RAPL_CORE_COUNTER`'
perf\t'The kernel\'s `power_core` PMU (`perf_event_open`, `CAP_PERFMON`)'
msr\t'The MSR driver (`/dev/cpu/N/msr`, `CAP_SYS_RAWIO`)'"
complete -c amd-hsmp-check -l perf.pmu-root -d 'Directory listing the kernel\'s PMUs (the power_core PMU\'s description is read there)' -r -F
complete -c amd-hsmp-check -l msr.device-root -d 'Directory holding <cpu>/msr device nodes' -r -F
complete -c amd-hsmp-check -l msr.poll-interval -d 'How often the 32-bit MSR energy counters are read to extend them to 64 bits. Shortened to a quarter of the shortest wrap at 100 W a core (164 s at the usual ESU of 16); a core not read for a whole wrap period restarts its count and the reset is counted' -r
complete -c amd-hsmp-check -l sample.max-age -d 'Freshness bound: every value the broker returns was read no earlier than this before the request arrived. Requests within it share reads, and it caps the mailbox load any peer can cause at one read of each item per this interval. 0 shares only reads that begin after a request arrived' -r
complete -c amd-hsmp-check -l connections.per-uid -d 'Connection slots each peer uid may hold at once, root included. Each --allow-uid/--allow-user/--allow-gid/--allow-group identity has this many slots kept for it alone, so the exporter (which holds at most 2) always connects, whoever else squats. A slot is free again as soon as its peer hangs up, even while its request waits; an allowed peer turned away is told why before the close' -r
complete -c amd-hsmp-check -l connections.shared -d 'Connection slots shared by every allowed peer (root included), beyond the reserved ones' -r
complete -c amd-hsmp-check -l connections.idle-timeout -d 'A connection with no request for this long is closed (the exporter reconnects)' -r
complete -c amd-hsmp-check -l path.procfs -d 'procfs mount point (for cpuinfo)' -r -F
complete -c amd-hsmp-check -l path.sysfs -d 'sysfs mount point (for CPU topology)' -r -F
complete -c amd-hsmp-check -l check.timeout -d 'How long the checks may take in all. Past it a `deadline` line names the check that did not finish (a device or a file that does not answer) and they exit 1' -r
complete -c amd-hsmp-check -l log.level -d 'Only log messages with the given severity or above' -r -f -a "debug\t'Everything, including each reconnect attempt and each refused peer'
info\t'Start-up, listening, peers and broker lost and found again'
warn\t'Problems that cost telemetry'
error\t'Only what stops the process'"
complete -c amd-hsmp-check -l log.format -d 'Output format of log messages: `logfmt` (`text` is accepted for it) or `json`, one record per line on standard error' -r -f -a "logfmt\t'`key=value` pairs, as Prometheus and node_exporter log by default'
json\t'One JSON object per line'"
complete -c amd-hsmp-check -l collector.core-energy.msr-fallback -d 'Also read per-core energy from the MSR devices where HSMP lacks the RAPL messages and the perf counter cannot be opened: adds msr to --collector.core-energy.sources (needs CAP_SYS_RAWIO at start-up; dropped right after the devices are opened)'
complete -c amd-hsmp-check -s V -l version -d 'Print the version, revision, build date and toolchain, then exit'
complete -c amd-hsmp-check -l check -d 'Run amd-hsmp-check with the other flags instead of serving (moved there; this form goes in the next release). It checks every precondition of a scrape on this machine, prints one line each with its verdict and fix, and exits 0 when nothing a scrape needs fails, 1 otherwise'
complete -c amd-hsmp-check -s h -l help -d 'Print help (see more with \'--help\')'
