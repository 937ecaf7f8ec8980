"""A torchvision ResNet image classifier (ResNet18/34/50).

There is no model hub here: weights are random unless ``checkpoint`` names a local
state_dict file. Input is JPEG/PNG bytes; output is the top-k class ids and softmax scores.
An image of more than ``max_pixels`` is refused from its header, before it is decoded (a
379 KB PNG of 20,000 x 20,000 pixels would decode to 1.2 GB; issue 50): 413, naming the
limit.

It serves one request (:meth:`predict`) or a batch (:meth:`predict_batch`, one forward
pass), with ``threads`` torch intra-op threads that :meth:`set_threads` changes in place:
the only vertical scaling a Ray replica allows, since Ray cannot resize a running replica's
CPUs (issue 20, Sponge). :meth:`profile` times forward passes over a grid of batch sizes and
thread counts for Sponge's latency model (``faro-serve profile``).

The network runs on the GPU the replica holds (issue 47): ``device="auto"`` takes CUDA when
torch sees one, which inside a Ray replica means Ray gave it one (Ray sets
``CUDA_VISIBLE_DEVICES`` to the GPUs a replica reserves: none for ``gpus: 0``), and the CPU
otherwise. Decoding and the transforms stay on the CPU (they do not batch); the batch moves
to the device for the forward pass. Every answer says which device served it.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import torch
import torchvision
from PIL import Image
from torchvision.transforms import v2 as T

ARCHS = ("resnet18", "resnet34", "resnet50")
# the most pixels an image may have: a 12-megapixel photo passes, with room; about 1,000 x the
# model's 224 x 224 input, so a decoded image stays under 150 MB
MAX_PIXELS = 50_000_000


class TooManyPixels(ValueError):
    """An image larger than the model takes, found from its header."""


def image_pixels(payload: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header alone (Pillow reads no pixels until
    asked), or None when Pillow cannot tell (the decoder then says what is wrong)."""
    try:
        with Image.open(io.BytesIO(payload)) as im:
            return im.size
    except Image.DecompressionBombError:  # past Pillow's own bound, far above ours: no size
        return (2 * Image.MAX_IMAGE_PIXELS + 1, 1) if Image.MAX_IMAGE_PIXELS else None
    except Exception:
        return None


def refused(err: ValueError) -> dict:
    """The answer to an image the model will not take: 413 for too many pixels, else 400."""
    if isinstance(err, TooManyPixels):
        return {"error": str(err), "status": 413, "reason": "too_many_pixels"}
    return {"error": str(err), "status": 400}


