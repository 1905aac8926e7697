#ifndef KLSERVE_TESTS_METRICS_METRICS_WITHOUT_PORT_H_
#define KLSERVE_TESTS_METRICS_METRICS_WITHOUT_PORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"

namespace klserve::server {

// Metrics that serve no port: the tests read Scrape(). Null (and a test
// failure) when they cannot be made.
inline std::unique_ptr<Metrics> MetricsWithoutPort() {
  MetricsOptions options;
  options.listen_address = "";
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(options);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? *std::move(metrics) : nullptr;
}

}  // namespace klserve::server

#endif  // KLSERVE_TESTS_METRICS_METRICS_WITHOUT_PORT_H_
