// The CUDA runtime's C API header: under the emulator the same declarations as cuda_runtime.h.
#pragma once

#include "cuda_runtime.h"
