"""flowdsl's collectives, and your own kernels, as PyTorch operators (``torch.library``).

``import flowdsl.torch`` registers the collectives as operators of the ``flowdsl`` namespace
(``torch.ops.flowdsl.all_reduce``, ...), each with a fake implementation (shapes for
``torch.compile``'s tracing), its schema's mutation stated, and autograd where it is defined.
They run the library's programs, as :mod:`flowdsl.collectives` does, on the tensors' CUDA
device and torch's current stream (so a CUDA graph captures them), or on the simulator, where
CPU tensors stand for a rank's device memory (``flowdsl.sim.spawn``; ``torch.compile`` with a
CPU backend such as ``aot_eager``).

**Communicators by name.** An operator's schema cannot take a communicator: operators take a
name, :func:`register` gives a communicator one (once; the functions below take either), and
:func:`communicator` finds it again. Names are unique in the process, so on the simulator each
simulated rank's communicator has its own.

**Functional and in-place forms**, as ``torch.distributed``'s functional collectives have them:
``all_reduce(x)`` returns a new tensor, ``all_reduce_(x)`` reduces into ``x``;
``all_gather``/``reduce_scatter`` return a new tensor gathered or scattered along dimension 0,
``all_gather_into(out, x)``/``reduce_scatter_into(out, x)`` write ``out``; ``all_to_all(x)`` sends part ``j``
of dimension 0 to rank ``j`` (a new tensor).

**Your own kernels.** :func:`custom_op` is ``torch.library.custom_op`` for a function whose first
parameter is a communicator: the operator's schema takes the communicator's name there, and the
function (and its fake implementation) receive the communicator itself.
``flowdsl/examples/tp_mlp.py`` makes a fused RMSNorm + ReduceScatter kernel an operator with
autograd and uses it in a tensor-parallel MLP.

Errors are flowdsl's: a tensor on another device than the communicator's, a non-contiguous
tensor, a dtype the collectives do not take or a dimension 0 that does not split over the ranks
is a :class:`flowdsl.UsageError`, raised at trace time where ``torch.compile`` traces the call.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import weakref

import torch

from . import collectives
from .collectives._config import DTYPES
from .errors import UsageError

__all__ = ["register", "communicator", "custom_op", "check_tensor", "check_shape", "rows_per_rank", "all_reduce",
           "all_reduce_", "all_to_all", "all_gather", "all_gather_into", "reduce_scatter", "reduce_scatter_into", "broadcast",
           "broadcast_", "reduce", "reduce_", "OPS"]

#: The reduction operators the operators take (``op=``), as :func:`flowdsl.collectives.all_reduce` names them.
OPS = ("sum", "prod", "min", "max", "avg")

_by_name: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_numbers = itertools.count()


# ---- communicators by name ---------------------------------------------------------------------

def register(comm) -> str:
    """The name operators know ``comm`` by (given at the first call; the same one after).

    The communicator is held weakly: once it is gone, its name finds nothing."""
    if isinstance(comm, str):
        communicator(comm)  # a name already: it must be one
        return comm
    if not hasattr(comm, "nranks") or not hasattr(comm, "alloc"):
        raise UsageError(f"Cannot register {comm!r} for flowdsl's torch operators: it is not a flowdsl communicator. "
                         "Pass the one from flowdsl.init() (or the simulator's)")
    name = comm.__dict__.get("_flowdsl_torch_name")
    if name is None:
        name = comm.__dict__["_flowdsl_torch_name"] = f"flowdsl{next(_numbers)}"
        _by_name[name] = comm
    return name


def communicator(group):
    """The communicator registered as ``group`` (a communicator passes through)."""
    if not isinstance(group, str):
        return group
    comm = _by_name.get(group)
    if comm is None:
        raise UsageError(f"No flowdsl communicator is registered as {group!r} (or it was closed and freed). "
                         "Pass the communicator itself, or the name flowdsl.torch.register(comm) returned")
    return comm


def _name(group) -> str:
    """``group``'s name, readable by ``torch.compile``'s tracing (a string, or an attribute of a communicator
    registered before)."""
    if isinstance(group, str):
        return group  # checked where it is used: the fake implementation resolves it
    name = getattr(group, "_flowdsl_torch_name", None)
    if name is not None:
        return name
    if torch.compiler.is_compiling():
        raise UsageError("Cannot name a communicator inside torch.compile: register it first "
                         "(group = flowdsl.torch.register(comm), outside the compiled code) and pass the name")
    return register(group)


# ---- checks at trace time ----------------------------------------------------------------------

_TORCH_NAMES = {getattr(torch, d): d for d in DTYPES if hasattr(torch, d)}


def check_tensor(operation: str, name: str, t, comm) -> None:
    """Refuse what a collective cannot take, naming the fix: called by the fake implementations, so that
    ``torch.compile`` says it while it traces, and by the eager path before anything is launched."""
    if not isinstance(t, torch.Tensor):
        raise UsageError(f"Cannot {operation}: {name} is a {type(t).__name__}, not a torch.Tensor")
    sim = comm.memory_device == "cpu"  # the simulator: CPU tensors stand for the rank's GPU memory
    if not comm.own_thread:
        raise UsageError(f"Cannot {operation} through torch on simulated ranks that share one thread: torch keeps "
                         "state per OS thread (grad mode, its dispatcher's frames), which ranks interleaved on one "
                         "thread corrupt. Run them with flowdsl.sim.spawn(..., host_threads=True)")
    if sim and t.device.type != "cpu":
        raise UsageError(f"Cannot {operation}: {name} is on {t.device}, and a simulated rank's tensors are CPU tensors "
                         "(they stand for its GPU's memory). Create it on the CPU")
    if not sim:
        want = comm.device
        if t.device.type != "cuda":
            raise UsageError(f"Cannot {operation}: {name} is on {t.device}; the communicator's ranks use CUDA device "
                             f"{want}. Move it there (.to('cuda:{want}'))")
        if want is not None and t.device.index != want:
            raise UsageError(f"Cannot {operation}: {name} is on {t.device} but the communicator uses cuda:{want}. "
                             f"Move it there (.to('cuda:{want}'))")
    if t.dtype not in _TORCH_NAMES:
        raise UsageError(f"Cannot {operation}: {name} has dtype {t.dtype}; the collectives take "
                         f"{', '.join(DTYPES)}")
    if not t.is_contiguous():
        raise UsageError(f"Cannot {operation}: {name} is not contiguous (shape {tuple(t.shape)}, strides "
                         f"{tuple(t.stride())}). Pass {name}.contiguous()")


def _resolved(operation: str, group: str, *tensors, op: str | None = None):
    """The communicator of an operator's call, ``op`` and its tensors (input, then output) checked: what a
    fake implementation runs while ``torch.compile`` traces, and the eager path before it launches."""
    if op is not None:
        _check_op(operation, op)
    comm = communicator(group)
    for name, t in zip(("input", "output"), tensors):
        check_tensor(operation, name, t, comm)
    return comm


def _check_op(operation: str, op: str) -> None:
    if op not in OPS:
        raise UsageError(f"Cannot {operation} with op={op!r}: the operators take {', '.join(map(repr, OPS))}")


def rows_per_rank(operation: str, t, nranks: int) -> int:
    """``t.shape[0] / nranks``, refused where dimension 0 does not split over the ranks."""
    if t.dim() == 0 or t.shape[0] % nranks:
        raise UsageError(f"Cannot {operation}: its input's dimension 0 ({tuple(t.shape)[:1] or 'a scalar'}) does not "
                         f"split over {nranks} ranks. Pass a tensor whose first dimension is a multiple of {nranks}")
    return t.shape[0] // nranks


def check_shape(operation: str, output, want, why: str) -> None:
    """Refuse an ``output`` tensor of another shape than ``want`` (``why``: how the input gives it)."""
    if tuple(output.shape) != tuple(want):
        raise UsageError(f"Cannot {operation}: output has shape {tuple(output.shape)}; it takes {tuple(want)} "
                         f"({why}). Pass an output of that shape")


def _gathered(input, nranks):
    return (nranks * input.shape[0], *input.shape[1:]) if input.dim() else (nranks,)


def _complete(comm, *values) -> None:
    """A CPU tensor's work is done when its operator returns (torch's CPU operators run on the host, in
    program order): where any of ``values`` is a CPU tensor (the simulator, where they stand for device
    memory), wait for the rank's kernels. CUDA tensors are stream-ordered, as every torch operator on them."""
    if any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values):
        comm.synchronize()


