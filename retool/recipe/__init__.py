"""The ReTool recipe: data preparation, the code-interpreter tool and the reward that verl runs.

Submodules are imported on demand (``retool.recipe.reward``, ``retool.recipe.tool``, ...): verl loads
the reward file by path and the tool class by dotted name, and neither should pay for the others.
"""
