// Per-step accumulation against hand-computed values: microbatch (row)
// weighting, the mean over layers, the scaling factor, diagnostics, and the
// life of a step (newer step, FinishStep, idle timeout, eviction, late
// samples).

#include "server/metrics/step_aggregator.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace klserve::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

StepSample Sample(const std::string& run, int64_t step,
                  std::optional<int32_t> layer, int32_t microbatch,
                  double kl_sum, int64_t rows, double c = 1.0) {
  StepSample s;
  s.run = run;
  s.step = step;
  s.layer = layer;
  s.microbatch = microbatch;
  s.kl_sum = kl_sum;
  s.rows = rows;
  s.scaling_factor = c;
  return s;
}

// Adds and expects success.
AddResult MustAdd(StepAggregator& agg, const StepSample& s,
                  absl::Time now = kT0) {
  absl::StatusOr<AddResult> r = agg.Add(s, now);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AddResult{};
}

// Finishes an open step and expects it.
FinishedStep MustFinish(StepAggregator& agg, const std::string& run,
                        int64_t step) {
  absl::StatusOr<FinishedStep> r = agg.Finish(run, step);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : FinishedStep{};
}

// Expects Finish to say `code` with `text` in its message.
void ExpectFinishFails(StepAggregator& agg, const std::string& run,
                       int64_t step, absl::StatusCode code,
                       absl::string_view text) {
  absl::StatusOr<FinishedStep> r = agg.Finish(run, step);
  ASSERT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(text), absl::string_view::npos)
      << r.status();
}

TEST(StepAggregator, WeightsMicrobatchesByRows) {
  StepAggregator agg;
  // Microbatch 0: 4 rows, mean KL 0.5; microbatch 1: 1 row, KL 1.0. The
  // row-weighted mean is 3 / 5 = 0.6 (not the mean of means, 0.75).
  MustAdd(agg, Sample("r", 10, 0, 0, 2.0, 4, 0.01));
  MustAdd(agg, Sample("r", 10, 0, 1, 1.0, 1, 0.01));
  const AddResult next = MustAdd(agg, Sample("r", 11, 0, 0, 7.0, 7, 0.01));
  ASSERT_EQ(next.finished.size(), 1u);
  const FinishedStep& s = next.finished[0];
  EXPECT_EQ(s.run, "r");
  EXPECT_EQ(s.step, 10);
  EXPECT_EQ(s.reason, FinishReason::kNewerStep);
  EXPECT_DOUBLE_EQ(s.unscaled_loss, 0.6);
  EXPECT_DOUBLE_EQ(s.loss, 0.006);
  ASSERT_TRUE(s.scaling_factor.has_value());
  EXPECT_EQ(*s.scaling_factor, 0.01);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.rows, 5);
  EXPECT_EQ(s.microbatches, 2);
  ASSERT_EQ(s.layers.size(), 1u);
  EXPECT_EQ(s.layers[0].layer, 0);
  EXPECT_DOUBLE_EQ(s.layers[0].unscaled_loss, 0.6);
  EXPECT_DOUBLE_EQ(s.layers[0].loss, 0.006);
  EXPECT_EQ(s.layers[0].rows, 5);
  EXPECT_EQ(s.layers[0].samples, 2);
}

