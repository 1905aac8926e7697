#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/half.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "proto/request_tensors.h"

#ifndef KLSERVE_BIN
#error "KLSERVE_BIN must be defined by the build"
#endif

namespace klserve::integration {
namespace {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A new empty file under the test temp dir; its path.
std::string MakeTempFile(const std::string& stem) {
  std::string path = ::testing::TempDir() + "klserve_it_" + stem + "_XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd >= 0) close(fd);
  return path;
}

// Forks and execs `argv` with stdout to `out_path` and stderr to `err_path`
// (the same path for both is fine). The child is SIGKILLed when the test
// process dies, so no server outlives a crashed test.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path) {
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  const int err_fd =
      out_path == err_path
          ? out_fd
          : open(err_path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_fd);
  if (err_fd != out_fd) close(err_fd);
  close(null_fd);
  return pid;
}

}  // namespace

// ---------------------------------------------------------------------------
// ServerProcess

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::unique_ptr<Client> MakeClient(const std::string& target, int max_attempts,
                                   absl::Duration deadline,
                                   const ClientOptions& security) {
  ClientOptions options;
  options.tls_ca_file = security.tls_ca_file;
  options.tls_cert_file = security.tls_cert_file;
  options.tls_key_file = security.tls_key_file;
  options.tls_server_name = security.tls_server_name;
  options.auth_token = security.auth_token;
  options.target = target;
  options.max_attempts = max_attempts;
  options.deadline = deadline;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create(std::move(options));
  if (!client.ok()) {
    ADD_FAILURE() << "Client::Create: " << client.status();
    return nullptr;
  }
  return *std::move(client);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& flags, absl::Duration timeout,
    const ClientOptions& probe, const ListenOn& listen) {
  absl::Status last_error;
  // The port is free when picked but could be taken before the server binds
  // it; another port then gets another try.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<ServerProcess> server(new ServerProcess());
    server->port_ = PickFreePort();
    if (server->port_ == 0) return absl::InternalError("no free port");
    std::vector<std::string> addresses;
    if (listen.loopback) {
      addresses.push_back(absl::StrCat("127.0.0.1:", server->port_));
    }
    for (const std::string& path : listen.sockets) {
      addresses.push_back("unix:" + path);
    }
    if (addresses.empty()) return absl::InvalidArgumentError("no address");
    server->target_ = addresses.front();
    server->log_path_ = MakeTempFile("server");
    int metrics_port = PickFreePort();
    while (metrics_port == server->port_) metrics_port = PickFreePort();
    server->metrics_port_ = metrics_port;
    std::vector<std::string> argv = {
        KLSERVE_BIN, "--listen=" + absl::StrJoin(addresses, ","), "--threads=2",
        // Loopback only, and tests running at once must not collide on the
        // default metrics port.
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    server->pid_ = Spawn(argv, server->log_path_, server->log_path_);
    if (server->pid_ < 0) return absl::InternalError("fork failed");

    const absl::Time give_up = absl::Now() + timeout;
    bool died = false;
    while (absl::Now() < give_up) {
      if (!server->Running()) {
        died = true;
        break;
      }
      // A fresh channel per probe: a channel that failed to connect waits
      // out a reconnect backoff of a second or more before trying again.
      std::unique_ptr<Client> health =
          MakeClient(server->target_, 1, absl::Milliseconds(500), probe);
      if (health == nullptr)
        return absl::InternalError("Client::Create failed");
      absl::StatusOr<bool> serving = health->Health();
      // Another process may hold the port this one failed to bind: only
      // this one's start-up line says the answer came from it.
      if (serving.ok() && *serving &&
          absl::StrContains(server->Log(), "klserve: serving on ")) {
        return server;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    last_error = absl::InternalError(
        absl::StrCat("klserve ", absl::StrJoin(argv, " "),
                     died ? " exited before serving" : " not SERVING in time",
                     "; its log:\n", server->Log()));
    if (!died || !absl::StrContains(server->Log(), "cannot serve")) break;
  }
  return last_error;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && Running()) {
    kill(pid_, SIGKILL);
    WaitForExit(absl::Seconds(10));
  }
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

bool ServerProcess::Running() {
  if (exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    wait_status_ = status;
    return false;
  }
  return r == 0;
}

void ServerProcess::Signal(int signal) {
  if (Running()) kill(pid_, signal);
}

std::optional<int> ServerProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= give_up) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return wait_status_;
}

