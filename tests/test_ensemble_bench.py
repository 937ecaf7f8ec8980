"""bench/ensemble_seeds.py: the seed ranges it reads and the mixtures it builds."""

import numpy as np

from bench.ensemble_seeds import mixture, seeds_of
from forecasting.train import TrainConfig, train_forecaster

SMALL = dict(max_steps=30, mlp_width=16, windows_batch_size=64, val_check_steps=10, members=1)


def series(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"s{i}": rng.poisson(100 + 40 * i + 30 * np.sin(np.arange(300) / 7)).astype(float) for i in range(3)}


def test_seed_ranges():
    assert seeds_of("1-4") == [1, 2, 3, 4] and seeds_of("3") == [3] and seeds_of("5-6") == [5, 6]


def test_a_mixture_of_single_networks_forecasts_as_the_ensemble_trained_at_once():
    hist = series(0)
    singles = [train_forecaster(hist, TrainConfig(**SMALL, seed=s)) for s in (4, 5)]
    both = train_forecaster(hist, TrainConfig(**{**SMALL, "members": 2}, seed=4))
    mixed = mixture(singles)
    assert mixed.n_members == 2
    np.testing.assert_allclose(
        mixed.predict(hist, seed=1).samples, both.predict(hist, seed=1).samples, rtol=1e-6, atol=1e-9
    )
