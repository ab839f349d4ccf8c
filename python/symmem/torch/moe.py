"""MoE token dispatch and combine on symmem (include/symmem/ep.hpp) for torch.

    ep = ExpertParallel(group, num_experts=256, topk=8, hidden=7168, max_tokens_per_rank=128,
                        payload="float8_e4m3", layout="expert_major")
    r = ep.dispatch(x, topk_idx, topk_weights, x_scales=scales)   # or num_tokens=device int32 tensor
    # r.x [E_local, rows, H] (expert-major) or [rows, H] (rank-major), r.expert_num_tokens [E_local] ...
    ep.combine_input[...] = experts(r)      # or pass the outputs to combine
    y = ep.combine(out=y)                   # [T, H] bfloat16

The ops behind it (schema + CUDA kernel + CPU kernel + fake, so torch.compile traces them):

  symmem::moe_dispatch(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor topk_weights, Tensor? num_tokens,
                       int context, *, Tensor(a!) recv_x, Tensor(b!) recv_x_scales, Tensor(c!) recv_topk_idx,
                       Tensor(d!) recv_topk_weights, Tensor(e!) expert_num_tokens, Tensor(f!) num_rows) -> ()
  symmem::moe_combine(Tensor? expert_out, Tensor? topk_weights, int context, bool weights_applied, *,
                      Tensor(a!) combine_input, Tensor(b!) expert_num_tokens, Tensor(c!) num_rows,
                      Tensor(d!) out) -> ()

dispatch returns the context's receive area at its full, fixed shape (graph capturable: nothing
depends on the counts, which stay on the device); tensors of a layout or payload that has none are
empty. They are the area itself, the same tensors every call: their contents are those of the last
dispatch; the expert computation that reads them and writes combine_input runs between a dispatch
and its combine(s) on the same stream, and combines may follow each other with combine_input
rewritten between them (docs/moe.md, "Ordering rules"). The tensors stay valid after close(): the
memory they cover is released only once they are gone.

The ops tell torch what they touch, so that torch.compile orders the caller's reads and writes
around them as eager runs them. dispatch writes the receive area and the counts, all arguments;
combine reads combine_input, and writes it when it stages expert_out there (the device's staging
copy: the valid rows), and out. The counts stand for the context's routing state, which combine
reads and the next dispatch replaces: combine declares them written too, so that a context's calls
keep their program order in compiled code (each takes the previous one's result).
The library writes only the context's own memory, so a kernel handed other tensors in their place
(torch.compile's functionalization passes copies where it does not reinplace: the second dispatch
of one context in a graph, say) makes them take the results and leaves the area as it was, which the
compiled code may still read (_into_area, _from_combine_input). Compiled code sees counts of its own
(ExpertParallel._counts), not the library's, which must hold the last dispatch's. In eager mode the
wrappers pass the context's own tensors: no copy.

A context of a CPU (gloo) group runs a reference implementation with torch.distributed (all-gathers
of every rank's tokens): the same layouts, counts and errors, for tests and for machines without
GPUs.
"""
import collections
import itertools
import logging
import weakref

import torch
import torch.distributed as dist

from .. import _native, errors
from .. import ep as core_ep
from . import _route
from .errors import agree_on_checks, refused
from .groups import capturing, state_of
from .memory import lent_tensor

_log = logging.getLogger("symmem")

_lib = torch.library.Library("symmem", "FRAGMENT")
_TAGS = (torch.Tag.pt2_compliant_tag,)
_lib.define("moe_dispatch(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor topk_weights, Tensor? num_tokens, "
            "int context, *, Tensor(a!) recv_x, Tensor(b!) recv_x_scales, Tensor(c!) recv_topk_idx, "
            "Tensor(d!) recv_topk_weights, Tensor(e!) expert_num_tokens, Tensor(f!) num_rows) -> ()", tags=_TAGS)
_lib.define("moe_combine(Tensor? expert_out, Tensor? topk_weights, int context, bool weights_applied, *, "
            "Tensor(a!) combine_input, Tensor(b!) expert_num_tokens, Tensor(c!) num_rows, Tensor(d!) out) -> ()",
            tags=_TAGS)

SCALE_COLUMNS = 128
_PAYLOAD_DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3": torch.float8_e4m3fn}
_contexts = {}  # id -> ExpertParallel (the ops name their context by id)
_ids = itertools.count(1)

