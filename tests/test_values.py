"""Value types validate at construction and say what is accepted."""

from __future__ import annotations

import pickle

import pytest

from fray import (
    TPU_TOPOLOGIES,
    ConfigError,
    CpuConfig,
    Entrypoint,
    EnvironmentConfig,
    GpuConfig,
    JobFailed,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    parse_size,
)
from fray.resources import format_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512m", 512 * 2**20),
        ("4g", 4 * 2**30),
        ("4G", 4 * 2**30),
        ("1.5t", int(1.5 * 2**40)),
        ("2GiB", 2 * 2**30),
        ("100kb", 100 * 1024),
        ("1024", 1024),
        (4096, 4096),
    ],
)
def test_parse_size_accepts_human_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["4gg", "", "g", "-1g", "four gigs", "1.2.3m", None, 1.5, True])
def test_parse_size_rejects_garbage_with_the_accepted_forms(bad):
    with pytest.raises(ConfigError) as info:
        parse_size(bad)
    assert "512m" in str(info.value) or "negative" in str(info.value) or "bool" in str(info.value)


def test_resource_config_defaults_and_sizes():
    r = ResourceConfig()
    assert r.cpu == 1 and r.ram_bytes == 128 * 2**20 and r.disk_bytes == 2**30
    assert r.device == CpuConfig() and r.preemptible and r.regions is None
    assert ResourceConfig(ram="4g").ram_bytes == 4 * 2**30


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"ram": "4gg"}, "ResourceConfig.ram"),
        ({"disk": "lots"}, "ResourceConfig.disk"),
        ({"cpu": -1}, "negative"),
        ({"cpu": "2"}, "number of cores"),
        ({"device": "tpu"}, "GpuConfig"),
        ({"preemptible": "no"}, "True or False"),
        ({"regions": "us-central1"}, "list of regions"),
        ({"regions": []}, "non-empty"),
    ],
)
def test_resource_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ResourceConfig(**kwargs)


@pytest.mark.parametrize(("name", "value"), [("ram", 4), ("disk", 100), ("ram", "4"), ("disk", " 4096 ")])
def test_resource_config_refuses_bare_numbers_as_ambiguous(name, value):
    with pytest.raises(ConfigError) as info:
        ResourceConfig(**{name: value})
    message = str(info.value)
    assert message.startswith(f"ResourceConfig({name}={value!r}): a bare number is ambiguous (bytes? GiB?)")
    assert f"{name}='4g'" in message and f"'{str(value).strip()}b' for {str(value).strip()} bytes" in message


def test_resource_config_takes_bytes_when_they_say_so():
    assert ResourceConfig(ram="4096b", disk="2GiB").ram_bytes == 4096
    assert ResourceConfig(ram=f"{5 * 2**20}b").ram_bytes == 5 * 2**20


def test_format_size_writes_what_resource_config_reads():
    for num_bytes in (100, 4096, 3 * 2**30):
        text = format_size(num_bytes)
        assert ResourceConfig(ram=text).ram_bytes == num_bytes


def test_regions_are_normalised_to_a_tuple():
    assert ResourceConfig(regions=["us-central1", "europe-west4"]).regions == ("us-central1", "europe-west4")


def test_gpu_config_validates_type_and_count():
    assert GpuConfig("H100", 8).count == 8
    assert GpuConfig("h100").type == "H100"  # marin writes "a100-80g": names are taken in any case
    with pytest.raises(ConfigError, match="known GPU type"):
        GpuConfig("H10O")
    with pytest.raises(ConfigError, match=">= 1"):
        GpuConfig("A100", 0)


@pytest.mark.parametrize(
    ("name", "chips", "hosts", "per_host", "topology"),
    [
        ("v4-8", 4, 1, 4, "2x2x1"),
        ("v4-32", 16, 4, 4, "2x2x4"),
        ("v5p-128", 64, 16, 4, "4x4x4"),
        ("v5litepod-8", 8, 1, 8, "2x4"),
        ("v5litepod-16", 16, 4, 4, "4x4"),
        ("v6e-256", 256, 64, 4, "16x16"),
        ("v6e-1", 1, 1, 1, "1x1"),
    ],
)
def test_tpu_topology_table(name, chips, hosts, per_host, topology):
    info = TPU_TOPOLOGIES[name]
    assert (info.chips, info.hosts, info.chips_per_host, info.topology) == (chips, hosts, per_host, topology)
    assert info.chips == info.hosts * info.chips_per_host


def test_every_tpu_slice_is_consistent():
    for info in TPU_TOPOLOGIES.values():
        assert info.chips == info.hosts * info.chips_per_host
        assert {info.family} <= {"v4", "v5e", "v5p", "v6e"}


def test_tpu_config_checks_type_and_topology():
    assert TpuConfig("v5litepod-16", "4x4").slice.hosts == 4
    assert ResourceConfig(device=TpuConfig("v4-16")).device_count == 4
    with pytest.raises(ConfigError, match="not a known TPU slice type"):
        TpuConfig("v5e-16")
    with pytest.raises(ConfigError, match="topology '4x4'"):
        TpuConfig("v5litepod-16", "2x8")


def test_environment_config_validation():
    env = EnvironmentConfig(pip_packages=["numpy"], env_vars={"A": "1"})
    assert env.pip_packages == ("numpy",)
    with pytest.raises(ConfigError, match="must be a list"):
        EnvironmentConfig(pip_packages="numpy")
    with pytest.raises(ConfigError, match="values must be strings"):
        EnvironmentConfig(env_vars={"A": 1})
    with pytest.raises(ConfigError, match="not a valid environment variable"):
        EnvironmentConfig(env_vars={"1A": "x"})


def test_entrypoints_validate():
    entry = Entrypoint.from_callable(print, args=[1, 2], kwargs={"sep": "-"})
    assert entry.args == (1, 2) and entry.kwargs == {"sep": "-"}
    assert Entrypoint.from_binary("echo", ["a"]).argv == ["echo", "a"]
    with pytest.raises(ConfigError, match="needs a callable"):
        Entrypoint.from_callable("print")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="list of strings"):
        Entrypoint.from_binary("echo", [1])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="tuple or list"):
        Entrypoint.from_callable(print, args="abc")


def test_job_request_validation():
    entry = Entrypoint.from_callable(print)
    assert JobRequest(name="ok.name_1-2", entrypoint=entry).max_retries_preemption == 100
    with pytest.raises(ConfigError, match="job name"):
        JobRequest(name="has/slash", entrypoint=entry)
    with pytest.raises(ConfigError, match="job name"):
        JobRequest(name="", entrypoint=entry)
    with pytest.raises(ConfigError, match="replicas"):
        JobRequest(name="x", entrypoint=entry, replicas=0)
    with pytest.raises(ConfigError, match="max_retries_failure"):
        JobRequest(name="x", entrypoint=entry, max_retries_failure=-1)
    with pytest.raises(ConfigError, match=r"Entrypoint\.from_callable"):
        JobRequest(name="x", entrypoint=print)  # type: ignore[arg-type]


def test_job_status_finished():
    assert [s for s in JobStatus if s.finished] == [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED]
    assert JobStatus("running") is JobStatus.RUNNING


def test_job_failed_pickles_with_its_cause_and_traceback():
    err = JobFailed("job-1", "ValueError: x", cause=ValueError("x"), traceback_text="Traceback...", exit_code=None)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err)
    assert isinstance(copy.cause, ValueError)
    assert copy.traceback_text == "Traceback..."
    assert copy.__cause__ is copy.cause  # the original is the cause, with the remote traceback under it
    assert type(copy.cause.__cause__).__name__ == "RemoteTraceback"
