// Shared by the benchmark binaries: a reporter that also keeps each run's figures, and a main()
// body that prints a binary's own "ratios" section after the usual table. Ratios and target
// checks inform; a MISS never fails the run (a shared machine is too noisy for that). A
// benchmark that could not run (SkipWithError) makes the exit status non-zero, so the ctest
// smoke tests catch a broken setup.
#ifndef KVTIER_BENCH_BENCH_REPORT_H_
#define KVTIER_BENCH_BENCH_REPORT_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"

namespace kvtier::bench {

// Reports `status` as the reason this benchmark could not run. The caller must leave the loop.
inline void Skip(benchmark::State& state, const char* what, const absl::Status& status) {
  state.SkipWithError(absl::StrCat(what, ": ", status.ToString()).c_str());
}

// What the ratios need of one benchmark.
struct Result {
  double real_ns = 0;  // wall time per iteration
  std::optional<double> bytes_per_second;
  std::optional<double> items_per_second;
  std::map<std::string, double> counters;  // every user counter, by name
};

inline double NsPerUnit(benchmark::TimeUnit unit) {
  switch (unit) {
    case benchmark::kNanosecond:
      return 1;
    case benchmark::kMicrosecond:
      return 1e3;
    case benchmark::kMillisecond:
      return 1e6;
    case benchmark::kSecond:
      return 1e9;
  }
  return 1;
}

// A reporter (console or JSON, as --benchmark_format asks) that also keeps each benchmark's
// figures. With repetitions the median stands for the benchmark, else its last run.
template <typename Base>
class CapturingReporter : public Base {
 public:
  using Base::Base;

  void ReportRuns(const std::vector<benchmark::BenchmarkReporter::Run>& runs) override {
    Base::ReportRuns(runs);
    for (const benchmark::BenchmarkReporter::Run& run : runs) {
      if (run.error_occurred) {
        any_error_ = true;
        continue;
      }
      const bool aggregate = run.run_type == benchmark::BenchmarkReporter::Run::RT_Aggregate;
      if (aggregate && run.aggregate_name != "median") continue;  // mean, stddev, cv, BigO
      const std::string name = run.run_name.str();
      if (!aggregate && medians_.contains(name)) continue;
      Result result;
      result.real_ns = run.GetAdjustedRealTime() * NsPerUnit(run.time_unit);
      if (auto it = run.counters.find("bytes_per_second"); it != run.counters.end()) {
        result.bytes_per_second = it->second.value;
      }
      if (auto it = run.counters.find("items_per_second"); it != run.counters.end()) {
        result.items_per_second = it->second.value;
      }
      for (const auto& [counter, value] : run.counters) result.counters[counter] = value.value;
      results_[name] = result;
      if (aggregate) medians_.insert(name);
    }
  }

  const std::map<std::string, Result>& results() const { return results_; }
  bool any_error() const { return any_error_; }

 private:
  std::map<std::string, Result> results_;
  std::set<std::string> medians_;
  bool any_error_ = false;
};

using Results = std::map<std::string, Result>;

inline const Result* Find(const Results& results, const std::string& name) {
  auto it = results.find(name);
  return it == results.end() ? nullptr : &it->second;
}

inline std::string Check(const char* what, double value, const char* unit, double target,
                         bool higher_is_better) {
  const bool pass = higher_is_better ? value >= target : value <= target;
  char line[160];
  std::snprintf(line, sizeof(line), "  %-46s %10.3f %-5s (target %s %g %s)  %s\n", what, value,
                unit, higher_is_better ? ">=" : "<=", target, unit, pass ? "PASS" : "MISS");
  return line;
}

inline std::string Ratio(const char* what, double ratio) {
  char line[120];
  std::snprintf(line, sizeof(line), "  %-46s %10.3f\n", what, ratio);
  return line;
}

// Prints the two sections a binary computed; an empty one says why.
inline void PrintSections(std::FILE* out, const char* ratio_title, const std::string& ratios,
                          const std::string& checks) {
  std::fprintf(out, "\n---- ratios (%s) ----\n", ratio_title);
  std::fputs(
      ratios.empty() ? "  (none: a run each ratio needs was filtered out)\n" : ratios.c_str(), out);
  std::fprintf(out, "---- targets (informational: a MISS does not fail the run) ----\n");
  std::fputs(checks.empty() ? "  (none: the runs they check were filtered out)\n" : checks.c_str(),
             out);
}

// The value of `--name=value` in argv, or nullopt. Read before benchmark::Initialize, which
// consumes the flags; 1.7.1 does not expose its parsed flag values.
inline std::optional<std::string_view> FlagValue(int argc, char** argv, std::string_view name) {
  std::optional<std::string_view> value;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.size() > name.size() + 1 && arg.starts_with(name) && arg[name.size()] == '=') {
      value = arg.substr(name.size() + 1);  // the last occurrence wins, as in the library
    }
  }
  return value;
}

// The console reporter's options as the library's default one would choose them: colour only on
// a terminal unless --benchmark_color says otherwise, so a piped log holds no escape codes.
inline benchmark::ConsoleReporter::OutputOptions ConsoleOptions(int argc, char** argv) {
  const std::string_view color = FlagValue(argc, argv, "--benchmark_color").value_or("auto");
  bool use_color = isatty(STDOUT_FILENO) != 0;
  if (color == "true" || color == "yes" || color == "1") use_color = true;
  if (color == "false" || color == "no" || color == "0") use_color = false;
  int options = benchmark::ConsoleReporter::OO_None;
  if (use_color) options |= benchmark::ConsoleReporter::OO_Color;
  if (FlagValue(argc, argv, "--benchmark_counters_tabular").value_or("false") == "true") {
    options |= benchmark::ConsoleReporter::OO_Tabular;
  }
  return static_cast<benchmark::ConsoleReporter::OutputOptions>(options);
}

// The whole main() of a benchmark binary: runs what the flags select, then `print_ratios` over
// the captured results (to stdout, or stderr when stdout carries JSON).
inline int RunAndReport(int argc, char** argv, void (*print_ratios)(std::FILE*, const Results&)) {
  const std::string format(FlagValue(argc, argv, "--benchmark_format").value_or("console"));
  const benchmark::ConsoleReporter::OutputOptions console_options = ConsoleOptions(argc, argv);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  bool any_error = false;
  if (format == "console") {
    CapturingReporter<benchmark::ConsoleReporter> reporter(console_options);
    benchmark::RunSpecifiedBenchmarks(&reporter);
    print_ratios(stdout, reporter.results());
    any_error = reporter.any_error();
  } else if (format == "json") {
    // stdout stays valid JSON; the ratios go to stderr.
    CapturingReporter<benchmark::JSONReporter> reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    std::fflush(stdout);
    print_ratios(stderr, reporter.results());
    any_error = reporter.any_error();
  } else {
    // csv (deprecated in the library) and anything else: the library's own reporter, no ratios.
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  // Misses are information; a benchmark that could not run at all is a broken setup.
  return any_error ? 1 : 0;
}

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_BENCH_REPORT_H_
