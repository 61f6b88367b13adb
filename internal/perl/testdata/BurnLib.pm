package Burn::Lib;
use strict;
use warnings;

sub delta {
    require BurnLib2;          # delta requires BurnLib2
}

1;
