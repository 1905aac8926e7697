// klctl: the command-line client of klserve.
//
//   klctl health|info|loss|bench [--flags]
//
// Every command talks to --target under --deadline. Failures print the gRPC
// code name and message to stderr and exit 1.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "auth/token_file.h"
#include "client/bench_load.h"
#include "client/client.h"
#include "client/kernel_load.h"
#include "client/npy.h"
#include "client/tensor_util.h"
#include "flags/byte_count.h"
#include "flags/duration.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/cpu/blas.h"
#include "kernels/dtype.h"
#include "kernels/status_macros.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"
#include "proto/utf8.h"

// Connection.
ABSL_FLAG(std::string, target, "localhost:50051",
          "Server address: HOST:PORT, or unix:/absolute/path for a server's "
          "Unix-domain socket");
ABSL_FLAG(klserve::flags::Duration, deadline,
          klserve::flags::Duration{absl::Seconds(120)},
          "Time limit of each call, retries included");
ABSL_FLAG(int, max_attempts, klserve::ClientOptions().max_attempts,
          "Attempts per call while UNAVAILABLE or refused at the server's "
          "limit of calls in flight (bench: while connecting; it sends a "
          "refused request again itself)");
ABSL_FLAG(std::string, stream, "auto",
          "loss, bench: auto (stream above --stream_threshold, if the "
          "stream can carry the request), always, never");
ABSL_FLAG(klserve::flags::ByteCount, stream_threshold,
          klserve::flags::ByteCount{int64_t{64} << 20},
          "Requests with more tensor bytes than this are streamed (auto)");
ABSL_FLAG(klserve::flags::ByteCount, block_bytes,
          klserve::flags::ByteCount{int64_t{4} << 20},
          "Per-row bytes per RowBlock (and per GradBlock answering it) "
          "when streaming");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM roots to verify the server with; TLS when set");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for servers requiring one (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server certificate must carry, if not --target's host");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the server's bearer token (trailing newlines "
          "stripped)");

// health.
ABSL_FLAG(std::string, service, "", "health: the service to ask about");

namespace klserve {
namespace {

// A loss input flag's help: the tensor's layout and dtypes, and the forms
// that need it.
std::string InputHelp(absl::string_view name) {
  const RequestTensor& tensor = *FindRequestTensor(name);
  const char* need = "";
  if (name == "query") {  // as LossForm has it
    need = " (selects the projections form)";
  } else if (RequiredIn(RequestForm::kLogits, tensor)) {
    need = " (required)";
  } else if (RequiredIn(RequestForm::kProjections, tensor)) {
    need = " (required with --query)";
  } else if (!TakenIn(RequestForm::kLogits, tensor)) {
    need = " (with --query)";
  }
  return absl::StrCat("loss: ", tensor.layout, " ", DTypeRuleText(tensor.dtype),
                      " .npy", need);
}

// A number a flag may leave unset, for the options and tags whose absence
// means what no number does (q_offset's S - T, an untagged layer). As
// std::optional, but --help shows "default: unset" where std::optional's
// shows an empty default, and "unset" parses back to it.
template <typename T>
struct Unsettable {
  std::optional<T> value;
};

template <typename T>
bool AbslParseFlag(absl::string_view text, Unsettable<T>* flag,
                   std::string* error) {
  if (text.empty() || text == "unset") {
    flag->value.reset();
    return true;
  }
  T value;
  if (!absl::ParseFlag(text, &value, error)) return false;
  flag->value = value;
  return true;
}

template <typename T>
std::string AbslUnparseFlag(const Unsettable<T>& flag) {
  return flag.value ? absl::UnparseFlag(*flag.value) : "unset";
}

}  // namespace
}  // namespace klserve

// loss: inputs (.npy files), one flag for each of the request's tensors,
// named after it (LossRequestFromFlags finds them by name).
using klserve::InputHelp;
ABSL_FLAG(std::string, attention_logits, "", InputHelp("attention_logits"));
ABSL_FLAG(std::string, attention_weights, "", InputHelp("attention_weights"));
ABSL_FLAG(std::string, indexer_scores, "", InputHelp("indexer_scores"));
ABSL_FLAG(std::string, topk_indices, "", InputHelp("topk_indices"));
ABSL_FLAG(std::string, segment_ids_q, "", InputHelp("segment_ids_q"));
ABSL_FLAG(std::string, segment_ids_kv, "", InputHelp("segment_ids_kv"));
ABSL_FLAG(std::string, attention_mask, "", InputHelp("attention_mask"));
ABSL_FLAG(std::string, key_padding_mask, "", InputHelp("key_padding_mask"));
ABSL_FLAG(std::string, row_valid, "", InputHelp("row_valid"));
ABSL_FLAG(std::string, key_start, "", InputHelp("key_start"));
ABSL_FLAG(std::string, key_end, "", InputHelp("key_end"));
// The projections form (--query set).
ABSL_FLAG(std::string, query, "", InputHelp("query"));
ABSL_FLAG(std::string, key, "", InputHelp("key"));
ABSL_FLAG(std::string, lse, "", InputHelp("lse"));
ABSL_FLAG(std::string, index_query, "", InputHelp("index_query"));
ABSL_FLAG(std::string, index_key, "", InputHelp("index_key"));
ABSL_FLAG(std::string, index_weights, "", InputHelp("index_weights"));

// loss: LossOptions.
ABSL_FLAG(bool, causal, false,
          "loss: key s valid only if s <= t + q_offset (MaxText and Megatron "
          "align the first query with the first key: with T != S pass "
          "--q_offset=0)");
ABSL_FLAG(klserve::Unsettable<int64_t>, q_offset, {},
          "loss: position of query row 0 among the keys; unset: S - T");
ABSL_FLAG(int64_t, num_keys, 0, "loss: S (required with --topk_indices)");
ABSL_FLAG(float, softmax_scale, 1,
          "loss: multiplies attention_logits (with --query: q . k)");
