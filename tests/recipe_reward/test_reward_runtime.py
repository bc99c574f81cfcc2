"""The reward as verl runs it: loaded by file path, called from threads, shaping, hard deadlines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import retool.recipe.reward.score as reward_module
from retool.recipe.reward.score import MAX_TIMEOUT_S, compute_score, count_tool_calls, shape_wrong_answer
from retool.recipe.reward.symbolic import SymbolicPool
from tests.conftest import repo_env
from tests.recipe_reward.cases import ALL, SYMBOLIC

REWARD_FILE = Path(reward_module.__file__)
SCHEDULING_SLACK_S = 5.0
"""How far past its deadline a comparison may return: the kill, the reply and this thread all wait for a
core on a loaded 2-core machine. A deadline not kept is far past it (a SIGSTOPped executor never answers;
the power tower runs minutes), so the bound still catches that."""
ENTRY_FILE = REWARD_FILE.parents[1] / "verl_plugins" / "reward.py"  # by path: importing it here would start workers in the test process


@pytest.fixture
def pool() -> Iterator[SymbolicPool]:
    """A pool of one worker, closed after the test whatever happened to its processes."""
    pool = SymbolicPool(size=1)
    yield pool
    pool.close()


SHAPING = [
    ("no tool calls keeps -1", {"num_turns": 2}, "", -1.0),
    ("one call from num_turns", {"num_turns": 4}, "", -0.9),
    ("three calls from num_turns", {"num_turns": 8}, "", -0.7),
    ("capped at -0.6", {"num_turns": 20}, "", -0.6),
    ("calls from verl tool_rewards", {"tool_rewards": [0.0, 0.0]}, "", -0.8),
    ("calls counted in the text", {}, "<tool_response>a</tool_response><interpreter>b</interpreter>", -0.8),
    ("num_turns None falls back to text", {"num_turns": None}, "<interpreter>b</interpreter>", -0.9),
]


@pytest.mark.parametrize(("extra_info", "text", "score"), [c[1:] for c in SHAPING], ids=[c[0] for c in SHAPING])
def test_tool_turn_shaping_of_wrong_answers(extra_info: dict, text: str, score: float) -> None:
    result = compute_score("dapo", text + " \\boxed{1}", "2", extra_info, tool_turn_shaping=True)
    assert result["acc"] == 0.0
    assert result["score"] == pytest.approx(score)


def test_shaping_is_off_by_default_and_never_touches_correct_answers() -> None:
    assert compute_score("dapo", "\\boxed{1}", "2", {"num_turns": 10})["score"] == -1.0
    assert compute_score("dapo", "\\boxed{2}", "2", {"num_turns": 10}, tool_turn_shaping=True)["score"] == 1.0
    assert compute_score("dapo", "\\boxed{1}", "2", {"num_turns": 10, "tool_turn_shaping": True})["score"] == pytest.approx(-0.6)


def test_shaping_helpers() -> None:
    assert shape_wrong_answer(0) == -1.0
    assert shape_wrong_answer(-3) == -1.0
    assert shape_wrong_answer(2, bonus_per_call=0.2, cap=-0.5) == pytest.approx(-0.6)
    assert count_tool_calls("<interpreter>x</interpreter>" * 3, None) == 3


def test_extra_verl_keyword_arguments_are_accepted() -> None:
    result = compute_score("dapo", "\\boxed{2}", "2", {}, reward_router_address=None, reward_model_tokenizer=None)
    assert result == {"score": 1.0, "acc": 1.0, "pred": "2", "source": "dapo", "reward_note": ""}


VERL_LOADER = textwrap.dedent(
    """
    import json, sys
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    config = OmegaConf.create({"custom_reward_function": {
        "path": sys.argv[1], "name": "compute_score", "reward_kwargs": {"tool_turn_shaping": True}}})
    fn = get_custom_reward_fn(config)
    calls = [
        dict(data_source="aime_2024", solution_str="<interpreter>\\\\boxed{7}</interpreter> so \\\\boxed{204}", ground_truth="204",
             extra_info={"num_turns": 4, "rollout_reward_scores": {}}),
        dict(data_source="aime_2024", solution_str="\\\\boxed{\\\\sqrt{8}}", ground_truth="2\\\\sqrt{2}", extra_info={},
             reward_router_address=None, reward_model_tokenizer=None),
        dict(data_source="dapo", solution_str="Answer: 3", ground_truth="4", extra_info={"num_turns": 6}),
    ]
    print(json.dumps({"module": sys.modules["custom_module"].__name__, "results": [fn(**c) for c in calls]}))
    """
)


@pytest.mark.slow
def test_verl_loads_the_reward_file_by_path(tmp_path: Path) -> None:
    """verl 0.6.1's own loader (spec_from_file_location as ``custom_module``) with reward_kwargs."""
    script = tmp_path / "load.py"
    script.write_text(VERL_LOADER)
    proc = subprocess.run(
        [sys.executable, str(script), str(REWARD_FILE)], cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert payload["module"] == "custom_module"
    assert payload["results"] == [
        {"score": 1.0, "acc": 1.0, "pred": "204", "source": "aime_2024", "reward_note": ""},
        {"score": 1.0, "acc": 1.0, "pred": "\\sqrt{8}", "source": "aime_2024", "reward_note": ""},
        {"score": pytest.approx(-0.8), "acc": 0.0, "pred": "3", "source": "dapo", "reward_note": ""},
    ]


WARM_LOADER = textwrap.dedent(
    """
    import json, sys, time
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from retool.recipe.reward.symbolic import default_pool
    config = OmegaConf.create({"custom_reward_function": {"path": sys.argv[1], "name": "compute_score"}})
    get_custom_reward_fn(config)
    pool = default_pool()
    started = len(pool._idle) + pool._busy
    deadline = time.monotonic() + 200
    while pool.ready_workers() < pool.size and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"started": started, "size": pool.size, "ready": pool.ready_workers()}))
    """
)


@pytest.mark.slow
def test_loading_the_reward_entry_file_warms_the_symbolic_workers_before_any_comparison(tmp_path: Path) -> None:
    """verl loads the entry file when its reward manager starts: the workers start there, not at the first rollout's reward."""
    script = tmp_path / "warm.py"
    script.write_text(WARM_LOADER)
    proc = subprocess.run(
        [sys.executable, str(script), str(ENTRY_FILE)], cwd=tmp_path, env=repo_env(RETOOL_SYMBOLIC_WORKERS="1"), capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"started": 1, "size": 1, "ready": 1}


@pytest.mark.slow
def test_verls_naive_reward_manager_puts_our_score_on_the_last_response_token(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.recipe_reward.verl_naive_manager", str(REWARD_FILE)],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["at_last_token"] == pytest.approx([1.0, -0.9])
    assert result["row_sums"] == pytest.approx([1.0, -0.9])
    assert result["extra"] == {
        "score": pytest.approx([1.0, -0.9]),
        "acc": [1.0, 0.0],
        "pred": ["204", "8"],
        "source": ["aime_2024", "dapo"],
        "reward_note": ["", ""],
    }


def test_concurrent_calls_from_a_thread_pool_agree_with_sequential_ones() -> None:
    """verl runs compute_score in loop.run_in_executor threads, where signals cannot time anything out.

    Graded with the largest symbolic budget: this checks the verdicts under concurrency, not speed. With
    the 0.5 s default, 8 threads' symbolic comparisons on a busy 2-core machine ran out of time (acc 0)."""
    cases = SYMBOLIC + ALL[:40]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda c: compute_score("dapo", c.response, c.truth, timeout_s=MAX_TIMEOUT_S)["acc"], cases))
    assert results == [c.correct for c in cases]


