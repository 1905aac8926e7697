#ifndef KLSERVE_SERVER_SERVICE_KL_SERVER_H_
#define KLSERVE_SERVER_SERVICE_KL_SERVER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend.h"
#include "server/metrics/loss_reporter.h"
#include "server/metrics/metrics.h"
#include "server/service/admission.h"
#include "server/service/auth.h"
#include "server/service/backend_selection.h"
#include "server/service/call_watchdog.h"
#include "server/service/compute_executor.h"
#include "server/service/idle_memory_release.h"
#include "server/service/loss_service.h"
#include "server/service/open_calls.h"
#include "server/service/server_options.h"
#include "server/service/socket_file.h"
#include "server/service/unsent_answers.h"

namespace klserve::server {

// The running service: backend, compute threads, the gRPC server with the
// IndexerKl service, grpc.health.v1 and reflection. docs/security.md has the
// resource model its options bound.
class KlServer {
 public:
  // Picks the backend, binds every address of `options.listen` and starts
  // serving. Errors: INVALID_ARGUMENT for a bad option, UNAVAILABLE when an
  // address cannot be bound or another server serves on its socket,
  // FAILED_PRECONDITION when a socket path holds something else.
  static absl::StatusOr<std::unique_ptr<KlServer>> Start(
      const ServerOptions& options);
  ~KlServer();

  // The first TCP address's port; 0 when serving on sockets only.
  int port() const { return tcp_ports_.empty() ? 0 : tcp_ports_.front(); }
  // Every TCP port it listens on (not its Unix sockets).
  const std::vector<int>& tcp_ports() const { return tcp_ports_; }
  // The /metrics port, 0 when not serving metrics.
  int metrics_port() const { return metrics_->port(); }
  const Backend& backend() const { return backends_->primary(); }

  // Health turns NOT_SERVING, new requests get UNAVAILABLE, requests in
  // flight finish and their answers go out (up to options.drain_timeout,
  // then they are cancelled), the server stops, and the open steps are
  // published and the TensorBoard files closed. Safe to call from any
  // thread, once.
  void Drain();
  // Blocks until the server has stopped.
  void Wait();
  // After Wait: removes the Unix socket files, as the destructor would, for
  // a process that ends without destroying the server (klserve_main.cc).
  void RemoveSocketFiles() { socket_files_.clear(); }

 private:
  explicit KlServer(const ServerOptions& options) : options_(options) {}

  const ServerOptions options_;
  // Destroyed in reverse: the executor finishes its last tasks while the
  // admission and the backend they use still exist.
  std::unique_ptr<ServingBackends> backends_;
  std::unique_ptr<Metrics> metrics_;
  // Shared with the credentials; null when no token is required.
  std::shared_ptr<TokenAuth> auth_;
  std::unique_ptr<LossReporter> reporter_;
  std::unique_ptr<Admission> requests_;
  std::unique_ptr<Admission> streams_;
  std::unique_ptr<ComputeExecutor> executor_;
  std::unique_ptr<CallWatchdog> watchdog_;
  std::unique_ptr<UnsentAnswers> unsent_answers_;
  std::unique_ptr<RegionRegistry> regions_;  // null unless shared_memory
  std::unique_ptr<LossService> service_;
  OpenCalls open_calls_;  // fed by the server's interceptor
  std::unique_ptr<IdleMemoryRelease> idle_release_;  // reads open_calls_
  // Removed after the server has stopped (destroyed after server_).
  std::vector<std::unique_ptr<SocketFile>> socket_files_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<int> tcp_ports_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_KL_SERVER_H_