ABSL_FLAG(std::string, flavor, "exact", "loss: exact or maxtext");
ABSL_FLAG(std::string, reduction, "mean", "loss: mean, mean_valid or sum");
ABSL_FLAG(double, scaling_factor, 1, "loss: c, multiplies loss and gradient");
ABSL_FLAG(double, grad_scale, 1,
          "loss: multiplies the gradient only, never the loss");
ABSL_FLAG(std::string, grad_dtype, "fp32",
          "loss, bench: gradient dtype fp32, bf16 or fp16");
ABSL_FLAG(bool, diagnostics, false, "loss: ask for entropies and row counts");
ABSL_FLAG(int64_t, recall_k, 0,
          "loss: k of the top-k recall diagnostic (prints the diagnostics, "
          "as --diagnostics)");
ABSL_FLAG(klserve::Unsettable<double>, index_weight_scale, {},
          "loss, with --query: multiplies index_weights; unset: "
          "1/sqrt(H_I * D_I)");
ABSL_FLAG(bool, use_relu, true,
          "loss, with --query: relu on each indexer head's dot product");
ABSL_FLAG(std::string, grad_out, "",
          "loss: write the gradient here (.npy; BF16 as '<u2'); the gradient "
          "is only requested when this is set. With --query: a directory, "
          "which gets d_index_query.npy, d_index_key.npy and "
          "d_index_weights.npy");
ABSL_FLAG(std::string, topk_out, "",
          "loss, with --query and --topk: write the service's top-k "
          "selection here ('<i4' .npy)");
ABSL_FLAG(std::string, row_kl_out, "",
          "loss: ask for each row's KL and write it here ('<f8' .npy)");

// loss: tags.
ABSL_FLAG(std::string, request_id, "", "loss: echoed in the response");
ABSL_FLAG(std::string, run, "",
          "loss, finish-step: run tag (enables per-step metrics)");
ABSL_FLAG(klserve::Unsettable<int64_t>, step, {},
          "loss, finish-step: step tag, required with --run; unset: the "
          "sample has no step");
ABSL_FLAG(klserve::Unsettable<int32_t>, layer, {},
          "loss: layer tag; unset: the untagged layer");
ABSL_FLAG(klserve::Unsettable<int32_t>, microbatch, {},
          "loss: microbatch tag; unset counts as 0");

// bench.
ABSL_FLAG(std::string, shape, "1,4096,4096",
          absl::StrFormat("bench: B,T,S; the problem's inputs must fit in a "
                          "quarter of the memory klctl may use (%.1f GiB "
                          "here: the machine's, or its container's limit)",
                          std::ldexp(klserve::MaxSyntheticInputBytes(), -30)));
ABSL_FLAG(int64_t, heads, 0,
          "bench: H of per-head logits; 0 sends a head-aggregated target");
ABSL_FLAG(int64_t, topk, 0,
          "bench: K for the sparse stage, 0 is dense; loss, with --query: "
          "the sparse stage with the service's own selection of K keys");
ABSL_FLAG(std::string, dtype, "fp32", "bench: input dtype fp32, bf16, fp16");
ABSL_FLAG(int, concurrency, 1,
          "bench: concurrent requests (one connection and one thread each), "
          "1 to 256");
ABSL_FLAG(klserve::flags::Duration, duration,
          klserve::flags::Duration{absl::Seconds(10)},
          "bench: stop starting requests after this long (per mode)");
ABSL_FLAG(int64_t, count, 0,
          "bench: stop after this many requests per mode; "
          "0 is no count limit");
ABSL_FLAG(std::string, form, "logits",
          "bench: logits (--heads, --topk as below) or projections (q, k "
          "and the indexer's projections: --heads, --kv_heads, --head_dim, "
          "--index_heads, --index_dim; --topk the service's selection)");
ABSL_FLAG(int64_t, kv_heads, 0,
          "bench, --form=projections: H_kv of the keys; 0 is --heads (MHA)");
ABSL_FLAG(int64_t, head_dim, 128, "bench, --form=projections: D");
ABSL_FLAG(int64_t, index_heads, 8, "bench, --form=projections: H_I");
ABSL_FLAG(int64_t, index_dim, 64, "bench, --form=projections: D_I");
ABSL_FLAG(std::string, mode, "loss",
          "bench: loss, echo (the same bytes through Echo) or both");
ABSL_FLAG(std::string, transport, "inline",
          "bench: how the loss calls' tensors travel: inline (in the "
          "messages), shm (in one shared-memory region registered once, "
          "outputs written there too; unary calls, a server on this host "
          "with --shared_memory) or both (shm, then inline)");
ABSL_FLAG(bool, kernel, false,
          "bench: first compute the same problem in this process through "
          "the kernels, on --kernel_threads threads, and report each "
          "transport's latency over that");
ABSL_FLAG(int, kernel_threads, 0,
          "bench --kernel: CPU threads, up to 256; 0 is the server's "
          "(GetServerInfo)");

namespace klserve {
namespace {

// While it lives, SIGINT, SIGTERM and SIGHUP remove /dev/shm/<key> before
// they end klctl as they would have: no destructor runs then, and the
// region's file, its pages in memory, stayed until someone removed it (the
// server lets go of its mapping when the registration's lease ends). A
// signal klctl was started to ignore stays ignored. One at a time.
class RegionFileRemovedOnSignal {
 public:
  explicit RegionFileRemovedOnSignal(const std::string& key) {
    absl::SNPrintF(path_, sizeof(path_), "/dev/shm/%s", key);
    struct sigaction action = {};
    action.sa_handler = &Remove;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler != SIG_IGN) {
        sigaction(kSignals[i], &action, nullptr);
      }
    }
  }
  ~RegionFileRemovedOnSignal() {
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], &previous_[i], nullptr);
    }
  }
  RegionFileRemovedOnSignal(const RegionFileRemovedOnSignal&) = delete;
  RegionFileRemovedOnSignal& operator=(const RegionFileRemovedOnSignal&) =
      delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  // Async-signal-safe: unlink, signal and raise only.
  static void Remove(int signal_number) {
    unlink(path_);
    signal(signal_number, SIG_DFL);
    raise(signal_number);
  }
  static inline char path_[300];  // "/dev/shm/" and a key of at most 255
  struct sigaction previous_[std::size(kSignals)];
};