absl::StatusOr<int64_t> ServerProcess::RssKiB() const {
  return StatusKiB("VmRSS");
}

absl::StatusOr<int64_t> ServerProcess::PeakRssKiB() const {
  return StatusKiB("VmHWM");
}

absl::StatusOr<int64_t> ServerProcess::StatusKiB(
    absl::string_view field) const {
  std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, field) && absl::ConsumePrefix(&rest, ":")) {
      rest = absl::StripAsciiWhitespace(rest);
      absl::ConsumeSuffix(&rest, "kB");
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) return kib;
    }
  }
  return absl::NotFoundError(absl::StrCat("no ", field, " for pid ", pid_));
}

std::string ServerProcess::Log() const { return ReadWholeFile(log_path_); }

void ServerTest::StartServer(const std::vector<std::string>& flags) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(flags);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  client_ = MakeClient(server_->target());
  ASSERT_NE(client_, nullptr);
}

void ServerTest::TearDown() {
  if (server_ != nullptr && !expect_exit_) {
    EXPECT_TRUE(server_->Running())
        << "klserve died during the test; its log:\n"
        << server_->Log();
  }
  client_.reset();
  server_.reset();  // SIGKILL if still running
}

// ---------------------------------------------------------------------------
// RunCommand

CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout) {
  const std::string out_path = MakeTempFile("out");
  const std::string err_path = MakeTempFile("err");
  CommandResult result;
  const pid_t pid = Spawn(argv, out_path, err_path);
  const absl::Time give_up = absl::Now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) {
      status = -1;
      break;
    }
    if (absl::Now() >= give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!result.timed_out && status >= 0 && WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  result.out = ReadWholeFile(out_path);
  result.err = ReadWholeFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return result;
}

// ---------------------------------------------------------------------------
// Problems

