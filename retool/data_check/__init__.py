"""``retool data check``: verify SFT trajectories against the sandbox before training on them.

SFT teaches the model what the interpreter answers to its code. If a recorded output is not
what our sandbox (through the same tool as RL) prints for that code, SFT and RL disagree about
the world; if the final answer is wrong, SFT teaches a wrong solution. The check re-executes
every code block, compares outputs, and scores the final answers with the training reward.
"""
