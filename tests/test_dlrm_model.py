"""DLRM model: shapes, the dot interaction, embedding sizes, hashed indices."""

from __future__ import annotations

import pytest
import torch

from models.dlrm.model import DotInteraction, Dlrm, build_model, embedding_table_bytes, interaction_output_size

# NVIDIA's criteo_f15.yaml cardinalities (Criteo 1TB, frequency threshold 15).
CRITEO_F15 = [7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667, 104,
              4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35]


def _inputs(batch: int, n_num: int, cards: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    numerical = torch.randn(batch, n_num, generator=generator)
    categorical = torch.stack([torch.randint(0, c, (batch,), generator=generator) for c in cards], dim=1)
    return numerical, categorical


def test_default_architecture_is_nvidias() -> None:
    cards = [10, 20, 30]
    model = Dlrm(13, cards)
    bottom = [m.out_features for m in model.bottom_mlp if isinstance(m, torch.nn.Linear)]
    top = [m.out_features for m in model.top_mlp if isinstance(m, torch.nn.Linear)]
    assert bottom == [512, 256, 128] and top == [1024, 1024, 512, 256, 1]
    assert [model.embeddings.table(i).shape for i in range(3)] == [torch.Size([c, 128]) for c in cards]
    assert model.embeddings.weight.shape == (sum(cards), 128)  # one joint table
    # 128 + 4 * 3 / 2 = 134 interaction columns, zero-padded to 136 as NVIDIA pads (a multiple of 8)
    assert model.top_mlp[0].in_features == 136 and model.interaction.padding == 2
    assert not isinstance(model.top_mlp[-1], torch.nn.ReLU)  # the output is a raw logit


def test_output_is_one_logit_per_row() -> None:
    cards = [7, 5, 300, 2]
    model = Dlrm(6, cards, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(32, 16, 1))
    numerical, categorical = _inputs(33, 6, cards)
    logits = model(numerical, categorical)
    assert logits.shape == (33,) and logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.mark.parametrize(("n_cat", "dim", "expected"), [(26, 128, 128 + 27 * 26 // 2), (1, 8, 9), (3, 4, 4 + 6)])
def test_interaction_size_formula(n_cat: int, dim: int, expected: int) -> None:
    assert interaction_output_size(n_cat, dim) == expected
    interaction = DotInteraction(n_cat, dim)
    out = interaction(torch.randn(5, dim), [torch.randn(5, dim) for _ in range(n_cat)])
    assert out.shape == (5, expected) == (5, interaction.output_size)
    padded = DotInteraction(n_cat, dim, padded=True)
    out = padded(torch.randn(5, dim), [torch.randn(5, dim) for _ in range(n_cat)])
    assert out.shape[1] % 8 == 0 and expected <= out.shape[1] < expected + 8
    assert interaction_output_size(n_cat, dim, padded=True) == out.shape[1]
    assert torch.equal(out[:, expected:], torch.zeros(5, out.shape[1] - expected))


def test_interaction_holds_bottom_output_then_pairwise_dots_without_diagonal() -> None:
    bottom = torch.tensor([[1.0, 2.0]])
    e0, e1 = torch.tensor([[3.0, 4.0]]), torch.tensor([[5.0, 6.0]])
    out = DotInteraction(2, 2)(bottom, [e0, e1])
    # strict lower triangle of [bottom, e0, e1] row by row: (e0,bottom), (e1,bottom), (e1,e0)
    assert out.tolist() == [[1.0, 2.0, 1 * 3 + 2 * 4, 1 * 5 + 2 * 6, 3 * 5 + 4 * 6]]


def test_embedding_size_bytes() -> None:
    assert embedding_table_bytes(CRITEO_F15, 128) == sum(CRITEO_F15) * 128 * 4
    # ~16.7 GB: why training logs the size before it allocates the tables
    assert embedding_table_bytes(CRITEO_F15, 128) == 16_747_078_656
    assert embedding_table_bytes([100, 5], 16, max_table_size=10) == (10 + 5) * 16 * 4
    model = Dlrm(3, [100, 5, 40], bottom_mlp_sizes=(8, 16), top_mlp_sizes=(4, 1))
    assert model.embedding_bytes() == embedding_table_bytes([100, 5, 40], 16) == 145 * 16 * 4


def test_hash_indices_wraps_ids_into_capped_tables() -> None:
    cards = [1000, 50]
    model = Dlrm(2, cards, bottom_mlp_sizes=(4,), top_mlp_sizes=(1,), max_table_size=64, hash_indices=True)
    assert model.table_sizes == [64, 50]
    numerical, categorical = _inputs(20, 2, cards)
    assert (categorical[:, 0] >= 64).any()  # some ids really are beyond the capped table
    wrapped = categorical % torch.tensor([64, 50])
    assert torch.equal(model(numerical, categorical), model(numerical, wrapped))


def test_capped_tables_without_hashing_are_refused() -> None:
    with pytest.raises(ValueError, match="hash_indices"):
        Dlrm(2, [1000, 50], bottom_mlp_sizes=(4,), top_mlp_sizes=(1,), max_table_size=64)


def test_build_model_from_hparams_roundtrip() -> None:
    model = Dlrm(3, [9, 4], bottom_mlp_sizes=(8, 4), top_mlp_sizes=(8, 1), sparse_embeddings=False)
    rebuilt = build_model(model.hparams)
    rebuilt.load_state_dict(model.state_dict())
    numerical, categorical = _inputs(7, 3, [9, 4])
    assert torch.equal(model(numerical, categorical), rebuilt(numerical, categorical))
    assert not rebuilt.embeddings.fused and not rebuilt.sparse_parameters()


def test_sparse_embeddings_update_only_the_looked_up_rows() -> None:
    model = Dlrm(2, [1000, 30], bottom_mlp_sizes=(4,), top_mlp_sizes=(1,))
    numerical, categorical = _inputs(8, 2, [1000, 30])
    before = model.embeddings.weight.detach().clone()
    model(numerical, categorical).sum().backward()
    assert model.embeddings.weight.grad is None  # no gradient tensor of the (possibly GB-sized) table
    model.apply_sparse_update(lr=0.5)
    changed = (model.embeddings.weight != before).any(dim=1).nonzero().flatten()
    looked_up = torch.unique(torch.cat([categorical[:, 0], categorical[:, 1] + 1000]))
    assert set(changed.tolist()) <= set(looked_up.tolist()) and changed.numel() > 0
    model.apply_sparse_update(lr=0.5)  # nothing pending: a second call changes nothing
    assert torch.equal(model.embeddings.weight[changed], model.embeddings.weight[changed])
