complete -c amd-hsmp-exporter -l web.listen-address -d 'Address to listen on for HTTP, `host:port`; `:PORT` means every address. Repeatable' -r
complete -c amd-hsmp-exporter -l web.config.file -d 'exporter-toolkit web configuration file (YAML): TLS, basic auth, response headers. Re-read on SIGHUP and when a certificate or key file changes' -r -F
complete -c amd-hsmp-exporter -l web.telemetry-path -d 'Path under which the metrics are served' -r
complete -c amd-hsmp-exporter -l web.max-scrape-timeout -d 'Upper bound of the time spent answering one scrape, whatever `X-Prometheus-Scrape-Timeout-Seconds` asks for (e.g. `10s`, `2500ms`, `1m`)' -r
complete -c amd-hsmp-exporter -l web.max-requests -d 'Most scrapes and landing-page views handled at once, each counted until the last piece of work it started has ended (its broker request, its walk of the cgroup hierarchy), also when its client hung up; more are answered 503 at once. 0 means no limit' -r
complete -c amd-hsmp-exporter -l web.max-connections -d 'Most HTTP connections open at once; more are closed at once [default: 512, lowered to what RLIMIT_NOFILE leaves room for]' -r
complete -c amd-hsmp-exporter -l web.max-connections-per-client -d 'Most HTTP connections open at once from one client address (IPv6: one /64) [default: 32, at most --web.max-connections]' -r
complete -c amd-hsmp-exporter -l web.header-read-timeout -d 'Time a client has from the first byte of a request to the end of its headers' -r
complete -c amd-hsmp-exporter -l web.idle-timeout -d 'A connection that handles no request and moves no byte for this long is closed (idle keep-alive, a client that does not read its answer)' -r
complete -c amd-hsmp-exporter -l broker.socket -d 'Unix socket of amd-hsmp-broker' -r -F
complete -c amd-hsmp-exporter -l path.cgroupfs -d 'Mount point of the cgroup v2 hierarchy the core-owner collector reads' -r -F
complete -c amd-hsmp-exporter -l path.procfs -d 'Mount point of the procfs: this process\'s own `process_*` metrics, and where the core-owner collector reads the title of a Slurm job\'s `slurmstepd` when the job\'s cgroup is named by its SLUID' -r -F
complete -c amd-hsmp-exporter -l collector.core-owner.max-age -d 'How long one walk of the cgroup hierarchy serves the scrapes that arrive after it began (at most one walk runs at a time); 0 walks again for every scrape that arrives after a walk began (e.g. `1s`, `0`, at most 1m)' -r
complete -c amd-hsmp-exporter -l collector.core-owner.linger -d 'How long a workload\'s energy counter (`amd_hsmp_workload_core_energy_joules_total`) is still exported after the last sample at which it held a core, so that its last value is scraped after it ends (e.g. `5m`, `0`, at most 1d)' -r
complete -c amd-hsmp-exporter -l collector.core-owner.sample-interval -d 'Also take a sample for the workload energy counters this often between scrapes, so that a workload shorter than the scrape interval is counted; each costs one broker sample and one walk of the cgroup hierarchy, as a scrape does. 0 samples at scrapes only (e.g. `5s`, `0`, at least 1s, at most 1h)' -r
complete -c amd-hsmp-exporter -l log.level -d 'Only log messages with the given severity or above' -r -f -a "debug\t'Everything, including each reconnect attempt and each refused peer'
info\t'Start-up, listening, peers and broker lost and found again'
warn\t'Problems that cost telemetry'
error\t'Only what stops the process'"
complete -c amd-hsmp-exporter -l log.format -d 'Output format of log messages: `logfmt` (`text` is accepted for it) or `json`, one record per line on standard error' -r -f -a "logfmt\t'`key=value` pairs, as Prometheus and node_exporter log by default'
json\t'One JSON object per line'"
complete -c amd-hsmp-exporter -l web.systemd-socket -d 'Serve on the sockets systemd passes (socket activation, LISTEN_FDS) instead of --web.listen-address'
complete -c amd-hsmp-exporter -l web.disable-exporter-metrics -d 'Leave out the exporter\'s metrics about itself: `process_*` and `amd_hsmp_web_refused_total` (as node_exporter\'s flag leaves out `process_*`, `go_*` and `promhttp_*`)'
complete -c amd-hsmp-exporter -l collector.core-energy -d 'Export per-core energy (on by default)'
complete -c amd-hsmp-exporter -l no-collector.core-energy -d 'Do not export per-core energy; the broker is not asked for it'
complete -c amd-hsmp-exporter -l collector.boost-limit -d 'Export per-core boost limits (on by default)'
complete -c amd-hsmp-exporter -l no-collector.boost-limit -d 'Do not export per-core boost limits; the broker is not asked for them'
complete -c amd-hsmp-exporter -l collector.prochot -d 'Export per-socket PROCHOT status (on by default)'
complete -c amd-hsmp-exporter -l no-collector.prochot -d 'Do not export PROCHOT status; the broker is not asked for it'
complete -c amd-hsmp-exporter -l collector.frequency-limit -d 'Export per-socket frequency limits and the limiters imposing them (on by default)'
complete -c amd-hsmp-exporter -l no-collector.frequency-limit -d 'Do not export socket frequency limits; the broker is not asked for them'
complete -c amd-hsmp-exporter -l collector.core-frequency-limit -d 'Export per-core frequency limits, which costs one mailbox message per core a scrape (off by default)'
complete -c amd-hsmp-exporter -l no-collector.core-frequency-limit -d 'Do not export per-core frequency limits; the broker is not asked for them (the default)'
complete -c amd-hsmp-exporter -l collector.package-energy -d 'Export per-socket package energy, the cores and the uncore beside them (HSMP GET_RAPL_PACKAGE_COUNTER, where the firmware answers it) (on by default)'
complete -c amd-hsmp-exporter -l no-collector.package-energy -d 'Do not export per-socket package energy; the broker is not asked for it'
complete -c amd-hsmp-exporter -l collector.core-owner -d 'Export which workload each physical core is assigned to, from the cgroup v2 cpusets under --path.cgroupfs (off by default)'
complete -c amd-hsmp-exporter -l no-collector.core-owner -d 'Do not export core owners; the cgroup hierarchy is not read (the default)'
complete -c amd-hsmp-exporter -s V -l version -d 'Print the version, revision, build date and toolchain, then exit'
complete -c amd-hsmp-exporter -s h -l help -d 'Print help (see more with \'--help\')'
