// IdleMemoryRelease's policy against scripted call activity: after which
// samples it releases, and after which it must not.

#include "server/service/idle_memory_release.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace klserve::server {
namespace {

using Activity = OpenCalls::Activity;

// Runs a release whose k-th sample of the activity is `script(k)` until it
// has taken `samples` samples and one more (a release follows its sample at
// once, before the next), and returns the index of the sample after which
// each release came, below `samples`.
std::vector<int64_t> ReleasesAfter(std::function<Activity(int64_t)> script,
                                   int64_t samples) {
  struct Progress {
    absl::Mutex mu;
    int64_t taken = 0;
    int64_t wanted = 0;
    std::vector<int64_t> releases;
  } progress;
  progress.wanted = samples + 1;
  {
    IdleMemoryRelease release(
        absl::Milliseconds(2),
        [&] {
          absl::MutexLock lock(&progress.mu);
          return script(progress.taken++);
        },
        [&] {
          absl::MutexLock lock(&progress.mu);
          progress.releases.push_back(progress.taken - 1);
        });
    absl::MutexLock lock(&progress.mu);
    progress.mu.Await(absl::Condition(
        +[](Progress* p) { return p->taken >= p->wanted; }, &progress));
  }  // stopped: no sample after this
  std::vector<int64_t> within;
  for (int64_t k : progress.releases) {
    if (k < samples) within.push_back(k);
  }
  return within;
}

TEST(IdleMemoryRelease, IdleItReleasesAfterEverySampleLikeTheLast) {
  // Idle from the start: what gRPC received for a call it refused before the
  // service saw it is given back too, though no call has ended.
  EXPECT_EQ(ReleasesAfter(
                [](int64_t) {
                  return Activity{0, 0};
                },
                6),
            (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(IdleMemoryRelease, AfterACallEndsItWaitsForOneSampleAlike) {
  // Samples 0-1 see a call open; 2 sees it ended; 3 on are alike.
  EXPECT_EQ(ReleasesAfter(
                [](int64_t k) {
                  return k < 2 ? Activity{1, 0} : Activity{0, 1};
                },
                6),
            (std::vector<int64_t>{3, 4, 5}));
}

TEST(IdleMemoryRelease, NeverWhileACallIsOpen) {
  // A stream open for good, after other calls ended.
  EXPECT_EQ(ReleasesAfter(
                [](int64_t) {
                  return Activity{1, 5};
                },
                10),
            std::vector<int64_t>{});
}

TEST(IdleMemoryRelease, NeverWhileCallsKeepEnding) {
  // One more call ended at each sample: a job calling faster than the
  // period, never idle for a whole one though no call is open when it looks.
  // Its buffers stay warm.
  EXPECT_EQ(ReleasesAfter(
                [](int64_t k) {
                  return Activity{0, k};
                },
                10),
            std::vector<int64_t>{});
}

}  // namespace
}  // namespace klserve::server
