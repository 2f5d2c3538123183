"""PositionalAttention's encodings as modules: a seed gives the recorded numerics, options, representation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from structconv import nn as snn
from structconv.experiments.cifar.models import build_model
from structconv.nn import ContentHeads, GaussianHeads, LearnedHeads, PositionalAttention, QuadraticHeads

D64 = torch.float64

#: The layer's configurations before its encodings were modules, as they are written now.
CONFIGS: dict[str, dict[str, Any]] = {
    "quadratic": {},
    "quadratic-spread": {"encoding": QuadraticHeads(width="spread", width_noise=0.1, alpha=0.5, centre_var=4.0)},
    "gaussian": {"encoding": "gaussian"},
    "gaussian-noise": {"encoding": GaussianHeads(width_noise=0.1, alpha=0.7)},
    "learned": {"encoding": "learned"},
    "learned-dim": {"encoding": LearnedHeads(positional_dim=6)},
    "learned-relative": {"encoding": LearnedHeads(relative_terms=True), "content": ContentHeads()},
    "learned-content": {"encoding": "learned", "content": ContentHeads(key_dim=3, bias=True)},
    "quadratic-content": {"content": ContentHeads(), "head_dim": 3},
    "gaussian-content-bias": {"encoding": "gaussian", "content": ContentHeads(bias=True)},
}

#: Recorded from the layer before the change, ``torch.manual_seed(0)`` then
#: ``PositionalAttention((3, 4), 4, 2, **old_options)``: per entry of its state dict (under the
#: flat names of then) the sum and the sum weighted by 1, 2, ... of the flattened values, and the
#: same of the float64 output on ``torch.randn(2, 12, 4)`` drawn from ``manual_seed(1)`` (``y``).
#: The old options: {}, width="spread" width_noise=0.1 alpha=0.5 centre_var=4.0, encoding="gaussian",
#: encoding="gaussian" width_noise=0.1 alpha=0.7, encoding="learned", encoding="learned"
#: positional_dim=6, encoding="learned" content=True, encoding="learned" content=True
#: relative_terms=False content_bias=True key_dim=3, content=True head_dim=3, encoding="gaussian"
#: content=True content_bias=True.
RECORDED: dict[str, dict[str, tuple[float, float]]] = {
    "quadratic": {
        "theta": (-0.9619058221578598, -12.284569449722767),
        "bias": (-0.4329621847718954, -1.4849243517965078),
        "centres": (-0.5130637884140015, -4.678931951522827),
        "log_alpha": (0.0, 0.0),
        "y": (-25.922884338347302, -1363.7639767779588),
    },
    "quadratic-spread": {
        "theta": (-1.2807021047919989, -22.05867808125913),
        "bias": (-0.0073670148849487305, 0.8783936649560928),
        "centres": (-0.7255818843841553, -6.61700963973999),
        "spread": (1.7516881823539734, 2.611828625202179),
        "y": (5.066879963551826, 486.9248559853278),
    },
    "gaussian": {
        "theta": (-0.5305757410824299, 5.997748037800193),
        "bias": (-0.635912150144577, -1.9480295479297638),
        "centres": (-0.5130637884140015, -4.678931951522827),
        "inv_sqrt_cov": (5.656854152679443, 25.455843687057495),
        "y": (-15.112891784641835, -1002.8551746084825),
    },
    "gaussian-noise": {
        "theta": (-0.5305757410824299, 5.997748037800193),
        "bias": (-0.635912150144577, -1.9480295479297638),
        "centres": (-0.5130637884140015, -4.678931951522827),
        "inv_sqrt_cov": (4.4549693912267685, 20.492279913276434),
        "y": (-14.338985376729553, -999.3496898037174),
    },
    "learned": {
        "theta": (0.2784521905705333, 3.306078721769154),
        "bias": (0.23495464026927948, 0.8211473822593689),
        "weight": (1.2500059120357037, 5.768229089677334),
        "tables.0": (-2.7271367013454437, -18.1018043756485),
        "tables.1": (-0.1719064563512802, 17.49953293800354),
        "y": (3.3481323988912717, 129.01243482543757),
    },
    "learned-dim": {
        "theta": (-0.8419672409072518, -27.630776436068118),
        "bias": (0.17695442587137222, -0.4410282373428345),
        "weight": (0.3816799484193325, -4.588344298303127),
        "tables.0": (-3.968993365764618, -34.27647739648819),
        "tables.1": (-4.571714289486408, -69.00867898017168),
        "y": (-0.30508929346663294, -27.48401014234983),
    },
    "learned-relative": {
        "theta": (-1.2261844603344798, -25.508246103301644),
        "bias": (-0.4130966365337372, -0.6265660300850868),
        "rel_key": (2.345576375722885, 22.229405760765076),
        "u": (0.0, 0.0),
        "v": (0.0, 0.0),
        "key": (1.4530303478240967, 7.820601940155029),
        "query": (-0.3841665983200073, -4.399002492427826),
        "tables.0": (-2.7271367013454437, -18.1018043756485),
        "tables.1": (-0.1719064563512802, 17.49953293800354),
        "y": (-11.850282633252606, -461.1678572507147),
    },
    "learned-content": {
        "theta": (-0.13770290231332183, 9.73782912734896),
        "bias": (-1.0759401470422745, -2.9038254469633102),
        "weight": (1.2500059120357037, 5.768229089677334),
        "key": (0.8359087705612183, 18.162773311138153),
        "query": (-0.24438154697418213, -2.184748113155365),
        "key_bias": (-1.1999711990356445, -2.8538888096809387),
        "query_bias": (0.16234761476516724, 0.47394484281539917),
        "tables.0": (-2.7271367013454437, -18.1018043756485),
        "tables.1": (-0.1719064563512802, 17.49953293800354),
        "y": (-23.086655134401724, -993.9891379666028),
    },
    "quadratic-content": {
        "value": (-0.5257780458778143, -1.337658654898405),
        "out": (1.4932165630161762, -3.1458150781691074),
        "bias": (0.2713022530078888, 0.9481793344020844),
        "centres": (-0.5130637884140015, -4.678931951522827),
        "log_alpha": (0.0, 0.0),
        "key": (-0.348824679851532, 4.758255064487457),
        "query": (-1.0115156173706055, -5.947011113166809),
        "y": (7.282925713626021, 234.5761601858449),
    },
    "gaussian-content-bias": {
        "theta": (0.7558008162304759, -1.926912414841354),
        "bias": (-0.22885053604841232, -1.317202776670456),
        "centres": (-0.5130637884140015, -4.678931951522827),
        "inv_sqrt_cov": (5.656854152679443, 25.455843687057495),
        "key": (-1.0115156173706055, -5.947011113166809),
        "query": (0.2611681818962097, 10.250417828559875),
        "key_bias": (-0.899315595626831, -2.754929840564728),
        "query_bias": (0.28219401836395264, 0.3440823554992676),
        "y": (9.289629091147567, 738.1105495258494),
    },
}

#: The same for the CIFAR models ``build_model(name, width=8, depth=2, ffn=8, heads=2, dropout=0.0,
#: attention_dropout=0.0)``: the float64 logits in eval mode on ``torch.randn(2, 3, 32, 32)`` from
#: ``manual_seed(1)``, and every entry of the state dict concatenated in the order of then.
RECORDED_MODELS: dict[str, dict[str, list[float]]] = {
    "sa-quadratic": {"y": [1.388793873326968, 12.99223768111606], "state": [47.575187141948845, 27423.511620649195]},
    "sa-gaussian": {"y": [-2.3491090449624266, -39.0698874004658], "state": [50.551847797847586, 28583.904022756702]},
    "sa-learned": {"y": [2.2168328413044467, 25.547983688763008], "state": [96.85324637033045, 124498.06755161833]},
    "sa-learned-content": {
        "y": [-0.52635801878257, -5.406913598549108],
        "state": [32.19514734641416, 41648.65146514791],
    },
}

#: Where each flat entry of before is now (written out here, independently of the layer's own table).
OLD_TO_NEW = {
    "theta": "weight",
    "centres": "encoding.centres",
    "log_alpha": "encoding.log_alpha",
    "spread": "encoding.spread",
    "inv_sqrt_cov": "encoding.inv_sqrt_cov",
    "weight": "encoding.weight",
    "tables.0": "encoding.tables.0",
    "tables.1": "encoding.tables.1",
    "rel_key": "encoding.rel_key",
    "u": "encoding.u",
    "v": "encoding.v",
    "key": "content.key",
    "query": "content.query",
    "key_bias": "content.key_bias",
    "query_bias": "content.query_bias",
}


def _digest(t: torch.Tensor) -> tuple[float, float]:
    flat = t.detach().double().flatten()
    return float(flat.sum()), float((flat * torch.arange(1, flat.numel() + 1, dtype=D64)).sum())


def _close(got: tuple[float, ...] | list[float], want: tuple[float, ...] | list[float]) -> bool:
    return all(abs(g - w) <= 1e-9 * max(1.0, abs(w)) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_seed_gives_the_parameters_and_outputs_of_before(name: str) -> None:
    torch.manual_seed(0)
    layer = PositionalAttention((3, 4), 4, 2, **CONFIGS[name])
    recorded = {OLD_TO_NEW.get(k, k): v for k, v in RECORDED[name].items()}
    state = layer.state_dict()
    assert set(state) | {"y"} == set(recorded)
    for key, value in state.items():
        assert _close(_digest(value), recorded[key]), key
    x = torch.randn(2, 12, 4, generator=torch.Generator().manual_seed(1), dtype=D64)
    with torch.no_grad():
        assert _close(_digest(layer.double()(x)), recorded["y"])


@pytest.mark.parametrize("name", sorted(RECORDED_MODELS))
def test_the_cifar_models_give_the_parameters_and_outputs_of_before(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, width=8, depth=2, ffn=8, heads=2, dropout=0.0, attention_dropout=0.0)
    # The order of then: a layer's content terms (its own parameters) came before the learned tables.
    state = model.state_dict()
    flat = torch.cat([state[k].flatten().double() for k in _old_order(list(state))])
    assert _close(_digest(flat), RECORDED_MODELS[name]["state"])
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=D64)
    with torch.no_grad():
        assert _close(_digest(model.double().eval()(x)), RECORDED_MODELS[name]["y"])


def _old_order(keys: list[str]) -> list[str]:
    """``keys`` in the state-dict order of before: each layer's tables after its other entries."""
    order = list(keys)
    for prefix in {k.partition("encoding.tables.")[0] for k in keys if "encoding.tables." in k}:
        tables = [k for k in order if k.startswith(prefix + "encoding.tables.")]
        rest = [k for k in order if k not in tables]
        last = max(i for i, k in enumerate(rest) if k.startswith(prefix))
        order = rest[: last + 1] + tables + rest[last + 1 :]
    return order


