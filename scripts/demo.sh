#!/usr/bin/env bash
# One command on a fresh machine: set up the environment, make a small CamVid-style
# sample, convert it, train a tiny Keras model for an epoch from the shards.
# Usage: scripts/demo.sh [WORKDIR]   (default: ./demo-out)
source "$(dirname "$0")/_env.sh"
WORK="${1:-$ROOT/demo-out}"
exec "$VENV/bin/python" "$ROOT/scripts/demo.py" "$WORK"
