# The libraries common/ is built as, and the files of each. Included by the
# top-level CMakeLists.txt for common/CMakeLists.txt (the full build), for
# cmake/compute_only.cmake (the compute-only cross build), so that both
# build the libraries they share from the same lists, and for tests/.
# common/CMakeLists.txt describes the layers and how they depend on each
# other.
#
# Each list names files relative to common/, globs allowed; a name that
# matches no file (yet) is no error. Every .c and .cu file under common/ is
# in exactly one list: configuring fails otherwise (kvf_layers_check).

set(KVF_COMMON_DIR ${CMAKE_SOURCE_DIR}/common)

# kvf_base: no model, no messaging, no third-party library.
set(KVF_BASE_FILES
    status.c log.c clock.c file.c signals.c crc32c.c utf8.c hex.c hashmap.c threadpool.c
    detmath.c dtype.c sampling.c timer.c evloop.c array.c)
# kvf_text: the tokenizer and what turns its output into text.
set(KVF_TEXT_FILES tokenizer*.c bpe.c detok.c textstream.c)
# kvf_model: the checkpoint, the KV pool, the prefix cache over it and the
# KV tiers (host RAM, disk) below it.
set(KVF_MODEL_FILES model*.c safetensors*.c kvcache*.c prefix_cache*.c block_hash*.c
    kv_tier*.c)
# kvf_cuda_host: the CUDA ops' shape checks, plain C (tested without a GPU).
set(KVF_CUDA_HOST_FILES backend/cuda/shapes.c)
# kvf_cuda: the CUDA backend and its kernels (nvcc; KVF_CUDA builds only).
set(KVF_CUDA_FILES backend/cuda/*.cu)
# kvf_engine: the backends and the forward pass over them.
set(KVF_ENGINE_FILES engine*.c backend_select.c gpu*.c backend/cpu/*.c)
# kvf_msg: control messages over nanomsg and protobuf-c, authenticated with
# libsodium.
set(KVF_MSG_FILES msg*.c net*.c node*.c clientsock*.c sampling_msg.c auth.c identity*.c)
# kvf_cli: the command line of every binary.
set(KVF_CLI_FILES flags*.c backend_flags.c)

set(KVF_LAYERS BASE TEXT MODEL CUDA_HOST CUDA ENGINE MSG CLI)

# The unit tests (tests/unit/test_<name>.c) that need the engine and
# nothing above it: the full build links them with kvf_engine alone, and
# they are what the compute-only build builds.
set(KVF_COMPUTE_TESTS threadpool backend attn_decode engine engine_golden detmath)

# kvf_layer_sources(<LAYER> <out var>): the layer's files (absolute paths).
function(kvf_layer_sources layer out)
  set(files)
  foreach(name ${KVF_${layer}_FILES})
    file(GLOB found CONFIGURE_DEPENDS ${KVF_COMMON_DIR}/${name})
    list(APPEND files ${found})
  endforeach()
  list(SORT files)
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# Fails the configure for a source file of common/ in no layer or in two.
function(kvf_layers_check)
  file(GLOB_RECURSE all CONFIGURE_DEPENDS ${KVF_COMMON_DIR}/*.c ${KVF_COMMON_DIR}/*.cu)
  set(claimed)
  set(problems)
  foreach(layer ${KVF_LAYERS})
    kvf_layer_sources(${layer} files)
    foreach(f ${files})
      if(f IN_LIST claimed)
        list(APPEND problems "${f} (in two layers)")
      endif()
    endforeach()
    list(APPEND claimed ${files})
  endforeach()
  foreach(f ${all})
    if(NOT f IN_LIST claimed)
      list(APPEND problems "${f} (in no layer)")
    endif()
  endforeach()
  if(problems)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "cmake/kvf_sources.cmake: every source file of common/ belongs to "
                        "exactly one library; add these to one of the KVF_<LAYER>_FILES "
                        "lists:\n  ${text}")
  endif()
endfunction()

# kvf_add_compute_libraries(): kvf_base, kvf_model and kvf_engine, which
# the full build and the compute-only build share. The engine has the CPU
# backend; common/CMakeLists.txt links the CUDA one in where there is one.
# Needs the targets Threads::Threads and PkgConfig::CJSON.
function(kvf_add_compute_libraries)
  kvf_layers_check()

  kvf_layer_sources(BASE files)
  add_library(kvf_base STATIC ${files})
  target_include_directories(kvf_base PUBLIC ${KVF_COMMON_DIR}/include)
  target_compile_definitions(kvf_base PUBLIC KVF_VERSION_STRING="${PROJECT_VERSION}" _GNU_SOURCE)
  target_link_libraries(kvf_base PUBLIC Threads::Threads m)

  kvf_layer_sources(MODEL files)
  add_library(kvf_model STATIC ${files})
  target_link_libraries(kvf_model PUBLIC kvf_base PkgConfig::CJSON)

  kvf_layer_sources(ENGINE files)
  add_library(kvf_engine STATIC ${files})
  target_link_libraries(kvf_engine PUBLIC kvf_model kvf_base)
endfunction()

# kvf_link_closure(<target> <out var>): every item target links, directly
# or through the libraries it links (their link interfaces).
function(kvf_link_closure target out)
  set(seen)
  get_target_property(todo ${target} LINK_LIBRARIES)
  if(NOT todo)
    set(todo)
  endif()
  while(todo)
    list(POP_FRONT todo item)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
    # ::@ items mark a target_link_libraries() call from another directory.
    if(item MATCHES "^::@" OR item IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${item})
    if(TARGET ${item})
      get_target_property(next ${item} INTERFACE_LINK_LIBRARIES)
      if(next)
        list(APPEND todo ${next})
      endif()
    endif()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# kvf_check_links(<target> <regex>...): fails the configure when an item of
# target's link closure matches one of the regexes (a library a layer must
# not depend on).
function(kvf_check_links target)
  if(NOT TARGET ${target})
    return()
  endif()
  kvf_link_closure(${target} closure)
  foreach(item ${closure})
    foreach(re ${ARGN})
      if(item MATCHES "${re}")
        message(FATAL_ERROR "${target} must not link ${item} (the layers in "
                            "common/CMakeLists.txt); its link closure: ${closure}")
      endif()
    endforeach()
  endforeach()
endfunction()

# The rules of the layering, checked once the whole tree is configured (a
# target_link_libraries() anywhere may add to a library's links): the base
# links no other kvferry library; the CUDA libraries nothing at or above
# the engine (kvf_engine links kvf_cuda, not the other way); the engine
# no messaging (nanomsg, protobuf-c, libsodium), no tokenizer.
function(kvf_layers_check_links)
  kvf_check_links(kvf_base "^kvf_")
  kvf_check_links(kvf_cuda_host "^kvf_(text|model|cuda|engine|msg|cli|common|proto)$")
  kvf_check_links(kvf_cuda "^kvf_(text|engine|msg|cli|common|proto)$")
  kvf_check_links(kvf_engine "^kvf_(text|msg|cli|common|proto)$" "nanomsg|NANOMSG"
                  "protobuf|PROTOBUF" "sodium|SODIUM" "pcre2|PCRE2" "utf8proc|UTF8PROC")
endfunction()
