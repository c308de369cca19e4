"""`routing:` of a route: the policy as a union on `name`, the shared `prefix` block, and the old
flat spellings still read (each with a deprecation naming its new field)."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from kvgate.index.kv.prefix import EVENT_FED_CAPACITY
from kvgate.middleware.config import (
    AffinityConfig,
    CacheAwareConfig,
    LeastLoadedConfig,
    PrefixConfig,
    RoundRobinConfig,
    RoutingConfig,
    load_config,
    parse_config,
)
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.routing import make_policy

ROOT = Path(__file__).resolve().parents[1]
EVENTS = {"name": "a", "api_base": "http://127.0.0.1:1/v1", "events": "tcp://127.0.0.1:1"}


def routing_of(routing: dict, replicas: list | None = None) -> RoutingConfig:
    route = {"name": "r", "model": "*", "routing": routing, **({"replicas": replicas} if replicas else {})}
    return parse_config({"routes": [route]}).routes[0].routing


def refused(routing: dict) -> str:
    with pytest.raises(ConfigError) as err:
        routing_of(routing)
    return err.value.message


def deprecations(routing: dict, replicas: list | None = None) -> tuple[RoutingConfig, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = routing_of(routing, replicas)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


POLICIES = [
    ("round_robin", RoundRobinConfig),
    ("least_loaded", LeastLoadedConfig),
    ("cache_aware", CacheAwareConfig),
    ("affinity", AffinityConfig),
]


@pytest.mark.parametrize("name, model", POLICIES)
def test_each_policy_parses_from_a_name_and_from_a_mapping(name, model):
    by_name, by_mapping = routing_of({"policy": name}).policy, routing_of({"policy": {"name": name}}).policy
    assert type(by_name) is model and by_name == by_mapping == model()
    assert make_policy(by_name).name == name and make_policy(by_name).settings is by_name


def test_the_default_policy_is_cache_aware_with_its_defaults():
    cfg = routing_of({})
    assert cfg.policy == CacheAwareConfig() and cfg.policy.name == "cache_aware"
    assert (
        cfg.policy.decode_weight,
        cfg.policy.miss_weight,
        cfg.policy.queue_slack,
        cfg.policy.prompt_slack,
        cfg.policy.session_slack,
    ) == (8.0, 64.0, 2.5, 0.5, float("inf"))
    assert RoutingConfig() == cfg


def test_knobs_live_on_their_policy():
    cfg = routing_of(yaml.safe_load("{policy: {name: cache_aware, decode_weight: 4, queue_slack: .inf}}"))
    assert cfg.policy.decode_weight == 4 and cfg.policy.queue_slack == float("inf") and cfg.policy.miss_weight == 64
    policy = make_policy(cfg.policy)
    assert policy.decode_weight == 4 and policy.queue_slack == float("inf")
    assert make_policy(routing_of({"policy": {"name": "affinity", "load_factor": 2}}).policy).load_factor == 2
    # bounds as before
    assert "routes.0.routing.policy.cache_aware.miss_weight" in refused(
        {"policy": {"name": "cache_aware", "miss_weight": 0.5}}
    )
    assert "routes.0.routing.policy.affinity.load_factor" in refused(
        {"policy": {"name": "affinity", "load_factor": 0.9}}
    )


@pytest.mark.parametrize(
    "policy, knob, owner",
    [
        ("affinity", "decode_weight", "cache_aware"),
        ("round_robin", "session_slack", "cache_aware"),
        ("cache_aware", "load_factor", "affinity"),
        ("least_loaded", "load_factor", "affinity"),
    ],
)
def test_a_knob_of_another_policy_is_refused_naming_its_policy(policy, knob, owner):
    message = refused({"policy": {"name": policy, knob: 4}})
    assert f"routing.policy.{knob} belongs to policy {owner}; this route's policy is {policy}" in message
    flat = refused({"policy": policy, knob: 4})  # the old flat spelling: refused the same way
    assert f"routing.{knob} belongs to policy {owner}; this route's policy is {policy}" in flat


def test_strict_models_and_unknown_names():
    assert "routes.0.routing.policy.cache_aware.decode_wieght" in refused(
        {"policy": {"name": "cache_aware", "decode_wieght": 4}}
    )
    assert "'cache_aware'" in refused({"policy": "random"})
    assert "routing.policy needs a name" in refused({"policy": {"decode_weight": 4}})
    assert "routes.0.routing.prefix.blocksize" in refused({"prefix": {"blocksize": 4}})


@pytest.mark.parametrize(
    "knob, value",
    [
        ("decode_weight", 4.0),
        ("miss_weight", 16.0),
        ("queue_slack", 3.0),
        ("prompt_slack", 1.0),
        ("session_slack", 2.0),
    ],
)
@pytest.mark.parametrize("policy", [{}, {"policy": "cache_aware"}, {"policy": {"name": "cache_aware"}}])
def test_old_flat_cache_aware_knobs_still_work_and_are_deprecated(knob, value, policy):
    cfg, said = deprecations({**policy, knob: value})
    assert getattr(cfg.policy, knob) == value and cfg.policy.name == "cache_aware"
    assert said == [
        f"routing.{knob} is deprecated: write routing.policy.{knob} (with policy: {{name: cache_aware, ...}})"
    ]


def test_old_flat_load_factor_still_works_with_affinity():
    cfg, said = deprecations({"policy": "affinity", "load_factor": 2})
    assert cfg.policy == AffinityConfig(load_factor=2)
    assert said == [
        "routing.load_factor is deprecated: write routing.policy.load_factor (with policy: {name: affinity, ...})"
    ]


@pytest.mark.parametrize(
    "field, value",
    [
        ("tokenizer", "smollm2"),
        ("block_size", 32),
        ("seed", "s"),
        ("capacity_blocks", 1000),
        ("record_answers", False),
        ("mode", "approximate"),
    ],
)
def test_old_flat_prefix_fields_still_work_and_are_deprecated(field, value):
    cfg, said = deprecations({"policy": "cache_aware", field: value})
    assert getattr(cfg.prefix, field) == value
    assert said == [f"routing.{field} is deprecated: write routing.prefix.{field}"]


def test_an_old_file_loads_as_the_new_one_and_says_each_field_once(caplog):
    old = {"policy": "cache_aware", "mode": "precise", "block_size": 256, "decode_weight": 4, "max_attempts": 2}
    new = {
        "policy": {"name": "cache_aware", "decode_weight": 4},
        "prefix": {"mode": "precise", "block_size": 256},
        "max_attempts": 2,
    }
    two_routes = {"routes": [{"name": n, "model": "*", "replicas": [EVENTS], "routing": old} for n in ("a", "b")]}
    with caplog.at_level(logging.WARNING, logger="kvgate.config"):
        with pytest.warns(DeprecationWarning) as caught:
            cfg = parse_config(two_routes)
    assert cfg.routes[0].routing == cfg.routes[1].routing == routing_of(new, [EVENTS])
    said = [str(w.message) for w in caught]
    assert sorted(said) == sorted(set(said)) and len(said) == 3  # once per field per load, not per route
    logged = [r.getMessage() for r in caplog.records if r.name == "kvgate.config"]
    assert sorted(logged) == sorted(said)
    # the new spelling says nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        routing_of(new, [EVENTS])


def test_a_field_given_old_and_new_is_refused():
    assert "keep routing.policy.decode_weight" in refused(
        {"policy": {"name": "cache_aware", "decode_weight": 4}, "decode_weight": 5}
    )
    assert "keep routing.prefix.mode" in refused({"prefix": {"mode": "precise"}, "mode": "approximate"})


def test_prefix_defaults_and_validation_hold_under_routing_prefix():
    cfg = routing_of({})
    assert cfg.prefix == PrefixConfig() and (cfg.prefix.mode, cfg.prefix.tokenizer, cfg.prefix.block_size) == (
        "approximate",
        "text",
        64,
    )
    assert cfg.prefix.capacity_blocks == EVENT_FED_CAPACITY
    assert cfg.prefix.record_answers and cfg.prefix.seed == "kvgate"
    # a model tokenizer in approximate mode: the engine's block size and cache size, once it says
    assert (PrefixConfig(tokenizer="smollm2").block_size, PrefixConfig(tokenizer="smollm2").capacity_blocks) == (
        None,
        None,
    )
    precise = routing_of({"prefix": {"mode": "precise"}}, [EVENTS]).prefix
    assert (precise.tokenizer, precise.block_size, precise.capacity_blocks) == ("auto", None, EVENT_FED_CAPACITY)
    message = refused({"prefix": {"mode": "precise", "tokenizer": "text"}})
    assert "routes.0.routing.prefix:" in message
    assert "routing.prefix.mode: precise cannot use routing.prefix.tokenizer: text" in message
    message = refused({"prefix": {"tokenizer": "auto"}})
    assert "routing.prefix.tokenizer: auto needs routing.prefix.mode: precise" in message
    # the same checks reach the old spelling
    assert "cannot use routing.prefix.tokenizer: text" in refused({"mode": "precise", "tokenizer": "text"})
    # precise mode still needs every replica's events
    with pytest.raises(ConfigError, match="routing.prefix.mode precise needs replicas"):
        routing_of({"prefix": {"mode": "precise"}}, [{"name": "a", "api_base": "http://127.0.0.1:1/v1"}])


def test_examples_use_the_new_spellings():
    for name in (
        "replicas_config.yaml",
        "vllm_config.yaml",
        "cluster_config.yaml",
        "proxy_config.yaml",
        "verified_config.yaml",
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            load_config(ROOT / "examples" / name)


def test_check_config_prints_the_deprecation_of_an_old_file(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(
        "routes:\n  - name: chat\n    model: 'demo-*'\n"
        "    replicas: [{name: r1, api_base: 'http://127.0.0.1:1/v1'}]\n"
        "    routing: {policy: cache_aware, decode_weight: 4, tokenizer: text}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "kvgate.middleware.cli", "check-config", "--config", str(old)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert (
        "routing.decode_weight is deprecated: write routing.policy.decode_weight (with policy: {name: cache_aware, ...})"
    ) in run.stderr
    assert "routing.tokenizer is deprecated: write routing.prefix.tokenizer" in run.stderr
    assert run.stderr.count("routing.decode_weight is deprecated") == 1
