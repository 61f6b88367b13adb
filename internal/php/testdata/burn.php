<?php
// A known chain with a CPU-bound leaf: main -> alpha -> beta -> a leaf
// chosen by argv[1]. The tests find each function's line by its name.
//   php (default): gamma_burn, a loop in PHP;
//   ext: gamma_hash, whose time goes to hash('sha256', ...), C code;
//   closure: Burner::run -> Burner::{closure}, a loop in PHP;
//   include: inc_burn.php's top-level code -> {closure} -> gamma_burn.
// It prints "ready" once the chain runs.

require __DIR__ . '/burner.php';

function gamma_burn(int $n): int
{
    $x = 0;
    for ($i = 0; $i < $n; $i++) {
        $x = ($x * 31 + $i) % 1000003;
    }
    return $x;
}

function gamma_hash(string $data): int
{
    return strlen(hash('sha256', $data));
}

function beta(string $mode, int $n, string $data): int
{
    switch ($mode) {
        case 'ext':
            return gamma_hash($data) + 1;
        case 'closure':
            return (new Burner())->run($n) + 1;
        case 'include':
            return (include __DIR__ . '/inc_burn.php') + 1;
    }
    return gamma_burn($n) + 1;
}

function alpha(string $mode, int $n, string $data): int
{
    return beta($mode, $n, $data) + 1;
}

function main(array $argv): void
{
    $mode = $argv[1] ?? 'php';
    $data = str_repeat('sonde', 200000);
    $sum = 0;
    echo "ready\n";
    for (;;) {
        $sum = ($sum + alpha($mode, 200000, $data)) % 1000003;
    }
}

main($argv);