# --- the encodings -------------------------------------------------------------------------------
def test_an_encoding_is_a_template_left_unbound_and_gives_each_layer_its_own_parameters() -> None:
    spec = QuadraticHeads(alpha=0.5, width="spread", width_noise=0.1)
    assert list(spec.parameters()) == [] and spec.grid == ()
    a = PositionalAttention((3, 4), 4, 2, encoding=spec)
    b = PositionalAttention((5, 5), 4, 3, encoding=spec)
    assert list(spec.parameters()) == [] and spec.grid == ()
    assert a.encoding is not spec and type(a.encoding) is QuadraticHeads and a.encoding.options() == spec.options()
    assert a.encoding.centres.shape == (2, 2) and b.encoding.centres.shape == (3, 2)
    assert not {id(p) for p in a.parameters()} & {id(p) for p in b.parameters()}
    bound = spec.bind((2, 2, 2), num_heads=4, embed_dim=6, boundary="periodic")
    assert bound.grid == (2, 2, 2) and bound.boundary == "periodic" and bound.spread.shape == (4,)
    with pytest.raises(ValueError, match=r"QuadraticHeads is not bound to a layer"):
        spec.mechanism()
    with pytest.raises(ValueError, match=r"ContentHeads is not bound to a layer"):
        ContentHeads().mechanism()


