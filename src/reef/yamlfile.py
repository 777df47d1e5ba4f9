"""YAML that people write: a key set twice in one mapping is an error, not a silent overwrite.

PyYAML keeps the last value of a repeated key without a word, so a `reef.yaml` that sets
`gate.temperature` twice serves with whichever came last. Reef reads its files through
`load_yaml`, which refuses them with the file, the line and the dotted key:
`reef.yaml line 58: gate.temperature is set twice (first at line 57)`.
"""

from __future__ import annotations

import io
from typing import Any

import yaml


class DuplicateKey(ValueError):
    """A mapping of the document sets the same key twice."""


def load_yaml(text: str, source: str) -> Any:
    """The document in `text` as Python values; `source` names it in errors (a file name),
    PyYAML's own included, which would otherwise say `"<unicode string>"`."""
    root = yaml.compose(_named(text, source), Loader=yaml.SafeLoader)
    refuse_duplicate_keys(root, source)
    return yaml.safe_load(_named(text, source))


def _named(text: str, source: str) -> io.StringIO:
    stream = io.StringIO(text)
    stream.name = source  # PyYAML's marks name a stream by its `name`
    return stream


def refuse_duplicate_keys(node: yaml.Node | None, source: str, path: str = "") -> None:
    """Raise `DuplicateKey` for the first mapping under `node` that sets a key twice."""
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            dotted = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in first_line and key != "<<":  # `<<` merges: several are allowed
                raise DuplicateKey(
                    f"{source} line {line}: {dotted} is set twice (first at line {first_line[key]})"
                )
            first_line[key] = line
            refuse_duplicate_keys(value_node, source, dotted)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            refuse_duplicate_keys(item, source, f"{path}[{index}]")
