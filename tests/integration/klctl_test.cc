// klctl against the real server: health, info, loss on .npy files written
// here (numbers and gradient bytes equal to the library's; the projections
// form's equal to the float64 reference), errors with the gRPC code name on
// stderr (bad inputs and outputs refused before any call), a short bench of
// each form, and the bench's shared-memory transport over a Unix socket;
// --help.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/request_tensors.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"
#include "tests/reference/projections_reference.h"

#ifndef KLCTL_BIN
#error "KLCTL_BIN must be defined by the build"
#endif

namespace klserve::integration {
namespace {

// The .npy descr of a wire dtype (BF16 travels as uint16, klserve's
// convention).
std::string Descr(const std::string& dtype) {
  if (dtype == "FP32") return "<f4";
  if (dtype == "FP16") return "<f2";
  if (dtype == "BF16") return "<u2";
  if (dtype == "INT32") return "<i4";
  if (dtype == "BOOL") return "|b1";
  if (dtype == "FP64") return "<f8";
  return "?";
}

std::string ShapeTuple(const v1::Tensor& t) {
  if (t.shape_size() == 1) return absl::StrCat("(", t.shape(0), ",)");
  return absl::StrCat("(", absl::StrJoin(t.shape(), ", "), ")");
}

// A version 1.0 .npy image of `t`'s shape and data under `descr`, written by
// hand from the format's definition.
std::string NpyImage(const v1::Tensor& t, const std::string& descr) {
  std::string dict = absl::StrCat(
      "{'descr': '", descr,
      "', 'fortran_order': False, 'shape': ", ShapeTuple(t), ", }");
  // magic (6) + version (2) + length (2) + dict + padding + '\n', a
  // multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string image("\x93NUMPY\x01\x00", 8);
  image.push_back(static_cast<char>(dict.size() & 0xff));
  image.push_back(static_cast<char>(dict.size() >> 8));
  return image + dict + t.data();
}

// The dict and data of an .npy file; empty dict when malformed.
struct Npy {
  std::string dict;
  std::string data;
};

Npy ParseNpyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  Npy npy;
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return npy;
  size_t header_len, data_start;
  if (bytes[6] == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) |
                 (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    data_start = 10 + header_len;
  } else {
    if (bytes.size() < 12) return npy;
    uint32_t len;
    std::memcpy(&len, bytes.data() + 8, 4);
    header_len = len;
    data_start = 12 + header_len;
  }
  if (data_start > bytes.size()) return npy;
  npy.dict = bytes.substr(data_start - header_len, header_len);
  npy.data = bytes.substr(data_start);
  return npy;
}

// "key: value" lines.
std::map<std::string, std::string> KeyValues(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    out[std::string(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return out;
}

double ParseDouble(const std::string& text) {
  double value = std::nan("");
  EXPECT_TRUE(absl::SimpleAtod(text, &value)) << "not a number: " << text;
  return value;
}

class KlctlTest : public ServerTest {
 protected:
  void SetUp() override {
    // klctl bench --mode=echo|both needs Echo.
    ASSERT_NO_FATAL_FAILURE(StartServer({"--enable_echo"}));
    char dir[] = "/tmp/klserve_klctl_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& file : files_) unlink(file.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
    ServerTest::TearDown();
  }

  // Writes `t` as <dir>/<name>.npy, under `descr` when given (else its
  // dtype's); its path.
  std::string Write(const std::string& name, const v1::Tensor& t,
                    std::string descr = "") {
    if (descr.empty()) descr = Descr(t.dtype());
    const std::string path = absl::StrCat(dir_, "/", name, ".npy");
    std::ofstream out(path, std::ios::binary);
    const std::string image = NpyImage(t, descr);
    out.write(image.data(), static_cast<std::streamsize>(image.size()));
    files_.push_back(path);
    return path;
  }
  std::string OutPath(const std::string& name) {
    const std::string path = absl::StrCat(dir_, "/", name, ".npy");
    files_.push_back(path);
    return path;
  }

  // `loss` with the .npy inputs of a small head-aggregated problem (B = 1,
  // T = 3, S = 4).
  std::vector<std::string> SmallLossArgs(const std::string& name,
                                         uint64_t seed) {
    ProblemSpec s;
    s.name = name;
    s.B = 1, s.T = 3, s.S = 4, s.H = 0;
    s.seed = seed;
    const v1::ComputeLossRequest request = MakeRequest(s);
    return {
        "loss",
        "--attention_weights=" + Write("weights", request.attention_weights()),
        "--indexer_scores=" + Write("scores", request.indexer_scores())};
  }

  CommandResult Klctl(std::vector<std::string> args) {
    args.insert(args.begin(), {KLCTL_BIN});
    args.insert(args.begin() + 2, {"--target=" + server().target(),
                                   "--deadline=30s", "--max_attempts=1"});
    return RunCommand(args, absl::Seconds(40));
  }

  // Runs `klctl loss` on `request`'s tensors (written as .npy) with
  // `flags`, and compares what it prints and writes with the library's
  // answer to `request` (whose options must say what the flags say).
  void ExpectLossMatchesLibrary(const v1::ComputeLossRequest& request,
                                std::vector<std::string> flags,
                                const std::string& transport) {
    absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
    ASSERT_TRUE(expected.ok()) << expected.status();
    std::vector<std::string> args = {"loss"};
    for (const RequestTensor& tensor : kRequestTensors) {
      if (const v1::Tensor* t = FindTensor(request, tensor)) {
        const std::string name(tensor.name);
        args.push_back(absl::StrCat("--", name, "=", Write(name, *t)));
      }
    }
    const std::string grad_path = OutPath("grad");
    const std::string row_kl_path = OutPath("row_kl");
    args.push_back("--grad_out=" + grad_path);
    args.push_back("--row_kl_out=" + row_kl_path);
    args.push_back("--request_id=" + request.request_id());
    args.insert(args.end(), flags.begin(), flags.end());

    const CommandResult run = Klctl(args);
    ASSERT_EQ(run.exit_code, 0)
        << "klctl " << absl::StrJoin(args, " ") << "\nstdout:\n"
        << run.out << "\nstderr:\n"
        << run.err;
    std::map<std::string, std::string> kv = KeyValues(run.out);
    const v1::LossResult& e = expected->result();
    ASSERT_TRUE(kv.count("loss")) << run.out;
    // %.17g round-trips a double exactly.
    EXPECT_EQ(ParseDouble(kv["loss"]), e.loss()) << run.out;
    EXPECT_EQ(ParseDouble(kv["unscaled_loss"]), e.unscaled_loss()) << run.out;
    EXPECT_EQ(kv["denominator"], absl::StrCat(e.denominator()));
    EXPECT_EQ(kv["rows_counted"], absl::StrCat(e.rows_counted()));
    EXPECT_EQ(kv["rows_fully_masked"], absl::StrCat(e.rows_fully_masked()));
    EXPECT_EQ(kv["rows_zero_target"], absl::StrCat(e.rows_zero_target()));
    EXPECT_EQ(kv["request_id"], request.request_id());
    EXPECT_EQ(kv["transport"], transport);
    if (e.has_diagnostics()) {
      EXPECT_EQ(ParseDouble(kv["mean_entropy_p"]),
                e.diagnostics().mean_entropy_p());
      EXPECT_EQ(ParseDouble(kv["mean_entropy_q"]),
                e.diagnostics().mean_entropy_q());
      if (e.diagnostics().has_topk_recall()) {
        EXPECT_EQ(ParseDouble(kv["topk_recall"]),
                  e.diagnostics().topk_recall());
      }
    }

    const Npy grad = ParseNpyFile(grad_path);
    EXPECT_TRUE(absl::StrContains(
        grad.dict, absl::StrCat("'descr': '", Descr(expected->grad().dtype()))))
        << grad.dict;
    EXPECT_TRUE(absl::StrContains(grad.dict, ShapeTuple(expected->grad())))
        << grad.dict;
    EXPECT_TRUE(grad.data == expected->grad().data())
        << "the gradient .npy's bytes differ from the library's ("
        << grad.data.size() << " vs " << expected->grad().data().size()
        << " bytes)";
    const Npy row_kl = ParseNpyFile(row_kl_path);
    EXPECT_TRUE(absl::StrContains(row_kl.dict, "'descr': '<f8'"))
        << row_kl.dict;
    EXPECT_TRUE(row_kl.data == expected->row_kl().data())
        << "the row_kl .npy's bytes differ from the library's";
  }

  // Runs `klctl loss` on the projections-form `request`'s tensors with
  // `flags` (which must say what its options say), the gradients into the
  // test's directory, and compares what it prints (the transport too) and
  // writes with the reference.
  void ExpectProjectionsMatchReference(const v1::ComputeLossRequest& request,
                                       std::vector<std::string> flags,
                                       const std::string& transport = "unary") {
    const klref::RefProjectionsResult ref =
        klref::ComputeProjectionsReference(RefProjectionsOf(request));
    ASSERT_TRUE(ref.kl.error.empty()) << ref.kl.error;
    std::vector<std::string> args = {"loss"};
    for (const RequestTensor& tensor : kRequestTensors) {
      if (const v1::Tensor* t = FindTensor(request, tensor)) {
        const std::string name(tensor.name);
        args.push_back(absl::StrCat("--", name, "=", Write(name, *t)));
      }
    }
    // The gradients land in the directory as <field>.npy.
    const std::string d_query = OutPath("d_index_query");
    const std::string d_key = OutPath("d_index_key");
    const std::string d_weights = OutPath("d_index_weights");
    const std::string topk_path = OutPath("topk_out");
    args.push_back("--grad_out=" + dir_);
    args.push_back("--row_kl_out=" + OutPath("row_kl"));
    const bool server_topk = request.options().topk() > 0;
    if (server_topk) args.push_back("--topk_out=" + topk_path);
    args.insert(args.end(), flags.begin(), flags.end());

    const CommandResult run = Klctl(args);
    ASSERT_EQ(run.exit_code, 0)
        << "klctl " << absl::StrJoin(args, " ") << "\nstdout:\n"
        << run.out << "\nstderr:\n"
        << run.err;
    std::map<std::string, std::string> kv = KeyValues(run.out);
    EXPECT_EQ(kv["transport"], transport);
    const double loss = ParseDouble(kv["loss"]);
    EXPECT_NEAR(loss, ref.kl.loss, 1e-5 * std::fabs(ref.kl.loss) + 1e-9)
        << run.out;
    EXPECT_EQ(kv["denominator"], absl::StrCat(ref.kl.denominator));
    EXPECT_EQ(kv["rows_fully_masked"], absl::StrCat(ref.kl.rows_fully_masked));
    const auto read = [](const std::string& path) {
      v1::Tensor t;
      t.set_dtype("FP32");
      t.set_data(ParseNpyFile(path).data);
      return t;
    };
    EXPECT_TRUE(CloseTensor(ref.d_index_query, read(d_query), 1e-4));
    EXPECT_TRUE(CloseTensor(ref.d_index_key, read(d_key), 1e-4));
    EXPECT_TRUE(CloseTensor(ref.d_index_weights, read(d_weights), 1e-4));
    EXPECT_TRUE(absl::StrContains(
        ParseNpyFile(d_query).dict,
        absl::StrCat("'shape': ", ShapeTuple(request.index_query()))));
    if (server_topk) {
      v1::Tensor topk;
      topk.set_dtype("INT32");
      topk.set_data(ParseNpyFile(topk_path).data);
      EXPECT_EQ(DecodeInts(topk), ref.topk_indices);
    }
  }

  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(KlctlTest, HealthPrintsServing) {
  const CommandResult run = Klctl({"health"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "SERVING\n");
}

TEST_F(KlctlTest, InfoPrintsTheBackend) {
  const CommandResult run = Klctl({"info"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::map<std::string, std::string> kv = KeyValues(run.out);
  EXPECT_EQ(kv["backend"], "cpu") << run.out;
  EXPECT_EQ(kv["threads"], "2") << run.out;
  EXPECT_FALSE(kv["version"].empty()) << run.out;
  EXPECT_EQ(kv["max_concurrent_requests"], "8") << run.out;
  EXPECT_EQ(kv["max_stream_key_bytes"], "1073741824") << run.out;
  EXPECT_EQ(kv["max_thread_scratch_bytes"], "1073741824") << run.out;
  EXPECT_EQ(kv["shared_memory"], "false") << run.out;
}

TEST_F(KlctlTest, DensePerHeadBf16LossAndGradientMatchTheLibrary) {
  ProblemSpec s;
  s.name = "klctl-dense";
  s.B = 2, s.T = 6, s.S = 10, s.H = 3;
  s.target_dtype = "BF16";
  s.scores_dtype = "FP32";
  s.segments = true;
  s.row_valid = true;
  s.options.set_causal(true);
  s.options.set_flavor(v1::FLAVOR_MAXTEXT);
  s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
  s.options.set_scaling_factor(0.01);
  s.options.set_softmax_scale(0.5f);
  s.options.set_grad_dtype("BF16");
  s.options.set_want_row_kl(true);
  s.options.set_want_diagnostics(true);
  s.options.set_recall_k(3);
  s.seed = 51;
  ExpectLossMatchesLibrary(
      MakeRequest(s),
      {"--causal", "--flavor=maxtext", "--reduction=mean_valid",
       "--scaling_factor=0.01", "--softmax_scale=0.5", "--grad_dtype=bf16",
       "--diagnostics", "--recall_k=3"},
      "unary");
}

TEST_F(KlctlTest, SparseAggregatedStreamedLossAndGradientMatchTheLibrary) {
  ProblemSpec s;
  s.name = "klctl-sparse";
  s.B = 2, s.T = 5, s.S = 24, s.K = 6, s.H = 0;
  s.target_dtype = "FP16";
  s.scores_dtype = "FP16";
  s.key_padding = true;
  s.attention_mask = true;
  s.options.set_reduction(v1::REDUCTION_SUM);
  s.options.set_grad_dtype("FP32");
  s.options.set_want_row_kl(true);
  s.seed = 52;
  // Streamed in small blocks (--stream=always, 64-byte blocks: about one
  // row each).
  ExpectLossMatchesLibrary(MakeRequest(s),
                           {"--num_keys=24", "--reduction=sum",
                            "--stream=always", "--block_bytes=64"},
                           "stream");
}

TEST_F(KlctlTest, KeyBoundsLossAndGradientMatchTheLibrary) {
  ProblemSpec s;
  s.name = "klctl-key-bounds";
  s.B = 1, s.T = 8, s.S = 8, s.H = 2;
  s.options.set_want_row_kl(true);
  s.seed = 54;
  v1::ComputeLossRequest request = MakeRequest(s);
  // Two documents of 5 and 3 rows, each row seeing its own up to itself.
  const std::vector<int32_t> start = {0, 0, 0, 0, 0, 5, 5, 5};
  const std::vector<int32_t> end = {1, 2, 3, 4, 5, 6, 7, 8};
  *request.mutable_key_start() = Int32Tensor({1, 8}, start);
  *request.mutable_key_end() = Int32Tensor({1, 8}, end);
  ExpectLossMatchesLibrary(request, {}, "unary");
}

TEST_F(KlctlTest, ProjectionsWithServerTopkMatchTheReference) {
  ProjectionsSpec s;
  s.name = "klctl-projections-topk";
  s.B = 2, s.T = 6, s.S = 9, s.H = 4, s.H_kv = 2, s.D = 8;
  s.options.set_causal(true);
  s.options.set_topk(3);
  s.options.set_want_row_kl(true);
  s.seed = 55;
  ExpectProjectionsMatchReference(MakeProjectionsRequest(s),
                                  {"--causal", "--topk=3"});
}

// Streamed in blocks of about 3 rows (tiles of 16 rows in the sparse stage):
// what klctl writes is assembled from GradBlocks of the completed rows.
TEST_F(KlctlTest, ProjectionsStreamedMatchTheReference) {
  ProjectionsSpec s;
  s.name = "klctl-projections-stream";
  s.B = 2, s.T = 20, s.S = 24, s.H = 4, s.H_kv = 2, s.D = 8;
  s.options.set_causal(true);
  s.options.set_topk(3);
  s.options.set_want_row_kl(true);
  s.seed = 57;
  // A row of query side: (4 * 8 + 3 * 4 + 3) FP32 = 188 bytes.
  ExpectProjectionsMatchReference(
      MakeProjectionsRequest(s),
      {"--causal", "--topk=3", "--stream=always", "--block_bytes=564"},
      "stream");
}

TEST_F(KlctlTest, ProjectionsWithKeyBoundsAndOptionsMatchTheReference) {
  ProjectionsSpec s;
  s.name = "klctl-projections-documents";
  s.B = 1, s.T = 10, s.S = 10, s.H = 2, s.H_kv = 1, s.D = 8;
  s.documents = {6, 4};
  s.options.set_use_relu(false);
  s.options.set_index_weight_scale(0.5);
  s.options.set_softmax_scale(0.25f);
  s.options.set_flavor(v1::FLAVOR_MAXTEXT);
  s.options.set_want_row_kl(true);
  s.seed = 56;
  ExpectProjectionsMatchReference(
      MakeProjectionsRequest(s),
      {"--use_relu=false", "--index_weight_scale=0.5", "--softmax_scale=0.25",
       "--flavor=maxtext"});
}

TEST_F(KlctlTest, ProjectionsWithoutAProjectionIsRefusedByName) {
  ProjectionsSpec s;
  s.name = "klctl-projections-missing";
  const v1::ComputeLossRequest request = MakeProjectionsRequest(s);
  const CommandResult run =
      Klctl({"loss", "--query=" + Write("query", request.query()),
             "--key=" + Write("key", request.key()),
             "--index_query=" + Write("index_query", request.index_query()),
             "--index_key=" + Write("index_key", request.index_key())});
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "--index_weights: required"))
      << run.err;
}

TEST_F(KlctlTest, BadInputExitsNonZeroWithTheCodeName) {
  ProblemSpec s;
  s.name = "klctl-bad";
  s.B = 1, s.T = 3, s.S = 4, s.H = 0;
  s.seed = 53;
  v1::ComputeLossRequest request = MakeRequest(s);
  SetFloat(*request.mutable_indexer_scores(), 5, std::nanf(""));
  const CommandResult run = Klctl(
      {"loss",
       "--attention_weights=" + Write("weights", request.attention_weights()),
       "--indexer_scores=" + Write("scores", request.indexer_scores())});
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "INVALID_ARGUMENT")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "indexer_scores")) << run.err;
}

// An input in a type its flag does not take is refused before any call,
// named as NumPy names it, with the types the flag takes.
TEST_F(KlctlTest, InputOfAnotherTypeIsRefusedWithTheTypesItsFlagTakes) {
  ProblemSpec s;
  s.name = "klctl-descr";
  s.B = 1, s.T = 3, s.S = 4, s.H = 0;
  s.seed = 58;
  const v1::ComputeLossRequest request = MakeRequest(s);
  const std::string weights =
      "--attention_weights=" + Write("weights", request.attention_weights());
  // Elements of `bytes` each, shaped [1, 3, 4] like the scores.
  const auto raw = [](int bytes) {
    v1::Tensor t;
    for (int64_t dim : {1, 3, 4}) t.add_shape(dim);
    t.set_data(std::string(12 * bytes, '\0'));
    return t;
  };
  const std::string takes_float =
      "want float32 '<f4', float16 '<f2' or bfloat16 as '<u2'";
  const struct {
    std::string flag, descr;
    int bytes;
    std::vector<std::string> expected;
  } cases[] = {
      {"indexer_scores", "<f8", 8, {"'<f8' (float64)", takes_float}},
      {"indexer_scores", "|u1", 1, {"'|u1' (uint8)", takes_float}},
      // How NumPy saves an ml_dtypes.bfloat16 array.
      {"indexer_scores",
       "<V2",
       2,
       {"'<V2' (void16)", takes_float, ".view('<u2')"}},
      {"topk_indices", "<f4", 4, {"'<f4' (float32)", "want int32 '<i4'"}},
      {"key_padding_mask",
       "<f4",
       4,
       {"'<f4' (float32)", "want bool '|b1' or uint8 '|u1'"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"loss", weights};
    if (c.flag != "indexer_scores") {
      args.push_back("--indexer_scores=" +
                     Write("scores", request.indexer_scores()));
    }
    args.push_back(
        absl::StrCat("--", c.flag, "=", Write(c.flag, raw(c.bytes), c.descr)));
    const std::string what = c.flag + " " + c.descr;
    const CommandResult run = Klctl(args);
    EXPECT_EQ(run.exit_code, 1) << what << "\n" << run.out;
    EXPECT_EQ(run.out, "") << what;
    std::vector<std::string> expected = {"INVALID_ARGUMENT", "--" + c.flag};
    expected.insert(expected.end(), c.expected.begin(), c.expected.end());
    for (const std::string& text : expected) {
      EXPECT_TRUE(absl::StrContains(run.err, text))
          << what << ": " << text << " missing in\n"
          << run.err;
    }
    // The wire dtypes are the server's words, not the file's.
    EXPECT_FALSE(absl::StrContains(run.err, "FP64")) << run.err;
    EXPECT_FALSE(absl::StrContains(run.err, "BOOL")) << run.err;
  }
}

// --topk_out needs --query and --topk, and every output must be writable:
// refused before the call (nothing printed), naming the flag.
TEST_F(KlctlTest, OutputFlagsAreCheckedBeforeTheCall) {
  ProjectionsSpec p;
  p.name = "klctl-outputs";
  const v1::ComputeLossRequest projections = MakeProjectionsRequest(p);
  std::vector<std::string> projection_args = {"loss"};
  for (const RequestTensor& tensor : kRequestTensors) {
    if (const v1::Tensor* t = FindTensor(projections, tensor)) {
      const std::string name(tensor.name);
      projection_args.push_back(absl::StrCat("--", name, "=", Write(name, *t)));
    }
  }
  const std::string a_file = Write("a_file", projections.query());
  ProblemSpec s;
  s.name = "klctl-outputs-logits";
  s.B = 1, s.T = 3, s.S = 4, s.H = 0;
  s.seed = 59;
  const v1::ComputeLossRequest logits = MakeRequest(s);
  const std::string scores_file = Write("scores", logits.indexer_scores());
  const std::vector<std::string> logits_args = {
      "loss",
      "--attention_weights=" + Write("weights", logits.attention_weights()),
      "--indexer_scores=" + scores_file};
  // A directory of gradients whose d_index_key.npy is a directory: the
  // query's gradient was written before the key's failed.
  const std::string grads = dir_ + "/grads";
  const std::string key_grad = grads + "/d_index_key.npy";
  ASSERT_EQ(mkdir(grads.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(key_grad.c_str(), 0700), 0);

  const struct {
    bool projections;
    std::vector<std::string> flags;
    std::vector<std::string> expected;
  } cases[] = {
      {true,
       {"--topk_out=" + OutPath("topk")},
       {"INVALID_ARGUMENT", "--topk_out: needs --query and --topk"}},
      {false,
       {"--topk=2", "--topk_out=" + OutPath("topk")},
       {"INVALID_ARGUMENT", "--topk_out: needs --query and --topk"}},
      {false,
       {"--grad_out=" + dir_ + "/no_such_dir/grad.npy"},
       {"NOT_FOUND", "--grad_out: cannot write", "no_such_dir"}},
      {false, {"--row_kl_out=" + dir_}, {"--row_kl_out: cannot write"}},
      // With --query, --grad_out is a directory.
      {true, {"--grad_out=" + a_file}, {"--grad_out: ", "Not a directory"}},
      {true,
       {"--grad_out=" + a_file + "/grads"},
       {"--grad_out: ", "Not a directory"}},
      {true,
       {"--grad_out=" + grads},
       {"--grad_out: cannot write \"" + key_grad, "Is a directory"}},
      // An output over an input, or over another output.
      {false,
       {"--grad_out=" + scores_file},
       {"INVALID_ARGUMENT",
        "--grad_out: \"" + scores_file + "\" is the input --indexer_scores"}},
      {false,
       {"--grad_out=" + dir_ + "/../" + dir_.substr(dir_.rfind('/') + 1) +
        "/scores.npy"},
       {"is the input --indexer_scores"}},
      {false,
       {"--grad_out=" + OutPath("twice"), "--row_kl_out=" + OutPath("twice")},
       {"INVALID_ARGUMENT", "--grad_out, --row_kl_out: both would write"}},
      // A flag that had been taken and then ignored.
      {false,
       {"--use_relu=false"},
       {"INVALID_ARGUMENT", "options.use_relu: only in the projections form"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args =
        c.projections ? projection_args : logits_args;
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const CommandResult run = Klctl(args);
    const std::string what = absl::StrJoin(c.flags, " ");
    EXPECT_EQ(run.exit_code, 1) << what;
    EXPECT_EQ(run.out, "") << what;  // no loss: no call was made
    for (const std::string& text : c.expected) {
      EXPECT_TRUE(absl::StrContains(run.err, text))
          << what << ": " << text << " missing in\n"
          << run.err;
    }
  }
  // Nothing was written before the refusals.
  EXPECT_EQ(access((grads + "/d_index_query.npy").c_str(), F_OK), -1);
  EXPECT_EQ(rmdir(key_grad.c_str()), 0);
  EXPECT_EQ(rmdir(grads.c_str()), 0);
}

TEST_F(KlctlTest, LossPrintsARequestIdOnlyWhenThereIsOne) {
  std::vector<std::string> args = SmallLossArgs("klctl-request-id", 60);
  const CommandResult without = Klctl(args);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  EXPECT_TRUE(absl::StrContains(without.out, "loss: ")) << without.out;
  EXPECT_FALSE(absl::StrContains(without.out, "request_id")) << without.out;
  args.push_back("--request_id=r-7");
  const CommandResult with = Klctl(args);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  EXPECT_EQ(KeyValues(with.out)["request_id"], "r-7") << with.out;
}

// Outputs that are devices, not files, may be the same device.
TEST_F(KlctlTest, OutputsMayShareADevice) {
  std::vector<std::string> args = SmallLossArgs("klctl-devices", 63);
  args.push_back("--grad_out=/dev/null");
  args.push_back("--row_kl_out=/dev/null");
  const CommandResult run = Klctl(args);
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

// --recall_k alone had printed no recall: it prints the diagnostics.
TEST_F(KlctlTest, RecallKPrintsTheDiagnostics) {
  std::vector<std::string> recall = SmallLossArgs("klctl-recall", 62);
  recall.push_back("--recall_k=3");
  const CommandResult recalled = Klctl(recall);
  ASSERT_EQ(recalled.exit_code, 0) << recalled.err;
  EXPECT_TRUE(KeyValues(recalled.out).contains("topk_recall")) << recalled.out;
}

// A newline in --request_id printed a `loss:` line of the caller's choosing
// before the real one; bytes that are not UTF-8 in --run made the server
// refuse the whole message as unparsable, naming no flag.
TEST_F(KlctlTest, TextFlagsMustBeUtf8WithoutControlCharacters) {
  const std::vector<std::string> args = SmallLossArgs("klctl-text-flags", 61);
  for (const auto& [flag, words] :
       std::vector<std::pair<std::string, std::string>>{
           {"--request_id=a\nloss: 5",
            "--request_id: must have no control character, got "
            "\"a\\nloss: 5\""},
           {"--run=\xff", "--run: must be UTF-8, got \"\\xff\""},
           {"--run=\xed\xa0\x80", "--run: must be UTF-8"},  // a surrogate
           {"--run=\xc0\xaf", "--run: must be UTF-8"}}) {   // overlong '/'
    std::vector<std::string> with = args;
    with.push_back(flag);
    const CommandResult run = Klctl(with);
    EXPECT_EQ(run.exit_code, 1) << flag;
    EXPECT_EQ(run.out, "") << flag;
    EXPECT_TRUE(absl::StrContains(run.err, words)) << flag << "\n" << run.err;
  }
  std::vector<std::string> with = args;
  with.push_back("--request_id=r\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82");
  const CommandResult run = Klctl(with);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(KeyValues(run.out)["request_id"],
            "r\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82");
  const CommandResult finish = Klctl({"finish-step", "--run=\x01", "--step=1"});
  EXPECT_EQ(finish.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(finish.err, "--run: must have no control"))
      << finish.err;
}

TEST_F(KlctlTest, UnreachableServerExitsNonZeroWithUnavailable) {
  const int port = PickFreePort();
  const CommandResult run = RunCommand(
      {KLCTL_BIN, "health", absl::StrCat("--target=127.0.0.1:", port),
       "--deadline=5s", "--max_attempts=1"},
      absl::Seconds(20));
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "UNAVAILABLE")) << run.err;
}

// `klctl health --target=<target>` fails at once (well within a 60-s
// deadline), with `words` in its error.
// klctl health with `flags` exits 1 with `words` in its error, naming its
// own flags, never the library's options behind them.
void ExpectRefused(const std::vector<std::string>& flags,
                   const std::string& words) {
  std::vector<std::string> argv = {KLCTL_BIN, "health", "--deadline=60s"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const CommandResult run = RunCommand(argv, absl::Seconds(30));
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, words)) << run.err;
  EXPECT_FALSE(absl::StrContains(run.err, "ClientOptions")) << run.err;
}

void ExpectTargetRefused(const std::string& target, const std::string& words) {
  ExpectRefused({"--target=" + target}, words);
}

// gRPC would resolve "http://localhost:50051" as one DNS name, retrying
// until the deadline; the client refuses it before any call.
TEST(KlctlTargetTest, AUrlIsRefusedNamingTheTarget) {
  ExpectTargetRefused(
      "http://localhost:50051",
      "target: \"http://localhost:50051\" is a URL; gRPC takes host:port");
}

// A port alone ("50051") was resolved as a DNS name until the deadline too.
TEST(KlctlTargetTest, APortAloneIsRefusedWithTheTargetToGive) {
  ExpectTargetRefused("50051",
                      "target: \"50051\" is a port alone; gRPC takes "
                      "host:port (localhost:50051)");
}

// A host alone got gRPC's port (443 for a name, 0 for an address), and the
// error said nothing listens there, not that the port was missing.
TEST(KlctlTargetTest, AHostAloneIsRefusedWithTheTargetToGive) {
  for (const auto& [host, give] :
       std::vector<std::pair<std::string, std::string>>{
           {"localhost", "localhost:50051"},
           {"127.0.0.1", "127.0.0.1:50051"},
           {"[::1]", "[::1]:50051"},
           {"::1", "[::1]:50051"},
           {"dns:///localhost", "dns:///localhost:50051"},
           {"dns://8.8.8.8/klserve.example",
            "dns://8.8.8.8/klserve.example:50051"},
           {"localhost:", "localhost:50051"},
           {"[::1]:", "[::1]:50051"},
           {"fd00::", "[fd00::]:50051"}}) {
    ExpectTargetRefused(host,
                        absl::StrCat("target: \"", host,
                                     "\" has no port, and gRPC would "
                                     "not pick klserve's; give host:port (",
                                     give, " for"));
  }
}

// gRPC took a port past 65535 modulo 65536 (127.0.0.1:124587 reached a
// server on 59051), a negative one likewise and a word as port 0.
TEST(KlctlTargetTest, APortOutsideOneTo65535IsRefused) {
  for (const std::string port :
       {"124587", "65536", "0", "-7485", "abc", "59051/path", "5e4"}) {
    const std::string target = absl::StrCat("127.0.0.1:", port);
    ExpectTargetRefused(
        target, absl::StrCat("target: \"", target, "\" has port \"", port,
                             "\"; a port is a number from "
                             "1 to 65535"));
  }
  ExpectTargetRefused("[::1]:70000", "has port \"70000\"");
  ExpectTargetRefused("unix:", "target: \"unix:\" has no path");
  // gRPC resolves http and https after a name (a TLS proxy's 443).
  const CommandResult https =
      RunCommand({KLCTL_BIN, "health", "--target=localhost:https",
                  "--deadline=5s", "--max_attempts=1"},
                 absl::Seconds(30));
  EXPECT_FALSE(absl::StrContains(https.err, "has port")) << https.err;
  ExpectTargetRefused("dns:///localhost:99999", "has port \"99999\"");
}

// klctl's refusals of its connection flags name the flags, as typed, not
// the library's options behind them (ClientOptions.tls_ca_file is --tls_ca).
TEST(KlctlTargetTest, ConnectionFlagRefusalsNameTheFlags) {
  const std::string missing = ::testing::TempDir() + "/klctl_no_such.pem";
  const std::string target = "--target=127.0.0.1:1";
  ExpectRefused({target, "--tls_server_name=klserve"},
                "INVALID_ARGUMENT: --tls_cert, --tls_key, --tls_server_name: "
                "need --tls_ca");
  ExpectRefused({target, "--tls_ca=" + missing, "--tls_cert=" + missing},
                "INVALID_ARGUMENT: --tls_cert, --tls_key: set both or neither");
  ExpectRefused({target, "--tls_ca=" + missing},
                "INVALID_ARGUMENT: --tls_ca: cannot read \"" + missing + "\"");
  ExpectRefused({target, "--max_attempts=0"},
                "INVALID_ARGUMENT: --max_attempts: must be >= 1, got 0");
  ExpectRefused({target, "--deadline=0s"},
                "INVALID_ARGUMENT: --deadline: must be finite and > 0, got 0");
  ExpectTargetRefused("https://localhost:50051",
                      "(TLS is set by --tls_ca, not an https:// scheme)");
}

// Each worker is a thread and a connection: 100000 of them exhausted the
// open files of klctl and of the server; as many kernel threads ended klctl
// with an uncaught std::system_error.
TEST_F(KlctlTest, BenchThreadsPastTheirBoundAreRefusedByName) {
  for (const auto& [flag, words] :
       std::vector<std::pair<std::string, std::string>>{
           {"--concurrency=100000", "--concurrency must be in [1, 256]"},
           {"--concurrency=0", "--concurrency must be in [1, 256]"},
           {"--kernel_threads=100000",
            "--kernel_threads: must be in [0, 256], got 100000"},
           {"--kernel_threads=-1",
            "--kernel_threads: must be in [0, 256], got -1"}}) {
    const CommandResult run =
        Klctl({"bench", "--shape=1,16,16", "--kernel", "--count=2", flag});
    EXPECT_EQ(run.exit_code, 1) << flag << "\n" << run.err;
    EXPECT_TRUE(absl::StrContains(run.err, words)) << flag << "\n" << run.err;
  }
}

TEST_F(KlctlTest, BenchRunsBothModes) {
  const CommandResult run = Klctl({"bench", "--count=2", "--mode=both",
                                   "--shape=1,64,256", "--duration=20s"});
  ASSERT_EQ(run.exit_code, 0) << "stdout:\n"
                              << run.out << "\nstderr:\n"
                              << run.err;
  int gb_per_s = 0;
  for (absl::string_view line : absl::StrSplit(run.out, '\n')) {
    absl::string_view rest = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&rest, "gb_per_s:")) {
      ++gb_per_s;
      double value = -1;
      EXPECT_TRUE(absl::SimpleAtod(absl::StripAsciiWhitespace(rest), &value))
          << line;
      EXPECT_GT(value, 0) << line;
    }
  }
  EXPECT_EQ(gb_per_s, 2) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "mode: loss")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "mode: echo")) << run.out;
}

