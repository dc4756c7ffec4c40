"""MIG on the node: the NVML calls that create and destroy GPU instances (a port, its
implementation over pynvml, and a simulated library that enforces NVML's placements), the
manager that keeps exactly the instances the node's pods reserved, and the tables of the
cards the simulated inventory offers."""
