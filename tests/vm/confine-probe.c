/*
 * The VM test's confinement probe: one system call, its errno as the exit code (0 when it
 * succeeded). Started with runcon in one of the policy's domains, as root and with every
 * descriptor closed, so that only the policy can refuse it and the refusal is its own AVC
 * record. Built statically by `cargo xtask vm-test` (no loader, no library to read); never
 * packaged.
 *
 *   confine-probe open PATH       open(PATH, O_RDONLY)
 *   confine-probe create PATH     open(PATH, O_WRONLY | O_CREAT | O_EXCL), removed again
 *   confine-probe tcp | udp       socket(AF_INET, SOCK_STREAM | SOCK_DGRAM)
 *   confine-probe perf TYPE CPU [SECONDS]
 *                                 perf_event_open of event 1 (energy-core) of PMU type TYPE on
 *                                 CPU, as the broker opens it; when it opens, one read(2) is
 *                                 printed (count, time enabled, time running), and with
 *                                 SECONDS a second one that much later
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static void perf_print(int fd)
{
	uint64_t values[3];

	if (read(fd, values, sizeof(values)) == (ssize_t)sizeof(values))
		printf("%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", values[0], values[1], values[2]);
	fflush(stdout);
}

static int perf_open(const char *type, const char *cpu, const char *seconds)
{
	struct perf_event_attr attr;
	int fd;

	memset(&attr, 0, sizeof(attr));
	attr.size = sizeof(attr);
	attr.type = (uint32_t)strtoul(type, NULL, 10);
	attr.config = 1;
	attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
	fd = (int)syscall(SYS_perf_event_open, &attr, -1, atoi(cpu), -1, PERF_FLAG_FD_CLOEXEC);
	if (fd < 0)
		return fd;
	perf_print(fd);
	if (seconds) {
		sleep((unsigned int)atoi(seconds));
		perf_print(fd);
	}
	return fd;
}

int main(int argc, char **argv)
{
	int fd = -1;
	if (argc == 3 && strcmp(argv[1], "open") == 0) {
		fd = open(argv[2], O_RDONLY | O_CLOEXEC);
	} else if (argc == 3 && strcmp(argv[1], "create") == 0) {
		fd = open(argv[2], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0)
			unlink(argv[2]);
	} else if (argc == 2 && strcmp(argv[1], "tcp") == 0) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
	} else if (argc == 2 && strcmp(argv[1], "udp") == 0) {
		fd = socket(AF_INET, SOCK_DGRAM, 0);
	} else if ((argc == 4 || argc == 5) && strcmp(argv[1], "perf") == 0) {
		fd = perf_open(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
	} else {
		return 100;
	}
	return fd >= 0 ? 0 : errno;
}
