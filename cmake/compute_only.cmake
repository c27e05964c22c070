# KVF_COMPUTE_ONLY: the compute engine (model, CPU backend, KV pool,
# engine) and the tests of its numerics, with no messaging, transport or
# GPU dependencies: only cJSON and cmocka. For builds on other
# architectures (tests/cross/aarch64.sh runs them under qemu).
find_package(Threads REQUIRED)
find_path(KVF_CJSON_INCLUDE cjson/cJSON.h REQUIRED)
find_library(KVF_CJSON_LIB cjson REQUIRED)
find_path(KVF_CMOCKA_INCLUDE cmocka.h REQUIRED)
find_library(KVF_CMOCKA_LIB cmocka REQUIRED)
# uthash (kvf/hashmap.h: safetensors.c, model_load.c, hashmap.c): header
# only, the build machine's own uthash-dev serves the target too.
find_path(KVF_UTHASH_INCLUDE uthash.h REQUIRED)

set(_c ${CMAKE_SOURCE_DIR}/common)
file(GLOB _cpu CONFIGURE_DEPENDS ${_c}/backend/cpu/*.c)
add_library(kvf_compute STATIC
  ${_c}/engine.c ${_c}/engine_stack.c ${_c}/model_config.c ${_c}/model_load.c
  ${_c}/model_write.c ${_c}/safetensors.c ${_c}/hashmap.c ${_c}/file.c ${_c}/kvcache.c
  ${_c}/dtype.c ${_c}/detmath.c ${_c}/log.c ${_c}/status.c ${_c}/threadpool.c ${_c}/clock.c
  ${_c}/sampling.c ${_c}/backend_select.c ${_cpu})
target_include_directories(kvf_compute PUBLIC ${_c}/include ${KVF_CJSON_INCLUDE}
                                              ${KVF_UTHASH_INCLUDE})
target_compile_definitions(kvf_compute PUBLIC KVF_VERSION_STRING="${PROJECT_VERSION}"
                                                _GNU_SOURCE)
target_link_libraries(kvf_compute PUBLIC ${KVF_CJSON_LIB} Threads::Threads m)

enable_testing()
set(KVF_TEST_DATA ${CMAKE_SOURCE_DIR}/tests/data)
foreach(module threadpool backend engine detmath)
  set(name test_${module})
  add_executable(${name} ${CMAKE_SOURCE_DIR}/tests/unit/${name}.c
                         ${CMAKE_SOURCE_DIR}/tests/unit/support.c)
  target_include_directories(${name} PRIVATE ${KVF_CMOCKA_INCLUDE})
  target_link_libraries(${name} PRIVATE kvf_compute ${KVF_CMOCKA_LIB})
  # no kvf binary in this build: the CLI tests skip
  target_compile_definitions(${name} PRIVATE KVF_TEST_DATA="${KVF_TEST_DATA}"
                                             KVF_BIN_DIR="${CMAKE_BINARY_DIR}/no-bin")
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 1800 LABELS "unit;cross")
endforeach()
