<?php
// The chain of an FPM request (fpm_burn.php).

function gamma_burn(int $n): int
{
    $x = 0;
    for ($i = 0; $i < $n; $i++) {
        $x = ($x * 31 + $i) % 1000003;
    }
    return $x;
}

function beta(int $n): int
{
    return gamma_burn($n) + 1;
}

function alpha(int $n): int
{
    return beta($n) + 1;
}
