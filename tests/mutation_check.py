"""Does the suite catch the bugs the docs rule out? One-line mutations, each in a fresh copy.

    .venv/bin/python tests/mutation_check.py             # every mutation (make mutation-check)
    .venv/bin/python tests/mutation_check.py -k deadline # those whose name contains "deadline"
    .venv/bin/python tests/mutation_check.py --list

Each mutation replaces one exact line of one file with a bug a reader of the docs would call a
bug. For each, the working tree (tracked and untracked, not ignored, files) is copied to a
temporary directory, the tests that should catch it are run there once as they are (they must
pass: a failing baseline says nothing), then again with the line replaced: **caught** when they
fail, **NOT caught** when they still pass. The exit status is 1 when any mutation survives, its
line is no longer in the file (the table is stale) or a baseline fails.

Not part of ``make test``: every mutation runs real servers, a few minutes in all. The figures of
the last run are in docs/development.md.
"""

# ruff: noqa: E402  (sys.path is set right before the imports, see below)
from __future__ import annotations

import sys

# Run as a script, this file's directory (tests/) comes first on sys.path, and tests/operator would stand for
# the standard library's ``operator`` (imported by argparse, dataclasses, ...): drop it before anything else.
sys.path[:] = [p for p in sys.path if p not in ("", __import__("os").path.dirname(__import__("os").path.abspath(__file__)))]

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_PATHS = (".venv", ".tools")
"""Ignored paths the tests need (the virtualenv, helm and kubectl): linked into each copy, never copied."""
BUILT = ("retool/sandbox/_settle*.so",)
"""Ignored files ``make install`` builds in the tree (the compiled execution setup): copied with their
times, so each copy runs the setup the checkout runs (a helper older than its source is refused)."""


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    original: str
    """The exact line, without its indentation; it must occur exactly once in ``file``."""
    mutated: str
    """What replaces it (the original's indentation is kept)."""
    tests: tuple[str, ...]
    """Test files or node ids that must catch it; only these run."""
    venv: str = ""
    """The virtualenv of the checkout that runs them, when not ``--python``'s: ``.venv-verl09`` for the 0.9 line's tests."""


REHEARSAL_TESTS = ("tests/verl09/test_rehearsal.py",)
"""The training rehearsal's tests (issue 47), in file order: SFT, then RL, then eval."""

