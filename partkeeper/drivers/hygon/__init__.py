"""Hygon DCU: MIG through DMI (libhydmi_mig.so.1, ctypes). `api` declares the library,
`catalogue` reads its profiles, `binding` calls it, `host` reads the registry and names what a
container gets."""
