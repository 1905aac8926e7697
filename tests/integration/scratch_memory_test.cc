// The server's memory around requests that need much scratch: the sparse
// index check takes memory of the row's slots, not of num_keys (it once
// allocated 8 bytes per key in every compute thread, for good), what a
// wide request grows goes back once it is answered, and its messages'
// buffers once the server has been idle for --release_memory_after_idle.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

class ScratchMemoryTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  int64_t RssKiB() {
    absl::StatusOr<int64_t> rss = server().RssKiB();
    EXPECT_TRUE(rss.ok()) << rss.status();
    return rss.value_or(0);
  }

  // Sends `request` and expects `expected` back, bit for bit.
  void ExpectAnswer(const v1::ComputeLossRequest& request,
                    const v1::ComputeLossResponse& expected) {
    absl::StatusOr<v1::ComputeLossResponse> response =
        client().ComputeLoss(request);
    ASSERT_TRUE(response.ok()) << Describe(response.status());
    EXPECT_TRUE(SameResponse(expected, *response));
  }
};

void SetKeys(v1::ComputeLossRequest& request,
             const std::vector<int32_t>& keys) {
  request.mutable_topk_indices()->set_data(
      std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * 4));
}

// A sparse [1, 1, 4] row over 8 keys, which the library computes in-process.
v1::ComputeLossRequest FourSlots() {
  ProblemSpec spec;
  spec.name = "four-slots";
  spec.B = 1, spec.T = 1, spec.S = 8, spec.H = 0, spec.K = 4;
  spec.empty_slots = false;
  spec.seed = 21;
  v1::ComputeLossRequest request = MakeRequest(spec);
  SetKeys(request, {5, 0, 7, -1});
  return request;
}

TEST_F(ScratchMemoryTest, SparseRowsOverHugeNumKeysAddNoRss) {
  const v1::ComputeLossRequest small = FourSlots();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(small);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ExpectAnswer(small, *expected);  // warm
  const int64_t start = RssKiB();
  for (int64_t num_keys :
       {int64_t{1} << 28, int64_t{std::numeric_limits<int32_t>::max()}}) {
    SCOPED_TRACE(num_keys);
    // Without causal or masks only the keys' validity matters: this is the
    // small row's problem with its keys renamed.
    v1::ComputeLossRequest huge = small;
    huge.mutable_options()->set_num_keys(num_keys);
    SetKeys(huge, {static_cast<int32_t>(num_keys - 1), 0, 123456, -1});
    ExpectAnswer(huge, *expected);
    const int64_t rss = RssKiB();
    RecordProperty("rss_kib_after_num_keys_" + std::to_string(num_keys),
                   std::to_string(rss));
    // A table of num_keys entries per thread was 2 GiB at 2^28.
    EXPECT_LT(rss - start, 64 * 1024)
        << "VmRSS " << start << " KiB before, " << rss << " KiB after";
  }
}

TEST_F(ScratchMemoryTest, WideRequestsRssComesBack) {
  // Two dense BF16 rows of 3 Mi keys: 24 MiB of input and 12 MiB of
  // gradient, and 123 MiB of scratch in each of the two compute threads
  // while they run. tcmalloc keeps the messages' memory for the next request
  // (its policy); the scratch must go back to the OS.
  ProblemSpec spec;
  spec.name = "wide";
  spec.B = 1, spec.T = 2, spec.S = int64_t{3} << 20, spec.H = 0;
  spec.target_dtype = spec.scores_dtype = "BF16";
  spec.options.set_grad_dtype("BF16");
  spec.options.set_want_row_kl(true);
  const v1::ComputeLossRequest wide = MakeRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(wide);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const v1::ComputeLossRequest small = FourSlots();
  absl::StatusOr<v1::ComputeLossResponse> small_expected =
      LibraryCompute(small);
  ASSERT_TRUE(small_expected.ok()) << small_expected.status();

  ExpectAnswer(small, *small_expected);  // warm
  const int64_t start = RssKiB();
  ExpectAnswer(wide, *expected);
  ExpectAnswer(small, *small_expected);
  absl::SleepFor(absl::Milliseconds(100));
  const int64_t end = RssKiB();
  RecordProperty("rss_kib_before_wide", std::to_string(start));
  RecordProperty("rss_kib_after_wide", std::to_string(end));
  EXPECT_LT(end - start, 64 * 1024)
      << "VmRSS " << start << " KiB before the wide request, " << end
      << " KiB after";
}

class IdleMemoryTest : public ServerTest {
 protected:
  static constexpr absl::Duration kIdle = absl::Milliseconds(300);
  void SetUp() override {
    StartServer({"--release_memory_after_idle=" + absl::FormatDuration(kIdle)});
  }
};

TEST_F(IdleMemoryTest, RssOfAWideRequestsMessagesGoesBackOnceIdle) {
  // 64 MiB of weights and 64 MiB of scores in, 64 MiB of gradient out: the
  // allocator keeps some of those buffers for the next call (92 MiB when
  // this test ran with --release_memory_after_idle=0) until the server has
  // been idle.
  ProblemSpec spec;
  spec.name = "wide-messages";
  spec.B = 1, spec.T = 4, spec.S = int64_t{4} << 20, spec.H = 0;
  const v1::ComputeLossRequest wide = MakeRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(wide);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const v1::ComputeLossRequest small = FourSlots();
  ASSERT_TRUE(client().ComputeLoss(small).ok());  // warm
  absl::SleepFor(3 * kIdle);
  const int64_t start = server().RssKiB().value_or(0);

  absl::StatusOr<v1::ComputeLossResponse> response = client().ComputeLoss(wide);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  EXPECT_TRUE(SameResponse(*expected, *response));
  const int64_t answered = server().RssKiB().value_or(0);
  RecordProperty("rss_kib_before", std::to_string(start));
  RecordProperty("rss_kib_answered", std::to_string(answered));

  // Released between one and two idle periods after the call; the rest is
  // slack for a loaded machine.
  int64_t rss = answered;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       rss - start >= 32 * 1024 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
    rss = server().RssKiB().value_or(0);
  }
  RecordProperty("rss_kib_idle", std::to_string(rss));
  EXPECT_LT(rss - start, 32 * 1024)
      << "VmRSS " << start << " KiB before the wide request, " << answered
      << " KiB once answered, " << rss << " KiB idle";
}

}  // namespace
}  // namespace klserve::integration
