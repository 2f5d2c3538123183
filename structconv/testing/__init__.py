r"""A conformance kit for bases and layers: what the package's own tests run, for any new one.

Every basis and layer of structconv stands on one formula, :math:`y_b = \sum_k A_k^\top x_b \Theta_k`.
The checks here hold a basis or a layer to what it should mean (a ``reference`` written apart
from it: a dense function of the graph or grid, or a peer layer) and to the formula:

:func:`dense_reference`
    The formula as one dense ``einsum``, ``"kmn,bmp,kpq->bnq"``: the reference for all of them.
:func:`check_basis`
    With ``reference=``, the basis' dense form equals it member by member, a difference told as
    the mistake it looks like (:mod:`.meaning`); every order :func:`structconv.explain` lists,
    run by :func:`structconv.conv`, equals the dense reference; gradients pass
    ``torch.autograd.gradcheck``; the basis is unchanged afterwards.
:func:`check_layer`
    With ``reference=``, a layer's output and input gradients equal the reference's; they also
    equal :func:`structconv.conv` of its own ``basis(...)`` and ``theta()`` plus its bias, in its
    layout (a contract per layer of :mod:`structconv.nn`).  Without a reference it warns
    (:class:`MeaningUnchecked`) that only consistency was checked.
:func:`compare_to_peer`
    A layer equals the same layer of another library, loaded with its parameters: outputs and
    the gradients of inputs and parameters.

Each raises an ``AssertionError`` that names what differs and by how much, so each works in
pytest (or any test runner) as it is.  This package imports every layer of structconv and
stands outside its layering (:mod:`structconv._layout`): nothing in the library imports it.

Examples
--------
>>> from structconv import grid_basis
>>> from structconv.testing import check_basis
>>> orders = check_basis(grid_basis((5, 4), 3, padding="same"))
"""

from ..engine.reference import dense_reference
from .basis import assert_unchanged, check_basis, random_operands, snapshot
from .layer import (
    CONTRACTS,
    Contract,
    MeaningUnchecked,
    attention_contract,
    check_layer,
    contract_for,
    grid_contract,
    node_contract,
    pool_contract,
    positional_contract,
)
from .peer import Link, PeerRun, compare_to_peer, run_module

__all__ = [
    "CONTRACTS",
    "Contract",
    "Link",
    "MeaningUnchecked",
    "PeerRun",
    "assert_unchanged",
    "attention_contract",
    "check_basis",
    "check_layer",
    "compare_to_peer",
    "contract_for",
    "dense_reference",
    "grid_contract",
    "node_contract",
    "pool_contract",
    "positional_contract",
    "random_operands",
    "run_module",
    "snapshot",
]
