"""Compiles CUDA sources to PTX with NVRTC through ctypes (run by `cargo xtask ptx`).

Usage: ptx_nvrtc.py LIBNVRTC ARCH INCLUDE_DIR OUT_DIR SOURCE...

Each SOURCE.cu becomes OUT_DIR/SOURCE.ptx. The NVRTC version is printed first, so the
caller can check it is the pinned one. Exits non-zero (with NVRTC's log) on any error.
"""

import ctypes
import os
import sys

# NVVM's output for some kernels depends on where the heap happens to be (register numbering
# and a few redundant moves change from run to run: `inverted_residual.cu` gave three different
# PTX texts in three runs), so the committed PTX could not be checked byte for byte. With
# address-space randomisation off for this process (personality ADDR_NO_RANDOMIZE, what
# `setarch -R` does; it takes effect at exec, hence the re-exec) the output is reproducible.
# Where the kernel refuses the personality change, compilation goes on as it is.
ADDR_NO_RANDOMIZE = 0x0040000
if os.environ.get("TILEKIT_NVRTC_NO_ASLR") != "1" and sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _current = _libc.personality(0xFFFFFFFF)
        if _current != -1 and _libc.personality(_current | ADDR_NO_RANDOMIZE) != -1:
            os.environ["TILEKIT_NVRTC_NO_ASLR"] = "1"
            os.execv(sys.executable, [sys.executable] + sys.argv)
    except (OSError, AttributeError):
        pass


def check(lib, code, what):
    if code != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        msg = lib.nvrtcGetErrorString(code).decode()
        raise SystemExit(f"nvrtc: {what} failed: {msg}")


def compile_one(lib, arch, include_dir, path, out_dir):
    with open(path, "rb") as f:
        src = f.read()
    name = os.path.basename(path).encode()
    prog = ctypes.c_void_p()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None), "nvrtcCreateProgram")
    # No fast math: the activations must be the accurate f32 formulas. Line info and debug
    # information stay off so the PTX holds no host paths and is byte-for-byte reproducible.
    opts = [f"--gpu-architecture={arch}", f"--include-path={include_dir}", "--std=c++17"]
    opts_c = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    res = lib.nvrtcCompileProgram(prog, len(opts), opts_c)
    log_size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    if res != 0:
        raise SystemExit(f"nvrtc: {path} failed to compile:\n{text}")
    if text:
        # Warnings fail the build too: a kernel that compiles with warnings is not shipped.
        raise SystemExit(f"nvrtc: {path} compiled with warnings:\n{text}")
    size = ctypes.c_size_t()
    check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(size.value)
    check(lib, lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    stem = os.path.splitext(os.path.basename(path))[0]
    with open(os.path.join(out_dir, stem + ".ptx"), "wb") as f:
        f.write(buf.value)


def main():
    libpath, arch, include_dir, out_dir, *sources = sys.argv[1:]
    lib = ctypes.CDLL(libpath)
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    print(f"nvrtc {major.value}.{minor.value}", flush=True)
    for path in sources:
        compile_one(lib, arch, include_dir, path, out_dir)


if __name__ == "__main__":
    main()
