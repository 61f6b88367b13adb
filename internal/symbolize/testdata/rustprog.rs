// A Rust workload for the demangling tests: a module function, a generic
// method and a plain function, none inlined.
mod util {
    #[inline(never)]
    pub fn helper(n: u64) -> u64 {
        let mut s = 0;
        for i in 0..n {
            s ^= i.wrapping_mul(31);
        }
        s
    }
}

struct Acc<T> {
    v: T,
}

impl<T: Copy + std::ops::Add<Output = T>> Acc<T> {
    #[inline(never)]
    fn add(&mut self, x: T) -> T {
        self.v = self.v + x;
        self.v
    }
}

#[inline(never)]
fn work(n: u64) -> u64 {
    util::helper(n) + 1
}

fn main() {
    let mut a = Acc { v: 1u64 };
    let n = std::env::args().count() as u64;
    println!("{} {}", work(n * 1000), a.add(n));
}
