"""JIT: cached, locked builds of a SourceSet into a shared library.

    key      = readable variant name + hash(rendered sources, templates, flags, compiler,
               torch version, mlagen version)                          (cache.py)
    lock     = one OS-level lock per key; a killed builder's lock dies with it (filelock)
    staging  = build in <cache>/staging/<key>.<pid>, publish by atomic rename to
               <cache>/builds/<key>; a build killed part-way leaves only staging litter
    check    = meta.json records the library's size and sha256; a published entry that no
               longer matches (or has no meta.json) is named, removed and rebuilt, never
               loaded (integrity.py)
"""

from .cache import Artifact, CacheEntry, cache_key, clear, entries
from .compile import build, compile_only, load
from .integrity import CacheError

__all__ = ["Artifact", "CacheEntry", "CacheError", "cache_key", "build", "load",
           "compile_only", "entries", "clear"]
