"""Preflight: a RetoolRun's data, tokenizer, tool, reward and sandbox through verl's own runtime code,
on CPU, before any accelerator is requested.

Composing the rendered overrides against verl's Hydra config (the render tests) proves a command
starts; it does not prove the stages survive their first minutes. The preflight runs what they run
then: verl's multi-turn SFT dataset on the SFT data, ``create_rl_dataset`` on the RL and eval
prompts, the tool registry on the rendered tool config, the reward as verl loads it, and one
scripted multi-turn rollout per data source through verl's tool agent loop and reward loop, joined
to the trainer's batch and validated by ``RayPPOTrainer``'s own code.

Modules: ``plan`` (what to check), ``runner`` and ``steps`` (in which order, verl 0.6.1),
``line09`` (the same checks on verl 0.9.1), ``flow`` (the steps both lines share, given the line's
verl pieces), the checks (``verl_config``, ``sft``, ``data``, ``tools``, ``reward``,
``scripted``/``agent``/``agent09``/``episodes``/``rollout``, ``batch``/``trainer``/``trainer09``),
``checks`` (names and exit codes), ``report`` and ``tracking`` (the verdict), ``command`` (the
stage's rendered command), ``entry``/``__main__`` (the program).
Nothing here is imported by the renderers except ``command``, which needs no verl.
"""
