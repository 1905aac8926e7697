#ifndef KLSERVE_TESTS_INTEGRATION_HARNESS_H_
#define KLSERVE_TESTS_INTEGRATION_HARNESS_H_

// Helpers of the integration tests, which drive the real `klserve` binary
// (and `klctl`) over loopback:
// - ServerProcess: starts klserve on a free 127.0.0.1 port, waits for
//   grpc.health.v1 SERVING, and SIGKILLs it on destruction if still running;
// - RunCommand: runs a program with a time limit, capturing its output;
// - random problems as ComputeLossRequest messages, and what the math
//   library computes for them in-process (the expected response);
// - bit-for-bit comparison of two responses;
// - raw gRPC stubs, for the stream protocol's error paths the Client
//   cannot produce.
//
// The binaries' paths come from CMake as KLSERVE_BIN and KLCTL_BIN.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/stream_codec.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve::integration {

// Every call of the tests runs under a deadline of this much at most.
inline constexpr absl::Duration kCallDeadline = absl::Seconds(30);

// ---------------------------------------------------------------------------
// The server process.

// Where a ServerProcess listens: its free loopback port and, or instead,
// Unix-domain sockets at these absolute paths.
struct ListenOn {
  bool loopback = true;
  std::vector<std::string> sockets;
};

class ServerProcess {
 public:
  // Starts `KLSERVE_BIN --listen=127.0.0.1:<free port> --threads=2
  // --metrics_listen=127.0.0.1:<another free port> <flags>` (a flag given in
  // `flags` wins over these defaults, being later), and
  // waits up to `timeout` for health SERVING. Fails if the process exits
  // first (the error carries its log). The health probe is a Client with
  // `probe` (its target, attempts and deadline replaced): a TLS server needs
  // a probe with TLS options. `listen` adds sockets; target() is then the
  // loopback address, or the first socket ("unix:/path") without loopback.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& flags = {},
      absl::Duration timeout = absl::Seconds(20),
      const ClientOptions& probe = ClientOptions(),
      const ListenOn& listen = ListenOn());

  // SIGKILLs the process if it is still running, and reaps it.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& target() const { return target_; }
  int port() const { return port_; }
  // The /metrics port it was started with.
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }

  // False once the process has exited (reaping it).
  bool Running();
  void Signal(int signal);
  // Waits up to `timeout` for the process to exit; its wait status, or
  // nullopt if it is still running.
  std::optional<int> WaitForExit(absl::Duration timeout);
  // VmRSS of /proc/<pid>/status, in KiB.
  absl::StatusOr<int64_t> RssKiB() const;
  // VmHWM: the most VmRSS has been since the process started, in KiB.
  absl::StatusOr<int64_t> PeakRssKiB() const;
  // What the process has written to stdout and stderr so far.
  std::string Log() const;

 private:
  ServerProcess() = default;
  // A "<field>: <n> kB" line of /proc/<pid>/status, in KiB.
  absl::StatusOr<int64_t> StatusKiB(absl::string_view field) const;

  pid_t pid_ = -1;
  bool exited_ = false;
  int wait_status_ = 0;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string target_;
  std::string log_path_;
};

// A free loopback port: bound with port 0, then closed.
int PickFreePort();

// A Client of `target` with a short deadline and the given attempts, and
// the TLS and token fields of `security` (only those).
std::unique_ptr<Client> MakeClient(
    const std::string& target, int max_attempts = 1,
    absl::Duration deadline = kCallDeadline,
    const ClientOptions& security = ClientOptions());

// A test fixture that owns one server started per test and checks, at the
// end of the test, that it is still running (unless the test said it would
// stop).
class ServerTest : public ::testing::Test {
 protected:
  // Starts the server with `flags`; fails the test if it does not come up.
  void StartServer(const std::vector<std::string>& flags = {});
  // For tests that stop the server on purpose.
  void ExpectServerToExit() { expect_exit_ = true; }
  void TearDown() override;

  ServerProcess& server() { return *server_; }
  Client& client() { return *client_; }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
  bool expect_exit_ = false;
};

// ---------------------------------------------------------------------------
// Running commands.

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  bool timed_out = false;
  std::string out;
  std::string err;
};

// Runs `argv` (argv[0] a path), killing it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(30));

// ---------------------------------------------------------------------------
// Problems.

struct ProblemSpec {
  std::string name;
  int64_t B = 1, T = 4, S = 8;
  int64_t H = 2;  // > 0: per-head attention_logits; 0: attention_weights
  int64_t K = 0;  // > 0: sparse stage with K slots (K <= S)
  std::string target_dtype = "FP32";
  std::string scores_dtype = "FP32";
  bool segments = false;
  bool attention_mask = false;
  bool key_padding = false;
  bool row_valid = false;
  // Head-aggregated target only: about one row in five all zero.
  bool zero_target_rows = false;
  // -inf in the scores and logits at positions the explicit attention mask
  // or an empty top-k slot makes invalid (about half of them).
  bool neg_inf_at_masked = false;
  // Empty (-1) top-k slots, about one in six.
  bool empty_slots = true;
  // causal, q_offset, flavor, reduction, ... (num_keys is set for sparse).
  v1::LossOptions options;
  uint64_t seed = 1;
};

