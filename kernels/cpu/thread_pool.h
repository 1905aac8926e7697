#ifndef KLSERVE_KERNELS_CPU_THREAD_POOL_H_
#define KLSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace klserve::cpu {

// A fixed set of threads created once. ParallelFor runs tasks 0..n-1 on the
// pool's threads and returns when all are done. Several threads may call
// ParallelFor at once (a server's calls, each on a thread of its own); their
// tasks share the workers, and a caller only waits. So at most num_threads
// threads compute, however many calls there are, and only they grow the
// thread-local scratch that --max_thread_scratch_bytes bounds per thread.
class ThreadPool {
 public:
  // num_threads <= 0 means one per CPU this process may use (UsableCpus:
  // its affinity and its cgroup's quota).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }

  // Runs task(0..n-1). The jobs of several callers take turns, a task at a
  // time, so that a short one is not held behind a long one. `finish` runs
  // on a thread each time it leaves the job (the job has no task left for
  // it, or another job's turn has come), before ParallelFor returns: the
  // point where that thread may drop what the tasks grew in its
  // thread-local state.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> task,
                   absl::FunctionRef<void()> finish);

 private:
  struct Job {
    absl::FunctionRef<void(int64_t)> task;
    absl::FunctionRef<void()> finish;
    int64_t n;
    int64_t next = 0;      // next task index to hand out
    int64_t finished = 0;  // tasks completed
  };

  void WorkerLoop();
  // Runs tasks of `job`, the front of jobs_, while it stays this thread's
  // turn. Called with mu_ held; drops it while a task runs.
  void RunTasks(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<Job*> jobs_ ABSL_GUARDED_BY(mu_);  // jobs with tasks to hand out
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_THREAD_POOL_H_
