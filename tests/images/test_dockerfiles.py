"""Every images/*/Dockerfile follows the image rules; the trainer bases match verl 0.6.1's stacks."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.conftest import REPO, repo_env
from tests.images.dockerfile import image_tag, parse, parse_text, violations

DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))
REQUIRED_IMAGES = {"operator", "sandbox", "trainer-cuda", "trainer-ascend"}
# Images that must run as a non-root user whatever their comments say.
NON_ROOT = {"operator", "trainer-cuda", "trainer-cuda-verl09", "sandbox"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def pinned_extras() -> set[str]:
    """Extras of this project whose every dependency (and the base dependencies) is pinned with ==."""
    project = PYPROJECT["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    base_pinned = all("==" in d for d in project["dependencies"])

    def pinned(extra: str, seen: frozenset[str] = frozenset()) -> bool:
        for dep in extras[extra]:
            self_ref = re.fullmatch(rf"{project['name']}\[([\w,-]+)\]", dep)
            if self_ref:
                if not all(e not in seen and pinned(e, seen | {extra}) for e in self_ref.group(1).split(",")):
                    return False
            elif "==" not in dep:
                return False
        return True

    return {e for e in extras if base_pinned and pinned(e)}


PINNED_EXTRAS = pinned_extras()


def image_id(path: Path) -> str:
    return path.parent.name


def test_required_images_exist() -> None:
    assert {image_id(p) for p in DOCKERFILES} >= REQUIRED_IMAGES


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=image_id)
def test_dockerfile_follows_the_image_rules(dockerfile: Path) -> None:
    assert violations(parse(dockerfile), PINNED_EXTRAS, REPO) == []


@pytest.mark.parametrize("dockerfile", [p for p in DOCKERFILES if image_id(p) in NON_ROOT], ids=image_id)
def test_service_images_run_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    """Numeric, so the kubelet can enforce runAsNonRoot without resolving a user name."""
    user = parse(dockerfile).final.all("USER")[-1].args
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), user


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=image_id)
def test_copied_sources_survive_the_dockerignore(dockerfile: Path) -> None:
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    for stage in parse(dockerfile).stages:
        for ins in stage.all("COPY"):
            if "--from=" in ins.args:
                continue
            sources = ins.args.split()[:-1]
            for src in sources:
                assert (REPO / src).exists(), f"{dockerfile}: COPY {src} does not exist"
                assert not [p for p in ignored if fnmatch.fnmatch(src.rstrip("/"), p.rstrip("/"))], f"{src} is excluded by .dockerignore"


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".tools", "tests"} <= ignored


def test_operator_image_matches_the_chart() -> None:
    df = parse(REPO / "images" / "operator" / "Dockerfile")
    values = yaml.safe_load((REPO / "charts" / "retool" / "values.yaml").read_text())
    assert df.final.all("ENTRYPOINT")[-1].json_args() == ["python", "-m", "retool_operator"]
    exposed = {int(p) for i in df.final.all("EXPOSE") for p in i.args.split()}
    assert exposed == {values["operator"]["livenessPort"], values["webhook"]["port"]}
    assert re.search(r'pip install .*"\.\[operator\]"', " ".join(i.args for s in df.stages for i in s.all("RUN")))
    uid = int(df.final.all("USER")[-1].args.split(":")[0])
    chart_uid = (REPO / "charts" / "retool" / "templates" / "operator-deployment.yaml").read_text()
    assert f'(dict "uid" {uid})' in chart_uid, "the chart's runAsUser must be the image's user"


def vllm_version(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"v?(\d+)\.(\d+)\.(\d+)", tag).groups())


def test_trainer_cuda_base_is_a_vllm_release_verl_0_6_1_supports() -> None:
    df = parse(REPO / "images" / "trainer-cuda" / "Dockerfile")
    base = df.stages[0].base
    assert base.startswith("vllm/vllm-openai:")
    assert (0, 8, 0) <= vllm_version(image_tag(base)) <= (0, 11, 0), "verl 0.6.1 supports vLLM <= 0.11.0"



def test_trainer_cuda_verl09_base_is_the_vllm_release_verl_0_9_1_is_built_against() -> None:
    base = parse(REPO / "images" / "trainer-cuda-verl09" / "Dockerfile").stages[0].base
    assert base.startswith("vllm/vllm-openai:")
    assert vllm_version(image_tag(base)) >= (0, 18, 0), "verl 0.9.x needs vLLM >= 0.18 (its vllm extra pins 0.24.0)"


LINE_OF_IMAGE = {"trainer-cuda": ("train", ""), "trainer-ascend": ("train", ""), "trainer-cuda-verl09": ("train-verl09", " --line 0.9.1")}


@pytest.mark.parametrize("image", sorted(LINE_OF_IMAGE))
def test_trainer_image_installs_its_lock_then_checks_the_result(image: str) -> None:
    """The base is checked against the lock's base pins first; the lock is installed exactly; then pip
    check and the import of every stage module, as build steps (a broken set fails the build)."""
    df = parse(REPO / "images" / image / "Dockerfile")
    runs = [i.args for i in df.final.all("RUN")]
    check_base = next(i for i, r in enumerate(runs) if "lock.py check-base /opt/retool/base.in" in r)
    install = next(i for i, r in enumerate(runs) if "--no-deps -r" in r)
    assert check_base < install
    steps = [step.strip() for step in runs[install].split("&&")]
    assert steps[0].replace('"', "").startswith("python3 -m pip install --no-cache-dir --no-deps -r /opt/retool/requirements")
    extra, line = LINE_OF_IMAGE[image]
    assert steps[1] == f'python3 -m pip install --no-cache-dir --no-deps ".[{extra}]"'
    assert steps[2] == f"python3 /opt/retool/lock.py pip-check {image}"
    assert steps[3] == f"python3 -m retool.runtime.cpu_only -m retool.runtime.import_check{line}"
    copied = " ".join(i.args for i in df.final.all("COPY"))
    for lock_file in (REPO / "images" / image).glob("requirements*.lock"):
        assert f"images/{image}/{lock_file.name}" in copied


def test_stage_modules_import_on_cpu_as_the_image_build_checks() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "retool.runtime.cpu_only", "-m", "retool.runtime.import_check"], env=repo_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stage modules import" in result.stderr


def test_ascend_image_preloads_jemalloc_and_builds_a2_and_a3() -> None:
    df = parse(REPO / "images" / "trainer-ascend" / "Dockerfile")
    assert df.args["BASE_VARIANT"] == ""
    text = (REPO / "images" / "trainer-ascend" / "Dockerfile").read_text()
    assert "FROM quay.io/ascend/vllm-ascend:v0.11.0rc1${BASE_VARIANT}" in text
    env = " ".join(i.args for i in df.final.all("ENV"))
    assert "LD_PRELOAD=/usr/local/lib/libjemalloc.so.2" in env
    assert "libjemalloc2=" in " ".join(i.args for i in df.final.all("RUN"))
    dry = subprocess.run(["make", "-n", "image-trainer-ascend-a3", "PUSH=1"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "--build-arg BASE_VARIANT=-a3" in dry and "trainer-ascend:0.1.0-a3" in dry
    assert "--platform linux/arm64,linux/amd64" in dry


# vllm-ascend's release matrix (docs/source/community/versioning_policy.md), tags whose stack is
# the Ascend ReTool recipe's: vLLM 0.11.0, CANN 8.3.RC1, torch/torch_npu 2.7.1.
VLLM_ASCEND_MATCHING_RECIPE = {"v0.11.0rc1": {"vllm": "0.11.0", "cann": "8.3.RC1", "torch": "2.7.1", "torch_npu": "2.7.1"}}


def test_trainer_ascend_base_matches_the_ascend_recipe_stack() -> None:
    df = parse(REPO / "images" / "trainer-ascend" / "Dockerfile")
    base = df.stages[0].base
    repo, tag = base.rsplit(":", 1)
    assert repo == "quay.io/ascend/vllm-ascend"
    assert tag in VLLM_ASCEND_MATCHING_RECIPE
    stack = VLLM_ASCEND_MATCHING_RECIPE[tag]
    assert stack["cann"].startswith("8.") and stack["torch_npu"] == "2.7.1"
    assert '".[train]"' in " ".join(i.args for i in df.final.all("RUN"))
    assert "root-required" not in (REPO / "images" / "trainer-cuda" / "Dockerfile").read_text()


def test_a_requirements_file_counts_as_pinned_only_when_it_is_a_copied_lock(tmp_path: Path) -> None:
    (tmp_path / "good.lock").write_text("# header\nverl==0.6.1\nhydra-core==1.3.8\n")
    (tmp_path / "loose.lock").write_text("verl==0.6.1\nhydra-core>=1.3\n")
    text = GOOD.replace("RUN python", "COPY good.lock loose.lock /opt/\nRUN python")
    pinned = text.replace('requests==2.32.5', "-r /opt/good.lock")
    assert violations(parse_text(pinned), PINNED_EXTRAS, tmp_path) == []
    loose = text.replace('requests==2.32.5', "-r /opt/loose.lock")
    assert violations(parse_text(loose), PINNED_EXTRAS, tmp_path) == ["pinned pip install: line 5: -r /opt/loose.lock: loose.lock: hydra-core>=1.3"]
    not_copied = text.replace('requests==2.32.5', "-r /opt/other.lock")
    assert "requirements not visible" in violations(parse_text(not_copied), PINNED_EXTRAS, tmp_path)[0]


GOOD = """\
FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="t" org.opencontainers.image.description="d" \\
      org.opencontainers.image.version="1" org.opencontainers.image.licenses="Apache-2.0"
