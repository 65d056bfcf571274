"""DiLoCo rounds in stage groups: hierarchical compressed all-reduce, streaming fragments, overlap.

- :class:`DiLoCoConfig`: the one config (H, outer optimizer, codecs, fragments, deadline, quorum, ...).
- :class:`DiLoCoSync`: one member's side; a peer agent calls ``after_inner_step(step)``.
- :class:`Membership` / :class:`StaticMembership` / :class:`Member`: who is in a round.
- :class:`RoundOutcome`, :class:`SyncStats`: what a round did, bytes sent in and across regions.
- :class:`HivemindDiLoCoSync` (``geotrain.sync.hivemind_backend``): the same outer loop on
  hivemind's DecentralizedAverager, the flat OpenDiLoCo baseline.

See :mod:`geotrain.sync.round` for the protocol and its failure handling.
"""

from geotrain.sync.config import DiLoCoConfig
from geotrain.sync.diloco import DiLoCoSync
from geotrain.sync.membership import Member, Membership, RoundId, RoundRoles, StaticMembership
from geotrain.sync.outer import Fragment, OuterState, split_fragments
from geotrain.sync.round import GroupRouter, RoundOutcome, RoundStatus, SyncStats

__all__ = [
    "DiLoCoConfig",
    "DiLoCoSync",
    "Fragment",
    "GroupRouter",
    "Member",
    "Membership",
    "OuterState",
    "RoundId",
    "RoundOutcome",
    "RoundRoles",
    "RoundStatus",
    "StaticMembership",
    "SyncStats",
    "split_fragments",
]
