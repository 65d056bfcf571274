"""``geotrain keygen OUT``: write a new swarm key (a 32-byte secret, Z85 text, mode 0600).

Prints ``{"event": "keygen", "path": ...}``. The key admits peers to the
swarm's data plane (CURVE); share it only with members.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keygen", help="write a new swarm key file", description=__doc__)
    p.add_argument("out", help="path of the key file to create")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.swarm.keys import generate_swarm_key

    path = generate_swarm_key(args.out, overwrite=args.force)
    print(json.dumps({"event": "keygen", "path": str(path)}), flush=True)
    return 0
