"""parallax.Config: each option declared once, in the part of the stage that reads it, and a
wrong one refused with a ConfigError that names it."""
import dataclasses
import re

import pytest

import parallax
from parallax.config import PlanOptions, RuntimeOptions
from runner.settings import Settings

PARTS = (PlanOptions, RuntimeOptions, Settings)


def test_configs_keywords_defaults_and_docstring_are_its_parts():
    """Config writes none of its options itself: each comes with its default and its
    documentation from its part, so help(parallax.Config) says which option is whose."""
    assert [f.name for f in dataclasses.fields(parallax.Config)] == [
        f.name for part in PARTS for f in dataclasses.fields(part)]
    for part in PARTS:
        assert f"{part.__module__}.{part.__name__}: " in parallax.Config.__doc__
        for field in dataclasses.fields(part):
            assert re.search(rf"^(\w+ / )?{field.name}\b.*:", parallax.Config.__doc__,
                             re.MULTILINE), field.name


@pytest.mark.parametrize("keywords, option", [
    (dict(run_option="ALLREDUCE"), "run_option"),
    (dict(collectives="nccl"), "collectives"),
    (dict(run_option="AR", sync=False), "sync"),
    (dict(trial_steps=2), "trial_steps"),
    (dict(trial_margin=-0.5), "trial_margin"),
    (dict(ps_config={"local_aggregation": False}), "ps_config"),
    (dict(heartbeat_timeout_secs=0), "heartbeat_timeout_secs"),
    (dict(stall_timeout_secs=-1), "stall_timeout_secs"),
    (dict(max_restarts=-1), "max_restarts"),
    (dict(max_restarts=1), "max_restarts"),  # without a checkpoint to resume from
])
def test_a_wrong_option_is_a_config_error_naming_it(keywords, option):
    with pytest.raises(parallax.ConfigError) as raised:
        parallax.Config(**keywords)
    assert isinstance(raised.value, parallax.ParallaxError) and isinstance(raised.value,
                                                                           ValueError)
    assert raised.value.option == option and option in str(raised.value)


def test_a_wrong_profile_config_is_a_config_error_naming_the_option():
    with pytest.raises(parallax.ConfigError, match="profile_config") as raised:
        parallax.ProfileConfig("/tmp/profile", profile_steps=[0])
    assert raised.value.option == "profile_config"
