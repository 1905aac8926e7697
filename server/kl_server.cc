#include "server/kl_server.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "kernels/status_macros.h"
#include "server/backend_selection.h"
#include "server/version.h"

namespace klserve::server {
namespace {

absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  if (in) buffer << in.rdbuf();
  if (!in || buffer.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read \"", path, "\" (or empty)"));
  }
  return buffer.str();
}

// The gRPC port's credentials: plaintext, TLS, or mutual TLS.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const ServerOptions& options) {
  const bool cert = !options.tls_cert_file.empty();
  const bool key = !options.tls_key_file.empty();
  if (cert != key) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: set both (TLS) or neither (plaintext)");
  }
  if (!cert) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca: needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain,
                   ReadPemFile("tls_cert", options.tls_cert_file));
  ASSIGN_OR_RETURN(pair.private_key,
                   ReadPemFile("tls_key", options.tls_key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile("tls_client_ca", options.tls_client_ca_file));
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KlServer>> KlServer::Start(
    const ServerOptions& options) {
  if (options.max_concurrent_requests < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_concurrent_requests: must be >= 1, got ",
                     options.max_concurrent_requests));
  }
  // gRPC counts message sizes in int.
  constexpr int64_t kGrpcMaxMessage = (int64_t{1} << 31) - 1;
  if (options.max_message_bytes < 1 ||
      options.max_message_bytes > kGrpcMaxMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: must be in [1, ", kGrpcMaxMessage,
                     "], got ", options.max_message_bytes));
  }
  if (options.max_tensor_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_tensor_bytes: must be >= 1, got ", options.max_tensor_bytes));
  }
  if (options.max_runs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_runs: must be >= 1, got ", options.max_runs));
  }
  if (options.max_layers_per_run < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_layers_per_run: must be >= 1, got ",
                     options.max_layers_per_run));
  }
  if (options.max_tensorboard_runs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tensorboard_runs: must be >= 1, got ",
                     options.max_tensorboard_runs));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   ListenCredentials(options));
  std::unique_ptr<KlServer> s(new KlServer(options));
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::string token, ReadTokenFile(options.auth_token_file));
    s->auth_ = std::make_unique<TokenAuth>(std::move(token));
  }
  ASSIGN_OR_RETURN(s->backend_, SelectBackend(options.backend, options.threads,
                                              options.isa));
  MetricsOptions metrics;
  metrics.listen_address = options.metrics_listen;
  metrics.version = std::string(kVersion);
  metrics.backend = std::string(s->backend_->name());
  metrics.device = s->backend_->device();
  ASSIGN_OR_RETURN(s->metrics_, Metrics::Create(metrics));
  for (const char* method : {"ComputeLoss", "ComputeLossStream",
                             "GetServerInfo", "FinishStep", "Echo"}) {
    s->metrics_->RegisterMethod(method);
  }
  LossReporterOptions reporting;
  reporting.steps.max_runs = options.max_runs;
  reporting.steps.idle_timeout = options.step_idle_timeout;
  reporting.max_layers_per_run = options.max_layers_per_run;
  reporting.tensorboard_dir = options.tensorboard_dir;
  reporting.max_tensorboard_runs = options.max_tensorboard_runs;
  s->reporter_ =
      std::make_unique<LossReporter>(s->metrics_.get(), std::move(reporting));
  s->admission_ = std::make_unique<Admission>(options.max_concurrent_requests,
                                              s->metrics_.get());
  s->executor_ =
      std::make_unique<ComputeExecutor>(options.max_concurrent_requests);
  s->service_ = std::make_unique<LossService>(ServiceContext{
      s->backend_.get(), s->executor_.get(), s->admission_.get(),
      s->metrics_.get(), s->reporter_.get(), &s->options_, s->auth_.get()});

  grpc::EnableDefaultHealthCheckService(true);
  // Reflection would describe the API to anyone: not with a token set. (The
  // plugin is process-wide once added; klserve runs one server.)
  if (s->auth_ == nullptr) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  }
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second klserve on the same
  // --listen would start and take half the calls. Off, it cannot bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->service_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      s->open_calls_.CountingFactory("/klserve.v1.IndexerKl/"));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot serve on ", options.listen));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  std::fprintf(
      stderr,
      "klserve: serving on port %d (%s%s), backend %s (%s), metrics "
      "on port %d\n",
      s->port_,
      options.tls_cert_file.empty()
          ? "plaintext"
          : (options.tls_client_ca_file.empty() ? "TLS" : "mutual TLS"),
      s->auth_ != nullptr ? ", token required" : "",
      std::string(s->backend_->name()).c_str(), s->backend_->device().c_str(),
      s->metrics_->port());
  return s;
}

KlServer::~KlServer() {
  if (server_ != nullptr) server_->Shutdown();
}

void KlServer::Drain() {
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  server_->GetHealthCheckService()->SetServingStatus(false);
  admission_->StartDraining();
  // Admitted calls are open calls: this waits for the work in flight, then
  // for the answers and refusals still on their way out.
  if (!open_calls_.WaitNone(deadline)) {
    std::fprintf(stderr,
                 "klserve: requests still in flight after the drain timeout; "
                 "cancelling them\n");
  }
  // Stops taking calls. One that slipped in after the count reached zero
  // gets a moment to be refused; then whatever is left (a health Watch, work
  // past the drain deadline) is cancelled.
  constexpr absl::Duration kLastRefusals = absl::Milliseconds(500);
  server_->Shutdown(
      absl::ToChronoTime(std::min(deadline, absl::Now() + kLastRefusals)));
  reporter_->Shutdown();
}

void KlServer::Wait() { server_->Wait(); }

}  // namespace klserve::server
