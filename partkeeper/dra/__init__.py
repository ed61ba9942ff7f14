"""DRA mode (docs/contract.md section 11): partitions as partitionable devices of
`resource.k8s.io/v1`.

`devices` names and orders what a card can offer, `slices` turns a snapshot into the node's
ResourceSlices. Both are pure; the shells that publish and prepare live in the allocator.
"""

DRIVER = "partitions.partkeeper.io"