def _children(pid: int) -> set[int]:
    """The live children of ``pid`` (the kernel's list for its main thread; a reaped child has left it)."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return set()
    return {int(child) for child in listed if _alive(int(child))}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pool_kills_an_executor_that_does_not_answer_by_the_deadline_and_recovers_from_the_warm_zygote(pool: SymbolicPool) -> None:
    """An executor that never answers (stopped here: no CPU, so its own timer cannot fire either, as
    inside one long C call or on a machine too loaded to schedule it) is killed at the deadline.

    It had not even read the request, so the request is still in the pipe when the zygote forks
    the next executor: that one must not serve it as the next comparison's answer (the stale
    verdict, False, differs from the next one, True).
    """
    assert pool.compare("2", "2", timeout_s=60.0) is True  # cold start
    worker = pool._idle[0]
    zygote, stuck = worker.proc.pid, worker.executor_pid
    assert stuck is not None and stuck != zygote
    os.kill(stuck, signal.SIGSTOP)
    started = time.monotonic()
    assert pool.compare("2", "3", timeout_s=0.3) is None
    assert time.monotonic() - started < 0.3 + SCHEDULING_SLACK_S
    assert pool.kills == 1
    assert pool.compare("2\\sqrt{2}", "\\sqrt{8}", timeout_s=5.0) is True  # a fresh fork serves at once
    assert pool.compare("1", "2", timeout_s=5.0) is False
    assert pool._idle[0].proc.pid == zygote and _alive(zygote)
    assert pool._idle[0].executor_pid not in (None, stuck)
    assert not _alive(stuck)


def test_a_power_tower_ends_at_its_deadline(pool: SymbolicPool) -> None:
    """9^{9^{9^9}} would keep sympy in big-integer powers for minutes; the comparison ends at its
    budget (by the executor's timer between CPython's squarings, or by the kill inside one)."""
    assert pool.compare("2", "2", timeout_s=60.0) is True
    started = time.monotonic()
    assert pool.compare("9^{9^{9^9}}", "5", timeout_s=0.3) is None
    assert time.monotonic() - started < 0.3 + SCHEDULING_SLACK_S
    assert pool.compare("\\sqrt{4}", "2", timeout_s=5.0) is True


def test_a_slow_pure_python_comparison_is_ended_by_the_executors_own_timer_as_out_of_time(pool: SymbolicPool) -> None:
    """Expanding (x+1)^60 (y+2)^30 takes sympy seconds of Python (5.5 s measured): the executor's timer
    interrupts it at 0.8 of the budget, the pool reports "out of time" (None, like a kill) and
    keeps the same executor, with no kill."""
    assert pool.compare("3", "3", timeout_s=60.0) is True
    executor = pool._idle[0].executor_pid
    assert pool.compare("(x+1)^{60}(y+2)^{30}", "(x+2)^{60}(y+1)^{30}", timeout_s=1.0) is None
    # The pool's own count, not the wall clock, says who ended it: at its deadline the pool kills the
    # executor and counts it (a fresh-clone run on a loaded machine returned in 1.0008 s with no kill).
    assert pool.kills == 0
    assert pool.compare("\\sqrt{4}", "2", timeout_s=5.0) is True
    assert pool._idle[0].executor_pid == executor


@pytest.mark.slow
def test_an_executor_dying_mid_comparison_is_retried_within_the_same_deadline(pool: SymbolicPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is a total over attempts: the retry gets what is left of it, never a fresh one.

    Every request the pool sends is recorded with when it was sent and the time limit it carries
    (the worker's own timer, 0.8 of the comparison's budget). The retry's budget must be at most
    what was left when the executor was killed, and the call must end before a fresh deadline,
    started at the kill, could have ended.
    """
    from retool.recipe.reward import symbolic

    timeout_s, kill_after_s = 4.0, 2.0
    assert pool.compare("3", "3", timeout_s=60.0) is True
    worker = pool._idle[0]
    zygote, executor = worker.proc.pid, worker.executor_pid
    assert executor is not None

    sent: list[tuple[float, float]] = []
    send = symbolic._Worker.send
    monkeypatch.setattr(symbolic._Worker, "send", lambda self, request: (sent.append((time.monotonic(), request["timeout_s"] / 0.8)), send(self, request))[1])
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(executor, signal.SIGKILL)
        killed_at.append(time.monotonic())

    killer = threading.Timer(kill_after_s, kill)
    started = time.monotonic()
    killer.start()
    assert pool.compare("9^{9^{9^9}}", "5", timeout_s=timeout_s) is None
    ended = time.monotonic()
    killer.join()

    assert len(sent) == 2, f"expected the first attempt and one retry, sent {len(sent)} request(s): {sent}"
    (first_sent, first_budget), (_, retry_budget) = sent
    (kill_time,) = killed_at
    assert first_budget == pytest.approx(timeout_s)
    left_at_kill = timeout_s - (kill_time - first_sent)
    assert retry_budget <= left_at_kill + 1e-6, f"the retry got {retry_budget:.3f} s, only {left_at_kill:.3f} s of the {timeout_s} s were left"
    assert ended - started < (kill_time - started) + timeout_s, "the call lasted as long as a fresh deadline from the kill"
    assert pool.compare("\\sqrt{4}", "2", timeout_s=5.0) is True
    assert pool._idle[0].proc.pid == zygote
    assert pool._busy == 0


