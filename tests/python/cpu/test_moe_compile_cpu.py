"""ExpertParallel under torch.compile, on the CPU reference (gloo, one rank): the ops tell torch
what they read and write (dispatch writes the receive area, combine reads and may stage into
combine_input), so a compiled step gives eager's result whatever order the compiler picks; and
combine() allocates the [T, H] it documents."""
import pytest

torch = pytest.importorskip("torch")

T, K, H, E = 4, 2, 128, 4
IDS = [[0, 1], [2, -1], [3, 1], [1, 0]]
BACKENDS = ["aot_eager", "inductor"]


@pytest.fixture
def ep(group_name):
    from symmem.torch.moe import ExpertParallel
    context = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=8, layout="rank_major")
    yield context
    context.close()


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g).to(torch.bfloat16), torch.tensor(IDS), torch.rand(T, K, generator=g)


def _compiled(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_of_one_dispatch_is_not_moved_past_the_next(ep, backend):
    # r1.x is the receive area, which the second dispatch rewrites: t1 must be computed before it,
    # as eager does (a compiler that took the outputs for fresh tensors returned b * 5).
    a, ids, w = _inputs(1)
    b, _, _ = _inputs(2)

    def step(a, b, ids, w):
        r1 = ep.dispatch(a, ids, w)
        t1 = r1.x[:T].float() * 2 + r1.expert_num_tokens.sum()  # the counts too
        r2 = ep.dispatch(b, torch.cat([ids[:, :1], -torch.ones_like(ids[:, :1])], 1), w)  # top-1
        return t1 + r2.x[:T].float() * 3 + r2.expert_num_tokens.sum() * 10

    expected = step(a, b, ids, w)
    assert torch.equal(expected, a.float() * 2 + 7 + b.float() * 3 + 40)
    got = _compiled(step, backend)(a, b, ids, w)
    assert torch.equal(got, expected)
    # The area holds the last dispatch's rows afterwards, as in eager.
    assert torch.equal(ep._impl.outputs.x[:T], b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_after_the_next_dispatch_sees_it_as_in_eager(ep, backend):
    # The other side of the same truth: dispatch's tensors are the area, not a snapshot.
    a, ids, w = _inputs(3)
    b, _, _ = _inputs(4)

    def step(a, b, ids, w):
        r1 = ep.dispatch(a, ids, w)
        ep.dispatch(b, ids, w)
        return r1.x[:T].float() * 1

    expected = step(a, b, ids, w)
    assert torch.equal(expected, b.float())
    assert torch.equal(_compiled(step, backend)(a, b, ids, w), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_into_combine_input_reaches_the_combine(ep, backend):
    # The experts write combine_input, combine reads it: the write must come first (a combine
    # that read it implicitly was handed the old zeros).
    x, ids, w = _inputs(5)

    def step(x, ids, w):
        r = ep.dispatch(x, ids, w)
        ep.combine_input.copy_(r.x * 2)
        out = torch.zeros(T, H, dtype=torch.bfloat16)
        ep.combine(out=out)
        first = out.clone()
        ep.combine_input.copy_(r.x * 3)  # rewritten right after a combine, then combined again
        ep.combine(out=out)
        return first, out

    ep.combine_input.zero_()
    expected = [t.clone() for t in step(x, ids, w)]
    assert torch.equal(expected[0], (x.float() * 2).to(torch.bfloat16))
    assert torch.equal(expected[1], (x.float() * 3).to(torch.bfloat16))
    ep.combine_input.zero_()
    got = _compiled(step, backend)(x, ids, w)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert torch.equal(ep.combine_input[:T], (x.float() * 3).to(torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_combine_of_expert_outputs_stages_them_into_combine_input(ep, backend):
    # combine(expert_out=...) copies the valid rows into combine_input (the device's staging copy):
    # a read of combine_input afterwards sees them, compiled as eager; rows past the count stay.
    x, ids, w = _inputs(6)

    def step(x, ids, w):
        r = ep.dispatch(x, ids, w)
        ep.combine_input.fill_(7)
        y = ep.combine(expert_out=(r.x * 2).contiguous())
        return y, ep.combine_input * 1

    expected = [t.clone() for t in step(x, ids, w)]
    assert torch.equal(expected[0], (x.float() * 2).to(torch.bfloat16))
    assert torch.equal(expected[1][:T], expected[0]) and bool((expected[1][T:] == 7).all())
    ep.combine_input.zero_()
    got = _compiled(step, backend)(x, ids, w)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


@pytest.mark.parametrize("tokens", [2, 0])
def test_combine_without_out_returns_the_last_dispatchs_tokens(ep, tokens):
    x = torch.randn(tokens, H).to(torch.bfloat16)
    r = ep.dispatch(x, torch.zeros(tokens, K, dtype=torch.int64), torch.ones(tokens, K))
    ep.combine_input.copy_(r.x)
    y = ep.combine()
    assert tuple(y.shape) == (tokens, H) and y.dtype == torch.bfloat16
    assert torch.equal(y, x)


def test_combine_without_out_under_compile(ep):
    x, ids, w = _inputs(7)

    def step(x, ids, w):
        r = ep.dispatch(x[:3], ids[:3], w[:3])
        ep.combine_input.copy_(r.x)
        return ep.combine()

    expected = step(x, ids, w)
    assert tuple(expected.shape) == (3, H)
    assert torch.equal(_compiled(step, "aot_eager")(x, ids, w), expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_two_rounds_in_one_graph_keep_their_order(group_name, backend, layout):
    # Each combine sums the routes of its own dispatch: the context's calls stay in program order.
    from symmem.torch.moe import ExpertParallel
    ep = ExpertParallel(num_experts=E, topk=K, hidden=H, max_tokens_per_rank=8, layout=layout)
    a, ids, w = _inputs(8)
    b, _, v = _inputs(9)
    other = torch.tensor([[3, 2], [0, -1], [1, 2], [2, 0]])

    def experts(r):
        ep.combine_input.copy_(r.x)
        if layout == "rank_major":  # rows: reduce over their local experts, weighted
            used = (r.topk_idx >= 0).float() * r.topk_weights
            ep.combine_input.copy_((r.x.float() * used.sum(1, keepdim=True)).to(torch.bfloat16))

    def step(a, b, ids, other, w, v):
        experts(ep.dispatch(a, ids, w))
        y1 = ep.combine()
        experts(ep.dispatch(b, other, v))
        return y1, ep.combine()

    try:
        expected = [t.clone() for t in step(a, b, ids, other, w, v)]
        for got, x, i, g in zip(expected, (a, b), (ids, other), (w, v)):  # sum of the weights, times x
            assert torch.allclose(got.float(), x.float() * (g * (i >= 0)).sum(1, keepdim=True), atol=0.05)
        got = _compiled(step, backend)(a, b, ids, other, w, v)
        assert all(torch.equal(g, e) for g, e in zip(got, expected))
    finally:
        ep.close()


def test_eager_calls_hand_out_the_context_memory_itself(ep):
    # No copy in eager mode: dispatch returns the receive area and the counts, the same tensors
    # every call, and combine reads combine_input where it is.
    a, ids, w = _inputs(10)
    r1 = ep.dispatch(a, ids, w)
    r2 = ep.dispatch(a, ids, w)
    assert all(t1 is t2 is mine for t1, t2, mine in zip(r1, r2, ep._impl.outputs))
    ep.combine_input.copy_(r2.x)
    before = ep.combine_input.data_ptr()
    assert torch.equal(ep.combine(), a) and ep.combine_input.data_ptr() == before


def test_a_compiled_step_compiles_once(ep):
    # Nothing a dispatch or combine changes on the host may be guarded in the graph: a counter of
    # dispatches, bumped inside it, recompiled the step on every call until dynamo gave up.
    a, ids, w = _inputs(7)

    def step(a, ids, w):
        r = ep.dispatch(a, ids, w)
        return ep.combine(expert_out=r.x.to(torch.bfloat16))

    compiled = _compiled(step, "aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(4):
            compiled(a, ids, w)


def test_a_context_tensor_in_another_role_is_checked(ep):
    # Only a context's own tensor in its own role skips the checks (eager passes them so): another
    # of its tensors as combine_input (float32 weights here; an fp8 receive area on a GPU, read as
    # bfloat16 past its end) is refused like any wrong tensor.
    a, ids, w = _inputs(8)
    received = ep.dispatch(a, ids, w)
    with pytest.raises(Exception, match="combine_input"):
        torch.ops.symmem.moe_combine(None, None, ep.id, False, combine_input=received.topk_weights,
                                     expert_num_tokens=received.expert_num_tokens, num_rows=received.num_rows,
                                     out=torch.empty(T, H, dtype=torch.bfloat16))
