// The Prometheus metrics: the values in the exposition text, the removal of a
// run's series, the HTTP endpoint on a real socket, and Debian's promtool
// linting a populated exposition.

#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/service/server_options.h"

namespace klserve::server {
namespace {

using Labels = std::map<std::string, std::string>;

// The value of the sample `name{labels}` in a text exposition, with exactly
// these labels; nullopt when there is none.
std::optional<double> ValueOf(const std::string& text, absl::string_view name,
                              const Labels& labels = {}) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos || line.substr(0, name_end) != name)
      continue;
    Labels got;
    absl::string_view rest = line.substr(name_end);
    if (absl::ConsumePrefix(&rest, "{")) {
      const size_t close = rest.find("} ");
      if (close == absl::string_view::npos) continue;
      // Label values in these tests hold no ',', '"' or '='.
      for (absl::string_view pair :
           absl::StrSplit(rest.substr(0, close), ',', absl::SkipEmpty())) {
        std::vector<std::string> kv = absl::StrSplit(pair, '=');
        if (kv.size() != 2 || kv[1].size() < 2) continue;
        got[kv[0]] = kv[1].substr(1, kv[1].size() - 2);
      }
      rest.remove_prefix(close + 1);
    }
    if (got != labels) continue;
    rest = absl::StripAsciiWhitespace(rest);
    if (rest == "NaN") return std::nan("");
    if (rest == "+Inf") return INFINITY;
    double v;
    if (absl::SimpleAtod(rest, &v)) return v;
  }
  return std::nullopt;
}

std::unique_ptr<Metrics> MakeMetrics(std::string listen = "") {
  MetricsOptions options;
  options.listen_address = std::move(listen);
  options.version = "0.1.0";
  options.backend = "cpu";
  options.device = "test-cpu";
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Create(options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// A step of run `run` with layers 0 and 1 (unscaled 0.5 and 1.5, c = 0.01).
FinishedStep TwoLayerStep(const std::string& run, int64_t step) {
  FinishedStep s;
  s.run = run;
  s.step = step;
  s.scaling_factor = 0.01;
  s.layers = {{.layer = 0, .loss = 0.005, .unscaled_loss = 0.5},
              {.layer = 1, .loss = 0.015, .unscaled_loss = 1.5}};
  s.unscaled_loss = 1.0;
  s.loss = 0.01;
  return s;
}

TEST(Metrics, BuildInfoIsOneWithItsLabels) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(
      ValueOf(
          m->Scrape(), "klserve_build_info",
          {{"version", "0.1.0"}, {"backend", "cpu"}, {"device", "test-cpu"}}),
      1.0);
}

TEST(Metrics, RecordsRequests) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->RecordRequest("ComputeLoss", "OK", 0.004, 1000, 200, 4096);
  m->RecordRequest("ComputeLoss", "OK", 0.2, 3000, 400, 1024);
  m->RecordRequest("ComputeLoss", "INVALID_ARGUMENT", 0.0001, 50, 0, 0);
  m->RecordRequest("ComputeLoss", "RESOURCE_EXHAUSTED", 0.00001, 0, 0, 0);
  m->RecordRequest("GetServerInfo", "OK", 0.0002, 0, 30, 0);
  const std::string text = m->Scrape();
  EXPECT_EQ(ValueOf(text, "klserve_requests_total",
                    {{"method", "ComputeLoss"}, {"code", "OK"}}),
            2.0);
  EXPECT_EQ(ValueOf(text, "klserve_requests_total",
                    {{"method", "ComputeLoss"}, {"code", "INVALID_ARGUMENT"}}),
            1.0);
  // The refusal before any work is counted, but is not in the latency; the
  // failure after work (INVALID_ARGUMENT) is.
  EXPECT_EQ(
      ValueOf(text, "klserve_requests_total",
              {{"method", "ComputeLoss"}, {"code", "RESOURCE_EXHAUSTED"}}),
      1.0);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_count",
                    {{"method", "ComputeLoss"}}),
            3.0);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_request_duration_seconds_sum",
                            {{"method", "ComputeLoss"}}),
                   0.2041);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_bucket",
                    {{"method", "ComputeLoss"}, {"le", "0.001"}}),
            1.0);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_bucket",
                    {{"method", "ComputeLoss"}, {"le", "0.005"}}),
            2.0);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_bucket",
                    {{"method", "ComputeLoss"}, {"le", "0.25"}}),
            3.0);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_bucket",
                    {{"method", "ComputeLoss"}, {"le", "1800"}}),
            3.0);
  EXPECT_EQ(ValueOf(text, "klserve_received_bytes_total",
                    {{"method", "ComputeLoss"}}),
            4050.0);
  EXPECT_EQ(
      ValueOf(text, "klserve_sent_bytes_total", {{"method", "ComputeLoss"}}),
      600.0);
  EXPECT_EQ(
      ValueOf(text, "klserve_sent_bytes_total", {{"method", "GetServerInfo"}}),
      30.0);
  EXPECT_EQ(ValueOf(text, "klserve_rows_computed_total"), 5120.0);
}

