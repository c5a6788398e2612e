"""The names saved files import from `hf_posenc.saving`, the writer's module before it was `writing`: folders
written before the reader moved to `loading` run remote code that does `from hf_posenc.saving import
from_pretrained, load_config` (`writing.LEGACY_REMOTE_CODE`), and a model pickled whole (`torch.save`) before then
holds `hf_posenc.saving.save_pretrained`. The package itself imports `loading` and `writing`; nothing imports this."""

from .loading import from_pretrained
from .loading import read_config as load_config
from .writing import save_pretrained

__all__ = ["from_pretrained", "load_config", "save_pretrained"]
