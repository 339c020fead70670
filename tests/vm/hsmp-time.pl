#!/usr/bin/perl
# The VM test's timing loop: sends ARGV[0] GET_PROC_HOT (0x0B) messages to socket 0 through
# the real driver, one ioctl(HSMP_IOCTL_CMD) each, and dies on the first error. The host times
# two runs of different lengths, so perl's own start-up cancels out.
use strict;
use warnings;
open(my $dev, '<', '/dev/hsmp') or die "open /dev/hsmp: $!";
for (1 .. $ARGV[0]) {
    # struct hsmp_message: msg_id, num_args, response_sz, args[8], sock_ind, 2 bytes padding.
    my $msg = pack('L S S L8 S x2', 0x0B, 0, 1, (0) x 8, 0);
    ioctl($dev, 0xC02CF800, $msg) or die "ioctl: $!";
}
