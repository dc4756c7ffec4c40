"""Stand-ins for what the tests cannot run for real: the Kubernetes API server, the kubelet's
device plugin API, the NVML library, a /proc tree, a cluster that only lists nodes, a clock
moved by hand."""
