<?php
// One FPM request: handle -> alpha -> beta -> gamma_burn, some tens of
// milliseconds of CPU, then a line of output.

require __DIR__ . '/fpm_lib.php';

function handle(int $n): string
{
    return "sum " . alpha($n) . "\n";
}

echo handle(300000);
