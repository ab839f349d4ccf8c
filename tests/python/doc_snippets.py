"""Runs the Python blocks of a markdown page in order, as one program (for the docs' tests)."""
import re
import sys


def blocks(path):
    return re.findall(r"```python\n(.*?)```", open(path).read(), flags=re.S)


if __name__ == "__main__":
    code = "\n".join(blocks(sys.argv[1]))
    exec(compile(code, sys.argv[1], "exec"), {"__name__": "__doc_snippets__"})
    print("snippets ok")
