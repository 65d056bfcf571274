"""Who takes part in a round, and which role each member plays in it.

What is a *member*? A peer of the stage group: its id, region and data-plane
address. A :class:`Membership` answers "who is in round ``r`` of fragment
``f``?"; every member must get the same answer for the same round (the DHT
backed one reads the live members of the stage group for the job and plan
version; :class:`StaticMembership` is a fixed list for tests and demos).

What are the *roles*? Computed by every member from the same member list,
with no message exchanged (:class:`RoundRoles`):

- a *region group* is the members of one region (each member alone when the
  all-reduce is flat);
- its *leader* gathers the region's pseudo-gradients and sends the result
  back; leaders rotate with the round number so no peer carries every round;
- the *coordinator* is the leader of the first region group: it decides which
  region groups are counted in the round (or that the round is discarded);
- the counted leaders, in group order, each *own* one shard of the fragment
  (reduce-scatter across regions, then all-gather).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from geotrain.errors import ConfigError

__all__ = ["Member", "Membership", "StaticMembership", "RoundId", "RoundRoles"]


@dataclass(frozen=True, order=True)
class Member:
    """One peer of a stage group."""

    peer_id: str
    region: str
    address: str

    def __post_init__(self) -> None:
        if not self.peer_id or not self.region:
            raise ConfigError(f"a member needs a peer_id and a region; got {self!r}")
        # dialback://: a member behind NAT, answered over the connection it opens (geotrain.transport.addresses)
        if not self.address.startswith(("tcp://", "dialback://")):
            raise ConfigError(f"member {self.peer_id} address must be tcp://host:port or dialback://; "
                              f"got {self.address!r}")


@dataclass(frozen=True, order=True)
class RoundId:
    """Round ``number`` of ``fragment`` (the k-th sync of that fragment)."""

    fragment: int
    number: int


@runtime_checkable
class Membership(Protocol):
    """The members of a round. Must be identical on every member for the same round."""

    def members(self, round_id: RoundId) -> Sequence[Member]: ...


class StaticMembership:
    """A fixed member list (tests, demos). :meth:`replace` swaps it, as a DHT update would."""

    def __init__(self, members: Sequence[Member]) -> None:
        self._lock = threading.Lock()
        self._members: tuple[Member, ...] = ()
        self.replace(members)

    def replace(self, members: Sequence[Member]) -> None:
        ids = [m.peer_id for m in members]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"member peer ids must be unique; got {ids}")
        with self._lock:
            self._members = tuple(sorted(members))

    def members(self, round_id: RoundId) -> Sequence[Member]:
        with self._lock:
            return self._members


@dataclass(frozen=True)
class RoundRoles:
    """Every role of one round, derived from the member list alone (see the module docstring)."""

    groups: tuple[tuple[str, tuple[Member, ...]], ...]  # (group key, members sorted by peer id), key order
    leaders: dict[str, Member]  # group key -> leader

    @classmethod
    def build(cls, members: Sequence[Member], round_id: RoundId, *, hierarchical: bool) -> RoundRoles:
        if not members:
            raise ConfigError("a round needs at least one member")
        by_group: dict[str, list[Member]] = {}
        for m in sorted(members):
            by_group.setdefault(m.region if hierarchical else m.peer_id, []).append(m)
        groups = tuple((key, tuple(by_group[key])) for key in sorted(by_group))
        # rotate leaders with the round so one slow or dead peer does not lead every round
        turn = round_id.number + round_id.fragment
        leaders = {key: ms[turn % len(ms)] for key, ms in groups}
        return cls(groups=groups, leaders=leaders)

    @property
    def coordinator(self) -> Member:
        return self.leaders[self.groups[0][0]]

    def group_of(self, peer_id: str) -> str:
        for key, ms in self.groups:
            if any(m.peer_id == peer_id for m in ms):
                return key
        raise ConfigError(f"peer {peer_id} is not a member of this round")

    def members_of(self, key: str) -> tuple[Member, ...]:
        return dict(self.groups)[key]

    @property
    def all_members(self) -> tuple[Member, ...]:
        return tuple(m for _, ms in self.groups for m in ms)
