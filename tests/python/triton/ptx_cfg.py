"""A control-flow graph of one PTX kernel (as Triton emits it), enough to ask questions of its loops:
basic blocks split at labels and after branches, edges for branches and fall-through, loops as the
strongly connected components that cycle."""
import re

_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"^(@!?%p\w+\s+)?bra(?:\.uni)?\s+(\$L__\w+);")


class Block:
    def __init__(self, name):
        self.name = name
        self.lines = []
        self.successors = []

    @property
    def text(self):
        return "\n".join(self.lines)


def kernel_body(ptx):
    """The instruction lines of the .entry function (comments and blank lines dropped)."""
    start = ptx.index(".entry")
    body = ptx[ptx.index("{", start) + 1:ptx.rindex("}")]
    lines = []
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def blocks(ptx):
    result, current = [], Block("entry")
    result.append(current)
    for line in kernel_body(ptx):
        label = _LABEL.match(line)
        if label:
            current = Block(label.group(1))
            result.append(current)
            continue
        current.lines.append(line)
        if _BRANCH.match(line) or line.startswith("ret;"):
            current = Block(f"after_{len(result)}")
            result.append(current)
    by_name = {b.name: b for b in result}
    for i, b in enumerate(result):
        last = b.lines[-1] if b.lines else ""
        branch = _BRANCH.match(last)
        if branch:
            b.successors.append(by_name[branch.group(2)])
        ends = last.startswith("ret;") or (branch is not None and branch.group(1) is None)
        if not ends and i + 1 < len(result):
            b.successors.append(result[i + 1])
    return result


def loops(ptx):
    """Each loop of the kernel as the list of its blocks (Tarjan's strongly connected components)."""
    graph = blocks(ptx)
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in v.successors:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w is v:
                    break
            if len(component) > 1 or v in v.successors:
                found.append(component)

    import sys
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def reaches_without(ptx, start_pattern, target_pattern, barrier_pattern):
    """Lines matching target_pattern that some path from a line matching start_pattern reaches
    without passing a line matching barrier_pattern (each as a regex)."""
    graph = blocks(ptx)
    start, target, barrier = re.compile(start_pattern), re.compile(target_pattern), re.compile(barrier_pattern)
    reached, seen, work = [], set(), []
    for b in graph:
        for i, line in enumerate(b.lines):
            if start.search(line):
                work.append((b, i + 1))
    while work:
        b, i = work.pop()
        if (b.name, i) in seen:
            continue
        seen.add((b.name, i))
        stopped = False
        for line in b.lines[i:]:
            if barrier.search(line):
                stopped = True
                break
            if target.search(line):
                reached.append(line)
                stopped = True
                break
        if not stopped:
            work.extend((s, 0) for s in b.successors)
    return reached


def polling_loop_problems(ptx):
    """What is wrong with the kernel's polling loops: one without the clock, or one polling a flag
    without the abort word. Also says when no polling loop was found at all."""
    problems, polling = [], 0
    for loop in loops(ptx):
        text = "\n".join(b.text for b in loop)
        polls_flag = "ld.acquire.sys" in text
        polls_host = "ld.volatile" in text
        if not (polls_flag or polls_host):
            continue
        polling += 1
        if "%globaltimer" not in text:
            problems.append(f"a polling loop ({loop[0].name}) never reads %globaltimer")
        if polls_flag and not polls_host:
            problems.append(f"a loop polling a flag ({loop[0].name}) never reads the abort word")
    if polling == 0:
        problems.append("no polling loop found")
    return problems
