"""Remote code for a checkpoint whose positional encoding was swapped with hf-posenc.

`AutoModel*.from_pretrained(repo, trust_remote_code=True)` runs this file. Plain `from_pretrained`
would build the stock architecture and silently drop the patch (its new position weights come
back randomly initialised); this loads the stock class named in `config.architectures` through
hf-posenc's loader, which re-applies `config.posenc` and then loads the patch's weights.
It needs hf-posenc installed: `pip install hf-posenc`.
"""

from transformers import PreTrainedModel

from hf_posenc.loading import load_model


class PosEncModel(PreTrainedModel):
    """Entry point named in `config.auto_map`; returns the patched stock model, not an instance of this class."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, config, **kwargs):
        kwargs.pop("trust_remote_code", None)  # the stock class needs no remote code
        # The loader also drops config.auto_map, which names a file of the published repo, so a later
        # save_pretrained writes a folder that reloads anywhere.
        return load_model(pretrained_model_name_or_path, task="saved", config=config, **kwargs)
