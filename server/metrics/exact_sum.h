#ifndef KLSERVE_SERVER_METRICS_EXACT_SUM_H_
#define KLSERVE_SERVER_METRICS_EXACT_SUM_H_

#include <array>
#include <cstdint>

namespace klserve::server {

// The sum of doubles, kept exactly and rounded once (to nearest, ties to
// even) when read: the same bits whatever order the terms came in. A step's
// samples arrive in the order the ranks' requests happen to finish, and a
// plain running sum would make the published loss depend on that order in
// its last bits (and lose small terms next to large ones).
//
// Every finite double is an integer multiple of 2^-1074 below 2^1024, so the
// sum is kept as a fixed-point integer of that unit, in base-2^32 digits held
// in int64 words: a word takes 2^31 terms before it could overflow, and the
// carries are propagated long before that. A NaN term, or infinities of both
// signs, make the sum NaN; infinities of one sign make it that infinity.
// 552 bytes; not thread-safe.
class ExactSum {
 public:
  void Add(double x);
  double Value() const;

 private:
  // 2098 bits hold any finite double's multiple of 2^-1074 (the largest
  // reaches bit 2097); two digits more hold the carries of 2^62 terms.
  static constexpr int kDigits = 68;
  // Terms added between two carry propagations: each adds less than 2^32 in
  // magnitude to a word, which stays below 2^62.
  static constexpr int kTermsPerNormalize = 1 << 30;

  using Digits = std::array<int64_t, kDigits>;
  // Leaves every word but the last in [0, 2^32), the last carrying the sign.
  static void Normalize(Digits& digits);

  Digits digits_{};
  int32_t terms_since_normalize_ = 0;
  bool nan_ = false;
  bool plus_infinity_ = false;
  bool minus_infinity_ = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_EXACT_SUM_H_
