"""Where the package finds the shared libraries it ships (libsymmem_capi.so, libsymmem_nccl.so)."""
import os


def locate(name, variable, error):
    """The path of library `name`: the environment variable `variable` when set, else `name`
    installed beside this package, else in a source tree's build/; else raises `error` (an
    exception type) saying where it looked."""
    explicit = os.environ.get(variable)
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, name), os.path.join(here, "..", "..", "build", name)):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    raise error(f"symmem: {name} not found beside {here} nor in the source tree's build/; "
                f"install the package (pip install .) or set {variable}")
