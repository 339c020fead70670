#!/usr/bin/perl
# The VM test's timing loop: sends ARGV[0] GET_PROC_HOT (0x0B) messages to socket 0 through
# the real driver, one ioctl(HSMP_IOCTL_CMD) each, timing each one with CLOCK_MONOTONIC, and
# prints the median in nanoseconds. Dies on the first error. perl-base has no Time::HiRes, so
# the clock is read with the clock_gettime system call itself.
use strict;
use warnings;
my $SYS_clock_gettime = 228;    # x86_64
my $CLOCK_MONOTONIC = 1;
sub now_ns {
    my $ts = "\0" x 16;
    syscall($SYS_clock_gettime, $CLOCK_MONOTONIC, $ts) == 0 or die "clock_gettime: $!";
    my ($s, $ns) = unpack('q q', $ts);
    return $s * 1_000_000_000 + $ns;
}
open(my $dev, '<', '/dev/hsmp') or die "open /dev/hsmp: $!";
my @times;
for (1 .. $ARGV[0]) {
    # struct hsmp_message: msg_id, num_args, response_sz, args[8], sock_ind, 2 bytes padding.
    my $msg = pack('L S S L8 S x2', 0x0B, 0, 1, (0) x 8, 0);
    my $t0 = now_ns();
    ioctl($dev, 0xC02CF800, $msg) or die "ioctl: $!";
    push @times, now_ns() - $t0;
}
my @sorted = sort { $a <=> $b } @times;
print $sorted[int(@sorted / 2)], "\n";
