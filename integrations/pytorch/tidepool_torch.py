"""tidepool as PyTorch's CUDA allocator.

    import tidepool_torch
    tidepool_torch.install()          # before anything allocates on the GPU
    x = torch.randn(1024, 1024, device="cuda")
    print(tidepool_torch.stats())     # reserved/used bytes, current and peak

install() loads libtidepool.so and hands PyTorch its tp_torch_alloc and
tp_torch_free through torch.cuda.memory.CUDAPluggableAllocator, with the
hooks for Tensor.record_stream, torch.cuda.empty_cache and CUDA graph
captures where PyTorch offers them. PyTorch's own memory statistics
(torch.cuda.memory_allocated and friends) do not work with a pluggable
allocator; stats(), reset_peaks() and trim() read and manage the tidepool
pool instead. See README.md next to this file.
"""

import ctypes
import ctypes.util
import os
import sys
import warnings

__all__ = [
    "find_library",
    "install",
    "installed",
    "library_path",
    "stats",
    "reset_peaks",
    "trim",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_lib = None  # the ctypes handle, once loaded
_lib_path = None
_installed = False


def find_library(path=None):
    """The path of libtidepool.so that install() would load.

    In order: the argument, $TIDEPOOL_LIB (either must exist when given),
    the repository's build directory (when this file lives in
    <repo>/integrations/pytorch), the tidepool package that `pip install .`
    installs next to this module, this file's directory, the usual install
    prefixes, then the dynamic linker's search path. Raises
    FileNotFoundError listing what was tried.
    """
    explicit_choices = ((path, "the path given"),
                        (os.environ.get("TIDEPOOL_LIB"), "TIDEPOOL_LIB"))
    for explicit, what in explicit_choices:
        if explicit:
            if not os.path.isfile(explicit):
                raise FileNotFoundError(f"tidepool: {what} names no file: {explicit}")
            return os.path.realpath(explicit)
    repo = os.path.normpath(os.path.join(_HERE, "..", ".."))
    candidates = [os.path.join(repo, "build", "libtidepool.so")]
    # Installed from the wheel: site-packages/tidepool/libtidepool.so, in the
    # tidepool package wherever the import system finds it.
    candidates.append(os.path.join(_HERE, "tidepool", "libtidepool.so"))
    try:
        import importlib.util

        spec = importlib.util.find_spec("tidepool")
        for d in (spec.submodule_search_locations or []) if spec else []:
            candidates.append(os.path.join(d, "libtidepool.so"))
    except (ImportError, ValueError):
        pass
    candidates.append(os.path.join(_HERE, "libtidepool.so"))
    for prefix in (sys.prefix, os.path.expanduser("~/.local"), "/usr/local", "/usr"):
        for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            candidates.append(os.path.join(prefix, libdir, "libtidepool.so"))
    for c in candidates:
        if os.path.isfile(c):
            return os.path.realpath(c)
    # A bare soname ("libtidepool.so.0") that dlopen resolves by itself.
    found = ctypes.util.find_library("tidepool")
    if found:
        return found
    raise FileNotFoundError(
        "tidepool: libtidepool.so not found; build it (cmake -S . -B build && "
        "cmake --build build) or set TIDEPOOL_LIB. Tried:\n  " + "\n  ".join(candidates)
    )


def _load(path=None):
    """Loads the library once (ctypes) and declares the entry points' types."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    # PyTorch hands tidepool CUDA streams: the emulated host platform must
    # never be picked silently in a PyTorch process.
    os.environ.setdefault("TIDEPOOL_PLATFORM", "cuda")
    p = find_library(path)
    lib = ctypes.CDLL(p)
    for sym in ("tp_torch_alloc", "tp_torch_free", "tp_torch_stats"):
        if not hasattr(lib, sym):
            raise RuntimeError(f"tidepool: {p} has no {sym}: a build older than "
                               "the PyTorch entry points? Rebuild it.")
    lib.tp_platform_name.restype = ctypes.c_char_p
    lib.tp_platform_name.argtypes = []
    lib.tp_error_name.restype = ctypes.c_char_p
    lib.tp_error_name.argtypes = [ctypes.c_int]
    lib.tp_torch_stats.restype = ctypes.c_int
    lib.tp_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    lib.tp_torch_reset_peaks.restype = ctypes.c_int
    lib.tp_torch_reset_peaks.argtypes = [ctypes.c_int]
    lib.tp_torch_timing.restype = ctypes.c_int
    lib.tp_torch_timing.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    lib.tp_torch_trim.restype = ctypes.c_int
    lib.tp_torch_trim.argtypes = [ctypes.c_int, ctypes.c_size_t]
    if hasattr(lib, "tp_torch_announce_captures"):
        lib.tp_torch_announce_captures.restype = None
        lib.tp_torch_announce_captures.argtypes = []
    _lib, _lib_path = lib, p
    return lib


def _check(rc, what):
    if rc != 0:
        name = _lib.tp_error_name(rc).decode()
        raise RuntimeError(f"tidepool: {what} failed: {name}")


def install(path=None):
    """Makes tidepool PyTorch's CUDA allocator for this process.

    Must run before PyTorch initialises CUDA's allocator, that is before the
    first tensor on a GPU (torch.cuda.is_available() and device_count() are
    fine). Returns the library's path. Calling it again is a no-op.
    """
    global _installed
    if _installed:
        return _lib_path
    import torch  # imported here so that the module loads without torch

    lib = _load(path)
    platform = lib.tp_platform_name()
    if platform != b"cuda":
        raise RuntimeError(
            "tidepool: the library did not start on the cuda platform "
            f"(got {platform!r}; TIDEPOOL_PLATFORM="
            f"{os.environ.get('TIDEPOOL_PLATFORM')!r}); is a GPU visible?"
        )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _lib_path, "tp_torch_alloc", "tp_torch_free"
    )
    announced = _install_hooks(allocator, lib)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            "tidepool: install() must run before the first CUDA allocation "
            f"of the process ({e})"
        ) from e
    if announced:
        lib.tp_torch_announce_captures()
    _installed = True
    return _lib_path


# The allocator's further hooks, by the setter's name: Tensor.record_stream,
# torch.cuda.empty_cache, and the pair that CUDAGraph calls around each
# capture. Builds of PyTorch without a setter keep that behaviour of a
# pluggable allocator (record_stream and empty_cache do nothing, and every
# allocation asks the driver whether its stream captures).
_HOOKS = (
    ("set_record_stream_fn", "tp_torch_record_stream"),
    ("set_reset_fn", "tp_torch_empty_cache"),
    ("set_begin_allocate_to_pool", "tp_torch_capture_begin"),
    ("set_end_allocate_to_pool_fn", "tp_torch_capture_end"),
)


def _install_hooks(allocator, lib):
    """Sets each hook PyTorch offers; True when both capture hooks are set.
    TIDEPOOL_TORCH_HOOKS=0 sets none."""
    if os.environ.get("TIDEPOOL_TORCH_HOOKS", "1") == "0":
        return False
    target = getattr(allocator, "_allocator", None)
    installed = set()
    for setter, symbol in _HOOKS:
        if target is None or not hasattr(target, setter) or not hasattr(lib, symbol):
            continue
        try:
            getattr(target, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
        except (TypeError, RuntimeError) as e:  # a PyTorch whose setter changed
            warnings.warn(f"tidepool: {setter} refused the hook ({e}); "
                          "that behaviour stays PyTorch's default")
            continue
        installed.add(setter)
    return {"set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn"} <= installed


def installed():
    """Whether install() has made tidepool PyTorch's allocator."""
    return _installed


def library_path():
    """The loaded library's path, or None before the first use."""
    return _lib_path


def _device_index(device):
    if device is None:
        import torch

        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    import torch

    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def stats(device=None):
    """The current pool's figures for a device (default: the current one).

    A dict of bytes: reserved_current, reserved_peak (memory the pool holds
    from the GPU) and used_current, used_peak (bytes of live allocations, as
    PyTorch asked for them). The peaks run from the start of the process or
    the last reset_peaks().
    """
    lib = _load()
    out = (ctypes.c_uint64 * 4)()
    dev = _device_index(device)
    _check(lib.tp_torch_stats(dev, out), f"tp_torch_stats(device {dev})")
    keys = ("reserved_current", "reserved_peak", "used_current", "used_peak")
    return dict(zip(keys, (int(v) for v in out)))


def chunk_maps(device=None):
    """How many chunks the device's current pool has mapped and unmapped
    since it was made (TP_POOL_ATTR_CHUNK_MAPS and _UNMAPS): each costs
    driver calls (tens of microseconds on a GPU), so their growth over a
    training step is what the pool spends on moving and growing memory."""
    lib = _load()
    dev = _device_index(device)
    pool = ctypes.c_void_p()
    _check(lib.tp_device_get_mem_pool(ctypes.byref(pool), dev),
           f"tp_device_get_mem_pool(device {dev})")
    out = []
    for attr in (101, 102):  # TP_POOL_ATTR_CHUNK_MAPS, _UNMAPS
        v = ctypes.c_uint64()
        _check(lib.tp_pool_get_attribute(pool, attr, ctypes.byref(v)),
               f"tp_pool_get_attribute({attr})")
        out.append(int(v.value))
    return {"maps": out[0], "unmaps": out[1]}


def timing():
    """Host time spent in tidepool's allocation and free entry points since
    the process started, where TIDEPOOL_TORCH_TIMING=1 was set before the
    first allocation (zeros otherwise): alloc_ns, allocs, free_ns, frees."""
    lib = _load()
    out = (ctypes.c_uint64 * 4)()
    _check(lib.tp_torch_timing(out), "tp_torch_timing")
    return {"alloc_ns": int(out[0]), "allocs": int(out[1]),
            "free_ns": int(out[2]), "frees": int(out[3])}


def reset_peaks(device=None):
    """Resets both peaks of the device's pool to the current figures."""
    lib = _load()
    dev = _device_index(device)
    _check(lib.tp_torch_reset_peaks(dev), f"tp_torch_reset_peaks(device {dev})")


def trim(device=None, keep=0):
    """Waits for the device's work, then gives free memory back to the GPU
    as cudaMemPoolTrimTo does: a pool that held more than `keep` bytes keeps
    at least `keep`, in whole chunks. torch.cuda.empty_cache() does
    the same with keep 0 on every device, where install() could set its
    hook."""
    lib = _load()
    dev = _device_index(device)
    _check(lib.tp_torch_trim(dev, keep), f"tp_torch_trim(device {dev})")
