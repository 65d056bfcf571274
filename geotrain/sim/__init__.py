"""Discrete-event simulation of large swarms on the planner's cost model (no network).

``simulate(scenario, SimConfig(hours=24, churn_per_hour=0.1))`` plays a job out
round by round with churn, repairs, replans (by the real planner) and money;
``onef1b.simulate_step`` plays one pipeline's inner step microbatch by
microbatch. ``geotrain simulate`` is the command.
"""

from geotrain.sim.config import SimConfig
from geotrain.sim.engine import Simulation, simulate
from geotrain.sim.host import HostModel, peer_cpu_terms
from geotrain.sim.onef1b import PipelineTiming, simulate_step, timing_from_plan
from geotrain.sim.result import SimResult

__all__ = ["HostModel", "PipelineTiming", "SimConfig", "SimResult", "Simulation", "simulate", "simulate_step", "timing_from_plan",
           "peer_cpu_terms"]
