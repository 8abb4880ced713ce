"""Reliability: crashes, faults, damaged files, fuzzed readers, long runs and misuse."""
