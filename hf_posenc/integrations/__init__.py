"""Integrations with tools people already use, each an optional extra.

- `hf_posenc.integrations.lm_eval` (`pip install hf-posenc[lm-eval]`): the `hf-posenc` model type of
  lm-evaluation-harness, which patches on the fly, and offline task configs (`LM_EVAL_TASK_DIR`);
  `hf_posenc.integrations.lm_eval_index` checks task names and their data against a cached copy of lm-eval's index.
- `hf_posenc.integrations.lora.modules_to_save` names a patch's own weights for peft's LoRA, e.g.
  through TRL's `SFTTrainer(peft_config=...)` (`pip install hf-posenc[trl]`), which otherwise takes a
  patched model as it is; docs/with_other_tools.md has the recipe.

Nothing here is imported by `import hf_posenc`, so the extras stay optional.
"""
