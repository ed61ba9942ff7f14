"""NVIDIA: MIG through NVML (nvidia-ml-py). `binding` calls the library, `tables` checks what it
reports against profiles.py, `check` is `partkeeper probe --check [--mutate]`."""
