<?php
// Two CPU-bound leaves in a loop, leaf_a doing three times leaf_b's work,
// sampled by PHP itself: a tick function (declare(ticks=1) runs it after
// every statement of this file) takes debug_backtrace() once a millisecond
// and counts the function it interrupted. The counts go to the file
// argv[1] as JSON every half second. It prints "ready" once it runs.

declare(ticks=1);

$counts = [];
$last = hrtime(true);
$written = $last;
$out = $argv[1];

register_tick_function(function () use (&$counts, &$last, &$written, $out) {
    $now = hrtime(true);
    if ($now - $last < 1000000) {
        return;
    }
    $last = $now;
    $bt = debug_backtrace(DEBUG_BACKTRACE_IGNORE_ARGS, 2);
    $fn = $bt[1]['function'] ?? '{main}';
    $counts[$fn] = ($counts[$fn] ?? 0) + 1;
    if ($now - $written >= 500000000) {
        $written = $now;
        file_put_contents($out . '.tmp', json_encode($counts));
        rename($out . '.tmp', $out);
    }
});

function leaf_a(int $n): int
{
    $x = 0;
    for ($i = 0; $i < 3 * $n; $i++) {
        $x = ($x * 31 + $i) % 1000003;
    }
    return $x;
}

function leaf_b(int $n): int
{
    $x = 0;
    for ($i = 0; $i < $n; $i++) {
        $x = ($x * 17 + $i) % 1000003;
    }
    return $x;
}

echo "ready\n";
$sum = 0;
for (;;) {
    $sum = ($sum + leaf_a(20000) + leaf_b(20000)) % 1000003;
}
