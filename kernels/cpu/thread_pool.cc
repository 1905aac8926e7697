#include "kernels/cpu/thread_pool.h"

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
  while (true) {
    // One task; the job goes to the back of the queue while it has more, so
    // that the jobs waiting take turns.
    jobs_.pop_front();
    const int64_t index = job.next++;
    if (job.next < job.n) jobs_.push_back(&job);
    mu_.Unlock();
    job.task(index);
    mu_.Lock();
    if (!jobs_.empty() && jobs_.front() == &job) {
      ++job.finished;  // its next task is this thread's again
      continue;
    }
    // This thread leaves the job: none of its tasks are left, or another
    // job's turn has come. Before the count below lets ParallelFor return:
    // the job lives on its caller's stack.
    mu_.Unlock();
    job.finish();
    mu_.Lock();
    ++job.finished;
    return;
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
