"""``mltrace.pytorch.hook``: the module path smdebug users imported the hook from
(``from smdebug.pytorch.hook import Hook``). The hook itself lives in mltrace.pytorch."""

from mltrace.capture.hook import set_hook
from mltrace.collections import CollectionKeys, CollectionManager
from mltrace.pytorch import DEFAULT_INCLUDE_COLLECTIONS, Hook, TornasoleHook, get_hook

__all__ = ["Hook", "TornasoleHook", "CollectionKeys", "CollectionManager", "DEFAULT_INCLUDE_COLLECTIONS",
           "get_hook", "set_hook"]
