/* Forced into every C++ translation unit (CMakeLists.txt): keeps the binaries
 * loadable with the libstdc++ of GCC 11 (GLIBCXX_3.4.29: RHEL 9 and its clones),
 * so that the wheel's tag is manylinux_2_34 rather than 2_35. GCC 12's
 * libstdc++ exports std::condition_variable::wait(unique_lock<mutex>&) at a
 * new version, GLIBCXX_3.4.30 (the same function, no longer noexcept for
 * thread cancellation, which weightlift never uses); bind it to the version
 * every libstdc++ since GCC 4.4 has. Nothing else of ours needs 3.4.30
 * (tests/packaging checks the tag). */
#include <version> /* names the standard library: __GLIBCXX__ for libstdc++ */
#if defined(__GLIBCXX__) && defined(__x86_64__) && !defined(WEIGHTLIFT_GLIBCXX_COMPAT)
#define WEIGHTLIFT_GLIBCXX_COMPAT
__asm__(".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
        "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
#endif
