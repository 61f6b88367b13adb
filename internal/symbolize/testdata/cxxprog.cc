// A C++ workload for the demangling tests: a namespaced function template,
// a member function and an overload set.
#include <cstdio>
#include <vector>

namespace geo {

template <typename T>
__attribute__((noinline)) T twice(T x) {
	T s = x;
	for (int i = 0; i < 10; i++) {
		s = s + x / (i + 1);
	}
	return s;
}

class Shape {
public:
	explicit Shape(double side) : side_(side) {}
	__attribute__((noinline)) double area() const { return side_ * side_; }

private:
	double side_;
};

__attribute__((noinline)) long scale(long x) { return twice(x) * 3; }
__attribute__((noinline)) double scale(double x) { return twice(x) * 3; }

}  // namespace geo

int main(int argc, char **) {
	std::vector<geo::Shape> shapes;
	for (int i = 0; i < argc + 3; i++) shapes.emplace_back(i);
	double sum = 0;
	for (const auto &s : shapes) sum += s.area();
	std::printf("%f %d %ld %f\n", sum, geo::twice(argc), geo::scale(long(argc)), geo::scale(double(argc)));
	return 0;
}
