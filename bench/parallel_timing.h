#ifndef KLSERVE_BENCH_PARALLEL_TIMING_H_
#define KLSERVE_BENCH_PARALLEL_TIMING_H_

#include <algorithm>
#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

namespace klserve::bench {

// Runs body(i) for i in [0, threads) on `threads` threads, `reps` times, and
// returns the fastest repetition's wall time in seconds: from the first
// thread's start to the last thread's end, each read by the workers
// themselves (a coordinating thread may wake late on 2 cores, which would
// make a repetition look shorter than it was). The threads are made once, so
// thread start-up is not timed.
template <typename Body>
double BestParallelSeconds(int threads, int reps, const Body& body) {
  std::barrier sync(threads);
  std::vector<std::chrono::steady_clock::time_point> starts(threads),
      ends(threads);
  double best = 1e300;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      for (int r = 0; r < reps; ++r) {
        sync.arrive_and_wait();
        starts[i] = std::chrono::steady_clock::now();
        body(i);
        ends[i] = std::chrono::steady_clock::now();
        sync.arrive_and_wait();
        if (i == 0) {
          const auto first = *std::min_element(starts.begin(), starts.end());
          const auto last = *std::max_element(ends.begin(), ends.end());
          best = std::min(best,
                          std::chrono::duration<double>(last - first).count());
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return best;
}

}  // namespace klserve::bench

#endif  // KLSERVE_BENCH_PARALLEL_TIMING_H_
