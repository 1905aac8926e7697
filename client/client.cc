#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "auth/credential_file.h"
#include "client/call_status.h"
#include "client/stream_codec.h"
#include "client/tensor_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/status_macros.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "proto/request_tensors.h"

namespace klserve {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Sets the call's deadline and, when the options carry one, its token.
void PrepareContext(grpc::ClientContext& context, const ClientOptions& options,
                    absl::Time deadline) {
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!options.auth_token.empty()) {
    context.AddMetadata("authorization",
                        absl::StrCat("Bearer ", options.auth_token));
  }
}

// The host[:port] of a target of the DNS form (no scheme, or dns:), as gRPC
// C++ 1.51 reads schemes (case matters); nothing for other schemes.
std::optional<absl::string_view> DnsHostPort(absl::string_view target) {
  absl::string_view host = target;
  if (absl::ConsumePrefix(&host, "dns:")) {
    if (absl::ConsumePrefix(&host, "//")) {
      const size_t slash = host.find('/');
      if (slash == absl::string_view::npos) return std::nullopt;
      host.remove_prefix(slash + 1);
    }
    return host;
  }
  const absl::string_view scheme = host.substr(0, host.find(':'));
  for (absl::string_view other :
       {"unix", "unix-abstract", "ipv4", "ipv6", "vsock", "xds", "google-c2p",
        "passthrough"}) {
    if (scheme == other) return std::nullopt;
  }
  // A URI of another scheme ("google-c2p-experimental:///x"): gRPC's.
  if (absl::StrContains(host, "://")) return std::nullopt;
  return host;
}

// Where `target` names a host without a port ("localhost", "10.0.0.1",
// "[::1]", a bare "::1", an empty port "localhost:", each also after "dns:"
// or "dns://authority/"), the host:port to give instead; otherwise nothing.
// Other schemes' targets (unix:, ipv4:, vsock:, ...) are gRPC's to check.
std::optional<std::string> WithDefaultPort(absl::string_view target) {
  const std::optional<absl::string_view> dns_host = DnsHostPort(target);
  if (!dns_host) return std::nullopt;
  absl::string_view host = *dns_host;
  if (absl::StripAsciiWhitespace(host).empty()) return std::nullopt;
  // An empty port ("localhost:", "[::1]:") is none; an IPv6 address may
  // end in "::" itself.
  if (absl::EndsWith(host, ":") &&
      (absl::EndsWith(host, "]:") ||
       std::count(host.begin(), host.end(), ':') == 1)) {
    host.remove_suffix(1);
    target.remove_suffix(1);
  }
  if (absl::StartsWith(host, "[")) {
    if (absl::StrContains(host, "]:")) return std::nullopt;
    return absl::StrCat(target, ":50051");
  }
  const auto colons = std::count(host.begin(), host.end(), ':');
  if (colons == 1) return std::nullopt;
  // No colon: a name or an IPv4 address. Several: an IPv6 address, whose
  // port needs the brackets.
  if (colons == 0) return absl::StrCat(target, ":50051");
  return absl::StrCat(target.substr(0, target.size() - host.size()), "[", host,
                      "]:50051");
}

