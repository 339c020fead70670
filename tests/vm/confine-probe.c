/*
 * The VM test's confinement probe: one system call, its errno as the exit code (0 when it
 * succeeded). Started with runcon in one of the policy's domains, as root and with every
 * descriptor closed, so that only the policy can refuse it and the refusal is its own AVC
 * record. Built statically by `cargo xtask vm-test` (no loader, no library to read); never
 * packaged.
 *
 *   confine-probe open PATH     open(PATH, O_RDONLY)
 *   confine-probe create PATH   open(PATH, O_WRONLY | O_CREAT | O_EXCL), removed again
 *   confine-probe tcp | udp     socket(AF_INET, SOCK_STREAM | SOCK_DGRAM)
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
	} else {
		return 100;
	}
	return fd >= 0 ? 0 : errno;
}
