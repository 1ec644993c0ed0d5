#!/usr/bin/env bash
# make test's second lane, beside the integration tests: lint, the unit tests, then the unit
# tests again on CPython 3.13 (marker newer_python). Each step's output goes to
# .cache/<step>.log and its exit code to .cache/<step>.rc, which make test reports after
# the integration tests (one shared lab, in order). Arguments: more pytest arguments.
#
# This lane should use only the CPU the lab leaves idle. `nice` alone does not do that:
# with the kernel's autogroups (one per session) a nice value counts only against the
# processes of its own session, so a niced lane started by make test took the session's
# whole share, half the machine, whenever Ansible waited on its hosts, from the hosts'
# dpkg and daemons (the suite's site.yml converge ran 514 s beside it, 305 s alone).
# Run under `setsid` (make test does), the lane is a session of its own: it lowers its
# autogroup's priority, which counts against everything else. Without autogroups (no
# /proc/self/autogroup) nice is all there is.
set -u
cd "$(dirname "$0")/.."
LANE_NICE=10
if [[ -z ${GPUPOOL_LANE_NICED:-} ]]; then
  GPUPOOL_LANE_NICED=1 exec nice -n "$LANE_NICE" "$0" "$@"
fi
# Only as a session of its own: lowering the caller's autogroup would slow its whole session.
if [[ "$(ps -o sid= -p $$ | tr -d ' ')" == "$$" ]]; then
  echo "$LANE_NICE" 2>/dev/null > /proc/self/autogroup || true
fi
VENV=.venv/bin
: "${LINT:?the lint command: make test passes its LINT}"
mkdir -p .cache

step() {  # step NAME COMMAND...: run it, its output and exit code under .cache/NAME.*
  local name=$1 rc=0
  shift
  "$@" > ".cache/$name.log" 2>&1 || rc=$?
  echo "$rc" > ".cache/$name.rc"
}

newer_python() {
  scripts/wheelhouse.sh 3.13 && "$VENV/pytest" -m newer_python "$@"
}

step lint bash -c "$LINT"
step unit-tests "$VENV/pytest" -m "not integration" "$@"
step newer-python newer_python "$@"
