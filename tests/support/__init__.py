"""Helpers of the tests: training jobs and scripts, trial writers, servers, browsers."""
