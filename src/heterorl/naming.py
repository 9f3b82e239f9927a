"""Short, unambiguous names for dotted config keys (sweep run directories, report groups and legends)."""

from __future__ import annotations

GENERIC_PARTS = frozenset({"name", "kind", "count"})  # say little alone: shown with their parent


def short_keys(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key that is unique among `keys` and says what it is: a bare list index
    or a generic part (`name`, `kind`, a list's `count`) keeps its parent (`objective.name`, `weights_delay.kind`)."""
    short = {}
    for key in keys:
        parts = key.split(".")
        n = 1
        while n < len(parts) and (
            parts[-n] in GENERIC_PARTS
            or parts[-n].isdigit()
            or any(o != key and (o == ".".join(parts[-n:]) or o.endswith("." + ".".join(parts[-n:]))) for o in keys)
        ):
            n += 1
        short[key] = ".".join(parts[-n:])
    return short
