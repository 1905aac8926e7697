#include "server/service/open_calls.h"

#include <utility>

#include "absl/strings/strip.h"
#include "server/service/method_names.h"

namespace klserve::server {

// Lives as long as its call: gRPC creates it when the call reaches the
// service and destroys it with the call.
class OpenCalls::Counter final : public grpc::experimental::Interceptor {
 public:
  Counter(OpenCalls* calls, bool moves_tensors)
      : calls_(calls), moves_tensors_(moves_tensors) {
    absl::MutexLock lock(&calls_->mu_);
    ++calls_->open_;
  }
  ~Counter() override {
    absl::MutexLock lock(&calls_->mu_);
    --calls_->open_;
    if (moves_tensors_) ++calls_->tensor_calls_ended_;
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  OpenCalls* const calls_;
  const bool moves_tensors_;
};

class OpenCalls::Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  Factory(OpenCalls* calls, std::string method_prefix)
      : calls_(calls), method_prefix_(std::move(method_prefix)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    absl::string_view method = info->method();
    if (!absl::ConsumePrefix(&method, method_prefix_)) return nullptr;
    return new Counter(calls_, MovesTensors(method));
  }

 private:
  OpenCalls* const calls_;
  const std::string method_prefix_;
};

bool OpenCalls::WaitNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(
                                   +[](int* n) { return *n == 0; }, &open_),
                               deadline);
}

OpenCalls::Activity OpenCalls::Current() {
  absl::MutexLock lock(&mu_);
  return {open_, tensor_calls_ended_};
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
OpenCalls::CountingFactory(std::string method_prefix) {
  return std::make_unique<Factory>(this, std::move(method_prefix));
}

}  // namespace klserve::server
