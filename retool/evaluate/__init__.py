"""Tool-integrated evaluation of any model served behind an OpenAI-compatible chat API.

The loop is the one training uses: the model answers with ``code_interpreter`` tool calls,
our sandbox runs the code, the output goes back into the conversation as a ``tool`` message,
and this repeats up to a number of assistant turns; the final answer is scored with the
training reward. ``retool eval`` is the command line; ``evaluate`` the library entry point.
"""