TEST_F(KlctlTest, BenchRunsTheProjectionsForm) {
  const CommandResult run =
      Klctl({"bench", "--form=projections", "--count=2", "--shape=1,64,64",
             "--heads=4", "--duration=20s"});
  ASSERT_EQ(run.exit_code, 0) << "stdout:\n"
                              << run.out << "\nstderr:\n"
                              << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "form=projections")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "transport: unary")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "requests: 2")) << run.out;
  const CommandResult streamed = Klctl(
      {"bench", "--form=projections", "--count=2", "--shape=1,64,64",
       "--heads=4", "--duration=20s", "--stream=always", "--block_bytes=4096"});
  ASSERT_EQ(streamed.exit_code, 0) << "stdout:\n"
                                   << streamed.out << "\nstderr:\n"
                                   << streamed.err;
  EXPECT_TRUE(absl::StrContains(streamed.out, "transport: stream"))
      << streamed.out;
  EXPECT_TRUE(absl::StrContains(streamed.out, "requests: 2")) << streamed.out;
}

// A problem whose inputs would not fit in memory is refused before they are
// made (it used to end klctl in std::bad_alloc), naming --shape, the bytes
// and the bound.
TEST(KlctlBenchTest, InputsPastTheMemoryBoundAreRefused) {
  const std::vector<std::string> shapes[] = {
      {"--shape=1,1000000,1000000"},
      {"--form=projections", "--shape=1,1000000000,1000000"},
      {"--shape=1000000000,1000000000,1000000000"},  // past 2^63 bytes
  };
  for (const std::vector<std::string>& flags : shapes) {
    std::vector<std::string> args = {KLCTL_BIN, "bench", "--target=127.0.0.1:1",
                                     "--duration=1s"};
    args.insert(args.end(), flags.begin(), flags.end());
    const CommandResult run = RunCommand(args, absl::Seconds(20));
    const std::string what = absl::StrJoin(flags, " ");
    EXPECT_EQ(run.exit_code, 1) << what << "\n" << run.err;
    EXPECT_EQ(run.out, "") << what;
    for (const char* text :
         {"INVALID_ARGUMENT", "--shape", " bytes, past the bound of ",
          "a quarter of the memory this process may use"}) {
      EXPECT_TRUE(absl::StrContains(run.err, text))
          << what << ": " << text << " missing in\n"
          << run.err;
    }
  }
  const CommandResult run =
      RunCommand({KLCTL_BIN, "bench", "--target=127.0.0.1:1",
                  "--shape=1,1000000,1000000", "--duration=1s"});
  EXPECT_TRUE(absl::StrContains(run.err, "would take 8000000000000 bytes"))
      << run.err;
}