// A web URL ("http://host:port") or a port alone ("50051") is no gRPC
// target: gRPC would take it all for a DNS name and retry its resolution
// until the deadline. A host alone ("localhost") gets gRPC's port, 443 for a
// name and 0 for an address, where no plaintext klserve listens; over TLS it
// may well be a proxy's 443.
absl::Status CheckTarget(const ClientOptions& options,
                         const ClientOptionNames& names) {
  const std::string& target = options.target;
  if (target.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.target, ": must not be empty"));
  }
  for (absl::string_view scheme :
       {"http://", "https://", "grpc://", "grpcs://", "tcp://"}) {
    if (absl::StartsWithIgnoreCase(target, scheme)) {
      return absl::InvalidArgumentError(
          absl::StrCat(names.target, ": \"", target,
                       "\" is a URL; gRPC takes host:port, dns:///host:port or "
                       "unix:/path (TLS is set by ",
                       names.tls_ca_file, ", not an https:// scheme)"));
    }
  }
  if (target == "unix:" || target == "unix://") {
    return absl::InvalidArgumentError(
        absl::StrCat(names.target, ": \"", target,
                     "\" has no path; give unix:/path/to/klserve.sock"));
  }
  if (target.find_first_not_of("0123456789") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.target, ": \"", target,
        "\" is a port alone; gRPC takes host:port (localhost:", target,
        "), dns:///host:port or unix:/path"));
  }
  const std::optional<std::string> with_port = WithDefaultPort(target);
  if (with_port && options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.target, ": \"", target,
        "\" has no port, and gRPC would not pick klserve's; give host:port (",
        *with_port, " for klserve's default --listen)"));
  }
  // gRPC takes a port past 65535 modulo 65536, a negative one likewise and
  // a word as 0 (but "http" and "https" after a name, 80 and 443), and
  // connects there.
  if (const std::optional<absl::string_view> host = DnsHostPort(target);
      host && !with_port) {
    const size_t colon = host->rfind(':');
    const absl::string_view port =
        colon == absl::string_view::npos ? "" : host->substr(colon + 1);
    int number = 0;
    const bool a_number =
        std::all_of(port.begin(), port.end(), absl::ascii_isdigit) &&
        absl::SimpleAtoi(port, &number) && number >= 1 && number <= 65535;
    if (!port.empty() && !a_number && port != "http" && port != "https") {
      return absl::InvalidArgumentError(absl::StrCat(
          names.target, ": \"", target, "\" has port \"", port,
          "\"; a port is a number from 1 to 65535 (or http, https)"));
    }
  }
  return absl::OkStatus();
}

// Plaintext, or TLS with the options' roots (and client certificate).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options, const ClientOptionNames& names,
    grpc::ChannelArguments& args) {
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty() ||
        !options.tls_server_name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(names.tls_cert_file, ", ", names.tls_key_file, ", ",
                       names.tls_server_name, ": need ", names.tls_ca_file));
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(names.tls_cert_file, ", ",
                                                   names.tls_key_file,
                                                   ": set both or neither"));
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs,
                   ReadPemFile(names.tls_ca_file, options.tls_ca_file,
                               PemContent::kCertificates));
  if (!options.tls_cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadPemFile(names.tls_cert_file, options.tls_cert_file,
                                 PemContent::kCertificates));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPemFile(names.tls_key_file, options.tls_key_file,
                                 PemContent::kPrivateKey));
  }
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::SslCredentials(ssl);
}