TEST(StepAggregator, AveragesLayersEquallyAfterWeightingRowsWithinEach) {
  StepAggregator agg;
  // Layer 0 over two ranks: (1 + 3) / (2 + 2) = 1.0.
  MustAdd(agg, Sample("r", 1, 0, 0, 1.0, 2, 0.5));
  MustAdd(agg, Sample("r", 1, 0, 0, 3.0, 2, 0.5));
  // Layer 1: 2 / 8 = 0.25, despite its many rows.
  MustAdd(agg, Sample("r", 1, 1, 0, 2.0, 8, 0.5));
  // Layer 2: 0 / 4 = 0.
  MustAdd(agg, Sample("r", 1, 2, 0, 0.0, 4, 0.5));
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_EQ(s.reason, FinishReason::kFinishStep);
  // (1.0 + 0.25 + 0) / 3.
  EXPECT_DOUBLE_EQ(s.unscaled_loss, 1.25 / 3);
  EXPECT_DOUBLE_EQ(s.loss, 0.5 * 1.25 / 3);
  ASSERT_EQ(s.layers.size(), 3u);
  EXPECT_EQ(s.layers[0].layer, 0);
  EXPECT_EQ(s.layers[1].layer, 1);
  EXPECT_EQ(s.layers[2].layer, 2);
  EXPECT_DOUBLE_EQ(s.layers[0].unscaled_loss, 1.0);
  EXPECT_DOUBLE_EQ(s.layers[0].loss, 0.5);
  EXPECT_DOUBLE_EQ(s.layers[1].unscaled_loss, 0.25);
  EXPECT_DOUBLE_EQ(s.layers[2].unscaled_loss, 0.0);
  EXPECT_EQ(s.layers[0].samples, 2);
  EXPECT_EQ(s.rows, 16);
  EXPECT_EQ(s.microbatches, 1);
}

TEST(StepAggregator, UntaggedSamplesFormOneImplicitLayer) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 1, std::nullopt, 0, 1.0, 1));
  MustAdd(agg, Sample("r", 1, std::nullopt, 1, 3.0, 1));  // untagged: 2.0
  MustAdd(agg, Sample("r", 1, 7, 0, 1.0, 1));             // layer 7: 1.0
  const FinishedStep s = MustFinish(agg, "r", 1);
  ASSERT_EQ(s.layers.size(), 2u);
  EXPECT_FALSE(s.layers[0].layer.has_value());  // the untagged layer first
  EXPECT_DOUBLE_EQ(s.layers[0].unscaled_loss, 2.0);
  EXPECT_EQ(s.layers[1].layer, 7);
  EXPECT_DOUBLE_EQ(s.unscaled_loss, 1.5);
  EXPECT_DOUBLE_EQ(s.loss, 1.5);
}

TEST(StepAggregator, MixedScalingFactorsAverageTheScaledLayerValues) {
  StepAggregator agg;
  // Layer 0: c = 1 and c = 0.5 on one row each: (1 * 1 + 0.5 * 1) / 2.
  MustAdd(agg, Sample("r", 1, 0, 0, 1.0, 1, 1.0));
  MustAdd(agg, Sample("r", 1, 0, 1, 1.0, 1, 0.5));
  // Layer 1: c = 0.01, KL 2 over one row.
  MustAdd(agg, Sample("r", 1, 1, 0, 2.0, 1, 0.01));
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_FALSE(s.scaling_factor.has_value());
  EXPECT_DOUBLE_EQ(s.layers[0].loss, 0.75);
  EXPECT_DOUBLE_EQ(s.layers[0].unscaled_loss, 1.0);
  EXPECT_DOUBLE_EQ(s.layers[1].loss, 0.02);
  EXPECT_DOUBLE_EQ(s.loss, (0.75 + 0.02) / 2);
  EXPECT_DOUBLE_EQ(s.unscaled_loss, 1.5);
}

TEST(StepAggregator, ZeroRowsGiveZeroNotNaN) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 1, 0, 0, 0.0, 0));
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_EQ(s.loss, 0.0);
  EXPECT_EQ(s.unscaled_loss, 0.0);
}

TEST(StepAggregator, NaNPropagatesSoAlertsSeeIt) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 1, 0, 0, std::nan(""), 4));
  MustAdd(agg, Sample("r", 1, 1, 0, 1.0, 4));
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_TRUE(std::isnan(s.loss));
  EXPECT_TRUE(std::isnan(s.layers[0].loss));
  EXPECT_DOUBLE_EQ(s.layers[1].loss, 0.25);
}

