"""The simulated scheduler of DRA mode: the structured allocator's rules over the simulated API.

    allocate.py  pure: complete pools, counters left, first fit in slice order
    cel.py       the small CEL subset device selectors use here
    claims.py    pure: a Pod's claims, claims from templates, what happens when Pods are done
    loop.py      the shell: claims from templates, allocation, reservation, binding, release
"""
