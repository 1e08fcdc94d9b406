# Precompiled GoogleTest (and nlohmann/json) for the test suites (THINDISK_PCH).
#
# Why: on the CI's 2 cores the build is most of the time budget, and every
# test source parses gtest (and some nlohmann/json) again. A precompiled
# header parses them once for the whole tree: about 2-4 s less CPU per
# heavy test source at -O2 -g (src/qcow2/create_test.cc 29.4 -> 24.9 s,
# src/nbd/server_test.cc 20.9 -> 18.9 s user+sys).
#
# What it does not change: the code generated. A precompiled header is given
# only to sources that include its headers themselves (a scan of each source
# at configure time), so no file gains a header it did not ask for; forcing
# json into a file changes what gcc inlines there, and with it gcc 12's -O2
# warnings. A precompiled header can hide a missing #include in a header
# included after it; build with -DTHINDISK_PCH=OFF to check.
#
# thindisk_pch_tests(<target>)  a GoogleTest suite: reuse the shared header
#                               (gtest, or gtest + json for a suite whose
#                               sources include json).

# Off by default: the header is forced in front of a source's own includes,
# which changes what gcc 12 inlines there, and its -O2 -Warray-bounds then
# fails src/block/open_nbd_test.cc (a false positive in std::string's
# memcpy); the gain was 2-4 s of CPU per heavy test source.
option(THINDISK_PCH "Precompile GoogleTest and nlohmann/json for the test suites" OFF)

# Sets <out> to the C++ sources of <target> that #include <header>.
function(_thindisk_sources_including target header out)
  get_target_property(sources ${target} SOURCES)
  get_target_property(dir ${target} SOURCE_DIR)
  string(REPLACE "." "\\." pattern "^#include <${header}>")
  set(found "")
  foreach(src IN LISTS sources)
    if(src MATCHES "\\.(cc|cpp)$")
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY ${dir} OUTPUT_VARIABLE path)
      file(STRINGS ${path} hits REGEX "${pattern}" LIMIT_COUNT 1)
      if(hits)
        list(APPEND found ${src})
      endif()
    endif()
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# A holder per shared header: an object library of one empty source with the
# compile flags of every test (same includes, GTest's definitions), so the
# suites can REUSE_FROM it. gcc checks the reuse: -Winvalid-pch (added by
# CMake) with -Werror fails on a mismatch rather than silently reparsing.
function(_thindisk_pch_holder name)
  set(src ${CMAKE_BINARY_DIR}/pch/${name}.cc)
  file(CONFIGURE OUTPUT ${src} CONTENT "// Holds the ${name} precompiled header.\n")
  add_library(${name} OBJECT ${src})
  target_include_directories(${name} PRIVATE ${THINDISK_SRC})
  target_link_libraries(${name} PRIVATE GTest::gtest nlohmann_json::nlohmann_json)
  thindisk_test_flags(${name})  # the suites reusing it compile with these
  target_precompile_headers(${name} PRIVATE ${ARGN})
endfunction()

if(THINDISK_PCH)
  _thindisk_pch_holder(td_pch_gtest <gtest/gtest.h>)
  _thindisk_pch_holder(td_pch_gtest_json <gtest/gtest.h> <nlohmann/json.hpp>)
endif()

function(thindisk_pch_tests target)
  if(NOT THINDISK_PCH)
    return()
  endif()
  _thindisk_sources_including(${target} nlohmann/json.hpp with_json)
  if(with_json)
    set(holder td_pch_gtest_json)
    set(chosen ${with_json})
  else()
    set(holder td_pch_gtest)
    _thindisk_sources_including(${target} gtest/gtest.h chosen)
  endif()
  if(NOT chosen)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  foreach(src IN LISTS sources)
    if(NOT src IN_LIST chosen)
      set_source_files_properties(${src} TARGET_DIRECTORY ${target}
                                  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  target_precompile_headers(${target} REUSE_FROM ${holder})
endfunction()
