// The hook through which GradScaler agrees with other processes on whether a step overflowed:
// called on each optimizer's inf/NaN flag before the skip-or-step decision. Data-parallel
// training (distributed/) installs one that MAX-reduces the flag over every rank.
#pragma once

#include <functional>

namespace ampgrad::amp {

/// Returns whether any process found an inf/NaN, given this process's flag. Every process must
/// call it equally often and in the same order (GradScaler calls it once per unscale_).
using FoundInfSync = std::function<bool(bool found_inf)>;

/// Installs the process-wide hook that every GradScaler calls from unscale_ (an empty function:
/// each process decides alone, the default). Returns the hook it replaces.
FoundInfSync set_found_inf_sync(FoundInfSync sync);

/// The flag every process agrees on: sync(found_inf) if a hook is installed, else found_inf.
bool sync_found_inf(bool found_inf);

}  // namespace ampgrad::amp