TEST(StepAggregator, TheValuesDoNotDependOnTheOrderSamplesArriveIn) {
  // Ranks' requests finish in any order. kl_sums 2^53, 1, 1 sum to 2^53 + 2;
  // a running sum started with 2^53 rounds each 1 away (ties to even) and
  // gets 2^53. Each layer and each diagnostic must be the exact sum, rounded
  // once, then divided by the rows.
  const double two53 = std::ldexp(1.0, 53);
  std::vector<StepSample> samples;
  for (int32_t layer : {0, 1}) {
    for (double kl : {two53, 1.0, 1.0}) {
      StepSample s =
          Sample("r", 1, layer, static_cast<int32_t>(kl == 1.0), kl, 1, 0.5);
      SampleDiagnostics& d = s.diagnostics.emplace();
      d.entropy_p_sum = kl;
      d.entropy_q_sum = -kl;
      d.recall_sum = kl;
      d.rows_counted = 1;
      samples.push_back(s);
    }
  }
  const double layer_mean = (two53 + 2.0) / 3.0;
  std::mt19937_64 rng(3);
  for (int order = 0; order < 30; ++order) {
    std::shuffle(samples.begin(), samples.end(), rng);
    StepAggregator agg;
    for (const StepSample& s : samples) MustAdd(agg, s);
    const FinishedStep step = MustFinish(agg, "r", 1);
    ASSERT_EQ(step.layers.size(), 2u);
    for (const LayerLoss& layer : step.layers) {
      EXPECT_EQ(layer.unscaled_loss, layer_mean);
      EXPECT_EQ(layer.loss, 0.5 * layer_mean);
    }
    EXPECT_EQ(step.unscaled_loss, layer_mean);
    EXPECT_EQ(step.loss, 0.5 * layer_mean);
    EXPECT_EQ(step.mean_entropy_p, (2 * two53 + 4.0) / 6.0);
    EXPECT_EQ(step.mean_entropy_q, -(2 * two53 + 4.0) / 6.0);
    EXPECT_EQ(step.topk_recall, (2 * two53 + 4.0) / 6.0);
  }
}

TEST(StepAggregator, DiagnosticsAreRowWeightedOverTheSamplesThatSentThem) {
  StepAggregator agg;
  StepSample a = Sample("r", 1, 0, 0, 1.0, 2);
  a.diagnostics = SampleDiagnostics{.entropy_p_sum = 4.0,
                                    .entropy_q_sum = 6.0,
                                    .recall_sum = 1.5,
                                    .rows_counted = 2};
  StepSample b = Sample("r", 1, 1, 0, 1.0, 4);
  b.diagnostics = SampleDiagnostics{.entropy_p_sum = 2.0,
                                    .entropy_q_sum = 6.0,
                                    .recall_sum = std::nullopt,
                                    .rows_counted = 4};
  StepSample c = Sample("r", 1, 2, 0, 1.0, 4);  // no diagnostics
  MustAdd(agg, a);
  MustAdd(agg, b);
  MustAdd(agg, c);
  const FinishedStep s = MustFinish(agg, "r", 1);
  ASSERT_TRUE(s.mean_entropy_p.has_value());
  ASSERT_TRUE(s.mean_entropy_q.has_value());
  ASSERT_TRUE(s.topk_recall.has_value());
  EXPECT_DOUBLE_EQ(*s.mean_entropy_p, 6.0 / 6);
  EXPECT_DOUBLE_EQ(*s.mean_entropy_q, 12.0 / 6);
  EXPECT_DOUBLE_EQ(*s.topk_recall, 1.5 / 2);  // over a's rows only
}

TEST(StepAggregator, NoDiagnosticsLeavesThemAbsent) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 1, 0, 0, 1.0, 2));
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_FALSE(s.mean_entropy_p.has_value());
  EXPECT_FALSE(s.mean_entropy_q.has_value());
  EXPECT_FALSE(s.topk_recall.has_value());
}

