"""``pyhami watch``: a live terminal view of the scheduler's telemetry on NATS.

It folds three streams into one picture: the daemon's per-node card usage
(``pyhami.usage.<node>``), its decisions (``pyhami.decisions``) and the agents'
inventories (``pyhami.inventory.<node>``), which say when a node was last heard
from and whether its cards are healthy.

- ``_model``: the messages folded into nodes, cards and decisions; pure, times passed in.
- ``_view``: the model as rich tables or JSON documents.
- ``_shell``: the command's arguments, the NATS subscription and the loops.
"""

from pyhami.watch._model import WatchModel
from pyhami.watch._shell import register
from pyhami.watch._view import render, snapshot_document

__all__ = ["WatchModel", "register", "render", "snapshot_document"]
