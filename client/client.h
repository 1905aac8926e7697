#ifndef KLSERVE_CLIENT_CLIENT_H_
#define KLSERVE_CLIENT_CLIENT_H_

// klserve::Client: a blocking C++ client for the klserve.v1.IndexerKl
// service (and grpc.health.v1.Health).
//
// Every call runs under a deadline (ClientOptions::deadline, counted from the
// start of the call and covering its retries). UNAVAILABLE, and a refusal at
// the server's limit of calls in flight (IsOverloaded), are retried with
// exponential backoff; every other error is returned at once, with the gRPC
// code and message kept (absl and gRPC codes share their numbers).
//
// gRPC headers stay out of this header (the stubs live behind a pointer),
// so code that includes it compiles without grpcpp.
//
// Shared memory (a server on this host started with --shared_memory): a
// caller creates a region (client/shared_memory_region.h), registers it
// (RegisterRegion), and builds requests whose tensors name slices of it
// (RegionTensor) and whose `outputs` say where the gradient and the other
// outputs go (RegionSliceFor); the server then reads and writes those bytes
// in place, and the response's tensors carry dtype, shape and `region`, no
// data. Such a request is always sent unary. The region must stay mapped
// until UnregisterRegion; docs/shared-memory.md has the server's rules.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

struct ClientOptions {
  // Server address, "host:port" or any gRPC target URI ("dns:///host:port",
  // "unix:/path"); a web URL ("http://...") is refused.
  std::string target = "localhost:50051";
  // Time limit of one call, its retries included. Finite and > 0.
  absl::Duration deadline = absl::Seconds(120);
  // The channel's send and receive message limits (gRPC's default receive
  // limit is 4 MiB). At most 2 GiB - 1, since no message can be larger.
  int64_t max_message_bytes = 1 << 30;
  // Attempts per call when the server answers UNAVAILABLE, or refuses it at
  // its limit of calls in flight (RESOURCE_EXHAUSTED naming
  // --max_concurrent_requests or --max_open_streams; the call did not run);
  // >= 1. Ten, with the backoff below, wait about 5 to 9 s in all: long
  // enough for a server (a sidecar, a pod) that restarts, or a burst of
  // calls from many ranks, so that a training step rides it out.
  int max_attempts = 10;
  // Wait before the first retry; doubled after each one up to max_backoff.
  // Each wait is jittered to between half and all of its value.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // ComputeLoss sends requests whose tensor bytes exceed this through
  // ComputeLossStream, the rest as one unary message.
  int64_t stream_threshold_bytes = 64 << 20;
  // Target bytes of per-row data per RowBlock when streaming, and per
  // GradBlock answering it (whichever a row has more of); > 0.
  int64_t block_bytes = 4 << 20;

  // Transport security (docs/security.md). PEM root certificates to verify
  // the server with; TLS when set, plaintext otherwise.
  std::string tls_ca_file;
  // A client certificate and its key, for servers that require one (mutual
  // TLS). Both or neither; need tls_ca_file.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name the server's certificate must carry, when it is not the
  // target's host (e.g. connecting by IP to a certificate for a DNS name).
  std::string tls_server_name;
  // Bearer token sent as "authorization: Bearer <token>" on every call
  // (health included, which needs it only on a server started with
  // --health_needs_token); empty sends none.
  std::string auth_token;
};

// What Client::Create's messages call each option it checks: the
// library's names by default; a program that fills the options from its
// own flags (klctl) passes the flags' names, so that its users read the
// names they typed.
struct ClientOptionNames {
  absl::string_view target = "ClientOptions.target";
  absl::string_view deadline = "ClientOptions.deadline";
  absl::string_view max_message_bytes = "ClientOptions.max_message_bytes";
  absl::string_view max_attempts = "ClientOptions.max_attempts";
  absl::string_view initial_backoff = "ClientOptions.initial_backoff";
  absl::string_view max_backoff = "ClientOptions.max_backoff";
  absl::string_view stream_threshold_bytes =
      "ClientOptions.stream_threshold_bytes";
  absl::string_view block_bytes = "ClientOptions.block_bytes";
  absl::string_view tls_ca_file = "ClientOptions.tls_ca_file";
  absl::string_view tls_cert_file = "ClientOptions.tls_cert_file";
  absl::string_view tls_key_file = "ClientOptions.tls_key_file";
  absl::string_view tls_server_name = "ClientOptions.tls_server_name";
};

// Sizes of one Echo message: `payload_bytes` up, `reply_bytes` back.
struct EchoMessageSize {
  int64_t payload_bytes = 0;
  int64_t reply_bytes = 0;
};

// What one Echo stream moved.
struct EchoStats {
  int64_t messages = 0;        // replies received
  int64_t bytes_sent = 0;      // payload bytes sent
  int64_t bytes_received = 0;  // payload bytes received
};

// Thread-safe: any number of threads may call any method at once; calls
// share one channel (one connection, owned by this Client alone).
class Client {
 public:
  // Validates `options` (INVALID_ARGUMENT naming the option as `names`
  // does) and creates the channel. Connecting is lazy: an unreachable
  // server shows up as UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      ClientOptions options, const ClientOptionNames& names = {});

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  // grpc.health.v1.Health/Check for `service` ("" is the whole server).
  // True when SERVING; false for any other reported state.
  absl::StatusOr<bool> Health(const std::string& service = "");

  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo();

