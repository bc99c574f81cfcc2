"""Turn YAML documents into RetoolRuns, or into a list of problems naming the field to fix.

One entry point for every consumer: ``retool validate`` (GitOps pull-request checks), the
admission webhook, and the operator's create handler on clusters without the webhook.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from retool.spec.kubeyaml import KubeYAMLError, KubeYAMLLoader, as_api_server_sees
from retool.spec.model import RetoolRun, RetoolRunSpec
from retool.spec.names import run_name_problems
from retool.spec.operator_rules import OperatorSettings, operator_refusals
from retool.spec.rules import Problem, check_rules


def describe_yaml_error(err: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``line L, column C: YAML syntax error: what``.

    PyYAML's own text spans several lines (with a caret) and names the stream ``<unicode string>``;
    the caller prefixes the file name.
    """
    if isinstance(err, KubeYAMLError):
        return str(err)
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    context = getattr(err, "context", None)
    what = ", ".join(str(part) for part in (context, problem) if part) or " ".join(str(err).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}YAML syntax error: {what}"


def load_documents(text: str) -> list[Any]:
    """The non-empty YAML documents of ``text`` as kubectl sends them to the API server (retool/spec/kubeyaml.py:
    YAML 1.1 booleans such as ``n``, Go's number forms, string keys); raises :class:`KubeYAMLError` for a
    document kubectl cannot send."""
    return [as_api_server_sees(d) for d in yaml.load_all(text, Loader=KubeYAMLLoader) if d is not None]


class SpecError(ValueError):
    """A RetoolRun that cannot be accepted; ``problems`` says why, field by field."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that owns the field at ``loc`` (to list the fields it does allow)."""
    model: Any = RetoolRun
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        inner = _unwrap(arg)
        if inner is not None:
            return inner
    return annotation if isinstance(annotation, type) else None


_JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "a mapping", type(None): "null"}


def _where(loc: Iterable[str | int]) -> tuple[str | int, ...]:
    """The field's location; a mapping key that failed (``labels.<key>.[key]``) names the key itself."""
    loc = tuple(loc)
    return loc[:-1] if loc and loc[-1] == "[key]" else loc