// Runs `attempt` until it returns anything but a retriable UNAVAILABLE or a
// refusal at the server's limit of calls in flight (IsOverloaded), or the
// attempts or the time run out; returns the last result. `attempt`
// takes a bool* it clears when a retry would be unsafe (a stream that has
// already delivered a response message). While the channel is down it
// waits on the channel rather than sleeping: a blocking client's channel
// makes connection progress only while someone polls it, so a plain sleep
// left the reconnect pending until gRPC's 5 s backup poller ran (measured:
// a server up 0.3 s after the first attempt was still not reached after
// 7 s); this way the retry also starts as soon as the connection is up.
template <typename Attempt>
auto WithRetries(const ClientOptions& options, grpc::Channel& channel,
                 absl::Time deadline, Attempt attempt)
    -> decltype(attempt(nullptr)) {
  absl::BitGen jitter;
  absl::Duration backoff = options.initial_backoff;
  const absl::Time start = absl::Now();
  int refusals = 0;  // at the server's limit of calls in flight
  for (int tries = 1;; ++tries) {
    bool may_retry = true;
    auto result = attempt(&may_retry);
    if (result.ok()) return result;
    const bool overloaded = IsOverloaded(result.status());
    if (result.status().code() != absl::StatusCode::kUnavailable &&
        !overloaded) {
      return ExplainMessageLimit(result.status(), options.max_message_bytes);
    }
    refusals += overloaded;
    // The last result, with the count of refusals and what ended the
    // retries (`ran_out`) added to a refusal at the limit.
    const auto last =
        [&](absl::string_view ran_out) -> decltype(attempt(nullptr)) {
      if (!overloaded || refusals < 2) {
        return ExplainUnavailable(result.status(), !options.tls_ca_file.empty(),
                                  !options.tls_cert_file.empty());
      }
      absl::Status status(
          result.status().code(),
          absl::StrCat(
              result.status().message(), " (refused ", refusals, " times in ",
              absl::StrFormat("%.1f s",
                              absl::ToDoubleSeconds(absl::Now() - start)),
              "; ", ran_out, ")"));
      result.status().ForEachPayload(
          [&](absl::string_view url, const absl::Cord& payload) {
            status.SetPayload(url, payload);
          });
      return status;
    };
    if (!may_retry || tries >= options.max_attempts) {
      return last(
          "for longer bursts raise ClientOptions::max_attempts, klctl "
          "--max_attempts");
    }
    // Jitter keeps a crowd of clients that failed together from retrying
    // together.
    const absl::Time until =
        absl::Now() + backoff * absl::Uniform(jitter, 0.5, 1.0);
    if (until >= deadline) return last("the call's deadline came first");
    if (channel.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
      absl::SleepFor(until - absl::Now());  // connected: the server said no
    } else {
      channel.WaitForConnected(absl::ToChronoTime(until));
    }
    backoff = std::min(backoff * 2, options.max_backoff);
  }
}

absl::Status ProtocolError(absl::string_view what) {
  return absl::InternalError(absl::StrCat("server broke the protocol: ", what));
}

}  // namespace

struct Client::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::IndexerKl::Stub> kl;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

Client::Client(ClientOptions options, std::unique_ptr<Stubs> stubs)
    : options_(std::move(options)), stubs_(std::move(stubs)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    ClientOptions options, const ClientOptionNames& names) {
  const auto invalid = [](absl::string_view name, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", rule));
  };
  RETURN_IF_ERROR(CheckTarget(options, names));
  if (options.deadline <= absl::ZeroDuration() ||
      options.deadline == absl::InfiniteDuration()) {
    return invalid(names.deadline,
                   absl::StrCat("must be finite and > 0, got ",
                                absl::FormatDuration(options.deadline)));
  }
  if (options.max_message_bytes < 1 || options.max_message_bytes > INT_MAX) {
    return invalid(names.max_message_bytes,
                   absl::StrCat("must be in [1, ", INT_MAX, "], got ",
                                options.max_message_bytes));
  }
  if (options.max_attempts < 1) {
    return invalid(names.max_attempts,
                   absl::StrCat("must be >= 1, got ", options.max_attempts));
  }
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return invalid(absl::StrCat(names.initial_backoff, ", ", names.max_backoff),
                   absl::StrCat("need 0 < ", names.initial_backoff,
                                " <= ", names.max_backoff));
  }
  if (options.stream_threshold_bytes < 0) {
    return invalid(
        names.stream_threshold_bytes,
        absl::StrCat("must be >= 0, got ", options.stream_threshold_bytes));
  }
  if (options.block_bytes < 1) {
    return invalid(names.block_bytes,
                   absl::StrCat("must be >= 1, got ", options.block_bytes));
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // A private connection per Client: concurrent Clients (klctl bench's
  // workers) would otherwise share one TCP connection and its flow control.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // gRPC's own reconnect backoff (1 s at first, then growing) would keep
  // failing our retries fast for seconds after the server comes up; follow
  // the retry schedule instead. (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left
  // alone: it is the connect timeout, and 50 ms cuts handshakes short.)
  args.SetInt(
      GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff)));

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   ChannelCredentials(options, names, args));
  auto stubs = std::make_unique<Stubs>();
  stubs->channel = grpc::CreateCustomChannel(options.target, credentials, args);
  stubs->kl = v1::IndexerKl::NewStub(stubs->channel);
  stubs->health = grpc::health::v1::Health::NewStub(stubs->channel);
  return std::unique_ptr<Client>(
      new Client(std::move(options), std::move(stubs)));
}

