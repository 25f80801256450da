"""Synthetic datasets for tests, the demo and the benchmark; never imported by the conversion path."""
