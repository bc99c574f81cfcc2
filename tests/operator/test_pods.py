"""The one pod path: every pod template of every child kind carries the settings of its role.

``pod_templates`` finds every pod template in a child object the way the controllers that create
the pods read them (Deployment and Job ``spec.template``; RayJob head group, worker groups and the
job submitter). The tables then assert, for every child kind the operator creates, that what a
role's settings say reaches every pod of that role — so a setting added once to
``retool_operator.builders.pods`` cannot miss a pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from retool.spec.validate import parse_run
from retool_operator import constants as c
from retool_operator.builders import build_mlflow, pod_template
from retool_operator.builders.pods import PodSettings
from retool_operator.profiles import hardware_profile
from retool_operator.render import desired_objects
from tests.operator.helpers import CONFIG, config_for
from tests.render.cases import VARIANTS

Obj = dict[str, Any]


def pod_templates(obj: Obj) -> Iterator[tuple[str, Obj]]:
    """(where, template) of every pod template inside ``obj``."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        yield "spec.template", spec["template"]
    elif kind == "RayJob":
        cluster = spec["rayClusterSpec"]
        yield "head", cluster["headGroupSpec"]["template"]
        for group in cluster.get("workerGroupSpecs") or []:
            yield f"worker:{group['groupName']}", group["template"]
        if "submitterPodTemplate" in spec:
            yield "submitter", spec["submitterPodTemplate"]


def all_pods(doc: Obj) -> list[tuple[Obj, str, Obj]]:
    objects = desired_objects(doc, config=config_for(doc)) + build_mlflow("ml", config=CONFIG)
    return [(obj, where, tpl) for obj in objects for where, tpl in pod_templates(obj)]


def test_every_child_kind_with_pods_is_walked() -> None:
    """The walker sees a pod in every kind that has one (a new kind must be added to it)."""
    kinds_with_pods = {obj["kind"] for obj, _, _ in all_pods(VARIANTS["qwen32b-two-nodes"]())}
    assert kinds_with_pods == {"Deployment", "Job", "RayJob"}
    wheres = {where for obj, where, _ in all_pods(VARIANTS["qwen32b-two-nodes"]()) if obj["kind"] == "RayJob"}
    assert wheres == {"head", "worker:trainers", "submitter"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_is_labelled_for_its_run_and_role(variant: str) -> None:
    doc = VARIANTS[variant]()
    for obj, where, tpl in all_pods(doc):
        lbls = tpl["metadata"]["labels"]
        assert lbls[c.LABEL_PART_OF] == c.PART_OF, (obj["kind"], where)
        if obj["metadata"]["name"] == c.MLFLOW_NAME:
            continue  # the namespace's tracker belongs to no run
        assert lbls[c.LABEL_RUN] == doc["metadata"]["name"], (obj["kind"], where)
        assert lbls[c.LABEL_ROLE] in (c.COMPONENT_STAGE, c.COMPONENT_SANDBOX), (obj["kind"], where)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_stage_pod_runs_on_the_trainer_nodes(variant: str) -> None:
    """Job pods, Ray heads, workers and the job submitter all run the trainer image: same nodes."""
    doc = VARIANTS[variant]()
    profile = hardware_profile(parse_run(doc).spec.hardware, CONFIG)
    stage_pods = [(obj, where, tpl) for obj, where, tpl in all_pods(doc) if tpl["metadata"]["labels"].get(c.LABEL_ROLE) == c.COMPONENT_STAGE]
    assert stage_pods
    for obj, where, tpl in stage_pods:
        spec = tpl["spec"]
        assert spec.get("nodeSelector", {}) == profile.node_selector, (obj["metadata"]["name"], where)
        assert spec.get("tolerations", []) == list(profile.tolerations), (obj["metadata"]["name"], where)
        assert all(container["image"] == profile.image for container in spec["containers"]), (obj["metadata"]["name"], where)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stage_commands_use_the_images_python3(variant: str) -> None:
    """The vLLM base images have ``python3`` but no ``python``."""
    doc = VARIANTS[variant]()
    for obj in desired_objects(doc, config=config_for(doc)):
        if obj["kind"] == "RayJob":
            assert obj["spec"]["entrypoint"].split()[0] == "python3"
        elif obj["kind"] == "Job":
            assert obj["spec"]["template"]["spec"]["containers"][0]["command"][0] == "python3"


SETTINGS_TABLE: list[tuple[str, PodSettings, str, Any]] = [
    ("annotations", PodSettings(labels={"a": "b"}, annotations={"team": "x"}), "metadata.annotations", {"team": "x"}),
    ("pull secrets", PodSettings(labels={}, image_pull_secrets=("reg",)), "spec.imagePullSecrets", [{"name": "reg"}]),
    ("service account", PodSettings(labels={}, service_account_name="trainer"), "spec.serviceAccountName", "trainer"),
    ("priority", PodSettings(labels={}, priority_class_name="high"), "spec.priorityClassName", "high"),
    ("scheduler", PodSettings(labels={}, scheduler_name="volcano"), "spec.schedulerName", "volcano"),
    ("runtime class", PodSettings(labels={}, runtime_class_name="gvisor"), "spec.runtimeClassName", "gvisor"),
    ("user namespaces", PodSettings(labels={}, host_users=False), "spec.hostUsers", False),
    ("security context", PodSettings(labels={}, security_context={"fsGroup": 1000}), "spec.securityContext", {"fsGroup": 1000}),
    ("extra volume", PodSettings(labels={}, volumes=({"name": "cache", "emptyDir": {}},)), "spec.volumes", [{"name": "own", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]),
]


@pytest.mark.parametrize(("setting", "expected_path", "expected"), [(s, p, e) for _, s, p, e in SETTINGS_TABLE], ids=[t[0] for t in SETTINGS_TABLE])
def test_pod_template_applies_each_setting(setting: PodSettings, expected_path: str, expected: Any) -> None:
    tpl = pod_template(setting, [{"name": "main", "image": "x"}], [{"name": "own", "emptyDir": {}}])
    node: Any = tpl
    for key in expected_path.split("."):
        node = node[key]
    assert node == expected


def test_pod_env_and_mounts_reach_every_container_and_a_containers_own_variable_wins() -> None:
    settings = PodSettings(
        labels={},
        env=({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}, {"name": "A", "value": "pod"}),
        env_from=({"secretRef": {"name": "extra"}},),
        volume_mounts=({"name": "cache", "mountPath": "/cache"},),
    )
    tpl = pod_template(settings, [{"name": "one", "image": "x", "env": [{"name": "A", "value": "own"}]}, {"name": "two", "image": "x"}])
    one, two = tpl["spec"]["containers"]
    assert one["env"] == [{"name": "A", "value": "own"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}]
    assert [e["name"] for e in two["env"]] == ["HF_TOKEN", "A"]
    assert one["envFrom"] == two["envFrom"] == [{"secretRef": {"name": "extra"}}]
    assert one["volumeMounts"] == two["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]


def test_pod_template_leaves_unset_settings_out() -> None:
    tpl = pod_template(PodSettings(labels={"x": "y"}), [{"name": "main", "image": "x"}])
    assert tpl == {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "main", "image": "x"}]}}