// In a container the bound is a quarter of its memory limit, not of the
// machine's memory: a klctl under a 2 GiB limit that counted the machine's
// 24 GiB would make 1 GiB of inputs, and more per request, and be killed
// by the kernel instead of refusing. Run in a cgroup v1 memory group made
// for the test inside this process's own (so that it escapes no limit),
// where the machine lets it make one (root, cgroup v1).
TEST(KlctlBenchTest, TheMemoryBoundFollowsTheContainersLimit) {
  std::string own;  // this process's memory cgroup: "<id>:memory:<path>"
  {
    std::ifstream cgroups("/proc/self/cgroup");
    for (std::string line; std::getline(cgroups, line);) {
      const std::vector<std::string> fields =
          absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (fields.size() == 3 && fields[1] == "memory") own = fields[2];
    }
  }
  if (own.empty()) GTEST_SKIP() << "no cgroup v1 memory controller here";
  const std::string group =
      absl::StrCat("/sys/fs/cgroup/memory", own == "/" ? "" : own,
                   "/klserve-klctl-test-", getpid());
  if (mkdir(group.c_str(), 0755) != 0) {
    GTEST_SKIP() << "no cgroup v1 memory group can be made here: "
                 << strerror(errno);
  }
  struct RemoveGroup {
    std::string path;
    ~RemoveGroup() { rmdir(path.c_str()); }  // empty once klctl has exited
  } remove{group};
  {
    std::ofstream limit(group + "/memory.limit_in_bytes");
    limit << (int64_t{2} << 30);
    ASSERT_TRUE(limit.good());
  }
  const CommandResult run = RunCommand(
      {"/bin/sh", "-c",
       absl::StrCat("echo $$ > ", group, "/cgroup.procs && exec ", KLCTL_BIN,
                    " bench --target=127.0.0.1:1 --duration=1s "
                    "--shape=1,8192,16384")},
      absl::Seconds(20));
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_TRUE(absl::StrContains(
      run.err,
      "would take 1073741824 bytes, past the bound of 536870912 "
      "bytes (a quarter of the memory this process may use"))
      << run.err;
}