  // Publishes the run's step now (FinishStep): its values, or
  // already_finished when it was published before; NOT_FOUND when the server
  // has no samples of `step` for `run`.
  absl::StatusOr<v1::FinishStepResponse> FinishStep(const std::string& run,
                                                    int64_t step);

  // Computes one problem, as one unary message when its tensor bytes are at
  // most options().stream_threshold_bytes, when it names a shared-memory
  // region (a tensor's `region` or any of `outputs`) or when the stream
  // cannot carry it (StreamCarries), through
  // ComputeLossStream otherwise. Either way the response is what the unary call
  // returns, in either form (the projections form, `query` set: d_index_query,
  // d_index_key, d_index_weights and, with options.topk, the service's
  // topk_indices).
  absl::StatusOr<v1::ComputeLossResponse> ComputeLoss(
      const v1::ComputeLossRequest& request);

  // The unary call (the request must fit the message limits).
  absl::StatusOr<v1::ComputeLossResponse> ComputeLossUnary(
      const v1::ComputeLossRequest& request);

  // Registers bytes [offset, offset + byte_size) of the shared-memory object
  // /dev/shm/<key> as region `name`; returns the lease (the region is
  // dropped after that long unused; any call naming it, or registering it
  // again with the same values, renews it). ALREADY_EXISTS when `name` is
  // held with other values; PERMISSION_DENIED from a caller that is not on
  // this host (a Unix socket or loopback); UNIMPLEMENTED from a server
  // without --shared_memory.
  absl::StatusOr<absl::Duration> RegisterRegion(const std::string& name,
                                                const std::string& key,
                                                int64_t offset,
                                                int64_t byte_size);
  // NOT_FOUND for an unknown name; FAILED_PRECONDITION while calls use it.
  absl::Status UnregisterRegion(const std::string& name);
  // The server's regions (by name) and its limits on them.
  absl::StatusOr<v1::ListRegionsResponse> ListRegions();

  // The bidi stream: a StreamHeader, then RowBlocks of `block_rows` rows
  // (0: as many as fit options().block_bytes), every row twice for
  // REDUCTION_MEAN_VALID without row_valid in the logits form
  // (RowBlock.counting), written by a second thread while this one reads
  // the GradBlocks; returns them assembled into one response, grad
  // [B, T, S or K] (the projections form: d_index_query, d_index_weights,
  // topk_indices, with d_index_key from the result) and row_kl [B, T]
  // included. The request's per-row tensors must have consistent shapes and
  // byte sizes (INVALID_ARGUMENT before anything is sent otherwise). The
  // projections form's key side travels whole in the header.
  // UNAVAILABLE is retried only while no response message has arrived.
  // A request naming a shared-memory region is INVALID_ARGUMENT naming the
  // field: regions are for the unary call only.
  absl::StatusOr<v1::ComputeLossResponse> ComputeLossStreaming(
      const v1::ComputeLossRequest& request, int64_t block_rows = 0);

  // One Echo stream: message i carries messages[i].payload_bytes of payload
  // and asks for messages[i].reply_bytes back. Writes and reads overlap as in
  // ComputeLossStreaming; messages are built before the stream starts, so
  // this measures the transport alone (the loss's block copies are not
  // mirrored).
  absl::StatusOr<EchoStats> EchoStream(
      absl::Span<const EchoMessageSize> messages);

  // `num_messages` messages of `payload_bytes`, each answered with
  // `reply_bytes`.
  absl::StatusOr<EchoStats> EchoStream(int64_t num_messages,
                                       int64_t payload_bytes,
                                       int64_t reply_bytes);

 private:
  struct Stubs;  // the gRPC channel and stubs

  Client(ClientOptions options, std::unique_ptr<Stubs> stubs);

  ClientOptions options_;
  std::unique_ptr<Stubs> stubs_;
};

// The slice of region `region` at `offset` that a tensor of `dtype` and
// `shape` fills: byte_size is prod(shape) times the element size. For
// ComputeLossRequest.outputs (e.g. the gradient: indexer_scores' shape in
// the grad_dtype; row_kl: FP64 [B, T]). INVALID_ARGUMENT for an unknown
// dtype, a negative dimension or offset, or a size that overflows. The
// server checks the rest (the region's name and bounds, alignment: offset
// a multiple of the element size).
absl::StatusOr<v1::RegionSlice> RegionSliceFor(absl::string_view dtype,
                                               absl::Span<const int64_t> shape,
                                               absl::string_view region,
                                               int64_t offset);

// A request tensor of `dtype` and `shape` whose bytes lie in region
// `region` at `offset` (dtype, shape and region set; no data). Errors as
// RegionSliceFor.
absl::StatusOr<v1::Tensor> RegionTensor(absl::string_view dtype,
                                        absl::Span<const int64_t> shape,
                                        absl::string_view region,
                                        int64_t offset);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_CLIENT_H_
