# A CPU-bound Perl workload with a known chain: main -> alpha -> beta ->
# gamma_burn ("chain"), or with an eval block and a required module in it
# ("eval": main -> alpha -> (eval) -> Burn::Lib::delta -> (require) of
# BurnLib2.pm's top-level code -> Burn::Lib2::epsilon_burn), or the chain
# with its leaf in an XS module ("xs": gamma_burn hashes with Digest::MD5's
# C code), or through a sort's comparison sub, which C calls ("sort": main ->
# alpha -> sort -> by_num -> beta -> gamma_burn). Prints "ready" once the
# leaf runs, then burns until killed.
# "oracle" runs two leaves, leaf_a with three times leaf_b's work, until
# SIGTERM or for the seconds its second argument says (default 120), then
# exits: NYTProf's exclusive times of the two are what Sonde's samples are
# compared with.
use strict;
use warnings;
use FindBin;
use lib $FindBin::Bin;

$| = 1;
my $mode = shift // 'chain';
my $said = 0;

sub ready { print "ready\n" unless $said++; }

sub gamma_burn {
    if ($mode eq 'xs') {
        require Digest::MD5;
        my $data = 'x' x (1 << 20);
        while (1) {
            Digest::MD5::md5($data);   # xs leaf
            ready();                   # xs ready
        }
    }
    my $x = 0;
    while (1) {
        for my $i (1 .. 1000) { $x = ($x * 31 + $i) % 1000003; }  # gamma_burn loop
        ready();                       # chain ready
    }
}

sub beta { gamma_burn(); }     # beta calls gamma_burn

sub by_num { beta(); 0 }       # by_num calls beta

sub alpha {
    if ($mode eq 'sort') {
        my @s = sort by_num 2, 1;   # alpha sorts
        return;
    }
    if ($mode eq 'eval') {
        eval { require BurnLib; Burn::Lib::delta(); 1 } or die $@;   # alpha evals
        return;
    }
    beta();                    # alpha calls beta
}

sub main { alpha(); }          # main calls alpha

sub leaf_a { my $x = 0; $x = ($x * 31 + $_) % 1000003 for 1 .. 300000; $x }
sub leaf_b { my $x = 0; $x = ($x * 31 + $_) % 1000003 for 1 .. 100000; $x }

if ($mode eq 'oracle') {
    my $stop = 0;
    $SIG{TERM} = sub { $stop = 1 };
    my $end = time + (shift // 120);
    ready();
    while (!$stop && time < $end) { leaf_a(); leaf_b(); }
    exit 0;
}

main();                        # top-level calls main
