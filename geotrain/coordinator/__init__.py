"""The coordinator: job launch, plan publication, monitoring, replanning, report.

It holds no training state: peers train from the plan on the DHT, so training
goes on if the coordinator dies, and a restarted one reattaches.
"""

from geotrain.coordinator.coordinator import Coordinator, CoordinatorConfig

__all__ = ["Coordinator", "CoordinatorConfig"]
