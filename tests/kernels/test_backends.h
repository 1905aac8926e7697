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

// The backend the running test computes with: a BackendTest's own while it
// runs, else the shared CPU backend. RunLibrary and the helpers built on it
// (test_data.h) compute with it when given no backend, so that a suite's
// helpers follow its backend without taking it as an argument.
Backend& BackendUnderTest();

// A suite that runs on every backend: instantiate it with
// KLSERVE_INSTANTIATE_ON_BACKENDS(Suite). Tests on a backend this machine
// lacks are skipped with the reason (scripts/gpu-check.sh fails on such a
// skip where there is a GPU).
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  void TearDown() override;
  Backend* backend() { return backend_; }

 private:
  Backend* backend_ = nullptr;
};

// "cpu" or "cuda": the name of a BackendTest instance.
std::string BackendName(const ::testing::TestParamInfo<std::string>& info);

}  // namespace klserve::testdata

// Runs the BackendTest suite `suite` once per backend, its tests named
// "Backends/<suite>.<test>/<backend>".
#define KLSERVE_INSTANTIATE_ON_BACKENDS(suite)                                \
  INSTANTIATE_TEST_SUITE_P(Backends, suite, ::testing::Values("cpu", "cuda"), \
                           ::klserve::testdata::BackendName)

#endif  // KLSERVE_TESTS_KERNELS_TEST_BACKENDS_H_
