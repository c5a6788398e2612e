"""`concat`: positions concatenated to token embeddings instead of added, inside the model's width.

Token embeddings are projected onto the top `d - d_pos` right singular directions of the embedding
matrix; the position code (`d_pos` dims, sinusoidal or learned) lives in the orthogonal complement.
Token and position channels are then exactly orthogonal: concatenation in a rotated basis. The
projection acts on the embedding *output* (a forward hook), never on the weights, because GPT-2 and
SmolLM2 tie input and output embeddings; in BERT-like models token types are projected too, so the
orthogonality holds up to the embedding LayerNorm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..domains import Domain, at_least, one_of, option, positive
from .base import EmbeddingDerived, InputScheme, ModelFacts, check_positions, loaded, register_scheme, table_rows
from .sinusoidal import BASE, sinusoidal_code


CODES = ("sinusoidal", "learned")


@dataclass(frozen=True)
class ConcatOptions:
    d_pos: int = option(None, "dims given to positions, < hidden size (0 is NoPE); required",
                        Domain(int, low=0, below="hidden_size"))
    code: str = option("sinusoidal", "position code in the complement", one_of(*CODES))
    max_positions: int | None = option(None, "table length for code='learned'; default: the model's own",
                                       at_least(1, int))
    base: float = option(10_000.0, "wavelength base for code='sinusoidal'", BASE)
    scale: float | None = option(None, "code multiplier; default: position vectors as long as the model's own",
                                 positive())


class ConcatPositions(EmbeddingDerived):
    """Slot module: `forward(position_ids)` -> code @ position_basis^T; `project_tokens` for the hook."""

    def __init__(self, token_basis: torch.Tensor, position_basis: torch.Tensor, table: torch.Tensor | None,
                 base: float, scale: float, offset: int) -> None:
        super().__init__()
        self.register_buffer("token_basis", token_basis)  # (d, d - d_pos), saved: the split must not drift
        self.register_buffer("position_basis", position_basis)  # (d, d_pos)
        self.table = nn.Parameter(table) if table is not None else None
        self.base, self.scale, self.offset = base, scale, offset

    def code(self, positions: torch.Tensor) -> torch.Tensor:
        if self.table is not None:
            positions = table_rows(positions, "concat")
            check_positions(positions, self.table.shape[0], "concat")
            return F.embedding(positions, self.table).float()
        return sinusoidal_code(positions, self.position_basis.shape[1], self.base) * self.scale

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.code(position_ids - self.offset) @ self.position_basis.float().T
        return out.to(self.token_basis.dtype)

    @torch.no_grad()
    def rederive_from(self, embeddings: torch.Tensor) -> None:
        if not (loaded(self.token_basis) or loaded(self.position_basis)):
            token_basis, position_basis, _ = embedding_split(embeddings, self.position_basis.shape[1])
            self.token_basis.copy_(token_basis)  # in place: the buffers keep the device and dtype they were moved to
            self.position_basis.copy_(position_basis)
        if self.table is not None and not loaded(self.table):  # a fresh learned code, drawn as `Concat.module` does
            self.table.normal_(0.0, self.scale / 2**0.5)

    def project_tokens(self, x: torch.Tensor) -> torch.Tensor:
        basis = self.token_basis.float()
        return ((x.float() @ basis) @ basis.T).to(x.dtype)


def embedding_split(embeddings: torch.Tensor, d_pos: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Orthonormal token and position bases from the SVD of the (V, d) embedding matrix, and the share
    of the embeddings' energy the token basis keeps. With fewer tokens than dimensions (a task model's vocabulary of
    a few symbols) the SVD has only V directions: the rest of the space, where the embeddings have no energy, is
    added after them, so the position basis still has its `d_pos` dimensions."""
    _, singular, vh = torch.linalg.svd(embeddings.float(), full_matrices=False)
    if vh.shape[0] < vh.shape[1]:  # the complement of the V directions: the last rows of a full SVD of them
        vh = torch.cat([vh, torch.linalg.svd(vh, full_matrices=True).Vh[vh.shape[0]:]])
    keep = embeddings.shape[1] - d_pos
    energy = singular.pow(2)
    return vh[:keep].T.contiguous(), vh[keep:].T.contiguous(), float(energy[:keep].sum() / energy.sum())


class Concat(InputScheme):
    name = "concat"
    Options = ConcatOptions
    citation = "the add-vs-concatenate question; Ke et al. 2021 (TUPE) discuss the mixed terms it removes"
    test_settings = {"concat": {"d_pos": 16}, "concat-learned": {"d_pos": 16, "code": "learned"}}
    reads_weights = True  # the token embeddings' subspace, and the positions' scale

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = dict(options)
        if out["code"] == "learned":
            out["max_positions"] = out["max_positions"] or facts.max_positions
        if out["scale"] is None:
            # |code|^2 = d * rms^2 spread over d_pos dims
            out["scale"] = round(facts.position_rms * (facts.hidden_size / max(out["d_pos"], 1)) ** 0.5, 6)
        return out

    def fixed_table(self, options: dict[str, Any]) -> bool:
        return options.get("code") == "learned"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        d_pos = options["d_pos"]
        token_basis, position_basis, kept = embedding_split(facts.token_embeddings, d_pos)
        old = facts.position_table
        table = None
        if options["code"] == "learned":
            n = options["max_positions"]
            table = torch.randn(n, d_pos) * options["scale"]
            if old is not None:  # keep the part of the old table that already lives in the complement
                own = old[facts.position_offset:].float().cpu() @ position_basis.cpu()
                table[: min(n, own.shape[0])] = own[:n]
        # the sinusoidal code has RMS 1/sqrt(2) per dim
        module = ConcatPositions(token_basis, position_basis, table, options["base"], options["scale"] * 2**0.5,
                                 facts.position_offset)
        module.notes = {"token_energy_kept": round(kept, 6)}
        return module.to(facts.dtype)  # bases too: saved like weights, they give the code its output dtype


register_scheme(Concat())
