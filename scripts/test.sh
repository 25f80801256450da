#!/usr/bin/env bash
# Set up (or reuse) the environment and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k verify -x
source "$(dirname "$0")/_env.sh"
cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
# pytest exits 5 when no test was collected: that is a failure here, not a pass.
exit $rc