def test_pod_template_does_not_share_state_between_pods() -> None:
    settings = PodSettings(labels={"x": "y"}, env=({"name": "A", "value": "1"},))
    first = pod_template(settings, [{"name": "main", "image": "x"}])
    first["spec"]["containers"][0]["env"][0]["value"] = "changed"
    first["metadata"]["labels"]["x"] = "changed"
    second = pod_template(settings, [{"name": "main", "image": "x"}])
    assert second["spec"]["containers"][0]["env"][0]["value"] == "1"
    assert second["metadata"]["labels"]["x"] == "y"




# ---------------------------------------------------------------- per-run settings (spec.pods, spec.scheduling)

RUN_PODS = {
    "serviceAccountName": "retool-trainer",
    "imagePullSecrets": ["registry-credentials"],
    "labels": {"cost-center": "ml-research"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}, {"name": "NCCL_DEBUG", "value": "INFO"}],
    "envFrom": [{"configMapRef": {"name": "proxy-settings"}}],
    "volumes": [{"name": "hub-cache", "mountPath": "/cache/huggingface", "persistentVolumeClaim": {"claimName": "hf-hub-cache"}}],
}
SANDBOX_PLACEMENT = {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}]}


def with_run_settings(base: str) -> Obj:
    doc = VARIANTS[base]()
    doc["spec"]["pods"] = RUN_PODS
    doc["spec"]["scheduling"] = {"priorityClassName": "ml-research"}
    doc["spec"]["sandbox"] = {**doc["spec"].get("sandbox", {}), **SANDBOX_PLACEMENT}
    return doc


def role_of(obj: Obj, where: str, tpl: Obj) -> str:
    """trainer (runs the stage's code, mounts the claim), submitter, sandbox or mlflow."""
    component = tpl["metadata"]["labels"].get(c.LABEL_ROLE)
    if component == c.COMPONENT_STAGE:
        return "submitter" if where == "submitter" else "trainer"
    return component


