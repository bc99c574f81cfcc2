"""The code-interpreter tool's pure parts, usable without verl.

``config`` holds the one tool schema and the tool-config document (SFT data, RL prompts, the
rollout and ``retool eval`` all read it); ``interpreter`` decides what code runs and what text
the model reads back. The verl tool class that calls the sandbox is
:mod:`retool.recipe.verl_plugins.tool`.
"""
