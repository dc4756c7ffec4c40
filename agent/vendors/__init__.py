"""The card vendors behind one seam (``agent.vendors.port``), a package each:
``agent.vendors.nvidia`` is the first. The agent's command chooses one at start-up."""
