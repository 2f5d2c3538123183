r"""Plan once, run many: :func:`contraction` binds a basis, the operands' shapes and an order.

It does once what :func:`~structconv.conv` does on every call (checks, placement, plan lookup);
a call of the :class:`Contraction` compares shapes, dtype and device with the compiled ones and
runs the same order, so its result is :func:`~structconv.conv`'s to the last bit
(``docs/engine.rst``, plan once, run many).

Two layouts of ``x`` and ``y``:

``"rows"``
    :func:`~structconv.conv`'s: ``x`` ``(B, M, P)`` or ``(M, P)``, ``y`` ``(B, N, Q)`` or ``(N, Q)``.
``"channels_first"``
    torch's layout of images: ``x`` ``(B, P, *in_shape)``, ``y`` ``(B, Q, *out_shape)``, with the
    entry shapes of the basis (:attr:`~structconv.Basis.entry_shapes`: a grid basis gives its
    grids).  An order that runs on this layout (the grid's native convolution, for a
    :class:`~structconv.ConvWeight`) takes ``x`` as it is, with the bias fused; any other order
    sees ``x`` framed as rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backend import Array, device_of, of, shape_str
from ..bases.base import Basis
from ..bases.convert import as_basis
from ..bases.factor import Theta
from .contract import _check_memory, _plan, conv
from .operands import FULL, Kind, Param, Shaped, as_param, autocast, autocast_basis, placed, prepare

LAYOUTS = ("rows", "channels_first")

Shape = tuple[int, ...]
#: What :meth:`Contraction.warm` returns: ``run(x, *operands, bias) -> y``.
WarmRun = Callable[..., Array]
#: What :meth:`Contraction.warm_per_call` returns: ``run(basis, x, operands, bias) -> y``.
WarmPerCall = Callable[[Basis, Array, tuple[Array, ...], Array | None], Array]


def _shape(value: Any, arg: str) -> Shape:
    if not isinstance(value, tuple | list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise TypeError(f"{arg} must be an array or a tuple of integers (its shape), got {type(value).__name__}")
    if any(s <= 0 for s in value):
        raise ValueError(f"{arg} must have positive sizes, got {tuple(value)}")
    return tuple(value)


def _operand_shapes(theta: Theta | Shape) -> tuple[Kind, tuple[Shape, ...], int]:
    """The kind, the operand shapes and the rank of a parameter (or of the shape of a full one)."""
    if isinstance(theta, tuple | list):
        shape = _shape(theta, "theta")
        if len(shape) != 3:
            raise ValueError(f"theta as a shape must be (K, P, Q), got {shape}")
        return FULL, (shape,), 0
    prm = as_param(theta)
    return prm.kind, tuple(tuple(int(s) for s in op.shape) for op in prm.operands), prm.R


class Contraction:
    r""":math:`y_b = \sum_k A_k^\top x_b \Theta_k` for one basis and fixed shapes, planned and checked once.

    Made by :func:`contraction`; call it as ``c(x, theta, bias=None, basis=None)``.  Under torch
    autocast a call casts the operands as :func:`~structconv.conv` does and runs a *cast twin*,
    the same order compiled for the autocast dtype (made once, with ``probe_autocast=False``: its
    operands arrive cast).

    Attributes
    ----------
    basis
        The bound basis (placed on the compiled dtype and device).
    plan
        The :class:`~structconv.Plan` (what :func:`~structconv.explain` reports); ``plan.chosen``
        is the order every call runs.
    layout
        ``"rows"`` or ``"channels_first"`` (see :mod:`structconv.engine.compiled`).
    """

    __slots__ = (
        "_autocast",
        "_backend",
        "_bias_shape",
        "_bound",
        "_casts",
        "_device",
        "_dtype",
        "_full",
        "_key",
        "_kind",
        "_last",
        "_operand_shapes",
        "_order",
        "_placement",
        "_rank",
        "_squeeze",
        "_verified",
        "_x_shape",
        "basis",
        "layout",
        "plan",
    )

    def __init__(
        self,
        basis: Basis,
        x_shape: Shape,
        theta: tuple[Kind, tuple[Shape, ...], int],
        order: str,
        layout: str,
        dtype: Any,
        *,
        probe_autocast: bool = True,
    ) -> None:
        self.basis, self.layout = basis, layout
        self._kind, self._operand_shapes, self._rank = theta
        self._x_shape, self._squeeze = x_shape, len(x_shape) == 2
        K, P, Q = self._kind.full_shape(self._operand_shapes, self._rank)
        rows = x_shape if layout == "rows" else (x_shape[0], basis.M, P)
        B = 1 if self._squeeze else int(rows[0])
        probe = Param(self._kind, tuple(Shaped(s) for s in self._operand_shapes), K, P, Q, self._rank)
        self.plan, self._order = _plan(basis, Shaped((B,)), probe, order)
        # The order's image run with its arithmetic done once (the bound basis' only).
        self._bound = self._order.bind_image(basis, probe) if layout == "channels_first" else None
        self._bias_shape = (Q,)
        self._full = (K, P, Q)
        self._key = basis.plan_key()
        self._dtype = dtype  # of x: the basis may differ (mixed dtypes under autocast go through conv's rules)
        self._placement = (basis.dtype, basis.device)
        self._device: Any = None  # bound by the first call, after the full checks
        self._verified = False
        self._last: Param | None = None  # the last single-array parameter read
        self._autocast: Any = None  # bound by the first call, for x's device (never, for a cast twin)
        self._casts: dict[Any, Contraction] | None = {} if probe_autocast else None
        self._backend: Any = None  # bound by the first call

    @property
    def order(self) -> str:
        """The order every call runs (``plan.chosen``)."""
        return self.plan.chosen

    def __call__(self, x: Array, theta: Theta, *, bias: Array | None = None, basis: Basis | None = None) -> Array:
        """Contract ``x`` with ``theta`` (shapes, dtype and device as compiled), plus ``bias`` ``(Q,)`` if given.

        ``basis`` replaces the bound basis for this call; it must have the same structure
        (:meth:`~structconv.Basis.plan_key`), as a graph rebuilt on every call has.
        """
        b, placed_as_compiled = (self.basis, True) if basis is None else self._same_structure(basis)
        if not self._verified:
            self._verify(b, x, theta, bias)
        elif x.shape != self._x_shape or x.dtype != self._dtype or x.device != self._device:
            raise self._mismatch(x)
        if self._autocast is not None and self._autocast():
            return self._autocast_run(x, theta, bias, basis)
        if not placed_as_compiled:
            return self._general(b, x, theta, bias)  # operands converted, or refused, by conv's rules
        return self._run_keyed(x, self._operands(theta), bias, basis)

    def run_keyed(self, x: Array, theta: Theta, bias: Array | None = None, basis: Basis | None = None) -> Array:
        """The call for a caller that keys its contractions by what the call would compare.

        A layer that looks its contraction up by ``x``'s shape, dtype and device (and by the
        structure, :meth:`~structconv.Basis.plan_key`, of a ``basis`` it rebuilds every call) has
        made those comparisons already; this runs the order without repeating them.  The first
        call still makes every check of :func:`~structconv.conv`, the parameter and the bias are
        compared as :meth:`__call__` compares them, and a basis placed otherwise goes through
        :func:`~structconv.conv`'s conversion rules.
        """
        if not self._verified:
            return self(x, theta, bias=bias, basis=basis)
        if self._autocast is not None and self._autocast():
            return self._autocast_run(x, theta, bias, basis)
        if basis is not None and self._placed_otherwise(basis):
            return self._general(basis, x, theta, bias)
        return self._run_keyed(x, self._operands(theta), bias, basis)

    def warm(self, cast: Any = None) -> WarmRun | None:
        r"""This contraction as one function of operands its first call checked: a layer's call once warm.

        ``run(x, *operands, bias)`` (all positional) is :meth:`__call__` with :math:`\Theta` given by
        its arrays (as :meth:`~structconv.engine.orders.Kind.operands_of` lists them), comparing
        nothing: the caller keys it by everything a call compares (``x``'s shape, dtype and
        device, the autocast state, the parameters' dtype, device and shapes).  Under autocast it
        casts as :meth:`__call__` does and runs the cast twin.  The function reads and writes no
        state of the contraction: ``torch.compile`` traces it with guards on what it holds alone.

        Parameters
        ----------
        cast
            The dtype of the autocast the run is for (the caller's key holds it), ``None`` for none.

        Returns
        -------
        WarmRun or None
            ``None`` before a first call, and under autocast before the first cast call or where
            every call takes :func:`~structconv.conv`'s conversions (a float64 operand).
        """
        parts = self._warm_parts(cast)
        if parts is None:
            return None
        dtype, target, _ = parts
        bound = target._bound
        if dtype is None and bound is not None:
            return bound  # the order's own bound run, unwrapped: nothing between the layer and the kernel
        run_basis = self.warm_per_call(cast)
        assert run_basis is not None
        basis = target.basis
        return lambda x, *rest: run_basis(basis, x, rest[:-1], rest[-1])

    def warm_per_call(self, cast: Any = None) -> WarmPerCall | None:
        """:meth:`warm` for a basis given on every call: ``run(basis, x, operands, bias)``.

        ``basis`` has the structure, dtype and device of the first call's (a layer that rebuilds
        its basis every call, from its parameters, keeps them); the rest is as for :meth:`warm`.
        """
        parts = self._warm_parts(cast)
        if parts is None:
            return None
        dtype, target, single = parts
        kind, full, rank = self._kind, self._full, self._rank
        bound, run_order, bound_basis = target._bound, target._run, target.basis
        cast_basis = dtype is not None and autocast_basis(self.basis, dtype) is not self.basis

        def run(basis: Basis, x: Array, operands: tuple[Array, ...], bias: Array | None) -> Array:
            if dtype is not None:  # the casts of _autocast_run; a float64 operand never gets here (no twin)
                x = x.to(dtype)
                operands = (operands[0].to(dtype),) if single else tuple([op.to(dtype) for op in operands])
                bias = None if bias is None else bias.to(dtype)
                basis = autocast_basis(basis, dtype) if cast_basis else basis
            if bound is not None and basis is bound_basis:
                return bound(x, *operands, bias)
            return run_order(basis, x, Param(kind, operands, *full, rank), bias)

        return run

    def _warm_parts(self, cast: Any) -> tuple[Any, Contraction, bool] | None:
        """The autocast dtype, the contraction that runs (this one or its cast twin), one operand or more."""
        if not self._verified:
            return None
        target = self
        if cast is not None:
            twin = None if self._casts is None else self._casts.get(cast)
            if twin is None:
                return None
            target = twin
        return cast, target, len(self._operand_shapes) == 1

    def _run_keyed(self, x: Array, ops: tuple[Array, ...], bias: Array | None, basis: Basis | None) -> Array:
        prm = self._param(ops)  # shape, dtype and device: a weight changed in place is caught too
        if bias is not None and (bias.shape != self._bias_shape or bias.dtype != self._dtype):
            raise ValueError(
                f"bias must have shape {shape_str(self._bias_shape)} and dtype {self._dtype}, got "
                f"{shape_str(tuple(bias.shape))} and {bias.dtype}"
            )
        bound = self._bound
        if bound is not None and basis is None:
            return bound(x, *prm.operands, bias)
        return self._run(self.basis if basis is None else basis, x, prm, bias)

    def _run(self, basis: Basis, x: Array, prm: Param, bias: Array | None) -> Array:
        """The bound order on checked operands, in the compiled layout, plus ``bias``."""
        if self._bound is not None:
            if basis is self.basis:
                return self._bound(x, *prm.operands, bias)
            return self._order.run_image(basis, x, prm, bias)
        y = self._order.run(basis, x[None] if self._squeeze else x, prm)
        if bias is not None:
            y = y + bias
        return y[0] if self._squeeze else y

    # --- the checks -------------------------------------------------------------------------
    def _rows(self, x: Array) -> Array:
        """``x`` as :func:`~structconv.conv` takes it (a view)."""
        if self.layout == "rows":
            return x
        xp = of(x).namespace()
        return xp.permute_dims(xp.reshape(x, (int(x.shape[0]), int(x.shape[1]), -1)), (0, 2, 1))

    def _verify(self, basis: Basis, x: Array, theta: Theta, bias: Array | None) -> None:
        """The first call: every check :func:`~structconv.conv` makes, then the device is bound."""
        if tuple(int(s) for s in x.shape) != self._x_shape:
            raise self._mismatch(x)
        on_x = placed(basis, x)
        if not isinstance(on_x, Basis) or on_x.plan_key() != self._key:
            raise ValueError("the basis changed structure since it was compiled")
        # Under autocast the operands are checked as conv checks them: converted first.
        a, xr, full = autocast(on_x, self._rows(x), self._kind.as_theta(theta, self._rank))
        _, x3, _, _ = prepare(a, xr, full)
        if x.dtype != self._dtype:
            raise TypeError(f"x has dtype {x.dtype} but the contraction was compiled for {self._dtype}")
        if self.plan.requested != "auto":
            _check_memory(self.plan, x3)
        if bias is not None and tuple(int(s) for s in bias.shape) != self._bias_shape:
            raise ValueError(f"bias must have shape {shape_str(self._bias_shape)}, got {shape_str(tuple(bias.shape))}")
        if bias is not None and device_of(bias) != device_of(x):
            raise ValueError(f"bias is on {device_of(bias)} but x is on {device_of(x)}")
        self._device = x.device
        self._backend = of(x)
        if self._casts is not None:
            self._autocast = self._backend.autocast_probe(x)
        self._verified = True

    def _operands(self, theta: Theta) -> tuple[Array, ...]:
        ops = self._kind.compiled_operands(theta)
        if ops is None:
            raise TypeError(f"theta must be a {self._kind.name} parameter as compiled, got {type(theta).__name__}")
        return ops

    def _param(self, ops: tuple[Array, ...]) -> Param:
        for op, shape in zip(ops, self._operand_shapes, strict=True):
            if op.shape != shape or op.dtype != self._dtype or op.device != self._device:
                raise self._theta_mismatch(op)
        if len(ops) > 1 or self._casts is None or self._backend.traced():
            # A twin's operands are new casts every call; traced, keeping one would be a side
            # effect replayed after every compiled call.
            return Param(self._kind, ops, *self._full, self._rank)
        last = self._last
        if last is not None and last.operands[0] is ops[0]:  # a layer's parameter: the same tensor every call
            return last
        self._last = Param(self._kind, ops, *self._full, self._rank)
        return self._last

    def _theta_mismatch(self, op: Any) -> ValueError:
        if not hasattr(op, "shape"):
            return ValueError(f"theta must be a {self._kind.name} parameter as compiled, got {type(op).__name__}")
        return ValueError(
            f"theta's arrays must have shapes {', '.join(shape_str(s) for s in self._operand_shapes)}, "
            f"dtype {self._dtype} and device {self._device} as compiled; got {shape_str(tuple(op.shape))}, "
            f"{op.dtype} on {device_of(op)}"
        )

    def _same_structure(self, basis: Basis) -> tuple[Basis, bool]:
        if not isinstance(basis, Basis) or basis.plan_key() != self._key:
            raise ValueError(
                f"basis must have the structure the contraction was compiled for ({self.basis!r}, plan key "
                f"{self._key}); got {basis!r} (plan key {basis.plan_key() if isinstance(basis, Basis) else None}): "
                "compile another contraction for it"
            )
        return basis, not self._placed_otherwise(basis)

    def _placed_otherwise(self, basis: Basis | None) -> bool:
        """Whether a per-call ``basis`` has another dtype or device than the compiled one (``None``: it has not)."""
        return basis is not None and (basis.dtype, basis.device) != self._placement

    def _mismatch(self, x: Array) -> ValueError:
        return ValueError(
            f"x has shape {shape_str(tuple(x.shape))}, dtype {x.dtype} on {device_of(x)}, but the contraction was "
            f"compiled for shape {shape_str(self._x_shape)}, dtype {self._dtype} "
            f"on {self._device or self.basis.device}; "
            "compile another contraction for these inputs"
        )

    def _autocast_run(self, x: Array, theta: Theta, bias: Array | None, basis: Basis | None) -> Array:
        """Under torch autocast: the operands in the autocast dtype, through this order compiled for it.

        The conversions are :func:`~structconv.conv`'s (:func:`~structconv.engine.operands.autocast`);
        the contraction they feed, the *cast twin*, is compiled once per autocast dtype for the
        same order, so a call under autocast costs the casts and the bound order, not
        :func:`~structconv.conv`'s checks and plan lookup every time.  What conv's rules would
        convert otherwise or refuse (a float64 operand, a basis placed otherwise, a theta that is
        no array of the compiled kind and shapes) goes through them.
        """
        backend = self._backend
        dtype = backend.autocast_dtype(x)
        ops = self._kind.compiled_operands(theta)
        if ops is not None and all(backend.owns(op) for op in ops) and not self._placed_otherwise(basis):
            for op, shape in zip(ops, self._operand_shapes, strict=True):
                if op.shape != shape:
                    raise self._theta_mismatch(op)
            xd, cast = backend.autocast_to(x, dtype), tuple(backend.autocast_to(op, dtype) for op in ops)
            if xd.dtype == dtype and all(op.dtype == dtype for op in cast):  # float64 is left as it is
                bias_d = None if bias is None else bias.to(dtype)
                return self._twin_run(dtype, xd, cast, bias_d, None if basis is None else autocast_basis(basis, dtype))
        return self._general(self.basis if basis is None else basis, x, theta, bias)

    def _twin_run(self, dtype: Any, x: Array, ops: tuple[Array, ...], bias: Array | None, basis: Basis | None) -> Array:
        """Operands already in ``dtype`` through the cast twin for it, compiled (and checked) on its first call."""
        assert self._casts is not None  # a twin never probes autocast
        twin = self._casts.get(dtype)
        if twin is not None:
            return twin._run_keyed(x, ops, bias, basis)
        twin = Contraction(
            autocast_basis(self.basis, dtype),
            self._x_shape,
            (self._kind, self._operand_shapes, self._rank),
            self.plan.requested,  # the same plan ("auto" plans the same: a plan's key holds no dtype)
            self.layout,
            dtype,
            probe_autocast=False,
        )
        y = twin(x, self._kind.from_operands(ops, self._rank), bias=bias, basis=basis)  # conv's checks, once
        self._casts[dtype] = twin
        return y

    def _general(self, basis: Basis, x: Array, theta: Theta, bias: Array | None) -> Array:
        """A basis placed otherwise, or float64 under autocast: :func:`~structconv.conv`'s conversions, same layout."""
        full = self._kind.as_theta(theta, self._rank)
        if self.layout == "rows":
            y = conv(basis, x, full, order=self.plan.requested)
            return y if bias is None else y + bias.to(y.dtype)
        a, x, full = autocast(placed(basis, x), x, full)
        placed_basis, x3, prm, _ = prepare(a, self._rows(x), full)
        bias = None if bias is None else bias.to(x3.dtype)
        return self._order.run_image(placed_basis, x, prm, bias)

    def __repr__(self) -> str:
        return (
            f"Contraction({self.basis!r}, x={shape_str(self._x_shape)}, theta={self._kind.name} "
            f"{', '.join(shape_str(s) for s in self._operand_shapes)}, order={self.order!r}, layout={self.layout!r})"
        )


def contraction(
    a: Basis | Array,
    x: Array | Shape,
    theta: Theta | Shape,
    *,
    order: str = "auto",
    layout: str = "rows",
) -> Contraction:
    r"""Compile :math:`y_b = \sum_k A_k^\top x_b \Theta_k` once for these shapes; call the result many times.

    Parameters
    ----------
    a
        The basis (a :class:`~structconv.Basis` or a dense ``(K, M, N)`` array), bound to the
        contraction.
    x
        An input (its values are not read) or its shape: ``(B, M, P)`` or ``(M, P)`` in the
        ``"rows"`` layout, ``(B, P, *in_shape)`` in ``"channels_first"``.  With an array the basis
        is placed on its dtype and device now; with a shape the basis' own are used.
    theta
        A parameter (values not read) — an array ``(K, P, Q)``, :class:`~structconv.Separable`,
        :class:`~structconv.LowRank` or :class:`~structconv.ConvWeight` — or the shape
        ``(K, P, Q)`` of a full one.  Calls take the same kind; a ``ConvWeight`` contraction also
        takes the bare weight.
    order
        As :func:`~structconv.conv`'s: ``"auto"`` picks the cheapest order for these shapes, now.
    layout
        ``"rows"`` (:func:`~structconv.conv`'s) or ``"channels_first"`` (torch's image layout).

    Returns
    -------
    Contraction
        ``c(x, theta, bias=None, basis=None)`` equals ``conv(a, x, theta, order) + bias`` in the
        chosen layout.  The first call makes every check of :func:`~structconv.conv`; later calls
        compare shapes, dtype and device with the first.

    Examples
    --------
    >>> import torch
    >>> from structconv import contraction, conv, grid_basis
    >>> A = grid_basis((16, 16), 3, padding=1)
    >>> x, theta = torch.randn(4, 256, 8), torch.randn(9, 8, 5)
    >>> c = contraction(A, x, theta)
    >>> c.order in c.plan.orders
    True
    >>> torch.equal(c(x, theta), conv(A, x, theta))
    True
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(order, str):
        raise TypeError(f"order must be a string such as 'auto' or 'ax', got {type(order).__name__}: {order!r}")
    basis = as_basis(a)
    if isinstance(x, tuple | list):
        x_shape = _shape(x, "x")
    else:
        x_shape = tuple(int(s) for s in x.shape)
        basis = basis.placed_like(x)
    spec = _operand_shapes(theta)
    _check_layout(basis, x_shape, spec, layout)
    dtype = basis.dtype if isinstance(x, tuple | list) else x.dtype
    return Contraction(basis, x_shape, spec, order, layout, dtype)


def _check_layout(basis: Basis, x_shape: Shape, spec: tuple[Kind, tuple[Shape, ...], int], layout: str) -> None:
    """Refuse an ``x`` or ``theta`` shape that does not fit the basis, naming the expected shape."""
    K, P, _ = spec[0].full_shape(spec[1], spec[2])
    if K != basis.K:
        raise ValueError(f"theta has K={K} members but the basis has K={basis.K}")
    if layout == "rows":
        if len(x_shape) not in (2, 3) or x_shape[-2] != basis.M or x_shape[-1] != P:
            raise ValueError(f"x must have shape (B, {basis.M}, {P}) or ({basis.M}, {P}), got {x_shape}")
        if basis.batch is not None and len(x_shape) == 3 and x_shape[0] != basis.batch:
            raise ValueError(f"the basis is per-instance with batch {basis.batch} but x has batch {x_shape[0]}")
        return
    in_shape = basis.entry_shapes[0]
    if x_shape[1:] != (P, *in_shape):
        raise ValueError(
            f"x in the channels_first layout must have shape (B, {P}, {', '.join(map(str, in_shape))}), got {x_shape}"
        )


__all__ = ["LAYOUTS", "Contraction", "WarmPerCall", "WarmRun", "contraction"]
