"""The reclaimer: destroys the partitions of Pods the watcher confirms gone or finished, fenced by
the claims store, and reports foreign instances. See docs/reclaimer.md.
"""
