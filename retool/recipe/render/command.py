"""What a stage runs: one frozen value the renderers return and the entrypoint executes.

A ``StageCommand`` is data, not behaviour: ``retool render`` prints it, ``retool.stage`` writes its
files and runs it, the tracking code logs it as an artifact, and the tests compose its Hydra
overrides against verl's own configuration. Keeping it plain (tuples and mappings of strings)
is what lets all four agree on exactly the same command.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

LATEST = "<latest>"
"""Stands for the latest checkpoint step in a rendered command until the stage resolves it.

Which ``global_step_N`` is the latest is known only on the PVC at run time, so the renderer (pure)
writes this token and ``StageCommand.with_latest_step`` replaces it (``retool.stage`` reads the step
with ``retool.storage.steps.latest_step``)."""


class RenderError(ValueError):
    """A spec that validates but cannot be turned into a working command (says which field to fix)."""


_BARE_STRING = re.compile(r"^[A-Za-z_/~][A-Za-z0-9_./:~\-]*$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}


def _quoted(text: str) -> str:
    """A Hydra quoted string (double quotes read best inside the single quotes of a shell).

    Hydra keeps backslashes literal except before a quote (and so before the closing quote), and
    OmegaConf would resolve ``${...}`` even inside quotes, so exactly those are escaped.
    """
    escaped = re.sub(r'(\\*)("|$)', lambda m: m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else ""), text)
    return '"' + escaped.replace("${", "\\${") + '"'


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar, so that it composes back to exactly ``value``.

    Strings that Hydra would read as another type (``true``, ``null``, ``1e-5``) or that hold
    characters outside its bare-word grammar are single-quoted; list elements are always quoted.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if _BARE_STRING.match(value) and value.lower() not in _RESERVED:
            return value
        return _quoted(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_quoted(v) if isinstance(v, str) else hydra_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} {value!r} as a Hydra override value")


def hydra_overrides(overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """``key=value`` strings in insertion order (a ``+`` prefix only where the key opts in)."""
    return tuple(f"{key}={hydra_value(value)}" for key, value in overrides.items())


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class StageCommand:
    """The exact process a stage runs.

    ``argv`` is executed without a shell. ``env`` is added to the pod's environment. ``files`` are
    written (path -> content) before ``argv`` runs, e.g. the tool config the RL rollout loads.
    ``pre`` are commands run first, in order, each of which must succeed (the eval stage merges
    the final RL checkpoint before evaluating it). ``config_name`` and ``overrides`` repeat the
    Hydra part of ``argv`` as data (``None`` for commands that are not verl Hydra entry points).
    ``notes`` say which values the cluster supplies at run time.
    ``checkpoint_source`` says where the stage finds the step that replaces :data:`LATEST`.
    """

    stage: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    pre: tuple[tuple[str, ...], ...] = ()
    config_name: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    checkpoint_source: tuple[str, str] | None = None
    """(checkpoints directory, required sub-directory) whose latest step replaces :data:`LATEST`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "pre", tuple(tuple(step) for step in self.pre))
        object.__setattr__(self, "env", _frozen(self.env))
        object.__setattr__(self, "files", _frozen(self.files))
        object.__setattr__(self, "overrides", _frozen(self.overrides))

    @property
    def needs_latest_step(self) -> bool:
        return any(LATEST in arg for step in (*self.pre, self.argv) for arg in step)

    def with_latest_step(self, step: int) -> StageCommand:
        """The command with :data:`LATEST` replaced by the checkpoint step found at run time."""
        if step < 0:
            raise ValueError(f"checkpoint steps are non-negative, got {step}")

        def sub(args: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(arg.replace(LATEST, str(step)) for arg in args)

        return replace(self, argv=sub(self.argv), pre=tuple(sub(p) for p in self.pre))

    def with_overrides(self, updates: Mapping[str, Any]) -> StageCommand:
        """The command with Hydra overrides replaced (in place in ``argv``) or added (at its end).

        For values known only when the stage starts (the SFT save frequency, a resume path).
        """
        if self.config_name is None:
            raise ValueError(f"the {self.stage} command is not a Hydra entry point: it has no overrides to change")
        rendered = dict(zip(updates, hydra_overrides(updates), strict=True))
        argv = []
        for arg in self.argv:
            key = arg.partition("=")[0]
            argv.append(rendered.pop(key) if key in rendered and key in self.overrides else arg)
        argv.extend(rendered.values())
        return replace(self, argv=tuple(argv), overrides={**self.overrides, **updates})

    def steps(self) -> tuple[tuple[str, ...], ...]:
        """Every command in execution order: ``pre`` then ``argv``."""
        return (*self.pre, self.argv)

    def shell(self) -> str:
        """A copy-pasteable shell rendering: exported environment, then each command."""
        lines = [f"export {key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        for step in self.steps():
            lines.append(_multiline(step))
        return "\n".join(lines)

    def script(self) -> str:
        """The whole stage as a shell script: write ``files``, then what :meth:`shell` shows."""
        return "\n".join([*(_heredoc(path, content) for path, content in self.files.items()), self.shell()])


def _heredoc(path: str, content: str) -> str:
    marker = "EOF"
    while marker in content.splitlines():
        marker += "_"
    return f"mkdir -p {shlex.quote(posixpath.dirname(path))}\ncat > {shlex.quote(path)} <<'{marker}'\n{content.rstrip()}\n{marker}"


def _multiline(argv: tuple[str, ...]) -> str:
    """One argument per line after the program, the way recipe scripts are written."""
    quoted = [shlex.quote(arg) for arg in argv]
    head_len = next((i for i, arg in enumerate(argv) if "=" in arg and not arg.startswith("-")), len(argv))
    head = " ".join(quoted[:head_len])
    rest = quoted[head_len:]
    if not rest:
        return head
    return " \\\n    ".join([head, *rest])
