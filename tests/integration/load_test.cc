// Load: several concurrent clients send a mix of valid requests (unary and
// streamed; dense and sparse; FP32, BF16 and FP16) and invalid ones (NaN,
// wrong byte sizes, unknown dtypes) for a bounded count and time. The server
// never dies, every valid answer equals the in-process library bit for bit,
// every invalid one is INVALID_ARGUMENT, and the server's RSS stays flat
// between the end of a warm-up phase and the end of the run.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

constexpr int kClients = 8;
constexpr int kWarmupPerClient = 50;
constexpr int kRequestsPerClient = 600;
constexpr absl::Duration kTimeCap = absl::Seconds(20);

std::vector<ProblemSpec> LoadSpecs() {
  std::vector<ProblemSpec> specs;
  {
    ProblemSpec s;
    s.name = "DensePerHeadFp32Causal";
    s.B = 2, s.T = 5, s.S = 11, s.H = 3;
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.seed = 101;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DensePerHeadBf16Masked";
    s.B = 2, s.T = 7, s.S = 9, s.H = 2;
    s.target_dtype = s.scores_dtype = "BF16";
    s.attention_mask = true;
    s.neg_inf_at_masked = true;
    s.options.set_flavor(v1::FLAVOR_MAXTEXT);
    s.options.set_reduction(v1::REDUCTION_SUM);
    s.options.set_grad_dtype("BF16");
    s.seed = 102;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DenseAggregatedFp16MeanValid";
    s.B = 3, s.T = 4, s.S = 13, s.H = 0;
    s.target_dtype = s.scores_dtype = "FP16";
    s.row_valid = true;
    s.key_padding = true;
    s.zero_target_rows = true;
    s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
    s.options.set_grad_dtype("FP16");
    s.options.set_want_row_kl(true);
    s.seed = 103;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparsePerHeadSegments";
    s.B = 2, s.T = 6, s.S = 40, s.K = 8, s.H = 2;
    s.scores_dtype = "BF16";
    s.segments = true;
    s.options.set_want_diagnostics(true);
    s.seed = 104;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparseAggregatedMeanValid";
    s.B = 1, s.T = 9, s.S = 30, s.K = 5, s.H = 0;
    s.target_dtype = "BF16";
    s.row_valid = true;
    s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
    s.options.set_want_row_kl(true);
    s.seed = 105;
    specs.push_back(s);
  }
  return specs;
}

struct Case {
  v1::ComputeLossRequest request;
  v1::ComputeLossResponse expected;
};

enum class Kind {
  kUnary,
  kStreamed,
  kNaN,
  kNaNStreamed,
  kWrongSize,
  kBadDtype
};
constexpr int kKinds = 6;

class LoadTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"--max_concurrent_requests=8"}));
    for (const ProblemSpec& spec : LoadSpecs()) {
      Case c;
      c.request = MakeRequest(spec);
      absl::StatusOr<v1::ComputeLossResponse> expected =
          LibraryCompute(c.request);
      ASSERT_TRUE(expected.ok()) << spec.name << ": " << expected.status();
      c.expected = *std::move(expected);
      cases_.push_back(std::move(c));
    }
  }

  // One request of kind `kind` on case `c`; records failures.
  void SendOne(Client& client, int thread, int i) {
    const Case& c = cases_[(thread + i) % cases_.size()];
    const Kind kind = static_cast<Kind>((thread * 7 + i) % kKinds);
    v1::ComputeLossRequest request = c.request;
    request.set_request_id(absl::StrCat("load-", thread, "-", i));
    const std::string what =
        absl::StrCat(request.request_id(), " kind ", static_cast<int>(kind));
    absl::StatusOr<v1::ComputeLossResponse> response;
    bool valid = false;
    switch (kind) {
      case Kind::kUnary:
        valid = true;
        response = client.ComputeLossUnary(request);
        break;
      case Kind::kStreamed:
        valid = true;
        response = client.ComputeLossStreaming(request, 1 + i % 3);
        break;
      case Kind::kNaN:
      case Kind::kNaNStreamed: {
        // Every element NaN: at least one sits at a position that counts.
        const int64_t n = request.indexer_scores().data().size() /
                          (request.indexer_scores().dtype() == "FP32" ? 4 : 2);
        for (int64_t k = 0; k < n; ++k) {
          SetFloat(*request.mutable_indexer_scores(), k,
                   std::numeric_limits<float>::quiet_NaN());
        }
        response = kind == Kind::kNaN ? client.ComputeLossUnary(request)
                                      : client.ComputeLossStreaming(request);
        break;
      }
      case Kind::kWrongSize:
        request.mutable_indexer_scores()->mutable_data()->append(2, '\0');
        response = client.ComputeLossUnary(request);
        break;
      case Kind::kBadDtype:
        request.mutable_indexer_scores()->set_dtype("FLOAT32");
        response = client.ComputeLossUnary(request);
        break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (valid) {
      if (!response.ok()) {
        ++failures_;
        ADD_FAILURE() << what << ": " << Describe(response.status());
        return;
      }
      v1::ComputeLossResponse expected = c.expected;
      expected.set_request_id(request.request_id());
      ::testing::AssertionResult same = SameResponse(expected, *response);
      if (!same) {
        ++failures_;
        ADD_FAILURE() << what << ": " << same.message();
      }
    } else if (response.status().code() != absl::StatusCode::kInvalidArgument) {
      ++failures_;
      ADD_FAILURE() << what << ": wanted INVALID_ARGUMENT, got "
                    << (response.ok() ? std::string("OK")
                                      : Describe(response.status()));
    }
  }

  // Runs `per_client` requests on each of kClients threads, stopping at
  // `until`.
  void Phase(int first, int per_client, absl::Time until) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kClients; ++t) {
      threads.emplace_back([this, t, first, per_client, until] {
        std::unique_ptr<Client> client = MakeClient(server().target());
        for (int i = first; i < first + per_client; ++i) {
          if (absl::Now() > until || failures_.load() > 20) return;
          SendOne(*client, t, i);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }

  std::vector<Case> cases_;
  std::mutex mu_;
  int done_ = 0;
  std::atomic<int> failures_{0};
};

TEST_F(LoadTest, MixedConcurrentRequestsStayCorrectAndRssStaysFlat) {
  const absl::Time start = absl::Now();
  const absl::Time until = start + kTimeCap;
  Phase(0, kWarmupPerClient, until);
  ASSERT_TRUE(server().Running()) << server().Log();
  absl::StatusOr<int64_t> warm = server().RssKiB();
  ASSERT_TRUE(warm.ok()) << warm.status();

  Phase(kWarmupPerClient, kRequestsPerClient, until);
  ASSERT_TRUE(server().Running()) << server().Log();
  absl::StatusOr<int64_t> end = server().RssKiB();
  ASSERT_TRUE(end.ok()) << end.status();
  // The server still answers after the load.
  absl::StatusOr<bool> serving = client().Health();
  ASSERT_TRUE(serving.ok() && *serving) << Describe(serving.status());

  const int64_t growth = *end - *warm;
  EXPECT_LT(growth, 64 * 1024)
      << "RSS grew " << growth << " KiB (" << *warm << " -> " << *end << ")";
  EXPECT_LT(growth, *warm / 4)
      << "RSS grew " << growth << " KiB (" << *warm << " -> " << *end << ")";
  // Most of the requests ran within the time cap.
  EXPECT_GE(done_, kClients * (kWarmupPerClient + kRequestsPerClient / 2))
      << "only " << done_ << " requests in " << (absl::Now() - start);
  std::cout << done_ << " requests in " << (absl::Now() - start) << "; RSS "
            << *warm << " -> " << *end << " KiB\n";
}

}  // namespace
}  // namespace klserve::integration