def _kill_quietly(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_worker_that_died_while_idle_is_replaced_and_the_answer_is_still_graded_right(pool: SymbolicPool) -> None:
    """The whole worker (zygote and executor) killed between calls, e.g. by the OOM killer."""
    assert pool.compare("x+x", "2x", timeout_s=60.0) is True
    worker = pool._idle[0]
    _kill_quietly(worker.executor_pid)
    _kill_quietly(worker.proc.pid)
    worker.proc.wait(timeout=10)
    for _ in range(3):
        assert pool.compare("2\\sqrt{2}", "\\sqrt{8}", timeout_s=60.0) is True
    assert pool._busy == 0 and len(pool._idle) == 1
    assert pool._idle[0].proc.pid != worker.proc.pid


@pytest.mark.slow
def test_an_executor_killed_while_idle_is_replaced_and_the_answer_is_still_graded_right(pool: SymbolicPool) -> None:
    assert pool.compare("x+x", "2x", timeout_s=60.0) is True
    zygote, executor = pool._idle[0].proc.pid, pool._idle[0].executor_pid
    _kill_quietly(executor)
    # the zygote notices and forks the next executor: wait for that child, not for a fixed time
    deadline = time.monotonic() + 30
    while not (_children(zygote) - {executor}) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _children(zygote) - {executor}, "the zygote forked no new executor in 30 s"
    assert pool.compare("2\\sqrt{2}", "\\sqrt{8}", timeout_s=60.0) is True
    assert pool._idle[0].executor_pid not in (None, executor)
    assert pool._busy == 0


def test_a_failing_release_still_returns_the_slot(pool: SymbolicPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot accounting survives an exception while a broken worker is being cleaned up."""
    from retool.recipe.reward import symbolic

    # ``pool`` is set up before ``monkeypatch``, so the patches are undone before the pool is closed.
    assert pool.compare("x+x", "2x", timeout_s=60.0) is True
    dead = pool._idle[0]
    _kill_quietly(dead.executor_pid)
    _kill_quietly(dead.proc.pid)
    dead.proc.wait(timeout=10)
    dead.ready = True
    monkeypatch.setattr(pool, "_acquire", lambda deadline: (setattr(pool, "_busy", pool._busy + 1), pool._idle.pop())[1])
    monkeypatch.setattr(symbolic._Worker, "kill", lambda self: (_ for _ in ()).throw(BrokenPipeError(32, "Broken pipe")))
    with pytest.raises(BrokenPipeError):
        pool.compare("1", "1", timeout_s=5.0)
    assert pool._busy == 0, "the slot came back although cleaning up the worker failed"


ORPHAN = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from retool.recipe.reward.symbolic import SymbolicPool
    pool = SymbolicPool(size=1)
    pool.compare("1", "1", timeout_s=60.0)
    worker = pool._idle[0]
    print(json.dumps([worker.proc.pid, worker.executor_pid]), flush=True)
    threading.Thread(target=pool.compare, args=("9^{9^{9^9}}", "5", 1.0), daemon=True).start()
    time.sleep(0.3)
    os._exit(0)  # the trainer process dies while the executor is stuck in C
    """
)


ORPHAN_DURING_WARM_UP = textwrap.dedent(
    """
    import json, os, time
    from retool.recipe.reward.symbolic import SymbolicPool
    pool = SymbolicPool(size=1)
    worker = pool._acquire(time.monotonic() + 1)  # starts the worker; it is still importing sympy
    print(json.dumps([worker.proc.pid]), flush=True)
    os._exit(0)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("script", [ORPHAN, ORPHAN_DURING_WARM_UP], ids=["executor stuck in C", "worker still warming up"])
def test_workers_do_not_outlive_a_dead_parent(tmp_path: Path, script: str) -> None:
    # stdout only: the workers inherit stderr, and run() would wait for them to close it
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=repo_env(), stdout=subprocess.PIPE, text=True, timeout=120, check=False)
    assert proc.returncode == 0
    pids = json.loads(proc.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids), "the CPU limit ends a stuck orphan executor, then its zygote exits"


FORKED = textwrap.dedent(
    """
    import json, multiprocessing
    from retool.recipe.reward.score import compute_score
    from retool.recipe.reward.symbolic import default_pool

    def child(queue):
        queue.put([compute_score("d", "\\\\boxed{\\\\sqrt{8}}", "2\\\\sqrt{2}")["acc"], id(default_pool())])

    first = compute_score("d", "\\\\boxed{x+x}", "2x")["acc"]
    parent_pool = id(default_pool())
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    child_acc, child_pool = queue.get(timeout=120)
    process.join(60)
    after = compute_score("d", "\\\\boxed{\\\\frac{\\\\pi}{2}}", "\\\\frac{1}{2}\\\\pi")["acc"]
    print(json.dumps([first, child_acc, after, process.exitcode, default_pool() is not None]))
    """
)


@pytest.mark.slow
def test_a_forked_child_gets_its_own_pool(tmp_path: Path) -> None:
    """A fork after the pool started must not share the parent's worker pipes (requests would interleave)."""
    env = repo_env(RETOOL_SYMBOLIC_WORKERS="1")  # two pools of one: four sympy imports would crawl on a shared CI core
    proc = subprocess.run([sys.executable, "-c", FORKED], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True, 0, True]


def test_closing_the_pool_ends_its_workers() -> None:
    pool = SymbolicPool(size=2)
    assert pool.compare("x+x", "2x", timeout_s=60.0) is True
    pids = [w.proc.pid for w in pool._idle]
    pool.close()
    assert pids and not any(_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.compare("1", "1", timeout_s=1.0)


def test_pool_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size must be >= 1"):
        SymbolicPool(size=0)


def test_worker_exits_when_its_input_closes() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-I", str(REWARD_FILE.with_name("symbolic_worker.py"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    ready = json.loads(proc.stdout.readline())
    assert ready["ready"] is True and isinstance(ready["pid"], int) and ready["pid"] != proc.pid
    proc.stdin.write(json.dumps({"id": 7, "pred": "\\frac{1}{2}", "truth": "0.5", "timeout_s": 5, "deadline": time.monotonic() + 60}) + "\n")
    proc.stdin.write("not json\n")
    # left in the pipe by a killed executor: past its deadline, answered at once and not computed
    proc.stdin.write(json.dumps({"id": 8, "pred": "1", "truth": "1", "timeout_s": 5, "deadline": time.monotonic() - 1}) + "\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"id": 7, "eq": True}
    assert json.loads(proc.stdout.readline())["eq"] is False
    assert json.loads(proc.stdout.readline()) == {"id": 8, "eq": False, "error": "expired"}
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
