"""``python -m mltrace``: the ``mltrace`` command (``python -m mltrace run train.py``)."""

import sys

from mltrace.cli import main

sys.exit(main())
