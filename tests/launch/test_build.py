"""launch/build.py wires the algorithm's parts from the config: the KL penalty's controller comes from the
algorithm's one factory (algorithm/rewards_shaping.py), with every field of ``algorithm.kl_penalty``."""

from trivium.algorithm.rewards_shaping import AdaptiveKLController, FixedKLController
from trivium.config.schema import KLPenaltyConfig
from trivium.launch.build import kl_penalty_controller


def test_the_kl_penalty_controller_takes_every_field_of_its_config():
    assert kl_penalty_controller(KLPenaltyConfig()) is None  # coef 0: no penalty
    fixed = kl_penalty_controller(KLPenaltyConfig(coef=0.05))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = kl_penalty_controller(KLPenaltyConfig(coef=0.02, adaptive=True, target_kl=0.3, horizon=500))
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.02, 0.3, 500)
