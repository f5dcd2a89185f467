# Sanitizer and fuzzing builds (docs/RELIABILITY.md). Included from the top-level
# CMakeLists.txt before any target, so the flags reach every target.
#
#   -DMOEJIT_SANITIZE=address,undefined   ASan + LSan + UBSan (gcc or clang); UB aborts
#   -DMOEJIT_SANITIZE=thread              TSan (gcc or clang)
#   -DMOEJIT_FUZZ=ON                      clang only: coverage instrumentation for libFuzzer
#                                         and the tests/fuzz/fuzz_* harness binaries
set(MOEJIT_SANITIZE "" CACHE STRING "Sanitizers for every target (address,undefined | thread | empty)")
option(MOEJIT_FUZZ "Build the libFuzzer harnesses in tests/fuzz (clang)" OFF)

if(MOEJIT_SANITIZE)
  if(MOEJIT_SANITIZE MATCHES "thread" AND MOEJIT_SANITIZE MATCHES "address")
    message(FATAL_ERROR "MOEJIT_SANITIZE: thread and address cannot be combined")
  endif()
  set(_moejit_san -fsanitize=${MOEJIT_SANITIZE})
  add_compile_options(${_moejit_san} -fno-omit-frame-pointer -g)
  if(MOEJIT_SANITIZE MATCHES "undefined")
    # Any undefined behaviour fails the test that hit it instead of printing and going on.
    add_compile_options(-fno-sanitize-recover=all)
  endif()
  add_link_options(${_moejit_san})
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # clang links its sanitizer runtimes into executables only (gcc links the shared
    # runtime into shared libraries too), so libmoejit's sanitizer references stay
    # undefined until an executable provides them: lift -Wl,--no-undefined for this
    # build. link_libraries() items go after the target's own options, so they win.
    link_libraries(-Wl,-z,undefs)
  endif()
  message(STATUS "moejit: sanitizers ${MOEJIT_SANITIZE}")
endif()

if(MOEJIT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MOEJIT_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
