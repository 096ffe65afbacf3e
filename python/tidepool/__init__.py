"""tidepool: CUDA's stream-ordered memory allocator as an open library.

What `pip install .` puts in this package, and how to find it:

    import tidepool
    tidepool.library_path()   # libtidepool.so, as tidepool_torch loads it
    tidepool.replay_path()    # the tidepool-replay program (also on PATH)
    tidepool.traces()         # the bundled allocation traces of real workloads

PyTorch's allocator is the top-level module tidepool_torch:

    import tidepool_torch
    tidepool_torch.install()  # before the first CUDA tensor

`python -m tidepool [options] [TRACE...]` runs tidepool-replay (with no
arguments, on the bundled traces); see its --help.
"""

import glob
import os
import shutil
import sysconfig

__all__ = ["library_path", "replay_path", "traces", "__version__"]

_HERE = os.path.dirname(os.path.abspath(__file__))

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    try:
        __version__ = _version("tidepool")
    except PackageNotFoundError:  # run from a checkout, not installed
        __version__ = "0.1.0"
except ImportError:  # Python < 3.8
    __version__ = "0.1.0"


def library_path():
    """The path of this package's libtidepool.so, or None when the package
    was not built (imported from a checkout)."""
    p = os.path.join(_HERE, "libtidepool.so")
    return p if os.path.isfile(p) else None


def replay_path():
    """The path of the tidepool-replay program the wheel installed: in the
    scripts directory of this interpreter's scheme (a virtualenv's bin, or
    ~/.local/bin for --user), else on PATH, else the build directory of a
    checkout. $TIDEPOOL_REPLAY overrides. Raises FileNotFoundError listing
    what was tried."""
    explicit = os.environ.get("TIDEPOOL_REPLAY")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"tidepool: TIDEPOOL_REPLAY names no program: {explicit}")
        return explicit
    tried = []
    schemes = [None] + [s for s in ("posix_user", "posix_prefix")
                        if s in sysconfig.get_scheme_names()]
    for scheme in schemes:
        try:
            scripts = (sysconfig.get_path("scripts") if scheme is None
                       else sysconfig.get_path("scripts", scheme))
        except KeyError:
            continue
        tried.append(os.path.join(scripts, "tidepool-replay"))
    which = shutil.which("tidepool-replay")
    if which:
        tried.append(which)
    # A checkout: python/tidepool -> <repo>/build/tidepool-replay.
    tried.append(os.path.normpath(os.path.join(_HERE, "..", "..", "build",
                                               "tidepool-replay")))
    for p in tried:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError("tidepool: tidepool-replay not found; install the "
                            "package (pip install .) or build the tree. Tried:\n  "
                            + "\n  ".join(tried))


def traces():
    """The bundled traces (traces/*.csv.gz of the source tree), sorted: the
    package's copies, or a checkout's own when imported from python/."""
    for d in (os.path.join(_HERE, "traces"),
              os.path.normpath(os.path.join(_HERE, "..", "..", "traces"))):
        found = sorted(glob.glob(os.path.join(d, "*.csv.gz")))
        if found:
            return found
    return []
