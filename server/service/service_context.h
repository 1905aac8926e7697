#ifndef KLSERVE_SERVER_SERVICE_SERVICE_CONTEXT_H_
#define KLSERVE_SERVER_SERVICE_SERVICE_CONTEXT_H_

#include "server/metrics/loss_reporter.h"
#include "server/metrics/metrics.h"
#include "server/service/admission.h"
#include "server/service/backend_selection.h"
#include "server/service/call_watchdog.h"
#include "server/service/compute_executor.h"
#include "server/service/server_options.h"
#include "server/service/unsent_answers.h"
#include "server/shm/region_registry.h"

namespace klserve::server {

// What every RPC handler shares; all of it outlives the gRPC server.
struct ServiceContext {
  const ServingBackends* backends;
  ComputeExecutor* executor;
  Admission* requests;  // unary ComputeLoss calls computing or queued
  Admission* streams;   // ComputeLossStream and Echo calls open
  CallWatchdog* watchdog;
  UnsentAnswers* unsent_answers;  // unary answers not yet taken
  Metrics* metrics;
  LossReporter* reporter;
  const ServerOptions* options;
  RegionRegistry* regions;  // null unless --shared_memory
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_SERVICE_CONTEXT_H_
