"""The ReTool reward: +1 for a correct final answer, -1 otherwise.

``answer`` extracts and normalises the final answer (linear-time string functions),
``equivalence`` decides exact, numeric and symbolic equality, ``symbolic`` / ``symbolic_worker``
run the symbolic checks in worker processes with a hard deadline, and ``score`` is
``compute_score``, the function verl calls (through :mod:`retool.recipe.verl_plugins.reward`).
"""
