#ifndef KLSERVE_SERVER_SERVICE_OPEN_CALLS_H_
#define KLSERVE_SERVER_SERVICE_OPEN_CALLS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"

namespace klserve::server {

// Counts the calls of one service that gRPC holds, from the moment it hands
// one to the service until the call is destroyed (its status sent), refused
// calls included. A drain waits for zero before stopping gRPC: a call gives
// its admission slot back when it finishes, before its answer or refusal
// has gone out, and stopping then would cancel that. Other services' calls
// are not counted: a health Watch never ends on its own.
class OpenCalls {
 public:
  // Waits until no call is open; false if `deadline` passed first.
  bool WaitNone(absl::Time deadline);

  // How many calls are open now, and how many of those that move tensors
  // (MovesTensors) have ended since the start.
  struct Activity {
    int open = 0;
    int64_t tensor_calls_ended = 0;
    bool operator==(const Activity&) const = default;
  };
  Activity Current();

  // An interceptor factory for ServerBuilder that counts the calls whose
  // method starts with `method_prefix` (e.g. "/klserve.v1.IndexerKl/").
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  CountingFactory(std::string method_prefix);

 private:
  class Counter;
  class Factory;

  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tensor_calls_ended_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_OPEN_CALLS_H_