TEST(StepAggregator, RunsAreIndependent) {
  StepAggregator agg;
  MustAdd(agg, Sample("a", 5, 0, 0, 1.0, 1));
  MustAdd(agg, Sample("b", 9, 0, 0, 3.0, 1));
  // A newer step of b finishes only b's step.
  const AddResult r = MustAdd(agg, Sample("b", 10, 0, 0, 1.0, 1));
  ASSERT_EQ(r.finished.size(), 1u);
  EXPECT_EQ(r.finished[0].run, "b");
  EXPECT_DOUBLE_EQ(r.finished[0].loss, 3.0);
  EXPECT_DOUBLE_EQ(MustFinish(agg, "a", 5).loss, 1.0);
  EXPECT_EQ(agg.num_runs(), 2);
}

TEST(StepAggregator, SkippedStepNumbersAreFine) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 100, 0, 0, 1.0, 1));
  const AddResult r = MustAdd(agg, Sample("r", 250, 0, 0, 1.0, 1));
  ASSERT_EQ(r.finished.size(), 1u);
  EXPECT_EQ(r.finished[0].step, 100);
  EXPECT_FALSE(r.late);
}

TEST(StepAggregator, SampleOfAnOlderStepIsLateAndNotMerged) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 5, 0, 0, 1.0, 1));
  MustAdd(agg, Sample("r", 6, 0, 0, 2.0, 1));  // finishes 5
  const AddResult late = MustAdd(agg, Sample("r", 5, 0, 1, 100.0, 1));
  EXPECT_TRUE(late.late);
  EXPECT_TRUE(late.finished.empty());
  const FinishedStep s6 = MustFinish(agg, "r", 6);
  EXPECT_DOUBLE_EQ(s6.loss, 2.0);  // the late sample is in neither step
  EXPECT_EQ(s6.samples, 1);
}

TEST(StepAggregator, SampleOfAFinishedStepIsLate) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 6, 0, 0, 2.0, 1));
  MustFinish(agg, "r", 6);
  EXPECT_TRUE(MustAdd(agg, Sample("r", 6, 0, 1, 1.0, 1)).late);
  EXPECT_TRUE(MustAdd(agg, Sample("r", 3, 0, 1, 1.0, 1)).late);
  // The next step opens normally.
  const AddResult r7 = MustAdd(agg, Sample("r", 7, 0, 0, 4.0, 2));
  EXPECT_FALSE(r7.late);
  EXPECT_TRUE(r7.finished.empty());
  EXPECT_DOUBLE_EQ(MustFinish(agg, "r", 7).loss, 2.0);
}

// Every rank of a job may finish its step: all but the first learn that it
// was finished already (the service answers them OK, already_finished).
TEST(StepAggregator, FinishStepOfAFinishedStepSaysSo) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 6, 0, 0, 2.0, 1));
  MustFinish(agg, "r", 6);
  // Finished by FinishStep.
  ExpectFinishFails(agg, "r", 6, absl::StatusCode::kAlreadyExists,
                    "step 6 of run \"r\": already finished: the run has "
                    "passed it, and published its value if it had "
                    "samples (the run's last finished step is 6)");
  // Its values stay for the other ranks' calls while it is the last.
  std::optional<PublishedValues> values = agg.LastPublished("r", 6);
  ASSERT_TRUE(values.has_value());
  EXPECT_EQ(values->loss, 2.0);
  EXPECT_EQ(values->samples, 1);
  // Finished by a newer step.
  MustAdd(agg, Sample("r", 7, 0, 0, 2.0, 1));
  MustAdd(agg, Sample("r", 8, 0, 0, 2.0, 1));
  ExpectFinishFails(agg, "r", 7, absl::StatusCode::kAlreadyExists,
                    "already finished: the run has passed it, and "
                    "published its value if it had samples (the run's "
                    "open step is 8)");
  EXPECT_FALSE(agg.LastPublished("r", 6).has_value());
  EXPECT_EQ(agg.LastPublished("r", 7)->loss, 2.0);
  // Nothing changed: step 8 is still open.
  EXPECT_EQ(MustFinish(agg, "r", 8).step, 8);
}

TEST(StepAggregator, FinishStepOfAnUnknownRunIsNotFound) {
  StepAggregator agg;
  ExpectFinishFails(agg, "nope", 3, absl::StatusCode::kNotFound,
                    "run \"nope\": no samples received");
}