Dispatched = collections.namedtuple("Dispatched", "x x_scales topk_idx topk_weights expert_num_tokens num_rows")
# moe_dispatch's keyword arguments for the receive area, in Dispatched's order.
RECEIVED = ("recv_x", "recv_x_scales", "recv_topk_idx", "recv_topk_weights", "expert_num_tokens", "num_rows")


def quantize_fp8(x, columns=SCALE_COLUMNS):
    """x [T, H] (floating) -> (float8 e4m3 [T, H], float32 scales [T, H / columns]): one scale per
    `columns` columns, amax / 448, as DeepEP and vLLM's per-token-group quantization do."""
    t, h = x.shape
    groups = x.float().view(t, h // columns, columns)
    scales = groups.abs().amax(dim=-1).clamp(min=1e-10) / 448.0
    q = (groups / scales.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(t, h), scales


def dequantize_fp8(q, scales, columns=SCALE_COLUMNS):
    t, h = q.shape
    return (q.float().view(t, h // columns, columns) * scales.unsqueeze(-1)).view(t, h)


def _view(comm, lent, ptr, shape, dtype):
    """A tensor of `shape` and `dtype` over `ptr` (float8 through its bytes), memory a context lends
    (its heap buffers or its counts): counted by `comm` and by the context's `lent` (memory.lent_tensor),
    so that neither releases it while the tensor, or a view of it, lives."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return lent_tensor(comm, ptr, nbytes, lent).view(dtype).view(shape)


def blocks_for(group=None, **config):
    """The blocks (SMs) an ExpertParallel(group, **config) would take (its `blocks`), before it is
    made: local, allocates nothing; None on a CPU group (it runs no kernels)."""
    state = state_of(group)
    if dist.get_backend(state.group) == "gloo":
        return None
    return core_ep.blocks_for(state.communicator().core, **config)


class ExpertParallel:
    """Collective: an EP context of `group` (default: the world group) whose buffers are fixed for
    its lifetime; `memory` states their size, known before allocation (ep_memory). `max_blocks`: the
    SMs dispatch and combine may use, -1 for the library's choice (`blocks` says what they take)."""

    def __init__(self, group=None, *, num_experts, topk, hidden, max_tokens_per_rank, payload="bfloat16",
                 layout="expert_major", max_tokens_per_expert=0, max_received_rows=0, max_blocks=-1):
        if payload not in _PAYLOAD_DTYPES:
            raise ValueError(f"ExpertParallel: payload {payload!r} is not one of {sorted(_PAYLOAD_DTYPES)}")
        if layout not in core_ep.LAYOUTS:
            raise ValueError(f"ExpertParallel: layout {layout!r} is not one of {sorted(core_ep.LAYOUTS)}")
        state = state_of(group)
        self.group, self.group_name = state.group, state.name
        self.world, self.rank = state.world, state.rank
        self.num_experts, self.topk, self.hidden = int(num_experts), int(topk), int(hidden)
        self.max_tokens_per_rank = int(max_tokens_per_rank)
        self.payload, self.layout = payload, layout
        self.max_blocks = int(max_blocks)
        self.local_experts = self.num_experts // self.world
        self.expert_major = layout == "expert_major"
        every = self.world * self.max_tokens_per_rank
        self.rows = (max_tokens_per_expert or every) if self.expert_major else (max_received_rows or every)
        self.memory = core_ep.memory(self.world, num_experts, topk, hidden, max_tokens_per_rank, payload, layout,
                                     max_tokens_per_expert, max_received_rows, max_blocks)
        self.cpu = dist.get_backend(self.group) == "gloo"
        _log.info("symmem ExpertParallel(%s, %s) of group %r: %d heap bytes and %d local bytes per rank", layout,
                  payload, self.group_name, *self.memory)
        if self.cpu:
            self.device = torch.device("cpu")
            self._impl = _ReferenceContext(self)
        else:
            _refuse_capture("ExpertParallel()", "allocates")
            comm = state.communicator()
            self.device = comm.torch_device
            self._impl = _DeviceContext(self, comm, max_tokens_per_expert, max_received_rows, max_blocks)
        self.closed = False
        self.tokens = 0  # the last dispatch's T (x.shape[0]): the rows combine() allocates
        self.dispatches = 0  # dispatches so far (a receiver can tell whether the area is still its batch's)
        # The counts compiled code sees (module docstring): dispatch copies the library's into them.
        self._counts = (torch.zeros(self.local_experts, dtype=torch.int32, device=self.device),
                        torch.zeros(1, dtype=torch.int32, device=self.device))
        self.id = next(_ids)
        _contexts[self.id] = self

    # Shapes of what dispatch returns (the same for the fake kernels).
    def received_shapes(self):
        rows, h, k = self.rows, self.hidden, self.topk
        x = (self.local_experts, rows, h) if self.expert_major else (rows, h)
        scales = x[:-1] + (h // SCALE_COLUMNS,) if self.payload == "float8_e4m3" else (0,)
        meta = (0,) if self.expert_major else (rows, k)
        return x, scales, meta

    def received_dtypes(self):
        """The dtypes of Dispatched's tensors, in its order."""
        return (_PAYLOAD_DTYPES[self.payload], torch.float32, torch.int32, torch.float32, torch.int32, torch.int32)

    def _require_open(self, op):
        if self.closed:
            raise errors.SymmemError(_native.ErrorCode.kInvalidArgument,
                                     f"symmem.{op}: this ExpertParallel (context {self.id}) was closed")

    @property
    def combine_input(self):
        """Where the experts' bfloat16 outputs go (rows as the receive area), read by combine with
        no copy. Rewriting it right after a combine is allowed (the combine has finished reading it
        on every rank when it ends)."""
        self._require_open("combine_input")
        return self._impl.combine_input

    def dispatch(self, x, topk_idx, topk_weights, x_scales=None, num_tokens=None):
        """x [T, H] (payload dtype), topk_idx [T, K] int64 or int32 (-1: none), topk_weights [T, K]
        float32, x_scales [T, H / 128] float32 for float8; num_tokens: a device int32 tensor (graphs
        captured at the maximum batch: the tensors then hold max_tokens_per_rank rows) or None for
        T = x.shape[0]. A rank with no tokens passes T = 0. A tensor that fails a check refuses the
        call: every rank raises, naming this rank (docs/moe.md)."""
        self._require_open("moe_dispatch")
        area = self._received()
        # Eager calls go straight to the kernel: the dispatcher costs microseconds per call with these
        # arguments. Compiled code needs the op (its schema says what it writes).
        op = torch.ops.symmem.moe_dispatch if torch.compiler.is_compiling() else _dispatch_kernel
        op(x, x_scales, topk_idx, topk_weights, num_tokens, self.id, **dict(zip(RECEIVED, area)))
        self.tokens = x.shape[0]
        if not torch.compiler.is_compiling():  # (a counter in a graph would guard it: a recompile per call)
            self.dispatches += 1
        return area

    def _received(self):
        """What dispatch writes and returns: the receive area and the counts (compiled: its own)."""
        area = Dispatched(*self._impl.outputs)
        if torch.compiler.is_compiling():
            area = area._replace(expert_num_tokens=self._counts[0], num_rows=self._counts[1])
        return area

    def combine(self, expert_out=None, out=None, weights_applied=False, topk_weights=None):
        """The tokens of the last dispatch, their expert outputs summed (float32, top-k or rank order)
        into out [>= T, H] bfloat16 (allocated [T, H] when None: [0, H] after a dispatch of no
        tokens). expert_out: None to read combine_input, else the outputs, staged into combine_input
        (its valid rows) first; topk_weights: None for the dispatch's, else [T, K]. Several combines
        may follow one dispatch, back to back."""
        self._require_open("moe_combine")
        if out is None:
            out = torch.empty((self.tokens, self.hidden), dtype=torch.bfloat16, device=self.device)
        area = self._received()
        op = torch.ops.symmem.moe_combine if torch.compiler.is_compiling() else _combine_kernel  # (as dispatch)
        op(expert_out, topk_weights, self.id, bool(weights_applied), combine_input=self._impl.combine_input,
           expert_num_tokens=area.expert_num_tokens, num_rows=area.num_rows, out=out)
        return out

    @property
    def blocks(self):
        """The blocks (SMs) dispatch and combine take: `max_blocks`, or the library's choice where
        it is -1 (include/symmem/ep.hpp); None on a CPU group."""
        return self._impl.blocks

    def describe(self):
        return self._impl.describe()

    def close(self):
        """Collective (every rank calls it; a second call does nothing): the context takes no more
        calls (they raise on every rank). Its memory returns at once when no rank still holds a tensor
        it lent (dispatch's outputs, combine_input) and no CUDA graph of the communicator lives;
        otherwise those tensors stay valid, and their memory mapped, until they are gone: the heap
        buffers until the communicator is released, the counts until symmem's next release point
        after the last of them dies. Nothing collective happens at garbage collection. Refused
        (RuntimeError, nothing done) during CUDA graph capture, as is creating a context."""
        if self.closed:
            return
        if not self.cpu:
            _refuse_capture("ExpertParallel.close()", "frees")
        self.closed = True
        _contexts.pop(self.id, None)
        self._impl.close()


def _refuse_capture(what, does):
    """Creating and closing a context are collective and allocate or free device memory (a device
    synchronisation), which a CUDA graph capture forbids: refused before anything happens, alike
    on every rank (they capture alike)."""
    if capturing():
        raise RuntimeError(f"symmem: {what} is collective and {does} device memory: it cannot run during CUDA "
                           "graph capture; call it before or after the capture")


class _DeviceContext:
    def __init__(self, ep, comm, max_tokens_per_expert, max_received_rows, max_blocks):
        self.ep = ep
        self.comm = comm
        if not capturing():
            comm._release_held()  # what closed contexts left behind, once unused
        self.ctx = core_ep.EpContext(comm.core, ep.num_experts, ep.topk, ep.hidden, ep.max_tokens_per_rank, ep.payload,
                                     ep.layout, max_tokens_per_expert, max_received_rows, max_blocks)
        self.blocks = self.ctx.blocks()
        r = self.ctx.received()
        dev = comm.torch_device
        xs, scales, meta = ep.received_shapes()
        # Every tensor over the context's memory (heap buffers and counts) counts in `lent`: close()
        # releases that memory only once no rank holds one.
        self.lent = weakref.WeakSet()

        def view(name, shape, dtype):
            return _view(comm, self.lent, r[name], shape, dtype)

        self.outputs = Dispatched(
            view("x", xs, _PAYLOAD_DTYPES[ep.payload]),
            view("x_scales", scales, torch.float32) if r["x_scales"] else
            torch.empty(scales, dtype=torch.float32, device=dev),
            view("topk_idx", meta, torch.int32) if r["topk_idx"] else torch.empty(meta, dtype=torch.int32, device=dev),
            view("topk_weights", meta, torch.float32) if r["topk_weights"] else
            torch.empty(meta, dtype=torch.float32, device=dev),
            view("expert_num_tokens", (ep.local_experts,), torch.int32),
            view("num_rows", (1,), torch.int32))
        self.combine_input = view("combine_input", xs, torch.bfloat16)
        self.out_rows = 0  # rows combine writes: the last dispatch's host count, or T for a device count

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens, received):
        try:
            _check_dispatch(self.ep, x, x_scales, topk_idx, topk_weights, num_tokens, received)
        except (TypeError, ValueError) as cause:
            raise refused(self.comm, "symmem.moe_dispatch", cause) from cause

        def run():
            self.ctx.dispatch(x.data_ptr(), x_scales.data_ptr() if x_scales is not None else 0, topk_idx.data_ptr(),
                              topk_idx.dtype == torch.int64, topk_weights.data_ptr(),
                              x.shape[0] if num_tokens is None else 0,
                              num_tokens.data_ptr() if num_tokens is not None else 0,
                              _route.current_stream(self.comm.device))

        _into_area(self.outputs, received, run)
        self.out_rows = x.shape[0]

    def combine(self, expert_out, topk_weights, weights_applied, combine_input, counts, out):
        try:
            _check_combine(self.ep, expert_out, topk_weights, combine_input, counts, out)
        except (TypeError, ValueError) as cause:
            raise refused(self.comm, "symmem.moe_combine", cause) from cause

        def run(staged):
            self.ctx.combine(staged.data_ptr() if staged is not None else 0, out.data_ptr(), weights_applied,
                             topk_weights.data_ptr() if topk_weights is not None else 0,
                             _route.current_stream(self.comm.device))

        _from_combine_input(self, expert_out, combine_input, run)

    def describe(self):
        return self.ctx.describe()

    def close(self):
        """Collective. The context's own tensors go first: what `lent` still counts is the caller's.
        The heap buffers are released now unless some rank lends (then they stay with the
        communicator); the counts (local memory) are freed now, or held by the communicator until
        their tensors are gone and no graph may replay a call (groups.GroupCommunicator.hold)."""
        self.outputs = self.combine_input = None
        lent = len(self.lent) > 0
        try:
            self.ctx.close(memory_lent=lent)
        finally:
            if lent or self.comm.core.live_graphs > 0:
                self.comm.hold(self.ctx.destroy, self.lent)
            else:
                self.ctx.destroy()


def _same(t, area):
    """Whether t is the context's own tensor `area` (eager), not a copy torch.compile passed."""
    return t is area or (t.data_ptr() == area.data_ptr() and t.shape == area.shape)


def _into_area(area, received, run):
    """A dispatch, `run()`, into the context's receive area and counts (`area`, Dispatched), for an
    op handed `received`. Handed the context's own tensors (eager), nothing is copied. Where it was
    handed others (copies torch.compile made), they take the results after it, and the receive area
    gets back what it held before, which compiled code may still read (on the device: after the
    dispatch's end barrier, before the next call, whose pushes wait for this rank's stream). The
    counts are the library's state and keep the new ones (compiled code reads its own: module
    docstring)."""
    swapped = [i for i, (mine, given) in enumerate(zip(area, received)) if not _same(given, mine)]
    kept = [(area[i], area[i].clone()) for i in swapped if i < 4]
    run()
    for i in swapped:
        received[i].copy_(area[i])
    for mine, before in kept:
        mine.copy_(before)


def _from_combine_input(impl, expert_out, combine_input, run):
    """A combine, `run(staged)` (staged: the tensor staged into the context's combine area first, or
    None), for an op handed `combine_input`: the context's (eager) is read where it is; a copy
    torch.compile made is staged as expert_out would be, and the area gets back what it held before
    (on the device: after the combine's exit guard, once no peer reads it). With expert_out, the
    staging's effect on combine_input is the op's declared write: made in the copy too."""
    area = impl.combine_input
    if _same(combine_input, area):
        run(expert_out)
        return
    before = area.clone()
    run(expert_out if expert_out is not None else combine_input)
    if expert_out is not None:
        _stage(impl.ep, combine_input, expert_out, impl.outputs)
    area.copy_(before)


def _stage(ep, dst, src, area):
    """combine's staging copy of src into dst (bfloat16 in the receive area's shape): the valid rows
    only (expert-major: [0, expert_num_tokens[e]) of each local expert; rank-major: [0, num_rows)),
    from the counts on the device (no synchronisation), as the device's staging kernel copies."""
    rows = torch.arange(ep.rows, device=dst.device)
    if ep.expert_major:
        valid = (rows.unsqueeze(0) < area.expert_num_tokens.unsqueeze(1)).unsqueeze(-1)
    else:
        valid = (rows < area.num_rows).unsqueeze(-1)
    dst.copy_(torch.where(valid, src, dst))


def _check_tensor(t, name, op, shape, dtypes, device):
    """One tensor argument: exactly `shape`, one of `dtypes`, contiguous, on `device`."""
    if tuple(t.shape) != tuple(shape) or t.dtype not in dtypes:
        raise ValueError(f"symmem.{op}: {name} must be {list(shape)} "
                         f"{' or '.join(str(d).replace('torch.', '') for d in dtypes)}, got {list(t.shape)} "
                         f"{str(t.dtype).replace('torch.', '')}")
    if not t.is_contiguous():
        raise ValueError(f"symmem.{op}: {name} must be contiguous (shape {list(t.shape)}, strides {list(t.stride())})")
    if t.device != device:
        raise ValueError(f"symmem.{op}: {name} is on {t.device}, the context on {device}")


def _owned(t, *mine):
    """Whether t is the context's own tensor for its role (one of `mine`: eager passes them as they
    are), which needs no check. Another of its tensors in that role is checked like any other."""
    return any(t is m for m in mine)


def _check_dispatch(ep, x, x_scales, topk_idx, topk_weights, num_tokens, received):
    """Every tensor argument of a dispatch, before anything is launched. T = x.shape[0] tokens (at
    most the context's max_tokens_per_rank; 0 for an idle rank); with a device count (num_tokens)
    the tensors hold max_tokens_per_rank rows, of which the count says how many go. `received`: the
    tensors the op writes, the receive area's shapes and dtypes (Dispatched's order)."""
    op = "moe_dispatch"
    payload = _PAYLOAD_DTYPES[ep.payload]
    if x.dim() != 2 or x.shape[1] != ep.hidden or x.dtype != payload:
        raise ValueError(f"symmem.{op}: x must be [T, {ep.hidden}] {payload}, got {list(x.shape)} {x.dtype}")
    tokens = x.shape[0]
    if tokens > ep.max_tokens_per_rank:
        raise ValueError(f"symmem.{op}: x has {tokens} tokens, the context holds {ep.max_tokens_per_rank}")
    if num_tokens is not None and tokens != ep.max_tokens_per_rank:
        raise ValueError(f"symmem.{op}: with a device count (num_tokens), x and the routing hold the context's "
                         f"{ep.max_tokens_per_rank} rows (the count says how many go), got {tokens}")
    _check_tensor(x, "x", op, (tokens, ep.hidden), (payload,), ep.device)
    _check_tensor(topk_idx, "topk_idx", op, (tokens, ep.topk), (torch.int64, torch.int32), ep.device)
    _check_tensor(topk_weights, "topk_weights", op, (tokens, ep.topk), (torch.float32,), ep.device)
    if ep.payload == "float8_e4m3":
        if x_scales is None:
            raise ValueError(f"symmem.{op}: a float8 payload needs x_scales [{tokens}, "
                             f"{ep.hidden // SCALE_COLUMNS}] float32")
        _check_tensor(x_scales, "x_scales", op, (tokens, ep.hidden // SCALE_COLUMNS), (torch.float32,), ep.device)
    elif x_scales is not None:
        raise ValueError(f"symmem.{op}: x_scales is for a float8 payload; this context's is {ep.payload}")
    if num_tokens is not None:
        if num_tokens.numel() != 1 or num_tokens.dtype != torch.int32:
            raise ValueError(f"symmem.{op}: num_tokens must be a one-element int32 tensor, got "
                             f"{list(num_tokens.shape)} {num_tokens.dtype}")
        if num_tokens.device != ep.device:
            raise ValueError(f"symmem.{op}: num_tokens is on {num_tokens.device}, the context on {ep.device}")
    xs, scales, meta = ep.received_shapes()
    shapes = (xs, scales, meta, meta, (ep.local_experts,), (1,))
    counts = getattr(ep, "_counts", (None, None))
    own = [(ep._impl.outputs[i],) + ((counts[i - 4],) if i >= 4 else ()) for i in range(len(RECEIVED))]
    for name, t, shape, dtype, mine in zip(RECEIVED, received, shapes, ep.received_dtypes(), own):
        if not _owned(t, *mine):
            _check_tensor(t, name, op, shape, (dtype,), ep.device)


def _check_combine(ep, expert_out, topk_weights, combine_input, counts, out):
    """Every tensor argument of a combine, against the last dispatch's T tokens (its x.shape[0]; the
    context's max_tokens_per_rank with a device count): out [>= T, H] bfloat16, topk_weights
    [T, K] float32, expert_out and combine_input the receive area's shape in bfloat16, counts
    (expert_num_tokens, num_rows) as dispatch's; all contiguous, on the context's device."""
    op = "moe_combine"
    tokens = ep._impl.out_rows
    if out.dim() != 2 or out.shape[0] < tokens:
        raise ValueError(f"symmem.{op}: out must be [>= {tokens}, {ep.hidden}] bfloat16 (the last dispatch had "
                         f"{tokens} tokens), got {list(out.shape)} {out.dtype}")
    _check_tensor(out, "out", op, (out.shape[0], ep.hidden), (torch.bfloat16,), ep.device)
    own_counts = getattr(ep, "_counts", (None, None))
    if not _owned(combine_input, ep._impl.combine_input):
        _check_tensor(combine_input, "combine_input", op, ep.received_shapes()[0], (torch.bfloat16,), ep.device)
    if not _owned(counts[0], ep._impl.outputs.expert_num_tokens, own_counts[0]):
        _check_tensor(counts[0], "expert_num_tokens", op, (ep.local_experts,), (torch.int32,), ep.device)
    if not _owned(counts[1], ep._impl.outputs.num_rows, own_counts[1]):
        _check_tensor(counts[1], "num_rows", op, (1,), (torch.int32,), ep.device)
    if expert_out is not None:
        _check_tensor(expert_out, "expert_out", op, ep.received_shapes()[0], (torch.bfloat16,), ep.device)
    if topk_weights is not None:
        _check_tensor(topk_weights, "topk_weights", op, (tokens, ep.topk), (torch.float32,), ep.device)


class _ReferenceContext:
    """The CPU reference: every rank all-gathers every rank's tokens and routes them itself, in the
    order of include/symmem/ep.hpp; combine all-gathers the expert outputs."""

    def __init__(self, ep):
        self.ep = ep
        xs, scales, meta = ep.received_shapes()
        self.outputs = Dispatched(torch.zeros(xs, dtype=_PAYLOAD_DTYPES[ep.payload]), torch.zeros(scales),
                                  torch.full(meta, -1, dtype=torch.int32), torch.zeros(meta),
                                  torch.zeros(ep.local_experts, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        self.combine_input = torch.zeros(xs, dtype=torch.bfloat16)
        self.blocks = None  # no kernels
        self.tokens = 0
        self.out_rows = 0
        self.route = None  # this rank's pairs: list per token of (rank, row, weight index)

    def _gather(self, t):
        parts = [torch.empty_like(t) for _ in range(self.ep.world)]
        dist.all_gather(parts, t.contiguous(), group=self.ep.group)
        return parts

    def dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens, received):
        agree_on_checks(self.ep, "moe_dispatch", lambda: _check_dispatch(self.ep, x, x_scales, topk_idx, topk_weights,
                                                                       num_tokens, received))
        _into_area(self.outputs, received, lambda: self._dispatch(x, x_scales, topk_idx, topk_weights, num_tokens))

    def _dispatch(self, x, x_scales, topk_idx, topk_weights, num_tokens):
        """The device's dispatch, into self.outputs."""
        ep = self.ep
        tokens = x.shape[0] if num_tokens is None else int(num_tokens.item())
        T, K, L = ep.max_tokens_per_rank, ep.topk, ep.local_experts

        def padded(t, fill):
            full = torch.full((T, *t.shape[1:]), fill, dtype=t.dtype)
            full[:t.shape[0]] = t
            return full

        counts = self._gather(torch.tensor([tokens], dtype=torch.int64))
        ids = self._gather(padded(topk_idx.to(torch.int64), -1))
        weights = self._gather(padded(topk_weights, 0.0))
        xs = self._gather(padded(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x, 0))
        scales = self._gather(padded(x_scales, 0.0)) if x_scales is not None else None
        n = [int(c.item()) for c in counts]
        for s in range(ep.world):  # the verdict, senders first
            if n[s] > T:
                raise errors.SymmemError(_native.ErrorCode.kCapacity,
                                         f"rank {s} passed {n[s]} tokens, but its context holds {T} per rank")
            bad = ids[s][:n[s]] >= ep.num_experts
            if bool(bad.any()):
                raise errors.SymmemError(_native.ErrorCode.kCapacity,
                                         f"rank {s} routed a token to expert {int(ids[s][:n[s]][bad][0])}, "
                                         f"outside the context's {ep.num_experts} experts")
        rows = {}  # (q, bin) -> list of (s, t, k)
        route = []
        for s in range(ep.world):
            for t in range(n[s]):
                ranks = []
                for k in range(K):
                    e = int(ids[s][t, k])
                    if e < 0:
                        continue
                    q = e // L
                    if ep.expert_major:
                        rows.setdefault((q, e % L), []).append((s, t, k))
                    elif q not in ranks:
                        ranks.append(q)
                if not ep.expert_major:
                    for q in sorted(ranks):
                        rows.setdefault((q, 0), []).append((s, t, -1))
        for (q, b), lst in sorted(rows.items()):
            if len(lst) > ep.rows:
                what = f"expert {q * L + b} of rank {q}" if ep.expert_major else f"rank {q}"
                raise errors.SymmemError(_native.ErrorCode.kCapacity,
                                         f"{what} would receive {len(lst)} rows, but its buffer holds {ep.rows}")
        out = self.outputs
        out.expert_num_tokens.zero_()
        if not ep.expert_major:
            out.topk_idx.fill_(-1)
        me = ep.rank
        received = 0
        for (q, b), lst in sorted(rows.items()):
            for i, (s, t, k) in enumerate(lst):
                if s == me:
                    route.append((t, k, q, b * ep.rows + i if ep.expert_major else i))
                if q != me:
                    continue
                dst = out.x[b, i] if ep.expert_major else out.x[i]
                dst.view(torch.uint8 if x.dtype == torch.float8_e4m3fn else dst.dtype).copy_(xs[s][t])
                if scales is not None:
                    (out.x_scales[b, i] if ep.expert_major else out.x_scales[i]).copy_(scales[s][t])
                if not ep.expert_major:
                    for kk in range(K):
                        e = int(ids[s][t, kk])
                        out.topk_idx[i, kk] = e % L if e >= 0 and e // L == me else -1
                        out.topk_weights[i, kk] = weights[s][t, kk]
                received += 1
        for k2 in range(L):
            out.expert_num_tokens[k2] = sum(1 for s in range(ep.world) for t in range(n[s])
                                            for kk in range(K) if int(ids[s][t, kk]) == me * L + k2)
        out.num_rows[0] = received
        self.tokens = n[me]
        self.out_rows = x.shape[0]
        self.route = route
        self.weights = weights[me].clone()

    def combine(self, expert_out, topk_weights, weights_applied, combine_input, counts, out):
        ep = self.ep
        agree_on_checks(ep, "moe_combine", lambda: _check_combine(ep, expert_out, topk_weights, combine_input,
                                                                     counts, out))
        _from_combine_input(self, expert_out, combine_input,
                            lambda staged: self._combine(staged, topk_weights, weights_applied, out))

    def _combine(self, staged, topk_weights, weights_applied, out):
        """The device's combine: the valid rows of `staged` (if any) into the combine area first,
        which the peers read."""
        ep = self.ep
        if staged is not None:
            _stage(ep, self.combine_input, staged, self.outputs)
        outputs = self._gather(self.combine_input)
        weights = topk_weights if topk_weights is not None else self.weights
        acc = torch.zeros((self.tokens, ep.hidden), dtype=torch.float32)
        # In top-k order (expert-major) or rank order (rank-major): the route is sorted so.
        order = sorted(self.route, key=lambda r: (r[0], r[1] if ep.expert_major else r[2]))
        for t, k, q, row in order:
            rows = outputs[q].view(-1, ep.hidden)
            v = rows[row].float()
            w = 1.0 if (not ep.expert_major or weights_applied) else float(weights[t, k])
            acc[t] += w * v
        out[:self.tokens] = acc.to(torch.bfloat16)

    def describe(self):
        return f"reference moe ({self.ep.layout}, {self.ep.payload}) over torch.distributed"

    def close(self):
        pass


# Kernels ------------------------------------------------------------------------------------

def _context(context):
    ep = _contexts.get(int(context))
    if ep is None:
        raise errors.SymmemError(_native.ErrorCode.kInvalidArgument, f"symmem: no open ExpertParallel context "
                                 f"{context} (it was closed, or never made)")
    return ep


def _serving(context):
    """The open context `context`, if its group is alive: a call on a group torch.distributed no
    longer knows is refused (SymmemError, a DistBackendError, as every entry point refuses it:
    groups.state_of), as is one on a communicator that was closed (close_all, the group made again).
    Both are the same on every rank. (The fake kernels take the context as it is.)"""
    ep = _context(context)
    state_of(ep.group)
    if not ep.cpu:
        ep._impl.comm._ensure_open()
    return ep


def _dispatch_kernel(x, x_scales, topk_idx, topk_weights, num_tokens, context, **received):
    _serving(context)._impl.dispatch(x, x_scales, topk_idx, topk_weights, num_tokens,
                                     Dispatched(*(received[name] for name in RECEIVED)))


def _combine_kernel(expert_out, topk_weights, context, weights_applied, *, combine_input, expert_num_tokens,
                    num_rows, out):
    _serving(context)._impl.combine(expert_out, topk_weights, weights_applied, combine_input,
                                    (expert_num_tokens, num_rows), out)


for _key in ("CUDA", "CPU"):
    _lib.impl("moe_dispatch", _dispatch_kernel, _key)
    _lib.impl("moe_combine", _combine_kernel, _key)


@torch.library.register_fake("symmem::moe_dispatch", lib=_lib)
def _dispatch_fake(x, x_scales, topk_idx, topk_weights, num_tokens, context, **received):
    return None


@torch.library.register_fake("symmem::moe_combine", lib=_lib)
def _combine_fake(expert_out, topk_weights, context, weights_applied, *, combine_input, expert_num_tokens,
                  num_rows, out):
    return None
