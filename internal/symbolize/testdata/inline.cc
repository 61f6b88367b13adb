// A C++ workload for the inline-chain tests: templates in namespaces that
// GCC inlines at -O2 into out-of-line callers.
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace geo {
namespace detail {

template <typename T>
inline T square(T x) {
	return x * x;
}

}  // namespace detail

template <typename T>
struct Acc {
	T sum{};
	inline void add(T x) { sum += detail::square(x) + 1; }
};

template <typename T>
__attribute__((noinline)) T total(const std::vector<T> &v) {
	Acc<T> a;
	for (const T &x : v) a.add(x);
	return a.sum;
}

}  // namespace geo

int main(int argc, char **argv) {
	std::vector<long> vl;
	std::vector<double> vd;
	for (int i = 0; i < argc * 100; i++) {
		vl.push_back(i);
		vd.push_back(i / 3.0);
	}
	std::printf("%ld %f\n", geo::total(vl), geo::total(vd));
	return 0;
}
