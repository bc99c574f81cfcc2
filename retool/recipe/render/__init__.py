"""Stage renderers: a RetoolRun spec -> the exact command each stage runs.

``stages.render_stage`` is the entry; ``command`` is the ``StageCommand`` value every renderer
returns; ``common``, ``sft`` (prepare, sft, merge) and ``ppo`` (rl, eval) build it; ``profiles``
holds the engine settings keyed by model size and accelerator; ``ascend`` the whole Ascend
difference. Everything here is pure: no environment, no filesystem, no verl import.
"""