def _message(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    if loc and loc[-1] == "[key]":
        return f"{loc[-2]!r} is not a valid key here ({_pattern_hint((*loc[:-1], '[key]'))})"
    if error["type"] == "extra_forbidden":
        owner = _model_at(loc[:-1])
        if owner is not None:
            allowed = [f.alias or name for name, f in owner.model_fields.items()]
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return f"unknown field; {hint}allowed: {', '.join(allowed)}"
        return "unknown field"
    if error["type"] == "missing":
        return "required field is missing"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error["type"].startswith("string_pattern"):
        message = f"{error.get('input')!r} is not valid here ({_pattern_hint(loc)})"
    elif error["type"].endswith("_type") and "input" in error:
        # Strict types: say what was given, so "2" (a string) for an integer is obvious.
        given = _JSON_TYPES.get(type(error["input"]), type(error["input"]).__name__)
        message = f"{message}, got {given} {error['input']!r}" if not isinstance(error["input"], dict | list) else f"{message}, got {given}"
    return message


_NAME_HINTS = {
    "eval": "expected lower-case letters, digits and '_'",
    "env": "expected an environment variable name: letters, digits, '_', '-' and '.'",
    "volumes": "expected a DNS label: lower-case letters, digits and '-'",
}


def _pattern_hint(loc: tuple[str | int, ...]) -> str:
    names = [str(part) for part in loc if not isinstance(part, int)]
    field = names[-1] if names else ""
    if field == "[key]":
        return "expected a label key such as example.com/team" if "labels" in names or "annotations" in names else "expected a valid key"
    if field == "name":
        return _NAME_HINTS.get(names[-2] if len(names) > 1 else "", "expected a Kubernetes object name")
    if len(names) > 1 and names[-2] == "labels":
        return "expected a label value: at most 63 letters, digits, '-', '_' and '.'"
    hints = {
        "base": "expected a Hugging Face id org/name, an s3://bucket/key URI or an absolute path",
        "sft": "expected a Hugging Face id org/name, an s3://bucket/key URI or an absolute path",
        "rl": "expected a Hugging Face id org/name, an s3://bucket/key URI or an absolute path",
        "source": "expected a Hugging Face id org/name, an s3://bucket/key URI or an absolute path",
        "uri": "expected s3://bucket/prefix with a valid bucket name",
        "endpoint": "expected an http(s):// URL",
        "trackingUri": "expected an http(s):// URL",
        "claimName": "expected a Kubernetes object name",
        "storageClassName": "expected a Kubernetes object name",
        "queueName": "expected a label value: letters, digits, '-', '_' and '.'",
        "queue": "expected a label value: letters, digits, '-', '_' and '.'",
        "imagePullSecrets": "expected a Kubernetes object name",
        "serviceAccountName": "expected a Kubernetes object name",
        "path": "expected a path",
        "subPath": "expected a relative path",
        "mountPath": "expected an absolute path",
        "deviceResourceName": "expected an extended resource name such as huawei.com/Ascend910",
    }
    return hints.get(field, "does not match the expected format")


def validate_document(document: Any) -> list[Problem]:
    """Every problem of one parsed YAML document (empty when it is a valid RetoolRun)."""
    if not isinstance(document, dict):
        return [Problem("(document)", f"expected a RetoolRun mapping, got {type(document).__name__}")]
    try:
        run = RetoolRun.model_validate(document)
    except ValidationError as err:
        problems = [Problem(_path(_where(e["loc"])) or "(document)", _message(e)) for e in err.errors()]
        name = (document.get("metadata") or {}).get("name") if isinstance(document.get("metadata"), dict) else None
        if isinstance(name, str) and not any(p.path.startswith("metadata.name") for p in problems):
            problems += [Problem("metadata.name", message) for message in run_name_problems(name)]
        return problems
    return check_rules(run)


def document_warnings(document: Any) -> list[Problem]:
    """What is accepted but probably wrong (e.g. a GPU product no node is labelled with); empty for an invalid document."""
    from retool.spec.products import product_warnings  # products imports rules, which this module imports

    if validate_document(document):
        return []
    spec = RetoolRun.model_validate(document).spec
    return product_warnings(spec) + line_warnings(spec)


ASCEND_0_9_WARNING = (
    "no Ascend trainer image for the 0.9 line is built by this release (retool/trainer-ascend-verl09, docs/verl-lines.md): "
    'set spec.hardware.image to one built on vllm-ascend v0.23.0 with ".[train-verl09]", or use trainer.verl "0.6.1" on Ascend'
)


def line_warnings(spec: RetoolRunSpec) -> list[Problem]:
    """A trainer line the chosen hardware has no image for (accepted: the operator's image may be set to one)."""
    if spec.trainer.verl == "0.9.1" and spec.hardware.accelerator == "ascend" and not spec.hardware.image:
        return [Problem("spec.trainer.verl", ASCEND_0_9_WARNING)]
    return []


def parse_run(document: Any) -> RetoolRun:
    """The RetoolRun of a document, or SpecError with every problem."""
    problems = validate_document(document)
    if problems:
        raise SpecError(problems)
    return RetoolRun.model_validate(document)


@dataclass(frozen=True)
class FileProblem:
    file: str
    document: int
    problem: Problem

    def __str__(self) -> str:
        return f"{self.file}[{self.document}]: {self.problem}"


def _document_problems(document: Any, settings: OperatorSettings | None) -> list[Problem]:
    problems = validate_document(document)
    if problems or settings is None:
        return problems
    return operator_refusals(RetoolRun.model_validate(document), settings)


def validate_text(text: str, source: str = "<stdin>", settings: OperatorSettings | None = None) -> tuple[int, list[FileProblem]]:
    """Validate a multi-document YAML stream: (documents checked, problems). With ``settings``, what an
    operator with those settings refuses in a valid run is a problem too (``retool.spec.operator_rules``)."""
    try:
        documents = load_documents(text)
    except yaml.YAMLError as err:
        return 0, [FileProblem(source, 0, Problem("(yaml)", describe_yaml_error(err)))]
    if not documents:
        return 0, [FileProblem(source, 0, Problem("(file)", "no YAML documents found"))]
    problems = [FileProblem(source, i, p) for i, d in enumerate(documents) for p in _document_problems(d, settings)]
    return len(documents), problems


def model_fit_problems(text: str, source: str, config: Mapping[str, Any] | None) -> tuple[list[FileProblem], list[FileProblem]]:
    """(errors, warnings) of every valid RetoolRun in ``text`` against a model's config.json.

    ``config`` None: each run's own ``spec.model.base`` when it is a local directory holding
    config.json (a PVC path mounted here), else the run is not checked against a model.
    """
    from retool.spec.model_fit import model_fit_findings, read_model_config  # model_fit imports the spec model

    errors: list[FileProblem] = []
    warnings: list[FileProblem] = []
    try:
        documents = load_documents(text)
    except yaml.YAMLError:
        return errors, warnings
    for index, document in enumerate(documents):
        if validate_document(document):
            continue
        run = RetoolRun.model_validate(document)
        model_config = config
        if model_config is None and run.spec.model.base.startswith("/") and (Path(run.spec.model.base) / "config.json").is_file():
            model_config = read_model_config(run.spec.model.base)
        for finding in model_fit_findings(run.spec, model_config) if model_config is not None else []:
            (errors if finding.severity == "error" else warnings).append(FileProblem(source, index, Problem(finding.path, finding.message)))
    return errors, warnings


def validate_file(path: str | Path, settings: OperatorSettings | None = None) -> tuple[int, list[FileProblem]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        return 0, [FileProblem(str(path), 0, Problem("(file)", err.strerror or str(err)))]
    except UnicodeDecodeError:
        return 0, [FileProblem(str(path), 0, Problem("(file)", "not UTF-8 text (is it a YAML file?)"))]
    return validate_text(text, str(path), settings)
