#ifndef KLSERVE_KERNELS_STATUS_MACROS_H_
#define KLSERVE_KERNELS_STATUS_MACROS_H_

// Debian's Abseil (20220623) has no RETURN_IF_ERROR; these are the two
// macros every module uses to pass a Status up.

#define KLSERVE_CONCAT_INNER_(a, b) a##b
#define KLSERVE_CONCAT_(a, b) KLSERVE_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                           \
  do {                                                  \
    if (absl::Status status_ = (expr); !status_.ok()) { \
      return status_;                                   \
    }                                                   \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(KLSERVE_CONCAT_(statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // KLSERVE_KERNELS_STATUS_MACROS_H_