def _plain(values):
    """Tensors as a kernel launch takes them. An operator's autograd is its registered formula, so its body
    sees plain tensors: a launch cannot take one that requires grad (torch refuses it its
    ``__cuda_array_interface__``), and torch 2.11 hands an operator's body such tensors where 2.14 does not."""
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]


def _detaching(fn):
    """``fn`` called with its tensor arguments detached (:func:`_plain`); its signature is ``fn``'s, which
    ``torch.library.custom_op`` reads for the schema."""
    @functools.wraps(fn)
    def body(*args, **kwargs):
        return fn(*_plain(args), **dict(zip(kwargs, _plain(kwargs.values()))))
    return body


# ---- the collectives as operators --------------------------------------------------------------

@torch.library.custom_op("flowdsl::all_reduce", mutates_args=())
@_detaching
def _all_reduce(input: torch.Tensor, op: str, group: str) -> torch.Tensor:
    comm = _resolved("all_reduce", group, input)
    out = torch.empty_like(input)
    collectives.all_reduce(comm, input, out, op=op)
    _complete(comm, out)
    return out


@_all_reduce.register_fake
def _(input, op, group):
    _resolved("all_reduce", group, input, op=op)
    return torch.empty_like(input)


@torch.library.custom_op("flowdsl::all_reduce_", mutates_args=("input",))
@_detaching
def _all_reduce_(input: torch.Tensor, op: str, group: str) -> None:
    comm = _resolved("all_reduce", group, input)
    collectives.all_reduce(comm, input, op=op)
    _complete(comm, input)


