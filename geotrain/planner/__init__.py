"""The planner: a cost model and a cost-aware, bandwidth-aware stage assignment.

Pure code: no I/O, no torch, no networking. ``geotrain plan`` reads scenario
files; the coordinator builds the same :class:`Scenario` from DHT records.

>>> from geotrain.planner import Scenario, plan
>>> result = plan(Scenario.from_dict(d), objective="cost")   # doctest: +SKIP
>>> result.to_json()["predicted"]["tokens_per_s"]             # doctest: +SKIP
"""

from geotrain.planner.costmodel import CostModel, Prediction, StageAssignment, evaluate
from geotrain.planner.objective import Objective
from geotrain.planner.plan import BASELINES, PlanResult, plan
from geotrain.planner.profile import LayerProfile, transformer_profile
from geotrain.planner.scenario import Job, Link, ModelSpec, Peer, Region, Scenario

__all__ = [
    "BASELINES",
    "CostModel",
    "Job",
    "LayerProfile",
    "Link",
    "ModelSpec",
    "Objective",
    "Peer",
    "PlanResult",
    "Prediction",
    "Region",
    "Scenario",
    "StageAssignment",
    "evaluate",
    "plan",
    "transformer_profile",
]
