// cpu::ThreadPool: the pool's threads alone run the tasks, so that --threads
// bounds the threads that compute and grow thread-local scratch whatever
// the number of callers; each thread that ran tasks of a job runs its
// `finish` before ParallelFor returns; and callers' jobs take turns.

#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace klserve::cpu {
namespace {

TEST(ThreadPool, TasksRunOnThePoolsThreadsAloneAndEachFinishes) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  absl::Mutex mu;
  std::set<std::thread::id> ran, finished;
  std::vector<int> done(100, 0);
  pool.ParallelFor(
      100,
      [&](int64_t i) {
        absl::MutexLock lock(&mu);
        ran.insert(std::this_thread::get_id());
        ++done[i];
      },
      [&] {
        absl::MutexLock lock(&mu);
        finished.insert(std::this_thread::get_id());
      });
  EXPECT_EQ(ran.count(std::this_thread::get_id()), 0u);
  EXPECT_LE(ran.size(), 3u);
  EXPECT_EQ(finished, ran);  // each ran thread finished, before the return
  for (int i = 0; i < 100; ++i) EXPECT_EQ(done[i], 1) << i;
  // One task too goes to the pool.
  std::thread::id one;
  pool.ParallelFor(
      1, [&](int64_t) { one = std::this_thread::get_id(); }, [] {});
  EXPECT_NE(one, std::this_thread::get_id());
}

TEST(ThreadPool, MoreCallersThanThreadsAllFinish) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum = 0;
  std::vector<std::thread> callers;
  for (int c = 0; c < 16; ++c) {
    callers.emplace_back([&] {
      pool.ParallelFor(
          50, [&](int64_t i) { sum += i; }, [] {});
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(sum.load(), 16 * (49 * 50 / 2));
}

// With one thread, a job that arrives while another runs has its task run
// after at most the running job's next (which took its turn as the first
// task ran): jobs take turns, so a short call is not held behind a long
// one.
TEST(ThreadPool, ALaterJobIsNotHeldBehindALongOne) {
  ThreadPool pool(1);
  absl::Mutex mu;
  std::vector<std::string> order;
  std::thread later;
  pool.ParallelFor(
      5,
      [&](int64_t i) {
        {
          absl::MutexLock lock(&mu);
          order.push_back("long" + std::to_string(i));
        }
        if (i == 0) {
          later = std::thread([&] {
            pool.ParallelFor(
                1,
                [&](int64_t) {
                  absl::MutexLock lock(&mu);
                  order.push_back("short");
                },
                [] {});
          });
          // Time for the later caller to queue its job.
          absl::SleepFor(absl::Seconds(1));
        }
      },
      [] {});
  later.join();
  EXPECT_EQ(order, (std::vector<std::string>{"long0", "long1", "short", "long2",
                                             "long3", "long4"}));
}

}  // namespace
}  // namespace klserve::cpu
