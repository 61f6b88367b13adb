// rchain: main -> a -> b -> c, where c burns CPU; Rust without frame
// pointers (the aarch64 QEMU check builds it with Debian's rustc, whose
// release predates std::hint::black_box: volatile reads keep the work).
use std::ptr::{read_volatile, write_volatile};

static mut SINK: u64 = 0;

#[inline(never)]
fn c(n: u64) -> u64 {
    let mut s = 0u64;
    for i in 0..n {
        s = s.wrapping_add(unsafe { read_volatile(&i) }.wrapping_mul(i));
    }
    s
}

#[inline(never)]
fn b(n: u64) -> u64 {
    c(n) + 1
}

#[inline(never)]
fn a(n: u64) -> u64 {
    b(n) + 1
}

fn main() {
    loop {
        let r = a(20_000_000);
        unsafe { write_volatile(&mut SINK, SINK.wrapping_add(r)) };
    }
}
