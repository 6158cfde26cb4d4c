// AMPGRAD_CPU_ISA moved down to framework/cpu_features.h, so that ops/ and amp/ can ask it too;
// these names stay for code written against ampgrad::utils.
#pragma once

#include "framework/cpu_features.h"

namespace ampgrad::utils {

using ampgrad::cpu_isa;
using ampgrad::CpuIsa;
using ampgrad::parse_cpu_isa;

}  // namespace ampgrad::utils
