"""The allocator in DRA mode (PK_MODE=dra, docs/contract.md section 11; see docs/dra.md).

    publish.py    the node's ResourceSlices, re-published on every change of claims or hardware
    slicewatch.py the watch of those slices: a change somebody else made wakes the publisher
    requests.py   what a ResourceClaim asks this node to prepare (pure)
    prepare.py    NodePrepareResources / NodeUnprepareResources over the claims store
    ends.py       when a ResourceClaim's use on the node has ended: its partition is released
    versions.py   which Kubernetes versions DRA mode publishes for (pure)
    plugin.py     the kubelet plugin: registration and DRA service sockets
    kube.py       the resource.k8s.io/v1 calls
    main.py       wiring
"""
