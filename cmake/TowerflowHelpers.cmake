# tw_add_library(NAME SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
#   A static archive of one area of the library; added to towerflow::towerflow.
function(tw_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                            $<INSTALL_INTERFACE:include/towerflow>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS} tw_build_flags)
  set_property(GLOBAL APPEND PROPERTY TW_ALL_LIBRARIES ${name})
endfunction()

# tw_add_test(NAME SOURCES ... [LIBS ...] [GPU])
#   A Catch2 executable whose test cases are registered one by one with CTest. GPU: some of its
#   cases use a GPU where there is one, so they hold CTest's resource lock "gpu" (one GPU-using
#   test at a time under ctest -j, each free to take the memory it needs).
function(tw_add_test name)
  cmake_parse_arguments(ARG "GPU" "" "SOURCES;LIBS" ${ARGN})
  set(_lock "")
  if(ARG_GPU)
    set(_lock RESOURCE_LOCK gpu)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  set_property(GLOBAL APPEND PROPERTY TW_CATCH_TESTS ${name})  # tests/check_test_names.sh
  target_link_libraries(${name} PRIVATE tw_catch_main ${ARG_LIBS} tw_build_flags)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  tw_test_code(${name})
  # A case that cannot run here says "TEST SKIPPED: <why>" (tests/test_skip.h): CTest lists it as
  # skipped, never as passed. --warn NoTests: a CTest entry whose name matches no test case fails
  # instead of passing with "No tests ran" (a ';' in a case's name splits it into two entries
  # that match nothing, as CMake lists are ';'-separated: write ',' instead).
  catch_discover_tests(${name} TEST_PREFIX "${name}:" DISCOVERY_TIMEOUT 60 EXTRA_ARGS --warn NoTests
                       PROPERTIES ENVIRONMENT "TOWERFLOW_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/fixtures"
                                  SKIP_REGULAR_EXPRESSION "TEST SKIPPED: " ${_lock})
endfunction()

# tw_test_code(TARGET [NO_PCH])
#   What a test program's own code compiles with: tw_test_flags, and the tests' precompiled header
#   (TOWERFLOW_PCH, tests/CMakeLists.txt) unless NO_PCH: a program whose source defines
#   CATCH_CONFIG_RUNNER or CATCH_CONFIG_MAIN before it includes Catch2.
function(tw_test_code target)
  cmake_parse_arguments(ARG "NO_PCH" "" "" ${ARGN})
  target_link_libraries(${target} PRIVATE tw_test_flags)
  if(NOT ARG_NO_PCH AND TARGET tw_test_pch)
    target_precompile_headers(${target} REUSE_FROM tw_test_pch)
  endif()
endfunction()

# tw_add_python_test(NAME COMMAND ... [PROPERTIES ...])
#   A test whose COMMAND runs Python 3 (${Python3_EXECUTABLE}: scripts/build.sh points it at the
#   environment scripts/install_deps.sh makes). Registered on every machine, so that every machine
#   has the same tests: where CMake found no Python 3 it reports itself skipped (77), saying why.
#   Exit 77 is a skip (the script says why: a package it needs is missing, say).
function(tw_add_python_test name)
  cmake_parse_arguments(ARG "" "" "COMMAND;PROPERTIES" ${ARGN})
  if(Python3_Interpreter_FOUND)
    add_test(NAME ${name} COMMAND ${ARG_COMMAND})
  else()
    add_test(NAME ${name} COMMAND sh -c "echo 'TEST SKIPPED: ${name} needs Python 3, and CMake found none; run scripts/install_deps.sh, or configure with -DPython3_EXECUTABLE=/path/to/python3'; exit 77")
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 ${ARG_PROPERTIES})
endfunction()

# tw_add_bench(NAME SOURCES ... [LIBS ...])
function(tw_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} tw_build_flags)
endfunction()

# The tests' own code (tw_add_test, and the test programs with a main of their own): a Release
# build compiles it at -O1. It sets up cases and checks results, and -O3 took about twice as long
# to compile it; the library under test keeps its own flags.
add_library(tw_test_flags INTERFACE)
target_compile_options(tw_test_flags INTERFACE $<$<CONFIG:Release>:-O1>)

# Flags every towerflow target compiles with (not exported to users' code).
add_library(tw_build_flags INTERFACE)
target_compile_options(tw_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${TOWERFLOW_WERROR}>>:-Werror>)
# GCC 12 reports impossible overlaps inside std::string's operator+ once it is inlined (GCC bug
# 105329, a false positive), which -DTOWERFLOW_WERROR=ON would turn into errors.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(tw_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(TOWERFLOW_NATIVE)
  target_compile_options(tw_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
if(TW_HAVE_CUDA)
  target_compile_definitions(tw_build_flags INTERFACE TOWERFLOW_HAVE_CUDA=1)
endif()
