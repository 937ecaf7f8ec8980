"""The built-in vision model runs on the device Ray gives it (issue 47): CUDA when its
replica holds a GPU (torch sees one only then: Ray sets CUDA_VISIBLE_DEVICES to the
replica's GPUs), the CPU otherwise, and every answer says which."""

import pytest
import torch
from torchvision.io import encode_jpeg

from deployments.vision import ImageClassifier, pick_device

JPEG = bytes(encode_jpeg((torch.rand(3, 72, 96) * 255).to(torch.uint8)).numpy())


def test_without_a_gpu_it_runs_on_the_cpu_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA test covers it")
    m = ImageClassifier("resnet18", image_size=64)
    assert str(m.device) == "cpu" and m.predict(JPEG)["device"] == "cpu"
    assert {a["device"] for a in m.predict_batch([JPEG, JPEG])} == {"cpu"}
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        pick_device("cuda")


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA GPU on this machine: the "
    "vision model's GPU path is checked where one is (the device tool, issue 47)",
)
def test_on_a_gpu_it_runs_there_and_says_so():
    m = ImageClassifier("resnet18", image_size=64)
    assert m.device.type == "cuda" and next(m.model.parameters()).is_cuda
    assert m.predict(JPEG)["device"].startswith("cuda")
    out = m.predict_batch([JPEG] * 4)
    assert {a["device"] for a in out} == {str(m.device)} and out[0]["batch"] == 4
    rows = m.profile([1, 4], [1], repeats=2, image_size=64)
    assert {r["device"] for r in rows} == {str(m.device)}


def pixel_bomb(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` pixels and whose data is a few
    bytes: what a decompression bomb looks like before it is decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    )


def test_an_image_of_too_many_pixels_is_refused_from_its_header():
    """Issue 50: 20,000 x 20,000 pixels (a 1.2 GB tensor once decoded) is a 413 naming the
    limit, answered before any pixel is decoded; a photo-sized image passes the check."""
    import time

    m = ImageClassifier("resnet18", image_size=64)
    t0 = time.perf_counter()
    out = m.predict(pixel_bomb(20_000, 20_000))
    assert time.perf_counter() - t0 < 1.0
    assert out == {
        "error": "image of more than 178,956,970 pixels exceeds the limit of 50,000,000 pixels",
        "status": 413,
        "reason": "too_many_pixels",
    }
    assert m.predict(pixel_bomb(10_000, 5_001))["error"] == (
        "image of 10,000 x 5,001 pixels exceeds the limit of 50,000,000 pixels"
    )
    assert m.predict_batch([pixel_bomb(20_000, 20_000), JPEG])[0]["status"] == 413
    small = ImageClassifier("resnet18", image_size=64, max_pixels=1000)
    assert small.predict(JPEG)["status"] == 413  # 96 x 72 = 6,912 pixels
    assert "classes" in m.predict(JPEG)
