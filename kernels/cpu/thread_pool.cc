#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#include "kernels/cpu/usable_cpus.h"

namespace klserve::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = UsableCpus();
  workers_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunTasks(Job& job) {
  while (job.next < job.n) {
    const int64_t index = job.next++;
    if (job.next == job.n) {
      // Nothing left to hand out: stop offering the job to other workers.
      jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
    }
    mu_.Unlock();
    job.task(index);
    mu_.Lock();
    if (job.next == job.n) {
      // This thread gets no more of the job's tasks. Before the count below
      // lets ParallelFor return: the job lives on its caller's stack.
      mu_.Unlock();
      job.finish();
      mu_.Lock();
    }
    ++job.finished;
  }
}

void ThreadPool::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](ThreadPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return pool->stopping_ || !pool->jobs_.empty();
        },
        this));
    if (jobs_.empty()) return;  // stopping and nothing left
    RunTasks(*jobs_.front());
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> task,
                             absl::FunctionRef<void()> finish) {
  if (n <= 0) return;
  Job job{task, finish, n};
  absl::MutexLock lock(&mu_);
  jobs_.push_back(&job);
  // The workers run the tasks; the job lives on our stack until they are
  // done.
  mu_.Await(absl::Condition(
      +[](Job* j) { return j->finished == j->n; }, &job));
}

}  // namespace klserve::cpu