namespace {

// A message past max_message_bytes, refused before it is sent: gRPC would
// refuse it only after serialising it, and one past 2 GiB it cannot
// serialise at all (an assertion in its serializer ends the process). The
// error is the one gRPC gives, for ExplainMessageLimit to explain.
absl::Status CheckMessageSize(const google::protobuf::Message& message,
                              int64_t max_message_bytes) {
  const size_t bytes = message.ByteSizeLong();
  if (bytes <= static_cast<size_t>(max_message_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("Sent message larger than max (", bytes, " vs. ",
                   max_message_bytes, ")"));
}

// One unary IndexerKl call with the options' deadline and retries.
template <typename Request, typename Response>
absl::StatusOr<Response> UnaryCall(
    const ClientOptions& options, grpc::Channel& channel,
    v1::IndexerKl::Stub& stub,
    grpc::Status (v1::IndexerKl::Stub::*method)(grpc::ClientContext*,
                                                const Request&, Response*),
    const Request& request) {
  RETURN_IF_ERROR(
      ExplainMessageLimit(CheckMessageSize(request, options.max_message_bytes),
                          options.max_message_bytes));
  const absl::Time deadline = absl::Now() + options.deadline;
  return WithRetries(
      options, channel, deadline, [&](bool*) -> absl::StatusOr<Response> {
        grpc::ClientContext context;
        PrepareContext(context, options, deadline);
        Response response;
        RETURN_IF_ERROR(StatusFromCall(
            (stub.*method)(&context, request, &response), context));
        return response;
      });
}

}  // namespace

absl::StatusOr<bool> Client::Health(const std::string& service) {
  HealthCheckRequest request;
  request.set_service(service);
  const absl::Time deadline = absl::Now() + options_.deadline;
  return WithRetries(
      options_, *stubs_->channel, deadline, [&](bool*) -> absl::StatusOr<bool> {
        grpc::ClientContext context;
        PrepareContext(context, options_, deadline);
        HealthCheckResponse response;
        RETURN_IF_ERROR(StatusFromCall(
            stubs_->health->Check(&context, request, &response), context));
        return response.status() == HealthCheckResponse::SERVING;
      });
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo() {
  return UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                   &v1::IndexerKl::Stub::GetServerInfo,
                   v1::GetServerInfoRequest());
}

absl::StatusOr<v1::FinishStepResponse> Client::FinishStep(
    const std::string& run, int64_t step) {
  v1::FinishStepRequest request;
  request.set_run(run);
  request.set_step(step);
  return UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                   &v1::IndexerKl::Stub::FinishStep, request);
}

absl::StatusOr<v1::ComputeLossResponse> Client::ComputeLoss(
    const v1::ComputeLossRequest& request) {
  // A request naming a region carries few bytes inline, and the stream
  // cannot carry it at all, nor some of the projections form's.
  if (UsesRegions(request) || !StreamCarries(request) ||
      RequestTensorBytes(request) <= options_.stream_threshold_bytes) {
    return ComputeLossUnary(request);
  }
  return ComputeLossStreaming(request);
}

absl::StatusOr<v1::ComputeLossResponse> Client::ComputeLossUnary(
    const v1::ComputeLossRequest& request) {
  return UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                   &v1::IndexerKl::Stub::ComputeLoss, request);
}

absl::StatusOr<absl::Duration> Client::RegisterRegion(const std::string& name,
                                                      const std::string& key,
                                                      int64_t offset,
                                                      int64_t byte_size) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  request.set_key(key);
  request.set_offset(offset);
  request.set_byte_size(byte_size);
  ASSIGN_OR_RETURN(const v1::RegisterRegionResponse response,
                   UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                             &v1::IndexerKl::Stub::RegisterRegion, request));
  return absl::Seconds(response.lease_seconds());
}

