"""What discovery reads when it cannot read the instance: the stock model of a config on the meta device
(`hf_posenc.view` decides when: a config alone, a reloaded patched model, an encoder-decoder config's stacks)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import transformers
from torch import nn

from ..errors import PosEncError


def meta_model(config: Any, model_class: type | None = None, encoder_decoder: bool = False) -> nn.Module:
    """The stock model of `config` on the meta device (no memory, no weights), built from a copy so the
    caller's config is left as it was.

    Args:
        config: a transformers config.
        model_class: the class to build; default the causal LM of its type, or with `encoder_decoder` its
            seq-to-seq (else speech seq-to-seq) model, whose stacks are read off an instance.
    """
    config = copy.deepcopy(config)
    if encoder_decoder:
        for auto in (transformers.AutoModelForSeq2SeqLM, transformers.AutoModelForSpeechSeq2Seq):
            try:
                with torch.device("meta"):
                    return auto.from_config(config)
            except ValueError:  # not this Auto class's type
                continue
        raise PosEncError(f"unsupported architecture {config.model_type!r}: no encoder-decoder class to read its "
                          "stacks from")
    try:
        with torch.device("meta"):
            if model_class:
                return model_class._from_config(config)
            return transformers.AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:
        raise PosEncError(f"unsupported architecture {config.model_type!r}: no causal LM class to read its "
                          f"structure from ({str(exc).splitlines()[0]})") from exc