def pick_device(device: str = "auto") -> torch.device:
    """``auto``: CUDA when torch sees a GPU (in a Ray replica: one Ray gave it), else the
    CPU; or the device named (``cuda``, ``cuda:1``, ``cpu``), checked to exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r}: torch sees no CUDA GPU here (in Ray, give the model gpus so that Ray assigns it one)"
        )
    return dev


class ImageClassifier:
    def __init__(
        self,
        arch: str = "resnet18",
        checkpoint: str | None = None,
        top_k: int = 5,
        image_size: int = 224,
        threads: int = 1,
        device: str = "auto",
        max_pixels: int = MAX_PIXELS,
    ):
        if arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)} (got {arch!r})")
        self.max_pixels = int(max_pixels)
        torch.set_num_threads(threads)
        self.device = pick_device(device)
        self.model = getattr(torchvision.models, arch)(weights=None)
        if checkpoint:
            path = Path(checkpoint)
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint {path} does not exist")
            self.model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        self.model.eval().to(self.device)
        # one request at a time, even if Ray runs sync methods in a thread pool
        self._one_at_a_time = threading.Lock()
        self.arch = arch
        self.top_k = top_k
        self.transform = T.Compose(
            [
                T.Resize(int(image_size * 256 / 224), antialias=True),
                T.CenterCrop(image_size),
                T.ToDtype(torch.float32, scale=True),
                T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            ]
        )

    def decode(self, payload: bytes) -> torch.Tensor:
        if not payload:
            raise ValueError("empty body: send JPEG or PNG bytes")
        size = image_pixels(payload)
        if size is not None and size[0] * size[1] > self.max_pixels:
            what = (
                f"of {size[0]:,} x {size[1]:,} pixels" if size[1] > 1 else f"of more than {size[0] - 1:,} pixels"
            )  # past Pillow's bound: no size
            raise TooManyPixels(f"image {what} exceeds the limit of {self.max_pixels:,} pixels")
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        try:
            return torchvision.io.decode_image(data, mode=torchvision.io.ImageReadMode.RGB)
        except (RuntimeError, ValueError):
            raise ValueError(f"body is not a decodable JPEG/PNG image ({len(payload)} bytes)") from None

    def set_threads(self, threads: int) -> None:
        """Torch's intra-op threads for the next forward passes (process-wide)."""
        if not (isinstance(threads, int) and threads >= 1):
            raise ValueError(f"threads must be an integer >= 1 (got {threads!r})")
        torch.set_num_threads(threads)

    def _top(self, probs: torch.Tensor) -> tuple[list, list]:
        scores, classes = torch.topk(probs, min(self.top_k, probs.numel()))
        return classes.tolist(), [round(float(s), 6) for s in scores]

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of a batch (N, 3, H, W) on the model's device, back on the CPU."""
        return torch.softmax(self.model(x.to(self.device, non_blocking=True)), dim=1).cpu()

    def _sync(self) -> None:
        if self.device.type == "cuda":  # a GPU's work is asynchronous: time it done
            torch.cuda.synchronize(self.device)

    def predict_batch(self, payloads: list[bytes]) -> list[dict]:
        """One answer per payload, the decodable ones classified in one forward pass; each
        answer carries the batch's size and processing time."""
        with self._one_at_a_time:
            t0, c0 = time.perf_counter(), time.thread_time()
            images, out = [], [None] * len(payloads)
            for k, payload in enumerate(payloads):
                try:
                    images.append((k, self.transform(self.decode(payload))))
                except ValueError as err:
                    out[k] = refused(err)
            if images:
                with torch.inference_mode():
                    probs = self._forward(torch.stack([x for _, x in images]))
                done = {
                    "processing_ms": (time.perf_counter() - t0) * 1e3,
                    "cpu_ms": (time.thread_time() - c0) * 1e3,
                    "batch": len(images),
                    "device": str(self.device),
                }
                for (k, _), p in zip(images, probs):
                    classes, scores = self._top(p)
                    out[k] = {"model": self.arch, "classes": classes, "scores": scores, **done}
            return out

    def profile(self, batches: list[int], threads: list[int], repeats: int = 5, image_size: int = 224) -> list[dict]:
        """Forward-pass seconds at every (batch, threads) point: ``repeats`` timed passes
        after one untimed pass, on random input. Before the grid, three passes at its largest
        point warm the model up (the first passes of a fresh model are slower: measured here,
        a batch of 1 at 48 px took 17 ms first and 10-13 ms after). Restores the thread count."""
        before = torch.get_num_threads()
        rows = []
        try:
            with self._one_at_a_time, torch.inference_mode():
                self.set_threads(int(max(threads)))
                x = torch.rand(int(max(batches)), 3, image_size, image_size, device=self.device)
                for _ in range(3):
                    self.model(x)
                for c in threads:
                    self.set_threads(int(c))
                    for b in batches:
                        x = torch.rand(int(b), 3, image_size, image_size, device=self.device)
                        self.model(x)
                        for _ in range(repeats):
                            self._sync()
                            t0 = time.perf_counter()
                            self.model(x)
                            self._sync()
                            rows.append(
                                {
                                    "batch": int(b),
                                    "threads": int(c),
                                    "device": str(self.device),
                                    "latency_s": time.perf_counter() - t0,
                                }
                            )
        finally:
            torch.set_num_threads(before)
        return rows

    def predict(self, payload: bytes) -> dict:
        with self._one_at_a_time:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                img = self.decode(payload)
            except ValueError as err:
                return refused(err)
            with torch.inference_mode():
                probs = self._forward(self.transform(img).unsqueeze(0))[0]
            classes, scores = self._top(probs)
            return {
                "model": self.arch,
                "classes": classes,
                "scores": scores,
                "device": str(self.device),
                "processing_ms": (time.perf_counter() - t0) * 1e3,
                # CPU this request used (torch's intra-op threads: 1 by default, this thread)
                "cpu_ms": (time.thread_time() - c0) * 1e3,
            }
