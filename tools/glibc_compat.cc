// Linked only into the GPU bundle (tools/gpu_check.sh build sets --define=gpu_bundle=1). Its static
// libstdc++ (GCC 12, built against glibc 2.36) references arc4random from std::random_device, which
// would make every bundled binary refuse to load on glibc < 2.36 (Ubuntu 22.04, RHEL 9). This
// definition, over getrandom (glibc 2.25), takes that reference and keeps the glibc floor at 2.34.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" uint32_t arc4random(void) {
  uint32_t value = 0;
  for (;;) {
    const ssize_t got = getrandom(&value, sizeof value, 0);
    if (got == static_cast<ssize_t>(sizeof value)) return value;
    // As glibc's own arc4random, which ends the process when the kernel cannot give randomness.
    if (got < 0 && errno != EINTR) std::abort();
  }
}