MUTATIONS: tuple[Mutation, ...] = (
    # Named in issue 20.
    Mutation(
        "dedup drops whitespace between characters ('12 3' and '123' become one question)",
        "retool/data/dedup.py",
        'return " ".join(question.split())',
        'return "".join(question.split())',
        ("tests/data/test_rl.py",),
    ),
    Mutation(
        "dedup compares questions with their whitespace (a double space makes a new question)",
        "retool/data/dedup.py",
        'return " ".join(question.split())',
        "return question",
        ("tests/data/test_rl.py",),
    ),
    Mutation(
        "retool eval exits 0 when samples failed at the endpoint",
        "retool/cli/eval.py",
        "return 1",
        "return 0",
        ("tests/evaluate/test_eval_e2e.py::test_eval_cli_exits_1_when_samples_fail_at_the_endpoint",),
    ),
    Mutation(
        "a symbolic comparison retried after its executor died gets a fresh deadline",
        "retool/recipe/reward/symbolic.py",
        "budget -= time.monotonic() - started[0]",
        "budget -= 0.0",
        ("tests/recipe_reward/test_reward_runtime.py::test_an_executor_dying_mid_comparison_is_retried_within_the_same_deadline",),
    ),
    Mutation(
        "parse_s3_uri drops the trailing slash of a prefix",
        "retool/data/sources.py",
        "return S3Location(bucket=match.group(1), key=match.group(2))",
        'return S3Location(bucket=match.group(1), key=match.group(2).rstrip("/"))',
        ("tests/data/test_sources.py::test_parse_s3_uri",),
    ),
    Mutation(
        "an unreachable MLflow raises a bare RuntimeError that names neither server nor action",
        "retool/tracking/_client.py",
        "raise TrackingError(f\"MLflow at {where} is unreachable ({reason}): {action} failed\") from exc",
        "raise RuntimeError(str(exc)) from exc",
        ("tests/operator/test_tracking.py::test_unreachable_mlflow_raises_for_the_caller_to_wait",),
    ),
    Mutation(
        "a module the tests import is renamed away (was a silent importorskip)",
        "retool/recipe/render/stages.py",
        "from collections.abc import Callable",
        "from collections.abc import Callable; import retool.recipe.render.renamed_away  # noqa: E702,F401",
        ("tests/operator/test_reconcile.py::test_pipeline_matches_the_stage_renderers",),
    ),
    Mutation(
        "the RBAC completeness test leaves its worker group (was a skip)",
        "tests/conftest.py",
        '"tests/operator/test_zz_rbac.py",',
        "# test_zz_rbac left out of the group",
        ("tests/operator/test_zz_rbac.py",),
    ),
    Mutation(
        "a module that records the operator's requests leaves the RBAC group",
        "tests/conftest.py",
        '"tests/operator/test_preflight_stage.py",',
        "# test_preflight_stage left out of the group",
        ("tests/operator/test_zz_rbac.py",),
    ),
    Mutation(
        "the sandbox queues one request more than queue_size",
        "retool/sandbox/pool.py",
        "if self._idle.empty() and self._waiting >= self.queue_size:",
        "if self._idle.empty() and self._waiting > self.queue_size:",
        ("tests/sandbox/test_pool.py::test_pool_runs_refuses_replaces_and_closes",),
    ),
    # The docs test: the reference pages against the code.
    Mutation(
        "an operator setting's default changes without the operations table",
        "retool_operator/config.py",
        'resync_seconds: float = Field(30.0, gt=0, description="Re-derive every run\'s status from its children at least this often.")',
        'resync_seconds: float = Field(60.0, gt=0, description="Re-derive every run\'s status from its children at least this often.")',
        ("tests/docs/test_doc_reference.py",),
    ),
    Mutation(
        "a sandbox setting's default changes without the sandbox table",
        "retool/sandbox/settings.py",
        'retry_after_s: int = Field(1, ge=1, description="Retry-After sent with 429.")',
        'retry_after_s: int = Field(2, ge=1, description="Retry-After sent with 429.")',
        ("tests/docs/test_doc_reference.py",),
    ),
    Mutation(
        "a sandbox metric is renamed without docs/sandbox.md",
        "retool/sandbox/metrics.py",
        'self.rejected = Counter("retool_sandbox_rejected", "Requests refused with 429 because the queue was full.", registry=r)',
        'self.rejected = Counter("retool_sandbox_refused", "Requests refused with 429 because the queue was full.", registry=r)',
        ("tests/docs/test_doc_reference.py",),
    ),
    Mutation(
        "a preflight exit code changes without docs/recipe.md",
        "retool/preflight/checks.py",
        'Check("config", 10, "verl composes every rendered stage\'s overrides and accepts them (Hydra struct mode, validate_config)"),',
        'Check("config", 20, "verl composes every rendered stage\'s overrides and accepts them (Hydra struct mode, validate_config)"),',
        ("tests/docs/test_doc_reference.py",),
    ),
    Mutation(
        "a flag of retool storage documented in docs/recipe.md is renamed",
        "retool/cli/storage.py",
        'action.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)")',
        'action.add_argument("--s3-endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)")',
        ("tests/docs/test_doc_reference.py",),
    ),
    Mutation(
        "the operator's API client keeps a token until a 401 (no re-read when the kubelet rotates the file)",
        "retool_operator/kube.py",
        "if force or stamp != self._stamp:",
        "if force or self._stamp is None:",
        ("tests/operator/test_token_rotation.py",),
    ),
    Mutation(
        "the operator's API client retries no 401 with a re-read token",
        "retool_operator/kube.py",
        "if err.status == 401 and attempt == 1 and self._creds.token_path:",
        "if False:",
        ("tests/operator/test_token_rotation.py",),
    ),
    Mutation(
        "the operator's API client follows proxy variables kopf was told to ignore",
        "retool_operator/kube.py",
        "self.rest_client.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=trust_env, read_bufsize=2**21)",
        "self.rest_client.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=True, read_bufsize=2**21)",
        ("tests/operator/test_kube_client.py",),
    ),
    # Named in issues 29 and 30.
    Mutation(
        "the agent loop appends a tool turn right after the model's <|im_end|> (verl 0.6.1's sequence, no newline)",
        "retool/recipe/verl_plugins/agent_loop.py",
        "separator = missing_turn_end(agent_data.prompt_ids[: before[0]], self.turn_end)",
        "separator = []",
        ("tests/turns/test_token_parity.py::test_rl_sft_and_eval_see_one_token_sequence",),
    ),
    Mutation(
        "the first call's position is where the model's turn holding it ends",
        "retool/recipe/verl_plugins/call_record.py",
        "self._first_call_at = len(agent_data.response_mask) - len(turn) + (start if start is not None else 0)",
        "self._first_call_at = len(agent_data.response_mask)",
        ("tests/turns/test_token_parity.py::test_the_first_call_position_is_where_the_call_begins", "tests/turns/test_dynamics_by_hand.py"),
    ),
    # Named in issue 48: the 0.9 line logged the turn's end as the first call's position, and fence lines counted as code.
    Mutation(
        "the 0.9 line's first call position is where the model's turn holding it ends",
        "retool/recipe/verl_plugins/call_record.py",
        "self._first_call_at = len(agent_data.response_mask) - len(turn) + (start if start is not None else 0)",
        "self._first_call_at = len(agent_data.response_mask)",
        ("tests/verl09/test_dynamics_by_hand.py",),
        venv=".venv-verl09",
    ),
    Mutation(
        "a fenced code block's fence lines count as code lines",
        "retool/recipe/dynamics.py",
        "return sum(1 for line in extract_code(code).splitlines() if line.strip())",
        "return sum(1 for line in code.splitlines() if line.strip())",
        ("tests/turns/test_dynamics_by_hand.py",),
    ),
    Mutation(
        "the preflight reads data files without checking their rows' required fields",
        "retool/preflight/fields.py",
        "paths = [files] if isinstance(files, str) else [str(f) for f in files]",
        "paths = []",
        ("tests/preflight/test_failures.py::test_rl_rows_without_reward_model_are_a_data_finding_not_a_crash",),
    ),
    # Named in issue 34.
    Mutation(
        "the operator's API client takes a 429 (throttling) for a refusal shown on the run",
        "retool_operator/kube.py",
        "return 400 <= self.status < 500 and self.status != 429",
        "return 400 <= self.status < 500",
        ("tests/operator/test_kube_client.py",),
    ),
    Mutation(
        "a pass stopped by an unwell API server is not requeued",
        "retool_operator/runner.py",
        "self._requeue(key, delay)",
        "pass",
        ("tests/operator/test_pass_requeue.py",),
    ),
    Mutation(
        "KubeRay 1.7's JobStatusCheckTimeoutExceeded uses a retry like a training failure",
        "retool_operator/attempts.py",
        "failed_attempts = entry.attempt - (entry.preempted_attempts or 0) - (entry.status_check_timeouts or 0)",
        "failed_attempts = entry.attempt - (entry.preempted_attempts or 0)",
        ("tests/operator/test_status_check_timeout.py",),
    ),
    # Named in issue 30.
    Mutation(
        "RewardSuspect clears as soon as the CUSUM drops below its limit (not when the excess is paid back to 0)",
        "retool/recipe/reward_watch.py",
        "suspect = self.statistic >= limit if not self.suspect else self.statistic > 0.0",
        "suspect = self.statistic >= limit",
        ("tests/dynamics/test_reward_alarm.py",),
    ),
    Mutation(
        "the operator reads the reward watch only while rl runs (a verdict landing after the end is lost)",
        "retool_operator/runner.py",
        "if entry.state not in RL_ENDED or final in self._final_verdicts:",
        "if True:",
        ("tests/operator/test_integration_tracking.py::test_a_reward_watch_verdict_that_lands_after_rl_ended_still_raises_reward_suspect",),
    ),
    Mutation(
        "retool compare merges rl attempts in MLflow's search order (the earlier attempt can win)",
        "retool/tracking/compare.py",
        'return sorted((r for r in stages if r.data.tags.get(naming.TAG_STAGE) == stage), key=lambda r: int(r.data.tags.get(naming.TAG_ATTEMPT, "0")))',
        "return [r for r in stages if r.data.tags.get(naming.TAG_STAGE) == stage]",
        ("tests/tracking/test_compare.py::test_the_latest_attempts_win_the_curves_and_the_final_scores",),
    ),
    Mutation(
        "parent runs get no headline metrics (MLflow's compare view of parents is empty)",
        "retool/stage_hooks.py",
        "log_headline(ctx.mlflow_tracking_uri, ctx.mlflow_parent_run_id)",
        "pass",
        ("tests/tracking/test_stage_hooks.py::test_eval_stage_logs_results_mirrors_and_registers_the_model",),
    ),
    # Named in issue 31 (behaviours of issues 20-25 a mutation check found untested).
    Mutation(
        "the KubeRay CRD check ignores CRDs that preserve unknown fields (a trimmed CRD refuses Ascend runs)",
        "retool_operator/kuberay_crd.py",
        'return bool(node.get("x-kubernetes-preserve-unknown-fields"))',
        "return False",
        ("tests/operator/test_kuberay_crd.py",),
    ),
    Mutation(
        "the operator does not recognise a Kueue Workload it deactivated itself",
        "retool_operator/queueing.py",
        "return bool(((workload.get(\"metadata\") or {}).get(\"annotations\") or {}).get(c.ANNOTATION_DEACTIVATED))",
        "return False",
        ("tests/operator/test_scheduling_and_storage.py",),
    ),
    Mutation(
        "cgroup v1 writes the memory limit before memsw when the limit grows (the kernel refuses it)",
        "retool/sandbox/cgroups.py",
        "order = (memsw, limit) if memory_bytes > current else (limit, memsw)",
        "order = (limit, memsw)",
        ("tests/sandbox/test_cgroups.py",),
    ),
    Mutation(
        "userfaultfd leaves the executions' seccomp deny list",
        "retool/sandbox/seccomp.py",
        '"bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",',
        '"bpf", "perf_event_open", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",',
        ("tests/sandbox/test_seccomp_denials.py",),
    ),
    Mutation(
        "the TIOCSTI ioctl (typing into another terminal) is allowed",
        "retool/sandbox/seccomp.py",
        'p.deny_any("ioctl", 1, (FIOSETOWN, SIOCSPGRP, TIOCSTI))',
        'p.deny_any("ioctl", 1, (FIOSETOWN, SIOCSPGRP))',
        ("tests/sandbox/test_seccomp_denials.py",),
    ),
    Mutation(
        "the sandbox closes a connection already at its connection cap (one early)",
        "retool/sandbox/http_limits.py",
        "if len(self.connections) > max_connections and self._live() > max_connections and not self._make_room():",
        "if len(self.connections) >= max_connections and self._live() >= max_connections and not self._make_room():",
        ("tests/sandbox/test_server_limits.py::test_the_connection_cap_exactly_at_its_value",),
    ),
    Mutation(
        "at the cap the sandbox evicts the newest connection of a phase, not the oldest",
        "retool/sandbox/http_limits.py",
        "return min(ranked)[2] if ranked else None",
        "return max(ranked)[2] if ranked else None",
        ("tests/sandbox/test_server_limits.py::test_the_eviction_order_at_the_cap",),
    ),
    Mutation(
        "an unlinked file open in two processes is counted twice against the disk limit",
        "retool/sandbox/accounting.py",
        "if info.st_nlink == 0 and stat.S_ISREG(info.st_mode) and key not in seen:",
        "if info.st_nlink == 0 and stat.S_ISREG(info.st_mode):",
        ("tests/sandbox/test_scratch.py::test_an_unlinked_file_held_open_by_two_processes_counts_once",),
    ),
    Mutation(
        "preflight model warnings are reported as passed",
        "retool/preflight/model.py",
        'return CheckResult("model", "run", "warning", "; ".join(str(f) for f in findings), details)',
        'return CheckResult("model", "run", "passed", "; ".join(str(f) for f in findings), details)',
        ("tests/preflight/test_model_check.py::test_model_warnings_are_reported_as_warnings_never_as_passed",),
    ),
    Mutation(
        "a pod creation etcd or the API server failed to serve (a timeout) is shown as a refusal",
        "retool_operator/below.py",
        "return message is not None and REFUSED.search(message) is not None",
        "return message is not None",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a Job's old FailedCreate is a refusal even after a pod was created (the retry got through)",
        "retool_operator/below.py",
        "if created is not None and _event_time(created) >= _event_time(failed):",
        "if False:",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a ReplicaFailure is shown the moment it appears (a fresh namespace's ServiceAccount race)",
        "retool_operator/below.py",
        "return when is None or (now - when).total_seconds() >= seconds",
        "return True",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a preflight leaves the reward module it loaded in sys.modules (the next trainer in the process scores with it)",
        "retool/preflight/runner.py",
        "@leaves_no_reward_loaded",
        "",
        ("tests/preflight/test_failures.py",),
    ),
    Mutation(
        "the rollout check leaves the trainer's data-loader workers to the garbage collector (40 s later, in another check)",
        "retool/preflight/flow.py",
        "release_loader_workers(trainer)",
        "pass",
        ("tests/preflight/test_failures.py",),
    ),
    Mutation(
        "the measured prompt lengths' fingerprint leaves out the tool schema (a longer schema reads the old lengths from datasets' cache)",
        "retool/recipe/verl_plugins/dataset.py",
        "json.dumps(tools, sort_keys=True, default=str),",
        '"",',
        ("tests/data/test_dataset.py",),
    ),
    Mutation(
        "a webhook whose cache has not seen the pod's own Job yet (Kueue after an etcd restart) is shown as a refusal",
        "retool_operator/below.py",
        "return found is not None and found.group(1) in owners",
        "return False",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a webhook that has not found the pod's owner for a minute is still taken for a cache that lags",
        "retool_operator/below.py",
        "if owner_unseen(message, owners) and (now - _first_time(failed)).total_seconds() < STALE_CACHE_SECONDS:",
        "if owner_unseen(message, owners):",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a Job whose pod succeeded, not yet marked complete, is asked why it has no pod",
        "retool_operator/below.py",
        'if int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1):',
        "if False:",
        ("tests/operator/test_refusals_below.py",),
    ),
    Mutation(
        "a RayJob read gone before the watch delivered its Complete is taken for deleted outside the operator",
        "retool_operator/reconcile.py",
        "MISSING_CONFIRM_SECONDS = 3.0",
        "MISSING_CONFIRM_SECONDS = 0.0",
        ("tests/operator/test_integration_upstream.py::test_a_succeeded_rayjob_kuberay_deletes_right_after_complete_is_not_rerun",),
    ),
    # Issue 32: the turn-format invariant on the 0.9 line.
    Mutation(
        "the 0.9 sft stage uses verl 0.9.1's own SFT dataset (each message tokenized alone: Qwen3's reasoning dropped)",
        "retool/recipe/render/v0_9.py",
        '"data.custom_cls.path": v0_9.SFT_DATASET_CLASS_PATH,',
        '"data.custom_cls.path": None,',
        ("tests/verl09/test_token_parity.py",),
        venv=".venv-verl09",
    ),
    # Issue 34: the outcome of a RayJob KubeRay deletes after success survives an operator restart.
    Mutation(
        "stage RayJobs are created without the operator's outcome finalizer (a restart takes a deleted success for a deletion)",
        "retool_operator/builders/stages.py",
        'meta = {**_child_meta(run, name, lbls, config=config, ray=True), "finalizers": [c.FINALIZER_OUTCOME]}',
        "meta = _child_meta(run, name, lbls, config=config, ray=True)",
        ("tests/operator/test_integration_upstream.py::test_a_rayjob_kuberay_deleted_after_success_while_the_operator_was_down_still_counts_as_succeeded",),
    ),
    Mutation(
        "a held RayJob deleted while it runs is followed as running forever",
        "retool_operator/reconcile.py",
        'if outcome.state == "missing" or (being_deleted(obj) and outcome.state in ("running", "suspended")):',
        'if outcome.state == "missing":',
        ("tests/operator/test_integration_upstream.py::test_a_running_rayjob_deleted_outside_the_operator_fails_its_attempt_and_is_let_go",),
    ),
    # Issue 47: the seams of a RetoolRun that really trains (tests/verl09/test_rehearsal.py, docs/rehearsal.md). Each
    # row runs the whole file: one rehearsal serves all its tests, so they share one baseline, and -x ends a
    # mutated run at the first seam that breaks.
    Mutation(
        "the SFT learning rate is not the spec's (the model learns nothing)",
        "retool/recipe/render/sft.py",
        '"optim.lr": sft.learning_rate,',
        '"optim.lr": 1e-9,',
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "an SFT retry starts over instead of resuming its checkpoint",
        "retool/recipe/render/sft.py",
        '"trainer.resume_mode": "auto",',
        '"trainer.resume_mode": "disable",',
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "RL starts from the base model, not from the merged SFT model",
        "retool/recipe/render/ppo.py",
        "return run_paths(run).sft_merged if run.spec.sft.enabled else model_path(run)",
        "return model_path(run)",
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "RL's actor does not learn (learning rate 0)",
        "retool/recipe/render/ppo.py",
        'f"{arr}.actor.optim.lr": rl.learning_rate,',
        'f"{arr}.actor.optim.lr": 0.0,',
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "an RL retry starts over instead of resuming its checkpoint",
        "retool/recipe/render/ppo.py",
        '"trainer.resume_mode": "auto",',
        '"trainer.resume_mode": "disable",',
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "eval serves the SFT model instead of the RL output",
        "retool/recipe/render/ppo.py",
        "return run_paths(run).rl_merged if run.spec.rl.enabled else policy_model_path(run)",
        "return policy_model_path(run)",
        REHEARSAL_TESTS,
        venv=".venv-verl09",
    ),
    Mutation(
        "the hf rollout engine drops the trainer's weights (RL's rollouts never see its updates)",
        "retool/recipe/verl_plugins/v0_9/hf_rollout.py",
        "own[name].copy_(tensor.to(own[name].dtype))",
        "pass",
        ("tests/verl09/test_hf_rollout.py::test_the_server_batches_concurrent_requests_and_takes_the_trainers_weights",),
        venv=".venv-verl09",
    ),
    Mutation(
        "verl's process groups keep their cpu:gloo,cpu:gloo backend on CPU (torch refuses it)",
        "retool/recipe/verl_plugins/v0_9/cpu.py",
        'kwargs["backend"] = BACKEND',
        "pass",
        ("tests/verl09/test_cpu_platform.py::test_a_cpu_process_gets_the_cpu_platform_gloo_the_fsdp_engines_and_the_hf_engine",),
        venv=".venv-verl09",
    ),
    # Round 18 (issues 48, 49, 51): each row names only the tests of its own module.
    Mutation(
        "a sandbox-failed trajectory keeps its GRPO group (its uid is not made its own)",
        "retool/recipe/verl_plugins/masking.py",
        'data.non_tensor_batch["uid"] = relabelled',
        "pass",
        ("tests/turns/test_sandbox_failure_mask.py",),
    ),
    Mutation(
        "a sandbox-failed trajectory stays in the loss (its response mask is kept)",
        "retool/recipe/verl_plugins/masking.py",
        "mask[torch.as_tensor(rows, device=mask.device)] = 0",
        "pass",
        ("tests/verl09/test_sandbox_failure_mask.py",),
        venv=".venv-verl09",
    ),
    Mutation(
        "a group's lone survivor keeps verl's mean 0, std 1",
        "retool/recipe/sandbox_failures.py",
        "orphaned = np.fromiter((not f and sizes[g] >= 2 and kept[g] == 1 for g, f in zip(groups, failed, strict=True)), dtype=bool, count=len(groups))",
        "orphaned = np.zeros(len(groups), dtype=bool)",
        ("tests/dynamics/test_sandbox_failures.py",),
    ),
    Mutation(
        "a sandbox replica Pending forever keeps the preflight waiting (no readyTimeoutSeconds)",
        "retool_operator/sandbox_gate.py",
        "if now is not None and ready_timeout_s is not None and created and (now - min(created)).total_seconds() >= ready_timeout_s:",
        "if False:",
        ("tests/operator/test_sandbox_gate.py",),
    ),
    Mutation(
        "StageStarted is never posted once a stage's pod runs",
        "retool_operator/reconcile.py",
        'if entry.state != "Running" or entry.running_time is not None or not observed.running_pods.get(child):',
        "if True:",
        ("tests/operator/test_reconcile.py",),
    ),
    Mutation(
        "an unchanged status is never written again (observedAt goes stale while the operator runs)",
        "retool_operator/status.py",
        "if seen and (now - dt.datetime.fromisoformat(str(seen).replace(\"Z\", \"+00:00\"))).total_seconds() < OBSERVED_HEARTBEAT_SECONDS:",
        "if True:",
        ("tests/operator/test_observed_at.py",),
    ),
    Mutation(
        "log lines of a pass do not name the run",
        "retool_operator/logcontext.py",
        'if run is not None and isinstance(record.msg, str) and not record.msg.startswith(f"[{run}]"):',
        "if False:",
        ("tests/operator/test_logcontext.py",),
    ),
    Mutation(
        "JSON with a 4301-digit integer or 60,000 levels of nesting is a plain-text 500",
        "retool/sandbox/run_route.py",
        "except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep",
        "except KeyError as exc:  # an integer too long, nesting too deep",
        ("tests/sandbox/test_run_route_fuzz.py",),
    ),
    Mutation(
        "an execution whose files cannot be written leaves its pipes open",
        "retool/sandbox/worker.py",
        "prepared.close()  # whatever the path out of the execution, none of its pipes stays open",
        "pass",
        ("tests/sandbox/test_server_limits.py",),
    ),
    # Issue 51: what a run costs, and the PriorityClass warning at admission.
    Mutation(
        "an ended pod is counted up to now instead of its last container's end",
        "retool_operator/cost.py",
        "end = parse_time(use.end_time) if use.end_time else until",
        "end = until",
        ("tests/operator/test_cost.py",),
    ),
    Mutation(
        "a pod that is gone is dropped without its hours being settled into its attempt",
        "retool_operator/cost.py",
        "settled[key] = settled.get(key, 0.0) + hours(use, now)",
        "pass",
        ("tests/operator/test_cost.py",),
    ),
    Mutation(
        "the last attempt of a failed stage is not counted as lost",
        "retool_operator/cost.py",
        'return attempt < entry.attempt or (attempt == entry.attempt and entry.state == "Failed")',
        "return attempt < entry.attempt",
        ("tests/operator/test_cost.py",),
    ),
    Mutation(
        "the clock's cost figures make every pass write the status",
        "retool_operator/status.py",
        'LIVE_COST_FIGURES = ("deviceHours", "lostDeviceHours", "deviceHoursPerPoint", "amount", "stages")',
        "LIVE_COST_FIGURES = ()",
        ("tests/operator/test_cost.py",),
    ),
    Mutation(
        "the admission warning is given for a PriorityClass that exists",
        "retool_operator/cluster_warnings.py",
        "return [] if found is not None else [missing_priority_class_warning(name)]",
        "return [missing_priority_class_warning(name)]",
        ("tests/operator/test_integration_admission.py",),
    ),
    # Issue 49: the HTTP layer's bounds.
    Mutation(
        "http layer: a write the client does not drain is never aborted",
        "retool/sandbox/http_limits.py",
        "if not self._lost and self.transport.get_write_buffer_size() > 0:",
        "if False:",
        ("tests/sandbox/test_http_lockouts.py::test_unread_answers_with_a_pipelined_ping_are_aborted_and_lock_nobody_out",),
    ),
    Mutation(
        "http layer: an abort closes gracefully behind the unread bytes (no reset, the kernel's queue kept)",
        "retool/sandbox/http_limits.py",
        'sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))',
        "pass",
        ("tests/sandbox/test_http_lockouts.py::test_unread_answers_with_a_pipelined_ping_are_aborted_and_lock_nobody_out",),
    ),
    Mutation(
        "http layer: a closing connection keeps its slot under the connection cap",
        "retool/sandbox/http_limits.py",
        "return sum(1 for c in self.connections if c.transport is not None and not c.transport.is_closing())",
        "return len(self.connections)",
        ("tests/sandbox/test_http_lockouts.py::test_a_closing_connection_frees_its_slot",),
    ),
    Mutation(
        "http layer: the in-flight body budget reserves declared lengths, not arrived bytes",
        "retool/sandbox/http_limits.py",
        "reserved = 0  # what arrived, never what was declared: a silent declaration holds nothing",
        "reserved = length if declared and self.budget.reserve(length) else 0",
        ("tests/sandbox/test_http_lockouts.py::test_silent_declared_bodies_do_not_lock_out_run_code",),
    ),
    Mutation(
        "http layer: unsent answer bytes are not bounded across the replica",
        "retool/sandbox/http_limits.py",
        "self._enforce_unsent_budget()",
        "pass",
        ("tests/sandbox/test_http_lockouts.py::test_unread_answers_are_bounded_in_bytes_across_the_replica",),
    ),
    Mutation(
        "http layer: a connection whose answer is unread never makes room at the cap",
        "retool/sandbox/http_limits.py",
        'EVICTION_ORDER = {"idle": 0, "unread": 1, "header": 2, "body": 3}',
        'EVICTION_ORDER = {"idle": 0, "header": 2, "body": 3}',
        ("tests/sandbox/test_http_lockouts.py::test_an_unread_connection_makes_room_before_one_sending_headers",),
    ),
    Mutation(
        "http layer: a request outside the pool has no bound",
        "retool/sandbox/http_limits.py",
        "self._handler_timer = self.loop.call_later(handler_timeout_s, self._give_up, cycle)",
        "pass",
        ("tests/sandbox/test_http_lockouts.py::test_a_request_outside_the_pool_is_bounded",),
    ),
    Mutation(
        "http layer: a request that is not HTTP is answered in plain text, outside the API's error shape",
        "retool/sandbox/http_limits.py",
        'self._refuse("400 Bad Request", msg)',
        "super().send_400_response(msg)",
        ("tests/sandbox/test_http_lockouts.py::test_the_http_layer_answers_errors_in_the_api_format",),
    ),
    Mutation(
        "a node's termination taint is not read as a sign that it is going",
        "retool_operator/notice.py",
        'why = GOING_TAINTS.get(str(taint.get("key") or ""))',
        "why = None",
        ("tests/operator/test_notice.py",),
    ),
    Mutation(
        "the trainer ignores the operator's save request at verl's step-end decision",
        "retool/recipe/verl_plugins/save_notice.py",
        "if request is not None and request != self.handled:",
        "if False:",
        ("tests/turns/test_save_notice.py",),
    ),
    Mutation(
        "the operator never asks the rl attempt to save when its node is going",
        "retool_operator/runner.py",
        "if sign is not None and (request is None or not request.delivered):",
        "if False:",
        ("tests/operator/test_integration_tracking.py::test_a_going_node_under_rl_asks_the_trainer_to_save_and_its_answer_reaches_the_run",),
    ),
    Mutation(
        "retool compare drops the operator's cost figures",
        "retool/tracking/compare.py",
        'cost={key: float(value) for key, value in parent.data.metrics.items() if key.startswith("cost/")},',
        "cost={},",
        ("tests/tracking/test_compare.py::test_compare_shows_what_each_run_cost_from_the_operators_figures",),
    ),
    # Issue 49: the shared-uid accounting.
    Mutation(
        "the memory watch subtracts the warm baseline from every fork again (forks that unmapped what they inherited count 0)",
        "retool/sandbox/accounting.py",
        "return max(0, sum(amounts) - (baseline_kib if any(flags) else 0))",
        "return sum(max(0, r - baseline_kib) if fork else r for r, fork in zip(amounts, flags, strict=True))",
        (
            "tests/sandbox/test_shared_uid_accounting.py::test_forks_that_unmap_what_they_inherited_count_against_the_memory_limit",
            "tests/sandbox/test_scratch.py::test_the_cheap_memory_estimate",
        ),
    ),
    Mutation(
        "the process watch allows an execution the shared uid's count at dispatch on top of MAX_PROCESSES (the leapfrog)",
        "retool/sandbox/worker.py",
        "if tasks > limits.max_processes:  # its own, whatever the shared uid's count lets it start",
        "if tasks > limits.max_processes + int(job.get(\"processes_in_use\") or 0):",
        ("tests/sandbox/test_shared_uid_accounting.py::test_an_execution_cannot_take_the_room_other_executions_processes_leave",),
    ),
    Mutation(
        "the process watch counts processes, not their threads",
        "retool/sandbox/accounting.py",
        "tasks += len(threads)",
        "tasks += 1",
        ("tests/sandbox/test_shared_uid_accounting.py::test_the_process_count_is_every_task_of_the_descendants_and_only_theirs",),
    ),
    Mutation(
        "the process watch counts the zygote's own tasks with the execution's",
        "retool/sandbox/accounting.py",
        "counted, root = not root, False  # the root's own tasks are not its descendants'",
        "counted, root = True, False",
        ("tests/sandbox/test_shared_uid_accounting.py::test_the_process_count_is_every_task_of_the_descendants_and_only_theirs",),
    ),
    # Issue 50, item 7: behaviours a one-line break left untested; each row names only its own module's tests.
    # -- sandbox (issue 50 item 7)
    Mutation(
        "an execution inherits the template's environment (the zygote's scrub gone: PASS_ENV's variables, PYTHONPATH)",
        "retool/sandbox/child.py",
        "os.environ.clear()",
        "pass",
        ("tests/sandbox/test_execution_start.py::test_an_execution_gets_the_clean_environment_not_the_servers",),
    ),
    Mutation(
        "an execution starts from the server's whole environment (credentials, service addresses in its initial environment)",
        "retool/sandbox/pool.py",
        "env = {name: os.environ[name] for name in settings.pass_env if name in os.environ}",
        "env = dict(os.environ)",
        ("tests/sandbox/test_execution_start.py::test_an_execution_gets_the_clean_environment_not_the_servers",),
    ),
    Mutation(
        "an execution can tgkill or tkill its zygote in a shared-uid pid namespace (the thread-signal guard protects no pid)",
        "retool/sandbox/seccomp.py",
        'p.deny_any("guard_thread", 0, protected)',
        'p.deny_any("guard_thread", 0, ())',
        ("tests/sandbox/test_execution_start.py::test_an_execution_cannot_signal_its_zygote_by_any_call",),
    ),
    Mutation(
        "an execution can kill its zygote in a shared-uid pid namespace (the process-signal guard protects only kill(-1))",
        "retool/sandbox/seccomp.py",
        'p.deny_any("guard_process", 0, (0xFFFFFFFF, *protected, *(-pid & 0xFFFFFFFF for pid in policy.protected)))',
        'p.deny_any("guard_process", 0, (0xFFFFFFFF,))',
        ("tests/sandbox/test_execution_start.py::test_an_execution_cannot_signal_its_zygote_by_any_call",),
    ),
    Mutation(
        "an execution can signal its zygote in a shared-uid pid namespace (the worker asks no protection for it)",
        "retool/sandbox/worker.py",
        '"protect_parent": self.pid_namespace and self.drop != "uid",',
        '"protect_parent": False,',
        ("tests/sandbox/test_execution_start.py::test_an_execution_cannot_signal_its_zygote_by_any_call",),
    ),
    Mutation(
        "/dev/urandom refused under Landlock (dropped from the device rules)",
        "retool/sandbox/landlock.py",
        'DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")',
        'DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random")',
        ("tests/sandbox/test_execution_start.py::test_landlock_leaves_an_execution_dev_urandom",),
    ),
    Mutation(
        "a failed execution setup is reported at its outermost frame (child.main), not the step that failed",
        "retool/sandbox/worker.py",
        'where = next((line for line in reversed(lines) if line.startswith("File ")), None)',
        'where = next((line for line in lines if line.startswith("File ")), None)',
        ("tests/sandbox/test_native_setup.py::test_a_failed_setup_is_reported_at_the_step_that_failed",),
    ),
    Mutation(
        "the zygote keeps the template's environment: both setup paths agree on it (the comparison pins what they share)",
        "retool/sandbox/child.py",
        "scrub_environment()  # before the first fork: every execution inherits SAFE_ENV",
        "pass",
        ("tests/sandbox/test_native_setup.py::test_the_compiled_setup_leaves_the_execution_as_the_python_setup_does",),
    ),
    Mutation(
        "the zygote keeps the template's JSON logging: both setup paths agree on it (the comparison pins what they share)",
        "retool/sandbox/child.py",
        "fresh_logging()  # and a fresh interpreter's logging, not the template's JSON handlers",
        "pass",
        ("tests/sandbox/test_native_setup.py::test_the_compiled_setup_leaves_the_execution_as_the_python_setup_does",),
    ),
    Mutation(
        "/dev/urandom refused by the Landlock rules both setup paths share (the comparison pins what they share)",
        "retool/sandbox/landlock.py",
        'DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")',
        'DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random")',
        ("tests/sandbox/test_native_setup.py::test_the_compiled_setup_leaves_the_execution_as_the_python_setup_does",),
    ),
    Mutation(
        "the template takes the server's whole environment: its secrets are in every execution's /proc/self/environ",
        "retool/sandbox/pool.py",
        "env = {name: os.environ[name] for name in settings.pass_env if name in os.environ}",
        "env = dict(os.environ)",
        ("tests/sandbox/test_hostile.py::test_no_secret_reaches_the_code",),
    ),
    Mutation(
        "the server stays dumpable: code sharing its uid reads its secrets in /proc/1/environ where Landlock is missing",
        "retool/sandbox/serve.py",
        "isolation.set_dumpable(False)",
        "pass",
        ("tests/sandbox/test_hostile.py::test_no_secret_reaches_the_code",),
    ),
    # -- operator (issue 50 item 7)
    Mutation(
        "a pod the API server refuses as invalid (a LimitRange default limit below its request) is no refusal: the run waits silently",
        "retool_operator/below.py",
        """REFUSED = re.compile(r'\\bis forbidden: |\\bis invalid: |admission webhook "[^"]*" denied the request')""",
        """REFUSED = re.compile(r'\\bis forbidden: |admission webhook "[^"]*" denied the request')""",
        ("tests/operator/test_stalls_below.py::test_a_pod_a_limitrange_turns_down_is_named_on_the_stage_and_stalls_the_run",),
    ),
    Mutation(
        "a run deleted with a running stage holds its RayJob until the run is gone (a foreground deletion never ends)",
        "retool_operator/runner.py",
        'if run is None or being_deleted(run) or outcome_recorded(load(run.get("status") or {}), child):',
        'if run is None or outcome_recorded(load(run.get("status") or {}), child):',
        ("tests/operator/test_integration_upstream.py::test_a_run_deleted_in_the_foreground_lets_its_running_rayjob_go_while_the_run_waits_for_it",),
    ),
    Mutation(
        "a deleted RayJob's outcome finalizer is released at its watch event, before the run's status records the outcome",
        "retool_operator/runner.py",
        'if run is None or being_deleted(run) or outcome_recorded(load(run.get("status") or {}), child):',
        "if True:",
        ("tests/operator/test_integration_upstream.py::test_a_deleted_rayjobs_finalizer_goes_only_once_its_outcome_is_in_the_runs_status",),
    ),
    Mutation(
        "one refused sandbox replica stalls a run whose sandbox has a ready replica",
        "retool_operator/runner.py",
        "if not uses_sandbox(run) or not observed.sandbox_pods_refused or observed.sandbox_ready_replicas > 0 or decision.sandbox_replicas == 0:",
        "if not uses_sandbox(run) or not observed.sandbox_pods_refused or decision.sandbox_replicas == 0:",
        ("tests/operator/test_stalls_below.py::test_one_refused_replica_of_a_ready_sandbox_does_not_stall_the_run",),
    ),
    Mutation(
        "the previous attempt's RayJob, deleted while the next attempt runs, is never released",
        "retool_operator/reconcile.py",
        "return entry is None or entry.job != name or entry.state not in c.FOLLOWED_STATES",
        "return entry is None or entry.state not in c.FOLLOWED_STATES",
        (
            "tests/operator/test_finalizers.py",
            "tests/operator/test_integration_upstream.py::test_the_previous_attempts_rayjob_deleted_during_the_next_attempt_is_let_go",
        ),
    ),
    Mutation(
        "the outcome finalizer is renamed without docs/operations.md (its kubectl commands name a finalizer nothing writes)",
        "retool_operator/constants.py",
        'FINALIZER_OUTCOME = "retool.dev/stage-outcome"',
        'FINALIZER_OUTCOME = "retool.dev/outcome"',
        ("tests/operator/test_finalizers.py",),
    ),
    Mutation(
        "kopf's finalizer on runs is renamed without docs/operations.md",
        "retool_operator/handlers.py",
        'settings.persistence.finalizer = f"{c.KOPF_ANNOTATION_PREFIX}/finalizer"',
        'settings.persistence.finalizer = f"{c.KOPF_ANNOTATION_PREFIX}/run"',
        ("tests/operator/test_finalizers.py",),
    ),
    # -- preflight (issue 50 item 7)
    Mutation(
        "preflight: an SFT tool call's arguments given as JSON text are refused",
        "retool/preflight/fields.py",
        "if arguments is MISSING or arguments is None or not isinstance(arguments, Mapping | str):",
        "if arguments is MISSING or arguments is None or not isinstance(arguments, Mapping):",
        ("tests/preflight/test_data_fields.py::test_tool_call_arguments_given_as_json_text_are_valid",),
    ),
    Mutation(
        "preflight: a field problem past row 1024 is reported at its row within the reading batch",
        "retool/preflight/fields.py",
        "problems.append(FieldProblem(path, start + offset, field, problem))",
        "problems.append(FieldProblem(path, offset, field, problem))",
        ("tests/preflight/test_data_fields.py::test_a_problem_past_the_first_reading_batch_is_reported_at_its_true_row",),
    ),
    Mutation(
        "preflight: a check runs although its dependency was skipped",
        "retool/preflight/flow.py",
        'bad = next((r for r in relevant if r.status in ("failed", "skipped")), None)',
        'bad = next((r for r in relevant if r.status == "failed"), None)',
        (
            "tests/preflight/test_wiring.py::test_a_skipped_dependency_blocks_the_check_that_needs_it",
            "tests/preflight/test_wiring.py::test_checks_behind_a_skipped_check_are_skipped_not_run",
        ),
    ),
    Mutation(
        "preflight: a run without an eval stage never checks the rl stage's validation",
        "retool/preflight/flow.py",
        'validate = stage == "eval" or (validates and "eval" not in target.commands)',
        'validate = stage == "eval"',
        ("tests/preflight/test_wiring.py::test_a_run_without_an_eval_stage_checks_the_rl_stages_validation",),
    ),
    Mutation(
        "preflight: the reward guard passes when verl binds other reward kwargs than the run renders",
        "retool/preflight/reward_guard.py",
        "if dict(bound) != dict(expected_kwargs):",
        "if False:",
        ("tests/preflight/test_wiring.py",),
    ),
    # -- spec, compare, render (issue 50 item 7)
    Mutation(
        "spec: one sequence's KV cache counted as K or V alone (half what vLLM allocates), so a run vLLM refuses is accepted",
        "retool/spec/memory_fit.py",
        "per_token = 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * shape.dtype_bytes",
        "per_token = shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * shape.dtype_bytes",
        ("tests/spec/test_model_fit.py",),
    ),
    Mutation(
        "spec: a rollout refusal with offload on advises turning offload on",
        "retool/spec/model_fit.py",
        "keeps_actor = rl.enabled and not rl.offload",
        "keeps_actor = rl.enabled",
        ("tests/spec/test_model_fit.py",),
    ),
    Mutation(
        "spec: a log-probabilities refusal with offload on advises turning offload on",
        "retool/spec/model_fit.py",
        '"shorten maxPromptLength + maxResponseLength, " + ("" if rl.offload else "set rl.offload: true, ") + "or add nodes or devices",',
        '"shorten maxPromptLength + maxResponseLength, set rl.offload: true, or add nodes or devices",',
        ("tests/spec/test_model_fit.py",),
    ),
    Mutation(
        "compare: a best validation value reached twice is reported at its last step",
        "retool/tracking/compare.py",
        "best = max(series, key=lambda step: (series[step], -step)) if series else None",
        "best = max(series, key=lambda step: (series[step], step)) if series else None",
        ("tests/tracking/test_compare.py",),
    ),
    Mutation(
        "compare: the headline's best validation step is the last step reaching it",
        "retool/tracking/headline.py",
        "step = max(series, key=lambda s: (series[s], -s))",
        "step = max(series, key=lambda s: (series[s], s))",
        ("tests/tracking/test_compare.py",),
    ),
    Mutation(
        "compare: the baseline is the first run given, not the text-only run",
        "retool/tracking/compare.py",
        "return next((run for run in runs if run.recipe == TEXT_ONLY), runs[0])",
        "return runs[0]",
        ("tests/tracking/test_compare.py",),
    ),
    Mutation(
        "sandbox: fetch_files follows a symlink swapped in for a directory of the path",
        "retool/sandbox/scratch.py",
        "inner = os.open(part, _DIR_FLAGS, dir_fd=fd)",
        "inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)",
        ("tests/sandbox/test_scratch.py",),
    ),
    # -- retry on the same Ray cluster (issue 51)
    Mutation(
        "cluster reuse: KubeRay's AppFailed without Ray's FAILED (a restarted head's lost job) keeps the cluster",
        "retool_operator/cluster_reuse.py",
        'return st.get("jobDeploymentStatus") == "Failed" and st.get("reason") == JOB_FAILED_REASON and st.get("jobStatus") == "FAILED"',
        'return st.get("jobDeploymentStatus") == "Failed" and st.get("reason") == JOB_FAILED_REASON',
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: a restarted head or worker is taken for healthy",
        "retool_operator/cluster_reuse.py",
        "if restarts:",
        "if False:",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: a pod made after the job was submitted (a replaced head) is taken for healthy",
        "retool_operator/cluster_reuse.py",
        "if since is not None and created is not None and created > since:",
        "if False:",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: a queued run (Kueue does not manage a clusterSelector RayJob) keeps its cluster",
        "retool_operator/cluster_reuse.py",
        "return stage in RAY_STAGES and run.spec.failure_policy.retry_on_same_cluster and not queued(run)",
        "return stage in RAY_STAGES and run.spec.failure_policy.retry_on_same_cluster",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: the keep patch leaves the TTL, which KubeRay's validation refuses without shutdownAfterJobFinishes",
        "retool_operator/cluster_reuse.py",
        'return {"spec": {"shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0}}',
        'return {"spec": {"shutdownAfterJobFinishes": False}}',
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: a cluster given up is still taken for needed, so it is never deleted",
        "retool_operator/cluster_reuse.py",
        "if kept is None or kept.released:",
        "if kept is None:",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: an unkept cluster is deleted at once even with a grace period",
        "retool_operator/cluster_reuse.py",
        "if cluster and not kept and (left_up or (not grace and enabled(run, old.name))):",
        "if cluster and not kept and (left_up or enabled(run, old.name)):",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: a cluster is kept again after a failure on it",
        "retool_operator/reconcile.py",
        'why = "this attempt already ran on a kept one" if entry.ray_cluster is not None else None',
        "why = None",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cluster reuse: the retry waits for the kept cluster's own pods to terminate",
        "retool_operator/reconcile.py",
        "blocking = {owner: left for owner, pods in blocking.items() if (left := [p for p in pods if p not in handed])}",
        "blocking = dict(blocking)",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "cost: a handed-over pod's earlier attempt is settled to now instead of to the handover",
        "retool_operator/cost.py",
        "settled[key] = settled.get(key, 0.0) + hours(known, parse_time(use.since_time) if use.since_time else now)",
        "settled[key] = settled.get(key, 0.0) + hours(known, now)",
        ("tests/operator/test_cluster_reuse.py",),
    ),
    Mutation(
        "render: the 0.9 line puts SFT's cpu_offload on engine.param_offload (verl 0.9.1's optimizer_offload left off)",
        "retool/recipe/render/v0_9.py",
        '"model.fsdp_config.cpu_offload": "engine.optimizer_offload",',
        '"model.fsdp_config.cpu_offload": "engine.param_offload",',
        ("tests/render/test_verl_lines.py",),
    ),
    Mutation(
        "charts: a legend swatch for every series, a red one on a clean check",
        "retool/tracking/bar_chart.py",
        "shown = any(series.values)  # a legend entry only for what the bars hold: no red swatch on a clean check",
        "shown = True",
        ("tests/evaluate/test_charts.py",),
    ),
    Mutation(
        "charts: past the limit, the first trajectories by row, those with a problem not first",
        "retool/data_check/chart.py",
        "shown = sorted((flagged + rest)[:max_bars], key=lambda t: t.index)",
        "shown = trajectories[:max_bars]",
        ("tests/evaluate/test_charts.py",),
    ),
    Mutation(
        "charts: a mismatched block drawn as reproduced",
        "retool/data_check/chart.py",
        "counts = [(sum(s.verdict in AGREEING for s in t.steps), sum(s.verdict == MISMATCH for s in t.steps), sum(s.verdict == NOT_RECORDED for s in t.steps)) for t in shown]",
        "counts = [(sum(s.verdict != NOT_RECORDED for s in t.steps), 0, sum(s.verdict == NOT_RECORDED for s in t.steps)) for t in shown]",
        ("tests/evaluate/test_charts.py",),
    ),
    Mutation(
        "demo: the timings chart drawn before training and logging ended (their steps missing)",
        "retool/demo/pipeline.py",
        "path = write_png(timings_chart(seconds), out_dir / Path(TIMINGS_CHART).name)",
        'path = write_png(timings_chart({k: v for k, v in seconds.items() if k not in ("mlflow", "train")}), out_dir / Path(TIMINGS_CHART).name)',
        ("tests/evaluate/test_embedded_and_demo.py::test_demo_runs_for_real_keeps_mlflow_on_request_and_stops_it",),
    ),
    Mutation(
        "reward watch: math-verify's comparison ignores the verdict's time budget (its own 5 s always)",
        "retool/recipe/reward_watch.py",
        "if verify(g, t, timeout_seconds=timeout_s, raise_on_error=True):",
        "if verify(g, t, raise_on_error=True):",
        ("tests/dynamics/test_second_verifier.py",),
    ),
    Mutation(
        "sandbox: the memory watch leaves the execution's open pipes out of its figure",
        "retool/sandbox/accounting.py",
        "cheap = self.inspect(cheap_pass) + self.pipes_kib",
        "cheap = self.inspect(cheap_pass)",
        ("tests/sandbox/test_shared_uid_accounting.py",),
    ),
    Mutation(
        "sandbox: a pipe counted once per descriptor that holds it, not once",
        "retool/sandbox/accounting.py",
        "seen.add(target)",
        'seen.add(f"{pid}/{fd}")',
        ("tests/sandbox/test_shared_uid_accounting.py",),
    ),
    Mutation(
        "sandbox: the exact memory read on every tick the cheap bound is over, not at its cadence",
        "retool/sandbox/accounting.py",
        "self._next_exact = now + max(self.exact_every_s, self.exact_cost_factor * (time.monotonic() - started))",
        "self._next_exact = now",
        ("tests/sandbox/test_layers.py",),
    ),
)


def working_tree_files(repo: Path) -> list[str]:
    """Tracked and untracked (not ignored) files; every file but the shared paths outside a git checkout (an export)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo, capture_output=True, check=False)
    if listed.returncode == 0:
        return [name for name in listed.stdout.decode().split("\0") if name and (repo / name).is_file()]
    files = (p.relative_to(repo) for p in repo.rglob("*") if p.is_file() and not p.is_symlink())
    return [p.as_posix() for p in files if p.parts[0] not in SHARED_PATHS and "__pycache__" not in p.parts]


def copy_tree(repo: Path, dest: Path) -> None:
    for name in working_tree_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)
    for pattern in BUILT:
        for built in repo.glob(pattern):
            shutil.copy2(built, dest / built.relative_to(repo))
    for name in SHARED_PATHS:
        if (repo / name).exists():
            (dest / name).symlink_to((repo / name).resolve())


def mutate(path: Path, original: str, mutated: str) -> None:
    """Replace the one line whose content is ``original``; ValueError when there is not exactly one."""
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == original]
    if len(hits) != 1:
        raise ValueError(f"{path.name}: {len(hits)} lines are {original!r} (expected exactly one: is the table stale?)")
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = indent + mutated + ("\n" if line.endswith("\n") else "")
    path.write_text("".join(lines))


@dataclass
class Outcome:
    passed: bool
    seconds: float
    tail: str


def run_tests(root: Path, python: str, tests: tuple[str, ...], timeout_s: float) -> Outcome:
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    try:
        proc = subprocess.run(
            [python, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=--strict-markers", *tests],
            cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Outcome(False, time.monotonic() - started, f"timed out after {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if " passed" in line or " failed" in line or " error" in line), lines[-1] if lines else "")
    failed = next((line for line in lines if line.startswith(("FAILED ", "ERROR "))), "")
    return Outcome(proc.returncode == 0, time.monotonic() - started, f"{summary} {failed}".strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-k", dest="only", action="append", default=[], help="only the mutations whose name contains this (repeat: any of them; rows with the same tests share one baseline)"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--repo", type=Path, default=REPO, help="the tree to copy (default: this checkout), e.g. an export of an older commit")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(words in m.name for words in args.only)]
    if args.list or not chosen:
        for m in chosen or MUTATIONS:
            print(f"{m.file}: {m.name}")
        return 0 if chosen else 2

    baselines: dict[tuple[str, tuple[str, ...]], Outcome] = {}
    results: list[tuple[Mutation, str, Outcome | None]] = []
    started = time.monotonic()
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix="retool-mutation-") as tmp:
            root = Path(tmp) / "repo"
            copy_tree(args.repo.resolve(), root)
            python = str(args.repo.resolve() / m.venv / "bin" / "python") if m.venv else args.python
            if (python, m.tests) not in baselines:
                baselines[(python, m.tests)] = run_tests(root, python, m.tests, args.timeout)
            base = baselines[(python, m.tests)]
            if not base.passed:
                verdict, outcome = "baseline FAILS", base
            else:
                try:
                    mutate(root / m.file, m.original, m.mutated)
                except ValueError as err:
                    verdict, outcome = "STALE", Outcome(False, 0.0, str(err))
                else:
                    outcome = run_tests(root, python, m.tests, args.timeout)
                    verdict = "NOT caught" if outcome.passed else "caught"
        results.append((m, verdict, outcome))
        print(f"{verdict:<14} {outcome.seconds:6.1f} s  {m.name}  [{m.file}]", flush=True)
        if verdict != "caught":
            print(f"               {outcome.tail}", flush=True)

    caught = sum(1 for _, verdict, _ in results if verdict == "caught")
    print(f"\n{caught} of {len(results)} mutations caught in {time.monotonic() - started:.0f} s")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
