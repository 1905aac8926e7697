#include "server/service/kl_server.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "auth/credential_file.h"
#include "auth/token_file.h"
#include "flags/byte_count.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "kernels/cpu/return_memory.h"
#include "kernels/status_macros.h"
#include "server/service/backend_selection.h"
#include "server/service/listen_addresses.h"
#include "server/service/method_names.h"
#include "server/service/version.h"
#include "server/shm/fault_guard.h"
#include "server/tensorboard/tensorboard_writer.h"

namespace klserve::server {
namespace {

// The transport: plaintext, TLS, or mutual TLS. `with_token`: credentials
// that take the token check.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TransportCredentials(
    const ServerOptions& options, bool with_token) {
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
    // gRPC 1.51's plaintext credentials take no AuthMetadataProcessor (it
    // aborts); the xDS credentials do, and with no xDS configuration they
    // serve their fallback, plaintext here. They are the only way to check
    // a token on a call's headers before its message is read.
    return with_token
               ? grpc::XdsServerCredentials(grpc::InsecureServerCredentials())
               : grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain,
                   ReadPemFile("--tls_cert", options.tls_cert_file,
                               PemContent::kCertificates));
  ASSIGN_OR_RETURN(
      pair.private_key,
      ReadPemFile("--tls_key", options.tls_key_file, PemContent::kPrivateKey));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPemFile("--tls_client_ca", options.tls_client_ca_file,
                                 PemContent::kCertificates));
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// Every option's own rule; the cross-checks (TLS files) come with their use.
absl::Status ValidateOptions(const ServerOptions& options) {
  const auto at_least = [](absl::string_view flag, int64_t value,
                           int64_t least) -> absl::Status {
    if (value >= least) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be >= ", least, ", got ", value));
  };
  const auto positive = [](absl::string_view flag,
                           absl::Duration value) -> absl::Status {
    if (value > absl::ZeroDuration() && value < absl::InfiniteDuration()) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be a positive, finite duration, got ",
                     absl::FormatDuration(value)));
  };
  // Both are threads made at start: the system refuses a few thousand
  // (std::thread then aborted the process), and no host has the cores.
  constexpr int kMaxThreads = 1024;
  const auto in_range = [](absl::string_view flag, int64_t value, int64_t low,
                           int64_t high) -> absl::Status {
    if (value >= low && value <= high) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": must be in [", low, ", ", high, "], got ", value));
  };
  // Byte counts as their flags take and print them (256MiB).
  const auto bytes = [](int64_t count) {
    return AbslUnparseFlag(flags::ByteCount{count});
  };
  const auto bytes_at_least = [&bytes](absl::string_view flag, int64_t value,
                                       int64_t least) -> absl::Status {
    if (value >= least) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be at least ", bytes(least), ", got ",
                     bytes(value)));
  };
  RETURN_IF_ERROR(in_range("threads", options.threads, 0, kMaxThreads));
  RETURN_IF_ERROR(in_range("max_concurrent_requests",
                           options.max_concurrent_requests, 1, kMaxThreads));
  RETURN_IF_ERROR(at_least("max_open_streams", options.max_open_streams, 1));
  // One poller and one stream.
  RETURN_IF_ERROR(
      at_least("max_reflection_threads", options.max_reflection_threads, 2));
  RETURN_IF_ERROR(at_least("max_streams_per_connection",
                           options.max_streams_per_connection, 1));
  // gRPC counts message sizes in int. Below 1KiB is a size meant in KiB or
  // MiB given without its unit: such a server would look healthy and refuse
  // nearly every answer.
  if (options.max_message_bytes < 1024 ||
      options.max_message_bytes >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: must be at least 1KiB and below "
                     "2GiB (gRPC counts in int), got ",
                     bytes(options.max_message_bytes)));
  }
  RETURN_IF_ERROR(
      bytes_at_least("max_tensor_bytes", options.max_tensor_bytes, 1));
  RETURN_IF_ERROR(
      bytes_at_least("max_stream_key_bytes", options.max_stream_key_bytes, 1));
  RETURN_IF_ERROR(bytes_at_least("max_thread_scratch_bytes",
                                 options.max_thread_scratch_bytes, 1));
  // Below a few MiB gRPC could not hold one connection's buffers.
  RETURN_IF_ERROR(bytes_at_least("transport_memory_bytes",
                                 options.transport_memory_bytes,
                                 int64_t{16} << 20));
  RETURN_IF_ERROR(at_least("max_runs", options.max_runs, 1));
  RETURN_IF_ERROR(
      at_least("max_layers_per_run", options.max_layers_per_run, 1));
  RETURN_IF_ERROR(at_least("max_microbatches_per_step",
                           options.max_microbatches_per_step, 1));
  RETURN_IF_ERROR(
      at_least("max_tensorboard_runs", options.max_tensorboard_runs, 1));
  RETURN_IF_ERROR(bytes_at_least("max_tensorboard_bytes",
                                 options.max_tensorboard_bytes, 1));
  RETURN_IF_ERROR(at_least("max_tensorboard_queued_steps",
                           options.max_tensorboard_queued_steps, 1));
  if (options.max_regions < 1 || options.max_regions > kMaxGuardedMappings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_regions: must be in [1, ", kMaxGuardedMappings,
                     "], got ", options.max_regions));
  }
  RETURN_IF_ERROR(
      bytes_at_least("max_region_bytes", options.max_region_bytes, 1));
  if (!options.metrics_listen.empty()) {
    RETURN_IF_ERROR(CheckHostPort("metrics_listen", options.metrics_listen));
    RETURN_IF_ERROR(Metrics::CheckListenAddress(options.metrics_listen));
  }
  RETURN_IF_ERROR(positive("region_lease", options.region_lease));
  RETURN_IF_ERROR(positive("stream_idle_timeout", options.stream_idle_timeout));
  RETURN_IF_ERROR(positive("max_stream_duration", options.max_stream_duration));
  RETURN_IF_ERROR(
      positive("max_compute_duration", options.max_compute_duration));
  RETURN_IF_ERROR(positive("max_connection_age", options.max_connection_age));
  // Infinite: a step is published by FinishStep or the next step only.
  if (options.step_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step_idle_timeout: must be a positive duration (inf: only "
        "FinishStep or the run's next step publishes a step), got ",
        absl::FormatDuration(options.step_idle_timeout)));
  }
  if (const absl::Duration drain = options.drain_timeout;
      drain < absl::ZeroDuration() || drain == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drain_timeout: must be a finite duration, 0 or more (0 cancels "
        "what is in flight at once), got ",
        absl::FormatDuration(drain)));
  }
  // It samples the calls once a period and releases every idle one: a
  // period of microseconds would spin.
  if (const absl::Duration idle = options.release_memory_after_idle;
      idle != absl::ZeroDuration() &&
      (idle < absl::Milliseconds(100) || idle == absl::InfiniteDuration())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--release_memory_after_idle: must be a finite duration of at least "
        "100ms, or 0 (never), got ",
        absl::FormatDuration(idle)));
  }
  if (options.health_needs_token && options.auth_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--health_needs_token: needs --auth_token_file (there is no token "
        "for health to need)");
  }
  // gRPC takes the connection age and its grace in int milliseconds.
  constexpr absl::Duration kGrpcMaxMillis = absl::Milliseconds(INT32_MAX);
  if (options.max_connection_age > kGrpcMaxMillis ||
      options.max_stream_duration > kGrpcMaxMillis) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connection_age, --max_stream_duration: at most ",
                     absl::FormatDuration(kGrpcMaxMillis)));
  }
  return absl::OkStatus();
}

