// Stand-in for CUDA's <cuda_runtime.h> when the kernels are built for the
// CPU emulator: everything is in ../emu.h. This directory comes first on the
// emulator's include path, ahead of any CUDA toolkit.
#ifndef KVF_CUDA_EMU_RUNTIME_H
#define KVF_CUDA_EMU_RUNTIME_H

#include "../emu.h"

#endif