TEST(Metrics, RequestDurationBucketsSpanHalfAMillisecondToTheLongestCall) {
  const std::vector<double>& b = RequestDurationBuckets();
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.front(), 0.0005);
  // The longest a call may take by default: a stream's --max_stream_duration
  // (a unary call's --max_compute_duration is shorter).
  const ServerOptions defaults;
  EXPECT_GE(b.back(), absl::ToDoubleSeconds(defaults.max_stream_duration));
  EXPECT_GE(b.back(), absl::ToDoubleSeconds(defaults.max_compute_duration));
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  const std::vector<double>& l = LossBuckets();
  EXPECT_LE(l.front(), 1e-4);
  EXPECT_GE(l.back(), 10.0);
  for (size_t i = 1; i < l.size(); ++i) EXPECT_LT(l[i - 1], l[i]);
}

TEST(Metrics, RegisterMethodCreatesZeroSeries) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->RegisterMethod("ComputeLossStream");
  m->RegisterLimit("max_open_streams");
  const std::string text = m->Scrape();
  // Every code, failures included: a first burst of errors then shows in
  // increase() rather than in the series' first sample.
  for (const char* code :
       {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
        "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED", "UNAUTHENTICATED"}) {
    EXPECT_EQ(ValueOf(text, "klserve_requests_total",
                      {{"method", "ComputeLossStream"}, {"code", code}}),
              0.0)
        << code;
  }
  EXPECT_EQ(ValueOf(text, "klserve_refused_at_limit_total",
                    {{"limit", "max_open_streams"}}),
            0.0);
  EXPECT_EQ(ValueOf(text, "klserve_request_duration_seconds_count",
                    {{"method", "ComputeLossStream"}}),
            0.0);
}

TEST(Metrics, CountsRequestsInFlight) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->InFlight(+1);
  m->InFlight(+1);
  m->InFlight(-1);
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_requests_in_flight"), 1.0);
}

TEST(Metrics, PublishesAStepPerLayerAndForAllLayers) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  FinishedStep s = TwoLayerStep("run-a", 41);
  s.mean_entropy_p = 3.5;
  s.mean_entropy_q = 4.25;
  s.topk_recall = 0.875;
  m->PublishStep(s);
  const std::string text = m->Scrape();
  EXPECT_EQ(ValueOf(text, "klserve_indexer_last_step", {{"run", "run-a"}}),
            41.0);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss",
                            {{"run", "run-a"}, {"layer", "all"}}),
                   0.01);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss_unscaled",
                            {{"run", "run-a"}, {"layer", "all"}}),
                   1.0);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss",
                            {{"run", "run-a"}, {"layer", "0"}}),
                   0.005);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss_unscaled",
                            {{"run", "run-a"}, {"layer", "1"}}),
                   1.5);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_steps_total",
                    {{"run", "run-a"}, {"layer", "all"}}),
            1.0);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_loss_distribution_count",
                    {{"run", "run-a"}}),
            1.0);
  // 0.01 falls in the bucket le="0.01" (upper bounds are inclusive).
  EXPECT_EQ(ValueOf(text, "klserve_indexer_loss_distribution_bucket",
                    {{"run", "run-a"}, {"le", "0.005"}}),
            0.0);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_loss_distribution_bucket",
                    {{"run", "run-a"}, {"le", "0.01"}}),
            1.0);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_entropy_p", {{"run", "run-a"}}),
            3.5);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_entropy_q", {{"run", "run-a"}}),
            4.25);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_topk_recall", {{"run", "run-a"}}),
            0.875);
}