@_all_reduce_.register_fake
def _(input, op, group):
    _resolved("all_reduce", group, input, op=op)


@torch.library.custom_op("flowdsl::all_to_all", mutates_args=())
@_detaching
def _all_to_all(input: torch.Tensor, group: str) -> torch.Tensor:
    comm = _resolved("all_to_all", group, input)
    rows_per_rank("all_to_all", input, comm.nranks)
    out = torch.empty_like(input)
    collectives.all_to_all(comm, input, out)
    _complete(comm, out)
    return out


@_all_to_all.register_fake
def _(input, group):
    rows_per_rank("all_to_all", input, _resolved("all_to_all", group, input).nranks)
    return torch.empty_like(input)


@torch.library.custom_op("flowdsl::all_gather", mutates_args=())
@_detaching
def _all_gather(input: torch.Tensor, group: str) -> torch.Tensor:
    comm = _resolved("all_gather", group, input)
    out = input.new_empty(_gathered(input, comm.nranks))
    collectives.all_gather(comm, input, out)
    _complete(comm, out)
    return out


@_all_gather.register_fake
def _(input, group):
    return input.new_empty(_gathered(input, _resolved("all_gather", group, input).nranks))


@torch.library.custom_op("flowdsl::all_gather_into", mutates_args=("output",))
@_detaching
def _all_gather_into(output: torch.Tensor, input: torch.Tensor, group: str) -> None:
    comm = _resolved("all_gather", group, input, output)
    check_shape("all_gather", output, _gathered(input, comm.nranks),
                f"the input's dimension 0 times {comm.nranks} ranks")
    collectives.all_gather(comm, input, output)
    _complete(comm, output)


@_all_gather_into.register_fake
def _(output, input, group):
    comm = _resolved("all_gather", group, input, output)
    check_shape("all_gather", output, _gathered(input, comm.nranks),
                f"the input's dimension 0 times {comm.nranks} ranks")


