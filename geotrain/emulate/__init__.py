"""Multi-region emulation on one machine.

- :mod:`~geotrain.emulate.topology`: the regions/links part of a scenario file.
- :mod:`~geotrain.emulate.netns`: regions as network namespaces, links shaped with htb (root).
- :mod:`~geotrain.emulate.links`: :class:`LinkEmulator`, the per-destination delay (and
  no-root bandwidth) hook the transport calls before each send. Emulation only.
"""

from geotrain.emulate.commands import EmulationConfig
from geotrain.emulate.links import LinkEmulator, LinkEmulatorConfig, LinkPath, SendEmulator
from geotrain.emulate.netns import Emulation, check_privileges, cleanup, status
from geotrain.emulate.topology import (
    RegionLink,
    Topology,
    load_topology,
    topology_from_dict,
    topology_from_scenario,
)

__all__ = [
    "Emulation",
    "EmulationConfig",
    "LinkEmulator",
    "LinkEmulatorConfig",
    "LinkPath",
    "RegionLink",
    "SendEmulator",
    "Topology",
    "check_privileges",
    "cleanup",
    "load_topology",
    "status",
    "topology_from_dict",
    "topology_from_scenario",
]
