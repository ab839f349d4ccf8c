"""A killed rank under PyTorch through libsymmem_nccl.so: every survivor must raise in time, then
end cleanly, never crash or hang.

Starts WORLD processes itself (not torchrun, whose agent would stop the survivors as soon as a
worker dies), each running dist.all_reduce in a loop on a ProcessGroupNCCL with the shim preloaded
and every call served by symmem (SYMMEM_NCCL=all). The last rank kills itself with SIGKILL midway.
Each survivor must raise an error naming the cause (from the next call, or from PyTorch's watchdog
after ncclCommGetAsyncError reported the device's timeout) within the shim's deadline plus a margin,
and then end cleanly:
- a watchdog that saw the failure ends the process once its flight-recorder dump wait has passed
  (4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC): its tear-down message, then SIGABRT. So the survivor
  stays alive, as a program that catches the error does. One that exited at once would race that
  dump against the interpreter's finalization: in PyTorch 2.11 a SIGSEGV in torch::symbolize
  (tests/torch_kill_exit_at_once_2_ranks.log in bench/results/h200x2);
- where the call raised before the watchdog saw the failure, the survivor closes its process group
  (which may raise ncclRemoteError, NCCL's own communicator having seen the dead peer) and exits.

  python3 tests/nccl/torch_kill.py --shim build/libsymmem_nccl.so [--world 2] [--timeout-ms 15000]
      [--pause-s 3] [--abort]

--pause-s: each survivor pauses that long after its first call that found the dead rank, so that
PyTorch's watchdog (which polls ncclCommGetAsyncError holding the communicator's lock that the
program's next call takes, and a call only until it completes) must report the failure before the
program's next call makes it raise; its report, and its ending the process, are required.
--abort: the watchdog aborts the communicators before it ends the process
(TORCH_NCCL_ASYNC_ERROR_HANDLING=1, else PyTorch's default 3): the shim's ncclCommAbort must return
success with a rank dead (PyTorch throws before its tear-down message otherwise).

Exit 0 when every survivor raised in time and ended cleanly, 1 otherwise (the survivors'
output is printed).
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

WORKER = r"""
import os, signal, sys, time, torch, torch.distributed as dist
from datetime import timedelta
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank), timeout=timedelta(seconds=600))
x = torch.ones(1 << 16, device="cuda")
start = None
for i in range(1000000):
    if i == 200:
        if rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.time()
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if i == 200:
            time.sleep(float(os.environ["KILL_TEST_PAUSE_S"]))
    except Exception as e:  # the survivor's outcome
        one_line = str(e).replace("\n", " | ")
        print(f"RAISED after {time.time() - (start or time.time()):.1f} s: {type(e).__name__}: {one_line}", flush=True)
        # A watchdog that saw the failure ends the process (SIGABRT) within this pause; one that did
        # not (the call raised first) leaves the program to close the group.
        time.sleep(float(os.environ["KILL_TEST_LINGER_S"]))
        try:
            dist.destroy_process_group()
            print("CLOSED the group", flush=True)
        except Exception as e:  # NCCL's own communicator may have seen the dead peer too
            print(f"CLOSED the group, which raised {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
            if "remote process exited" not in str(e):
                print("CLOSING FAILED otherwise", flush=True)
        sys.exit(3)
    x.fill_(1.0)
print("the loop ended without an error", flush=True)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shim", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--timeout-ms", type=int, default=15000)
    p.add_argument("--margin-s", type=float, default=45.0, help="beyond the deadline, for the error to surface")
    p.add_argument("--pause-s", type=float, default=0.0,
                   help="a survivor's pause after its first call that found the dead rank (the watchdog first)")
    p.add_argument("--abort", action="store_true", help="the watchdog aborts the communicators first")
    p.add_argument("--dump-wait-ms", type=int, default=2000,
                   help="PyTorch's flight-recorder dump timeout: its watchdog waits four of them, then ends the process")
    args = p.parse_args()
    watchdog_s = 4 * args.dump_wait_ms / 1000.0
    if args.pause_s > 0 and watchdog_s < args.pause_s + 1:
        p.error("--dump-wait-ms: the watchdog's wait (4 of them) must outlast the pause by a second, "
                "or the process may end before the program's next call")
    # TORCH_CPP_LOG_LEVEL: PyTorch's error lines, which the check reads, whatever the caller set.
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="WARNING",
               LD_PRELOAD=os.path.realpath(args.shim), SYMMEM_NCCL="all",
               SYMMEM_NCCL_TIMEOUT_MS=str(args.timeout_ms), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.world), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               KILL_TEST_PAUSE_S=str(args.pause_s), TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=str(args.dump_wait_ms),
               TORCH_NCCL_ASYNC_ERROR_HANDLING="1" if args.abort else "3")
    limit_s = args.timeout_ms / 1000.0 + args.pause_s + args.margin_s
    # With --pause-s only the watchdog may end a survivor: it lingers past the deadline, which
    # catches a watchdog that never does.
    linger_s = watchdog_s + 15
    env["KILL_TEST_LINGER_S"] = str(linger_s if args.pause_s == 0 else 3600)
    procs = []
    for r in range(args.world):
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        killed = procs[-1]
        killed.wait(timeout=600)
        t_killed = time.time()
        deadline = t_killed + limit_s + linger_s + 30
        ok = killed.returncode == -signal.SIGKILL
        print(f"rank {args.world - 1}: exit {killed.returncode} (expected -9, SIGKILL)")
        for r, proc in enumerate(procs[:-1]):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
                elapsed = time.time() - t_killed
                # The program's own error names symmem's cause and the dead rank (the watchdog's log says
                # so too, which is not what is checked here).
                raised_lines = [l for l in out.splitlines() if l.startswith("RAISED after ")]
                raised_after = [float(l.split()[2]) for l in raised_lines]
                raised = (bool(raised_lines) and raised_after[0] <= limit_s and "ncclRemoteError" in raised_lines[0]
                          and "symmem" in raised_lines[0] and f"rank {args.world - 1}" in raised_lines[0])
                # PyTorch's watchdog ends a process whose collective it saw fail: its tear-down message
                # (printed once the abort, if asked, returned), then SIGABRT. Where the call raised first,
                # the program closes the group and exits. Never a crash of another kind (a heap
                # corruption's abort too is SIGABRT), never a hang.
                heap_error = re.search(r"\w+\(\): (invalid|corrupted|unaligned|memory corruption)"
                                       r"|double free or corruption", out)
                by_watchdog = (proc.returncode == -signal.SIGABRT and "we are taking the entire process down" in out
                               and "watchdog thread terminated with exception" in out and not heap_error)
                closed = (proc.returncode == 3 and "CLOSED the group" in out and "CLOSING FAILED" not in out)
                ended = by_watchdog or (args.pause_s == 0 and closed)
                print(f"rank {r}: exit {proc.returncode} {elapsed:.1f} s after the kill "
                      f"({'raised' if raised else 'DID NOT RAISE'} in {raised_after[0] if raised_after else '-'} s; "
                      f"{'ended by the watchdog' if by_watchdog else 'closed its group' if ended else 'NOT ENDED CLEANLY'}"
                      ")")
                lines = [l for l in out.splitlines()
                         if "RAISED" in l or "symmem" in l or "Error" in l or "CLOSED" in l or "process down" in l]
                print("\n".join("    " + l[:400] for l in lines[-6:]))
                ok = ok and raised and ended
                if args.pause_s > 0:
                    # The watchdog polls a call only until it completes: the poll that first sees the
                    # failure must report it (PyTorch 2.11's log line, or its exception's origin).
                    reported = "failure detected by watchdog" in out or "checkForNCCLErrorsInternal" in out
                    print(f"rank {r}: the watchdog {'reported' if reported else 'DID NOT REPORT'} the failure")
                    ok = ok and reported
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                print(f"rank {r}: STILL RUNNING {deadline - t_killed:.0f} s after the kill (hang)")
                print("\n".join("    " + l[:400] for l in out.splitlines()[-10:]))
                ok = False
    finally:  # a check that failed midway leaves no survivor holding its GPU
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    print("every survivor raised in time and ended cleanly" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
