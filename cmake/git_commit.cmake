# Writes OUT, a header defining SYMMEM_GIT_COMMIT: the source tree's commit at build time ("-dirty"
# when the sources differ from it, as scripts/bundle.sh says it), so that symmem-bench's CSV rows
# name the commit the binary was built from, not the one CMake was configured at. Run by a target
# at every build; the header is rewritten only when the commit changes (no rebuild otherwise).
#   cmake -DSOURCE_DIR=... -DOUT=... -P cmake/git_commit.cmake
# Only this tree's own repository counts (not one it was unpacked inside).
execute_process(COMMAND git rev-parse --show-toplevel WORKING_DIRECTORY "${SOURCE_DIR}"
                OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
file(REAL_PATH "${SOURCE_DIR}" source_real)
if(top)
  file(REAL_PATH "${top}" top)
endif()
if(failed OR NOT commit OR NOT top STREQUAL source_real)
  set(commit "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- src include tools tests python WORKING_DIRECTORY "${SOURCE_DIR}"
                  RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define SYMMEM_GIT_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE "${OUT}" "${text}")
endif()
