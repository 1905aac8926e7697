#ifndef KLSERVE_SERVER_TENSORBOARD_RUN_NAME_H_
#define KLSERVE_SERVER_TENSORBOARD_RUN_NAME_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace klserve::server {

// A run name (tags.run, FinishStepRequest.run) is used as it is: as the
// `run` label of the run's Prometheus series and as the run's TensorBoard
// directory under --tensorboard_dir. Names are checked instead of rewritten
// so that two distinct runs can never end up on one series or in one
// directory (rewriting maps several names to one, and evicting one of them
// would then remove the other's series).

// The longest run name, in bytes.
inline constexpr size_t kMaxRunNameBytes = 128;

// The characters a run name may use, as error messages list them.
inline constexpr absl::string_view kRunNameCharacters =
    "ASCII letters, digits and . _ - + = , with / between parts";

// OK when `run` is 1 to kMaxRunNameBytes bytes of kRunNameCharacters, and
// each '/'-separated part is non-empty, neither "." nor "..", and without
// "tfevents" (which marks TensorBoard's event files): a relative path that
// stays inside the directory it is joined to (TensorBoard shows
// "exp/seed_1" as a run of that name). Otherwise INVALID_ARGUMENT whose
// message starts with `field` ("tags.run", "run") and says what is wrong.
absl::Status CheckRunName(absl::string_view run, absl::string_view field);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_TENSORBOARD_RUN_NAME_H_
