"""Regenerate the JSON scenarios in this folder from ``geotrain.planner.catalog``.

Run ``python examples/scenarios/generate.py``; commit the JSON it writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from geotrain.planner.catalog import ESTIMATED, dtfm_scenario, heterogeneous_price
from geotrain.planner.generate import heterogeneous_mix, new_user_swarm, uneven_swarm

HERE = Path(__file__).resolve().parent


def main() -> None:
    files = {f"dtfm_case{case}.json": dtfm_scenario(case) for case in range(1, 6)}
    files["heterogeneous_price.json"] = heterogeneous_price()
    files["uneven_64.json"] = uneven_swarm(0)
    files["new_user_swarm.json"] = new_user_swarm()
    files["heterogeneous_mix.json"] = heterogeneous_mix()
    for name, d in files.items():
        (HERE / name).write_text(json.dumps(d, indent=1) + "\n")
        print(f"wrote {name}: {len(d['peers'])} peers, {len(d['regions'])} regions")
    print("estimated (relayed) region pairs:", sorted(ESTIMATED))


if __name__ == "__main__":
    main()