// The microbatch tags a step's samples carried, as the aggregator counted
// them: a job that sends 4 per step sees 4, and a step finished early (by
// the idle timeout, say) with some missing shows fewer.
TEST(Metrics, PublishesTheMicrobatchesOfTheLastStep) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  FinishedStep full = TwoLayerStep("mb", 1);
  full.microbatches = 4;
  m->PublishStep(full);
  EXPECT_EQ(
      ValueOf(m->Scrape(), "klserve_indexer_microbatches", {{"run", "mb"}}),
      4.0);
  FinishedStep short_step = TwoLayerStep("mb", 2);
  short_step.microbatches = 3;
  m->PublishStep(short_step);
  EXPECT_EQ(
      ValueOf(m->Scrape(), "klserve_indexer_microbatches", {{"run", "mb"}}),
      3.0);
}

TEST(Metrics, SumsAndCountsAccumulateOverSteps) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->PublishStep(TwoLayerStep("r", 1));
  FinishedStep second = TwoLayerStep("r", 2);
  second.loss = 0.03;
  second.layers[0].loss = 0.025;
  m->PublishStep(second);
  const std::string text = m->Scrape();
  // The gauges hold the last step; the counters the sum over steps.
  EXPECT_DOUBLE_EQ(
      *ValueOf(text, "klserve_indexer_loss", {{"run", "r"}, {"layer", "all"}}),
      0.03);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_last_step", {{"run", "r"}}), 2.0);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss_sum_total",
                            {{"run", "r"}, {"layer", "all"}}),
                   0.04);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss_sum_total",
                            {{"run", "r"}, {"layer", "0"}}),
                   0.03);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_steps_total",
                    {{"run", "r"}, {"layer", "0"}}),
            2.0);
  EXPECT_DOUBLE_EQ(
      *ValueOf(text, "klserve_indexer_loss_distribution_sum", {{"run", "r"}}),
      0.04);
}

// A negative loss (a negative scaling factor) goes to a counter of its own:
// one counter cannot go down, and had dropped it while its step counted.
TEST(Metrics, NegativeLossesSumInACounterOfTheirOwn) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  int64_t step = 0;
  for (const double loss : {-0.5, 0.25, -0.125}) {
    FinishedStep s;
    s.run = "r";
    s.step = ++step;
    s.loss = loss;
    s.unscaled_loss = std::fabs(loss);
    s.layers = {{.layer = 0, .loss = loss, .unscaled_loss = std::fabs(loss)}};
    m->PublishStep(s);
  }
  const std::string text = m->Scrape();
  for (const char* layer : {"all", "0"}) {
    const Labels labels = {{"run", "r"}, {"layer", layer}};
    EXPECT_EQ(ValueOf(text, "klserve_indexer_loss_sum_total", labels), 0.25);
    EXPECT_EQ(ValueOf(text, "klserve_indexer_loss_negative_sum_total", labels),
              0.625);
    EXPECT_EQ(ValueOf(text, "klserve_indexer_steps_total", labels), 3.0);
  }
}

TEST(Metrics, UntaggedLayerIsNone) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  FinishedStep s;
  s.run = "r";
  s.step = 3;
  s.loss = 2.0;
  s.unscaled_loss = 2.0;
  s.layers = {{.layer = std::nullopt, .loss = 2.0, .unscaled_loss = 2.0}};
  m->PublishStep(s);
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_indexer_loss",
                    {{"run", "r"}, {"layer", "none"}}),
            2.0);
}

