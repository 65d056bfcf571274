"""Reading the user's structured files (job TOML, scenario and topology JSON) with one set of refusals.

Every refusal is a typed error naming the file: unreadable, not UTF-8, nested
absurdly deep (both parsers recurse once per level, so a hostile file thousands
of levels deep is refused by a scan before parsing, and a RecursionError is
caught as a second line), or not valid TOML/JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import tomllib

from geotrain.errors import ConfigError

__all__ = ["read_structured", "too_deep"]

MAX_DEPTH = 32  # no geotrain file nests arrays/tables/objects deeper than a handful of levels


def too_deep(text: str, *, limit: int = MAX_DEPTH) -> bool:
    """Bracket nesting beyond ``limit`` outside strings and comments, found without recursion."""
    depth = 0
    quote = ""
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth = max(0, depth - 1)
    return False


def read_structured(
    path: str | Path, *, what: str, fmt: Literal["toml", "json"], error: type[ConfigError] = ConfigError
) -> Any:
    """Parse ``path`` as ``fmt``; ``what`` names the file in errors ("job file", "scenario file", ...)."""
    p = Path(path)
    kind = fmt.upper()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {p} is not UTF-8 text (byte {e.start}); write it as {kind}") from None
    if too_deep(text):
        raise error(f"{what} {p} nests arrays, tables or objects too deeply")
    try:
        return tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise error(f"{what} {p} is not valid {kind}: {e}") from None
    except RecursionError:  # second line: the scan above is heuristic about quotes
        raise error(f"{what} {p} nests arrays, tables or objects too deeply") from None
