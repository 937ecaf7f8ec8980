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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine: the "
                    "vision model's GPU path is checked where one is (the device tool, issue 47)")
def test_on_a_gpu_it_runs_there_and_says_so():
    m = ImageClassifier("resnet18", image_size=64)
    assert m.device.type == "cuda" and next(m.model.parameters()).is_cuda
    assert m.predict(JPEG)["device"].startswith("cuda")
    out = m.predict_batch([JPEG] * 4)
    assert {a["device"] for a in out} == {str(m.device)} and out[0]["batch"] == 4
    rows = m.profile([1, 4], [1], repeats=2, image_size=64)
    assert {r["device"] for r in rows} == {str(m.device)}
