"""``pyhami bench``: the benchmarks that run on an installed pyhami, one module each.

``command`` registers them: ``decide`` (the decision core, on the seeded random clusters
of ``synthetic``), ``agent`` (publishing and decoding inventories), ``monitor`` (the node
monitor), ``extender`` (the daemon over HTTP, with its load generator ``load`` and its
no-op floor ``floor``) and ``fleet`` (simulated agents over a NATS cluster of three) need
nothing the wheel does not bring; ``loopback`` is their plain GET. ``cluster`` needs a
checkout of the repository (the control plane's binaries, ``k8s/``, ``charts/``): it is
the harness's command ``scripts/bench-cluster``, and ``pyhami bench cluster`` only says so.

The package itself imports nothing: its modules run as processes of their own too
(``python -m pyhami.bench.load``, ``python -m pyhami.bench.floor``), which should not load
every bench first.
"""
