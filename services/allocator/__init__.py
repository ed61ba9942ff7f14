"""The allocator: kubelet device plugin with write-ahead claims and truthful capacity.

`serve(config, nc, *, ready=None, options=None)` runs it in process (tests, the embedded stack);
`main()` is the container entrypoint. See docs/allocator.md.
"""

from services.allocator.main import main, serve

__all__ = ["main", "serve"]
