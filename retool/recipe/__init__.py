"""The ReTool training recipe, one package per concern.

- :mod:`retool.recipe.reward`: final-answer extraction, equivalence and the +1/-1 score (pure
  string functions; symbolic checks in killable worker processes).
- :mod:`retool.recipe.tool`: the code-interpreter tool's pure parts: its schema and config, what
  code runs, what text the model reads back.
- :mod:`retool.recipe.render`: the stage renderers: a RetoolRun spec -> the exact command, files
  and Hydra overrides each stage runs (pure; ``retool render`` prints them).
- :mod:`retool.recipe.verl_plugins`: the only code verl imports by path inside its own processes
  (dataset class, reward entry file, tool class), and the one definition of those paths.
- :mod:`retool.recipe.metrics`: mean@k / maj@k / best@k / pass@k exactly as verl names and
  computes them, without importing verl.

What a stage pod needs around verl (its context, the PVC layout, the multi-node launcher) is in
:mod:`retool.runtime`; checkpoint discovery and copies are in :mod:`retool.storage`.
"""
