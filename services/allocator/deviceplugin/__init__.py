"""The allocator in device-plugin mode (PK_MODE=deviceplugin, the default; docs/contract.md
section 5).

    main.py          wiring: the plugin sockets, registration, the recompute's boards
    registration.py  one plugin socket per resource, registered with kubelet
    plugin.py        the device-plugin API: the servicer, the gRPC status of a `Refusal`, and
                     the ContainerAllocateResponse and partition descriptor (pure builders)
    allocate.py      one Allocate, from kubelet's request to the reply: the shell that gathers
                     what `decide` asks for and acts on its answer, under one deadline
    decide.py        which Pod and container the Allocate serves (`which_pod`), and what
                     follows a plan that wrote nothing (`after_miss`): pure
    podmatch.py      asking the watcher and kubelet about the Pods (the I/O `decide` needs)
    room.py          making room when an Allocate does not fit (asks the watcher, the reclaimer)
    removals.py      the capacity update after a reclaim, in the reclaim's trace
"""