def _get(tpl: Obj, path: str) -> Any:
    node: Any = tpl
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


HUB_MOUNT = {"name": "hub-cache", "mountPath": "/cache/huggingface"}
# setting -> (roles that get it, how to read it from a pod template, the value those roles carry)
PER_RUN: list[tuple[str, set[str], Any, Any]] = [
    ("service account", {"trainer", "submitter"}, lambda t: _get(t, "spec.serviceAccountName"), "retool-trainer"),
    ("image pull secrets", {"trainer", "submitter", "sandbox"}, lambda t: _get(t, "spec.imagePullSecrets"), [{"name": "registry-credentials"}]),
    ("priority class", {"trainer", "submitter"}, lambda t: _get(t, "spec.priorityClassName"), "ml-research"),
    ("extra label", {"trainer", "submitter", "sandbox"}, lambda t: _get(t, "metadata.labels").get("cost-center"), "ml-research"),
    ("extra annotation", {"trainer", "submitter", "sandbox"}, lambda t: (_get(t, "metadata.annotations") or {}).get("sidecar.istio.io/inject"), "false"),
    (
        "secret reference in every container's env",
        {"trainer"},
        lambda t: all({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in c.get("env", []) for c in t["spec"]["containers"]),
        True,
    ),
    ("envFrom in every container", {"trainer"}, lambda t: all(c.get("envFrom") == [{"configMapRef": {"name": "proxy-settings"}}] for c in t["spec"]["containers"]), True),
    (
        "extra volume",
        {"trainer"},
        lambda t: [v for v in _get(t, "spec.volumes") or [] if v["name"] == "hub-cache"],
        [{"name": "hub-cache", "persistentVolumeClaim": {"claimName": "hf-hub-cache"}}],
    ),
    ("extra volume mounted in every container", {"trainer"}, lambda t: all(HUB_MOUNT in c.get("volumeMounts", []) for c in t["spec"]["containers"]), True),
    ("sandbox node selector", {"sandbox"}, lambda t: (_get(t, "spec.nodeSelector") or {}).get("pool"), "cpu"),
    ("sandbox toleration", {"sandbox"}, lambda t: SANDBOX_PLACEMENT["tolerations"][0] in (_get(t, "spec.tolerations") or []), True),
]
ABSENT = (None, [], {}, False)


@pytest.mark.parametrize("base", ["qwen32b-two-nodes", "qwen7b-ascend-two-nodes", "minimal"])
@pytest.mark.parametrize(("setting", "roles", "read", "value"), PER_RUN, ids=[p[0] for p in PER_RUN])
def test_each_per_run_setting_reaches_every_pod_of_its_roles_and_no_other(base: str, setting: str, roles: set[str], read: Any, value: Any) -> None:
    """A setting of spec.pods reaches every pod of the roles it is for (in every child kind), and
    never the others: the sandbox runs model-written code, so no identity, env or volume of the run."""
    doc = with_run_settings(base)
    pods = all_pods(doc)
    seen_roles = set()
    for obj, where, tpl in pods:
        role = role_of(obj, where, tpl)
        seen_roles.add(role)
        got = read(tpl)
        if role in roles:
            assert got == value, (setting, obj["kind"], obj["metadata"]["name"], where)
        else:
            assert got in ABSENT, (setting, obj["kind"], obj["metadata"]["name"], where, got)
    assert roles <= seen_roles


def test_a_run_variable_overrides_the_profile_default_but_never_the_stage_context() -> None:
    doc = with_run_settings("qwen32b-two-nodes")
    for obj, where, tpl in all_pods(doc):
        if role_of(obj, where, tpl) != "trainer":
            continue
        for container in tpl["spec"]["containers"]:
            names = [e["name"] for e in container["env"]]
            assert names.count("NCCL_DEBUG") == 1 and {"name": "NCCL_DEBUG", "value": "INFO"} in container["env"], obj["metadata"]["name"]
            assert names.count("RETOOL_RUN_NAME") == 1


def test_run_labels_never_replace_the_operators_labels() -> None:
    doc = with_run_settings("minimal")
    for obj, _where, tpl in all_pods(doc):
        if obj["metadata"]["name"] == c.MLFLOW_NAME:
            assert "cost-center" not in tpl["metadata"]["labels"]  # the namespace's tracker belongs to no run
            continue
        assert tpl["metadata"]["labels"][c.LABEL_RUN] == "minimal"
