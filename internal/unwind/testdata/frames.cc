// C++ fixture for the CFI oracle test: exceptions (personality routines and
// LSDAs in the CIE/FDE augmentation data), destructors and virtual calls.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct Base {
	virtual ~Base() = default;
	virtual int run(int n) = 0;
};

struct Thrower : Base {
	int run(int n) override {
		std::vector<std::string> names(n, "x");
		if (n > 2) throw std::runtime_error("too many: " + std::to_string(names.size()));
		return static_cast<int>(names.size());
	}
};

__attribute__((noinline)) int call(Base &b, int n) {
	std::string guard = "guard";
	try {
		return b.run(n) + static_cast<int>(guard.size());
	} catch (const std::runtime_error &e) {
		return -static_cast<int>(std::string(e.what()).size());
	}
}

int main(int argc, char **) {
	auto t = std::make_unique<Thrower>();
	int total = 0;
	for (int i = 0; i < argc + 4; i++) total += call(*t, i);
	std::printf("%d\n", total);
	return 0;
}