TEST(StepAggregator, FinishStepOfAStepWithoutSamplesIsNotFound) {
  StepAggregator agg;
  MustAdd(agg, Sample("r", 6, 0, 0, 2.0, 1));
  ExpectFinishFails(agg, "r", 7, absl::StatusCode::kNotFound,
                    "step 7 of run \"r\": no samples (the run's open "
                    "step is 6)");
  // The open step is untouched.
  EXPECT_DOUBLE_EQ(MustFinish(agg, "r", 6).loss, 2.0);
  // Nothing open: a later step is still unknown.
  ExpectFinishFails(agg, "r", 9, absl::StatusCode::kNotFound,
                    "no samples (the run's last finished step is 6)");
}

TEST(StepAggregator, IdleTimeoutFinishesTheOpenStep) {
  StepAggregator agg({.max_runs = 8, .idle_timeout = absl::Seconds(10)});
  MustAdd(agg, Sample("r", 1, 0, 0, 1.0, 1), kT0);
  MustAdd(agg, Sample("r", 1, 0, 1, 3.0, 1), kT0 + absl::Seconds(4));
  // The clock runs from the step's last sample.
  EXPECT_TRUE(agg.FinishIdle(kT0 + absl::Seconds(13)).empty());
  const std::vector<FinishedStep> idle =
      agg.FinishIdle(kT0 + absl::Seconds(14));
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0].reason, FinishReason::kIdle);
  EXPECT_EQ(idle[0].step, 1);
  EXPECT_DOUBLE_EQ(idle[0].loss, 2.0);
  EXPECT_EQ(idle[0].first_sample_time, kT0);
  EXPECT_EQ(idle[0].last_sample_time, kT0 + absl::Seconds(4));
  // Finished once only; the run stays tracked, and a straggler is late.
  EXPECT_TRUE(agg.FinishIdle(kT0 + absl::Hours(1)).empty());
  EXPECT_EQ(agg.num_runs(), 1);
  EXPECT_TRUE(
      MustAdd(agg, Sample("r", 1, 0, 2, 1.0, 1), kT0 + absl::Hours(1)).late);
}

TEST(StepAggregator, IdleTimeoutFinishesOnlyIdleRuns) {
  StepAggregator agg({.max_runs = 8, .idle_timeout = absl::Seconds(10)});
  MustAdd(agg, Sample("old", 1, 0, 0, 1.0, 1), kT0);
  MustAdd(agg, Sample("new", 1, 0, 0, 1.0, 1), kT0 + absl::Seconds(8));
  const std::vector<FinishedStep> idle =
      agg.FinishIdle(kT0 + absl::Seconds(12));
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0].run, "old");
}

