// heavy is the C++ file the node-like scenario compiles in a loop with
// g++ -O2 -c: a small log indexer written the way real C++ is, on the
// standard library's heaviest headers (regex, iostreams, containers,
// algorithms, variant, function), so each compile spends 1-2 s in the
// compiler's parser and optimizer like a real translation unit. It is
// compiled, never run.
#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

namespace logindex {

using Value = std::variant<long, double, std::string, bool>;

struct Entry {
	std::chrono::system_clock::time_point when;
	std::string host;
	std::string level;
	std::map<std::string, Value> fields;
	std::vector<std::string> tags;
};

struct Stats {
	std::size_t count = 0;
	double sum = 0;
	double min = 0;
	double max = 0;
	std::vector<double> values;

	void add(double v)
	{
		if (count == 0 || v < min)
			min = v;
		if (count == 0 || v > max)
			max = v;
		++count;
		sum += v;
		values.push_back(v);
	}

	double quantile(double q) const
	{
		if (values.empty())
			return 0;
		std::vector<double> sorted(values);
		std::sort(sorted.begin(), sorted.end());
		auto i = static_cast<std::size_t>(q * (sorted.size() - 1));
		return sorted[i];
	}
};

std::string render(const Value &v)
{
	return std::visit(
		[](const auto &x) -> std::string {
			using T = std::decay_t<decltype(x)>;
			std::ostringstream out;
			if constexpr (std::is_same_v<T, bool>)
				out << (x ? "true" : "false");
			else if constexpr (std::is_same_v<T, std::string>)
				out << std::quoted(x);
			else
				out << std::setprecision(6) << x;
			return out.str();
		},
		v);
}

std::optional<Value> parse_value(const std::string &s)
{
	static const std::regex integer(R"(^[-+]?\d+$)");
	static const std::regex real(R"(^[-+]?\d*\.\d+([eE][-+]?\d+)?$)");
	static const std::regex boolean(R"(^(true|false)$)", std::regex::icase);
	if (std::regex_match(s, integer))
		return Value(std::stol(s));
	if (std::regex_match(s, real))
		return Value(std::stod(s));
	if (std::regex_match(s, boolean))
		return Value(s[0] == 't' || s[0] == 'T');
	if (s.empty())
		return std::nullopt;
	return Value(s);
}

std::optional<Entry> parse_line(const std::string &line)
{
	static const std::regex head(R"(^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z\s+(\S+)\s+(DEBUG|INFO|WARN|ERROR)\s+(.*)$)");
	static const std::regex field(R"((\w+)=("[^"]*"|\S+))");
	static const std::regex tag(R"(#([A-Za-z][\w-]*))");
	std::smatch m;
	if (!std::regex_match(line, m, head))
		return std::nullopt;
	std::tm tm{};
	tm.tm_year = std::stoi(m[1]) - 1900;
	tm.tm_mon = std::stoi(m[2]) - 1;
	tm.tm_mday = std::stoi(m[3]);
	tm.tm_hour = std::stoi(m[4]);
	tm.tm_min = std::stoi(m[5]);
	tm.tm_sec = std::stoi(m[6]);
	Entry e;
	e.when = std::chrono::system_clock::from_time_t(timegm(&tm));
	e.host = m[7];
	e.level = m[8];
	std::string rest = m[9];
	for (std::sregex_iterator it(rest.begin(), rest.end(), field), end; it != end; ++it) {
		std::string v = (*it)[2];
		if (v.size() >= 2 && v.front() == '"')
			v = v.substr(1, v.size() - 2);
		if (auto pv = parse_value(v))
			e.fields.emplace((*it)[1], *pv);
	}
	for (std::sregex_iterator it(rest.begin(), rest.end(), tag), end; it != end; ++it)
		e.tags.push_back((*it)[1]);
	return e;
}

class Index {
public:
	void add(Entry e)
	{
		std::size_t id = entries_.size();
		by_host_[e.host].push_back(id);
		by_level_[e.level].insert(id);
		for (const auto &t : e.tags)
			by_tag_.emplace(t, id);
		for (const auto &[k, v] : e.fields)
			if (auto d = number(v))
				stats_[k].add(*d);
		entries_.push_back(std::move(e));
	}