// How often the watchdog looks: a small part of the shortest timeout, so a
// call ends within an eighth of its timeout of when it should.
absl::Duration WatchdogPeriod(const ServerOptions& options) {
  return std::clamp(
      std::min(options.stream_idle_timeout, options.max_stream_duration) / 8,
      absl::Milliseconds(10), absl::Seconds(1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KlServer>> KlServer::Start(
    const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(const std::vector<ListenAddress> addresses,
                   ParseListenAddresses(options.listen));
  std::unique_ptr<KlServer> s(new KlServer(options));
  ASSIGN_OR_RETURN(s->backends_, SelectBackends(options.backend,
                                                options.threads, options.isa));
  // The files the flags name are read before any port is bound: a start
  // refused for a missing key or token then says so even when a port is
  // taken too, and holds no port while it fails.
  std::optional<std::string> token;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(options.auth_token_file));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   TransportCredentials(options, token.has_value()));
  MetricsOptions metrics;
  metrics.listen_address = options.metrics_listen;
  metrics.version = std::string(kVersion);
  metrics.backend = std::string(s->backends_->primary().name());
  metrics.device = s->backends_->primary().device();
  absl::StatusOr<std::unique_ptr<Metrics>> created = Metrics::Create(metrics);
  if (!created.ok()) {
    // civetweb says why in its own terms ("null context when constructing
    // CivetServer").
    const std::string why = WhyCannotBind(options.metrics_listen);
    if (why.empty()) return created.status();
    return absl::UnavailableError(absl::StrCat(
        "--metrics_listen: cannot serve metrics on \"", options.metrics_listen,
        "\": ", why,
        "; give another HOST:PORT, or --metrics_listen= to serve none"));
  }
  s->metrics_ = *std::move(created);
  for (absl::string_view method : kIndexerKlMethods) {
    s->metrics_->RegisterMethod(method);
  }
  if (token.has_value()) {
    // The check counts its refusals in the metrics, so it comes after them.
    s->auth_ = std::make_shared<TokenAuth>(
        *std::move(token), options.health_needs_token, s->metrics_.get());
    credentials->SetAuthMetadataProcessor(s->auth_);
  }
  // Made once the flags, the metrics address and the credentials have
  // passed, so that a start refused for one of them leaves no directory.
  if (!options.tensorboard_dir.empty()) {
    if (absl::Status dir =
            TensorBoardWriter::PrepareLogDirectory(options.tensorboard_dir);
        !dir.ok()) {
      // The flag names the subject in place of the writer's own prefix.
      return absl::Status(
          dir.code(),
          absl::StrCat("--tensorboard_dir: ",
                       absl::StripPrefix(dir.message(), "tensorboard: ")));
    }
  }
  LossReporterOptions reporting;
  reporting.steps.max_runs = options.max_runs;
  reporting.steps.idle_timeout = options.step_idle_timeout;
  reporting.max_layers_per_run = options.max_layers_per_run;
  reporting.max_microbatches_per_step = options.max_microbatches_per_step;
  reporting.tensorboard.dir = options.tensorboard_dir;
  reporting.tensorboard.max_runs = options.max_tensorboard_runs;
  reporting.tensorboard.max_bytes = options.max_tensorboard_bytes;
  reporting.tensorboard.max_queued = options.max_tensorboard_queued_steps;
  s->reporter_ =
      std::make_unique<LossReporter>(s->metrics_.get(), std::move(reporting));
  s->requests_ = std::make_unique<Admission>(
      options.max_concurrent_requests, "requests in flight",
      "max_concurrent_requests", s->metrics_.get());
  s->streams_ =
      std::make_unique<Admission>(options.max_open_streams, "streams open",
                                  "max_open_streams", s->metrics_.get());
  s->executor_ =
      std::make_unique<ComputeExecutor>(options.max_concurrent_requests);
  s->watchdog_ = std::make_unique<CallWatchdog>(WatchdogPeriod(options));
  s->unsent_answers_ = std::make_unique<UnsentAnswers>(
      int64_t{options.max_concurrent_requests} * options.max_message_bytes,
      s->metrics_.get());
  if (options.shared_memory) {
    s->regions_ = std::make_unique<RegionRegistry>(
        RegionLimits{.max_regions = options.max_regions,
                     .max_bytes = options.max_region_bytes,
                     .lease = options.region_lease},
        [metrics = s->metrics_.get()](int regions, int64_t bytes) {
          metrics->SharedMemoryRegions(regions, bytes);
        });
  }
  s->service_ = std::make_unique<LossService>(ServiceContext{
      s->backends_.get(), s->executor_.get(), s->requests_.get(),
      s->streams_.get(), s->watchdog_.get(), s->unsent_answers_.get(),
      s->metrics_.get(), s->reporter_.get(), &s->options_, s->regions_.get()});

  grpc::EnableDefaultHealthCheckService(true);
  // With a token set, reflection needs it like every method but health
  // (and health too with --health_needs_token).
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second klserve on the same
  // --listen would start and take half the calls. Off, it cannot bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_streams_per_connection);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_age)));
  // A call still open when its connection is closed was open for at least
  // this long after the GOAWAY: a stream within --max_stream_duration has
  // had the time it was promised.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.max_stream_duration)));
  // gRPC 1.51 inflates a compressed message whole before it holds it to
  // --max_message_bytes, outside the memory quota: 3 MB of gzip held 3.7 GB,
  // and through health even without the token. With identity alone, a call
  // that announces another encoding ends at its headers (UNIMPLEMENTED);
  // tensors of floats barely compress anyway.
  for (const grpc_compression_algorithm algorithm :
       {GRPC_COMPRESS_DEFLATE, GRPC_COMPRESS_GZIP}) {
    builder.SetCompressionAlgorithmSupportStatus(algorithm, false);
  }
  grpc::ResourceQuota quota("klserve");
  quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
  quota.SetMaxThreads(options.max_reflection_threads);
  builder.SetResourceQuota(quota);
  // gRPC writes each address's port here when it binds (1 for a socket).
  std::vector<int> bound(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i].is_unix()) {
      RETURN_IF_ERROR(ClaimSocketPath(addresses[i].socket_path));
      builder.AddListeningPort("unix:" + BindingPath(addresses[i].socket_path),
                               credentials, &bound[i]);
    } else {
      builder.AddListeningPort(addresses[i].address, credentials, &bound[i]);
    }
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->service_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      s->open_calls_.CountingFactory(std::string(kIndexerKlPrefix)));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Sockets are born owner-only (socket_file.h); nothing else creates files
  // while the server starts.
  const mode_t umask_before = umask(0077);
  s->server_ = builder.BuildAndStart();
  umask(umask_before);
  // gRPC says which address failed, and why, only in its log when it builds
  // no server at all; a port bound to 0 names itself. A TCP address that
  // cannot bind says why; where each binds, gRPC refused something else,
  // with TLS most likely the certificate or key.
  const auto cannot_serve = [&](absl::Span<const ListenAddress> failed) {
    std::vector<std::string> all;
    for (const ListenAddress& address : failed) {
      const std::string why =
          address.is_unix() ? "" : WhyCannotBind(address.address);
      all.push_back(why.empty()
                        ? address.address
                        : absl::StrCat(address.address, " (", why, ")"));
    }
    std::string hint;
    if (failed.size() > 1) hint = " (one of them: gRPC's log above says which)";
    if (!options.tls_cert_file.empty()) {
      absl::StrAppend(&hint,
                      "; with TLS, check --tls_cert and --tls_key (gRPC's log "
                      "above says what it refused)");
    }
    return absl::UnavailableError(absl::StrCat("--listen: cannot serve on ",
                                               absl::StrJoin(all, ", "), hint));
  };
  if (s->server_ == nullptr) return cannot_serve(addresses);
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (bound[i] == 0) return cannot_serve({addresses[i]});
  }
  if (options.release_memory_after_idle != absl::ZeroDuration()) {
    s->idle_release_ = std::make_unique<IdleMemoryRelease>(
        options.release_memory_after_idle,
        [calls = &s->open_calls_] { return calls->Current(); },
        [] { cpu::ReturnFreedMemory(std::numeric_limits<int64_t>::max()); });
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    const ListenAddress& address = addresses[i];
    if (address.is_unix()) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<SocketFile> file,
          SocketFile::Publish(address.socket_path, options.unix_socket_mode));
      s->socket_files_.push_back(std::move(file));
    } else {
      s->tcp_ports_.push_back(bound[i]);
    }
  }
  // The service by its name too, as a health check of one service asks
  // (else NOT_FOUND); SetServingStatus(false) at the drain covers both.
  s->server_->GetHealthCheckService()->SetServingStatus(
      std::string(v1::IndexerKl::service_full_name()), true);
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  const std::string metrics_at =
      s->metrics_->port() == 0
          ? std::string("metrics off")
          : absl::StrCat("metrics on port ", s->metrics_->port(), " (",
                         options.metrics_listen, ")");
  const std::string tensorboard_at =
      options.tensorboard_dir.empty()
          ? std::string("no TensorBoard files")
          : absl::StrCat("TensorBoard files in ", options.tensorboard_dir);
  const std::string security = absl::StrCat(
      options.tls_cert_file.empty()
          ? "plaintext"
          : (options.tls_client_ca_file.empty() ? "TLS" : "mutual TLS"),
      s->auth_ != nullptr ? ", token required" : "");
  // "port 50051 (127.0.0.1:50051, plaintext)" for TCP, the form scripts
  // read; "unix:/run/klserve.sock (plaintext)" for a socket.
  std::vector<std::string> serving;
  for (size_t i = 0; i < addresses.size(); ++i) {
    serving.push_back(
        addresses[i].is_unix()
            ? absl::StrCat(addresses[i].address, " (", security, ")")
            : absl::StrCat("port ", bound[i], " (", addresses[i].address, ", ",
                           security, ")"));
  }
  std::fprintf(stderr, "klserve: serving on %s, backend %s (%s), %s, %s\n",
               absl::StrJoin(serving, " and ").c_str(),
               std::string(s->backends_->primary().name()).c_str(),
               s->backends_->primary().device().c_str(), metrics_at.c_str(),
               tensorboard_at.c_str());
  return s;
}

KlServer::~KlServer() {
  if (server_ != nullptr) server_->Shutdown();
}

void KlServer::Drain() {
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  server_->GetHealthCheckService()->SetServingStatus(false);
  requests_->StartDraining();
  streams_->StartDraining();
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
  // The event files get what is left of the drain, at least a moment: a
  // disk that stalls must not hold the exit for ever.
  constexpr absl::Duration kEventFilesAtLeast = absl::Seconds(1);
  reporter_->Shutdown(std::max(deadline, absl::Now() + kEventFilesAtLeast));
}

void KlServer::Wait() { server_->Wait(); }

}  // namespace klserve::server
