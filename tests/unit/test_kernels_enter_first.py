"""Every SM kernel of symmem begins with device::enter_kernel() (device/dependent_launch.cuh):
kernels are launched with programmatic dependent launch, so a kernel that touched global memory
before that wait could read what the previous kernel on its stream has not finished writing.

    python3 tests/unit/test_kernels_enter_first.py REPO_ROOT
"""
import pathlib
import re
import sys

KERNEL = re.compile(r"__global__\s+void[^{;]*\{\s*(?P<first>[^;]*;)", re.S)


def main(root):
    kernels, wrong = 0, []
    for path in sorted(pathlib.Path(root, "src").rglob("*.cu")):
        for m in KERNEL.finditer(path.read_text()):
            kernels += 1
            if m.group("first").strip() != "device::enter_kernel();":
                line = path.read_text().count("\n", 0, m.start()) + 1
                wrong.append(f"{path}:{line}: first statement is {m.group('first').strip()!r}")
    if kernels == 0:
        print("no kernels found: the pattern no longer matches the sources", file=sys.stderr)
        return 1
    for w in wrong:
        print(w, file=sys.stderr)
    print(f"{kernels} kernels, {len(wrong)} without enter_kernel() first")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
