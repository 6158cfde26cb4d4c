// ampgrad: a small C++20 autograd framework with automatic mixed precision.
// This umbrella header is the public API; see README.md for the tour.
#pragma once

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "utils/cpu_isa.h"
#include "utils/crc32c.h"
