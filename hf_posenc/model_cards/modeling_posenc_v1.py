"""Remote code of a model whose positional encoding was swapped with hf-posenc.

`AutoConfig` / `AutoModel*.from_pretrained(folder_or_repo, trust_remote_code=True)` run this file.
The folder's config.json names the stock architecture in `posenc.model_type` (or keeps its own
`model_type` when transformers can express the scheme), and hf-posenc loads that stock class,
re-applies the scheme in `config.posenc` and loads the scheme's weights: the model you get is the
stock transformers class, patched. Needs hf-posenc installed: `pip install hf-posenc`.

Inference engines never run this file's `from_pretrained`: they read `architectures`, which names a class
only hf-posenc's engine plug-ins provide (vLLM: `hf_posenc.serving`), and an engine without the plug-in
refuses the folder by that name.
"""

import transformers
from transformers import PretrainedConfig, PreTrainedModel

from hf_posenc.saving import from_pretrained, load_config


class PosEncAutoConfig(PretrainedConfig):
    """Entry point of AutoConfig: returns the stock config (e.g. LlamaConfig) with `posenc`."""

    model_type = "hf_posenc"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        return load_config(pretrained_model_name_or_path, **kwargs)


class PosEncModel(PreTrainedModel):
    """Entry point of one Auto class: returns the patched stock model, not an instance of this class."""

    auto_class = "AutoModel"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        return from_pretrained(pretrained_model_name_or_path, getattr(transformers, cls.auto_class), **kwargs)

    @classmethod
    def _can_set_attn_implementation(cls):
        """False: vLLM's Transformers backend serves a remote-code class that takes its attention, building it from
        config -- without the patch. Asked here, it refuses the folder by its architecture's name instead."""
        return False


class PosEncForCausalLM(PosEncModel):
    auto_class = "AutoModelForCausalLM"


class PosEncForMaskedLM(PosEncModel):
    auto_class = "AutoModelForMaskedLM"


class PosEncForSequenceClassification(PosEncModel):
    auto_class = "AutoModelForSequenceClassification"


class PosEncForTokenClassification(PosEncModel):
    auto_class = "AutoModelForTokenClassification"


class PosEncForQuestionAnswering(PosEncModel):
    auto_class = "AutoModelForQuestionAnswering"


class PosEncForSeq2SeqLM(PosEncModel):
    auto_class = "AutoModelForSeq2SeqLM"


class PosEncForSpeechSeq2Seq(PosEncModel):
    auto_class = "AutoModelForSpeechSeq2Seq"
