"""The contracts as data: one JSON Schema per `--json` output and per input or record file (docs/contracts.md).

The schemas ship inside the package, so a script that reads gpuwise's JSON can check it without this
repository: `gpuwise.contracts.validate("estimate", json.loads(out))` (needs the `jsonschema` package,
which gpuwise itself does not: it is imported only here, only when asked). Every `--json` object carries
`schema_version` (SCHEMA_VERSION); the rules for changing a schema are in docs/contracts.md
("Versions and the extend-only rule").
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

# Bumped only when a contract breaks (a key removed, renamed or retyped, a unit or meaning changed): a new
# key, optional or not, does not bump it. See docs/contracts.md.
SCHEMA_VERSION = 1

# every `gpuwise COMMAND --json` output (the CLI's COMMANDS, in its order)
OUTPUTS = ("demo", "gpus", "pick", "run", "estimate", "fit", "measure", "tune", "watch", "launch", "train",
           "scale", "doctor")
# the files gpuwise reads or writes
FILES = ("fake-gpus", "fake-torch", "truth-record", "published-row")


def names() -> tuple[str, ...]:
    """Every schema there is: the command outputs, then the files."""
    return OUTPUTS + FILES


@cache
def _text(name: str) -> str:
    if name not in names():
        raise ValueError(f"no schema named {name!r}; there are: {', '.join(names())}")
    return resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `gpuwise NAME --json`, or of a file (`fake-gpus`, `truth-record` ...)."""
    return json.loads(_text(name))


def validate(name: str, obj: Any) -> None:
    """Raise `jsonschema.ValidationError` unless `obj` follows schema `name` (needs `pip install jsonschema`)."""
    try:
        import jsonschema
    except ImportError as exc:  # not a gpuwise dependency: only users who validate need it
        raise ImportError("gpuwise.contracts.validate needs the jsonschema package: pip install jsonschema") from exc
    jsonschema.Draft202012Validator(schema(name)).validate(obj)
