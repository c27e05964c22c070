// Stand-in for CUDA's <cuda_runtime.h> when CUDA code is built for the CPU
// emulator: the device side is ../emu.h, the host API ../emu_runtime.h.
// This directory comes first on the emulator's include path, ahead of any
// CUDA toolkit.
#ifndef KVF_CUDA_EMU_RUNTIME_H
#define KVF_CUDA_EMU_RUNTIME_H

#include "../emu.h"
#include "../emu_runtime.h"

#endif
