"""``mltrace.pytorch.collection``: the module path of smdebug's PyTorch collections
(``from smdebug.pytorch.collection import Collection``). They live in mltrace.pytorch."""

from mltrace.collections import CollectionKeys, CollectionManager
from mltrace.pytorch import DEFAULT_COLLECTIONS, Collection

__all__ = ["Collection", "CollectionKeys", "CollectionManager", "DEFAULT_COLLECTIONS"]
