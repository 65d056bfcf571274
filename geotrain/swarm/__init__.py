"""The control plane: typed, signed records on hivemind's DHT.

- :class:`Swarm` / :class:`SwarmConfig`: join the swarm's DHT, publish and read records.
- :mod:`geotrain.swarm.records`: the records (:class:`PeerRecord`, :class:`LinkRow`,
  :class:`JobRecord`, :class:`PlanRecord`, :class:`ProgressRecord`).
- :mod:`geotrain.swarm.schema`: the validators every node runs (limits, signature, schema).
- :mod:`geotrain.swarm.msgpack_guard`: the pre-decode scan that keeps poisoned records
  from crashing a reader.
- :class:`Heartbeat`: republishes a peer record; a dead peer vanishes within 3 periods and an RPC timeout.
- :mod:`geotrain.swarm.keys`: the swarm's shared secret (``geotrain keygen``).

Importing this package does not import hivemind or torch; starting a :class:`Swarm` does.
"""

from geotrain.swarm.heartbeat import Heartbeat
from geotrain.swarm.records import JobRecord, LinkMeasurement, LinkRow, PeerRecord, PlanRecord, ProgressRecord
from geotrain.swarm.swarm import Swarm, SwarmConfig

__all__ = [
    "Heartbeat",
    "JobRecord",
    "LinkMeasurement",
    "LinkRow",
    "PeerRecord",
    "PlanRecord",
    "ProgressRecord",
    "Swarm",
    "SwarmConfig",
]