TEST(Metrics, NonFiniteLossSetsTheGaugeButNotTheSums) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->PublishStep(TwoLayerStep("r", 1));
  FinishedStep bad = TwoLayerStep("r", 2);
  bad.loss = std::nan("");
  bad.unscaled_loss = std::nan("");
  bad.layers[1].loss = std::nan("");
  bad.layers[1].unscaled_loss = std::nan("");
  m->PublishStep(bad);
  const std::string text = m->Scrape();
  EXPECT_TRUE(std::isnan(*ValueOf(text, "klserve_indexer_loss",
                                  {{"run", "r"}, {"layer", "all"}})));
  EXPECT_EQ(
      ValueOf(text, "klserve_indexer_nonfinite_steps_total", {{"run", "r"}}),
      1.0);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_steps_total",
                    {{"run", "r"}, {"layer", "all"}}),
            1.0);
  EXPECT_DOUBLE_EQ(*ValueOf(text, "klserve_indexer_loss_sum_total",
                            {{"run", "r"}, {"layer", "all"}}),
                   0.01);
  // Layer 0 stayed finite and counts.
  EXPECT_EQ(ValueOf(text, "klserve_indexer_steps_total",
                    {{"run", "r"}, {"layer", "0"}}),
            2.0);
  EXPECT_EQ(
      ValueOf(text, "klserve_indexer_loss_distribution_count", {{"run", "r"}}),
      1.0);
}

TEST(Metrics, SanitizesTheRunLabel) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->PublishStep(TwoLayerStep("bad\nrun\xc3\xa9", 1));
  m->CountLateSample("bad\nrun\xc3\xa9");
  const std::string text = m->Scrape();
  EXPECT_EQ(ValueOf(text, "klserve_indexer_last_step", {{"run", "bad_run_"}}),
            1.0);
  EXPECT_EQ(ValueOf(text, "klserve_late_samples_total", {{"run", "bad_run_"}}),
            1.0);
}

TEST(Metrics, RemoveRunRemovesEverySeriesOfTheRunOnly) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  FinishedStep gone = TwoLayerStep("gone", 7);
  gone.mean_entropy_p = 1;
  gone.mean_entropy_q = 2;
  gone.topk_recall = 0.5;
  m->PublishStep(gone);
  FinishedStep nan_step = TwoLayerStep("gone", 8);
  nan_step.loss = std::nan("");
  m->PublishStep(nan_step);
  m->CountLateSample("gone");
  m->PublishStep(TwoLayerStep("kept", 3));
  ASSERT_NE(m->Scrape().find("run=\"gone\""), std::string::npos);

  m->RemoveRun("gone");
  const std::string text = m->Scrape();
  EXPECT_EQ(text.find("run=\"gone\""), std::string::npos) << text;
  EXPECT_EQ(ValueOf(text, "klserve_indexer_last_step", {{"run", "kept"}}), 3.0);
  EXPECT_EQ(ValueOf(text, "klserve_indexer_runs_removed_total"), 1.0);
  // Removing again, or an unknown run, is a no-op.
  m->RemoveRun("gone");
  m->RemoveRun("never");
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_indexer_runs_removed_total"), 1.0);
  // A run that comes back starts from zero.
  m->PublishStep(TwoLayerStep("gone", 9));
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_indexer_steps_total",
                    {{"run", "gone"}, {"layer", "all"}}),
            1.0);
}

TEST(Metrics, CountsTensorBoardErrorsAndLateSamples) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->CountTensorBoardError();
  m->CountTensorBoardError();
  m->CountLateSample("r");
  m->CountLateSampleOfEvictedRun();
  const std::string text = m->Scrape();
  EXPECT_EQ(ValueOf(text, "klserve_tensorboard_write_errors_total"), 2.0);
  EXPECT_EQ(ValueOf(text, "klserve_late_samples_total", {{"run", "r"}}), 1.0);
  EXPECT_EQ(ValueOf(text, "klserve_late_samples_of_evicted_runs_total"), 1.0);
  // A late sample before the run's first step makes no step gauges (they
  // read 0 as if step 0 had been published); the step makes them, and a
  // run removed before its first step goes whole.
  EXPECT_EQ(text.find("klserve_indexer_last_step{run=\"r\"}"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("klserve_indexer_microbatches{run=\"r\"}"),
            std::string::npos)
      << text;
  m->PublishStep(TwoLayerStep("r", 5));
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_indexer_last_step", {{"run", "r"}}),
            5.0);
  m->CountLateSample("early");
  m->RemoveRun("early");
  EXPECT_EQ(m->Scrape().find("run=\"early\""), std::string::npos);
}

TEST(Metrics, EmptyListenAddressServesNothing) {
  auto m = MakeMetrics("");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->port(), 0);
  EXPECT_NE(m->Scrape().find("klserve_build_info"), std::string::npos);
}

