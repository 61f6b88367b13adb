# Prints the exclusive time (seconds) NYTProf measured of each sub named on
# the command line, one "name seconds" line each, from the profile in
# $ENV{NYTPROF_FILE}.
use strict;
use warnings;
use Devel::NYTProf::Data;

my $p = Devel::NYTProf::Data->new({ filename => $ENV{NYTPROF_FILE}, quiet => 1 });
my $subs = $p->subname_subinfo_map;
for my $name (@ARGV) {
    my $si = $subs->{$name} or die "no sub $name in the profile\n";
    printf "%s %.6f\n", $name, $si->excl_time;
}
