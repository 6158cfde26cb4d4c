// The process-wide found-inf hook (see found_inf_sync.h).
#include "amp/found_inf_sync.h"

#include <mutex>
#include <utility>

namespace ampgrad::amp {

namespace {
std::mutex hook_mutex;
FoundInfSync& installed_hook() {
  static FoundInfSync hook;
  return hook;
}
}  // namespace

FoundInfSync set_found_inf_sync(FoundInfSync sync) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  return std::exchange(installed_hook(), std::move(sync));
}

bool sync_found_inf(bool found_inf) {
  FoundInfSync hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    hook = installed_hook();  // called outside the lock: it may block on other processes
  }
  return hook ? hook(found_inf) : found_inf;
}

}  // namespace ampgrad::amp