// Echo off on the server: the error alone, before the loss mode's run (it
// came after a whole run of it), and no block of zeros for either mode.
TEST(KlctlBenchTest, AModeThatFailsPrintsOnlyTheError) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const CommandResult run = RunCommand(
      {KLCTL_BIN, "bench", "--target=" + (*server)->target(), "--mode=both",
       "--count=1", "--shape=1,64,256", "--duration=20s"},
      absl::Seconds(40));
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "UNIMPLEMENTED")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "--enable_echo")) << run.err;
  EXPECT_FALSE(absl::StrContains(run.out, "mode: loss\n")) << run.out;
  EXPECT_FALSE(absl::StrContains(run.out, "mode: echo")) << run.out;
  EXPECT_FALSE(absl::StrContains(run.out, "requests: 0")) << run.out;
}

// More workers than the server has slots: its refusals are load, which the
// benchmark retries and reports, rather than a failure that ends the run.
TEST(KlctlBenchTest, RefusalsPastTheServersLimitAreRetried) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_concurrent_requests=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  const CommandResult run = RunCommand(
      {KLCTL_BIN, "bench", "--target=" + (*server)->target(), "--concurrency=6",
       "--count=60", "--stream=never", "--shape=1,64,256", "--duration=20s"},
      absl::Seconds(40));
  ASSERT_EQ(run.exit_code, 0) << "stdout:\n"
                              << run.out << "\nstderr:\n"
                              << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "requests: 60")) << run.out;
}

