"""The repository's harness: what runs from a checkout and never ships in the wheel.

The product (``common``, ``agent``, ``scheduler``, ``pyhami``) never imports it (an import
contract holds it); it may import the product. Here:

- ``controlplane``: a real etcd and kube-apiserver (and the shipped kube-scheduler
  configuration, ``k8s/``'s manifests, the chart), built by ``scripts/build-control-plane.sh``;
  the end-to-end suite (``tests/e2e``) and the cluster benchmark run on it.
- ``bench_cluster``: kube-scheduler with pyhami against kube-scheduler alone on that plane
  (``scripts/bench-cluster``, the flags ``pyhami bench cluster`` had).
- ``bench_simulate``: the simulator's engine on a synthetic trace (``scripts/bench-simulate``).
- ``check_hami_webui``: HAMi-WebUI's server against the nodes pyhami registers, on the
  control plane (``scripts/check-hami-webui``, a manual check).
- ``benchmarks/``: micro-benchmarks run as scripts (``python harness/benchmarks/NAME.py``),
  some on the test suite's builders.

The benchmarks an installed pyhami runs itself are ``pyhami bench``'s (``pyhami/bench/``).
"""
