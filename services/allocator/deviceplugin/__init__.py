"""The allocator in device-plugin mode (PK_MODE=deviceplugin, the default; docs/contract.md
section 5).

    main.py          wiring: the plugin sockets, registration, the recompute's boards
    registration.py  one plugin socket per resource, registered with kubelet
    plugin.py        the device-plugin API servicer; a `Refusal` becomes a gRPC status here
    allocate.py      one Allocate, from kubelet's request to the reply (the shell)
    whichpod.py      which Pod and container the Allocate serves, and whether it is kubelet's
                     retry: pure decisions over what podmatch.py gathered
    podmatch.py      asking the watcher and kubelet about the Pods (the I/O of those decisions)
    where.py         where the partitions go and what follows a plan that wrote nothing (pure)
    room.py          making room when an Allocate does not fit (asks the watcher, the reclaimer)
    reply.py         the ContainerAllocateResponse and the partition descriptor (pure)
    removals.py      the capacity update after a reclaim, in the reclaim's trace
"""
