#ifndef KLSERVE_TESTS_KERNELS_TEST_BACKENDS_H_
#define KLSERVE_TESTS_KERNELS_TEST_BACKENDS_H_

#include <string>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace klserve::testdata {

// The backend named `name` ("cpu": two threads; "cuda": device 0), made once
// and shared by the tests; null with the reason in `why` when this build or
// this machine has none.
Backend* TestBackend(const std::string& name, std::string* why);

// A suite that runs on every backend: instantiate it with
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::Values("cpu", "cuda"),
// name generator returning the backend's name).
// Tests on a backend this machine lacks are skipped with the reason.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = TestBackend(GetParam(), &why);
    if (backend_ == nullptr) GTEST_SKIP() << why;
  }
  Backend* backend() { return backend_; }

 private:
  Backend* backend_ = nullptr;
};

}  // namespace klserve::testdata

#endif  // KLSERVE_TESTS_KERNELS_TEST_BACKENDS_H_
