"""geotrain: train one PyTorch model across regions.

Peers in several regions run bandwidth-aware pipeline stages; the peers holding
the same stage (a stage group) sync DiLoCo-style every H inner steps with
compressed pseudo-gradients; a cost-aware planner assigns peers to stages;
everything is coordinated over hivemind's DHT.
"""

__version__ = "0.1.0.dev0"