std::string EncodeFloats(const std::vector<float>& values,
                         const std::string& dtype) {
  std::string out;
  if (dtype == "FP32") {
    out.resize(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
  } else {
    out.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits = dtype == "BF16" ? FloatToBFloat16(values[i])
                                            : FloatToFloat16(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

void SetFloat(v1::Tensor& tensor, int64_t index, float value) {
  std::string& data = *tensor.mutable_data();
  if (tensor.dtype() == "FP32") {
    std::memcpy(data.data() + 4 * index, &value, 4);
  } else {
    const uint16_t bits = tensor.dtype() == "BF16" ? FloatToBFloat16(value)
                                                   : FloatToFloat16(value);
    std::memcpy(data.data() + 2 * index, &bits, 2);
  }
}

float GetFloat(const v1::Tensor& tensor, int64_t index) {
  const std::string& data = tensor.data();
  if (tensor.dtype() == "FP32") {
    float value;
    std::memcpy(&value, data.data() + 4 * index, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, data.data() + 2 * index, 2);
  return tensor.dtype() == "BF16" ? BFloat16ToFloat(bits)
                                  : Float16ToFloat(bits);
}

v1::Tensor Int32Tensor(std::vector<int64_t> shape,
                       const std::vector<int32_t>& values) {
  v1::Tensor t;
  t.set_dtype("INT32");
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                         values.size() * 4));
  return t;
}

namespace {

v1::Tensor FloatTensor(const std::string& dtype, std::vector<int64_t> shape,
                       const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(EncodeFloats(values, dtype));
  return t;
}

v1::Tensor BoolTensor(std::vector<int64_t> shape,
                      const std::vector<uint8_t>& values) {
  v1::Tensor t;
  t.set_dtype("BOOL");
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size()));
  return t;
}

}  // namespace

v1::ComputeLossRequest MakeProjectionsRequest(const ProjectionsSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const auto random = [&](int64_t n) {
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    return values;
  };
  const int64_t B = spec.B, T = spec.T, S = spec.S;

  v1::ComputeLossRequest request;
  request.set_request_id(absl::StrCat(spec.name, "-", spec.seed));
  *request.mutable_options() = spec.options;
  const std::string& dtype = spec.dtype;
  *request.mutable_query() = FloatTensor(dtype, {B, T, spec.H, spec.D},
                                         random(B * T * spec.H * spec.D));
  *request.mutable_key() = FloatTensor(dtype, {B, S, spec.H_kv, spec.D},
                                       random(B * S * spec.H_kv * spec.D));
  *request.mutable_index_query() = FloatTensor(
      dtype, {B, T, spec.H_I, spec.D_I}, random(B * T * spec.H_I * spec.D_I));
  *request.mutable_index_key() =
      FloatTensor(dtype, {B, S, spec.D_I}, random(B * S * spec.D_I));
  *request.mutable_index_weights() =
      FloatTensor(dtype, {B, T, spec.H_I}, random(B * T * spec.H_I));
  if (spec.K > 0) {
    // K distinct keys per row (partial Fisher-Yates), about one slot in six
    // empty.
    std::vector<int32_t> topk(B * T * spec.K);
    std::vector<int32_t> keys(S);
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t s = 0; s < S; ++s) keys[s] = static_cast<int32_t>(s);
      for (int64_t j = 0; j < spec.K; ++j) {
        std::swap(keys[j], keys[j + rng() % (S - j)]);
        topk[r * spec.K + j] = unit(rng) < 1.0 / 6 ? -1 : keys[j];
      }
    }
    *request.mutable_topk_indices() = Int32Tensor({B, T, spec.K}, topk);
  }
  if (!spec.documents.empty()) {
    // B = 1 rows packed along T = S, each seeing its document up to itself.
    std::vector<int32_t> start, end;
    int32_t begin = 0;
    for (const int32_t length : spec.documents) {
      for (int32_t t = begin; t < begin + length; ++t) {
        start.push_back(begin);
        end.push_back(t + 1);
      }
      begin += length;
    }
    *request.mutable_key_start() = Int32Tensor({1, begin}, start);
    *request.mutable_key_end() = Int32Tensor({1, begin}, end);
  }
  return request;
}

ProblemSpec WideSpec(int64_t T, uint64_t seed) {
  ProblemSpec s;
  s.name = "wide";
  s.B = 1, s.T = T, s.S = 4096, s.H = 0;
  s.options.set_causal(true);
  s.options.set_want_row_kl(true);
  s.seed = seed;
  return s;
}

