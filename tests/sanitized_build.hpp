#pragma once
// kSanitizedBuild: true when this test binary is built with AddressSanitizer or ThreadSanitizer
// (scripts/sanitize.sh). Instrumentation slows every memory access several-fold, so the tests
// that assert a speed (lookup latency) still run their code under the sanitizer -- that is the
// point, for the multi-threaded ones -- but report the figure instead of asserting it.
namespace mlajit::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

}  // namespace mlajit::testing
