#!/usr/bin/env bash
# Every Catch2 test case can run under CTest by its name: catch_discover_tests registers one CTest
# entry per case and runs the binary with the name as its test spec, so a name with ';' becomes
# two entries (CMake lists are ';'-separated) that match nothing, and a name that starts with '-'
# is read as an option ("--help ..." prints Catch's usage and exits 0). Either would report a
# pass for a case that never ran.
#   check_test_names.sh TEST_BINARY...
set -uo pipefail
bad=0 cases=0
for bin in "$@"; do
  # (Catch exits with the number of cases listed.)
  names=$("$bin" --list-test-names-only)
  [ -n "$names" ] || { echo "FAILED: $bin --list-test-names-only listed nothing"; exit 1; }
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    cases=$((cases + 1))
    case "$name" in
      -*) echo "FAILED: $(basename "$bin"): \"$name\" starts with '-', which Catch reads as an option; reword it"; bad=1 ;;
      *\;*) echo "FAILED: $(basename "$bin"): \"$name\" holds ';', which splits its CTest entry in two; write ',' instead"; bad=1 ;;
    esac
  done <<< "$names"
done
[ $cases -gt 0 ] || { echo "FAILED: no test cases listed"; exit 1; }
[ $bad = 0 ] && echo "$cases test cases in $# binaries, every name runnable by CTest"
exit $bad
