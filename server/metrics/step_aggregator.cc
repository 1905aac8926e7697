#include "server/metrics/step_aggregator.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace klserve::server {
namespace {

// A row-weighted mean with the spec's convention for N = 0.
double Ratio(double sum, int64_t rows) {
  return rows > 0 ? sum / static_cast<double>(rows) : 0.0;
}

void SortByRunAndStep(std::vector<FinishedStep>& steps) {
  std::sort(steps.begin(), steps.end(),
            [](const FinishedStep& a, const FinishedStep& b) {
              return std::tie(a.run, a.step) < std::tie(b.run, b.step);
            });
}

}  // namespace

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNewerStep:
      return "newer_step";
    case FinishReason::kFinishStep:
      return "finish_step";
    case FinishReason::kIdle:
      return "idle";
    case FinishReason::kEvicted:
      return "evicted";
    case FinishReason::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

StepAggregator::StepAggregator(StepAggregatorOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<AddResult> StepAggregator::Add(const StepSample& sample,
                                              absl::Time now) {
  if (sample.run.empty()) {
    return absl::InvalidArgumentError(
        "tags.run: must be non-empty for a step sample, got \"\"");
  }
  if (sample.rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows: must be >= 0, got ", sample.rows));
  }
  if (sample.diagnostics.has_value() && sample.diagnostics->rows_counted < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("diagnostics.rows_counted: must be >= 0, got ",
                     sample.diagnostics->rows_counted));
  }

  AddResult result;
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(sample.run);
  if (it == runs_.end()) {
    // A run that comes back after its eviction keeps its last finished step
    // (taken before this arrival evicts another run, which may push it out).
    std::optional<int64_t> last_finished_step;
    PublishedValues last_values;
    if (auto kept = evicted_.find(sample.run); kept != evicted_.end()) {
      if (sample.step <= kept->second.last_finished_step) {
        result.late = true;
        result.of_evicted_run = true;
        return result;
      }
      last_finished_step = kept->second.last_finished_step;
      last_values = kept->second.last_values;
      evicted_.erase(kept);  // its entry in evicted_order_ is stale now
    }
    if (static_cast<int>(runs_.size()) >= std::max(options_.max_runs, 1)) {
      EvictOne(result);
    }
    it = runs_.emplace(sample.run, RunState{}).first;
    it->second.last_finished_step = last_finished_step;
    it->second.last_values = last_values;
  }
  RunState& state = it->second;
  state.last_activity = now;

  if (state.open.has_value()) {
    if (sample.step < state.open->step) {
      result.late = true;
      return result;
    }
    if (sample.step > state.open->step) {
      result.finished.push_back(
          Close(sample.run, state, FinishReason::kNewerStep));
    }
  } else if (state.last_finished_step.has_value() &&
             sample.step <= *state.last_finished_step) {
    result.late = true;
    return result;
  }
  if (!state.open.has_value()) {
    // Not emplace(): clang 14 finds no constructor for it, as it does not
    // see a nested class's default member initializers there.
    state.open = OpenStep();
    state.open->step = sample.step;
    state.open->scaling_factor = sample.scaling_factor;
    state.open->first_sample_time = now;
  }
  Merge(sample, now, *state.open);
  return result;
}

void StepAggregator::Merge(const StepSample& sample, absl::Time now,
                           OpenStep& open) {
  LayerSums& layer = open.layers[sample.layer];
  layer.kl_sum.Add(sample.kl_sum);
  layer.scaled_kl_sum.Add(sample.scaling_factor * sample.kl_sum);
  layer.rows += sample.rows;
  ++layer.samples;
  open.microbatches.insert(sample.microbatch);
  // Exact comparison on purpose: clients send the same configured constant.
  if (sample.scaling_factor != open.scaling_factor) {
    open.mixed_scaling_factors = true;
  }
  ++open.samples;
  open.rows += sample.rows;
  if (sample.diagnostics.has_value()) {
    const SampleDiagnostics& d = *sample.diagnostics;
    open.has_diagnostics = true;
    open.entropy_p_sum.Add(d.entropy_p_sum);
    open.entropy_q_sum.Add(d.entropy_q_sum);
    open.diagnostics_rows += d.rows_counted;
    if (d.recall_sum.has_value()) {
      open.has_recall = true;
      open.recall_sum.Add(*d.recall_sum);
      open.recall_rows += d.rows_counted;
    }
  }
  open.last_sample_time = now;
}

