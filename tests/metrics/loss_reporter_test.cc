// The loss reporter between the step aggregator and the metrics: what
// concurrent requests leave in the Prometheus exposition.

#include "server/metrics/loss_reporter.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/metrics/metrics_without_port.h"

namespace klserve::server {
namespace {

// The distinct run labels of klserve_indexer_last_step in an exposition.
int RunsWithSeries(const std::string& exposition) {
  int runs = 0;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::StartsWith(line, "klserve_indexer_last_step{")) ++runs;
  }
  return runs;
}

// Threads that each run fresh runs of two steps push the others' runs out
// of --max_runs = 2. A step published by one thread after another had
// evicted its run and removed its series used to bring the series back for
// good: 66 runs kept series after 20,000 runs went through (a helper's
// attack over gRPC). Whatever the interleaving, only tracked runs may have
// series: at most max_runs.
TEST(LossReporterTest, RunsEvictedWhileOthersPublishKeepNoSeries) {
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.steps.max_runs = 2;
  LossReporter reporter(metrics.get(), options);
  constexpr int kThreads = 8;
  constexpr int kRunsPerThread = 10000;
  IndexerKlResult result;
  result.kl_sum = 1;
  result.denominator = 1;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRunsPerThread; ++r) {
        const std::string run = absl::StrCat("t", t, "r", r);
        for (int64_t step = 0; step < 2; ++step) {
          for (int32_t layer = 0; layer < 4; ++layer) {
            ASSERT_TRUE(reporter
                            .Add({.run = run,
                                  .step = step,
                                  .layer = layer,
                                  .microbatch = 0},
                                 result, 1.0)
                            .ok());
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LE(RunsWithSeries(metrics->Scrape()), options.steps.max_runs);
}

// A late sample of a run evicted past --max_runs is counted without series
// of its own, and leaves the tracked runs' series as they were: it used to
// take its run back, evicting a live run and removing that run's series.
TEST(LossReporterTest, ALateSampleOfAnEvictedRunKeepsTheLiveRunsSeries) {
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.steps.max_runs = 1;
  LossReporter reporter(metrics.get(), options);
  IndexerKlResult result;
  result.kl_sum = 1;
  result.denominator = 1;
  const auto add = [&](const std::string& run, int64_t step) {
    LossTags tags;
    tags.run = run;
    tags.step = step;
    ASSERT_TRUE(reporter.Add(tags, result, 1.0).ok());
  };
  add("old", 1);
  add("old", 2);   // publishes step 1
  add("live", 1);  // evicts old, publishing step 2
  add("live", 2);  // publishes step 1
  add("old", 2);   // late
  const std::string exposition = metrics->Scrape();
  EXPECT_TRUE(
      absl::StrContains(exposition, "klserve_indexer_last_step{run=\"live\"}"))
      << exposition;
  EXPECT_EQ(RunsWithSeries(exposition), 1) << exposition;
  EXPECT_FALSE(absl::StrContains(exposition, "run=\"old\"")) << exposition;
  EXPECT_TRUE(absl::StrContains(exposition,
                                "klserve_late_samples_of_evicted_runs_total 1"))
      << exposition;
}

// A step, a layer or a microbatch without a run is aggregated nowhere: the
// caller learns it (an ML-engineer helper's job tagged steps and saw no
// curve, with no error).
TEST(LossReporterTest, TagsWithoutARunAreRefusedNamingTheRun) {
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporter reporter(metrics.get(), LossReporterOptions());
  LossTags step, layer, microbatch;
  step.step = 3;
  layer.layer = 2;
  microbatch.microbatch = 0;  // set, even to 0
  for (const LossTags& tags : {step, layer, microbatch}) {
    const absl::Status status = reporter.CheckTags(tags);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), "tags.run: required"))
        << status;
  }
  EXPECT_TRUE(reporter.CheckTags(LossTags()).ok());
}

// A step keeps its distinct microbatches until it is published, so their
// range is bounded like the layers', before anything is computed.
TEST(LossReporterTest, MicrobatchesOutsideTheirRangeAreRefusedNamingTheFlag) {
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.max_microbatches_per_step = 16;
  LossReporter reporter(metrics.get(), options);
  const auto check = [&](int32_t microbatch) {
    return reporter.CheckTags(
        {.run = "r", .step = 1, .layer = 0, .microbatch = microbatch});
  };
  EXPECT_TRUE(check(0).ok());
  EXPECT_TRUE(check(15).ok());
  for (const int32_t outside : {-1, 16, std::numeric_limits<int32_t>::max()}) {
    const absl::Status status = check(outside);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_TRUE(absl::StartsWith(status.message(), "tags.microbatch: "))
        << status;
    EXPECT_TRUE(
        absl::StrContains(status.message(), "--max_microbatches_per_step"))
        << status;
  }
  // Without a run, a microbatch is an error of its own: no run to count in.
  LossTags untagged;
  untagged.microbatch = -1;
  EXPECT_TRUE(
      absl::StartsWith(reporter.CheckTags(untagged).message(), "tags.run: "));
}

}  // namespace
}  // namespace klserve::server
