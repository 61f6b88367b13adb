// compile is what the compile test has g++ compile, again and again: a
// translation unit of a few standard headers and their templates.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

int compiled()
{
	std::map<std::string, std::vector<int>> m;
	m["a"].push_back(1);
	std::unordered_map<int, std::string> u{{1, "one"}};
	std::vector<std::string> v{"b", "a"};
	std::sort(v.begin(), v.end());
	return int(m.size() + u.size() + v.size());
}
