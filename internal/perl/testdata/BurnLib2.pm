package Burn::Lib2;
use strict;
use warnings;

sub epsilon_burn {
    my $x = 0;
    while (1) {
        for my $i (1 .. 1000) { $x = ($x * 31 + $i) % 1000003; }  # epsilon_burn loop
        main::ready();
    }
}

epsilon_burn();                # BurnLib2 top-level calls epsilon_burn

1;
