<?php
// Included by beta (burn.php include): its top-level code calls
// gamma_burn through an arrow function. $n is beta's.

$f = fn (int $k): int => gamma_burn($k);
return $f($n);
