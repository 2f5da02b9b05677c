// Whether this build runs under AddressSanitizer or ThreadSanitizer, for the few tests whose
// measurement the sanitizers' shadow memory or slowdown makes meaningless (resident memory, an
// address-space limit, a full-trace simulation against the test timeout). GCC defines
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; Clang answers __has_feature.
#ifndef KVTIER_TESTS_TESTING_SANITIZERS_H_
#define KVTIER_TESTS_TESTING_SANITIZERS_H_

namespace kvtier::testing {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SANITIZERS_H_