def test_binding_resolves_the_defaults_that_depend_on_the_layer() -> None:
    layer = PositionalAttention((3, 4), 6, 2, encoding=LearnedHeads(), content=ContentHeads())
    assert layer.encoding.options() == {"positional_dim": 6, "relative_terms": False}
    assert layer.content is not None and layer.content.options() == {"key_dim": 3, "bias": False}
    assert [tuple(t.shape) for t in layer.encoding.tables] == [(5, 3), (7, 3)]
    odd = PositionalAttention((3, 4), 6, 4, encoding=LearnedHeads(positional_dim=5), content=ContentHeads())
    assert [tuple(t.shape) for t in odd.encoding.tables] == [(5, 3), (7, 2)]
    assert odd.content is not None and odd.content.key_dim == 1  # embed_dim // num_heads, at least 1
    assert [
        type(PositionalAttention((3, 3), 4, 2, encoding=n).encoding) for n in ("quadratic", "gaussian", "learned")
    ] == [
        QuadraticHeads,
        GaussianHeads,
        LearnedHeads,
    ]


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: QuadraticHeads(width="square"),
            ValueError,
            r"QuadraticHeads: width must be one of \('exp', 'spread'\)",
        ),
        (lambda: QuadraticHeads(width_noise=0.1), ValueError, r"width_noise needs width='spread'"),
        (lambda: QuadraticHeads(alpha=-1.0), ValueError, r"QuadraticHeads: alpha must be finite and positive"),
        (lambda: QuadraticHeads(alpha="1"), TypeError, r"QuadraticHeads: alpha must be a real number, got str"),
        (lambda: QuadraticHeads(positional_dim=4), TypeError, r"unexpected keyword argument 'positional_dim'"),
        (lambda: GaussianHeads(width="spread"), TypeError, r"unexpected keyword argument 'width'"),
        (lambda: GaussianHeads(centre_var=float("nan")), ValueError, r"centre_var must be finite and >= 0"),
        (lambda: LearnedHeads(alpha=1.0), TypeError, r"unexpected keyword argument 'alpha'"),
        (lambda: LearnedHeads(positional_dim=0), ValueError, r"positional_dim must be a positive integer"),
        (lambda: LearnedHeads(relative_terms=1), TypeError, r"relative_terms must be True or False, got int"),
        (lambda: ContentHeads(key_dim=2.5), ValueError, r"ContentHeads: key_dim must be a positive integer"),
        (lambda: QuadraticHeads(1.0), TypeError, r"positional argument"),  # options are keywords
        (
            lambda: PositionalAttention((3, 3), 4, 2, encoding=LearnedHeads(relative_terms=True)),
            ValueError,
            r"LearnedHeads: relative_terms are the content terms of Eq. 5; give the layer content=ContentHeads",
        ),
        (
            lambda: PositionalAttention(
                (3, 3), 4, 2, encoding=LearnedHeads(relative_terms=True), content=ContentHeads(bias=True)
            ),
            ValueError,
            r"with relative_terms, u and v are the biases; give ContentHeads\(bias=False\)",
        ),
        (
            lambda: PositionalAttention((3, 3), 4, 2, encoding=LearnedHeads(positional_dim=1)),
            ValueError,
            r"positional_dim=1 must be at least the grid's 2 dimensions",
        ),
        (
            lambda: PositionalAttention((3, 3), 4, 2, encoding=None),
            TypeError,
            r"encoding must be one of .* got NoneType",
        ),
        (lambda: PositionalAttention((3, 3), 4, 2, encoding="sinusoidal"), ValueError, r"got str 'sinusoidal'"),
        (lambda: PositionalAttention((3, 3), 4, 2, content=True), TypeError, r"content must be None or a ContentHeads"),
        (lambda: PositionalAttention((3, 3), 4, 2, boundary="reflect"), ValueError, r"boundary must be one of"),
    ],
)
def test_an_option_is_checked_by_the_encoding_it_belongs_to(build: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_the_representation_shows_the_encoding_the_grid_the_heads_and_the_widths() -> None:
    layer = PositionalAttention((8, 8), 64, 9, encoding=QuadraticHeads(alpha=1.0))
    assert repr(layer) == (
        "PositionalAttention(grid=(8, 8), embed_dim=64, num_heads=9, encoding=QuadraticHeads(alpha=1.0, width='exp'), "
        "content=None, head_dim=None)"
    )
    other = PositionalAttention(
        (4, 4), 8, 2, encoding=LearnedHeads(relative_terms=True), content=ContentHeads(), head_dim=3, bias=False,
        attention_dropout=0.1, threshold=None, boundary="periodic",
    )  # fmt: skip
    assert repr(other) == (
        "PositionalAttention(grid=(4, 4), embed_dim=8, num_heads=2, encoding=LearnedHeads(positional_dim=8, "
        "relative_terms=True), content=ContentHeads(key_dim=4, bias=False), head_dim=3, attention_dropout=0.1, "
        "bias=False, boundary='periodic', threshold=None)"
    )
    assert repr(GaussianHeads()) == "GaussianHeads(alpha=1.0)"
    assert repr(LearnedHeads()) == "LearnedHeads(positional_dim=None)"
    assert "(heads):" not in repr(build_model("sa-learned-content", width=8, depth=1, ffn=8, heads=2))


def test_the_encodings_are_exported_and_their_names_clash_with_no_mechanism() -> None:
    import structconv

    new = {"PositionalHeads", "QuadraticHeads", "GaussianHeads", "LearnedHeads", "ContentHeads"}
    assert new <= set(snn.__all__)
    assert not new & set(structconv.__all__)


def test_a_layer_with_encodings_survives_deepcopy_and_state_dict_round_trips() -> None:
    torch.manual_seed(0)
    layer = PositionalAttention((3, 4), 4, 2, **CONFIGS["learned-relative"]).double()
    x = torch.randn(2, 12, 4, dtype=D64)
    twin = copy.deepcopy(layer)
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
    fresh = PositionalAttention((3, 4), 4, 2, **CONFIGS["learned-relative"]).double()
    fresh.load_state_dict(layer.state_dict())
    torch.testing.assert_close(fresh(x), layer(x), rtol=0, atol=0)