// The text of --help about --`flag`, from "--flag (" to the end of its
// "default: ...;", its lines joined.
std::string FlagHelp(const std::string& help, const std::string& flag) {
  const size_t begin = help.find("--" + flag + " (");
  if (begin == std::string::npos) return "";
  const size_t end = help.find(';', help.find("default: ", begin));
  return absl::StrJoin(
      absl::StrSplit(help.substr(begin, end + 1 - begin),
                     absl::ByAnyChar(" \n"), absl::SkipEmpty()),
      " ");
}

// --help exits 0, as klserve's does, and names klctl.cc by its path in the
// repository, not the checkout's; each flag says what it defaults to.
TEST(KlctlHelpTest, HelpExitsZeroAndNamesTheFileInTheRepository) {
  const CommandResult run = RunCommand({KLCTL_BIN, "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "Flags from client/klctl.cc:"))
      << run.out;
  // This test's source is in the checkout klctl was built from.
  const absl::string_view source = __FILE__;
  const std::string checkout(
      source.substr(0, source.rfind("tests/integration/")));
  EXPECT_FALSE(absl::StrContains(run.out, checkout + "client/")) << run.out;

  EXPECT_FALSE(absl::StrContains(run.out, "default: ;")) << run.out;
  const std::string query = FlagHelp(run.out, "query");
  EXPECT_TRUE(absl::StrContains(query, "selects the projections form"))
      << query;
  EXPECT_FALSE(absl::StrContains(query, "required with --query")) << query;
  for (const char* flag : {"scaling_factor", "grad_scale", "softmax_scale"}) {
    EXPECT_TRUE(absl::StrContains(FlagHelp(run.out, flag), "default: 1;"))
        << FlagHelp(run.out, flag);
  }
  for (const char* flag :
       {"step", "layer", "microbatch", "q_offset", "index_weight_scale"}) {
    const std::string help = FlagHelp(run.out, flag);
    EXPECT_TRUE(absl::StrContains(help, "; unset")) << help;
    EXPECT_TRUE(absl::StrContains(help, "default: unset;")) << help;
  }
  EXPECT_TRUE(absl::StrContains(FlagHelp(run.out, "shape"),
                                "quarter of the memory klctl may use"))
      << FlagHelp(run.out, "shape");
}

// "unset" (or nothing) leaves a number unset; a number is a number.
TEST(KlctlHelpTest, UnsetNumbersParse) {
  const CommandResult unset =
      RunCommand({KLCTL_BIN, "finish-step", "--run=r", "--step=unset"});
  EXPECT_EQ(unset.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unset.err, "needs --run and --step"))
      << unset.err;
  const CommandResult set =
      RunCommand({KLCTL_BIN, "finish-step", "--run=r", "--step=12",
                  "--target=127.0.0.1:1", "--deadline=5s", "--max_attempts=1"});
  EXPECT_EQ(set.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(set.err, "UNAVAILABLE")) << set.err;
  const CommandResult bad =
      RunCommand({KLCTL_BIN, "finish-step", "--run=r", "--step=seven"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad.err, "'step'")) << bad.err;
}

// The key of the region klctl bench reports ("region: /dev/shm/<key>,
// ..."), or "" when it reports none.
std::string ReportedRegionKey(const std::string& out) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::ConsumePrefix(&line, "region: /dev/shm/")) {
      return std::string(line.substr(0, line.find(',')));
    }
  }
  return "";
}

