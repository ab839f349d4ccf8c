"""symmem.triton's helpers and examples under Triton's interpreter, each rank a process over shared
memory laid out as symmem's heap and host board (triton_interpreter_ranks.py): the barrier across
calls, a rank one call ahead, a mismatched call, a rank that never comes, signals and put-with-signal,
and the examples' data paths against exact references. What it cannot show (NVLink ordering, the
PTX) is for test_triton_ptx.py and the GPU script."""
import pytest

pytest.importorskip("triton", reason="symmem.triton needs Triton (pip install triton==3.6.0)")
pytest.importorskip("torch", reason="the interpreted ranks hold their data in torch tensors")

from triton_interpreter_ranks import USER_OP, run_ranks  # noqa: E402

SIGNATURE = 0x5EED1234
TIMEOUT, MISMATCH, ABORTED = 1, 2, 3


def exchanged(rank, world, call, program):
    """What exchange_kernel's program reads from every rank at call `call` (epochs count from 1)."""
    return [p * 1000 + call * 10 + program for p in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_barrier_orders_every_call_and_program(world):
    out = run_ranks(world, "barrier_epochs", 3)
    for rank, result in out.items():
        assert result["record"]["code"] == 0 and not result["aborted"], result["record"]
        for call, values in enumerate(result["results"], start=1):
            for program in range(2):
                assert values[program * world:(program + 1) * world] == exchanged(rank, world, call, program)
                assert values[64 + program] == 1  # both barriers passed


def test_a_peer_one_call_ahead_is_accepted():
    out = run_ranks(2, "one_ahead")
    assert out[0]["seen_before_call_1"] == 2, "rank 1 was not one call ahead when rank 0 waited"
    for rank in (0, 1):
        assert out[rank]["oks"][1:3] == [1, 1], (rank, out[rank])
        assert out[rank]["record"]["code"] == 0


def test_a_mismatched_call_fails_on_both_ranks_naming_the_other():
    out = run_ranks(2, "mismatch")
    for rank in (0, 1):
        record = out[rank]["record"]
        assert record["code"] == MISMATCH and record["op"] == USER_OP and record["rank"] == rank
        assert record["peer"] == 1 - rank
        assert record["signature"] == SIGNATURE + rank and record["peer_signature"] == SIGNATURE + 1 - rank
        assert out[rank]["aborted"]
        assert out[rank]["results"][0][64:66] == [0, 0]  # the kernel reported failure and skipped its work


def test_a_rank_that_never_comes_is_named_in_time():
    out = run_ranks(3, "never_comes", timeout_ms=1000, skip=(2,))
    codes = {rank: result["record"]["code"] for rank, result in out.items()}
    assert set(codes.values()) <= {TIMEOUT, ABORTED} and TIMEOUT in codes.values(), out
    for rank, result in out.items():
        record = result["record"]
        if record["code"] == TIMEOUT:
            assert record["peer"] == 2 and record["rank"] == rank and record["phase"] == 0
        assert result["aborted"]
        # The deadline, plus the interpreter's slow spins: 8 s alone, 12 s beside a build on 2 cores.
        assert result["seconds"] < 1.0 + 20.0
        assert result["results"][0][64:66] == [0, 0]


def test_put_with_signal_delivers_and_an_unsignalled_wait_times_out():
    out = run_ranks(2, "signals", 10, timeout_ms=1000)  # the unsignalled wait must time out
    received = out[1]["out"]
    assert received[:10] == [i + 0.5 for i in range(10)]
    assert received[64] == 1.0  # the signal came
    assert received[65] == 0.0  # pad word 1 never did
    record = out[1]["record"]
    assert record["code"] == TIMEOUT and record["peer"] == 0 and record["phase"] == 9
    assert out[0]["record"]["code"] == 0


@pytest.mark.parametrize("world, dtype, n, programs", [(3, "float32", 200, 2), (2, "float16", 100, 1),
                                                       (2, "int32", 130, 3)])
def test_one_shot_all_reduce_example_is_exact(world, dtype, n, programs):
    out = run_ranks(world, "example_all_reduce", dtype, n, programs, 2)
    for rank, result in out.items():
        assert result["wrong"] == [0, 0], (rank, result)
        assert result["record"]["code"] == 0


@pytest.mark.parametrize("mode", ["pull", "push"])
@pytest.mark.parametrize("through_table", [False, True], ids=["stride", "table"])
def test_all_gather_example_is_exact(mode, through_table):
    out = run_ranks(3, "example_all_gather", mode, 70, 2, 2, through_table)
    for rank, result in out.items():
        assert result["wrong"] == [0, 0], (rank, result)
        assert result["record"]["code"] == 0


@pytest.mark.parametrize("shard_rows, piece_rows", [(40, 16), (32, 32), (24, 8)])
def test_fused_example_waits_for_the_pieces_of_each_tile(shard_rows, piece_rows):
    # Tiles of 16 rows cross pieces and (40, 24) shards: each waits for exactly the pieces it reads.
    pieces = -(-shard_rows // piece_rows)
    result = run_ranks(1, "fused_pieces", shard_rows, piece_rows, pieces)[0]
    assert result["error"] < 1e-3, result
    assert result["record"]["code"] == 0


def test_fused_example_names_the_peer_whose_piece_never_came():
    result = run_ranks(1, "fused_pieces", 40, 16, 1, timeout_ms=500)[0]
    record = result["record"]
    assert record["code"] == TIMEOUT and record["peer"] == 1 and record["phase"] == 1, record
    assert result["error"] < 1e-3  # the rows that did arrive were computed
