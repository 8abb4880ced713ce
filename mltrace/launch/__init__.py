"""``mltrace run``: an unmodified training script with a hook attached (smdebug's zero script change).

Modules: ``command`` (the subcommand: options, the program to start), ``config`` (the smdebug
JSON document, merged and validated), ``process`` and ``bootstrap/`` (what each process of the
job does at start-up), ``imports`` (post-import hooks), ``session`` (the process's hooks), and one
``attach_<framework>`` per framework.
"""

import os

#: The folder ``mltrace run`` puts on PYTHONPATH (its sitecustomize activates mltrace).
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")

__all__ = ["BOOTSTRAP_DIR"]
