// layout: main -> layout_a -> layout_b -> layout_c, where layout_c burns
// CPU; the Rust twin of layout.c. It first prints the run-time address of
// each function ("layout_a 0x..."), then runs the chain forever, or with the
// argument "wait" sleeps instead.
use std::hint::black_box;
use std::io::Write;

#[no_mangle]
#[inline(never)]
pub extern "C" fn layout_c(n: u64) -> u64 {
    let mut x = n;
    for i in 0..100_000_000u64 {
        x = black_box(x.wrapping_mul(i | 1).wrapping_add(i));
    }
    x
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn layout_b(n: u64) -> u64 {
    black_box(layout_c(n)) + 1
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn layout_a(n: u64) -> u64 {
    black_box(layout_b(n)) + 1
}

fn main() {
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "layout_a {:#x}", layout_a as *const () as usize).unwrap();
        writeln!(out, "layout_b {:#x}", layout_b as *const () as usize).unwrap();
        writeln!(out, "layout_c {:#x}", layout_c as *const () as usize).unwrap();
        out.flush().unwrap();
    }
    if std::env::args().nth(1).as_deref() == Some("wait") {
        loop {
            std::thread::park();
        }
    }
    loop {
        black_box(layout_a(black_box(3)));
    }
}
