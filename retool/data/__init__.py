"""Data preparation: ReTool-SFT, DAPO-Math-17k and AIME sources -> the parquet layouts verl reads.

Library entry points (each returns a ``PrepareSummary``): ``prepare_sft``, ``prepare_rl``,
``prepare_eval``, and ``prepare_run`` for every output of a RetoolRun.
"""

from retool.data.eval import prepare_eval
from retool.data.report import PrepareSummary
from retool.data.rl import prepare_rl
from retool.data.run import prepare_run
from retool.data.schema import AGENT_NAME, ANSWER_INSTRUCTION, TOOL_NAME, code_interpreter_tool
from retool.data.sft import prepare_sft
from retool.data.sources import SourceError

__all__ = [
    "AGENT_NAME",
    "ANSWER_INSTRUCTION",
    "TOOL_NAME",
    "PrepareSummary",
    "SourceError",
    "code_interpreter_tool",
    "prepare_eval",
    "prepare_rl",
    "prepare_run",
    "prepare_sft",
]