// bench's workers and kernel threads, each a thread (a worker also a
// connection, a descriptor here and one in the server): far past any CPU's
// cores, and well within the usual soft limit of 1024 open files, which
// 100000 workers exhausted in klctl and in the server.
constexpr int kMostBenchThreads = 256;

constexpr char kUsage[] = R"(the command-line client for klserve.

Usage: klctl <command> [flags]

Commands:
  health  grpc.health.v1 check; prints SERVING or NOT_SERVING, exit 0 only
          when serving (--service names a service, default the server)
  info    prints GetServerInfo
  loss    computes the loss of a problem read from .npy files
          (--indexer_scores plus --attention_logits or --attention_weights,
          optional masks, key bounds and --topk_indices; or the projections
          form: --query, --key, --index_query, --index_key, --index_weights,
          optional --lse, --topk_indices or --topk); prints the result as
          key: value lines; --grad_out / --row_kl_out / --topk_out write
          .npy files (--grad_out is a directory with --query)
  bench   bounded synthetic load (--shape, --heads, --topk, --dtype,
          --concurrency, --duration, --count, --mode=loss|echo|both;
          --form=projections with --kv_heads, --head_dim, --index_heads,
          --index_dim); --transport=inline|shm|both for the loss calls,
          --kernel to time the problem in process too (a line of p50
          latencies, kernel / shm / inline, and their ratios end the output)
  finish-step  publishes a run's step now (--run, --step); prints its
          indexer_loss

Common flags: --target=HOST:PORT|unix:/path --deadline=120s
              --stream=auto|always|never
Errors print the gRPC code and message to stderr and exit 1.
)";

// The float dtypes' names, in any case.
absl::StatusOr<std::string> WireDType(absl::string_view flag,
                                      absl::string_view value) {
  const std::string upper = absl::AsciiStrToUpper(value);
  std::vector<std::string> names;
  for (DType dtype : kFloatDTypes) {
    if (upper == DTypeName(dtype)) return upper;
    names.push_back(absl::AsciiStrToLower(DTypeName(dtype)));
  }
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": must be ",
                                                 absl::StrJoin(names, ", "),
                                                 ", got \"", value, "\""));
}

absl::StatusOr<StreamMode> StreamModeFlag() {
  const std::string value = absl::AsciiStrToLower(absl::GetFlag(FLAGS_stream));
  if (value == "auto") return StreamMode::kAuto;
  if (value == "always") return StreamMode::kAlways;
  if (value == "never") return StreamMode::kNever;
  return absl::InvalidArgumentError(absl::StrCat(
      "--stream: must be auto, always or never, got \"", value, "\""));
}

absl::StatusOr<std::unique_ptr<Client>> MakeClient(ClientOptions* out) {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.deadline = absl::GetFlag(FLAGS_deadline).value;
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.stream_threshold_bytes = absl::GetFlag(FLAGS_stream_threshold).bytes;
  options.block_bytes = absl::GetFlag(FLAGS_block_bytes).bytes;
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file);
      !path.empty()) {
    ASSIGN_OR_RETURN(options.auth_token, ReadTokenFile(path));
  }
  if (out != nullptr) *out = options;
  // klctl sets no backoff and no message limit: those keep the library's
  // names, which its defaults never make it say.
  return Client::Create(std::move(options),
                        {.target = "--target",
                         .deadline = "--deadline",
                         .max_attempts = "--max_attempts",
                         .stream_threshold_bytes = "--stream_threshold",
                         .block_bytes = "--block_bytes",
                         .tls_ca_file = "--tls_ca",
                         .tls_cert_file = "--tls_cert",
                         .tls_key_file = "--tls_key",
                         .tls_server_name = "--tls_server_name"});
}

// True when serving; NOT_SERVING is an answer, not an error.
absl::StatusOr<bool> Health() {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, MakeClient(nullptr));
  ASSIGN_OR_RETURN(const bool serving,
                   client->Health(absl::GetFlag(FLAGS_service)));
  std::printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
  return serving;
}

absl::Status Info() {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, MakeClient(nullptr));
  ASSIGN_OR_RETURN(const v1::GetServerInfoResponse info,
                   client->GetServerInfo());
  std::printf("version: %s\n", info.version().c_str());
  std::printf("backend: %s\n", info.backend().c_str());
  std::printf("device: %s\n", info.device().c_str());
  std::printf("threads: %d\n", info.threads());
  std::printf("max_message_bytes: %lld\n",
              static_cast<long long>(info.max_message_bytes()));
  std::printf("max_tensor_bytes: %lld\n",
              static_cast<long long>(info.max_tensor_bytes()));
  std::printf("max_concurrent_requests: %d\n", info.max_concurrent_requests());
  std::printf("max_open_streams: %d\n", info.max_open_streams());
  std::printf("max_stream_key_bytes: %lld\n",
              static_cast<long long>(info.max_stream_key_bytes()));
  std::printf("max_thread_scratch_bytes: %lld\n",
              static_cast<long long>(info.max_thread_scratch_bytes()));
  std::printf("input_dtypes: %s\n",
              absl::StrJoin(info.input_dtypes(), ",").c_str());
  std::printf("grad_dtypes: %s\n",
              absl::StrJoin(info.grad_dtypes(), ",").c_str());
  std::printf("shared_memory: %s\n", info.shared_memory() ? "true" : "false");
  return absl::OkStatus();
}

// The value of a text flag sent as a string field (--run, --request_id):
// UTF-8, which the server's protobuf requires (it would refuse the whole
// message as unparsable), and no control character, which would break
// the `key: value` lines klctl prints (a newline in --request_id printed a
// `loss:` line of the caller's choosing).
absl::StatusOr<std::string> TextFlag(absl::string_view flag,
                                     const std::string& value) {
  if (!IsUtf8(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": must be UTF-8, got \"", absl::CHexEscape(value), "\""));
  }
  if (std::any_of(value.begin(), value.end(),
                  [](unsigned char c) { return c < 0x20 || c == 0x7F; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must have no control character, got \"",
                     absl::CHexEscape(value), "\""));
  }
  return value;
}

