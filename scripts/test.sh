#!/usr/bin/env bash
# Set up (or reuse) the environment and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k verify -x
source "$(dirname "$0")/_env.sh"
cd "$ROOT"
set +e
# --durations: the slowest tests in every log, so the run's length stays watched (CI allows 90 min;
# the default run is kept near 20).
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=40 "$@"
rc=$?
# pytest exits 5 when no test was collected: that is a failure here, not a pass.
exit $rc
