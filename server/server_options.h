#ifndef KLSERVE_SERVER_SERVER_OPTIONS_H_
#define KLSERVE_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace klserve::server {

// Everything the server is configured with. main.cc fills it from flags;
// tests build one directly.
struct ServerOptions {
  // Address to serve gRPC on; port 0 picks a free one (see KlServer::port).
  std::string listen = "0.0.0.0:50051";
  // "auto" (CUDA when usable, else CPU), "cpu" or "cuda".
  std::string backend = "auto";
  // CPU backend threads; 0 = one per core.
  int threads = 0;
  // Largest message received or sent. A problem larger than this goes
  // through ComputeLossStream. gRPC caps messages below 2 GiB.
  int64_t max_message_bytes = int64_t{256} << 20;
  // Requests (unary or streams) in flight at once; more get
  // RESOURCE_EXHAUSTED. Also the number of compute threads.
  int max_concurrent_requests = 8;
  // Largest single tensor a request may carry or ask for (a stream's blocks
  // count one at a time).
  int64_t max_tensor_bytes = int64_t{1} << 30;
  // How long SIGTERM waits for requests in flight before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Prometheus /metrics address (9464: clear of Prometheus's 9090 and the
  // Pushgateway's 9091); empty serves none.
  std::string metrics_listen = "0.0.0.0:9464";
  // Where each run's TensorBoard event file goes; empty writes none.
  std::string tensorboard_dir;
  // Runs whose per-step series are kept; the run idle longest goes first.
  int max_runs = 64;
  // A step with no request for this long is finished and published.
  absl::Duration step_idle_timeout = absl::Minutes(5);
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVER_OPTIONS_H_
