"""mltrace's tests, one folder per part of the library (tests/format for mltrace/format, ...).

A package, so that pytest imports test modules by their full name (tests.storage.test_s3) with the
repository root on sys.path, never the tests folder itself: folders named after the frameworks
(tests/tensorflow, tests/xgboost) or the plugins (tests/tb_plugin) then cannot shadow the real
packages. Helpers live in tests/support; shared fixtures in the conftest.py files. tests/legacy
has no __init__.py: it runs in .venv-legacy and imports its own helpers by their bare names.
"""
