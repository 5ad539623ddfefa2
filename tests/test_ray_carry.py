"""Ray workers get spectrace's variables: the plugin adds its prefixes to vLLM's own
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, after what the user set (pure logic here; vLLM's real
``get_env_vars_to_copy`` in tests/test_ray_env.py)."""

from __future__ import annotations

from spectrace.recorder import ray_carry


def test_prefixes_added_after_the_users_and_never_twice():
    env = {ray_carry.PREFIXES_ENV: "MY_, OTEL_"}
    assert ray_carry.carry_to_ray_workers(env) == "MY_,OTEL_,SPECTRACE"
    assert ray_carry.carry_to_ray_workers(env) == "MY_,OTEL_,SPECTRACE"  # the plugin loads in every process


def test_unset_variable_gets_both_prefixes():
    env: dict[str, str] = {}
    ray_carry.carry_to_ray_workers(env)
    assert env == {ray_carry.PREFIXES_ENV: "SPECTRACE,OTEL_"}