absl::Status Client::UnregisterRegion(const std::string& name) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  return UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                   &v1::IndexerKl::Stub::UnregisterRegion, request)
      .status();
}

absl::StatusOr<v1::ListRegionsResponse> Client::ListRegions() {
  return UnaryCall(options_, *stubs_->channel, *stubs_->kl,
                   &v1::IndexerKl::Stub::ListRegions, v1::ListRegionsRequest());
}

absl::StatusOr<v1::ComputeLossResponse> Client::ComputeLossStreaming(
    const v1::ComputeLossRequest& request, int64_t block_rows) {
  RETURN_IF_ERROR(CheckNoRegions(request));
  ASSIGN_OR_RETURN(const RequestSlicer slicer, RequestSlicer::Create(request));
  const int64_t num_rows = slicer.num_rows();
  if (block_rows <= 0) block_rows = slicer.BlockRowsFor(options_.block_bytes);
  block_rows = std::min(block_rows, num_rows);
  // Built once: retries resend the same header.
  v1::ComputeLossStreamRequest header_message;
  *header_message.mutable_header() = slicer.MakeHeader();
  RETURN_IF_ERROR(ExplainMessageLimit(
      CheckMessageSize(header_message, options_.max_message_bytes),
      options_.max_message_bytes));

  const absl::Time deadline = absl::Now() + options_.deadline;
  auto attempt =
      [&](bool* may_retry) -> absl::StatusOr<v1::ComputeLossResponse> {
    grpc::ClientContext context;
    PrepareContext(context, options_, deadline);
    auto stream = stubs_->kl->ComputeLossStream(&context);

    // Bidi: blocks go out from this thread while the caller's thread reads
    // gradients, so the server computes block i while block i+1 travels.
    absl::Status too_large;  // a block past the message limit, unexplained
    std::thread writer([&] {
      if (!stream->Write(header_message)) return;
      v1::ComputeLossStreamRequest message;  // reused: keeps its capacity
      // The counting pass, when the server needs one to know N, then the
      // rows again for their gradients.
      for (const bool counting : {true, false}) {
        if (counting && !slicer.counts_first()) continue;
        for (int64_t row = 0; row < num_rows; row += block_rows) {
          v1::RowBlock* block = message.mutable_block();
          slicer.FillBlock(row, std::min(block_rows, num_rows - row), block);
          block->set_counting(counting);
          too_large = CheckMessageSize(message, options_.max_message_bytes);
          if (!too_large.ok()) {
            context.TryCancel();
            return;
          }
          // A failed write means the call is over; Finish says why.
          if (!stream->Write(message)) return;
        }
      }
      stream->WritesDone();
    });

    const bool projections = slicer.form() == RequestForm::kProjections;
    ResponseAssembler assembler(request.indexer_scores().shape(),
                                slicer.counts_first());
    ProjectionsResponseAssembler projections_assembler(slicer.batch(),
                                                       slicer.rows_per_batch());
    std::optional<v1::ComputeLossResponse> result;
    absl::Status local;
    v1::ComputeLossStreamResponse message;
    while (stream->Read(&message)) {
      *may_retry = false;
      if (result.has_value()) {
        local = ProtocolError("ComputeLossStream: message after the result");
      } else if (message.has_grad_block()) {
        local = projections
                    ? projections_assembler.Add(*message.mutable_grad_block())
                    : assembler.Add(*message.mutable_grad_block());
      } else if (message.has_result()) {
        result = std::move(*message.mutable_result());
      } else {
        local = ProtocolError("ComputeLossStream: empty response message");
      }
      if (!local.ok()) break;
    }
    // After a local error the server may still be reading: cancel so the
    // writer's pending Write fails instead of waiting for the deadline.
    if (!local.ok()) context.TryCancel();
    writer.join();
    const grpc::Status status = stream->Finish();
    RETURN_IF_ERROR(too_large);
    RETURN_IF_ERROR(local);
    RETURN_IF_ERROR(StatusFromCall(status, context));
    if (!result.has_value()) {
      return ProtocolError("ComputeLossStream: no result before the end");
    }
    return projections ? projections_assembler.Finish(std::move(*result))
                       : assembler.Finish(std::move(*result));
  };
  return WithRetries(options_, *stubs_->channel, deadline, attempt);
}

