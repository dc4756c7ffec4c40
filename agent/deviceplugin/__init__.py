"""The kubelet device plugin: advertises the node's cards as HAMi's ``resourceCountName``
(``nvidia.com/gpu`` by default) and gives each container the cards the scheduler chose,
with HAMi-core's limits.

``allocation`` decides (pure), ``source`` asks the daemon which pods wait, ``plugin``
serves the kubelet over gRPC (``_v1beta1``: generated from the kubelet's api.proto).
"""
