// rustburn: burns CPU forever in named Rust functions.
use std::hint::black_box;

#[inline(never)]
fn spin(n: u64) -> u64 {
    let mut s = 0u64;
    for i in 0..n {
        s = black_box(s ^ i.wrapping_mul(31));
    }
    s
}

#[inline(never)]
fn outer() -> u64 {
    spin(black_box(1 << 20)) + 1
}

fn main() {
    loop {
        black_box(outer());
    }
}
