"""The GC: collects the logical-slice artifacts it owns from per-Pod working directories.

It deletes only `c-*/sliced/` trees carrying the allocator's ownership mark, and then empty
directories, and only after the watcher confirms the Pod gone or finished and the allocator's
claim query answers. See docs/gc.md.
"""
