# Turns one CUDA source into C++ for the CPU emulator (emu.h), at build time:
#
#   cmake -DIN=<file.cu> -DOUT=<file.cc> -P cu_to_cc.cmake
#
# Only the syntax plain C++ has no way to express is rewritten; everything
# else (qualifiers, builtins, the CUDA headers) is provided by emu.h and
# include/. Every rewrite keeps the line count, and the output starts with a
# #line directive, so compiler errors and sanitizer reports name the .cu
# file and its lines.
#
#   kernel<T><<<grid, block, smem, stream>>>(args)
#       -> kvf_emu::launch(kernel<T>, grid, block, smem, stream)(args)
#   extern __shared__ __align__(16) float name[];
#       -> float *name = static_cast<float *>(kvf_emu::dynamic_smem());
#   __shared__ float name[N];
#       -> KVF_EMU_SHARED(float, name, [N]);   (one copy per CTA, see emu.h)
#   #pragma unroll [n]
#       -> (removed: g++ warns about the unknown pragma)
#
# Anything the rewrites do not cover (a launch or a __shared__ declaration
# of another form) stops the build, naming the file and the line's code,
# rather than compiling into something that runs differently.

cmake_minimum_required(VERSION 3.25)
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DIN=<file.cu> -DOUT=<file.cc> -P cu_to_cc.cmake")
endif()
file(READ "${IN}" src)

# CMake regexes have no \s, \w or lazy quantifiers: identifiers and blanks are
# spelled out. A C++ type here is words separated by blanks ("unsigned char").
set(id "[A-Za-z_][A-Za-z0-9_]*")
set(ws "[ \t]")
set(type "[A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]")

# Launches. The kernel may be a template-id (no nested <>) and its <<< may
# start the next line; the blanks between them are kept after the comma so
# the line count stays. The configuration ends at the first >>>.
string(REGEX REPLACE "(${id}(<[^<>;]*>)?)([ \t\r\n]*)<<<([^;]*)>>>[ \t]*\\("
       "kvf_emu::launch(\\1,\\3\\4)(" src "${src}")

# Dynamic shared memory: a pointer to this CTA's buffer.
set(align "(__align__\\([0-9]+\\)${ws}+)?")
set(unsized "${ws}*\\[${ws}*\\]${ws}*;")
string(REGEX REPLACE "extern${ws}+__shared__${ws}+${align}(${type})${ws}+(${id})${unsized}"
       "\\2 *\\3 = static_cast<\\2 *>(kvf_emu::dynamic_smem());" src "${src}")

# Static shared memory (after the extern form, which this would also match).
string(REGEX REPLACE "__shared__${ws}+(${type})${ws}+(${id})${ws}*((\\[[^];\n]*\\])*)${ws}*;"
       "KVF_EMU_SHARED(\\1, \\2, \\3);" src "${src}")

string(REGEX REPLACE "#pragma${ws}+unroll[^\n]*" "" src "${src}")

# Leftovers would compile to something else or not at all: name them. Lines
# that start a // comment or continue a /* */ one are not code.
string(REGEX MATCH "\n[ \t]*([^/* \t\n][^\n]*)?(<<<|__shared__)[^\n]*" left "\n${src}")
if(left)
  string(STRIP "${left}" left)
  message(FATAL_ERROR "${IN}: CUDA syntax the emulator conversion does not handle: ${left}")
endif()

file(WRITE "${OUT}" "#line 1 \"${IN}\"\n${src}")
