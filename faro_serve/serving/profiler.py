"""The deployment ``faro-serve profile`` measures: a model replica on Ray Serve that times
its own forward passes over a grid of batch sizes and thread counts (issue 20, Sponge's
latency model). The replica reserves as many Ray CPUs as the largest thread count, so the
threads it runs are the CPUs it holds, as a serving replica's would be."""

from ray import serve

from deployments.vision import ImageClassifier


@serve.deployment(num_replicas=1, max_ongoing_requests=1)
class Profiler:
    def __init__(self, arch: str, checkpoint: str | None = None):
        self.model = ImageClassifier(arch, checkpoint=checkpoint, threads=1)

    def profile(self, batches: list[int], threads: list[int], repeats: int, image_size: int) -> list[dict]:
        return self.model.profile(batches, threads, repeats, image_size)


def profile_app(arch: str, max_threads: int, checkpoint: str | None = None):
    return Profiler.options(ray_actor_options={"num_cpus": max_threads}).bind(arch, checkpoint)
