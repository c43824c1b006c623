"""PNG checks: the signature and IHDR width/height, and a full decode with Pillow (matplotlib's dependency)."""

from __future__ import annotations

import io
import struct

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG that decodes completely; AssertionError if ``data`` is not one."""
    from PIL import Image

    assert data[:8] == PNG_SIGNATURE, "not a PNG (signature)"
    length, chunk = struct.unpack(">I4s", data[8:16])
    assert chunk == b"IHDR" and length == 13, "not a PNG (first chunk is not IHDR)"
    width, height = struct.unpack(">II", data[16:24])
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # every pixel decodes
        assert image.size == (width, height)
    assert width > 0 and height > 0
    return width, height