RUN python -m pip install --no-cache-dir ".[operator]" requests==2.32.5
USER 10001
HEALTHCHECK CMD ["true"]
"""


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        pytest.param(GOOD.replace("python:3.11.14-slim-bookworm", "python"), "pinned base: python has no tag", id="untagged base"),
        pytest.param(GOOD.replace("python:3.11.14-slim-bookworm", "python:latest"), "pinned base: python:latest uses latest", id="latest base"),
        pytest.param("ARG BASE\n" + GOOD.replace("FROM python:3.11.14-slim-bookworm", "FROM ${BASE}"), "uses an ARG without a default", id="base from an ARG without default"),
        pytest.param(GOOD.replace("requests==2.32.5", "requests"), "pinned pip install: line 4: requests", id="unpinned pip package"),
        pytest.param(GOOD.replace("requests==2.32.5", "requests>=2"), "pinned pip install: line 4: requests>=2", id="range instead of pin"),
        pytest.param(GOOD.replace('".[operator]"', "."), "pinned pip install: line 4: . (this project needs an extra", id="project without a pinned extra"),
        pytest.param(GOOD.replace('".[operator]"', '".[nosuchextra]"'), "this project needs an extra", id="project with an unknown extra"),
        pytest.param(GOOD.replace('".[operator]"', "-r requirements.txt"), "-r requirements.txt (requirements not visible", id="requirements file"),
        pytest.param(GOOD + "RUN pip install --upgrade pip\n", "pinned pip install: line 7: pip", id="unpinned pip upgrade"),
        pytest.param(GOOD.replace("USER 10001\n", ""), "non-root user", id="no USER"),
        pytest.param(GOOD.replace("USER 10001", "USER root"), "non-root user", id="root without a reason"),
        pytest.param(GOOD.replace("USER 10001", "# root-required: because\nUSER 0"), "non-root user", id="root with a reason too short to be one"),
        pytest.param(GOOD.replace('org.opencontainers.image.licenses="Apache-2.0"', ""), "org.opencontainers.image.licenses missing", id="missing OCI label"),
        pytest.param(GOOD + "ADD https://example.com/x.tgz /x\n", "no remote ADD", id="ADD of a URL"),
        pytest.param(GOOD.replace('HEALTHCHECK CMD ["true"]', "HEALTHCHECK NONE"), "health check", id="health check disabled without a documented probe"),
    ],
)
def test_each_rule_catches_its_violation(text: str, rule: str) -> None:
    assert [v for v in violations(parse_text(text), PINNED_EXTRAS) if rule in v], violations(parse_text(text), PINNED_EXTRAS)


def test_the_good_sample_passes_and_justifications_are_read() -> None:
    assert violations(parse_text(GOOD), PINNED_EXTRAS) == []
    justified = GOOD.replace("USER 10001", "# root-required: the device nodes belong to a host group whose id varies per host\nUSER root")
    justified = justified.replace('HEALTHCHECK CMD ["true"]', "# probe: the controller that creates these pods defines their probes\nHEALTHCHECK NONE")
    assert violations(parse_text(justified), PINNED_EXTRAS) == []


def test_parser_joins_continuations_and_names_stages() -> None:
    df = parse_text("ARG V=1.2\nFROM img:${V} AS build\nRUN a \\\n  && b\nFROM build\n")
    assert [(s.base, s.name) for s in df.stages] == [("img:1.2", "build"), ("build", None)]
    assert df.stages[0].all("RUN")[0].args == "a && b"


def test_make_images_builds_every_dockerfile_under_the_chart_default_names() -> None:
    out = subprocess.run(["make", "-n", "images", "PUSH=1"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout
    values = yaml.safe_load((REPO / "charts" / "retool" / "values.yaml").read_text())
    version = PYPROJECT["project"]["version"]
    expected = {values["operator"]["image"]["repository"]} | {i["repository"] for i in values["defaults"]["images"].values()}
    built = set(re.findall(r"-t (\S+):" + re.escape(version) + r" --push \.", out))
    assert {f"retool/{image_id(p)}" for p in DOCKERFILES} == built
    assert {r for r in expected if r.removeprefix("retool/") in {image_id(p) for p in DOCKERFILES}} <= built
    assert out.count("docker buildx build") == len(DOCKERFILES)
