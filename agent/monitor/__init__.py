"""HAMi's node monitor, inside the agent: what containers actually use on the node's cards.

Two sources, one model (``agent.monitor.model``): HAMi-core's shared cache files, one per
container under the containers folder (``agent.monitor.cache``), where HAMi-core runs;
NVML's running processes, mapped to pods through each process's cgroup
(``agent.monitor.processes``), everywhere. The priority feedback loop writes back into the
cache files (``agent.monitor.feedback``).
"""
