"""A small Dockerfile reader and the image rules every ReTool Dockerfile must follow.

There is no Docker engine where the tests run, so the rules are checked on the text: pinned
bases, pinned pip installs (a ``-r`` file counts when it is a file of the build context, copied
into the image, whose every requirement is ``name==version``: a lock), a non-root user (or a
written reason), OCI labels, no remote ADD, and a health check (or a written probe). Comments starting with ``# root-required:`` and
``# probe:`` are how a Dockerfile justifies an exception; the rules read them.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED_LABELS = ("title", "description", "version", "licenses")
PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "--prefix", "--target", "-t", "--root", "-i", "--index-url", "--extra-index-url", "--cache-dir", "--python"}
PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
LOCAL_PROJECT = re.compile(r"^\.(\[(?P<extras>[A-Za-z0-9_,-]+)\])?$")


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str

    def json_args(self) -> list[str] | None:
        """The exec form (``["a", "b"]``) as a list, or None for the shell form."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, list) else None
        return None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    path: Path
    stages: list[Stage]
    comments: list[str]
    args: dict[str, str]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def justification(self, tag: str) -> str:
        """Text of the ``# <tag>:`` comment (continued on following comment lines), or ''."""
        for i, comment in enumerate(self.comments):
            if comment.startswith(f"{tag}:"):
                text = [comment.removeprefix(f"{tag}:").strip()]
                for nxt in self.comments[i + 1 :]:
                    if re.match(r"^[a-z-]+:", nxt) or not nxt:
                        break
                    text.append(nxt)
                return " ".join(text).strip()
        return ""


def parse(path: Path) -> Dockerfile:
    return parse_text(path.read_text(), path)


def parse_text(text: str, path: Path = Path("Dockerfile")) -> Dockerfile:
    """Logical instructions (continuations joined, comments set aside), split into stages."""
    stages: list[Stage] = []
    comments: list[str] = []
    global_args: dict[str, str] = {}
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            if not stripped.startswith("# syntax=") and not stripped.startswith("# escape="):
                comments.append(stripped.lstrip("#").strip())
            continue
        if not stripped and not pending:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        logical = " ".join(p for p in pending if p)
        pending = []
        keyword, _, args = logical.partition(" ")
        ins = Instruction(start, keyword.upper(), args.strip())
        if ins.keyword == "FROM":
            stages.append(_stage(ins.args, global_args))
        elif not stages:
            if ins.keyword == "ARG":
                name, eq, default = ins.args.partition("=")
                if eq:
                    global_args[name.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(ins)
    if pending:
        raise ValueError(f"{path}: file ends inside a line continuation")
    if not stages:
        raise ValueError(f"{path}: no FROM instruction")
    return Dockerfile(path, stages, comments, global_args)


def _stage(args: str, global_args: dict[str, str]) -> Stage:
    words = [w for w in args.split() if not w.startswith("--platform")]
    image = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0])
    name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
    return Stage(image, name)


