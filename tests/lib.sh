# Shared by the tests/system/test_*.sh scripts (sourced after cd to the repo root): the check counter, and
# waits for events. A test waits for what it needs to see (a log line, a file, a step), never for a
# fixed time, so that a loaded machine changes how long it takes, not what it asserts.
pass=0 fail=0
# check DESCRIPTION CONDITION: counts the condition (a shell expression) as passed or failed.
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
# wait_until CONDITION: polls every 10 ms until the shell expression holds. The bound (TEST_WAIT_S,
# 300 s) only ends a wait on a process that wedged or died; it returns 1 then.
wait_until() {
  local t=$SECONDS
  until eval "$1"; do [ $((SECONDS - t)) -ge "${TEST_WAIT_S:-300}" ] && return 1; sleep 0.01; done
}
# wait_for FILE PATTERN: until FILE has a line matching the grep pattern.
wait_for() {
  local t=$SECONDS
  until grep -q -- "$2" "$1" 2>/dev/null; do [ $((SECONDS - t)) -ge "${TEST_WAIT_S:-300}" ] && return 1; sleep 0.01; done
}
# last_step FILE: the step of the last "step N/M | loss" line of a train output (0 before the first).
last_step() { local s; s=$(grep -o '^step *[0-9]*/' "$1" 2>/dev/null | tail -n 1 | tr -dc 0-9); echo "${s:-0}"; }