TEST(Metrics, ConcurrentPublishRemoveRecordAndScrape) {
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 300; ++i) {
        const std::string run = absl::StrCat("run-", i % 4);
        m->PublishStep(TwoLayerStep(run, i));
        m->RecordRequest("ComputeLoss", "OK", 0.001, 10, 10, 1);
        if ((i + t) % 7 == 0) m->RemoveRun(run);
        if (i % 50 == 0) m->CountLateSample(run);
      }
    });
  }
  threads.emplace_back([&m] {
    for (int i = 0; i < 100; ++i) {
      EXPECT_NE(m->Scrape().find("klserve_build_info"), std::string::npos);
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ValueOf(m->Scrape(), "klserve_requests_total",
                    {{"method", "ComputeLoss"}, {"code", "OK"}}),
            900.0);
}

// GET `path` from 127.0.0.1:`port`; the whole response, or "" on failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = absl::StrCat(
        "GET ", path,
        " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (send(fd, request.data(), request.size(), 0) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
    }
  }
  close(fd);
  return response;
}

TEST(Metrics, ServesTheExpositionOverHttp) {
  // Port 0: the kernel picks a free port, and port() reports it.
  auto m = MakeMetrics("127.0.0.1:0");
  ASSERT_NE(m, nullptr);
  ASSERT_GT(m->port(), 0);
  m->RecordRequest("ComputeLoss", "OK", 0.01, 10, 10, 3);
  m->PublishStep(TwoLayerStep("http-run", 5));
  const std::string response = HttpGet(m->port(), "/metrics");
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  const size_t body = response.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_NE(response.find("text/plain"), std::string::npos);
  // Chunked or not, the series lines are whole within the body.
  EXPECT_NE(response.find("klserve_rows_computed_total 3", body),
            std::string::npos)
      << response;
  EXPECT_NE(
      response.find("klserve_indexer_last_step{run=\"http-run\"} 5", body),
      std::string::npos)
      << response;
}

TEST(Metrics, ListeningOnABusyPortIsUnavailable) {
  auto first = MakeMetrics("127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  ASSERT_GT(first->port(), 0);
  MetricsOptions options;
  options.listen_address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<Metrics>> second = Metrics::Create(options);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message().rfind("--metrics_listen:", 0), 0u)
      << second.status();
}

// promtool from $PROMTOOL, the path CMake found, or PATH; "" when none.
std::string FindPromtool() {
  if (const char* env = std::getenv("PROMTOOL"); env != nullptr && *env) {
    return env;
  }
#ifdef KLSERVE_PROMTOOL
  if (access(KLSERVE_PROMTOOL, X_OK) == 0) return KLSERVE_PROMTOOL;
#endif
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    return "promtool";
  }
  return "";
}

TEST(Metrics, PopulatedExpositionPassesPromtoolCheckMetrics) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package `prometheus`, or set "
                    "PROMTOOL=/path/to/promtool); exposition not linted";
  }
  auto m = MakeMetrics();
  ASSERT_NE(m, nullptr);
  m->RegisterMethod("ComputeLoss");
  m->RecordRequest("ComputeLoss", "OK", 0.01, 100, 10, 64);
  m->RecordRequest("ComputeLoss", "RESOURCE_EXHAUSTED", 0.001, 100, 0, 0);
  m->InFlight(+1);
  FinishedStep s = TwoLayerStep("lint-run", 12);
  s.mean_entropy_p = 3;
  s.mean_entropy_q = 3.5;
  s.topk_recall = 0.9;
  m->PublishStep(s);
  FinishedStep nan_step = TwoLayerStep("lint-run", 13);
  nan_step.loss = std::nan("");
  m->PublishStep(nan_step);
  m->CountLateSample("lint-run");
  m->CountTensorBoardError();

  const std::string dir = testing::TempDir();
  const std::string exposition = dir + "/klserve_metrics.prom";
  const std::string report = dir + "/klserve_promtool.txt";
  {
    std::ofstream out(exposition);
    out << m->Scrape();
  }
  const std::string command = absl::StrCat(
      promtool, " check metrics < '", exposition, "' > '", report, "' 2>&1");
  const int rc = std::system(command.c_str());
  std::ifstream in(report);
  const std::string output((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output;
  EXPECT_EQ(output, "") << output;
}

}  // namespace
}  // namespace klserve::server