def image_tag(reference: str) -> str | None:
    """The tag of ``[registry[:port]/]repo[:tag][@digest]``, or None when untagged."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def pip_installs(run_args: str) -> list[list[str]]:
    """Argument lists of every ``pip install`` in a RUN command (shell form)."""
    out = []
    for command in re.split(r"&&|\|\||;|\|", run_args):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for i, word in enumerate(words):
            if word == "pip" or word.endswith("/pip") or word == "pip3" or (word == "-m" and i + 1 < len(words) and words[i + 1] == "pip"):
                j = i + 2 if word == "-m" else i + 1
                if j < len(words) and words[j] == "install":
                    out.append(words[j + 1 :])
                break
    return out


LockReader = Callable[[str], "list[str] | None"]
"""Path in the image -> the unpinned lines of the context files copied there (None: not a copied file)."""


def unpinned_requirements(args: list[str], pinned_extras: set[str], locks: LockReader | None = None) -> list[str]:
    """Requirements of one ``pip install`` that are neither ``name==version`` nor this project with a pinned extra."""
    bad = []
    skip = False
    requirement_file = False
    for word in args:
        if requirement_file:
            requirement_file = False
            unpinned = locks(word) if locks is not None else None
            if unpinned is None:
                bad.append(f"-r {word} (requirements not visible to the rule check)")
            bad.extend(f"-r {word}: {line}" for line in unpinned or [])
            continue
        if skip:
            skip = False
            continue
        if word in ("-r", "--requirement"):
            requirement_file = True
            continue
        if word in PIP_OPTIONS_WITH_VALUE:
            skip = True
            continue
        if word.startswith("-"):
            if word in ("-e", "--editable") or word.startswith(("--requirement=", "-r")):
                bad.append(f"{word} (requirements not visible to the rule check)")
            continue
        local = LOCAL_PROJECT.match(word)
        if local:
            extras = set((local.group("extras") or "").split(",")) - {""}
            if not extras or not extras <= pinned_extras:
                bad.append(f"{word} (this project needs an extra whose dependencies are all pinned)")
        elif not PINNED_REQUIREMENT.match(word):
            bad.append(word)
    return bad


def copied_locks(stage: Stage, context: Path | None) -> LockReader:
    """Reads requirement files that a COPY of this stage put at a path (``$(...)`` in the path matches any text)."""

    def read(image_path: str) -> list[str] | None:
        if context is None:
            return None
        pattern = re.sub(r"\$\([^)]*\)|\$\{[^}]*\}|\$\w+", "*", image_path)
        sources = []
        for ins in stage.all("COPY"):
            words = [w for w in ins.args.split() if not w.startswith("--")]
            *srcs, dest = words
            for src in srcs:
                target = dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") or len(srcs) > 1 else dest
                if fnmatch.fnmatch(target, pattern):
                    sources.append(context / src)
        if not sources:
            return None
        unpinned = []
        for source in sources:
            if not source.is_file():
                return None
            for line in source.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line and not PINNED_REQUIREMENT.match(line):
                    unpinned.append(f"{source.name}: {line}")
        return unpinned

    return read


def violations(df: Dockerfile, pinned_extras: set[str], context: Path | None = None) -> list[str]:
    """Every broken rule, as 'rule: detail' lines; empty when the Dockerfile follows them all.

    ``context`` is the build context (the repository root), where ``-r`` files are read.
    """
    out: list[str] = []
    names = {s.name for s in df.stages if s.name}
    for stage in df.stages:
        if stage.base in names or stage.base == "scratch":
            continue
        if "$" in stage.base:
            out.append(f"pinned base: {stage.base} uses an ARG without a default")
            continue
        tag = image_tag(stage.base)
        if tag is None and "@sha256:" not in stage.base:
            out.append(f"pinned base: {stage.base} has no tag")
        elif tag == "latest" or (tag and tag.startswith("latest")):
            out.append(f"pinned base: {stage.base} uses latest")
    for stage in df.stages:
        for ins in stage.all("RUN"):
            for args in pip_installs(ins.args):
                for req in unpinned_requirements(args, pinned_extras, copied_locks(stage, context)):
                    out.append(f"pinned pip install: line {ins.line}: {req}")
        for ins in stage.all("ADD"):
            if re.search(r"(^|\s)(https?://|git@|ftp://)", ins.args):
                out.append(f"no remote ADD: line {ins.line}: {ins.args}")
    final = df.final
    users = final.all("USER")
    user = users[-1].args.split(":")[0] if users else "root"
    if user in ("root", "0"):
        reason = df.justification("root-required")
        if len(reason) < 40:
            out.append("non-root user: the final stage runs as root without a '# root-required: <reason>' comment")
    labels = " ".join(i.args for i in final.all("LABEL"))
    for key in REQUIRED_LABELS:
        if f"org.opencontainers.image.{key}=" not in labels:
            out.append(f"OCI labels: org.opencontainers.image.{key} missing")
    checks = final.all("HEALTHCHECK")
    has_check = any(not c.args.upper().startswith("NONE") for c in checks)
    if not has_check and len(df.justification("probe")) < 30:
        out.append("health check: no HEALTHCHECK CMD and no '# probe: <how the pod is probed>' comment")
    return out