TEST(StepAggregator, EvictsTheRunIdleLongest) {
  StepAggregator agg({.max_runs = 2, .idle_timeout = absl::Minutes(5)});
  MustAdd(agg, Sample("a", 1, 0, 0, 1.0, 1), kT0);
  MustAdd(agg, Sample("b", 4, 0, 0, 8.0, 2), kT0 + absl::Seconds(1));
  MustAdd(agg, Sample("a", 1, 0, 1, 1.0, 1), kT0 + absl::Seconds(2));
  // A third run: b's last sample is the oldest.
  const AddResult r =
      MustAdd(agg, Sample("c", 1, 0, 0, 1.0, 1), kT0 + absl::Seconds(3));
  ASSERT_EQ(r.evicted_runs.size(), 1u);
  EXPECT_EQ(r.evicted_runs[0], "b");
  // Its open step is finished first, so it is published before removal.
  ASSERT_EQ(r.finished.size(), 1u);
  EXPECT_EQ(r.finished[0].run, "b");
  EXPECT_EQ(r.finished[0].step, 4);
  EXPECT_EQ(r.finished[0].reason, FinishReason::kEvicted);
  EXPECT_DOUBLE_EQ(r.finished[0].loss, 4.0);
  EXPECT_EQ(agg.num_runs(), 2);
  // The evicted run's published step is still known as finished (another
  // rank's FinishStep says so); a later one had no samples.
  ExpectFinishFails(agg, "b", 4, absl::StatusCode::kAlreadyExists,
                    "already finished");
  ExpectFinishFails(agg, "b", 5, absl::StatusCode::kNotFound,
                    "no samples received");
  // An evicted run that comes back remembers the step it published: a
  // late sample of it is late, not a second point at step 4, and does not
  // take the run back, which would evict a live run for a sample that
  // publishes nothing.
  const AddResult late =
      MustAdd(agg, Sample("b", 4, 0, 0, 2.0, 1), kT0 + absl::Seconds(4));
  EXPECT_TRUE(late.late);
  EXPECT_TRUE(late.of_evicted_run);
  EXPECT_TRUE(late.evicted_runs.empty());
  EXPECT_TRUE(late.finished.empty());
  EXPECT_EQ(agg.num_runs(), 2);
  EXPECT_EQ(MustFinish(agg, "a", 1).loss, 1.0);  // still tracked, step whole
  // It stays remembered: a second late sample is late again.
  EXPECT_TRUE(MustAdd(agg, Sample("b", 3, 0, 0, 2.0, 1), kT0 + absl::Seconds(5))
                  .of_evicted_run);
  // A new step takes it back as usual, evicting the run idle longest (a,
  // whose step is finished).
  const AddResult next =
      MustAdd(agg, Sample("b", 5, 0, 0, 2.0, 1), kT0 + absl::Seconds(6));
  EXPECT_FALSE(next.late);
  EXPECT_FALSE(next.of_evicted_run);
  ASSERT_EQ(next.evicted_runs.size(), 1u);
  EXPECT_EQ(next.evicted_runs[0], "a");
  EXPECT_DOUBLE_EQ(MustFinish(agg, "b", 5).loss, 2.0);
}

// What an evicted run remembers is bounded: past kEvictedRunsKeptPerRun *
// max_runs evictions the oldest is forgotten, and that run starts afresh.
TEST(StepAggregator, EvictedRunsRememberedAreBounded) {
  StepAggregator agg({.max_runs = 1, .idle_timeout = absl::Minutes(5)});
  const int kept = StepAggregator::kEvictedRunsKeptPerRun;
  absl::Time now = kT0;
  for (int i = 0; i <= kept + 1; ++i) {
    now += absl::Seconds(1);
    MustAdd(agg, Sample("run" + std::to_string(i), 7, 0, 0, 1.0, 1), now);
  }
  // run0 .. run{kept} were evicted, run0 longest ago: forgotten.
  now += absl::Seconds(1);
  EXPECT_FALSE(MustAdd(agg, Sample("run0", 7, 0, 0, 1.0, 1), now).late);
  // run0's return evicted run17, which pushed out run1; run2 is still
  // remembered.
  now += absl::Seconds(1);
  EXPECT_TRUE(MustAdd(agg, Sample("run2", 7, 0, 0, 1.0, 1), now).late);
}

// The bound counts runs, not evictions: two runs that evict each other many
// times over (each eviction remembered anew) do not push out a third run
// evicted once, whose late sample must stay late (a helper's finding: it
// was forgotten after 16 evictions, taken back by a late sample, which
// evicted a live run, and its step published twice).
TEST(StepAggregator, RunsEvictingEachOtherDoNotPushOutARunEvictedOnce) {
  StepAggregator agg({.max_runs = 1, .idle_timeout = absl::Minutes(5)});
  absl::Time now = kT0;
  MustAdd(agg, Sample("x", 1, 0, 0, 3.0, 1), now);
  MustFinish(agg, "x", 1);
  for (int i = 1; i <= 10 * StepAggregator::kEvictedRunsKeptPerRun; ++i) {
    now += absl::Seconds(1);
    MustAdd(agg, Sample(i % 2 == 0 ? "y" : "z", i, 0, 0, 1.0, 1), now);
  }
  const AddResult late = MustAdd(agg, Sample("x", 1, 0, 0, 1.0, 1), now);
  EXPECT_TRUE(late.of_evicted_run);
  EXPECT_TRUE(late.evicted_runs.empty());
  // x's published values are still those another rank's FinishStep gets.
  const std::optional<PublishedValues> values = agg.LastPublished("x", 1);
  ASSERT_TRUE(values.has_value());
  EXPECT_DOUBLE_EQ(values->loss, 3.0);
  EXPECT_EQ(values->samples, 1);
  EXPECT_FALSE(agg.LastPublished("x", 0).has_value());
}

