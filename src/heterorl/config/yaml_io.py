"""YAML read under bounds: a config is parsed into nodes, its aliases are counted as expanded, and only a document
whose expansion fits is turned into Python data.

PyYAML's composer keeps an alias as a second reference to the anchored node, so parsing is linear in the file;
constructing the data (and the JSON round trip that gives every alias its own copy) is what a "billion laughs"
file turns into gigabytes. The size of a node as expanded is 1 plus the length of a scalar, or 1 plus the sizes
of a collection's children, computed once per distinct node (a post-order walk without recursion); an alias that
refers to a node containing it is a cycle. Both are refused before any data is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from heterorl.config.base import ConfigError

MAX_YAML_BYTES = 4 * 2**20  # a config, sweep or run file is hand-sized: far below this
MAX_EXPANDED_SIZE = 2**24  # characters and nodes of the document with every alias expanded


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_size(root: yaml.Node, limit: int = MAX_EXPANDED_SIZE) -> int:
    """The document's size with every alias expanded; ValueError at a cycle or once the size passes `limit`."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes on the path from the root: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_.discard(key)
            own = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
            sizes[key] = own + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > limit:
                raise ValueError(f"it expands past {limit:,} characters and nodes (a YAML alias used too often)")
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ValueError("a YAML alias refers to the node that contains it")
        open_.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def load_yaml_text(text: str, where: str, error: type[ValueError] = ConfigError) -> Any:
    """Plain data (dicts, lists, str, numbers, bools, None) from one YAML document, every alias its own copy;
    `error(where: why)` for invalid YAML, a cycle, an expansion past the bound, or a non-JSON value (a date)."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{where}: {len(text):,} characters; a YAML file here is at most {MAX_YAML_BYTES:,}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        data = loader.construct_document(node)
        # a JSON round trip gives every alias its own copy, so an override of one list item never silently
        # changes the items that shared the anchor
        return json.loads(json.dumps(data))
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise error(f"{where}: nested too deep") from None
    except TypeError as exc:  # a date, a set or binary data: json.dumps refuses them
        raise error(f"{where}: {exc}; quote dates and write plain strings, numbers, lists and mappings") from None
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | Path, error: type[ValueError] = ConfigError) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file gives {}); `error` names the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise error(f"file not found: {p}")
    if p.stat().st_size > 4 * MAX_YAML_BYTES:  # not read at all (a UTF-8 character is at most 4 bytes)
        raise error(f"{p}: {p.stat().st_size:,} bytes; a YAML file here is at most {MAX_YAML_BYTES:,} characters")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start : exc.start + 1]!r})") from None
    loaded = load_yaml_text(text, str(p), error)
    if loaded is not None and not isinstance(loaded, dict):
        raise error(f"{p}: the top level must be a mapping")
    return loaded or {}