absl::StatusOr<EchoStats> Client::EchoStream(
    absl::Span<const EchoMessageSize> messages) {
  // One prebuilt request per distinct size (a plan of row blocks has one or
  // two), written as is: the baseline then carries no copy of its own.
  std::vector<v1::EchoRequest> requests;
  std::vector<int> request_of(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const EchoMessageSize& size = messages[i];
    if (size.payload_bytes < 0 || size.reply_bytes < 0) {
      return absl::InvalidArgumentError(
          "EchoStream: payload and reply sizes must be >= 0");
    }
    auto same = [&](const v1::EchoRequest& request) {
      return static_cast<int64_t>(request.payload().size()) ==
                 size.payload_bytes &&
             request.reply_bytes() == size.reply_bytes;
    };
    auto found = std::find_if(requests.begin(), requests.end(), same);
    if (found == requests.end()) {
      v1::EchoRequest& request = requests.emplace_back();
      request.mutable_payload()->assign(size.payload_bytes, '\x5a');
      request.set_reply_bytes(size.reply_bytes);
      found = requests.end() - 1;
    }
    request_of[i] = found - requests.begin();
  }

  const absl::Time deadline = absl::Now() + options_.deadline;
  auto attempt = [&](bool* may_retry) -> absl::StatusOr<EchoStats> {
    grpc::ClientContext context;
    PrepareContext(context, options_, deadline);
    auto stream = stubs_->kl->Echo(&context);
    EchoStats stats;
    std::thread writer([&] {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (!stream->Write(requests[request_of[i]])) return;
        stats.bytes_sent += messages[i].payload_bytes;
      }
      stream->WritesDone();
    });
    v1::EchoResponse response;
    while (stream->Read(&response)) {
      *may_retry = false;
      ++stats.messages;
      stats.bytes_received += response.payload().size();
    }
    writer.join();
    RETURN_IF_ERROR(StatusFromCall(stream->Finish(), context));
    if (stats.messages != static_cast<int64_t>(messages.size())) {
      return ProtocolError(absl::StrCat("Echo: ", stats.messages,
                                        " replies to ", messages.size(),
                                        " messages"));
    }
    return stats;
  };
  return WithRetries(options_, *stubs_->channel, deadline, attempt);
}

absl::StatusOr<EchoStats> Client::EchoStream(int64_t num_messages,
                                             int64_t payload_bytes,
                                             int64_t reply_bytes) {
  if (num_messages < 0) {
    return absl::InvalidArgumentError("EchoStream: num_messages must be >= 0");
  }
  std::vector<EchoMessageSize> messages(
      num_messages, EchoMessageSize{payload_bytes, reply_bytes});
  return EchoStream(messages);
}

absl::StatusOr<v1::RegionSlice> RegionSliceFor(absl::string_view dtype,
                                               absl::Span<const int64_t> shape,
                                               absl::string_view region,
                                               int64_t offset) {
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region slice: offset must be >= 0, got ", offset));
  }
  absl::StatusOr<int64_t> bytes = ExpectedTensorBytes(dtype, shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("region slice: ", bytes.status().message()));
  }
  v1::RegionSlice slice;
  slice.set_region(std::string(region));
  slice.set_offset(offset);
  slice.set_byte_size(*bytes);
  return slice;
}

absl::StatusOr<v1::Tensor> RegionTensor(absl::string_view dtype,
                                        absl::Span<const int64_t> shape,
                                        absl::string_view region,
                                        int64_t offset) {
  v1::Tensor tensor;
  ASSIGN_OR_RETURN(*tensor.mutable_region(),
                   RegionSliceFor(dtype, shape, region, offset));
  tensor.set_dtype(std::string(dtype));
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  return tensor;
}

}  // namespace klserve
