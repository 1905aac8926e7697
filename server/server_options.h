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
  // The CPU kernels' ISA variant: "auto" (the best this CPU runs), "avx512",
  // "avx2" or "baseline" (kernels/cpu/isa.h); all give the same bits.
  std::string isa = "auto";
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
  // tags.layer must be in [0, max_layers_per_run); bounds each run's
  // per-layer series (LossReporterOptions).
  int max_layers_per_run = 256;
  // Runs given a TensorBoard directory over the process's lifetime; later
  // new runs get Prometheus series only (LossReporterOptions).
  int max_tensorboard_runs = 1024;
  // A step with no request for this long is finished and published.
  absl::Duration step_idle_timeout = absl::Minutes(5);

  // Transport security (docs/security.md). With both tls_cert_file and
  // tls_key_file set, the gRPC port speaks TLS only (plaintext clients are
  // refused); with neither, plaintext only. Setting one without the other
  // is an error. PEM files, read once at start.
  std::string tls_cert_file;  // server certificate chain
  std::string tls_key_file;   // its private key
  // PEM CA bundle: when set (TLS only), clients must present a certificate
  // signed by one of these CAs (mutual TLS); without one the handshake fails.
  std::string tls_client_ca_file;
  // A file holding a bearer token (trailing newlines stripped; empty is an
  // error). When set, every IndexerKl RPC must carry the metadata
  // "authorization: Bearer <token>" or gets UNAUTHENTICATED;
  // grpc.health.v1.Health stays open (Kubernetes probes), and server
  // reflection is not served. Read once at start.
  std::string auth_token_file;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVER_OPTIONS_H_
