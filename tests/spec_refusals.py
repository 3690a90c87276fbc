"""Bad arguments that the GPU's typing and the simulator refuse alike, with the message both give.

Each case is a kernel body ``(comm, win, arr, n)`` that passes one primitive an argument of the
wrong kind, and the pattern the error must match. ``tests/compile/test_spec_refusals.py`` compiles
each (the GPU's typing); ``tests/sim/test_spec_refusals.py`` runs each on the simulator. Both read
the words from the primitive's spec (``flowdsl._spec.Spec.refusal``).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
from numba import cuda, uint64

from flowdsl import MemoryOrder, RedOp, ThreadScope, cft, coop, flow, gin, lsa, mem, team, wait


def lsa_barrier_on_a_window(comm, win, arr, n):
    lsa.barrier(win, coop.cta(), 0).sync(MemoryOrder.ACQUIRE)


def lsa_barrier_with_an_int_coop(comm, win, arr, n):
    lsa.barrier(comm, n, 0).sync(MemoryOrder.ACQUIRE)


def lsa_view_of_an_array(comm, win, arr, n):
    lsa.local_view(arr)[0] = 1


def lsa_view_with_a_float_start(comm, win, arr, n):
    lsa.local_view(win, 1.5)[0] = 1


def lsa_sync_without_a_session(comm, win, arr, n):
    lsa.sync(comm, MemoryOrder.ACQUIRE)


def lsa_session_sync_with_a_window_order(comm, win, arr, n):
    lsa.barrier(comm, coop.cta(), 0).sync(win)


def lsa_session_sync_without_an_order(comm, win, arr, n):
    lsa.barrier(comm, coop.cta(), 0).sync()  # the simulator's session took SEQ_CST by default; numba refuses it


def coop_sync_of_an_int(comm, win, arr, n):
    coop.sync(n)


def team_rank_of_a_comm(comm, win, arr, n):
    arr[0] = team.rank_to_world(comm, comm, 0)


def gin_flush_without_a_context(comm, win, arr, n):
    gin.flush(comm, coop.cta())


def gin_put_with_a_counter_as_signal(comm, win, arr, n):
    gin.put(gin.context(comm), team.world(comm), 0, win, 0, win, 64, 64, remote=gin.counter_inc(0))


def gin_put_from_an_array(comm, win, arr, n):
    gin.put(gin.context(comm), team.world(comm), 0, win, 0, arr, 0, 4)


def cft_submit_without_a_session(comm, win, arr, n):
    cft.submit(comm)


def cft_fence_with_a_window_order(comm, win, arr, n):
    cft.fence(coop.cta(), win)


def cft_put_from_a_coop(comm, win, arr, n):
    storage = cuda.shared.array(4, uint64, alignment=16)
    cft.put(cft.session(comm, coop.cta(), storage), 0, 0, coop.cta(), 16)


def wait_poll_on_an_array(comm, win, arr, n):
    wait.poll(arr, 0, wait.USER, -1, 0, 1, 0)


def mem_load_acquire_of_floats(comm, win, arr, n):
    arr[0] = mem.load_acquire(arr, 0, ThreadScope.DEVICE)


def mem_fence_at_thread_scope(comm, win, arr, n):
    mem.fence(MemoryOrder.ACQUIRE, 3)


def mem_fence_that_orders_nothing(comm, win, arr, n):
    mem.fence(MemoryOrder.RELAXED, ThreadScope.DEVICE)


def mem_fence_with_a_window_scope(comm, win, arr, n):
    mem.fence(MemoryOrder.ACQUIRE, win)


def mem_vector_of_a_window(comm, win, arr, n):
    mem.store_vec(win, 0, (1.0, 2.0, 3.0, 4.0))


def flow_reduction_by_a_window(comm, win, arr, n):
    arr[0] = flow.reduction(win, 2).nranks


def flow_premulsum_without_its_scale(comm, win, arr, n):
    arr[0] = flow.premul(flow.reduction(RedOp.PREMULSUM, 2), arr[1])  # the GPU refuses it where it is applied


def flow_premul_by_a_scale_of_another_type(comm, win, arr, n):
    arr[0] = flow.premul(flow.reduction(RedOp.PREMULSUM, 2, 0, 2.0), arr[1])


#: (kernel body, pattern of the message): the GPU's typing error and the simulator's UsageError match it.
CASES = [
    (lsa_barrier_on_a_window, r"flowdsl\.lsa\.barrier requires a device communicator, got Window"),
    (lsa_barrier_with_an_int_coop, r"flowdsl\.lsa\.barrier requires a coop \(flowdsl\.coop\.cta\(\), \.warp\(\), "
                                   r"\.\.\.\), got int64"),
    (lsa_view_of_an_array, r"flowdsl\.lsa\.local_view requires a window \(from comm\.register\(buf\)\), got array"
                           r"\(float32, 1d"),
    (lsa_view_with_a_float_start, r"flowdsl\.lsa\.local_view requires start to be an integer, got float64"),
    (lsa_sync_without_a_session, r"flowdsl\.lsa\.sync requires a barrier session \(from flowdsl\.lsa\.barrier\), "
                                 r"got DevComm"),
    (lsa_session_sync_with_a_window_order, r"flowdsl\.lsa\.sync requires order to be a flowdsl\.MemoryOrder, "
                                           r"got Window"),
    (coop_sync_of_an_int, r"flowdsl\.coop\.sync requires a coop \(flowdsl\.coop\.cta\(\), \.warp\(\), \.\.\.\), "
                          r"got int64"),
    (team_rank_of_a_comm, r"flowdsl\.team\.rank_to_world requires a team, got DevComm"),
    (gin_flush_without_a_context, r"flowdsl\.gin\.flush requires a GIN context, got DevComm"),
    (gin_put_with_a_counter_as_signal, r"flowdsl\.gin\.put requires a signal action \(flowdsl\.gin\."
                                       r"strong_signal_inc\(id\), \.\.\.\), got "),
    (gin_put_from_an_array, r"flowdsl\.gin\.put requires a source window, got array\(float32, 1d"),
    (cft_submit_without_a_session, r"flowdsl\.cft\.submit requires a CFT session \(flowdsl\.cft\.session\(comm, "
                                   r"coop, storage\)\), got DevComm"),
    (cft_fence_with_a_window_order, r"flowdsl\.cft\.fence requires order to be a flowdsl\.MemoryOrder, got Window"),
    (cft_put_from_a_coop, r"flowdsl\.cft\.put requires src to be a shared-memory array \(a cuda\.shared\.array\), "
                          r"got Coop"),
    (mem_load_acquire_of_floats, r"flowdsl\.mem\.load_acquire requires elements of int32, uint32, int64, uint64, "
                                 r"got float32"),
    (mem_fence_at_thread_scope, r"flowdsl\.mem\.fence requires scope SYSTEM, DEVICE, BLOCK, got THREAD"),
    (mem_fence_that_orders_nothing, r"flowdsl\.mem\.fence requires order ACQUIRE, RELEASE, ACQ_REL, SEQ_CST, "
                                    r"got RELAXED"),
    (mem_fence_with_a_window_scope, r"flowdsl\.mem\.fence requires scope to be a flowdsl\.ThreadScope, got Window"),
    (mem_vector_of_a_window, r"flowdsl\.mem\.store_vec requires an array \(a window view or device array\), "
                             r"got Window"),
    (flow_reduction_by_a_window, r"flowdsl\.flow\.reduction requires op to be a flowdsl\.RedOp, got Window"),
    (flow_premulsum_without_its_scale, r"flowdsl\.flow\.reduction requires scale for RedOp\.PREMULSUM: the scalar "
                                       r"this rank's input is multiplied by"),
    (flow_premul_by_a_scale_of_another_type, r"flowdsl\.flow\.premul requires the reduction's scale in the element "
                                             r"type, got a float64 scale for float32 elements"),
    (lsa_session_sync_without_an_order, r"missing a required argument: 'order'"),
    (wait_poll_on_an_array, r"flowdsl\.wait\.poll requires a device communicator, got array\(float32, 1d"),
]

#: The arguments every case's kernel takes: a float32 window and array, and an integer.
ARRAY = np.zeros(16, np.float32)


def _arity_case(stub, nargs: int, reason: str):
    """A kernel body ``(comm, win, arr, n)`` calling ``stub`` with ``nargs`` integer arguments, and the refusal
    both layers give (the arguments do not bind, so their types never matter)."""
    name = stub.__flowdsl_primitive__
    namespace = {"stub": stub}
    exec(f"def body(comm, win, arr, n):\n    stub({', '.join(['n'] * nargs)})\n", namespace)  # noqa: S102
    body = namespace["body"]
    body.__name__ = body.__qualname__ = f"{name.removeprefix('flowdsl.').replace('.', '_')}_{reason.split()[0]}"
    return body, re.escape(stub.__flowdsl_spec__.refusal_arity(reason))


def _arity_cases():
    from flowdsl._stubs import PRIMITIVES  # noqa: PLC0415

    cases = []
    for stub in PRIMITIVES.values():
        params = stub.__flowdsl_spec__.params
        cases.append(_arity_case(stub, len(params) + 1, "too many positional arguments"))
        required = [p for p in params if p.default is inspect.Parameter.empty]
        if required:
            cases.append(_arity_case(stub, len(required) - 1, f"missing a required argument: '{required[-1].name}'"))
    return cases


#: Every primitive called with one argument too many, and without its last required one: both layers refuse
#: it naming the primitive and its parameters (:meth:`flowdsl._spec.Spec.refusal_arity`).
ARITY_CASES = _arity_cases()


#: A value of the case kernel's of each argument kind, where the kernel has one (``comm, win, arr, n``, or an
#: expression of them): what the parameters before the one refused are given.
_VALID = {"comm": "comm", "window": "win", "array": "arr", "int": "n", "coop": "coop.cta()",
          "order": "MemoryOrder.ACQUIRE", "scope": "ThreadScope.DEVICE"}
#: A value of the wrong kind for each kind, and its type as both layers name it.
_WRONG = {"array": ("comm", "DevComm"), "shared_array": ("comm", "DevComm"), "int": ("win", "Window"),
          "word": ("win", "Window"), "order": ("win", "Window"), "scope": ("win", "Window"),
          "enum": ("win", "Window"), "coop": ("n", "int64")}


#: How each layer writes the type of a wrong value (the GPU's typing adds the window's element type).
_GOT = {"Window": r"Window(\(float32\))?", "DevComm": r"DevComm(\([^)]*\))?", "int64": "int64"}


def _kind_case(stub, index: int):
    """A kernel body passing ``stub`` a value of the wrong kind as parameter ``index`` (those before it of
    their kind, those after it ``n``), and the refusal both layers give: the spec's, with its signature."""
    spec = stub.__flowdsl_spec__
    params = spec.params
    param = params[index].name
    wrong, got = _WRONG.get(spec.args[param].kind, ("win" if spec.args[param].kind == "comm" else "comm",
                                                     "Window" if spec.args[param].kind == "comm" else "DevComm"))
    args = [_VALID[spec.args[p.name].kind] for p in params[:index]] + [wrong]
    args += ["n" for p in params[index + 1:] if p.default is inspect.Parameter.empty]
    namespace = {"stub": stub, "coop": coop, "MemoryOrder": MemoryOrder, "ThreadScope": ThreadScope}
    exec(f"def body(comm, win, arr, n):\n    stub({', '.join(args)})\n", namespace)  # noqa: S102
    body = namespace["body"]
    body.__name__ = body.__qualname__ = f"{spec.name.removeprefix('flowdsl.').replace('.', '_')}_{param}_{got}"
    return body, re.escape(spec.refusal(param, "@GOT@")).replace("@GOT@", _GOT[got])


def _kind_cases():
    from flowdsl._stubs import PRIMITIVES  # noqa: PLC0415

    cases = []
    for stub in PRIMITIVES.values():
        spec = stub.__flowdsl_spec__
        for index, p in enumerate(spec.params):
            if p.name not in spec.args:
                break  # a parameter no kind describes: its checks are the primitive's own (CASES)
            cases.append(_kind_case(stub, index))
            arg = spec.args[p.name]
            if arg.kind not in _VALID or (arg.dtypes and "float32" not in arg.dtypes):
                break  # no value of this kind (the kernel's array is float32) to pass before the next parameter
    return cases


#: Every primitive given an argument of the wrong kind, parameter by parameter as far as the case kernel has
#: values for those before it: both layers refuse it in the spec's words (:meth:`flowdsl._spec.Spec.refusal`).
KIND_CASES = _kind_cases()
