#ifndef KLSERVE_SERVER_SERVICE_CONTEXT_H_
#define KLSERVE_SERVER_SERVICE_CONTEXT_H_

#include "kernels/backend.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/compute_executor.h"
#include "server/loss_reporter.h"
#include "server/metrics.h"
#include "server/server_options.h"

namespace klserve::server {

// What every RPC handler shares; all of it outlives the gRPC server.
struct ServiceContext {
  Backend* backend;
  ComputeExecutor* executor;
  Admission* admission;
  Metrics* metrics;
  LossReporter* reporter;
  const ServerOptions* options;
  // Checks each IndexerKl call's bearer token; null when no token is set.
  const TokenAuth* auth = nullptr;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_CONTEXT_H_
