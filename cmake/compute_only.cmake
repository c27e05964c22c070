# KVF_COMPUTE_ONLY: the compute engine (kvf_base, kvf_model, kvf_engine with
# the CPU backend: the same libraries from the same file lists as the full
# build, cmake/kvf_sources.cmake) and the tests of its numerics, with no
# messaging, transport or GPU dependencies: only cJSON and cmocka. For
# builds on other architectures (tests/cross/aarch64.sh runs them under
# qemu).
find_package(Threads REQUIRED)
find_path(KVF_CJSON_INCLUDE cjson/cJSON.h REQUIRED)
find_library(KVF_CJSON_LIB cjson REQUIRED)
find_path(KVF_CMOCKA_INCLUDE cmocka.h REQUIRED)
find_library(KVF_CMOCKA_LIB cmocka REQUIRED)
# uthash (kvf/hashmap.h, used by safetensors.c and the model files): header
# only, the build machine's own uthash-dev serves the target too.
find_path(KVF_UTHASH_INCLUDE uthash.h REQUIRED)
include_directories(SYSTEM ${KVF_UTHASH_INCLUDE})

# cJSON under the name the full build's pkg-config gives it, which the
# shared library definitions link (a cross build has no pkg-config for the
# target's libraries).
add_library(PkgConfig::CJSON INTERFACE IMPORTED)
target_include_directories(PkgConfig::CJSON INTERFACE ${KVF_CJSON_INCLUDE})
target_link_libraries(PkgConfig::CJSON INTERFACE ${KVF_CJSON_LIB})

kvf_add_compute_libraries()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL kvf_layers_check_links)

enable_testing()
set(KVF_TEST_DATA ${CMAKE_SOURCE_DIR}/tests/data)
foreach(module ${KVF_COMPUTE_TESTS})
  set(name test_${module})
  add_executable(${name} ${CMAKE_SOURCE_DIR}/tests/unit/${name}.c
                         ${CMAKE_SOURCE_DIR}/tests/unit/support.c)
  target_include_directories(${name} PRIVATE ${KVF_CMOCKA_INCLUDE})
  target_link_libraries(${name} PRIVATE kvf_engine ${KVF_CMOCKA_LIB})
  # no kvf binary in this build: the CLI tests skip
  target_compile_definitions(${name} PRIVATE KVF_TEST_DATA="${KVF_TEST_DATA}"
                                             KVF_BIN_DIR="${CMAKE_BINARY_DIR}/no-bin")
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 1800 LABELS "unit;cross")
endforeach()