v1::ComputeLossRequest MakeRequest(const ProblemSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::normal_distribution<float> score(0.0f, 1.5f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const auto chance = [&](double p) { return unit(rng) < p; };

  const int64_t B = spec.B, T = spec.T, S = spec.S, H = spec.H;
  const bool sparse = spec.K > 0;
  const int64_t X = sparse ? spec.K : S;  // slots per row
  const float kNegInf = -std::numeric_limits<float>::infinity();

  v1::ComputeLossRequest request;
  request.set_request_id(absl::StrCat(spec.name, "-", spec.seed));
  *request.mutable_options() = spec.options;
  if (sparse) request.mutable_options()->set_num_keys(S);

  // Masks first: -inf goes where they make a slot invalid.
  std::vector<uint8_t> mask;
  if (spec.attention_mask) {
    mask.resize(B * T * S);
    for (auto& m : mask) m = chance(0.75) ? 1 : 0;
    request.mutable_attention_mask()->CopyFrom(BoolTensor({B, T, S}, mask));
  }
  std::vector<int32_t> topk;
  if (sparse) {
    topk.resize(B * T * spec.K);
    std::vector<int32_t> keys(S);
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t s = 0; s < S; ++s) keys[s] = static_cast<int32_t>(s);
      for (int64_t j = 0; j < spec.K; ++j) {  // partial Fisher-Yates
        std::uniform_int_distribution<int64_t> pick(j, S - 1);
        std::swap(keys[j], keys[pick(rng)]);
        topk[r * spec.K + j] =
            spec.empty_slots && chance(1.0 / 6) ? -1 : keys[j];
      }
    }
    request.mutable_topk_indices()->CopyFrom(Int32Tensor({B, T, spec.K}, topk));
  }
  // Whether slot x of row r is invalid for a reason the generator knows.
  const auto known_invalid = [&](int64_t r, int64_t x) {
    if (sparse) {
      const int32_t key = topk[r * spec.K + x];
      if (key < 0) return true;
      return spec.attention_mask && mask[r * S + key] == 0;
    }
    return spec.attention_mask && mask[r * S + x] == 0;
  };

  std::vector<float> scores(B * T * X);
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t x = 0; x < X; ++x) {
      float v = score(rng);
      if (spec.neg_inf_at_masked && known_invalid(r, x) && chance(0.5)) {
        v = kNegInf;
      }
      scores[r * X + x] = v;
    }
  }
  request.mutable_indexer_scores()->CopyFrom(
      FloatTensor(spec.scores_dtype, {B, T, X}, scores));

  if (H > 0) {
    std::vector<float> logits(B * H * T * X);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t x = 0; x < X; ++x) {
            float v = logit(rng);
            if (spec.neg_inf_at_masked && known_invalid(b * T + t, x) &&
                chance(0.5)) {
              v = kNegInf;
            }
            logits[((b * H + h) * T + t) * X + x] = v;
          }
        }
      }
    }
    request.mutable_attention_logits()->CopyFrom(
        FloatTensor(spec.target_dtype, {B, H, T, X}, logits));
  } else {
    std::vector<float> weights(B * T * X);
    for (int64_t r = 0; r < B * T; ++r) {
      const bool zero_row = spec.zero_target_rows && chance(0.2);
      for (int64_t x = 0; x < X; ++x) {
        weights[r * X + x] = zero_row || chance(0.1) ? 0.0f : unit(rng);
      }
    }
    request.mutable_attention_weights()->CopyFrom(
        FloatTensor(spec.target_dtype, {B, T, X}, weights));
  }

  if (spec.segments) {
    std::vector<int32_t> q(B * T), kv(B * S);
    std::uniform_int_distribution<int32_t> id(0, 2);
    for (auto& v : q) v = id(rng);
    for (auto& v : kv) v = chance(0.1) ? -1 : id(rng);
    request.mutable_segment_ids_q()->CopyFrom(Int32Tensor({B, T}, q));
    request.mutable_segment_ids_kv()->CopyFrom(Int32Tensor({B, S}, kv));
  }
  if (spec.key_padding) {
    std::vector<uint8_t> pad(B * S);
    for (auto& v : pad) v = chance(0.9) ? 1 : 0;
    request.mutable_key_padding_mask()->CopyFrom(BoolTensor({B, S}, pad));
  }
  if (spec.row_valid) {
    std::vector<uint8_t> valid(B * T);
    // Nonzero bytes other than 1 are true as well.
    for (auto& v : valid) v = chance(0.75) ? (chance(0.5) ? 1 : 7) : 0;
    request.mutable_row_valid()->CopyFrom(BoolTensor({B, T}, valid));
  }
  return request;
}

namespace {

absl::StatusOr<DType> DTypeOf(const std::string& name) {
  if (name == "FP32") return DType::kFloat32;
  if (name == "BF16") return DType::kBFloat16;
  if (name == "FP16") return DType::kFloat16;
  if (name == "INT32") return DType::kInt32;
  if (name == "BOOL") return DType::kBool;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", name));
}

absl::StatusOr<TensorView> View(const v1::Tensor& t) {
  TensorView view;
  absl::StatusOr<DType> dtype = DTypeOf(t.dtype());
  if (!dtype.ok()) return dtype.status();
  view.dtype = *dtype;
  view.shape.assign(t.shape().begin(), t.shape().end());
  view.data = t.data().data();
  view.byte_size = static_cast<int64_t>(t.data().size());
  return view;
}

Backend& TestBackend() {
  static CpuBackend* backend = new CpuBackend(2);
  return *backend;
}

}  // namespace

