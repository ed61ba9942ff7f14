"""The allocator in DRA mode (PK_MODE=dra, docs/contract.md section 11; see docs/dra.md).

    publish.py   the node's ResourceSlices, re-published on every change of claims or hardware
    requests.py  what a ResourceClaim asks this node to prepare (pure)
    prepare.py   NodePrepareResources / NodeUnprepareResources over the claims store
    plugin.py    the kubelet plugin: registration and DRA service sockets
    kube.py      the resource.k8s.io/v1 calls
    main.py      wiring
"""
