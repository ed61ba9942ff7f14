"""The allocator: kubelet's partitions from write-ahead claims, with truthful capacity.

Two modes over one core: `core/` (state and views, the claims writer, realising a claim, the
handoff), `deviceplugin/` (kubelet's device-plugin API) and `dra/` (DRA's kubelet plugin and
ResourceSlices); `main.py` picks one by `PK_MODE`. Neither mode imports the other, and the core
imports neither (the import contracts in pyproject.toml).

`serve(config, nc, *, ready=None, options=None)` runs it in process (tests, the embedded stack);
`main()` is the container entrypoint. See docs/allocator.md.
"""

from services.allocator.main import main, serve

__all__ = ["main", "serve"]
