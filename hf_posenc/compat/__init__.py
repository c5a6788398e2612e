"""The only package that knows which transformers version is installed.

Everything that reaches into transformers internals goes through here, one module per job: `versions` (what this
hf-posenc was tested with; an older transformers refused on import, before the others import its internals),
`rope` (rotary classes, RoPE init functions, rope_parameters), `attention` (attention and mask interfaces),
`cache` (cache layers, and the record of key positions a cache carries), `loading` (GGUF, checkpoint keys, the load
report), `wrappers` (what runs inside peft's wrappers, an encoder-decoder's encoder), `compile` (what torch.compile
must see of a patch). Callers use `compat.<name>`.
"""

from __future__ import annotations

from .versions import MIN_TRANSFORMERS, TESTED_RANGES, TESTED_THROUGH, check_transformers, within

from .attention import (attn_implementation, base_attention_function, base_mask_function, known_attention,
                        register_attention)
from .cache import (CACHE_NAMES, RECORD_ATTR, ROW_OPS, FollowRows, cache_in, cache_kwarg, cache_length, cache_out,
                    record_positions, recorded_positions, static_length, static_record, static_slots)
from .compile import guard_hooks
from .loading import (LOAD_LOGGER, LOAD_REPORTS, checkpoint_key_renamer, dense_gguf_kwargs, load_report_held,
                      log_load_report, saves_here, without_handoff_kwargs)
from .rope import (ROPE_INIT_FUNCTIONS, ROPE_KEYS, ROTARY_ATTRIBUTES, rederive_rotary, rope_parameters, rotary_config,
                   rotary_module_class, text_config, with_head_dim)
from .wrappers import encoder_module, get_peft_model, running_module

__all__ = ["CACHE_NAMES", "FollowRows", "LOAD_LOGGER", "LOAD_REPORTS", "MIN_TRANSFORMERS", "RECORD_ATTR",
           "ROPE_INIT_FUNCTIONS", "ROPE_KEYS", "ROTARY_ATTRIBUTES", "ROW_OPS", "TESTED_RANGES", "TESTED_THROUGH",
           "attn_implementation", "base_attention_function", "base_mask_function", "cache_in", "cache_kwarg",
           "cache_length", "cache_out", "check_transformers", "checkpoint_key_renamer", "dense_gguf_kwargs",
           "encoder_module", "get_peft_model", "guard_hooks", "known_attention", "load_report_held",
           "log_load_report", "record_positions", "recorded_positions", "rederive_rotary", "register_attention",
           "rope_parameters", "rotary_config", "rotary_module_class", "running_module", "saves_here", "static_length",
           "static_record", "static_slots", "text_config", "with_head_dim", "within", "without_handoff_kwargs"]