TEST(StepAggregator, EvictsARunWithoutAnOpenStep) {
  StepAggregator agg({.max_runs = 1, .idle_timeout = absl::Minutes(5)});
  MustAdd(agg, Sample("a", 1, 0, 0, 1.0, 1), kT0);
  MustFinish(agg, "a", 1);
  const AddResult r =
      MustAdd(agg, Sample("b", 1, 0, 0, 1.0, 1), kT0 + absl::Seconds(1));
  EXPECT_TRUE(r.finished.empty());
  ASSERT_EQ(r.evicted_runs.size(), 1u);
  EXPECT_EQ(r.evicted_runs[0], "a");
}

TEST(StepAggregator, FinishAllClosesEveryOpenStep) {
  StepAggregator agg;
  MustAdd(agg, Sample("b", 2, 0, 0, 1.0, 1));
  MustAdd(agg, Sample("a", 7, 0, 0, 1.0, 1));
  MustAdd(agg, Sample("c", 1, 0, 0, 1.0, 1));
  MustFinish(agg, "c", 1);
  const std::vector<FinishedStep> all = agg.FinishAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].run, "a");
  EXPECT_EQ(all[1].run, "b");
  EXPECT_EQ(all[0].reason, FinishReason::kShutdown);
  EXPECT_TRUE(agg.FinishAll().empty());
}

TEST(StepAggregator, RejectsMalformedSamplesNamingTheField) {
  StepAggregator agg;
  absl::StatusOr<AddResult> no_run = agg.Add(Sample("", 1, 0, 0, 1, 1), kT0);
  ASSERT_EQ(no_run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(no_run.status().message().rfind("tags.run:", 0), 0u)
      << no_run.status();
  absl::StatusOr<AddResult> negative =
      agg.Add(Sample("r", 1, 0, 0, 1, -1), kT0);
  ASSERT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.status().message().rfind("rows:", 0), 0u)
      << negative.status();
  StepSample bad_diag = Sample("r", 1, 0, 0, 1, 1);
  bad_diag.diagnostics = SampleDiagnostics{};
  bad_diag.diagnostics->rows_counted = -2;
  absl::StatusOr<AddResult> diag = agg.Add(bad_diag, kT0);
  ASSERT_EQ(diag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(diag.status().message().rfind("diagnostics.rows_counted:", 0), 0u)
      << diag.status();
  EXPECT_EQ(agg.num_runs(), 0);  // nothing changed
}

TEST(StepAggregator, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kNewerStep), "newer_step");
  EXPECT_EQ(FinishReasonName(FinishReason::kFinishStep), "finish_step");
  EXPECT_EQ(FinishReasonName(FinishReason::kIdle), "idle");
  EXPECT_EQ(FinishReasonName(FinishReason::kEvicted), "evicted");
  EXPECT_EQ(FinishReasonName(FinishReason::kShutdown), "shutdown");
}

TEST(StepAggregator, ConcurrentAddsAllCount) {
  StepAggregator agg;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&agg, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Two layers; every sample has KL 1 per row.
        ASSERT_TRUE(agg.Add(Sample("r", 1, i % 2, t, 3.0, 3), kT0).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const FinishedStep s = MustFinish(agg, "r", 1);
  EXPECT_EQ(s.samples, kThreads * kPerThread);
  EXPECT_EQ(s.rows, 3 * kThreads * kPerThread);
  EXPECT_EQ(s.microbatches, kThreads);
  EXPECT_DOUBLE_EQ(s.loss, 1.0);
}

}  // namespace
}  // namespace klserve::server