	std::vector<const Entry *> query(const std::function<bool(const Entry &)> &pred) const
	{
		std::vector<const Entry *> out;
		for (const auto &e : entries_)
			if (pred(e))
				out.push_back(&e);
		std::stable_sort(out.begin(), out.end(), [](const Entry *a, const Entry *b) { return a->when < b->when; });
		return out;
	}

	std::vector<std::pair<std::string, std::size_t>> top_hosts(std::size_t n) const
	{
		std::vector<std::pair<std::string, std::size_t>> v;
		for (const auto &[h, ids] : by_host_)
			v.emplace_back(h, ids.size());
		std::partial_sort(v.begin(), v.begin() + std::min(n, v.size()), v.end(),
			[](const auto &a, const auto &b) { return std::tie(b.second, a.first) < std::tie(a.second, b.first); });
		v.resize(std::min(n, v.size()));
		return v;
	}

	std::set<std::string> tags_of_level(const std::string &level) const
	{
		std::set<std::string> out;
		auto it = by_level_.find(level);
		if (it == by_level_.end())
			return out;
		for (const auto &[t, id] : by_tag_)
			if (it->second.count(id))
				out.insert(t);
		return out;
	}

	const std::map<std::string, Stats> &stats() const { return stats_; }

	std::string report() const
	{
		std::ostringstream out;
		out << "entries " << entries_.size() << '\n';
		for (const auto &[k, s] : stats_)
			out << std::left << std::setw(16) << k << " n=" << s.count << " mean=" << (s.count ? s.sum / s.count : 0)
			    << " p50=" << s.quantile(0.5) << " p99=" << s.quantile(0.99) << '\n';
		for (const auto &[h, n] : top_hosts(5))
			out << "host " << h << ' ' << n << '\n';
		return out.str();
	}

private:
	static std::optional<double> number(const Value &v)
	{
		if (auto p = std::get_if<long>(&v))
			return static_cast<double>(*p);
		if (auto p = std::get_if<double>(&v))
			return *p;
		return std::nullopt;
	}

	std::deque<Entry> entries_;
	std::unordered_map<std::string, std::vector<std::size_t>> by_host_;
	std::map<std::string, std::unordered_set<std::size_t>> by_level_;
	std::multimap<std::string, std::size_t> by_tag_;
	std::map<std::string, Stats> stats_;
};

template <typename Key, typename Fn>
auto group_by(const std::vector<const Entry *> &es, Fn key)
{
	std::map<Key, std::list<const Entry *>> out;
	for (auto e : es)
		out[key(*e)].push_back(e);
	return out;
}

std::string rewrite(const std::string &s)
{
	static const std::vector<std::pair<std::regex, std::string>> rules = {
		{std::regex(R"(\b(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\b)"), "<ip>"},
		{std::regex(R"(\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b)"), "<uuid>"},
		{std::regex(R"(\b\d+ms\b)"), "<duration>"},
		{std::regex(R"(/home/[^/\s]+)"), "/home/<user>"},
	};
	std::string out = s;
	for (const auto &[re, with] : rules)
		out = std::regex_replace(out, re, with);
	return out;
}

} // namespace logindex

int main(int argc, char **argv)
{
	logindex::Index index;
	std::istream *in = &std::cin;
	std::ifstream file;
	if (argc > 1) {
		file.open(argv[1]);
		in = &file;
	}
	std::string line;
	std::size_t bad = 0;
	while (std::getline(*in, line)) {
		if (auto e = logindex::parse_line(logindex::rewrite(line)))
			index.add(std::move(*e));
		else
			++bad;
	}
	auto errors = index.query([](const logindex::Entry &e) { return e.level == "ERROR"; });
	auto by_host = logindex::group_by<std::string>(errors, [](const logindex::Entry &e) { return e.host; });
	for (const auto &[h, es] : by_host) {
		std::cout << h << ": " << es.size() << " errors";
		if (!es.empty())
			for (const auto &[k, v] : es.front()->fields)
				std::cout << ' ' << k << '=' << logindex::render(v);
		std::cout << '\n';
	}
	for (const auto &t : index.tags_of_level("WARN"))
		std::cout << "warn tag " << t << '\n';
	std::cout << index.report() << "unparsed " << bad << '\n';
}
