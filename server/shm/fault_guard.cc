#include "server/shm/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace klserve::server {
namespace {

// One guarded mapping. The signal handler reads the table without a lock,
// so every field is an atomic, and a slot is published by storing its size
// last (and retired by clearing its size first).
struct GuardedMapping {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<std::atomic<bool>*> damaged{nullptr};
};

GuardedMapping g_mappings[kMaxGuardedMappings];
struct sigaction g_previous;  // the handler the guard displaced
std::once_flag g_installed;
std::mutex g_slots_mu;  // serialises Guard and Unguard (not the handler)

void PassOn(int signo, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(signo, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN) return;
  if (g_previous.sa_handler != SIG_DFL) {
    g_previous.sa_handler(signo);
    return;
  }
  // The default action, now: for a SIGBUS sent with kill() as for a fault.
  signal(signo, SIG_DFL);
  raise(signo);
}

void OnSigbus(int signo, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // Only a fault of an access says where it was; a SIGBUS a process sent
  // (si_code <= 0) names no address of ours.
  if (info->si_code <= 0) {
    PassOn(signo, info, context);
    errno = saved_errno;
    return;
  }
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardedMapping& m : g_mappings) {
    const size_t size = m.size.load(std::memory_order_acquire);
    if (size == 0) continue;
    const uintptr_t base = m.base.load(std::memory_order_relaxed);
    if (address < base || address - base >= size) continue;
    // Zero pages in place of the whole mapping, private to the server: the
    // object's pages are never touched again, and what the call writes
    // from here on goes nowhere. mmap is a plain system call here, safe in
    // a handler; MAP_NORESERVE charges nothing for pages never touched.
    // Without the zero pages the access would fault forever: a crash (the
    // previous handler) is better.
    if (mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0) == MAP_FAILED) {
      break;
    }
    m.damaged.load(std::memory_order_relaxed)
        ->store(true, std::memory_order_relaxed);
    errno = saved_errno;
    return;
  }
  PassOn(signo, info, context);
  errno = saved_errno;
}

void Install() {
  struct sigaction action = {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

absl::StatusOr<int> Guard(void* base, size_t size, std::atomic<bool>* damaged) {
  std::call_once(g_installed, Install);
  std::lock_guard<std::mutex> lock(g_slots_mu);
  for (int slot = 0; slot < kMaxGuardedMappings; ++slot) {
    GuardedMapping& m = g_mappings[slot];
    if (m.size.load(std::memory_order_relaxed) != 0) continue;
    m.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
    m.damaged.store(damaged, std::memory_order_relaxed);
    m.size.store(size, std::memory_order_release);
    return slot;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "shared memory: ", kMaxGuardedMappings, " regions mapped at once"));
}

void Unguard(int slot) {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  g_mappings[slot].size.store(0, std::memory_order_release);
}

}  // namespace klserve::server
