"""The config schema: defaults, validation messages that name the key, -o overrides, docs in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fusefs import config
from fusefs.cli import mountopts
from fusefs.errors import ConfigError
from placement.model import PerfModel

ROOT = Path(__file__).resolve().parent.parent


def load_text(tmp_path: Path, text: str, **overrides: str) -> config.Config:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return config.load(p, overrides)


def test_defaults_print_and_round_trip() -> None:
    text = config.defaults_yaml()
    assert config.build(config.Config, yaml.safe_load(text)) == config.Config()


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    assert load_text(tmp_path, "") == config.Config()


def test_the_model_defaults_of_the_config_are_the_planners() -> None:
    """A config that leaves the model out and one that spells out every default give the same model:
    placement.model holds the one copy of the numbers, the config section takes its defaults from it."""
    tiers = [config.TierConfig(kind="memory"), config.TierConfig(kind="directory", path="/x")]
    spelled = PerfModel.from_config(config.Config(tiers=tiers).to_dict())
    bare = PerfModel.from_config({"tiers": [{"kind": "memory"}, {"kind": "directory", "path": "/x"}]})
    assert spelled.tiers == bare.tiers
    for attr in ("pfs", "network_mbps", "staging_threads", "staging_write", "open_latency_s"):
        assert getattr(spelled, attr) == getattr(bare, attr), attr
    assert dict(zip(spelled.pfs.xs, spelled.pfs.ys, strict=True)) == {1: 330.0, 2: 730.0, 4: 1540.0, 8: 2870.0}


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("job:\n  world_size: 2.5\n", "job.world_size", "an integer"),
        ("job:\n  world_size: 4\n  ranks_per_node: 3\n", "job.ranks_per_node", "divisor"),
        ("tiers:\n  - kind: disk\n", "tiers.0.kind", "'memory', 'directory'"),
        ("tiers:\n  - kind: directory\n    bytes: 1G\n", "tiers.0.path", "directory"),
        ("tiers:\n  - kind: memory\n    bytes: lots\n", "tiers.0.bytes", "byte size"),
        ("datasets:\n  - root: /abs\n", "datasets.0.root", "inside the mount"),
        ("datasets:\n  - root: a\n    follows: b\n", "datasets.0.follows", "another dataset"),
        ("datasets:\n  - root: a\n    sampler: {kind: list}\n", "datasets.0.sampler.order_file", "file name"),
        ("model:\n  pfs_mbps: {1: -3}\n", "model.pfs_mbps.1", "positive"),
        ("peers:\n  port: 70000\n", "peers.port", "0..65535"),
        ("bogus: 1\n", "bogus", "unknown key"),
        ("prefetch:\n  reactive: false\n", "prefetch.reactive", "was removed: without a trusted plan the tiers"),
        ("fuse: 3\n", "fuse", "a mapping"),
        ("- a\n", "top level", "mapping"),
        ("job: [\n", "line", "not valid YAML"),
    ],
)
def test_errors_name_key_and_expectation(tmp_path: Path, text: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_text(tmp_path, text)
    assert key in str(exc.value) and expected in str(exc.value)
    assert "\n" not in str(exc.value)


def test_byte_sizes() -> None:
    assert config.parse_bytes("4GiB") == 4 << 30
    assert config.parse_bytes("2GB") == 2 * 10**9
    assert config.parse_bytes("512M") == 512 << 20
    assert config.parse_bytes(1234) == 1234
    for bad in ("-1", "1X", "", True, -5):
        with pytest.raises(ValueError):
            config.parse_bytes(bad)


def test_overrides_reach_nested_keys_and_list_items(tmp_path: Path) -> None:
    cfg = load_text(
        tmp_path,
        "tiers:\n  - kind: memory\n    bytes: 1G\n",
        **{
            "tiers.0.bytes": "2G",
            "tiers.1.kind": "directory",
            "tiers.1.path": "/tmp/x",
            "tiers.1.bytes": "5G",
            "job.epochs": "7",
            "datasets.0.sampler.drop_last": "true",
        },
    )
    assert [t.bytes for t in cfg.tiers] == [2 << 30, 5 << 30]
    assert cfg.tiers[1].kind == "directory" and cfg.job.epochs == 7 and cfg.datasets[0].sampler.drop_last
    with pytest.raises(ConfigError, match="past the end"):
        config.load(None, {"tiers.5.bytes": "1G"})
    # The old default, as -o or in a file saved from an older --defaults, asked for what is always done:
    # ignored (with a warning); the other value asked for what no longer exists: an error.
    assert config.load(None, {"prefetch.reactive": "true"}) == config.load(None, {})
    with pytest.raises(ConfigError, match=r"^prefetch\.reactive was removed: .*; delete the key$"):
        config.load(None, {"prefetch.reactive": "false"})


def test_mount_option_parsing() -> None:
    cfg_file, overrides, ignored = mountopts.parse_mount_options(["config=/etc/s.yaml,rw,noauto", "job.epochs=2"])
    assert cfg_file == "/etc/s.yaml" and overrides == {"job.epochs": "2"} and ignored == ["rw", "noauto"]
    assert mountopts.parse_mount_options(["allow_other"])[1] == {"allow_other": "true"}


def test_every_key_is_in_the_man_page() -> None:
    man = (ROOT / "man" / "seerfs.yaml.5").read_text()
    documented = set(re.findall(r"^\.TP\n\.B ([a-z_][a-z_.\[\]0-9]*)$", man, re.MULTILINE))
    missing = [k for k in config.all_keys() if k not in documented]
    assert not missing, f"keys missing from man/seerfs.yaml.5: {missing}"
    extra = documented - set(config.all_keys())
    assert not extra, f"man/seerfs.yaml.5 documents keys that do not exist: {extra}"


@pytest.mark.parametrize(("text", "value"), [("on", "on"), ("off", "off"), ("auto", "auto"), ("'on'", "on")])
def test_an_on_off_key_takes_yamls_bare_on_and_off(tmp_path: Path, text: str, value: str) -> None:
    """fuse.no_open is off|auto|on; YAML 1.1 reads a bare on/off as a boolean, which means the same."""
    path = tmp_path / "c.yaml"
    path.write_text(f"fuse: {{no_open: {text}}}\n")
    assert config.load(path).fuse.no_open == value
    assert config.load(None, {"fuse.no_open": text.strip("'")}).fuse.no_open == value
    assert config.Config().fuse.no_open == "off"