absl::StatusOr<v1::ComputeLossResponse> LibraryCompute(
    const v1::ComputeLossRequest& request) {
  IndexerKlInputs in;
  for (const RequestTensor& tensor : kRequestTensors) {
    const v1::Tensor* t = FindTensor(request, tensor);
    if (t == nullptr) continue;
    absl::StatusOr<TensorView> view = View(*t);
    if (!view.ok()) return view.status();
    SetInput(tensor, *std::move(view), in);
  }

  // LossOptions as the proto documents them.
  const v1::LossOptions& o = request.options();
  IndexerKlOptions options;
  options.causal = o.causal();
  if (o.has_q_offset()) options.q_offset = o.q_offset();
  options.num_keys = o.num_keys();
  if (o.has_softmax_scale()) options.softmax_scale = o.softmax_scale();
  options.flavor =
      o.flavor() == v1::FLAVOR_MAXTEXT ? Flavor::kMaxText : Flavor::kExact;
  switch (o.reduction()) {
    case v1::REDUCTION_MEAN_VALID:
      options.reduction = Reduction::kMeanValid;
      break;
    case v1::REDUCTION_SUM:
      options.reduction = Reduction::kSum;
      break;
    default:
      options.reduction = Reduction::kMean;
  }
  if (o.has_scaling_factor()) options.scaling_factor = o.scaling_factor();
  if (o.has_grad_scale()) options.grad_scale = o.grad_scale();
  options.want_grad = !o.skip_grad();
  if (!o.grad_dtype().empty()) {
    absl::StatusOr<DType> grad_dtype = DTypeOf(o.grad_dtype());
    if (!grad_dtype.ok()) return grad_dtype.status();
    options.grad_dtype = *grad_dtype;
  }
  options.want_row_kl = o.want_row_kl();
  options.want_diagnostics = o.want_diagnostics();
  options.recall_k = o.recall_k();

  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(in, options);
  if (!problem.ok()) return problem.status();
  const absl::StatusOr<RowData> rows = WholeRowData(*problem, in);
  if (!rows.ok()) return rows.status();
  const int64_t B = problem->B, T = problem->T, K = problem->row_length;

  v1::ComputeLossResponse response;
  response.set_request_id(request.request_id());
  LossOutputs outputs;
  if (options.want_grad) {
    v1::Tensor* grad = response.mutable_grad();
    grad->set_dtype(DTypeName(options.grad_dtype));
    grad->add_shape(B);
    grad->add_shape(T);
    grad->add_shape(K);
    grad->mutable_data()->resize(B * T * K * DTypeSize(options.grad_dtype));
    outputs.grad = grad->mutable_data()->data();
    outputs.grad_byte_size = static_cast<int64_t>(grad->data().size());
  }
  std::vector<double> row_kl;
  if (options.want_row_kl) {
    row_kl.resize(B * T);
    outputs.row_kl = row_kl.data();
    outputs.row_kl_size = B * T;
  }
  absl::StatusOr<IndexerKlResult> result =
      ComputeIndexerKl(TestBackend(), *problem, *rows, outputs);
  if (!result.ok()) return result.status();
  if (options.want_row_kl) {
    v1::Tensor* t = response.mutable_row_kl();
    t->set_dtype("FP64");
    t->add_shape(B);
    t->add_shape(T);
    t->set_data(std::string(reinterpret_cast<const char*>(row_kl.data()),
                            row_kl.size() * sizeof(double)));
  }
  v1::LossResult* out = response.mutable_result();
  out->set_loss(result->loss);
  out->set_unscaled_loss(result->unscaled_loss);
  out->set_denominator(result->denominator);
  out->set_rows_counted(result->rows_counted);
  out->set_rows_fully_masked(result->rows_fully_masked);
  out->set_rows_zero_target(result->rows_zero_target);
  if (result->diagnostics) {
    v1::Diagnostics* d = out->mutable_diagnostics();
    d->set_mean_entropy_p(result->diagnostics->mean_entropy_p);
    d->set_mean_entropy_q(result->diagnostics->mean_entropy_q);
    if (result->diagnostics->topk_recall) {
      d->set_topk_recall(*result->diagnostics->topk_recall);
    }
  }
  return response;
}