@torch.library.custom_op("flowdsl::reduce_scatter", mutates_args=())
@_detaching
def _reduce_scatter(input: torch.Tensor, op: str, group: str) -> torch.Tensor:
    comm = _resolved("reduce_scatter", group, input)
    out = input.new_empty((input.shape[0] // comm.nranks, *input.shape[1:]))
    collectives.reduce_scatter(comm, input, out, op=op)
    _complete(comm, out)
    return out


@_reduce_scatter.register_fake
def _(input, op, group):
    comm = _resolved("reduce_scatter", group, input, op=op)
    return input.new_empty((rows_per_rank("reduce_scatter", input, comm.nranks), *input.shape[1:]))


@torch.library.custom_op("flowdsl::reduce_scatter_into", mutates_args=("output",))
@_detaching
def _reduce_scatter_into(output: torch.Tensor, input: torch.Tensor, op: str, group: str) -> None:
    comm = _resolved("reduce_scatter", group, input, output)
    check_shape("reduce_scatter", output, (rows_per_rank("reduce_scatter", input, comm.nranks), *input.shape[1:]),
                f"the input's dimension 0 over {comm.nranks} ranks")
    collectives.reduce_scatter(comm, input, output, op=op)
    _complete(comm, output)


@_reduce_scatter_into.register_fake
def _(output, input, op, group):
    comm = _resolved("reduce_scatter", group, input, output, op=op)
    check_shape("reduce_scatter", output, (rows_per_rank("reduce_scatter", input, comm.nranks), *input.shape[1:]),
                f"the input's dimension 0 over {comm.nranks} ranks")


@torch.library.custom_op("flowdsl::broadcast", mutates_args=())
@_detaching
def _broadcast(input: torch.Tensor, root: int, group: str) -> torch.Tensor:
    comm = _resolved("broadcast", group, input)
    out = torch.empty_like(input)
    collectives.broadcast(comm, input, out, root=root)
    _complete(comm, out)
    return out


@_broadcast.register_fake
def _(input, root, group):
    _resolved("broadcast", group, input)
    return torch.empty_like(input)


@torch.library.custom_op("flowdsl::broadcast_", mutates_args=("input",))
@_detaching
def _broadcast_(input: torch.Tensor, root: int, group: str) -> None:
    comm = _resolved("broadcast", group, input)
    collectives.broadcast(comm, input, root=root)
    _complete(comm, input)


@_broadcast_.register_fake
def _(input, root, group):
    _resolved("broadcast", group, input)


@torch.library.custom_op("flowdsl::reduce", mutates_args=())
@_detaching
def _reduce(input: torch.Tensor, op: str, root: int, group: str) -> torch.Tensor:
    comm = _resolved("reduce", group, input)
    out = torch.empty_like(input)
    collectives.reduce(comm, input, out, op=op, root=root)
    _complete(comm, out)
    return out


@_reduce.register_fake
def _(input, op, root, group):
    _resolved("reduce", group, input, op=op)
    return torch.empty_like(input)


@torch.library.custom_op("flowdsl::reduce_", mutates_args=("input",))
@_detaching
def _reduce_(input: torch.Tensor, op: str, root: int, group: str) -> None:
    comm = _resolved("reduce", group, input)
    collectives.reduce(comm, input, op=op, root=root)
    _complete(comm, input)


@_reduce_.register_fake
def _(input, op, root, group):
    _resolved("reduce", group, input, op=op)


# Autograd, with torch.distributed.nn.functional's convention (the loss is the sum of the ranks' losses):
# an all-reduce's gradient is the all-reduce of the gradients, all-gather and sum reduce-scatter are each
# other's. Other reductions have no gradient here (torch.distributed's have none either).

def _all_reduce_backward(ctx, grad):
    if ctx.op != "sum":
        raise UsageError(f"Cannot differentiate all_reduce with op={ctx.op!r}: only 'sum' has a gradient here")
    return _all_reduce(grad.contiguous(), "sum", ctx.group), None, None


def _save_op_group(ctx, inputs, output):
    ctx.op, ctx.group = inputs[-2], inputs[-1]


def _all_gather_backward(ctx, grad):
    return _reduce_scatter(grad.contiguous(), "sum", ctx.group), None


def _all_to_all_backward(ctx, grad):  # block j of a rank's input became block r of rank j's output: the way back
    return _all_to_all(grad.contiguous(), ctx.group), None


def _reduce_scatter_backward(ctx, grad):
    if ctx.op != "sum":
        raise UsageError(f"Cannot differentiate reduce_scatter with op={ctx.op!r}: only 'sum' has a gradient here")
    return _all_gather(grad.contiguous(), ctx.group), None, None


_all_reduce.register_autograd(_all_reduce_backward, setup_context=_save_op_group)
_all_gather.register_autograd(_all_gather_backward,
                              setup_context=lambda ctx, inputs, output: setattr(ctx, "group", inputs[-1]))
_reduce_scatter.register_autograd(_reduce_scatter_backward, setup_context=_save_op_group)
_all_to_all.register_autograd(_all_to_all_backward,
                              setup_context=lambda ctx, inputs, output: setattr(ctx, "group", inputs[-1]))


# ---- the Python forms --------------------------------------------------------------------------

def all_reduce(input, op: str = "sum", *, group) -> torch.Tensor:
    """``op`` over ranks of ``input``, a new tensor (``group``: a communicator or its name)."""
    return _all_reduce(input, str(op), _name(group))


def all_reduce_(input, op: str = "sum", *, group) -> torch.Tensor:
    """``op`` over ranks of ``input``, into ``input``; returns it."""
    _all_reduce_(input, str(op), _name(group))
    return input


def all_to_all(input, *, group) -> torch.Tensor:
    """Part ``j`` of dimension 0 of ``input`` goes to rank ``j``; part ``i`` of the result came from rank ``i``
    (``torch.distributed``'s ``all_to_all_single`` with equal splits; a new tensor)."""
    return _all_to_all(input, _name(group))


def all_gather(input, *, group) -> torch.Tensor:
    """Every rank's ``input`` concatenated along dimension 0, rank order (a new tensor)."""
    return _all_gather(input, _name(group))


def all_gather_into(output, input, *, group) -> torch.Tensor:
    """:func:`all_gather` into ``output`` (``nranks`` times ``input``'s elements); returns it."""
    _all_gather_into(output, input, _name(group))
    return output


def reduce_scatter(input, op: str = "sum", *, group) -> torch.Tensor:
    """``op`` over ranks of ``input``; this rank keeps its part of dimension 0 (a new tensor)."""
    return _reduce_scatter(input, str(op), _name(group))


def reduce_scatter_into(output, input, op: str = "sum", *, group) -> torch.Tensor:
    """:func:`reduce_scatter` into ``output`` (``input``'s elements / ``nranks``); returns it."""
    _reduce_scatter_into(output, input, str(op), _name(group))
    return output


def broadcast(input, root: int = 0, *, group) -> torch.Tensor:
    """Rank ``root``'s ``input`` on every rank (a new tensor)."""
    return _broadcast(input, int(root), _name(group))


def broadcast_(input, root: int = 0, *, group) -> torch.Tensor:
    """Rank ``root``'s ``input`` into ``input`` on every rank; returns it."""
    _broadcast_(input, int(root), _name(group))
    return input


def reduce(input, op: str = "sum", root: int = 0, *, group) -> torch.Tensor:
    """``op`` over ranks of ``input`` on rank ``root`` (a new tensor; its contents on other ranks are
    undefined, as NCCL's reduce leaves them)."""
    return _reduce(input, str(op), int(root), _name(group))


def reduce_(input, op: str = "sum", root: int = 0, *, group) -> torch.Tensor:
    """``op`` over ranks of ``input``, into ``input`` on rank ``root``; returns it."""
    _reduce_(input, str(op), int(root), _name(group))
    return input


# ---- your own kernels as operators -------------------------------------------------------------

def custom_op(name: str, fn=None, *, mutates_args, device_types=None):
    """``torch.library.custom_op`` for ``fn(comm, ...)``, whose first parameter is a flowdsl communicator.

    The operator's schema takes the communicator's name (:func:`register`) in that place; ``fn``, and the
    fake implementation given to ``register_fake``, receive the communicator itself. Call the result with
    the communicator or its name. ``register_autograd``'s functions see the name (resolve it with
    :func:`communicator`). Everything else is ``torch.library.custom_op``'s: annotate the other parameters,
    state what ``fn`` writes in ``mutates_args``, return new tensors (never an input).

    Example (``flowdsl/examples/tp_mlp.py`` has a whole one)::

        @flowdsl.torch.custom_op("mylib::scaled_sum", mutates_args=())
        def scaled_sum(comm, x: torch.Tensor, scale: float) -> torch.Tensor:
            out = torch.empty_like(x)
            my_kernel[blocks, threads](comm.device_communicator(), x, out, scale)
            return out

        @scaled_sum.register_fake
        def _(comm, x, scale):
            return torch.empty_like(x)
    """
    def wrap(fn):
        params = list(inspect.signature(fn).parameters.values())
        if not params:
            raise UsageError(f"Cannot make {fn.__qualname__} the operator {name}: its first parameter must be the "
                             "communicator (def f(comm, x: torch.Tensor, ...))")
        first = params[0].name

        @functools.wraps(fn)
        def by_name(group, *args, **kwargs):
            comm = communicator(group)
            args, kwargs = _plain(args), dict(zip(kwargs, _plain(kwargs.values())))  # autograd: register_autograd's
            result = fn(comm, *args, **kwargs)
            _complete(comm, *args, *kwargs.values())
            return result
        by_name.__signature__ = inspect.signature(fn).replace(
            parameters=[params[0].replace(annotation=str), *params[1:]])
        by_name.__annotations__ = {**getattr(fn, "__annotations__", {}), first: str}
        op = torch.library.custom_op(name, by_name, mutates_args=mutates_args, device_types=device_types)
        return _CommunicatorOp(op)
    return wrap if fn is None else wrap(fn)


class _CommunicatorOp:
    """What :func:`custom_op` returns: the operator, called with a communicator or its name."""

    def __init__(self, op):
        self.op = op
        functools.update_wrapper(self, op)

    def __call__(self, comm, *args, **kwargs):
        return self.op(_name(comm), *args, **kwargs)

    def register_fake(self, fake):
        """The fake implementation, ``fake(comm, ...)``: the outputs' shapes and dtypes, no data."""
        self.op.register_fake(lambda group, *args, **kwargs: fake(communicator(group), *args, **kwargs))
        return fake

    def register_autograd(self, backward, *, setup_context=None):
        """``torch.library``'s ``register_autograd``: the communicator is its name in ``inputs``."""
        self.op.register_autograd(backward, setup_context=setup_context)

    def __getattr__(self, attr):
        return getattr(self.op, attr)
