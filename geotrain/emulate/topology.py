"""The part of a scenario that emulation needs: regions and the links between them.

A *scenario* is the planner's JSON file (``docs/scenario.md``): ``regions``,
``links``, ``peers``, ``model``, ``job``. Emulation reads only ``regions`` and
``links`` so the same file both plans and emulates. A *link* here is one
undirected region pair ``{a, b}`` with a bandwidth (``bandwidth_gbps``, decimal
gigabits per second) and a round-trip time (``rtt_ms``); ``a == b`` describes
the links inside one region. Links whose ends are not both region names are
per-peer overrides for the planner; emulation works per region and skips them.

This module parses that part itself (plain dicts, no I/O beyond reading the
file) so emulation does not depend on the planner package.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geotrain.errors import ScenarioError
from geotrain.files import read_structured

logger = logging.getLogger(__name__)

# Region labels become parts of namespace names (gt-<tag>-<region>), so keep them file-name safe.
REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, kw_only=True)
class RegionLink:
    """One undirected region pair: ``bandwidth_bps`` in bytes/s, ``rtt_s`` in seconds."""

    a: str
    b: str
    bandwidth_bps: float
    rtt_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0):
            raise ScenarioError(
                f"link {self.a}-{self.b}: bandwidth_gbps must be a finite number > 0; got {self.bandwidth_bps * 8 / 1e9}"
            )
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ScenarioError(f"link {self.a}-{self.b}: rtt_ms must be a finite number >= 0; got {self.rtt_s * 1e3}")

    @property
    def one_way_delay_s(self) -> float:
        """Half the round trip: the delay one message sees in one direction."""
        return self.rtt_s / 2


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Regions and their links, as emulation sees a scenario.

    ``links`` is keyed by the sorted pair ``(a, b)``; use :meth:`link` to look a
    pair up in either order. Region pairs without a link are unreachable.
    """

    regions: tuple[str, ...]
    links: Mapping[tuple[str, str], RegionLink] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.regions:
            raise ScenarioError('scenario has no regions; add e.g. "regions": {"eu-west": {}}')
        if len(set(self.regions)) != len(self.regions):
            raise ScenarioError(f"scenario lists a region twice: {list(self.regions)}")
        for r in self.regions:
            if not REGION_RE.match(r):
                raise ScenarioError(
                    f"region name {r!r} must be 1-64 characters of letters, digits, '.', '_' or '-', "
                    "starting with a letter or digit"
                )
        for (a, b), link in self.links.items():
            if (a, b) != tuple(sorted((a, b))) or {a, b} != {link.a, link.b}:
                raise ScenarioError(f"links key {(a, b)} must be the sorted pair of its link's ends")
            for end in (a, b):
                if end not in self.regions:
                    raise ScenarioError(f"link {a}-{b} names unknown region {end!r}; add it under 'regions'")

    def link(self, a: str, b: str) -> RegionLink | None:
        """The link between regions ``a`` and ``b`` (either order), or None if there is none."""
        key = (a, b) if a <= b else (b, a)
        return self.links.get(key)

    def inter_region_pairs(self) -> list[tuple[str, str]]:
        """Every ordered pair of distinct regions, in region order."""
        return [(a, b) for a in self.regions for b in self.regions if a != b]


def topology_from_dict(scenario: Mapping[str, Any]) -> Topology:
    """Read ``regions`` and ``links`` of a scenario given as parsed JSON."""
    if not isinstance(scenario, Mapping):
        raise ScenarioError("a scenario must be a JSON object with 'regions' and 'links'")
    regions_raw = scenario.get("regions")
    if isinstance(regions_raw, (Mapping, list)):
        regions = tuple(str(r) for r in regions_raw)
    else:
        raise ScenarioError('scenario needs "regions": an object keyed by region name')
    links_raw = scenario.get("links", [])
    if not isinstance(links_raw, list):
        raise ScenarioError('scenario "links" must be a list of {"a", "b", "bandwidth_gbps", "rtt_ms"}')
    region_set = set(regions)
    links: dict[tuple[str, str], RegionLink] = {}
    for i, raw in enumerate(links_raw):
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"links[{i}] must be an object with a, b, bandwidth_gbps, rtt_ms")
        try:
            a, b = str(raw["a"]), str(raw["b"])
            gbps, rtt_ms = float(raw["bandwidth_gbps"]), float(raw["rtt_ms"])
        except (KeyError, TypeError, ValueError) as e:
            raise ScenarioError(f"links[{i}] needs a, b, bandwidth_gbps (number), rtt_ms (number): {e}") from None
        if a not in region_set or b not in region_set:
            # per-peer overrides matter to the planner; the emulator shapes whole regions
            logger.debug("links[%d] %s-%s is not a region pair; emulation skips it", i, a, b)
            continue
        key = (a, b) if a <= b else (b, a)
        if key in links:
            raise ScenarioError(f"links[{i}] repeats the pair {a}-{b}; keep one entry per region pair")
        links[key] = RegionLink(a=key[0], b=key[1], bandwidth_bps=gbps * 1e9 / 8, rtt_s=rtt_ms / 1e3)
    return Topology(regions=regions, links=links)


def load_topology(path: str | Path) -> Topology:
    """Read the ``regions``/``links`` part of a scenario JSON file."""
    p = Path(path)
    data = read_structured(p, what="scenario file", fmt="json", error=ScenarioError)
    try:
        return topology_from_dict(data)
    except ScenarioError as e:
        raise ScenarioError(f"{p}: {e}") from None


def topology_from_scenario(scenario: Any) -> Topology:
    """The emulation view of a parsed planner scenario (``geotrain.planner.scenario.Scenario``).

    Duck-typed (``.regions`` names, ``.links`` with ``a``, ``b``, ``bandwidth_gbps``,
    ``rtt_ms``) so emulation does not import the planner.
    """
    links = [
        {"a": ln.a, "b": ln.b, "bandwidth_gbps": ln.bandwidth_gbps, "rtt_ms": ln.rtt_ms} for ln in scenario.links
    ]
    return topology_from_dict({"regions": list(scenario.regions), "links": links})
