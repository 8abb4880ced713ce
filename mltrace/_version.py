"""The mltrace version string (read by setup.cfg and written into run tags)."""

__version__ = "0.1.0"