absl::Status FinishStep() {
  ASSIGN_OR_RETURN(const std::string run,
                   TextFlag("run", absl::GetFlag(FLAGS_run)));
  const std::optional<int64_t> step = absl::GetFlag(FLAGS_step).value;
  if (run.empty() || !step) {
    return absl::InvalidArgumentError("finish-step: needs --run and --step");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, MakeClient(nullptr));
  ASSIGN_OR_RETURN(const v1::FinishStepResponse finished,
                   client->FinishStep(run, *step));
  // Published before: the values are the published ones when it is the
  // run's last finished step, else NaN (the proto's FinishStepResponse).
  if (finished.already_finished()) std::printf("already_finished: true\n");
  std::printf("indexer_loss: %.17g\n", finished.indexer_loss());
  std::printf("indexer_loss_unscaled: %.17g\n",
              finished.indexer_loss_unscaled());
  std::printf("requests: %lld\n", static_cast<long long>(finished.requests()));
  return absl::OkStatus();
}

// The path given by the loss input flag named after `tensor` (empty when
// unset).
absl::StatusOr<std::string> InputPath(const RequestTensor& tensor) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(tensor.name);
  if (flag != nullptr) {
    if (auto path = flag->TryGet<std::string>()) return *std::move(path);
  }
  return absl::InternalError(absl::StrCat("klctl defines no string flag --",
                                          tensor.name, " for the request's ",
                                          tensor.name));
}

// Reads the .npy at `path` (given by the flag named after `input`), in one
// of the element types `input` takes, into `tensor`.
absl::Status ReadInput(const RequestTensor& input, const std::string& path,
                       v1::Tensor* tensor) {
  absl::StatusOr<v1::Tensor> read = ReadNpy(path, input.dtype);
  if (!read.ok()) {
    return absl::Status(
        read.status().code(),
        absl::StrCat("--", input.name, ": ", read.status().message()));
  }
  *tensor = *std::move(read);
  return absl::OkStatus();
}

// --query selects the projections form.
RequestForm LossForm() {
  return absl::GetFlag(FLAGS_query).empty() ? RequestForm::kLogits
                                            : RequestForm::kProjections;
}

absl::StatusOr<v1::ComputeLossRequest> LossRequestFromFlags() {
  v1::ComputeLossRequest request;
  std::vector<std::string> paths;
  for (const RequestTensor& tensor : kRequestTensors) {
    ASSIGN_OR_RETURN(std::string path, InputPath(tensor));
    paths.push_back(std::move(path));
  }
  // A tensor of the other form is sent as given, for the server to refuse
  // by name.
  const RequestForm form = LossForm();
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty() && RequiredIn(form, kRequestTensors[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", kRequestTensors[i].name, ": required",
          form == RequestForm::kProjections ? " with --query" : ""));
    }
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty()) continue;
    const RequestTensor& tensor = kRequestTensors[i];
    RETURN_IF_ERROR(
        ReadInput(tensor, paths[i], MutableTensor(request, tensor)));
  }

  v1::LossOptions* options = request.mutable_options();
  options->set_causal(absl::GetFlag(FLAGS_causal));
  if (auto q_offset = absl::GetFlag(FLAGS_q_offset).value) {
    options->set_q_offset(*q_offset);
  }
  options->set_num_keys(absl::GetFlag(FLAGS_num_keys));
  options->set_softmax_scale(absl::GetFlag(FLAGS_softmax_scale));
  const std::string flavor = absl::AsciiStrToLower(absl::GetFlag(FLAGS_flavor));
  if (flavor == "exact") {
    options->set_flavor(v1::FLAVOR_EXACT);
  } else if (flavor == "maxtext") {
    options->set_flavor(v1::FLAVOR_MAXTEXT);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--flavor: must be exact or maxtext, got \"", flavor, "\""));
  }
  const std::string reduction =
      absl::AsciiStrToLower(absl::GetFlag(FLAGS_reduction));
  if (reduction == "mean") {
    options->set_reduction(v1::REDUCTION_MEAN);
  } else if (reduction == "mean_valid") {
    options->set_reduction(v1::REDUCTION_MEAN_VALID);
  } else if (reduction == "sum") {
    options->set_reduction(v1::REDUCTION_SUM);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--reduction: must be mean, mean_valid or sum, got \"",
                     reduction, "\""));
  }
  options->set_grad_scale(absl::GetFlag(FLAGS_grad_scale));
  options->set_scaling_factor(absl::GetFlag(FLAGS_scaling_factor));
  ASSIGN_OR_RETURN(const std::string grad_dtype,
                   WireDType("grad_dtype", absl::GetFlag(FLAGS_grad_dtype)));
  options->set_grad_dtype(grad_dtype);
  // Without a file to write it to, the gradient would only cost bandwidth.
  options->set_skip_grad(absl::GetFlag(FLAGS_grad_out).empty());
  options->set_want_row_kl(!absl::GetFlag(FLAGS_row_kl_out).empty());
  // The recall is a diagnostic: asking for it prints the diagnostics.
  options->set_want_diagnostics(absl::GetFlag(FLAGS_diagnostics) ||
                                absl::GetFlag(FLAGS_recall_k) != 0);
  options->set_recall_k(absl::GetFlag(FLAGS_recall_k));
  if (auto scale = absl::GetFlag(FLAGS_index_weight_scale).value) {
    options->set_index_weight_scale(*scale);
  }
  // Sent in the logits form too when it is not the default, for the server
  // to refuse by name (as --index_weight_scale) rather than go unheard.
  if (form == RequestForm::kProjections || !absl::GetFlag(FLAGS_use_relu)) {
    options->set_use_relu(absl::GetFlag(FLAGS_use_relu));
  }
  options->set_topk(absl::GetFlag(FLAGS_topk));

  ASSIGN_OR_RETURN(*request.mutable_request_id(),
                   TextFlag("request_id", absl::GetFlag(FLAGS_request_id)));
  v1::Tags* tags = request.mutable_tags();
  ASSIGN_OR_RETURN(*tags->mutable_run(),
                   TextFlag("run", absl::GetFlag(FLAGS_run)));
  if (auto step = absl::GetFlag(FLAGS_step).value) tags->set_step(*step);
  if (auto layer = absl::GetFlag(FLAGS_layer).value) tags->set_layer(*layer);
  if (auto microbatch = absl::GetFlag(FLAGS_microbatch).value) {
    tags->set_microbatch(*microbatch);
  }
  return request;
}

