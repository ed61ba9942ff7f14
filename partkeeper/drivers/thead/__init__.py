"""T-Head PPU: MIG through HGML (libhgml.so, ctypes). `api` declares the library, `catalogue`
reads its profiles, `binding` calls it, `nodes` names what a container gets."""
