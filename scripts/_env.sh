# Sourced by scripts/demo.sh and scripts/test.sh: make (or reuse) the project's virtual
# environment and install imgshard into it with the extras the tests need.
# IMGSHARD_VENV overrides the location (default: .venv in the repository).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IMGSHARD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "imgshard: creating virtual environment in $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.imgshard-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/converter/transform/*.c "$ROOT"/readers/*.c | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] || ! "$VENV/bin/python" -c "import converter, readers" 2>/dev/null; then
  echo "imgshard: installing imgshard and its dependencies into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test,dask,tfds,s3,gcs,coco,tiff,yaml,grain,augbench]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