std::string ShapeString(const v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ","), "]");
}

// Writes the response's tensor field `name` to `path` and says so.
absl::Status WriteOutput(const std::string& name,
                         const v1::ComputeLossResponse& response,
                         const std::string& path) {
  const google::protobuf::FieldDescriptor* field =
      response.GetDescriptor()->FindFieldByName(name);
  const google::protobuf::Reflection& reflection = *response.GetReflection();
  if (field == nullptr || !reflection.HasField(response, field)) {
    return absl::InternalError(absl::StrCat("the response carries no ", name));
  }
  const auto& tensor =
      static_cast<const v1::Tensor&>(reflection.GetMessage(response, field));
  RETURN_IF_ERROR(WriteNpy(path, tensor));
  std::printf("%s: %s %s -> %s\n", name.c_str(), tensor.dtype().c_str(),
              ShapeString(tensor).c_str(), path.c_str());
  return absl::OkStatus();
}

// --grad_out: the logits forms' gradient into that file; the projections
// form's three gradients into that directory (made if missing), one .npy
// each, named after its field.
absl::Status WriteGradients(const v1::ComputeLossResponse& response,
                            const std::string& grad_out) {
  if (!response.has_d_index_query()) {
    return WriteOutput("grad", response, grad_out);
  }
  std::error_code error;
  std::filesystem::create_directories(grad_out, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("--grad_out: cannot make the directory \"", grad_out,
                     "\": ", error.message()));
  }
  for (const char* name : {"d_index_query", "d_index_key", "d_index_weights"}) {
    RETURN_IF_ERROR(WriteOutput(
        name, response,
        (std::filesystem::path(grad_out) / name).string() + ".npy"));
  }
  return absl::OkStatus();
}

// OK when `dir` is a directory this process may make files in; otherwise
// the reason, after `what`.
absl::Status CheckWritableDirectory(absl::string_view what,
                                    const std::filesystem::path& dir) {
  std::error_code error;
  const bool is_directory = std::filesystem::is_directory(dir, error);
  if (error) return absl::ErrnoToStatus(error.value(), what);
  if (!is_directory) return absl::ErrnoToStatus(ENOTDIR, what);
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::ErrnoToStatus(errno, what);
  }
  return absl::OkStatus();
}

// OK when --`flag`=`path` names a file that can be made or overwritten.
absl::Status CheckOutputFile(absl::string_view flag, const std::string& path) {
  const std::string what =
      absl::StrCat("--", flag, ": cannot write \"", path, "\"");
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::ErrnoToStatus(EISDIR, what);
  }
  // A file that exists needs only to be writable (/dev/stdout, a file
  // mounted into a read-only directory); a new one, its directory.
  if (access(path.c_str(), W_OK) == 0) return absl::OkStatus();
  if (errno != ENOENT) return absl::ErrnoToStatus(errno, what);
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return CheckWritableDirectory(
      absl::StrCat(what, " in \"", dir.string(), "\""), dir);
}

// OK when --`flag`=`path` names a directory that exists or can be made
// (create_directories makes what is missing below the nearest that exists).
absl::Status CheckOutputDirectory(absl::string_view flag,
                                  const std::string& path) {
  std::filesystem::path dir = path;
  std::error_code error;
  while (!dir.empty() && !std::filesystem::exists(dir, error)) {
    dir = dir.parent_path();
  }
  if (dir.empty()) dir = ".";
  return CheckWritableDirectory(
      dir == path ? absl::StrCat("--", flag, ": cannot write in \"", path, "\"")
                  : absl::StrCat("--", flag, ": cannot make the directory \"",
                                 path, "\" in \"", dir.string(), "\""),
      dir);
}

// Whether two paths name one regular file: the same file where both exist
// (through a link, or spelt otherwise), else the same path once normalised.
// A device (/dev/null, /dev/stdout) may take several outputs.
bool SameFile(const std::string& a, const std::string& b) {
  std::error_code error;
  for (const std::string& path : {a, b}) {
    const std::filesystem::file_status status =
        std::filesystem::status(path, error);
    if (std::filesystem::exists(status) &&
        !std::filesystem::is_regular_file(status)) {
      return false;
    }
  }
  if (std::filesystem::equivalent(a, b, error)) return true;
  const std::filesystem::path canonical_a =
      std::filesystem::weakly_canonical(a, error);
  if (error) return false;
  const std::filesystem::path canonical_b =
      std::filesystem::weakly_canonical(b, error);
  return !error && canonical_a == canonical_b;
}