// ---------------------------------------------------------------------------
// Comparison

namespace {

bool SameBits(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

std::string DoubleText(double v) {
  return absl::StrCat(absl::StrFormat("%.17g", v), " (0x",
                      absl::Hex(std::bit_cast<uint64_t>(v)), ")");
}

void CompareTensor(const char* field, bool has_expected,
                   const v1::Tensor& expected, bool has_actual,
                   const v1::Tensor& actual, std::vector<std::string>& diffs) {
  if (has_expected != has_actual) {
    diffs.push_back(absl::StrCat(field, ": present ", has_expected,
                                 " expected, ", has_actual, " actual"));
    return;
  }
  if (!has_expected) return;
  if (expected.dtype() != actual.dtype()) {
    diffs.push_back(absl::StrCat(field, ".dtype: ", expected.dtype(), " vs ",
                                 actual.dtype()));
  }
  if (absl::StrJoin(expected.shape(), ",") !=
      absl::StrJoin(actual.shape(), ",")) {
    diffs.push_back(absl::StrCat(field, ".shape: [",
                                 absl::StrJoin(expected.shape(), ","), "] vs [",
                                 absl::StrJoin(actual.shape(), ","), "]"));
  }
  const std::string& e = expected.data();
  const std::string& a = actual.data();
  if (e.size() != a.size()) {
    diffs.push_back(
        absl::StrCat(field, ".data: ", e.size(), " bytes vs ", a.size()));
    return;
  }
  if (e != a) {
    size_t first = 0;
    int64_t count = 0;
    bool found = false;
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] != a[i]) {
        if (!found) first = i;
        found = true;
        ++count;
      }
    }
    diffs.push_back(absl::StrCat(field, ".data: ", count,
                                 " bytes differ, the first at byte ", first));
  }
}

}  // namespace

