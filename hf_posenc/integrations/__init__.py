"""Integrations with tools people already use, each an optional extra.

- `hf_posenc.integrations.lm_eval` (`pip install hf-posenc[lm-eval]`): the `hf-posenc` model type of
  lm-evaluation-harness, which patches on the fly, and offline task configs (`TASKS`).
- TRL (`pip install hf-posenc[trl]`) needs no code here: `SFTTrainer` takes a patched model as it
  is; docs/with_other_tools.md has the recipe.

Nothing here is imported by `import hf_posenc`, so the extras stay optional.
"""