FinishedStep StepAggregator::Close(const std::string& run, RunState& state,
                                   FinishReason reason) {
  const OpenStep& open = *state.open;
  FinishedStep out;
  out.run = run;
  out.step = open.step;
  out.reason = reason;
  out.samples = open.samples;
  out.rows = open.rows;
  out.microbatches = static_cast<int64_t>(open.microbatches.size());
  out.first_sample_time = open.first_sample_time;
  out.last_sample_time = open.last_sample_time;
  if (!open.mixed_scaling_factors) out.scaling_factor = open.scaling_factor;

  double unscaled_total = 0.0;
  double scaled_total = 0.0;
  out.layers.reserve(open.layers.size());
  for (const auto& [layer, sums] : open.layers) {
    LayerLoss l;
    l.layer = layer;
    l.unscaled_loss = Ratio(sums.kl_sum.Value(), sums.rows);
    // With one c for the step, c * mean is exact; the sum of c_i * kl_i is
    // only needed when the samples disagree.
    l.loss = out.scaling_factor.has_value()
                 ? *out.scaling_factor * l.unscaled_loss
                 : Ratio(sums.scaled_kl_sum.Value(), sums.rows);
    l.rows = sums.rows;
    l.samples = sums.samples;
    unscaled_total += l.unscaled_loss;
    scaled_total += l.loss;
    out.layers.push_back(l);
  }
  // A step exists only once a sample was merged, so there is a layer.
  const double num_layers = static_cast<double>(out.layers.size());
  out.unscaled_loss = unscaled_total / num_layers;
  out.loss = out.scaling_factor.has_value()
                 ? *out.scaling_factor * out.unscaled_loss
                 : scaled_total / num_layers;

  if (open.has_diagnostics) {
    out.mean_entropy_p =
        Ratio(open.entropy_p_sum.Value(), open.diagnostics_rows);
    out.mean_entropy_q =
        Ratio(open.entropy_q_sum.Value(), open.diagnostics_rows);
  }
  if (open.has_recall) {
    out.topk_recall = Ratio(open.recall_sum.Value(), open.recall_rows);
  }

  state.last_finished_step = open.step;
  state.last_values = {.loss = out.loss,
                       .unscaled_loss = out.unscaled_loss,
                       .samples = out.samples};
  state.open.reset();
  return out;
}

void StepAggregator::EvictOne(AddResult& result) {
  // A linear scan: it runs only when a new run arrives with the table full,
  // over at most max_runs entries.
  auto victim = runs_.end();
  for (auto it = runs_.begin(); it != runs_.end(); ++it) {
    if (victim == runs_.end() ||
        it->second.last_activity < victim->second.last_activity) {
      victim = it;
    }
  }
  if (victim == runs_.end()) return;
  if (victim->second.open.has_value()) {
    result.finished.push_back(
        Close(victim->first, victim->second, FinishReason::kEvicted));
  }
  result.evicted_runs.push_back(victim->first);
  if (victim->second.last_finished_step.has_value()) {
    const int64_t order = ++evictions_;
    evicted_[victim->first] = {*victim->second.last_finished_step,
                               victim->second.last_values, order};
    evicted_order_.emplace_back(victim->first, order);
    // The bound counts runs, not evictions: runs that evict each other in
    // turn must not push out a run evicted once (whose late samples would
    // then publish its steps again).
    const size_t kept = static_cast<size_t>(kEvictedRunsKeptPerRun) *
                        static_cast<size_t>(std::max(options_.max_runs, 1));
    const auto live = [&](const std::pair<std::string, int64_t>& entry) {
      auto run = evicted_.find(entry.first);
      return run != evicted_.end() && run->second.order == entry.second;
    };
    while (evicted_.size() > kept) {
      if (live(evicted_order_.front())) {
        evicted_.erase(evicted_order_.front().first);
      }
      evicted_order_.pop_front();
    }
    // Stale entries (of runs taken back or evicted again since) go once
    // they are as many as the runs kept: a pass over 2 * kept entries at
    // most every kept evictions.
    if (evicted_order_.size() > 2 * kept) {
      std::erase_if(evicted_order_,
                    [&](const auto& entry) { return !live(entry); });
    }
  }
  runs_.erase(victim);
}

