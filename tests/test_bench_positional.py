"""The peers of benchmarks/bench_positional.py compute PositionalAttention's function (float64, tiny grids).

The benchmark checks every peer before it times it, in float32; these tests pin the peers'
formulas down exactly, on every encoding, both head widths, with and without gradients, so a
wrong peer cannot hide behind float32 noise.  Flex runs its eager reference here (compiling
takes tens of seconds per shape; the compiled kernel is checked by the benchmark itself).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch

from benchmarks import bench_positional as bp
from structconv.nn import LearnedHeads, PositionalAttention

D64 = torch.float64
SIDE, WIDTH, HEADS, BATCH, SMALL = 4, 8, 2, 3, 3


def _layer(encoding: str, head_dim: int | None, dropout: float = 0.0) -> PositionalAttention:
    torch.manual_seed(7)
    layer = PositionalAttention(
        (SIDE, SIDE),
        WIDTH,
        HEADS,
        encoding=LearnedHeads(positional_dim=6) if encoding == "learned" else encoding,
        head_dim=head_dim,
        threshold=None,  # the exact softmax: the comparison is then to float64 rounding
        attention_dropout=dropout,
    ).to(D64)
    with torch.no_grad():  # parameters away from their initial symmetry, widths on a useful scale
        if encoding == "quadratic":
            layer.encoding.set_alpha(torch.tensor([0.3, 1.7], dtype=D64))
        if encoding == "gaussian":
            layer.encoding.inv_sqrt_cov.add_(0.4 * torch.randn_like(layer.encoding.inv_sqrt_cov))
        if layer.bias is not None:
            layer.bias.normal_()
    return layer


def _peers() -> dict[str, Callable[[PositionalAttention, torch.Tensor], torch.Tensor]]:
    peers: dict[str, Callable[[PositionalAttention, torch.Tensor], torch.Tensor]] = {
        "paper dense": bp.paper_dense,
        "sdpa": bp.sdpa_masked,
        "sdpa qk": bp.sdpa_qk,
        "flex": lambda layer, x: bp.flex_peer(layer, x, compiled=False),
    }
    natten, _ = bp.load_natten()
    if natten is not None:  # checked only where NATTEN is found (see bench_positional.load_natten)
        peers["natten"] = lambda layer, x: bp.natten_peer(natten.module, layer, x, compiled=False)
    return peers


FLOAT32_ONLY = ("natten",)  # NATTEN refuses float64: run in float32 against the float64 layer


PEERS = _peers()
BACKWARD = ("paper dense", "sdpa", "sdpa qk")  # Flex (and NATTEN through it) has no CPU backward


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-10) -> None:
    got, want = got.detach().to(want.dtype), want.detach()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("encoding", bp.ENCODINGS)
@pytest.mark.parametrize("head_dim", [None, SMALL])
@pytest.mark.parametrize("peer", sorted(PEERS))
def test_peer_output_equals_the_layer(encoding: str, head_dim: int | None, peer: str) -> None:
    layer = _layer(encoding, head_dim)
    x = torch.randn(BATCH, SIDE * SIDE, WIDTH, dtype=D64)
    with torch.no_grad(), warnings.catch_warnings():
        # Flex's "called without torch.compile" notice, and its deprecation of the argument NATTEN passes
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if peer in FLOAT32_ONLY:
            _close(PEERS[peer](copy.deepcopy(layer).float(), x.float()), layer(x), tol=1e-5)
        else:
            _close(PEERS[peer](layer, x), layer(x))


@pytest.mark.parametrize("encoding", bp.ENCODINGS)
@pytest.mark.parametrize("head_dim", [None, SMALL])
@pytest.mark.parametrize("peer", BACKWARD)
def test_peer_gradients_equal_the_layer(encoding: str, head_dim: int | None, peer: str) -> None:
    layer = _layer(encoding, head_dim)
    x = torch.randn(BATCH, SIDE * SIDE, WIDTH, dtype=D64, requires_grad=True)
    leaves = [x, *layer.parameters()]
    want = torch.autograd.grad(layer(x).sum(), leaves)
    y = PEERS[peer](layer, x)
    _close(y, layer(x))
    got = torch.autograd.grad(y.sum(), leaves)
    for g, w in zip(got, want, strict=True):
        _close(g, w)


@pytest.mark.parametrize("head_dim", [None, SMALL])
def test_paper_dense_draws_the_layers_shared_dropout_mask(head_dim: int | None) -> None:
    layer = _layer("quadratic", head_dim, dropout=0.3).train()
    x = torch.randn(BATCH, SIDE * SIDE, WIDTH, dtype=D64)
    torch.manual_seed(3)
    want = layer(x)
    torch.manual_seed(3)
    _close(bp.paper_dense(layer, x, key_major_mask=True), want)
    torch.manual_seed(3)
    dropped = bp.paper_dense(layer, x)  # the timed draw: another mask, still one for the whole batch
    assert not torch.allclose(dropped, want)
    layer.eval()
    _close(bp.paper_dense(layer, x), layer(x))


def test_positional_queries_and_keys_give_the_scores_up_to_a_term_of_the_query() -> None:
    for encoding in bp.ENCODINGS:
        layer = _layer(encoding, None)
        like = torch.zeros((), dtype=D64)
        with torch.no_grad():
            q, k = bp.positional_qk(layer, like)
            scores = bp.position_scores(layer, like)
        diff = q @ k.transpose(1, 2) - scores
        spread = diff - diff[..., :1]  # zero where the difference is constant along the keys
        assert float(spread.abs().max()) <= 1e-10 * float(scores.abs().max()), encoding


def test_layer_flops_counts_a_multiply_add_as_two() -> None:
    flops = bp.layer_flops("quadratic", 2, 1, 3, 1, None)  # N = M = 4, W = E = 3, O = 9
    assert flops["aggregation"] == 2 * 4 * 4 * 3
    assert flops["maps"] == 2 * 4 * 3 * 3
    assert flops["scores"] == 6 * 9
    assert flops["total"] == sum(v for k, v in flops.items() if k != "total")