// gtest prints a parameter by its name.
inline void PrintTo(const ProblemSpec& spec, std::ostream* os) {
  *os << spec.name;
}

// A random, valid request for `spec`.
v1::ComputeLossRequest MakeRequest(const ProblemSpec& spec);

// A request of the projections form: the projections normal(0, 1) in one
// input dtype, and for the sparse stage the client's top-k indices.
struct ProjectionsSpec {
  std::string name;
  int64_t B = 1, T = 6, S = 6;
  int64_t H = 2, H_kv = 2, D = 8;  // main attention; H_kv divides H
  int64_t H_I = 3, D_I = 4;        // indexer
  // > 0: the sparse stage with the client's topk_indices of K slots (about
  // one in six empty).
  int64_t K = 0;
  std::string dtype = "FP32";  // of every projection
  // Non-empty (B = 1, T = S = the sum): per-row key bounds of documents of
  // these lengths packed along T, each row seeing its document up to itself.
  std::vector<int32_t> documents;
  // causal, topk, use_relu, index_weight_scale, flavor, reduction, ...
  v1::LossOptions options;
  uint64_t seed = 1;
};

inline void PrintTo(const ProjectionsSpec& spec, std::ostream* os) {
  *os << spec.name;
}

v1::ComputeLossRequest MakeProjectionsRequest(const ProjectionsSpec& spec);

// An INT32 tensor of `shape` holding `values`.
v1::Tensor Int32Tensor(std::vector<int64_t> shape,
                       const std::vector<int32_t>& values);

// Dense head-aggregated FP32 [1, T, 4096], causal, with row_kl: 32 KiB of
// input per row, for tests that need large requests.
ProblemSpec WideSpec(int64_t T, uint64_t seed);

// What the math library (IndexerKlProblem::Create + ComputeIndexerKl on a
// 2-thread CpuBackend) computes for `request`, shaped as the server's
// response: grad [B, T, S or K] in grad_dtype, row_kl FP64 [B, T].
absl::StatusOr<v1::ComputeLossResponse> LibraryCompute(
    const v1::ComputeLossRequest& request);

// Bit-for-bit equality of two responses: request_id, every result field
// (doubles compared as bits), diagnostics' presence and values, and the
// presence, dtype, shape and bytes of grad, row_kl and the projections
// form's d_index_query, d_index_key, d_index_weights and topk_indices.
::testing::AssertionResult SameResponse(const v1::ComputeLossResponse& expected,
                                        const v1::ComputeLossResponse& actual);

// Encodes float values in a wire dtype ("FP32", "BF16", "FP16").
std::string EncodeFloats(const std::vector<float>& values,
                         const std::string& dtype);
// Sets element `index` of a float tensor to `value`.
void SetFloat(v1::Tensor& tensor, int64_t index, float value);
// Element `index` of a float tensor.
float GetFloat(const v1::Tensor& tensor, int64_t index);

// ---------------------------------------------------------------------------
// Raw gRPC.

std::unique_ptr<v1::IndexerKl::Stub> MakeStub(const std::string& target);

// One ComputeLossStream call with its context.
struct RawStream {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ComputeLossStreamRequest,
                                           v1::ComputeLossStreamResponse>>
      stream;
};
// With `wait_for_ready`, the call waits for the channel to connect instead
// of failing at once when a first connection attempt does: for tests that
// open many connections together to test the server, not the connecting.
RawStream OpenStream(v1::IndexerKl::Stub& stub,
                     absl::Duration deadline = kCallDeadline,
                     bool wait_for_ready = false);

// Writes the messages, closes the writing side, reads everything and
// returns the final status with the messages read. For short streams whose
// messages fit in gRPC's buffers (the server answers each block once it is
// read).
struct StreamOutcome {
  grpc::Status status;
  std::vector<v1::ComputeLossStreamResponse> responses;
};
StreamOutcome RunStream(
    v1::IndexerKl::Stub& stub,
    const std::vector<v1::ComputeLossStreamRequest>& messages,
    absl::Duration deadline = kCallDeadline);

// A stream's first message (the slicer's StreamHeader) and a block of it,
// of the counting pass or not (RowBlock.counting).
v1::ComputeLossStreamRequest HeaderMessage(const RequestSlicer& slicer);
v1::ComputeLossStreamRequest BlockMessage(const RequestSlicer& slicer,
                                          int64_t row_begin, int64_t num_rows,
                                          bool counting = false);

// ---------------------------------------------------------------------------
// The /metrics endpoint.

// A connected loopback socket whose reads and writes give up after
// `timeout`, or -1.
int ConnectLoopback(int port, absl::Duration timeout);

// The whole HTTP response to GET /metrics on 127.0.0.1:`port`, headers
// included, or "" when none came within `timeout`.
std::string ScrapeMetrics(int port, absl::Duration timeout = absl::Seconds(10));

// "CODE: message" for failure messages.
std::string Describe(const absl::Status& status);
std::string Describe(const grpc::Status& status);

}  // namespace klserve::integration

#endif  // KLSERVE_TESTS_INTEGRATION_HARNESS_H_