// The output flags as --help describes them, checked before the inputs are
// read and the call is made, so that a mistyped path or a missing flag costs
// no computation; and no output may name an input's file or another
// output's (the gradient written over the scores it came from, say).
absl::Status CheckLossOutputs(RequestForm form) {
  std::vector<std::pair<std::string, std::string>> outputs;  // flag, file
  if (const std::string grad_out = absl::GetFlag(FLAGS_grad_out);
      !grad_out.empty()) {
    if (form != RequestForm::kProjections) {
      RETURN_IF_ERROR(CheckOutputFile("grad_out", grad_out));
      outputs.emplace_back("grad_out", grad_out);
    } else {
      RETURN_IF_ERROR(CheckOutputDirectory("grad_out", grad_out));
      std::error_code error;
      const bool exists = std::filesystem::is_directory(grad_out, error);
      for (const char* name :
           {"d_index_query", "d_index_key", "d_index_weights"}) {
        const std::string file =
            (std::filesystem::path(grad_out) / name).string() + ".npy";
        if (exists) RETURN_IF_ERROR(CheckOutputFile("grad_out", file));
        outputs.emplace_back("grad_out", file);
      }
    }
  }
  if (const std::string topk_out = absl::GetFlag(FLAGS_topk_out);
      !topk_out.empty()) {
    if (form != RequestForm::kProjections || absl::GetFlag(FLAGS_topk) < 1) {
      return absl::InvalidArgumentError(
          "--topk_out: needs --query and --topk (the service's top-k "
          "selection is made only in the projections form with --topk)");
    }
    RETURN_IF_ERROR(CheckOutputFile("topk_out", topk_out));
    outputs.emplace_back("topk_out", topk_out);
  }
  if (const std::string row_kl_out = absl::GetFlag(FLAGS_row_kl_out);
      !row_kl_out.empty()) {
    RETURN_IF_ERROR(CheckOutputFile("row_kl_out", row_kl_out));
    outputs.emplace_back("row_kl_out", row_kl_out);
  }
  std::vector<std::pair<absl::string_view, std::string>> inputs;
  for (const RequestTensor& tensor : kRequestTensors) {
    ASSIGN_OR_RETURN(std::string input, InputPath(tensor));
    if (!input.empty()) inputs.emplace_back(tensor.name, std::move(input));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, file] = outputs[i];
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (SameFile(file, outputs[j].second)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ", --", outputs[j].first,
                         ": both would write \"", file, "\""));
      }
    }
    for (const auto& [input_flag, input] : inputs) {
      if (SameFile(file, input)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ": \"", file, "\" is the input --",
                         input_flag, "; write the outputs elsewhere"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Loss() {
  ASSIGN_OR_RETURN(const StreamMode mode, StreamModeFlag());
  RETURN_IF_ERROR(CheckLossOutputs(LossForm()));
  ASSIGN_OR_RETURN(const v1::ComputeLossRequest request,
                   LossRequestFromFlags());
  ClientOptions client_options;
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, MakeClient(&client_options));

  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ComputeLossResponse> response;
  const bool streamed = UsesStream(request, mode, client_options);
  if (streamed) {
    response = client->ComputeLossStreaming(request);
  } else {
    response = client->ComputeLossUnary(request);
  }
  if (!response.ok()) return response.status();
  const double latency_ms = absl::ToDoubleMilliseconds(absl::Now() - start);

  const v1::LossResult& result = response->result();
  // An id neither sent nor given by the server would be an empty line.
  if (!request.request_id().empty() || !response->request_id().empty()) {
    std::printf("request_id: %s\n", response->request_id().c_str());
  }
  std::printf("transport: %s\n", streamed ? "stream" : "unary");
  std::printf("loss: %.17g\n", result.loss());
  std::printf("unscaled_loss: %.17g\n", result.unscaled_loss());
  std::printf("denominator: %lld\n",
              static_cast<long long>(result.denominator()));
  std::printf("rows_counted: %lld\n",
              static_cast<long long>(result.rows_counted()));
  std::printf("rows_fully_masked: %lld\n",
              static_cast<long long>(result.rows_fully_masked()));
  std::printf("rows_zero_target: %lld\n",
              static_cast<long long>(result.rows_zero_target()));
  if (result.has_diagnostics()) {
    const v1::Diagnostics& diagnostics = result.diagnostics();
    std::printf("mean_entropy_p: %.17g\n", diagnostics.mean_entropy_p());
    std::printf("mean_entropy_q: %.17g\n", diagnostics.mean_entropy_q());
    if (diagnostics.has_topk_recall()) {
      std::printf("topk_recall: %.17g\n", diagnostics.topk_recall());
    }
  }
  std::printf("latency_ms: %.3f\n", latency_ms);

  const std::string grad_out = absl::GetFlag(FLAGS_grad_out);
  if (!grad_out.empty()) RETURN_IF_ERROR(WriteGradients(*response, grad_out));
  const std::string topk_out = absl::GetFlag(FLAGS_topk_out);
  if (!topk_out.empty()) {
    RETURN_IF_ERROR(WriteOutput("topk_indices", *response, topk_out));
  }
  const std::string row_kl_out = absl::GetFlag(FLAGS_row_kl_out);
  if (!row_kl_out.empty()) {
    RETURN_IF_ERROR(WriteOutput("row_kl", *response, row_kl_out));
  }
  return absl::OkStatus();
}

// Prints the results of a mode that ran to its end. A mode that failed
// prints none: its error, klctl's, is all there is to say about it.
absl::Status ReportLoad(absl::string_view mode, const LoadResult& load) {
  RETURN_IF_ERROR(load.first_error);
  std::printf("mode: %s\n", std::string(mode).c_str());
  std::printf("  requests: %lld\n", static_cast<long long>(load.requests));
  if (load.refusals > 0) {
    std::printf("  refused (server at its limit, retried): %lld\n",
                static_cast<long long>(load.refusals));
  }
  std::printf("  seconds: %.3f\n", absl::ToDoubleSeconds(load.elapsed));
  std::printf("  requests_per_s: %.3f\n", load.RequestsPerSecond());
  std::printf("  gb_per_s: %.3f\n", load.GigabytesPerSecond());
  std::printf("  latency_p50_ms: %.3f\n", load.LatencyPercentileMs(0.50));
  std::printf("  latency_p99_ms: %.3f\n", load.LatencyPercentileMs(0.99));
  return absl::OkStatus();
}

absl::Status Bench() {
  ASSIGN_OR_RETURN(const StreamMode stream_mode, StreamModeFlag());
  const std::string mode = absl::AsciiStrToLower(absl::GetFlag(FLAGS_mode));
  if (mode != "loss" && mode != "echo" && mode != "both") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode: must be loss, echo or both, got \"", mode, "\""));
  }
  const std::string transport =
      absl::AsciiStrToLower(absl::GetFlag(FLAGS_transport));
  if (transport != "inline" && transport != "shm" && transport != "both") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--transport: must be inline, shm or both, got \"", transport, "\""));
  }
  const bool shm_loss = transport != "inline";
  const bool inline_loss = transport != "shm";
  if (shm_loss && stream_mode == StreamMode::kAlways) {
    return absl::InvalidArgumentError(
        "--transport=shm, both: shared-memory regions are for unary calls; "
        "not with --stream=always");
  }
  LoadLimits limits;
  limits.concurrency = absl::GetFlag(FLAGS_concurrency);
  limits.duration = absl::GetFlag(FLAGS_duration).value;
  limits.count = absl::GetFlag(FLAGS_count);
  // Both limits must keep the run bounded.
  if (limits.concurrency < 1 || limits.concurrency > kMostBenchThreads ||
      limits.count < 0 || limits.duration <= absl::ZeroDuration() ||
      limits.duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--concurrency must be in [1, ", kMostBenchThreads,
        "], --count >= 0, --duration finite and > 0; got --concurrency=",
        limits.concurrency, ", --count=", limits.count,
        ", --duration=", absl::FormatDuration(limits.duration)));
  }
  const int kernel_threads = absl::GetFlag(FLAGS_kernel_threads);
  if (kernel_threads < 0 || kernel_threads > kMostBenchThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kernel_threads: must be in [0, ", kMostBenchThreads,
                     "], got ", kernel_threads));
  }

  int64_t batch = 0, rows = 0, keys = 0;
  const std::vector<std::string> dims =
      absl::StrSplit(absl::GetFlag(FLAGS_shape), ',');
  if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &batch) ||
      !absl::SimpleAtoi(dims[1], &rows) || !absl::SimpleAtoi(dims[2], &keys)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shape: must be B,T,S, got \"", absl::GetFlag(FLAGS_shape), "\""));
  }
  ASSIGN_OR_RETURN(const std::string dtype,
                   WireDType("dtype", absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(const std::string grad_dtype,
                   WireDType("grad_dtype", absl::GetFlag(FLAGS_grad_dtype)));
  const std::string form = absl::AsciiStrToLower(absl::GetFlag(FLAGS_form));
  v1::ComputeLossRequest request;
  if (form == "logits") {
    SyntheticProblem problem;
    problem.batch = batch, problem.rows = rows, problem.keys = keys;
    problem.heads = absl::GetFlag(FLAGS_heads);
    problem.topk = absl::GetFlag(FLAGS_topk);
    problem.dtype = dtype;
    problem.grad_dtype = grad_dtype;
    ASSIGN_OR_RETURN(request, MakeSyntheticRequest(problem));
    std::printf(
        "problem: form=logits B=%lld T=%lld S=%lld H=%lld K=%lld dtype=%s "
        "grad_dtype=%s\n",
        static_cast<long long>(batch), static_cast<long long>(rows),
        static_cast<long long>(keys), static_cast<long long>(problem.heads),
        static_cast<long long>(problem.topk), dtype.c_str(),
        grad_dtype.c_str());
  } else if (form == "projections") {
    SyntheticProjections problem;
    problem.batch = batch, problem.rows = rows, problem.keys = keys;
    if (absl::GetFlag(FLAGS_heads) > 0)
      problem.heads = absl::GetFlag(FLAGS_heads);
    problem.kv_heads = absl::GetFlag(FLAGS_kv_heads) > 0
                           ? absl::GetFlag(FLAGS_kv_heads)
                           : problem.heads;
    problem.head_dim = absl::GetFlag(FLAGS_head_dim);
    problem.index_heads = absl::GetFlag(FLAGS_index_heads);
    problem.index_dim = absl::GetFlag(FLAGS_index_dim);
    problem.topk = absl::GetFlag(FLAGS_topk);
    problem.dtype = dtype;
    problem.grad_dtype = grad_dtype;
    ASSIGN_OR_RETURN(request, MakeSyntheticProjectionsRequest(problem));
    std::printf(
        "problem: form=projections B=%lld T=%lld S=%lld H=%lld H_kv=%lld "
        "D=%lld H_I=%lld D_I=%lld K=%lld dtype=%s grad_dtype=%s\n",
        static_cast<long long>(batch), static_cast<long long>(rows),
        static_cast<long long>(keys), static_cast<long long>(problem.heads),
        static_cast<long long>(problem.kv_heads),
        static_cast<long long>(problem.head_dim),
        static_cast<long long>(problem.index_heads),
        static_cast<long long>(problem.index_dim),
        static_cast<long long>(problem.topk), dtype.c_str(),
        grad_dtype.c_str());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--form: must be logits or projections, got \"", form, "\""));
  }

  ClientOptions client_options;
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, MakeClient(&client_options));
  ASSIGN_OR_RETURN(const int64_t grad_element_bytes, WireDTypeSize(grad_dtype));
  ASSIGN_OR_RETURN(
      const std::vector<EchoMessageSize> plan,
      EchoPlanFor(request, grad_element_bytes, stream_mode, client_options));
  int64_t grad_bytes = 0;
  for (const EchoMessageSize& message : plan) grad_bytes += message.reply_bytes;
  std::printf("request_bytes: %lld\ngrad_bytes: %lld\n",
              static_cast<long long>(RequestTensorBytes(request)),
              static_cast<long long>(grad_bytes));
  if (inline_loss || mode != "loss") {
    std::printf(
        "transport: %s (%zu message%s each way)\n",
        UsesStream(request, stream_mode, client_options) ? "stream" : "unary",
        plan.size(), plan.size() == 1 ? "" : "s");
  }
  std::fflush(stdout);

  // p50 latencies for the closing table, in the order measured.
  std::vector<std::pair<std::string, double>> p50s;
  if (absl::GetFlag(FLAGS_kernel)) {
    int threads = kernel_threads;
    if (threads == 0) {
      ASSIGN_OR_RETURN(const v1::GetServerInfoResponse info,
                       client->GetServerInfo());
      threads = info.threads();
    }
    std::printf("kernel_threads: %d\n", threads);
    const LoadResult kernel_load = RunKernelLoad(request, threads, limits);
    RETURN_IF_ERROR(ReportLoad("kernel", kernel_load));
    p50s.emplace_back("kernel", kernel_load.LatencyPercentileMs(0.50));
  }

  // A server without Echo says so before the loss calls' whole run, not
  // after it: one message of one byte.
  if (mode == "both") {
    RETURN_IF_ERROR(client
                        ->EchoStream({EchoMessageSize{.payload_bytes = 1,
                                                      .reply_bytes = 1}})
                        .status());
  }
  std::optional<LoadResult> loss_load, echo_load;
  if (shm_loss && mode != "echo") {
    ASSIGN_OR_RETURN(const RegionProblem problem,
                     PlaceInRegion(request, limits.concurrency));
    const RegionFileRemovedOnSignal remove_on_signal(problem.region.key());
    std::printf(
        "region: /dev/shm/%s, %lld bytes (the inputs once, the "
        "outputs of %d worker%s)\n",
        problem.region.key().c_str(),
        static_cast<long long>(problem.region.byte_size()), limits.concurrency,
        limits.concurrency == 1 ? "" : "s");
    std::fflush(stdout);  // before a run that may be interrupted
    absl::Status registered =
        client
            ->RegisterRegion(problem.name, problem.region.key(), 0,
                             problem.region.byte_size())
            .status();
    if (registered.code() == absl::StatusCode::kUnimplemented) {
      return absl::UnimplementedError(absl::StrCat(
          "--transport=shm: the server serves no shared-memory regions "
          "(start it with --shared_memory): ",
          registered.message()));
    }
    RETURN_IF_ERROR(registered);
    const LoadResult shm_load =
        RunRegionLossLoad(problem, client_options, limits);
    // The calls have all returned, so the server holds the region for none
    // of them; it goes before the region (and its pages) does.
    const absl::Status unregistered = client->UnregisterRegion(problem.name);
    RETURN_IF_ERROR(ReportLoad("loss_shm", shm_load));
    RETURN_IF_ERROR(unregistered);
    p50s.emplace_back("shm", shm_load.LatencyPercentileMs(0.50));
  }
  if (inline_loss && mode != "echo") {
    loss_load = RunLossLoad(request, stream_mode, client_options, limits);
    RETURN_IF_ERROR(ReportLoad("loss", *loss_load));
    p50s.emplace_back("inline", loss_load->LatencyPercentileMs(0.50));
  }
  if (mode != "loss") {
    echo_load = RunEchoLoad(plan, client_options, limits);
    RETURN_IF_ERROR(ReportLoad("echo", *echo_load));
  }
  if (loss_load.has_value() && echo_load.has_value() &&
      echo_load->GigabytesPerSecond() > 0) {
    std::printf("loss_over_echo: %.3f\n", loss_load->GigabytesPerSecond() /
                                              echo_load->GigabytesPerSecond());
  }
  if (p50s.size() > 1) {
    // Each later one over the first measured (the kernel's own time when
    // --kernel). Not "latency_p50_ms:", which each mode's block has.
    std::printf("p50_ms:");
    for (const auto& [name, ms] : p50s) {
      std::printf(" %s=%.3f", name.c_str(), ms);
    }
    std::printf("\n");
    for (size_t i = 1; i < p50s.size(); ++i) {
      if (p50s[0].second <= 0) break;
      std::printf("%s_over_%s: %.3f\n", p50s[i].first.c_str(),
                  p50s[0].first.c_str(), p50s[i].second / p50s[0].second);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace klserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(klserve::kUsage);
  // As klserve's: --help names the file each flag is defined in by its name
  // in the repository, not by the path of the checkout that built the
  // binary.
  absl::FlagsUsageConfig usage;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("client/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  // absl's own --version says only whether NDEBUG was defined.
  usage.version_string = [] {
    return std::string("klctl " KLSERVE_VERSION "\n");
  };
  absl::SetFlagsUsageConfig(usage);
  // absl::ParseCommandLine exits 1 after printing the help that was asked
  // for, which scripts read as a failure; its two halves, run here, let
  // --help exit 0, as klserve's does. (absl's internal API: Debian pins
  // absl's version.)
  const std::vector<char*> args = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (const int handled = absl::flags_internal::HandleUsageFlags(
          std::cout, absl::ProgramUsageMessage());
      handled != -1) {
    return handled == 1 ? 0 : handled;  // 1: a help flag was handled
  }
  if (args.size() != 2) {
    std::fprintf(stderr, "%s\nklctl: expected exactly one command\n",
                 klserve::kUsage);
    return 1;
  }
  const std::string command = args[1];
  // bench --kernel computes in this process. Loading the BLAS sets
  // environment variables (kernels/cpu/blas.h): now, before gRPC's threads.
  if (command == "bench" && absl::GetFlag(FLAGS_kernel)) {
    klserve::cpu::LoadBlas().IgnoreError();
  }
  absl::Status status;
  if (command == "health") {
    absl::StatusOr<bool> serving = klserve::Health();
    if (serving.ok()) return *serving ? 0 : 1;
    status = serving.status();
  } else if (command == "info") {
    status = klserve::Info();
  } else if (command == "loss") {
    status = klserve::Loss();
  } else if (command == "bench") {
    status = klserve::Bench();
  } else if (command == "finish-step") {
    status = klserve::FinishStep();
  } else {
    status = absl::InvalidArgumentError(absl::StrCat(
        "unknown command \"", command,
        "\"; want health, info, loss, bench or finish-step (see --help)"));
  }
  if (!status.ok()) {
    std::fflush(stdout);  // what was printed so far comes before the error
    std::fprintf(stderr, "klctl: %s: %s\n",
                 absl::StatusCodeToString(status.code()).c_str(),
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
