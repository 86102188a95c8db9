"""What the plot scripts' tests share: a skip (exit 77) without matplotlib, and a PNG's size."""
import struct
import sys


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: matplotlib is not installed ({e}); pip install matplotlib")
        sys.exit(77)


def png_size(path):
    """(width, height) of a PNG file, from its IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])
