"""Processes of a swarm on this machine: what ``geotrain demo`` and the multi-process tests start.

- :mod:`geotrain.local.procs`: launch ``geotrain`` child processes, wait for their JSON ``ready`` line,
  and reap them (SIGTERM, then SIGKILL) whatever happens.
- :mod:`geotrain.local.swarm`: a bootstrap DHT node and one peer per region, all ready.
"""
