# Cross toolchain for AArch64 Linux (Debian: gcc-aarch64-linux-gnu, with the
# target's libraries installed as :arm64 multiarch packages). Used with
# -DKVF_COMPUTE_ONLY=ON by tests/cross/aarch64.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# ctest runs the target's test binaries under qemu user emulation.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