bool ShmObjectExists(const std::string& key) {
  return access(("/dev/shm/" + key).c_str(), F_OK) == 0;
}

// bench --transport=both --kernel over a Unix socket: the kernel alone, the
// tensors in a shared-memory region, then inline, with the table of their
// latencies; the region unregistered and its object gone afterwards.
class KlctlShmBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/klserve_klctl_shm_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/klserve.sock";
  }
  void TearDown() override {
    server_.reset();  // SIGKILLs it if still running
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  void Start(const std::vector<std::string>& flags) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags, absl::Seconds(20), ClientOptions(),
                             {.loopback = false, .sockets = {socket_}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_EQ(server_->target(), "unix:" + socket_);
  }

  CommandResult Bench(std::vector<std::string> flags) {
    std::vector<std::string> args = {KLCTL_BIN, "bench",
                                     "--target=unix:" + socket_,
                                     "--deadline=30s", "--max_attempts=1"};
    args.insert(args.end(), flags.begin(), flags.end());
    return RunCommand(args, absl::Seconds(60));
  }

  std::string dir_, socket_;
  std::unique_ptr<ServerProcess> server_;
};

// klctl stopped by Ctrl-C (or SIGTERM) in the middle of a shared-memory
// bench left its region's file, its pages in memory, in /dev/shm.
TEST_F(KlctlShmBenchTest, AnInterruptedRunLeavesNoFileInDevShm) {
  ASSERT_NO_FATAL_FAILURE(Start({"--shared_memory"}));
  for (const char* signal_name : {"INT", "TERM"}) {
    std::vector<std::string> args = {"/usr/bin/timeout",
                                     "-s",
                                     signal_name,
                                     "8",
                                     KLCTL_BIN,
                                     "bench",
                                     "--target=unix:" + socket_,
                                     "--shape=1,16,16",
                                     "--transport=shm",
                                     "--duration=60s"};
    const CommandResult run = RunCommand(args, absl::Seconds(30));
    EXPECT_EQ(run.exit_code, 124) << run.out << run.err;  // timeout's own
    const size_t at = run.out.find("region: /dev/shm/");
    ASSERT_NE(at, std::string::npos) << run.out;
    const size_t end = run.out.find(',', at);
    const std::string path = run.out.substr(at + 8, end - at - 8);
    EXPECT_NE(access(path.c_str(), F_OK), 0) << signal_name << ": " << path;
  }
}

