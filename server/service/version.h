#ifndef KLSERVE_SERVER_SERVICE_VERSION_H_
#define KLSERVE_SERVER_SERVICE_VERSION_H_

#include "absl/strings/string_view.h"

namespace klserve::server {

// The project's version, from CMake's project(VERSION).
inline constexpr absl::string_view kVersion = KLSERVE_VERSION;

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_VERSION_H_