::testing::AssertionResult SameResponse(const v1::ComputeLossResponse& expected,
                                        const v1::ComputeLossResponse& actual) {
  std::vector<std::string> diffs;
  if (expected.request_id() != actual.request_id()) {
    diffs.push_back(absl::StrCat("request_id: \"", expected.request_id(),
                                 "\" vs \"", actual.request_id(), "\""));
  }
  const v1::LossResult& e = expected.result();
  const v1::LossResult& a = actual.result();
  const auto same_double = [&](const char* field, double x, double y) {
    if (!SameBits(x, y)) {
      diffs.push_back(
          absl::StrCat(field, ": ", DoubleText(x), " vs ", DoubleText(y)));
    }
  };
  const auto same_int = [&](const char* field, int64_t x, int64_t y) {
    if (x != y) diffs.push_back(absl::StrCat(field, ": ", x, " vs ", y));
  };
  same_double("loss", e.loss(), a.loss());
  same_double("unscaled_loss", e.unscaled_loss(), a.unscaled_loss());
  same_int("denominator", e.denominator(), a.denominator());
  same_int("rows_counted", e.rows_counted(), a.rows_counted());
  same_int("rows_fully_masked", e.rows_fully_masked(), a.rows_fully_masked());
  same_int("rows_zero_target", e.rows_zero_target(), a.rows_zero_target());
  if (e.has_diagnostics() != a.has_diagnostics()) {
    diffs.push_back(absl::StrCat("diagnostics: present ", e.has_diagnostics(),
                                 " expected, ", a.has_diagnostics(),
                                 " actual"));
  } else if (e.has_diagnostics()) {
    const v1::Diagnostics& ed = e.diagnostics();
    const v1::Diagnostics& ad = a.diagnostics();
    same_double("mean_entropy_p", ed.mean_entropy_p(), ad.mean_entropy_p());
    same_double("mean_entropy_q", ed.mean_entropy_q(), ad.mean_entropy_q());
    if (ed.has_topk_recall() != ad.has_topk_recall()) {
      diffs.push_back(absl::StrCat("topk_recall: present ",
                                   ed.has_topk_recall(), " expected, ",
                                   ad.has_topk_recall(), " actual"));
    } else if (ed.has_topk_recall()) {
      same_double("topk_recall", ed.topk_recall(), ad.topk_recall());
    }
  }
  CompareTensor("grad", expected.has_grad(), expected.grad(), actual.has_grad(),
                actual.grad(), diffs);
  CompareTensor("row_kl", expected.has_row_kl(), expected.row_kl(),
                actual.has_row_kl(), actual.row_kl(), diffs);
  CompareTensor("d_index_query", expected.has_d_index_query(),
                expected.d_index_query(), actual.has_d_index_query(),
                actual.d_index_query(), diffs);
  CompareTensor("d_index_key", expected.has_d_index_key(),
                expected.d_index_key(), actual.has_d_index_key(),
                actual.d_index_key(), diffs);
  CompareTensor("d_index_weights", expected.has_d_index_weights(),
                expected.d_index_weights(), actual.has_d_index_weights(),
                actual.d_index_weights(), diffs);
  CompareTensor("topk_indices", expected.has_topk_indices(),
                expected.topk_indices(), actual.has_topk_indices(),
                actual.topk_indices(), diffs);
  if (diffs.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "responses differ (expected vs actual):\n  "
         << absl::StrJoin(diffs, "\n  ");
}

// ---------------------------------------------------------------------------
// Raw gRPC

std::unique_ptr<v1::IndexerKl::Stub> MakeStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::IndexerKl::NewStub(grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args));
}

RawStream OpenStream(v1::IndexerKl::Stub& stub, absl::Duration deadline,
                     bool wait_for_ready) {
  RawStream raw;
  raw.context = std::make_unique<grpc::ClientContext>();
  raw.context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  raw.context->set_wait_for_ready(wait_for_ready);
  raw.stream = stub.ComputeLossStream(raw.context.get());
  return raw;
}

StreamOutcome RunStream(
    v1::IndexerKl::Stub& stub,
    const std::vector<v1::ComputeLossStreamRequest>& messages,
    absl::Duration deadline) {
  RawStream raw = OpenStream(stub, deadline);
  std::thread writer([&] {
    for (const auto& message : messages) {
      if (!raw.stream->Write(message)) return;
    }
    raw.stream->WritesDone();
  });
  StreamOutcome outcome;
  v1::ComputeLossStreamResponse response;
  while (raw.stream->Read(&response)) outcome.responses.push_back(response);
  writer.join();
  outcome.status = raw.stream->Finish();
  return outcome;
}

std::string Describe(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                      status.message());
}

std::string Describe(const grpc::Status& status) {
  return Describe(
      absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message()));
}

v1::ComputeLossStreamRequest HeaderMessage(const RequestSlicer& slicer) {
  v1::ComputeLossStreamRequest m;
  *m.mutable_header() = slicer.MakeHeader();
  return m;
}

v1::ComputeLossStreamRequest BlockMessage(const RequestSlicer& slicer,
                                          int64_t row_begin, int64_t num_rows,
                                          bool counting) {
  v1::ComputeLossStreamRequest m;
  slicer.FillBlock(row_begin, num_rows, m.mutable_block());
  m.mutable_block()->set_counting(counting);
  return m;
}

int ConnectLoopback(int port, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ScrapeMetrics(int port, absl::Duration timeout) {
  const int fd = ConnectLoopback(port, timeout);
  if (fd < 0) return "";
  std::string response;
  const absl::string_view get =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, get.data(), get.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(get.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  }
  close(fd);
  return response;
}

}  // namespace klserve::integration
