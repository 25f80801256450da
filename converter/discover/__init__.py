"""Stage 1: find the sources (pairs, splits, classes)."""