TEST_F(KlctlShmBenchTest, ShmNextToInlineAndTheKernel) {
  ASSERT_NO_FATAL_FAILURE(Start({"--shared_memory"}));
  const CommandResult info = RunCommand(
      {KLCTL_BIN, "info", "--target=unix:" + socket_, "--max_attempts=1"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(KeyValues(info.out)["shared_memory"], "true") << info.out;
  const CommandResult run = Bench({"--transport=both", "--kernel", "--count=3",
                                   "--shape=1,64,256", "--duration=20s"});
  ASSERT_EQ(run.exit_code, 0) << "stdout:\n"
                              << run.out << "\nstderr:\n"
                              << run.err;
  for (const char* expected :
       {"kernel_threads: 2", "mode: kernel", "mode: loss_shm", "mode: loss\n",
        "p50_ms: kernel=", "shm_over_kernel: ", "inline_over_kernel: "}) {
    EXPECT_TRUE(absl::StrContains(run.out, expected))
        << expected << " missing in\n"
        << run.out;
  }
  int requests = 0;
  for (absl::string_view line : absl::StrSplit(run.out, '\n')) {
    if (absl::StripAsciiWhitespace(line) == "requests: 3") ++requests;
  }
  EXPECT_EQ(requests, 3) << run.out;  // each of kernel, shm, inline

  const std::string key = ReportedRegionKey(run.out);
  ASSERT_FALSE(key.empty()) << run.out;
  EXPECT_FALSE(ShmObjectExists(key)) << key;
  std::unique_ptr<Client> client = MakeClient(server_->target());
  absl::StatusOr<v1::ListRegionsResponse> regions = client->ListRegions();
  ASSERT_TRUE(regions.ok()) << Describe(regions.status());
  EXPECT_EQ(regions->regions_size(), 0);
}

TEST_F(KlctlShmBenchTest, ShmWithConcurrentWorkers) {
  ASSERT_NO_FATAL_FAILURE(Start({"--shared_memory"}));
  const CommandResult run =
      Bench({"--transport=shm", "--concurrency=3", "--count=6",
             "--shape=2,32,128", "--grad_dtype=bf16", "--duration=20s"});
  ASSERT_EQ(run.exit_code, 0) << "stdout:\n"
                              << run.out << "\nstderr:\n"
                              << run.err;
  EXPECT_TRUE(absl::StrContains(run.out, "mode: loss_shm")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "requests: 6")) << run.out;
  EXPECT_TRUE(absl::StrContains(run.out, "outputs of 3 workers")) << run.out;
  EXPECT_FALSE(absl::StrContains(run.out, "mode: loss\n")) << run.out;
}

TEST_F(KlctlShmBenchTest, ServerWithoutSharedMemory) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const CommandResult run =
      Bench({"--transport=shm", "--count=1", "--shape=1,8,16"});
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "UNIMPLEMENTED")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "--shared_memory")) << run.err;
  // The region klctl made is gone all the same.
  const std::string key = ReportedRegionKey(run.out);
  ASSERT_FALSE(key.empty()) << run.out;
  EXPECT_FALSE(ShmObjectExists(key)) << key;
}

TEST_F(KlctlShmBenchTest, ShmIsForUnaryCalls) {
  ASSERT_NO_FATAL_FAILURE(Start({"--shared_memory"}));
  const CommandResult run = Bench({"--transport=shm", "--stream=always"});
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_TRUE(absl::StrContains(run.err, "INVALID_ARGUMENT")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "--stream=always")) << run.err;
  const CommandResult bad = Bench({"--transport=pigeon"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad.err, "--transport")) << bad.err;
}

}  // namespace
}  // namespace klserve::integration
