<?php
// A class whose method burns CPU in a closure (burn.php closure).

class Burner
{
    public function run(int $n): int
    {
        $burn = function (int $n): int {
            $x = 0;
            for ($i = 0; $i < $n; $i++) {
                $x = ($x * 17 + $i) % 1000003;
            }
            return $x;
        };
        return $burn($n);
    }
}
