# The version (project()) and the git commit the build was configured at, for --version, the
# start-up block and checkpoint metadata (core/version.h). A source tree without git (a release
# archive, CI's copy) says "unknown", unless -DTOWERFLOW_COMMIT=... names it. Moving HEAD (a commit,
# a checkout) re-runs the configure step, so the commit stays the one built.
set(TOWERFLOW_COMMIT "" CACHE STRING "The commit to report when the source tree has no git history (empty: from git)")
set(TW_COMMIT "${TOWERFLOW_COMMIT}")
if(NOT TW_COMMIT)
  set(TW_COMMIT "unknown")
  find_package(Git QUIET)
  if(GIT_FOUND AND EXISTS ${PROJECT_SOURCE_DIR}/.git)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} rev-parse --short=12 HEAD
                    OUTPUT_VARIABLE _tw_head RESULT_VARIABLE _tw_rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_tw_rc EQUAL 0)
      set(TW_COMMIT "${_tw_head}")
    endif()
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} rev-parse --git-path HEAD
                    OUTPUT_VARIABLE _tw_head_file OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} rev-parse --symbolic-full-name HEAD
                    OUTPUT_VARIABLE _tw_ref OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(_tw_watch "${_tw_head_file}" ".git/${_tw_ref}" ".git/packed-refs")
      if(_tw_watch AND NOT IS_ABSOLUTE "${_tw_watch}")
        set(_tw_watch "${PROJECT_SOURCE_DIR}/${_tw_watch}")
      endif()
      if(_tw_watch AND EXISTS "${_tw_watch}" AND NOT IS_DIRECTORY "${_tw_watch}")
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_tw_watch}")
      endif()
    endforeach()
  endif()
endif()
configure_file(${PROJECT_SOURCE_DIR}/core/version.cc.in ${PROJECT_BINARY_DIR}/generated/core/version.cc @ONLY)
