"""NVIDIA, the first vendor behind the agent's seam (``agent.vendors.port``): its cards
read through NVML (``nvml``) or simulated (``simulated``), and what the kubelet's device
plugin gives a container of them (``containers``, ``plugin``, with HAMi-core's contract in
``hamicore``). The core's description of the vendor is ``common.core.vendors.NVIDIA``."""