absl::StatusOr<FinishedStep> StepAggregator::Finish(absl::string_view run,
                                                    int64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end()) {
    if (auto kept = evicted_.find(run);
        kept != evicted_.end() && step <= kept->second.last_finished_step) {
      return absl::AlreadyExistsError(absl::StrCat(
          "step ", step, " of run \"", run,
          "\": already finished: the run has passed it, and published its "
          "value if it had samples (the run was evicted since, as the least "
          "recently active; its last finished step is ",
          kept->second.last_finished_step, ")"));
    }
    return absl::NotFoundError(
        absl::StrCat("run \"", run,
                     "\": no samples received (never tagged in a request, or "
                     "evicted as the least recently active run)"));
  }
  const std::string& name = it->first;
  RunState& state = it->second;
  if (state.open.has_value() && step == state.open->step) {
    return Close(name, state, FinishReason::kFinishStep);
  }
  // A tracked run has an open step or a finished one.
  const std::string where =
      state.open.has_value()
          ? absl::StrCat("the run's open step is ", state.open->step)
          : absl::StrCat("the run's last finished step is ",
                         *state.last_finished_step);
  const bool finished = state.open.has_value()
                            ? step < state.open->step
                            : state.last_finished_step.has_value() &&
                                  step <= *state.last_finished_step;
  const std::string message = absl::StrCat(
      "step ", step, " of run \"", name, "\": ",
      finished ? "already finished: the run has passed it, and published "
                 "its value if it had samples"
               : "no samples",
      " (", where, ")");
  return finished ? absl::AlreadyExistsError(message)
                  : absl::NotFoundError(message);
}

std::optional<PublishedValues> StepAggregator::LastPublished(
    absl::string_view run, int64_t step) const {
  absl::MutexLock lock(&mu_);
  if (auto it = runs_.find(run); it != runs_.end()) {
    if (it->second.last_finished_step != step) return std::nullopt;
    return it->second.last_values;
  }
  // A run evicted since (every rank of its job may finish the step).
  if (auto kept = evicted_.find(run);
      kept != evicted_.end() && kept->second.last_finished_step == step) {
    return kept->second.last_values;
  }
  return std::nullopt;
}

std::vector<FinishedStep> StepAggregator::FinishIdle(absl::Time now) {
  std::vector<FinishedStep> finished;
  absl::MutexLock lock(&mu_);
  for (auto& [run, state] : runs_) {
    if (state.open.has_value() &&
        now - state.open->last_sample_time >= options_.idle_timeout) {
      finished.push_back(Close(run, state, FinishReason::kIdle));
    }
  }
  SortByRunAndStep(finished);
  return finished;
}

std::vector<FinishedStep> StepAggregator::FinishAll() {
  std::vector<FinishedStep> finished;
  absl::MutexLock lock(&mu_);
  for (auto& [run, state] : runs_) {
    if (state.open.has_value()) {
      finished.push_back(Close(run, state, FinishReason::kShutdown));
    }
  }
  SortByRunAndStep(finished);
  return finished;
}

int StepAggregator::num_runs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(runs_.size());
}

}  // namespace klserve::server
